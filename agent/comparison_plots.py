"""The plots of a policy comparison (`rlalloc evaluate`), drawn with matplotlib (imported here
alone, when a plot is drawn): the JCT CDF per policy, GPU allocation and queue length over time,
and every run's paired avg-JCT change against the reference (`write_plots`). Policies whose
curves coincide are drawn dashed over each other, so that each stays visible (`same_curves`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rlalloc.agent.comparison_stats import (
    confidence,
    distinct_runs,
    paired_runs,
    percent_changes,
    repeated_runs,
)

if TYPE_CHECKING:
    from rlalloc.agent.comparison_runs import RunSpec

PAIRED_PLOT = "paired_avg_jct.png"
PAIRED_LOG_RATIO = 3.0
"""paired_avg_jct.png turns to a log axis (of each run's JCT ratio to the reference, labelled as
% change) once the largest ratio is this many times the smallest: on a linear axis a policy at
+450% squeezes the close ones, which the plot is there to separate, into a few pixels."""
PAIRED_MIN_SPAN_PCT = 1.0
"""A linear paired axis reaches at least this many % either side of 0: scaled to its data alone,
a change of +0.007 % spread over the whole width and read as large as one of +50 %. Close
policies differ by a few % (examples: docs/agent.md, "What `evaluate` writes"), so on this
span a change well under 1 % looks small and one of those still stands apart from 0; larger
changes widen the axis as before."""
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
    of different lengths, down-sampled at different steps (`comparison_runs.run_one`), and
    drew over each other solid though their lines coincide. Two piecewise-linear lines agree
    everywhere if they agree at every point of either; an x repeated (a vertical step, as in a
    CDF) is compared at the step's two ends. A curve without points (a run that recorded none)
    is the same only as another without."""
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


def write_plots(results: dict[RunSpec, dict], names: dict[str, str], out: Path,
                reference: str | None = None) -> None:
    """jct_cdf.png, gpu_util.png and queue_length.png into `out`, every policy of `names` in
    one colour throughout (the time series from each policy's run on the first workload and
    seed), and with `reference` also paired_avg_jct.png (`PAIRED_PLOT`)."""
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
