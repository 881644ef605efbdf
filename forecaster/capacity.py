"""A capacity rule judged by what it costs: keep GPUs for the forecast's q-quantile of demand.

As a predictive autoscaler would, the rule holds, at every forecast origin, the q-quantile of
demand one horizon ahead in whole GPUs (`gpus_to_keep`); the demand that then arrives is
either served (GPUs beyond it sit idle) or waits (demand beyond the GPUs held). Each origin
stands for the minutes until the next one, so summing gives GPU-hours. A higher q buys less
waiting with more idle GPUs; a sharper forecaster buys both at once, which is what the
trade-off curve over q shows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

MINUTES_PER_HOUR = 60
CAPACITY_HORIZON_MIN = 60
"""The capacity rule keeps GPUs for demand this far ahead: the longest horizon forecast."""


@dataclass(frozen=True)
class CapacityCost:
    """GPU-hours a capacity rule held idle and left demand waiting."""

    level: float
    idle_gpu_hours: float
    waiting_gpu_hours: float


def gpus_to_keep(demand: np.ndarray, size_gpus: np.ndarray | float) -> np.ndarray:
    """The whole number of GPUs nearest each forecast ``demand`` (fractions of clusters of
    ``size_gpus`` GPUs; halves round up), never below 0.

    Demand is a whole number of GPUs, so each of its quantiles is one too, and a forecast of
    it is read as the whole number it estimates. Rounding up instead would hold a GPU more
    wherever a quantile sits a hair above the current count, as a network's quantiles do at
    the atom of "no change" (its float error, not a forecast of one more GPU)."""
    return np.floor(np.maximum(np.asarray(demand, dtype=np.float64), 0.0) * size_gpus + 0.5)


def capacity_cost(held_demand: np.ndarray, actual_demand: np.ndarray, size_gpus: np.ndarray,
                  minutes_per_origin: float, level: float) -> CapacityCost:
    """Idle and waiting GPU-hours of holding ``held_demand`` (fractions of each cluster, one
    per origin; in whole GPUs, `gpus_to_keep`) against ``actual_demand`` (same units), on
    clusters of ``size_gpus`` GPUs (one per origin), each origin counting
    ``minutes_per_origin``."""
    held = gpus_to_keep(held_demand, size_gpus)
    wanted = actual_demand * size_gpus
    hours = minutes_per_origin / MINUTES_PER_HOUR
    return CapacityCost(
        level=level,
        idle_gpu_hours=float(np.maximum(held - wanted, 0.0).sum() * hours),
        waiting_gpu_hours=float(np.maximum(wanted - held, 0.0).sum() * hours),
    )


def idle_at_waiting(curve: list[CapacityCost], waiting_gpu_hours: float) -> float | None:
    """Idle GPU-hours of a rule's curve at a given waiting, interpolated between its levels
    (where levels tie on waiting, the one idling least); None outside the waiting the curve
    spans (no extrapolation). This compares forecasters at equal waiting."""
    waiting = np.array([cost.waiting_gpu_hours for cost in curve])
    idle = np.array([cost.idle_gpu_hours for cost in curve])
    if not waiting.min() <= waiting_gpu_hours <= waiting.max():
        return None
    points = np.unique(waiting)
    least = np.array([idle[waiting == value].min() for value in points])
    return float(np.interp(waiting_gpu_hours, points, least))


def capacity_report(curves: dict[str, list[CapacityCost]],
                    reference: str) -> dict[str, object]:
    """The curves as JSON, and each model's idle GPU-hours at the waiting that ``reference``'s
    rule leaves at each of its levels (None beyond a curve's span): the comparison at equal
    waiting."""
    return {
        "curves": {name: [asdict(cost) for cost in curve] for name, curve in curves.items()},
        "idle_at_reference_waiting": {
            "reference": reference,
            "levels": [cost.level for cost in curves[reference]],
            "waiting_gpu_hours": [cost.waiting_gpu_hours for cost in curves[reference]],
            "idle_gpu_hours": {name: [idle_at_waiting(curve, cost.waiting_gpu_hours)
                                      for cost in curves[reference]]
                               for name, curve in curves.items()},
        },
    }
