"""Judge the LSTM, its stand-in and the baselines on the same origins of one held-out series.

Every model forecasts from the same origins (every ``origin_stride_min`` minutes, starting two
days into each segment so that every model has the history it needs), and the errors are
reported per horizon:

* ``mae``: mean absolute error in demand fraction (0.01 = 1 % of the cluster's GPUs);
* ``mape``: mean of |error| / actual, in percent, over targets with actual demand of at least
  `MAPE_MIN_DEMAND` (an idle cluster would make it infinite); ``None`` at a horizon where no
  target reaches it, rather than the NaN of an empty mean.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlalloc.forecaster import baselines
from rlalloc.forecaster.baselines import HoltWintersParams
from rlalloc.forecaster.model import LSTMForecaster
from rlalloc.forecaster.series import DemandSeries
from rlalloc.forecaster.standin import EWMAForecaster

MAPE_MIN_DEMAND = 0.05
"""Targets below 5 % of the cluster are left out of MAPE (they would dominate it)."""
FIRST_ORIGIN_MIN = baselines.HOLT_WINTERS_MIN_HISTORY_MIN - 1
"""Origins start two days in: Holt-Winters' initial states need two seasons."""


@dataclass(frozen=True)
class Evaluation:
    """Forecasts of every model and the actual values at the same origins."""

    horizons_min: tuple[int, ...]
    actual: np.ndarray
    """(N, H) actual demand at each origin + horizon."""
    forecasts: dict[str, np.ndarray]
    """Model name -> (N, H) forecasts."""
    origin_minutes: np.ndarray
    """(N,) origin index within its segment, for plots."""
    segment_of_origin: np.ndarray
    """(N,) which segment each origin belongs to."""

    def scores(self) -> dict[str, dict[str, list[float | None]]]:
        """Model name -> {"mae": per horizon, "mape": per horizon (percent, or None where
        `mape_targets` is 0)}."""
        counted = self._mape_counted()
        out = {}
        for name, forecast in self.forecasts.items():
            error = np.abs(forecast - self.actual)
            mape = [
                float(100.0 * np.mean(error[counted[:, k], k] / self.actual[counted[:, k], k]))
                if counted[:, k].any() else None
                for k in range(len(self.horizons_min))
            ]
            out[name] = {"mae": error.mean(axis=0).tolist(), "mape": mape}
        return out

    def mape_targets(self) -> list[int]:
        """Per horizon, how many targets MAPE counts (those of at least `MAPE_MIN_DEMAND`)."""
        return self._mape_counted().sum(axis=0).tolist()

    def _mape_counted(self) -> np.ndarray:
        """(N, H) whether each target is large enough for MAPE."""
        return self.actual >= MAPE_MIN_DEMAND


def evaluate_series(
    series: DemandSeries,
    lstm: LSTMForecaster,
    standin: EWMAForecaster,
    holt_winters: HoltWintersParams,
    origin_stride_min: int = 5,
) -> Evaluation:
    """Forecast every origin of every segment with every model."""
    horizons = lstm.horizons_min
    first = max(FIRST_ORIGIN_MIN, lstm.min_history_min - 1)
    actual, forecasts, minutes, segment_ids = [], {}, [], []
    for index, segment in enumerate(series.segments):
        demand = segment.demand.astype(np.float64)
        origins = np.arange(first, len(demand) - max(horizons), origin_stride_min)
        if len(origins) == 0:
            continue
        per_model = {
            "lstm": lstm.predict_many(demand, segment.minute_of_day(), origins),
            "naive": baselines.naive(demand, origins, horizons),
            "seasonal_naive": baselines.seasonal_naive(demand, origins, horizons),
            "moving_average": baselines.moving_average(demand, origins, horizons),
            "holt_winters": baselines.holt_winters(demand, origins, horizons, holt_winters),
            "ewma_standin": standin.predict_many(demand, origins),
        }
        for name, values in per_model.items():
            forecasts.setdefault(name, []).append(values)
        actual.append(np.stack([demand[origins + h] for h in horizons], axis=1))
        minutes.append(origins)
        segment_ids.append(np.full(len(origins), index))
    if not actual:
        raise ValueError(
            f"{series.source}: no segment is longer than {first + max(horizons) + 1} minutes"
        )
    return Evaluation(
        horizons_min=horizons,
        actual=np.concatenate(actual),
        forecasts={name: np.concatenate(parts) for name, parts in forecasts.items()},
        origin_minutes=np.concatenate(minutes),
        segment_of_origin=np.concatenate(segment_ids),
    )
