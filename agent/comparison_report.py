"""The report of a policy comparison (`rlalloc evaluate`): results.md's tables and text from the
results.json document (`rlalloc.agent.comparison_stats.summarise`), runs.csv's rows, and
`write_report`, which writes those with the plots (`rlalloc.agent.comparison_plots`) and
replaces an earlier run's files together or not at all.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import TYPE_CHECKING

from rlalloc.agent.comparison_plots import PAIRED_PLOT, write_plots
from rlalloc.agent.comparison_stats import LOWER_IS_BETTER, NEGLIGIBLE_BASE, percent_change
from rlalloc.agent.evaluation import DECISIONS_PER_FACTOR
from rlalloc.env.cluster import cluster_markdown
from rlalloc.env.metrics import METRIC_KEYS
from rlalloc.env.output import remove_outputs, staged_outputs, write_atomic, write_json

if TYPE_CHECKING:
    from rlalloc.agent.comparison_runs import RunSpec

REPORT_METRICS = ("avg_jct_s", "p95_jct_s", "avg_queue_s", "makespan_s", "gpu_util", "goodput",
                  "lost_gpu_hours", "restarts_per_job", "progress_preserved", "ettr",
                  "energy_kwh")
"""Columns of results.md (results.json has every metric of `METRIC_KEYS`)."""
RUNS_CSV = "runs.csv"
OUTPUT_FILES = ("results.json", "results.md", RUNS_CSV, "jct_cdf.png", "gpu_util.png",
                "queue_length.png", PAIRED_PLOT)
"""What `write_report` writes into `rlalloc evaluate`'s --out (paired_avg_jct.png only with two
policies or more; under --force a run removes an earlier run's that it does not write
itself)."""


def counted_runs(report: dict, name: str) -> int:
    """How many runs policy `name`'s mean and CI in `report` are over: one per workload where
    its seeds repeated one run (``seeds_repeat``), one per seed elsewhere."""
    repeated = set((report.get("seeds_repeat") or {}).get(name, []))
    seeds = len(report["seeds"])
    return sum(1 if workload in repeated else seeds for workload in report["workloads"])


def _negligible_text(keys: list[str]) -> str:
    """Why `keys` have no % change, for results.md: ``avg queue was at most 1 s`` (a floor of
    `NEGLIGIBLE_BASE`) or ``GPU util was 0``, joined by "and"."""
    words = []
    for key in keys:
        name, _, unit = metric_header(key).partition(" (")
        floor = NEGLIGIBLE_BASE.get(key)
        words.append(f"{name} was 0" if floor is None else
                     f"{name} was at most {floor:g}{' ' + unit.rstrip(')') if unit else ''}")
    return " and ".join(words)


METRIC_HEADERS = {
    "avg_jct_s": "avg JCT (s)", "p50_jct_s": "p50 JCT (s)", "p95_jct_s": "p95 JCT (s)",
    "p99_jct_s": "p99 JCT (s)", "avg_queue_s": "avg queue (s)", "makespan_s": "makespan (s)",
    "gpu_util": "GPU util (0-1)", "gpu_busy_util": "GPU busy util (0-1)",
    "goodput": "goodput (0-1)", "lost_gpu_hours": "lost GPU-hours",
    "restarts_per_job": "restarts/job", "mean_recovery_s": "mean recovery (s)",
    "progress_preserved": "progress preserved (0-1)", "ettr": "ETTR (0-1)",
    "energy_kwh": "energy (kWh)", "failures": "failures", "invalid_actions": "invalid actions"}
"""results.md's column headings: what each metric is, in its unit ((0-1): a share)."""


SHARE_METRICS = frozenset(key for key, header in METRIC_HEADERS.items()
                          if header.endswith("(0-1)"))
"""Metrics that are shares: results.md keeps 3 decimals for them (`column_digits`)."""


def metric_header(key: str) -> str:
    """A metric's column heading in results.md (the key itself where none is set)."""
    return METRIC_HEADERS.get(key, key)


def paired_table(paired: dict) -> str:
    """results.md's paired table: mean % change ± 95% CI and runs better, per metric."""
    policies = paired["policies"]
    metrics = list(next(iter(policies.values())))
    lines = ["| policy | " + " | ".join(f"{_paired_header(key)}, % change" for key in metrics)
             + " |", "|---|" + "---|" * len(metrics)]
    for name, values in policies.items():
        cells = [_paired_cell(v) for v in values.values()]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    missing = [key for key in metrics if any(values[key]["mean"] is None
                                             for values in policies.values())]
    if missing:
        lines += ["", f"n/a: `{paired['reference']}`'s {_negligible_text(missing)} on every "
                  "run, so there is no % change to take; the runs still count towards better."]
    return "\n".join(lines)


def workload_table(paired: dict) -> str | None:
    """results.md's table of each policy's avg JCT change per workload (`workload_change`),
    with its footnotes; None for one workload, where the paired table says it all."""
    by_workload = paired["avg_jct_by_workload"]
    workloads = list(next(iter(by_workload.values()), {}))
    if len(workloads) < 2:
        return None
    lines = ["| workload | " + " | ".join(by_workload) + " |", "|---|" + "---|" * len(by_workload)]
    for workload in workloads:
        escaped = workload.replace("|", r"\|")  # a path's "|" would split the row
        lines.append(f"| {escaped} | " + " | ".join(_workload_cell(changes[workload])
                                                    for changes in by_workload.values()) + " |")
    cells = [change for changes in by_workload.values() for change in changes.values()]
    if any(change["mean"] is None for change in cells):
        lines += ["", f"n/a: `{paired['reference']}`'s avg JCT there was 0 (no job to count), "
                  "so there is no % change to take."]
    if any(change["runs_unfinished"] for change in cells):
        lines += ["", "unfinished: runs of the policy or the reference stopped at the time "
                  "limit or given up; their avg JCT is a lower bound (each unfinished job at its "
                  "time in the system so far), so the % is not to be trusted."]
    return "\n".join(lines)


def _workload_cell(change: dict) -> str:
    """``-4.8%``, ``n/a``, or ``+1.2% (2 unfinished)`` (`workload_change`)."""
    text = "n/a" if change["mean"] is None else f"{change['mean']:+.1f}%"
    return text + (f" ({change['runs_unfinished']} unfinished)" if change["runs_unfinished"]
                   else "")


def _paired_header(key: str) -> str:
    """A metric's heading without its unit (the paired table's cells are % changes)."""
    return metric_header(key).split(" (")[0]


def _paired_cell(value: dict) -> str:
    """``+1.2% ± 2.0 (6/12 better)``; the % runs named where some had a reference of 0."""
    runs, counted = value["runs"], value["runs_with_change"]
    change = "n/a" if value["mean"] is None else \
        f"{value['mean']:+.1f}% ± {_half_width(value['ci95'], counted, 1)}"
    if 0 < counted < runs:
        change += f" over {counted} run{'s' if counted > 1 else ''}"
    return f"{change} ({value['better_runs']}/{runs} better)"


def _half_width(ci95: float, runs: int, digits: int) -> str:
    """A 95% CI half-width as shown, n/a with fewer than 2 runs (`confidence` gives 0 there,
    which would read as an exact figure)."""
    return f"{ci95:,.{digits}f}" if runs > 1 else "n/a"


def _change(value: float, base: float, key: str, finished: bool = True) -> str:
    """`` (-23% ✓)``: the change of a mean against the reference's, none where the reference's
    is 0 or negligible (`NEGLIGIBLE_BASE`: 0.02 restarts per job made 1.5 "+7000%"); no ✓
    unless every run of the policy `finished` (else its JCTs are lower bounds)."""
    change = percent_change(value, base, key)
    if change is None:
        return ""
    if abs(change) < 0.5:
        return " (0%)"
    better = finished and (change < 0 if key in LOWER_IS_BETTER else change > 0)
    return f" ({change:+.0f}%{' ✓' if better else ''})"


def column_digits(means: list[float], share: bool = False) -> int:
    """Decimals of one results.md column, from its largest mean, so that a column reads in one
    format (``7 ± 30`` below ``134 ± 163``, not ``7.180 ± 30.130``); 3 for a `share` (0-1),
    where 0.994 against 0.999 of progress preserved is the difference that matters."""
    if share:
        return 3
    largest = max((abs(mean) for mean in means), default=0.0)
    return 0 if largest >= 100 else 1 if largest >= 10 else 2 if largest >= 1 else 3


def table_reference(report: dict) -> str | None:
    """The policy results.md's brackets compare against: the paired comparison's reference
    (--reference), else static; none when it is the only policy or was not evaluated."""
    policies = report["policies"]
    paired = report.get("paired") or {}
    reference = paired.get("reference", "static")
    return reference if reference in policies and len(policies) > 1 else None


def markdown_table(report: dict, metrics: tuple[str, ...] = REPORT_METRICS) -> str:
    """results.md's table: mean ± 95% CI per policy and metric, in one format per column, and
    the change of the mean against `table_reference`."""
    policies = report["policies"]
    reference = table_reference(report)
    base = policies[reference] if reference is not None else None
    digits = {key: column_digits([values[key]["mean"] for values in policies.values()],
                                 share=key in SHARE_METRICS)
              for key in metrics}
    lines = ["| policy | " + " | ".join(map(metric_header, metrics)) + " |",
             "|---|" + "---|" * len(metrics)]
    for name, values in policies.items():
        cells = []
        runs = counted_runs(report, name)
        for key in metrics:
            mean, ci = values[key]["mean"], values[key]["ci95"]
            cell = f"{mean:,.{digits[key]}f} ± {_half_width(ci, runs, digits[key])}"
            if base is not None and name != reference:
                cell += _change(mean, base[key]["mean"], key,
                                finished=not report["runs_unfinished"].get(name))
            cells.append(cell)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_report(report: dict, results: dict[RunSpec, dict], names: dict[str, str],
                 out: Path, reference: str | None = None) -> None:
    """results.json, results.md, runs.csv and the PNG plots into `out` (with `reference`, the
    policy of the paired comparison, also paired_avg_jct.png; an earlier run's is removed
    otherwise, so that it cannot pass for this run's).

    All of them are written into a hidden staging directory first and moved into `out` only
    once the last plot is saved (`staged_outputs`): the plots take seconds, and a run stopped
    by Ctrl-C or an error among them left this run's results.json and results.md beside the
    plots of the run that --force replaces. Now `out` keeps the earlier run whole instead."""
    paired = report.get("paired")
    if not (paired and paired["policies"]):
        reference = None  # one policy alone: nothing to pair
    with staged_outputs(out) as staging:
        write_json(staging / "results.json", report)
        write_atomic(staging / "results.md", results_markdown(report, reference is not None))
        write_atomic(staging / RUNS_CSV, runs_table(results, names))
        write_plots(results, names, staging, reference)
    if reference is None:
        remove_outputs(out, [PAIRED_PLOT])


def runs_table(results: dict[RunSpec, dict], names: dict[str, str]) -> str:
    """runs.csv: one row per run (policy label, workload, seed, whether every job finished,
    whether the run was given up, every metric), so that a comparison can be cut by workload or
    seed, which the means of results.json hide (one workload's loss inside an average gain,
    say)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["policy", "workload", "seed", "finished", "given_up", *METRIC_KEYS])
    for spec, result in results.items():
        writer.writerow([names[spec.policy], spec.workload, spec.seed, result["finished"],
                         bool(result.get("given_up")),
                         *(result["metrics"][key] for key in METRIC_KEYS)])
    return buffer.getvalue()


def results_markdown(report: dict, with_paired: bool) -> str:
    """results.md: the table, the note where seeds repeated one run, the paired table
    (`with_paired`), unfinished runs, each lookahead policy's deviations, the plots' names and
    a cluster file's content."""
    unfinished = {k: v for k, v in report["runs_unfinished"].items() if v}
    md = [f"# Policy comparison on {report['cluster']}",
          "",
          f"Workloads: {', '.join(report['workloads'])}; seeds {report['seeds']}; failures "
          f"`{report['failures']}`; efficiency `{report['efficiency']}` (a policy named "
          f"NAME@MODE runs under MODE). {_cell_legend(report)}",
          "",
          markdown_table(report),
          ""]
    repeat_note = _seeds_repeat_note(report)
    if repeat_note:
        md += [repeat_note, ""]
    if with_paired:
        paired = report["paired"]
        md += [f"Paired against `{paired['reference']}`: each run's change against its run on "
               "the same workload and seed, mean ± 95% CI, and on how many runs it was better.",
               "",
               paired_table(paired),
               ""]
        per_workload = workload_table(paired)
        if per_workload:
            md += [f"Avg JCT, % change against `{paired['reference']}` per workload (mean over "
                   "its seeds):", "", per_workload, ""]
    for name, counts in report["lookahead"].items():
        md += [_lookahead_line(name, counts), ""]
    for warning in report.get("warnings") or []:
        md += [f"**Warning:** {warning}", ""]
    if unfinished:
        md += [f"Runs stopped with jobs unfinished: {unfinished} (their JCTs and queueing "
               "count each unfinished job at its time in the system so far, a lower bound; no "
               "✓ and no run counted better for them).", ""]
    given_up = {k: v for k, v in report.get("runs_given_up", {}).items() if v}
    if given_up:
        md += [f"Of those, given up before the time limit: {given_up}: past "
               f"{report['give_up_factor']:g} x static's average or longest JCT on the same "
               f"workload and seed, or {DECISIONS_PER_FACTOR:g} x that many times its decision "
               "points (`--give-up-factor`).", ""]
    paired_png = f", {PAIRED_PLOT}" if with_paired else ""
    md.append(f"Each run's metrics: {RUNS_CSV}. "
              f"Plots: jct_cdf.png, gpu_util.png, queue_length.png{paired_png}.")
    if report.get("cluster_file"):
        md += ["", *cluster_markdown(report["cluster_file"])]
    return "\n".join(md) + "\n"


def _lookahead_line(name: str, counts: dict) -> str:
    """results.md's line on how often lookahead policy `name` left its base (`lookahead_totals`),
    as `rlalloc simulate` prints it: a planner that never deviated is its base, at a second of
    simulation per contested decision."""
    runs = counts["runs"]
    return (f"`{name}` left its base at {counts['deviations']:,} of the {counts['contested']:,} "
            "decisions where its heuristics' proposals differed (contested), summed over its "
            f"{runs} run{'s' if runs > 1 else ''}.")


def _seeds_repeat_note(report: dict) -> str | None:
    """results.md's line under the table where seeds repeated one run (`repeated_runs`): that
    those runs count once in the ± and the paired counts (no ± for a policy left with one run),
    and how to get runs that vary."""
    repeated = report.get("seeds_repeat") or {}
    if not repeated:
        return None
    copies, workloads = len(report["seeds"]), report["workloads"]
    everywhere = all(len(on) == len(workloads) for on in repeated.values())
    if everywhere and len(repeated) == len(report["policies"]):
        where = "every policy on each workload"
    elif everywhere:
        where = ", ".join(f"`{name}`" for name in repeated) + " on each workload"
    else:
        where = "; ".join(f"`{name}` on {', '.join(Path(w).name for w in on)}"
                          for name, on in repeated.items())
    counted = ("so there is one run and no ±" if len(workloads) == 1 and everywhere else
               "so the paired counts take each such run once, not as "
               f"{copies} independent copies, and the ± counts the runs no more than they "
               f"spread (Kish's effective number; the means weigh it as {copies} runs)")
    return (f"Note: all {copies} seeds gave the same run for {where}: nothing in these runs "
            "depended on the seed (from a workload file only failures do, and none happened), "
            f"{counted}. Use --failures or a synthetic workload for runs that vary.")


def _cell_legend(report: dict) -> str:
    """What a cell of results.md's table shows: the CI only where there are runs to spread,
    the change against `table_reference` only where it was evaluated with others."""
    workloads = len(report["workloads"])
    runs = workloads * len(report["seeds"])
    repeat = ("; a run that every seed repeated is not counted as independent copies in "
              "the ±, below"
              if report.get("seeds_repeat") else "")
    legend = (f"Each cell: mean ± 95% CI (t-distribution over {runs} runs = seeds × workloads"
              f"{repeat})" if runs > 1 else
              "Each cell: the one run's value (one seed, one workload: no CI, n/a)")
    reference = table_reference(report)
    if reference is not None:
        legend += (f"; in brackets the change of the mean against `{reference}`'s (✓ = better; "
                   "none where its value is 0 or next to it)")
    return legend + "."
