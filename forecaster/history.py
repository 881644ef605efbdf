"""Validation of the demand history that callers hand to a forecaster's `predict`."""

from __future__ import annotations

import numpy as np


def check_history(history: np.ndarray, min_length: int) -> np.ndarray:
    """A 1-D finite float64 copy of ``history``, or a ValueError that says what is wrong.

    Callers (simulator, actuator) own their history; a NaN or a short one is their bug to see,
    not something to forecast through into a NaN.
    """
    demand = np.asarray(history, dtype=np.float64)
    if demand.ndim != 1:
        raise ValueError(f"history must be 1-D per-minute demand, got shape {demand.shape}")
    if len(demand) < min_length:
        raise ValueError(
            f"history has {len(demand)} minutes; the forecaster needs at least {min_length}"
        )
    if not np.isfinite(demand).all():
        bad = int(np.flatnonzero(~np.isfinite(demand))[0])
        raise ValueError(f"history[{bad}] is {demand[bad]}; forward-fill gaps before forecasting")
    return demand
