"""Figures of an evaluation: forecasts and their bands against actual demand on one sample
day, and the capacity rule's trade-off between idle and waiting GPU-hours."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from rlalloc.forecaster.evaluate import ONLINE_SUFFIX, Evaluation
from rlalloc.forecaster.quantiles import level_index
from rlalloc.forecaster.series import MINUTES_PER_DAY

PLOTTED_MODELS = ("lstm", "naive", "holt_winters", "ewma_standin", "naive_hourly",
                  "seasonal_naive", "seasonal_naive_hourly")
MODEL_COLORS = {name: f"C{i}" for i, name in enumerate(PLOTTED_MODELS)}
"""One colour per model, whichever of them an evaluation has."""
DAY_MODELS = PLOTTED_MODELS[:4]
"""The models drawn on the sample day (more would hide the actual)."""
BANDED_MODELS = ("lstm", "naive")
"""Models whose [q0.1, q0.9] band the sample day shades."""
BAND = (0.1, 0.9)
PLOT_HORIZON_MIN = 60
"""The horizon drawn by default: the longest the allocator plans over."""


def plot_sample_day(
    evaluation: Evaluation, horizon_min: int = PLOT_HORIZON_MIN, day: int | None = None,
    series: str | None = None,
) -> bytes:
    """PNG of the ``horizon_min`` forecasts made during one day against what happened; the
    title names ``series`` (the evaluated file) where given.

    Returned rather than saved, so the caller writes it atomically and only once every result
    of the run exists.

    ``day`` counts days from the first evaluated origin of the first segment; by default the
    day on which the naive forecast's error is the median of all days: a typical day, neither
    cherry-picked nor an outage.
    """
    column = evaluation.horizons_min.index(horizon_min)
    in_first = evaluation.segment_of_origin == 0
    if evaluation.series_of_origin is not None:
        in_first &= evaluation.series_of_origin == 0
    minutes = evaluation.origin_minutes[in_first]
    day_of_origin = (minutes - minutes[0]) // MINUTES_PER_DAY
    if day is None:
        naive_error = np.abs(evaluation.forecasts["naive"][in_first, column]
                             - evaluation.actual[in_first, column])
        per_day = [naive_error[day_of_origin == d].mean() for d in np.unique(day_of_origin)]
        day = int(np.argsort(per_day)[len(per_day) // 2])
    start = minutes[0] + day * MINUTES_PER_DAY
    chosen = np.flatnonzero(in_first & (evaluation.origin_minutes >= start)
                            & (evaluation.origin_minutes < start + MINUTES_PER_DAY))
    hours = (evaluation.origin_minutes[chosen] + horizon_min - start) / 60.0
    figure, axes = plt.subplots(figsize=(11, 4.5), layout="constrained")
    for name in BANDED_MODELS:
        if name in evaluation.quantile_forecasts:
            band = evaluation.quantile_forecasts[name][chosen, column]
            low, high = (band[:, level_index(evaluation.quantiles, q)] for q in BAND)
            axes.fill_between(hours, low, high, color=MODEL_COLORS[name], alpha=0.15, lw=0,
                              label=f"{name} q{BAND[0]:g}-q{BAND[1]:g}")
    for name in DAY_MODELS:  # the LSTM on top of the baselines, the actual over all
        if name in evaluation.forecasts:
            lstm = name == "lstm"
            axes.plot(hours, evaluation.forecasts[name][chosen, column], lw=1.6 if lstm else 1,
                      alpha=1.0 if lstm else 0.7, zorder=3 if lstm else 2,
                      label=f"{name} (median)" if name in evaluation.quantile_forecasts else name,
                      color=MODEL_COLORS[name])
    axes.plot(hours, evaluation.actual[chosen, column], color="black", lw=1.5, zorder=4,
              label="actual")
    axes.set_xticks(np.arange(0, 25, 3))
    axes.set_xlabel(f"hours into sample day {day + 1} (time of the forecast target)")
    axes.set_ylabel("GPU demand (running + pending,\nshare of cluster GPUs)")
    where = f" on {series}" if series else ""
    axes.set_title(f"{horizon_min}-minute-ahead forecasts vs actual demand{where}, "
                   f"sample day {day + 1}", fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    png = io.BytesIO()
    figure.savefig(png, format="png", dpi=110)
    plt.close(figure)
    return png.getvalue()


def plot_capacity(capacity: dict[str, list[dict[str, float]]], horizon_min: int) -> bytes:
    """PNG of each forecaster's capacity rule: GPU-hours held idle against GPU-hours of demand
    left waiting, one point per quantile level q (labelled on the LSTM's curve), a model
    calibrated online dashed in its colour; lower-left is better."""
    figure, axes = plt.subplots(figsize=(8, 5.5), layout="constrained")
    for name, curve in capacity.items():
        model, online = name.removesuffix(ONLINE_SUFFIX), name.endswith(ONLINE_SUFFIX)
        lstm = name == "lstm"
        axes.plot([c["waiting_gpu_hours"] for c in curve], [c["idle_gpu_hours"] for c in curve],
                  marker="o", ms=3, lw=1.8 if model == "lstm" else 1,
                  zorder=3 if model == "lstm" else 2, label=name,
                  color=MODEL_COLORS.get(model), ls="--" if online else "-")
        if lstm:
            for cost in curve:
                axes.annotate(f"q{cost['level']:g}", (cost["waiting_gpu_hours"],
                                                      cost["idle_gpu_hours"]),
                              fontsize=7, xytext=(3, 3), textcoords="offset points")
    axes.set_xscale("log")  # seasonal naive's curve lies an order of magnitude out
    axes.set_yscale("log")
    axes.set_xlabel("GPU-hours of demand left waiting (log)")
    axes.set_ylabel("GPU-hours held idle (log)")
    axes.set_title(f"Keeping GPUs for the q-quantile of demand {horizon_min} min ahead "
                   "(lower left is better)", fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    png = io.BytesIO()
    figure.savefig(png, format="png", dpi=110)
    plt.close(figure)
    return png.getvalue()
