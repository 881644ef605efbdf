"""A cheap stand-in for the LSTM with the same `predict` interface: an exponentially weighted
mean of the last minutes, one half-life per horizon, fitted on the training series.

It exists so the simulator can forecast at microsecond cost when the LSTM's gain does not
matter for the decision at hand; docs/forecaster.md compares the two (error and latency).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from rlalloc.forecaster.config import HORIZONS_MIN, SHIPPED_MODEL_DIR
from rlalloc.forecaster.history import check_history

HALF_LIVES_MIN: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
"""Candidate half-lives searched at fit time (0.25 is practically the last value)."""
TAIL_MIN = 128
"""Minutes of history the weights reach back (weights beyond are negligible)."""
STANDIN_FILE = "standin.json"
"""File name of the stand-in inside a trained forecaster directory."""


class EWMAForecaster:
    """Forecast every horizon as an exponentially weighted mean of the recent history."""

    def __init__(self, half_lives_min: tuple[float, ...],
                 horizons_min: tuple[int, ...]) -> None:
        if len(half_lives_min) != len(horizons_min):
            raise ValueError("one half-life per horizon")
        self.half_lives_min = tuple(float(h) for h in half_lives_min)
        if not all(0 < h < math.inf for h in self.half_lives_min):  # NaN fails both
            # 0 divides by zero and NaN spreads: the weights, and every forecast, would be NaN
            raise ValueError(f"half-lives {list(self.half_lives_min)} min: each must be a "
                             "positive finite number of minutes")
        self.horizons_min = tuple(horizons_min)
        ages = np.arange(TAIL_MIN)[::-1]  # oldest first, like the history
        weights = np.stack([0.5 ** (ages / h) for h in self.half_lives_min])
        self._weights = weights / weights.sum(axis=1, keepdims=True)

    @property
    def min_history_min(self) -> int:
        """Fewest per-minute samples `predict` needs."""
        return TAIL_MIN

    def predict(self, history: np.ndarray, last_minute_of_day: int | None = None) -> np.ndarray:
        """Demand at each horizon; ``last_minute_of_day`` is accepted for interface parity."""
        demand = check_history(history, TAIL_MIN)
        return self._weights @ demand[-TAIL_MIN:]

    def predict_many(self, demand: np.ndarray, origins: np.ndarray) -> np.ndarray:
        """Forecasts from many origins at once, (len(origins), n_horizons)."""
        windows = np.lib.stride_tricks.sliding_window_view(demand, TAIL_MIN)
        return windows[origins - TAIL_MIN + 1] @ self._weights.T

    def to_json(self) -> dict[str, list[float] | list[int]]:
        """Plain-JSON form."""
        return {
            "half_lives_min": list(self.half_lives_min),
            "horizons_min": list(self.horizons_min),
        }

    def save(self, path: str | Path) -> None:
        """Write the half-lives as JSON."""
        Path(path).write_text(json.dumps(self.to_json(), indent=2, allow_nan=False) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> EWMAForecaster:
        """Inverse of `save`."""
        data = json.loads(Path(path).read_text())
        return cls(tuple(data["half_lives_min"]), tuple(data["horizons_min"]))


def load_standin(directory: str | Path | None = None) -> EWMAForecaster:
    """The stand-in saved next to a trained forecaster (default: the shipped one).

    Imports neither torch nor statsmodels, so the simulator can forecast without them.
    """
    return EWMAForecaster.load(Path(directory or SHIPPED_MODEL_DIR) / STANDIN_FILE)


def fit_ewma(
    segments: list[np.ndarray], horizons_min: tuple[int, ...] = HORIZONS_MIN
) -> EWMAForecaster:
    """Pick, per horizon, the half-life with the lowest MAE on the training segments."""
    best = []
    for index, horizon in enumerate(horizons_min):
        errors = []
        for half_life in HALF_LIVES_MIN:
            candidate = EWMAForecaster((half_life,) * len(horizons_min), horizons_min)
            total, count = 0.0, 0
            for demand in segments:
                origins = np.arange(TAIL_MIN - 1, len(demand) - horizon, 7)
                forecast = candidate.predict_many(demand.astype(np.float64), origins)[:, index]
                total += np.abs(forecast - demand[origins + horizon]).sum()
                count += len(origins)
            errors.append(total / max(count, 1))
        best.append(HALF_LIVES_MIN[int(np.argmin(errors))])
    return EWMAForecaster(tuple(best), horizons_min)
