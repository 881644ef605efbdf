"""Judge the LSTM, its stand-in and the baselines on the same origins of held-out series.

Every model forecasts from the same origins (every ``origin_stride_min`` minutes, starting two
days into each segment so that every model has the history it needs), pooled over the
evaluated series (demand is a fraction of each cluster, so they pool), and the errors are
reported per horizon:

* ``mae``: mean absolute error of the point forecast (a quantile model's median) in demand
  fraction (0.01 = 1 % of the cluster's GPUs);
* ``mape``: mean of |error| / actual, in percent, over targets with actual demand of at least
  `MAPE_MIN_DEMAND` (an idle cluster would make it infinite); ``None`` at a horizon where no
  target reaches it, rather than the NaN of an empty mean;
* for the quantile models: the pinball loss per reported level and its mean over them, the
  share of outcomes at or below the 0.9-quantile and inside [q0.1, q0.9], and the capacity
  rule's idle and waiting GPU-hours for each level from the median up (`capacity`).

Every quantile model is scored twice: as fitted (its name) and calibrated online on each
evaluated series from that series' own past outcomes (its name + `ONLINE_SUFFIX`,
`rlalloc.forecaster.online_calibration`), as a forecaster running in the cluster would be.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from rlalloc.forecaster import baselines
from rlalloc.forecaster.capacity import CAPACITY_HORIZON_MIN, CapacityCost, capacity_cost
from rlalloc.forecaster.features import local_scale
from rlalloc.forecaster.model import LSTMForecaster
from rlalloc.forecaster.online_calibration import (
    DEFAULT_STEP_SIZE,
    OnlineCalibrator,
    calibrate_segment,
)
from rlalloc.forecaster.quantile_baselines import FittedBaselines, holt_winters_quantiles
from rlalloc.forecaster.quantiles import MEDIAN, REPORTED_LEVELS, level_index, pinball_loss
from rlalloc.forecaster.series import DemandSeries
from rlalloc.forecaster.standin import EWMAForecaster

MAPE_MIN_DEMAND = 0.05
"""Targets below 5 % of the cluster are left out of MAPE (they would dominate it)."""
FIRST_ORIGIN_MIN = baselines.HOLT_WINTERS_MIN_HISTORY_MIN - 1
"""Origins start two days in: Holt-Winters' initial states need two seasons."""
ONLINE_SUFFIX = "_online"
"""Appended to a quantile model's name for its forecasts calibrated online."""
ONLINE_STEP_SIZES: dict[str, float] = {
    "lstm": DEFAULT_STEP_SIZE,
    "naive": 0.005,
    "naive_hourly": 0.005,
    "seasonal_naive": 2.0,
    "seasonal_naive_hourly": 2.0,
    "holt_winters": 0.2,
}
"""Each quantile model's online calibration step, each chosen on the validation VCs only (the
lowest pinball loss there; docs/experiments/2026-11-27-forecaster-quantiles.md)."""


@dataclass(frozen=True)
class Evaluation:
    """Forecasts of every model and the actual values at the same origins."""

    horizons_min: tuple[int, ...]
    actual: np.ndarray
    """(N, H) actual demand at each origin + horizon."""
    forecasts: dict[str, np.ndarray]
    """Model name -> (N, H) point forecasts (the median of a quantile model)."""
    origin_minutes: np.ndarray
    """(N,) origin index within its segment, for plots."""
    segment_of_origin: np.ndarray
    """(N,) which segment (of its series) each origin belongs to."""
    quantiles: tuple[float, ...] = ()
    """Levels along the last axis of `quantile_forecasts`."""
    quantile_forecasts: dict[str, np.ndarray] = field(default_factory=dict)
    """Model name -> (N, H, Q) quantile forecasts, for the models that make them."""
    series_of_origin: np.ndarray | None = None
    """(N,) which evaluated series each origin belongs to (all the first when None)."""
    size_gpus_of_origin: np.ndarray | None = None
    """(N,) the size in GPUs of the cluster each origin belongs to (1 when None)."""
    minutes_per_origin: float = 5.0
    """Minutes each origin stands for in the capacity rule's GPU-hours: the origin stride."""

    def scores(self) -> dict[str, dict[str, object]]:
        """Model name -> {"mae": per horizon, "mape": per horizon (percent, or None where
        `mape_targets` is 0)}, and for quantile models "pinball" (level -> per horizon),
        "pinball_mean", "coverage_q90" and "coverage_q10_q90" (per horizon)."""
        counted = self._mape_counted()
        out: dict[str, dict[str, object]] = {}
        for name, forecast in self.forecasts.items():
            error = np.abs(forecast - self.actual)
            mape = [
                float(100.0 * np.mean(error[counted[:, k], k] / self.actual[counted[:, k], k]))
                if counted[:, k].any() else None
                for k in range(len(self.horizons_min))
            ]
            out[name] = {"mae": error.mean(axis=0).tolist(), "mape": mape}
            if name in self.quantile_forecasts:
                out[name].update(self._quantile_scores(self.quantile_forecasts[name]))
        return out

    def capacity(self) -> dict[str, list[CapacityCost]]:
        """Quantile model name -> the capacity rule's cost at every level from the median up,
        keeping GPUs for demand `CAPACITY_HORIZON_MIN` minutes ahead."""
        column = self.horizons_min.index(CAPACITY_HORIZON_MIN)
        sizes = (np.ones(len(self.actual)) if self.size_gpus_of_origin is None
                 else self.size_gpus_of_origin)
        return {
            name: [capacity_cost(forecast[:, column, q], self.actual[:, column], sizes,
                                 self.minutes_per_origin, level)
                   for q, level in enumerate(self.quantiles) if level >= MEDIAN]
            for name, forecast in self.quantile_forecasts.items()
        }

    def mape_targets(self) -> list[int]:
        """Per horizon, how many targets MAPE counts (those of at least `MAPE_MIN_DEMAND`)."""
        return self._mape_counted().sum(axis=0).tolist()

    def _mape_counted(self) -> np.ndarray:
        """(N, H) whether each target is large enough for MAPE."""
        return self.actual >= MAPE_MIN_DEMAND

    def _quantile_scores(self, forecast: np.ndarray) -> dict[str, object]:
        """Pinball losses and coverages of one model's (N, H, Q) quantile forecasts."""
        pinball = {
            str(level): pinball_loss(self.actual, forecast[..., level_index(self.quantiles,
                                                                            level)],
                                     level).mean(axis=0).tolist()
            for level in REPORTED_LEVELS
        }
        low = forecast[..., level_index(self.quantiles, 0.1)]
        high = forecast[..., level_index(self.quantiles, 0.9)]
        return {
            "pinball": pinball,
            "pinball_mean": np.mean(list(pinball.values()), axis=0).tolist(),
            "coverage_q90": np.mean(self.actual <= high, axis=0).tolist(),
            "coverage_q10_q90": np.mean((self.actual >= low) & (self.actual <= high),
                                        axis=0).tolist(),
        }


def evaluate_series(
    series: list[DemandSeries],
    lstm: LSTMForecaster,
    standin: EWMAForecaster,
    fitted: FittedBaselines,
    origin_stride_min: int = 5,
    step_sizes: Mapping[str, float] = MappingProxyType(ONLINE_STEP_SIZES),
) -> Evaluation:
    """Forecast every origin of every segment of every series with every model, the quantile
    models also calibrated online with their ``step_sizes`` (one calibrator per series and
    model, carried across the series' segments)."""
    horizons = lstm.horizons_min
    first = max(FIRST_ORIGIN_MIN, lstm.min_history_min - 1)
    median = level_index(lstm.quantiles, MEDIAN)
    actual, points, bands, minutes, segment_ids, series_ids, sizes = [], {}, {}, [], [], [], []
    for number, one in enumerate(series):
        calibrators: dict[str, OnlineCalibrator] = {}
        clock = 0
        for index, segment in enumerate(one.segments):
            demand = segment.demand.astype(np.float64)
            origins = np.arange(first, len(demand) - max(horizons), origin_stride_min)
            if len(origins) == 0:
                continue
            quantile_models, point_models = _forecasts(
                demand, segment.minute_of_day(), origins, lstm, standin, fitted)
            scales = local_scale(demand, origins, lstm.config)
            for name, values in list(quantile_models.items()):
                calibrator = calibrators.setdefault(
                    name, OnlineCalibrator(lstm.quantiles, horizons, step_sizes[name]))
                quantile_models[name + ONLINE_SUFFIX] = calibrate_segment(
                    calibrator, values, origins, demand, scales, clock)
            clock += len(demand)
            for name, values in quantile_models.items():
                bands.setdefault(name, []).append(values)
                points.setdefault(name, []).append(values[..., median])
            for name, values in point_models.items():
                points.setdefault(name, []).append(values)
            actual.append(np.stack([demand[origins + h] for h in horizons], axis=1))
            minutes.append(origins)
            segment_ids.append(np.full(len(origins), index))
            series_ids.append(np.full(len(origins), number))
            sizes.append(np.full(len(origins), one.size_gpus))
    if not actual:
        raise ValueError(
            f"{', '.join(one.source for one in series)}: no segment is longer than "
            f"{first + max(horizons) + 1} minutes"
        )
    return Evaluation(
        horizons_min=horizons,
        actual=np.concatenate(actual),
        forecasts={name: np.concatenate(parts) for name, parts in points.items()},
        origin_minutes=np.concatenate(minutes),
        segment_of_origin=np.concatenate(segment_ids),
        quantiles=lstm.quantiles,
        quantile_forecasts={name: np.concatenate(parts) for name, parts in bands.items()},
        series_of_origin=np.concatenate(series_ids),
        size_gpus_of_origin=np.concatenate(sizes),
        minutes_per_origin=float(origin_stride_min),
    )


def _forecasts(
    demand: np.ndarray, minute_of_day: np.ndarray, origins: np.ndarray, lstm: LSTMForecaster,
    standin: EWMAForecaster, fitted: FittedBaselines,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Every model's forecasts from ``origins`` of one segment: quantile models' (N, H, Q) at
    the LSTM's levels, then point models' (N, H)."""
    horizons, at = lstm.horizons_min, minute_of_day[origins]
    naive = baselines.naive(demand, origins, horizons)
    seasonal = baselines.seasonal_naive(demand, origins, horizons)
    holt_winters = baselines.holt_winters(demand, origins, horizons, fitted.holt_winters)
    quantile_models = {
        "lstm": lstm.predict_many(demand, minute_of_day, origins),
        "naive": fitted.naive.apply(naive, at, hourly=False),
        "naive_hourly": fitted.naive.apply(naive, at, hourly=True),
        "seasonal_naive": fitted.seasonal_naive.apply(seasonal, at, hourly=False),
        "seasonal_naive_hourly": fitted.seasonal_naive.apply(seasonal, at, hourly=True),
        "holt_winters": holt_winters_quantiles(holt_winters, fitted.holt_winters, horizons,
                                               lstm.quantiles),
    }
    point_models = {
        "naive_last_value": naive,
        "moving_average": baselines.moving_average(demand, origins, horizons),
        "ewma_standin": standin.predict_many(demand, origins),
    }
    return quantile_models, point_models
