"""`rlalloc evaluate`: compare allocation policies over workloads and seeds, with 95% CIs.

Writes DIR/results.json (``mean`` and ``ci95``, the 95% confidence half-width, of every metric
per policy, over seeds x workloads, t-distribution; ``ci95`` is 0 for a single run, which has no
spread to measure, and results.md shows n/a there), DIR/results.md (a table with each policy's
change against `static`, where static was evaluated) and plots: JCT CDF per policy, GPU
utilisation and queue length over time. results.json's ``sources`` maps each label to the
--policies entry it stands for (a saved model is labelled by its directory's name, or by its
path where that name is taken: see `policy_labels`). Its ``cluster`` is --cluster as given;
``cluster_file`` records a cluster YAML's content as it was used (`env.cluster.cluster_record`;
null for NODESxGPUS), and results.md shows it.

Both also hold a *paired* comparison against a reference policy (``--reference``): each run's
change against the reference's run on the same workload and seed. Workloads differ far more
from each other than close policies do, so the unpaired CIs of two good policies overlap even
where one is better on every run; the paired CI and the count of runs won answer "is A better
than B here" directly (plot: paired_avg_jct.png).

Runs go to parallel worker processes (one per core by default): one run is seconds of pure
Python, far more than the cost of a process.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from env.argtypes import POSITIVE_INT, AppendOnce, unique_names
from env.cluster import add_cluster_flag, cluster_markdown, cluster_record
from env.efficiency import EFFICIENCY_MODES, add_efficiency_flag
from env.errors import UserError
from env.metrics import METRIC_KEYS
from env.output import (
    add_out_flags,
    out_dir_for_run,
    remove_outputs,
    write_atomic,
    write_json,
)
from env.workers import worker_pool
from env.workload.loader import EMBEDDED_DEFAULT

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
OUTPUT_FILES = ("results.json", "results.md", "jct_cdf.png", "gpu_util.png", "queue_length.png",
                PAIRED_PLOT)
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
                        help="policy of --policies every other is compared with run by run "
                             "(default: static if listed, else the first)")
    parser.add_argument("--jobs", type=POSITIVE_INT, default=min(2, os.cpu_count() or 1),
                        help="parallel worker processes")
    add_out_flags(parser, Path("results/evaluate"))


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
    """Worker: run one simulation and return its metrics, JCTs and down-sampled series."""
    import torch

    from agent.evaluation import run_policy
    from agent.registry import load_policy
    from env.failures import FailureParams
    from env.params import SimParams
    from env.scenario import build_scenario

    torch.set_num_threads(1)
    params = SimParams(failures=FailureParams(failures_per_gpu_day=spec.failures_per_gpu_day))
    policy, efficiency = policy_and_mode(spec.policy, spec.efficiency)
    scenario = build_scenario(spec.workload, spec.cluster, seed=spec.seed, efficiency=efficiency)
    result = run_policy(scenario.simulator(params, seed=spec.seed), load_policy(policy).act)
    step = max(1, len(result.series["t"]) // _SERIES_POINTS)
    series = {k: v[::step] for k, v in result.series.items()}
    return {"metrics": result.metrics, "finished": result.finished, "jcts_s": result.jcts_s,
            "series": series}


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
    from agent.registry import builtin_names, load_policy

    labels, misleading = {}, False
    for entry in policies:
        policy, _ = policy_and_mode(entry, efficiency)
        name = load_policy(policy).name
        labels[entry] = name + entry[len(policy):]
        misleading |= name != policy and name in builtin_names()
    if misleading or len(set(labels.values())) < len(labels):
        return {entry: entry for entry in policies}
    return labels


def confidence(values: list[float]) -> dict[str, float]:
    """Mean and 95% confidence half-width (Student t over the runs). One run has no spread
    to measure: its half-width is 0, which the tables show as n/a."""
    from scipy import stats

    array = np.asarray(values, dtype=float)
    mean = float(array.mean())
    if len(array) < 2:
        return {"mean": mean, "ci95": 0.0}
    half = stats.t.ppf(0.975, len(array) - 1) * array.std(ddof=1) / np.sqrt(len(array))
    return {"mean": mean, "ci95": float(half)}


def run(args: argparse.Namespace) -> int:
    """Validate inputs, run every (policy, workload, seed) and write the report."""
    from tqdm import tqdm

    from env.failures import parse_failure_rate
    from env.scenario import build_scenario

    policies = args.policies
    if not policies:
        raise UserError("--policies is empty; give e.g. static,elastic,ppo")
    names = policy_labels(policies, args.efficiency)
    modes = {policy_and_mode(entry, args.efficiency)[1] for entry in policies}
    reference = args.reference or ("static" if "static" in policies else policies[0])
    if reference not in policies:
        raise UserError(f"--reference {reference}: not among --policies ({', '.join(policies)}); "
                        "name one of them")
    workloads = args.workloads or [EMBEDDED_DEFAULT]
    for workload in workloads:  # fails fast on a bad workload, cluster or profile
        for mode in modes:
            build_scenario(workload, args.cluster, seed=0, efficiency=mode)
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
                    for spec, result in zip(specs, pool.map(_run_one, specs), strict=True):
                        results[spec] = result
                        bar.update()
            else:
                for spec in specs:
                    results[spec] = _run_one(spec)
                    bar.update()
        report = summarise(results, names, workloads, seeds, args.cluster, args.failures,
                           args.efficiency)
        report["cluster_file"] = cluster_file
        report["paired"] = paired_changes(results, names, reference)
        write_report(report, results, names, args.out, reference)
    print(f"wrote {args.out / 'results.json'}, results.md and plots")
    return 0


def summarise(results: dict[RunSpec, dict], names: dict[str, str], workloads: list[str],
              seeds: list[int], cluster: str, failures: str, efficiency: str = "none") -> dict:
    """The results.json document."""
    policies: dict[str, dict] = {}
    unfinished: dict[str, int] = {}
    for policy, name in names.items():
        runs = [r for spec, r in results.items() if spec.policy == policy]
        policies[name] = {key: confidence([r["metrics"][key] for r in runs])
                          for key in METRIC_KEYS}
        unfinished[name] = sum(not r["finished"] for r in runs)
    return {"policies": policies, "sources": {name: entry for entry, name in names.items()},
            "workloads": workloads, "seeds": seeds, "cluster": cluster, "failures": failures,
            "efficiency": efficiency, "runs_unfinished": unfinished}


def paired_runs(results: dict[RunSpec, dict], policy: str,
                reference: str) -> list[tuple[dict, dict]]:
    """(metrics of `policy`, metrics of `reference`) for each workload and seed both ran."""
    base = {(spec.workload, spec.seed): r["metrics"] for spec, r in results.items()
            if spec.policy == reference}
    return [(r["metrics"], base[spec.workload, spec.seed]) for spec, r in results.items()
            if spec.policy == policy and (spec.workload, spec.seed) in base]


NEGLIGIBLE_BASE = {"avg_queue_s": 1.0, "restarts_per_job": 0.01}
"""Reference values too small to take a % change against: a reference that queued jobs for
0.02 s on average made another policy's 15 s "+73,925 %", a figure that says nothing about
either. Jobs run for hours, so a second of mean queueing or a restart per hundred jobs is none."""


def percent_changes(runs: list[tuple[dict, dict]], key: str) -> list[float]:
    """Per run, the % change of `key` against the reference. Undefined where the reference's
    value is 0 or negligible (`NEGLIGIBLE_BASE`; e.g. no queueing at all): such runs are left
    out here and count only towards better/worse in `paired_changes`."""
    floor = NEGLIGIBLE_BASE.get(key, 0.0)
    return [100.0 * (m[key] - b[key]) / abs(b[key]) for m, b in runs if abs(b[key]) > floor]


def paired_changes(results: dict[RunSpec, dict], names: dict[str, str], reference: str,
                   metrics: tuple[str, ...] = PAIRED_METRICS) -> dict:
    """Every other policy's per-run % change against `reference` on the same workload and
    seed: mean ± 95% CI of the changes, and on how many runs it was better (results.json's
    ``paired``)."""
    paired: dict[str, dict] = {}
    for policy, name in names.items():
        if policy == reference:
            continue
        runs = paired_runs(results, policy, reference)
        paired[name] = {}
        for key in metrics:
            sign = -1.0 if key in LOWER_IS_BETTER else 1.0
            changes = percent_changes(runs, key)
            paired[name][key] = {**(confidence(changes) if changes else {"mean": None,
                                                                          "ci95": None}),
                                 "unit": "%", "runs_with_change": len(changes),
                                 "better_runs": sum(sign * (m[key] - b[key]) > 0 for m, b in runs),
                                 "runs": len(runs)}
    return {"reference": names[reference], "policies": paired}


def paired_table(paired: dict) -> str:
    """results.md's paired table: mean % change ± 95% CI and runs better, per metric."""
    policies = paired["policies"]
    metrics = list(next(iter(policies.values())))
    lines = ["| policy | " + " | ".join(metrics) + " |", "|---|" + "---|" * len(metrics)]
    for name, values in policies.items():
        cells = [_paired_cell(v) for v in values.values()]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


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


def _change(value: float, base: float, key: str) -> str:
    if not base:
        return ""
    change = 100.0 * (value - base) / abs(base)
    better = change < 0 if key in LOWER_IS_BETTER else change > 0
    return f" ({change:+.0f}%{'' if abs(change) < 0.5 else (' ✓' if better else '')})"


def markdown_table(report: dict, metrics: tuple[str, ...] = REPORT_METRICS) -> str:
    """results.md's table: mean ± 95% CI per policy and metric, change against static (if
    evaluated)."""
    policies = report["policies"]
    base = policies.get("static")
    runs = len(report["workloads"]) * len(report["seeds"])
    lines = ["| policy | " + " | ".join(metrics) + " |",
             "|---|" + "---|" * len(metrics)]
    for name, values in policies.items():
        cells = []
        for key in metrics:
            mean, ci = values[key]["mean"], values[key]["ci95"]
            digits = 0 if abs(mean) >= 100 else 3
            cell = f"{mean:,.{digits}f} ± {_half_width(ci, runs, digits)}"
            if base is not None and name != "static":
                cell += _change(mean, base[key]["mean"], key)
            cells.append(cell)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_report(report: dict, results: dict[RunSpec, dict], names: dict[str, str],
                 out: Path, reference: str | None = None) -> None:
    """results.json, results.md and the PNG plots into `out` (with `reference`, the policy of
    the paired comparison, also paired_avg_jct.png; an earlier run's is removed otherwise, so
    that it cannot pass for this run's)."""
    write_json(out / "results.json", report)
    unfinished = {k: v for k, v in report["runs_unfinished"].items() if v}
    md = [f"# Policy comparison on {report['cluster']}",
          "",
          f"Workloads: {', '.join(report['workloads'])}; seeds {report['seeds']}; failures "
          f"`{report['failures']}`; efficiency `{report['efficiency']}` (a policy named "
          f"NAME@MODE runs under MODE). {_cell_legend(report)}",
          "",
          markdown_table(report),
          ""]
    paired = report.get("paired")
    if not (paired and paired["policies"]):
        reference = None  # one policy alone: nothing to pair
    if reference is not None:
        md += [f"Paired against `{paired['reference']}`: each run's change against its run on "
               "the same workload and seed, mean ± 95% CI, and on how many runs it was better.",
               "",
               paired_table(paired),
               ""]
    if unfinished:
        md.append(f"Runs stopped at the time limit with jobs unfinished: {unfinished} (their "
                  "JCTs count only the finished jobs).")
    paired_png = f", {PAIRED_PLOT}" if reference is not None else ""
    md.append(f"Plots: jct_cdf.png, gpu_util.png, queue_length.png{paired_png}.")
    if report.get("cluster_file"):
        md += ["", *cluster_markdown(report["cluster_file"])]
    write_atomic(out / "results.md", "\n".join(md) + "\n")
    _plots(results, names, out, reference)
    if reference is None:
        remove_outputs(out, [PAIRED_PLOT])


def _cell_legend(report: dict) -> str:
    """What a cell of results.md's table shows: the CI only where there are runs to spread,
    the change against static only where static was evaluated with others."""
    runs = len(report["workloads"]) * len(report["seeds"])
    legend = (f"Each cell: mean ± 95% CI (t-distribution over {runs} runs = seeds × workloads)"
              if runs > 1 else "Each cell: the one run's value (one seed, one workload: no CI, "
                               "n/a)")
    if "static" in report["policies"] and len(report["policies"]) > 1:
        legend += "; in brackets the change against `static` (✓ = better)"
    return legend + "."


def _paired_plot(results: dict[RunSpec, dict], names: dict[str, str], reference: str,
                 out: Path, colors: dict[str, str]) -> None:
    """paired_avg_jct.png: every run's avg-JCT change against `reference`, per policy, with
    the mean: the spread the paired CI summarises, and which workloads drive it."""
    import matplotlib.pyplot as plt

    others = [p for p in names if p != reference]
    fig, ax = plt.subplots(figsize=(7, 0.6 * len(others) + 1.8))
    for row, policy in enumerate(others):
        changes = percent_changes(paired_runs(results, policy, reference), "avg_jct_s")
        ax.scatter(changes, np.full(len(changes), row), s=18, alpha=0.6, color=colors[policy])
        if changes:
            ax.plot([np.mean(changes)] * 2, [row - 0.3, row + 0.3], color="black", lw=2)
    ax.axvline(0.0, color="grey", lw=1)
    ax.set_yticks(range(len(others)), [names[p] for p in others])
    ax.set_xlabel(f"avg JCT change per run against {names[reference]} (%, lower is better)")
    ax.set_title("Paired comparison (dots: runs, bar: mean)")
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    fig.savefig(out / PAIRED_PLOT, dpi=120)
    plt.close(fig)


def _legend(ax: object) -> None:
    """A legend when some policy drew a line (none finished a job: an empty plot, no legend)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend()


def _plots(results: dict[RunSpec, dict], names: dict[str, str], out: Path,
           reference: str | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # one colour per policy in every figure (the paired plot leaves the reference out, which
    # would otherwise shift matplotlib's colour cycle by one there)
    colors = {policy: f"C{i % 10}" for i, policy in enumerate(names)}
    if reference is not None:
        _paired_plot(results, names, reference, out, colors)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy, name in names.items():
        jcts = np.sort(np.concatenate([r["jcts_s"] for s, r in results.items()
                                       if s.policy == policy] or [np.zeros(0)]))
        if len(jcts):  # a zero-length job (a zero duration in the trace) has no log position
            ax.plot(np.maximum(jcts, 1.0) / 3600.0, np.arange(1, len(jcts) + 1) / len(jcts),
                    label=name, color=colors[policy])
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (h, log scale)")
    ax.set_ylabel("share of jobs")
    ax.set_title("JCT CDF (all workloads and seeds)")
    ax.grid(alpha=0.3)
    _legend(ax)
    fig.tight_layout()
    fig.savefig(out / "jct_cdf.png", dpi=120)
    plt.close(fig)
    first = min(results, key=lambda s: (s.workload, s.seed)) if results else None
    for key, label, file in (("alloc_gpus", "allocated GPUs (share of cluster)", "gpu_util.png"),
                             ("queued_jobs", "jobs waiting (holding no GPU)",
                              "queue_length.png")):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for policy, name in names.items():
            spec = next((s for s in results if s.policy == policy
                         and (first is None or (s.workload, s.seed)
                              == (first.workload, first.seed))), None)
            if spec is None:
                continue
            series = results[spec]["series"]
            values = np.asarray(series[key], dtype=float)
            if key == "alloc_gpus":
                from env.cluster import parse_cluster
                values = values / parse_cluster(spec.cluster).total_gpus
            ax.plot(np.asarray(series["t"]) / 3600.0, values, label=name, lw=1,
                    color=colors[policy])
        ax.set_xlabel("time (h)")
        ax.set_ylabel(label)
        if first is not None:
            ax.set_title(f"{Path(first.workload).name}, seed {first.seed}")
        ax.grid(alpha=0.3)
        _legend(ax)
        fig.tight_layout()
        fig.savefig(out / file, dpi=120)
        plt.close(fig)
