"""Quantile forecasts: the levels forecast, the pinball loss that scores them, their coverage.

Every quantile forecaster (the LSTM and the baselines) returns an array whose last axis runs
over `QUANTILE_LEVELS`, ascending, with the values non-decreasing along it (no crossing).
"""

from __future__ import annotations

import numpy as np

QUANTILE_LEVELS: tuple[float, ...] = (0.1, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)
"""Levels forecast: 0.1, 0.5 and 0.9 are the ones reported; the others make the capacity rule's
trade-off curve (keep GPUs for the q-quantile of demand) a measured one, not an interpolation."""
REPORTED_LEVELS: tuple[float, ...] = (0.1, 0.5, 0.9)
"""Levels whose pinball loss is reported, and averaged into the mean pinball loss."""
MEDIAN = 0.5


def level_index(levels: tuple[float, ...], level: float) -> int:
    """Position of ``level`` in ``levels``, or a ValueError naming both."""
    matches = [i for i, value in enumerate(levels) if abs(value - level) < 1e-9]
    if not matches:
        raise ValueError(f"quantile level {level} is not among {list(levels)}")
    return matches[0]


def pinball_loss(actual: np.ndarray, forecast: np.ndarray, level: float) -> np.ndarray:
    """Pinball (quantile) loss of ``forecast`` as the ``level``-quantile of ``actual``,
    element-wise: level * (y - f) where y >= f, (1 - level) * (f - y) below. Its expectation is
    smallest at the true quantile, so its mean scores a quantile forecast as MAE scores a
    median (at level 0.5 it is half the absolute error)."""
    error = np.asarray(actual, dtype=np.float64) - np.asarray(forecast, dtype=np.float64)
    return np.maximum(level * error, (level - 1.0) * error)


def without_crossing(values: np.ndarray) -> np.ndarray:
    """``values`` sorted along the last (quantile) axis: a q-quantile never below a lower one."""
    return np.sort(values, axis=-1)
