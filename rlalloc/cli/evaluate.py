"""`rlalloc evaluate`: compare allocation policies over workloads and seeds, with 95% CIs.

Writes DIR/results.json (``mean`` and ``ci95``, the 95% confidence half-width, of every metric
per policy, over seeds x workloads, t-distribution; ``ci95`` is 0 for a single run, which has no
spread to measure, and results.md shows n/a there), DIR/results.md (a table with each policy's
change against the reference policy, --reference below), DIR/runs.csv (each run's metrics) and
plots: JCT CDF per policy, GPU utilisation and queue length over time. results.json's
``sources`` maps each label to the --policies entry it stands for (a saved model is labelled by
its directory's name, or by its path where that name is taken: see `policy_labels`). Its
``cluster`` is --cluster as given; ``cluster_file`` records a cluster YAML's content as it was
used (`rlalloc.env.cluster.cluster_record`; null for NODESxGPUS), and results.md shows it. Its
``seeds_repeat`` maps each policy to the workloads on which its every seed gave the same run
(`repeated_runs`): its CIs and paired counts take those runs once (`distinct_runs`), while
the means still weigh every (workload, seed) alike (`confidence`), and results.md says so
under its table. Its ``lookahead`` gives each lookahead policy's (a planner's, `rlalloc planner
fit`) contested decisions and deviations from its base, summed over its runs
(`lookahead_totals`; results.md has a line per such policy). All of these files replace
an earlier run's together or not at all (`write_report`).

Both also hold a *paired* comparison against a reference policy (``--reference``): each run's
change against the reference's run on the same workload and seed. Workloads differ far more
from each other than close policies do, so the unpaired CIs of two good policies overlap even
where one is better on every run; the paired CI and the count of runs won answer "is A better
than B here" directly (plot: paired_avg_jct.png). With several workloads, the average JCT's
change per workload too (``paired.avg_jct_by_workload``, a table in results.md).

Runs go to parallel worker processes (one per core by default): one run is seconds of pure
Python, far more than the cost of a process.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlalloc.cli.argtypes import POSITIVE_INT, AppendOnce, unique_names
from rlalloc.env.cluster import add_cluster_flag, cluster_markdown, cluster_record
from rlalloc.env.efficiency import EFFICIENCY_MODES, add_efficiency_flag
from rlalloc.env.errors import UserError
from rlalloc.env.metrics import METRIC_KEYS
from rlalloc.env.output import (
    add_out_flags,
    out_dir_for_run,
    remove_outputs,
    staged_outputs,
    write_atomic,
    write_json,
)
from rlalloc.env.workers import ordered_results, worker_pool
from rlalloc.env.workload.loader import EMBEDDED_DEFAULT
from rlalloc.forecaster.signals import default_signals

DEFAULT_POLICIES = ("static,tiresias,elastic,reactive,proactive,elastic-srpt,elastic-srpt-0.25,"
                    "ppo,dqn")
REPORT_METRICS = ("avg_jct_s", "p95_jct_s", "avg_queue_s", "makespan_s", "gpu_util", "goodput",
                  "lost_gpu_hours", "restarts_per_job", "progress_preserved", "ettr",
                  "energy_kwh")
"""Columns of results.md (results.json has every metric of `METRIC_KEYS`)."""
PAIRED_METRICS = ("avg_jct_s", "p95_jct_s", "avg_queue_s", "makespan_s", "gpu_util",
                  "restarts_per_job")
"""Metrics of the paired comparison against --reference."""
LOWER_IS_BETTER = {"avg_jct_s", "p50_jct_s", "p95_jct_s", "p99_jct_s", "avg_queue_s",
                   "makespan_s", "lost_gpu_hours", "restarts_per_job", "mean_recovery_s",
                   "energy_kwh", "failures", "invalid_actions"}
_SERIES_POINTS = 400
PAIRED_PLOT = "paired_avg_jct.png"
RUNS_CSV = "runs.csv"
OUTPUT_FILES = ("results.json", "results.md", RUNS_CSV, "jct_cdf.png", "gpu_util.png",
                "queue_length.png", PAIRED_PLOT)
"""What `rlalloc evaluate` writes into --out (paired_avg_jct.png only with two policies or
more; under --force a run removes an earlier run's that it does not write itself)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `rlalloc evaluate`."""
    parser.add_argument("--workload", action=AppendOnce, dest="workloads", metavar="W",
                        help="workload (repeatable, each once): CSV path or "
                             "synthetic[:NUM_JOBS[:LOAD[:MAX_HOURS]]]; "
                             f"default {EMBEDDED_DEFAULT} (the embedded generator)")
    add_cluster_flag(parser)
    parser.add_argument("--policies", type=unique_names, default=DEFAULT_POLICIES,
                        help="comma-separated built-in names or saved-model directories, each "
                             "once "
                             f"(default {DEFAULT_POLICIES}); NAME@MODE runs one under another "
                             "--efficiency, e.g. tiresias@fixed,elastic@adaptive as Pollux "
                             "compared them")
    parser.add_argument("--seeds", type=POSITIVE_INT, default=3,
                        help="seeds per workload (failure process; synthetic draws too; "
                             "default: %(default)s)")
    parser.add_argument("--failures", default="default",
                        help="failures per GPU-day or none|default|stress (default: default)")
    add_efficiency_flag(parser)
    parser.add_argument("--reference", default=None, metavar="POLICY",
                        help="policy of --policies every other is compared with run by run, "
                             "as given there or by its label in results.md (default: static if "
                             "listed, else the first)")
    parser.add_argument("--jobs", type=POSITIVE_INT, default=min(2, os.cpu_count() or 1),
                        help="parallel worker processes")
    add_out_flags(parser, Path("runs/evaluate"))


@dataclass(frozen=True)
class RunSpec:
    """One simulation: a policy on a workload with a seed."""

    policy: str
    workload: str
    seed: int
    cluster: str
    failures_per_gpu_day: float
    efficiency: str = "none"


def _run_one(spec: RunSpec) -> dict:
    """Worker: run one simulation and return its metrics, JCTs, down-sampled series and, for a
    lookahead policy, its decision counts (`lookahead_counts`; None otherwise). The policy is
    loaded afresh per run, so the counts are this run's. Torch, where the policy loads it, runs
    on one thread: in a worker and in the --jobs 1 main process alike, so that both give the
    same numbers."""
    from rlalloc.agent.evaluation import lookahead_counts, run_policy
    from rlalloc.agent.registry import load_policy
    from rlalloc.env.failures import FailureParams
    from rlalloc.env.params import SimParams
    from rlalloc.env.scenario import build_scenario
    from rlalloc.env.workers import torch_on_one_thread

    params = SimParams(failures=FailureParams(failures_per_gpu_day=spec.failures_per_gpu_day))
    policy, efficiency = policy_and_mode(spec.policy, spec.efficiency)
    scenario = build_scenario(spec.workload, spec.cluster, seed=spec.seed, efficiency=efficiency, signals=default_signals())
    loaded = load_policy(policy)
    torch_on_one_thread()
    result = run_policy(scenario.simulator(params, seed=spec.seed), loaded.act)
    step = max(1, len(result.series["t"]) // _SERIES_POINTS)
    series = {k: v[::step] for k, v in result.series.items()}
    return {"metrics": result.metrics, "finished": result.finished, "jcts_s": result.jcts_s,
            "series": series, "lookahead": lookahead_counts(loaded)}


def policy_and_mode(entry: str, default: str) -> tuple[str, str]:
    """A --policies entry as (policy, efficiency mode): ``NAME@MODE``, or `default` for a plain
    name (or a saved-model path, which may itself contain an ``@``)."""
    name, at, mode = entry.rpartition("@")
    if not at or Path(entry).exists():
        return entry, default
    if mode not in EFFICIENCY_MODES:
        raise UserError(f"--policies {entry}: {mode!r} is not an efficiency mode; write "
                        f"NAME@{'|'.join(EFFICIENCY_MODES)}")
    return name, mode


def policy_labels(policies: list[str], efficiency: str) -> dict[str, str]:
    """Each --policies entry's label in the report: its policy's name (a saved model's
    directory name) and any ``@MODE``, or, where such labels would pass for other policies,
    every entry as given: two entries sharing a label, or a saved model named like a
    built-in (``runs/ppo`` is not the shipped ``ppo``). Loading each policy here fails fast,
    with the list of valid names."""
    from rlalloc.agent.registry import builtin_names, load_policy

    labels, misleading = {}, False
    for entry in policies:
        policy, _ = policy_and_mode(entry, efficiency)
        name = load_policy(policy).name
        labels[entry] = name + entry[len(policy):]
        misleading |= name != policy and name in builtin_names()
    if misleading or len(set(labels.values())) < len(labels):
        return {entry: entry for entry in policies}
    return labels


def confidence(values: list[float], copies: list[int] | None = None) -> dict[str, float]:
    """Mean and 95% confidence half-width (Student t over the runs). One run has no spread
    to measure: its half-width is 0, which the tables show as n/a.

    `copies`: how many runs each value stands for (`distinct_runs`: a run every seed repeated
    stands for all of them), so that the mean weighs every (workload, seed) alike, as the runs
    were asked for, while the half-width takes Kish's effective sample size of those weights
    ((sum w)^2 / sum w^2: the distinct runs' count when they all stand for as many, fewer when
    some stand for more), never the copies as independent runs. Without weights a workload
    whose seeds repeated weighed 1/(seeds+1) of two workloads instead of 1/2, and could
    reverse a comparison."""
    from scipy import stats

    array = np.asarray(values, dtype=float)
    weights = np.ones(len(array)) if copies is None else np.asarray(copies, dtype=float)
    mean = float(np.average(array, weights=weights))
    if len(array) < 2:
        return {"mean": mean, "ci95": 0.0}
    n = weights.sum() ** 2 / np.sum(weights ** 2)
    variance = np.average((array - mean) ** 2, weights=weights) * n / (n - 1)
    half = stats.t.ppf(0.975, n - 1) * np.sqrt(variance) / np.sqrt(n)
    return {"mean": mean, "ci95": float(half)}


def run(args: argparse.Namespace) -> int:
    """Validate inputs, run every (policy, workload, seed) and write the report."""
    from tqdm import tqdm

    from rlalloc.env.failures import parse_failure_rate
    from rlalloc.env.scenario import build_scenario, require_applications

    policies = args.policies
    if not policies:
        raise UserError("--policies is empty; give e.g. static,elastic,ppo")
    names = policy_labels(policies, args.efficiency)
    modes = {policy_and_mode(entry, args.efficiency)[1] for entry in policies}
    reference = args.reference or ("static" if "static" in policies else policies[0])
    by_label = {name: entry for entry, name in names.items()}  # results.md names a saved
    reference = by_label.get(reference, reference)  # policy by its label: that is accepted too
    if reference not in policies:
        raise UserError(f"--reference {reference}: not among --policies ({', '.join(policies)}); "
                        "name one of them")
    workloads = args.workloads or [EMBEDDED_DEFAULT]
    for mode in modes:  # fails fast on a bad workload, cluster, profile or efficiency mode
        require_applications([build_scenario(workload, args.cluster, seed=0, efficiency=mode, signals=default_signals())
                              for workload in workloads], mode, workloads)
    warnings = _planner_warnings(policies, workloads, args.cluster)
    for warning in warnings:
        print(f"rlalloc: warning: {warning}", file=sys.stderr)
    cluster_file = cluster_record(args.cluster)  # the path alone dangles once the file moves
    rate = parse_failure_rate(args.failures)
    # after the checks (a refused run leaves no directory), before hours of runs; a stopped
    # run leaves no new directory behind
    with out_dir_for_run(args.out, list(OUTPUT_FILES), args.force):
        seeds = list(range(args.seeds))
        specs = [RunSpec(p, w, s, args.cluster, rate, args.efficiency) for p in policies
                 for w in workloads for s in seeds]
        results: dict[RunSpec, dict] = {}
        with tqdm(total=len(specs), desc="evaluate", unit="run") as bar:
            if args.jobs > 1:
                with worker_pool(args.jobs) as pool:
                    runs = ordered_results(pool, _run_one, specs)
                    for spec, result in zip(specs, runs, strict=True):
                        results[spec] = result
                        bar.update()
            else:
                for spec in specs:
                    results[spec] = _run_one(spec)
                    bar.update()
        report = summarise(results, names, workloads, seeds, args.cluster, args.failures,
                           args.efficiency)
        report["cluster_file"] = cluster_file
        report["warnings"] = warnings
        report["paired"] = paired_changes(results, names, reference)
        write_report(report, results, names, args.out, reference)
    print(f"wrote {args.out / 'results.json'}, results.md, {RUNS_CSV} and plots")
    return 0


def _planner_warnings(policies: list[str], workloads: list[str], cluster: str) -> list[str]:
    """A line per planner directory among `policies` that draws its futures from one of the
    evaluated `workloads` (`rlalloc.agent.planner.drawn_from`): its score there is flattered."""
    from rlalloc.agent.planner import drawn_from
    from rlalloc.agent.registry import PLANNER_FILE
    from rlalloc.env.scenario import build_scenario

    planners = [entry for entry in policies
                if (Path(policy_and_mode(entry, "none")[0]) / PLANNER_FILE).is_file()]
    if not planners:
        return []
    scenarios = {w: build_scenario(w, cluster, seed=0, signals=default_signals()) for w in workloads}
    warnings = []
    for entry in planners:
        if own := drawn_from(Path(policy_and_mode(entry, "none")[0]), scenarios):
            warnings.append(f"{entry} was fitted on {', '.join(own)}: it draws its futures "
                            "from that workload's own arrivals, next hour included, so its "
                            "score there is flattered; compare it on workloads it was not "
                            "fitted on")
    return warnings


def summarise(results: dict[RunSpec, dict], names: dict[str, str], workloads: list[str],
              seeds: list[int], cluster: str, failures: str, efficiency: str = "none") -> dict:
    """The results.json document (its ``lookahead``: `lookahead_totals`)."""
    policies: dict[str, dict] = {}
    unfinished: dict[str, int] = {}
    repeated = repeated_runs(results)
    counted = distinct_runs(results, repeated)
    for policy, name in names.items():
        runs = [r for spec, r in counted.items() if spec.policy == policy]
        policies[name] = {key: confidence([r["metrics"][key] for r in runs],
                                          [r["copies"] for r in runs])
                          for key in METRIC_KEYS}
        unfinished[name] = sum(not r["finished"] for r in runs)
    return {"policies": policies, "sources": {name: entry for entry, name in names.items()},
            "workloads": workloads, "seeds": seeds, "cluster": cluster, "failures": failures,
            "efficiency": efficiency, "runs_unfinished": unfinished,
            "seeds_repeat": {name: [w for w in workloads if (policy, w) in repeated]
                             for policy, name in names.items()
                             if any(owner == policy for owner, _ in repeated)},
            "lookahead": lookahead_totals(counted, names)}


def lookahead_totals(results: dict[RunSpec, dict], names: dict[str, str]) -> dict[str, dict]:
    """Per lookahead policy (a planner; label -> counts), its decisions contested (where its
    heuristics' proposals differed) and deviations from its base, summed over its ``runs``;
    other policies are left out. Sums, not means: deviations / contested is then the rate over
    every decision, and a run with few contested decisions weighs as little as it counts.
    A key of its own beside ``policies``, whose every entry is a metric's mean and CI for every
    policy: these are counts, of some policies only, like ``lookahead`` in `rlalloc simulate`'s
    metrics.json."""
    totals: dict[str, dict] = {}
    for policy, name in names.items():
        counts = [r["lookahead"] for spec, r in results.items() if spec.policy == policy]
        if all(count is not None for count in counts):
            totals[name] = {"contested": sum(c["contested"] for c in counts),
                            "deviations": sum(c["deviations"] for c in counts),
                            "runs": len(counts)}
    return totals


def repeated_runs(results: dict[RunSpec, dict]) -> set[tuple[str, str]]:
    """The (policy, workload) pairs (a --policies entry, a --workload) on which every seed gave
    the same metrics: read off the runs, not the flags, since whether anything draws from the
    seed depends on the workload, the failure rate and the policy. A workload file without
    failures replays the same run under every seed, and so does one with failures where none
    struck; a synthetic workload beside it draws new jobs per seed."""
    metrics: dict[tuple[str, str], list[dict]] = {}
    for spec, result in results.items():
        metrics.setdefault((spec.policy, spec.workload), []).append(result["metrics"])
    return {key for key, values in metrics.items()
            if len(values) > 1 and all(_same_metrics(values[0], other) for other in values[1:])}


def distinct_runs(results: dict[RunSpec, dict], repeated: set[tuple[str, str]],
                  together: tuple[str, ...] = ()) -> dict[RunSpec, dict]:
    """`results` less the copies of the `repeated` runs: their first seed's run only, its
    ``copies`` the number of runs it stands for (1 elsewhere; `confidence` weighs by it).
    Counted as independent, 3 copies of 4 runs made CIs 2.8x too narrow and "12 of 12 better"
    out of 4 (results.json's ``seeds_repeat`` names them). With `together` (the two policies of
    a paired comparison), a workload's runs are copies only where all of them repeated there:
    pairs with a run that varies by seed are distinct pairs."""
    first = min((spec.seed for spec in results), default=0)
    seeds = len({spec.seed for spec in results})

    def repeats(spec: RunSpec) -> bool:
        return all((o, spec.workload) in repeated for o in together or (spec.policy,))

    return {spec: {**result, "copies": seeds if repeats(spec) else 1}
            for spec, result in results.items() if spec.seed == first or not repeats(spec)}


def counted_runs(report: dict, name: str) -> int:
    """How many runs policy `name`'s mean and CI in `report` are over: one per workload where
    its seeds repeated one run (``seeds_repeat``), one per seed elsewhere."""
    repeated = set((report.get("seeds_repeat") or {}).get(name, []))
    seeds = len(report["seeds"])
    return sum(1 if workload in repeated else seeds for workload in report["workloads"])


def _same_metrics(first: dict[str, float], second: dict[str, float]) -> bool:
    """Whether two runs' metrics are equal, NaN (a metric with nothing to measure) included."""
    keys = sorted(first)
    return keys == sorted(second) and bool(np.array_equal(
        np.asarray([first[k] for k in keys], dtype=float),
        np.asarray([second[k] for k in keys], dtype=float), equal_nan=True))


@dataclass(frozen=True)
class Pair:
    """A run of a policy and the reference's run on the same workload and seed."""

    metrics: dict
    base: dict
    """The reference's metrics."""
    copies: int
    """Runs the pair stands for (`distinct_runs`)."""
    finished: bool
    """Whether the policy's run finished every job: if not, its JCTs are lower bounds
    (`RunAccounting.summary`), so it is never counted better."""


def paired_runs(results: dict[RunSpec, dict], policy: str, reference: str,
                workload: str | None = None) -> list[Pair]:
    """A `Pair` for each workload (or `workload` alone) and seed both ran."""
    base = {(spec.workload, spec.seed): r["metrics"] for spec, r in results.items()
            if spec.policy == reference}
    return [Pair(r["metrics"], base[spec.workload, spec.seed], r.get("copies", 1),
                 r["finished"])
            for spec, r in results.items()
            if spec.policy == policy and (spec.workload, spec.seed) in base
            and workload in (None, spec.workload)]


NEGLIGIBLE_BASE = {"avg_queue_s": 1.0, "restarts_per_job": 0.01}
"""Reference values too small to take a % change against: a reference that queued jobs for
0.02 s on average made another policy's 15 s "+73,925 %", a figure that says nothing about
either. Jobs run for hours, so a second of mean queueing or a restart per hundred jobs is none."""


def percent_change(value: float, base: float, key: str) -> float | None:
    """The % change of `value` of metric `key` against the reference's `base`; None where
    `base` is 0 or negligible (`NEGLIGIBLE_BASE`; e.g. no queueing at all)."""
    if abs(base) <= NEGLIGIBLE_BASE.get(key, 0.0):
        return None
    return 100.0 * (value - base) / abs(base)


def percent_changes(runs: list[Pair], key: str) -> tuple[list[float], list[int]]:
    """Per run, the % change of `key` against the reference (`percent_change`), and the runs
    each stands for (`Pair.copies`, `confidence`'s weights); runs whose reference value is
    negligible are left out here and count only towards better/worse in `paired_changes`."""
    kept = [(percent_change(pair.metrics[key], pair.base[key], key), pair.copies)
            for pair in runs]
    kept = [(change, copies) for change, copies in kept if change is not None]
    return [change for change, _ in kept], [copies for _, copies in kept]


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


def paired_changes(results: dict[RunSpec, dict], names: dict[str, str], reference: str,
                   metrics: tuple[str, ...] = PAIRED_METRICS) -> dict:
    """Every other policy's per-run % change against `reference` on the same workload and
    seed: mean ± 95% CI of the changes, and on how many runs it was better (results.json's
    ``paired``); and its average JCT's change per workload (`workload_change`)."""
    paired: dict[str, dict] = {}
    by_workload: dict[str, dict] = {}
    workloads = list(dict.fromkeys(spec.workload for spec in results))
    repeated = repeated_runs(results)
    for policy, name in names.items():
        if policy == reference:
            continue
        # pairs of two runs that both repeated over the seeds are copies of one pair
        pairs = distinct_runs(results, repeated, (policy, reference))
        runs = paired_runs(pairs, policy, reference)
        paired[name] = {}
        for key in metrics:
            sign = -1.0 if key in LOWER_IS_BETTER else 1.0
            changes, copies = percent_changes(runs, key)
            better = sum(pair.finished and sign * (pair.metrics[key] - pair.base[key]) > 0
                         for pair in runs)
            paired[name][key] = {**(confidence(changes, copies) if changes
                                    else {"mean": None, "ci95": None}),
                                 "unit": "%", "runs_with_change": len(changes),
                                 "better_runs": better, "runs": len(runs)}
        by_workload[name] = {workload: workload_change(pairs, policy, reference, workload)
                             for workload in workloads}
    return {"reference": names[reference], "policies": paired,
            "avg_jct_by_workload": by_workload}


def workload_change(results: dict[RunSpec, dict], policy: str, reference: str,
                    workload: str) -> dict:
    """`policy`'s mean % change of average JCT against `reference` on `workload` (over its
    seeds; None where no run has one), and how many of the runs of either left jobs
    unfinished: their average is a lower bound (`RunAccounting.summary`). An average gain
    can hide one workload's loss (results.json's ``paired.avg_jct_by_workload``)."""
    changes, _ = percent_changes(paired_runs(results, policy, reference, workload),
                                 "avg_jct_s")  # one workload: every pair stands for as many
    unfinished = sum(not r["finished"] for spec, r in results.items()
                     if spec.workload == workload and spec.policy in (policy, reference))
    return {"mean": float(np.mean(changes)) if changes else None,
            "runs_unfinished": unfinished}


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
                  "limit; their avg JCT is a lower bound (each unfinished job at its time in the "
                  "system so far), so the % is not to be trusted."]
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
        _plots(results, names, staging, reference)
    if reference is None:
        remove_outputs(out, [PAIRED_PLOT])


def runs_table(results: dict[RunSpec, dict], names: dict[str, str]) -> str:
    """runs.csv: one row per run (policy label, workload, seed, whether every job finished,
    every metric), so that a comparison can be cut by workload or seed, which the means of
    results.json hide (one workload's loss inside an average gain, say)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["policy", "workload", "seed", "finished", *METRIC_KEYS])
    for spec, result in results.items():
        writer.writerow([names[spec.policy], spec.workload, spec.seed, result["finished"],
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
        md += [f"Runs stopped at the time limit with jobs unfinished: {unfinished} (their "
               "JCTs and queueing count each unfinished job at its time in the system so far, "
               "a lower bound; no ✓ and no run counted better for them).", ""]
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


PAIRED_LOG_RATIO = 3.0
"""paired_avg_jct.png turns to a log axis (of each run's JCT ratio to the reference, labelled as
% change) once the largest ratio is this many times the smallest: on a linear axis a policy at
+450% squeezes the close ones, which the plot is there to separate, into a few pixels."""
PAIRED_MIN_SPAN_PCT = 1.0
"""A linear paired axis reaches at least this many % either side of 0: scaled to its data alone,
a change of +0.007 % spread over the whole width and read as large as one of +50 %. Close
policies in docs/agent.md differ by about 1-5 % (elastic-srpt-0.25 against elastic-srpt -0.9 %,
the planner against its base -1.9 %), so on this span a change well under 1 % looks small and
one of those still stands apart from 0; larger changes widen the axis as before."""
_CHANGE_TICKS = (-99, -95, -90, -75, -50, -25, -10, 0, 10, 25, 50, 100, 200, 400, 900, 1900,
                 4900, 9900)


def paired_axis_is_log(ratios: list[float]) -> bool:
    """Whether the paired plot's x axis is logarithmic for these JCT ratios (`PAIRED_LOG_RATIO`)."""
    return bool(ratios) and min(ratios) > 0 and max(ratios) > PAIRED_LOG_RATIO * min(ratios)


def _change_ticks(low_ratio: float, high_ratio: float, labels: int = 12) -> list[float]:
    """Ratios to label on a log paired axis, at round % changes from 0 outwards, no two closer
    than 1/`labels` of the axis (labels of +0% and +10% overlapped on a 0.5x-5x axis)."""
    gap = np.log10(high_ratio / low_ratio) / labels
    ratios = [1.0 + change / 100.0 for change in _CHANGE_TICKS]
    kept = [1.0]
    for side in ([r for r in ratios if r > 1.0], [r for r in reversed(ratios) if r < 1.0]):
        last = 1.0
        for ratio in side:
            if low_ratio <= ratio <= high_ratio and abs(np.log10(ratio / last)) >= gap:
                kept.append(ratio)
                last = ratio
    return sorted(kept)


def _percent(change: float) -> str:
    """A tick label of a % change: ``-25%``, ``0%``, ``+2.5%``."""
    if abs(change) < 1e-9:
        return "0%"
    return f"{change:+,.6g}%"  # every digit the tick has: +12.5%, not a rounded +12%


def _scope(results: dict[RunSpec, dict]) -> str:
    """What a figure's runs cover, for its title: workloads, cluster, seeds, failures."""
    if not results:
        return ""
    specs = list(results)
    workloads = sorted({spec.workload for spec in specs})
    seeds = len({spec.seed for spec in specs})
    what = Path(workloads[0]).name if len(workloads) == 1 else f"{len(workloads)} workloads"
    rate = specs[0].failures_per_gpu_day
    failures = f"failures {rate:g}/GPU-day" if rate else "no failures"
    return f"{what} on {specs[0].cluster}, {seeds} seed{'s' if seeds > 1 else ''}, {failures}"


def _paired_plot(results: dict[RunSpec, dict], names: dict[str, str], reference: str,
                 out: Path, colors: dict[str, str]) -> None:
    """paired_avg_jct.png: every run's avg-JCT change against `reference`, per policy in
    results.md's order, with the mean and its 95% CI: the spread the paired CI summarises, and
    which workloads drive it. The axis is a log one of JCT ratios where they span a lot, a
    linear one at least `PAIRED_MIN_SPAN_PCT` either side of 0 otherwise."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    others = [p for p in names if p != reference]
    repeated = repeated_runs(results)  # each pair once, as in results.json's paired CIs
    changes = {p: percent_changes(paired_runs(distinct_runs(results, repeated, (p, reference)),
                                              p, reference), "avg_jct_s")
               for p in others}
    ratios = [1.0 + change / 100.0 for values, _ in changes.values() for change in values]
    log = paired_axis_is_log(ratios)

    def x(change: float | np.ndarray) -> float | np.ndarray:
        return 1.0 + np.asarray(change) / 100.0 if log else np.asarray(change)

    fig, ax = plt.subplots(figsize=(8, 0.5 * len(others) + 2.2), layout="constrained")
    for row, policy in enumerate(others):
        values, copies = changes[policy]
        ax.scatter(x(values), np.full(len(values), row), s=18, alpha=0.6,
                   color=colors[policy], zorder=3)
        if values:
            stats = confidence(values, copies)
            mean, half = stats["mean"], stats["ci95"]
            low = mean - half
            if log:  # a CI reaching -100% or below has no place on a log axis: cut at its edge
                low = max(low, 100.0 * (0.8 * min(ratios) - 1.0))
            ax.plot([x(low), x(mean + half)], [row, row], color="black", lw=1, marker="|",
                    markersize=7, zorder=2)
            ax.plot([x(mean)] * 2, [row - 0.3, row + 0.3], color="black", lw=2, zorder=4)
    ax.axvline(x(0.0), color="grey", lw=1)
    ax.set_yticks(range(len(others)), [names[p] for p in others])
    ax.set_ylim(len(others) - 0.5, -0.5)  # the first policy on top, as in results.md
    if log:
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(FixedLocator(_change_ticks(*ax.get_xlim())))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda r, _: _percent(100 * (r - 1))))
    else:
        low, high = ax.get_xlim()
        ax.set_xlim(min(low, -PAIRED_MIN_SPAN_PCT), max(high, PAIRED_MIN_SPAN_PCT))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _percent(v)))
    ax.set_xlabel(f"avg JCT change per run against {names[reference]} (lower is better"
                  + (", log scale" if log else "") + ")")
    ax.set_title(f"Paired avg JCT against {names[reference]}: dots runs, bar mean, line 95% CI"
                 f"\n{_scope(results)}", fontsize=10)
    ax.grid(alpha=0.3, axis="x")
    fig.savefig(out / PAIRED_PLOT, dpi=120)
    plt.close(fig)


def _legend(ax: object) -> None:
    """A legend right of the axes, where it covers no line, when some policy drew one (none
    finished a job: an empty plot, no legend)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


Curve = tuple[np.ndarray, np.ndarray]
"""One policy's line in a figure: its x and y values."""
_DASH = 4.0
"""Length of one dash of a line drawn over an equal one (`_dash_style`), in line widths."""


def same_curves(curves: dict[str, Curve]) -> dict[str, str]:
    """Each policy whose curve is the same as an earlier one's (in `curves`' order, `_same`) ->
    that earlier policy: a policy and the heuristic it equals, or a learned policy that never
    moved off its start, draw one line, and the later would hide the earlier entirely."""
    same: dict[str, str] = {}
    for i, (policy, curve) in enumerate(curves.items()):
        for earlier, earlier_curve in list(curves.items())[:i]:
            if earlier not in same and _same(curve, earlier_curve):
                same[policy] = earlier
                break
    return same


def _same(first: Curve, second: Curve) -> bool:
    """Whether two curves draw the same line: equal where both are drawn, and the one that
    goes on further stays at the other's last value after that one ends (at its first before
    it starts). Then whichever is drawn later covers the other wherever that one shows, and
    where one goes on alone its own line shows it. Compared as drawn, straight between points,
    not point by point: two runs that end at different times, all-zero queues say, have series
    of different lengths, down-sampled at different steps (`_SERIES_POINTS`), and drew over
    each other solid though their lines coincide. Two piecewise-linear lines agree everywhere
    if they agree at every point of either; an x repeated (a vertical step, as in a CDF) is
    compared at the step's two ends. A curve without points (a run that recorded none) is the
    same only as another without."""
    lines = [tuple(np.asarray(values, dtype=float) for values in curve)
             for curve in (first, second)]
    if not (len(lines[0][0]) and len(lines[1][0])):
        return len(lines[0][0]) == len(lines[1][0])
    return all(np.allclose(_line_at(other, line[0]), _line_at(line, line[0]), rtol=1e-9,
                           atol=1e-12, equal_nan=True)
               for line, other in (lines, lines[::-1]))


def _line_at(curve: Curve, at: np.ndarray) -> np.ndarray:
    """`curve`'s line (x increasing) at each of `at`, held at its ends outside its x: the value
    coming from the left and the one leaving to the right (they differ at a vertical step)."""
    x, y = curve
    return np.stack([np.interp(-at, -x[::-1], y[::-1]), np.interp(at, x, y)])


def _dash_style(member: int, members: int) -> tuple[float, tuple[float, float]]:
    """The dash pattern of the `member`-th (from 1) of `members` equal curves drawn over the
    first, which stays solid beneath: each takes its own `_DASH`-long turn of a period of
    `members` dashes, the last turn left to the solid one, so every colour shows along the
    line."""
    period = _DASH * members
    return ((period - _DASH * (member - 1)) % period, (_DASH, period - _DASH))


def _draw_curves(ax: object, curves: dict[str, Curve], names: dict[str, str],
                 colors: dict[str, str], lw: float) -> None:
    """Each policy's curve in its colour, labelled by its name; one equal to an earlier
    policy's (`same_curves`) dashed over it and labelled "(same as X)", so that both stay
    visible and the legend says why they share a line."""
    same = same_curves(curves)
    members = {policy: 1 + sum(first == policy for first in same.values()) for policy in curves}
    turns: dict[str, int] = {}
    for policy, (x, y) in curves.items():
        first = same.get(policy)
        if first is None:
            ax.plot(x, y, label=names[policy], color=colors[policy], lw=lw)
            continue
        turns[first] = turns.get(first, 0) + 1
        ax.plot(x, y, label=f"{names[policy]} (same as {names[first]})", color=colors[policy],
                lw=lw, linestyle=_dash_style(turns[first], members[first]))


def _plots(results: dict[RunSpec, dict], names: dict[str, str], out: Path,
           reference: str | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    # one colour per policy in every figure (the paired plot leaves the reference out, which
    # would otherwise shift matplotlib's colour cycle by one there)
    colors = {policy: f"C{i % 10}" for i, policy in enumerate(names)}
    if reference is not None:
        _paired_plot(results, names, reference, out, colors)

    fig, ax = plt.subplots(figsize=(8.5, 4.5), layout="constrained")
    cdfs: dict[str, Curve] = {}
    for policy in names:
        jcts = np.sort(np.concatenate([r["jcts_s"] for s, r in results.items()
                                       if s.policy == policy] or [np.zeros(0)]))
        if len(jcts):  # a zero-length job (a zero duration in the trace) has no log position
            cdfs[policy] = (np.maximum(jcts, 1.0) / 3600.0,
                            np.arange(1, len(jcts) + 1) / len(jcts))
    _draw_curves(ax, cdfs, names, colors, lw=1.5)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # 0.01, not 10^-2
    ax.set_xlabel("job completion time (h, log scale)")
    ax.set_ylabel("share of jobs finished within it")
    ax.set_title(f"JCT CDF per policy, every job of every run\n{_scope(results)}", fontsize=10)
    ax.grid(alpha=0.3)
    _legend(ax)
    fig.savefig(out / "jct_cdf.png", dpi=120)
    plt.close(fig)
    first = min(results, key=lambda s: (s.workload, s.seed)) if results else None
    for key, what, label, file in (
            ("alloc_gpus", "Allocated GPUs", "allocated GPUs (share of cluster)",
             "gpu_util.png"),
            ("queued_jobs", "Jobs waiting", "jobs waiting (holding no GPU)",
             "queue_length.png")):
        fig, ax = plt.subplots(figsize=(8.5, 4.5), layout="constrained")
        over_time: dict[str, Curve] = {}
        for policy in names:
            spec = next((s for s in results if s.policy == policy
                         and (first is None or (s.workload, s.seed)
                              == (first.workload, first.seed))), None)
            if spec is None:
                continue
            series = results[spec]["series"]
            values = np.asarray(series[key], dtype=float)
            if key == "alloc_gpus":
                from rlalloc.env.cluster import parse_cluster
                values = values / parse_cluster(spec.cluster).total_gpus
            over_time[policy] = (np.asarray(series["t"], dtype=float) / 3600.0, values)
        _draw_curves(ax, over_time, names, colors, lw=1.0)
        ax.set_xlabel("simulated time (h)")
        ax.set_ylabel(label)
        if first is not None:
            ax.set_title(f"{what} over time per policy, one run: {Path(first.workload).name}, "
                         f"seed {first.seed}, {first.cluster}", fontsize=10)
        ax.grid(alpha=0.3)
        _legend(ax)
        fig.savefig(out / file, dpi=120)
        plt.close(fig)
