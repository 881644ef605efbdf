"""The statistics of a policy comparison (`rlalloc evaluate`), over the result rows of its runs
(`rlalloc.agent.comparison_runs`): each policy's mean and 95% confidence interval of every
metric (`summarise`, `confidence`), the runs that every seed repeated, counted once
(`repeated_runs`, `distinct_runs`), and each policy's paired % changes against a reference run
by run (`paired_changes`). Reporting and plotting read these; nothing here draws or writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rlalloc.env.metrics import METRIC_KEYS

if TYPE_CHECKING:
    from rlalloc.agent.comparison_runs import RunSpec

PAIRED_METRICS = ("avg_jct_s", "p95_jct_s", "avg_queue_s", "makespan_s", "gpu_util",
                  "restarts_per_job", "lost_gpu_hours", "ettr")
"""Metrics of the paired comparison against --reference (lost GPU-hours and ETTR: where
failures, checkpoints and failover decide, as on a large fleet)."""
LOWER_IS_BETTER = {"avg_jct_s", "p50_jct_s", "p95_jct_s", "p99_jct_s", "avg_queue_s",
                   "makespan_s", "lost_gpu_hours", "restarts_per_job", "mean_recovery_s",
                   "energy_kwh", "failures", "invalid_actions"}


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


def summarise(results: dict[RunSpec, dict], names: dict[str, str], workloads: list[str],
              seeds: list[int], cluster: str, failures: str, efficiency: str = "none") -> dict:
    """The results.json document (its ``lookahead``: `lookahead_totals`)."""
    policies: dict[str, dict] = {}
    unfinished: dict[str, int] = {}
    given_up: dict[str, int] = {}
    repeated = repeated_runs(results)
    counted = distinct_runs(results, repeated)
    for policy, name in names.items():
        runs = [r for spec, r in counted.items() if spec.policy == policy]
        policies[name] = {key: confidence([r["metrics"][key] for r in runs],
                                          [r["copies"] for r in runs])
                          for key in METRIC_KEYS}
        unfinished[name] = sum(not r["finished"] for r in runs)
        given_up[name] = sum(bool(r.get("given_up")) for r in runs)
    return {"policies": policies, "sources": {name: entry for entry, name in names.items()},
            "workloads": workloads, "seeds": seeds, "cluster": cluster, "failures": failures,
            "efficiency": efficiency, "runs_unfinished": unfinished,
            "runs_given_up": given_up,
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


NEGLIGIBLE_BASE = {"avg_queue_s": 1.0, "restarts_per_job": 0.01, "lost_gpu_hours": 1.0}
"""Reference values too small to take a % change against: a reference that queued jobs for
0.02 s on average made another policy's 15 s "+73,925 %", a figure that says nothing about
either. Jobs run for hours, so a second of mean queueing, a restart per hundred jobs or a
GPU-hour lost to failures in a whole run is none."""


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
