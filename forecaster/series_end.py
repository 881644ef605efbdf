"""The forecast a running forecaster would make now: quantiles of demand after the last minute
of a series, calibrated online on that series' own past outcomes.

This is what a predictive autoscaler asks for (how many GPUs to keep for the next hour, and
how surely), and what `rlalloc forecast predict` prints. The calibration replays the series as
`forecast evaluate` does (a forecast every ``origin_stride_min`` minutes, each outcome fed to
the `OnlineCalibrator` once its minute is known), so the offsets at the end are those the
forecaster would hold had it run over the whole file.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from rlalloc.env.errors import UserError
from rlalloc.forecaster.capacity import gpus_to_keep
from rlalloc.forecaster.features import local_scale
from rlalloc.forecaster.model import LSTMForecaster
from rlalloc.forecaster.online_calibration import (
    DEFAULT_STEP_SIZE,
    OnlineCalibrator,
    calibrate_segment,
)
from rlalloc.forecaster.series import DemandSeries


@dataclass(frozen=True)
class SeriesEndForecast:
    """Quantiles of demand after a series' last minute, with what they were made from."""

    horizons_min: tuple[int, ...]
    quantiles: tuple[float, ...]
    demand: np.ndarray
    """(H, Q) demand fractions, non-decreasing along the levels."""
    last_demand: float
    """Demand in the series' last minute, the origin's."""
    origin: pd.Timestamp | None
    """When the last minute began, where the series has timestamps."""
    size_gpus: float
    """The cluster's size in GPUs that turns fractions into GPUs (the series' median total,
    or the size the caller gave)."""
    outcomes_seen: int
    """Past forecasts whose outcomes calibrated these quantiles (0: as fitted at training)."""

    def gpus(self) -> np.ndarray:
        """(H, Q) each quantile in whole GPUs: the capacity rule's GPUs to keep for it."""
        return gpus_to_keep(self.demand, self.size_gpus).astype(int)


def forecast_series_end(series: DemandSeries, lstm: LSTMForecaster,
                        step_size: float = DEFAULT_STEP_SIZE, origin_stride_min: int = 5,
                        size_gpus: float | None = None) -> SeriesEndForecast:
    """``lstm``'s quantiles after the last minute of ``series``, calibrated online with
    ``step_size`` on forecasts made every ``origin_stride_min`` minutes of its past (in every
    gap-free run long enough to forecast from and score), in GPUs of a cluster of
    ``size_gpus`` (default: the series' own size). A `UserError` when the last run is
    shorter than the model's history (forecasting from an earlier run's end would be stale),
    or when neither the series nor ``size_gpus`` gives the cluster's size."""
    if size_gpus is None and not series.size_from_file:
        raise UserError(f"{series.source}: a time,demand file holds no cluster size; pass "
                        "--gpus N, the cluster's GPUs, to have the quantiles in GPUs")
    last = series.segments[-1]
    if len(last.demand) < lstm.min_history_min:
        raise UserError(
            f"{series.source}: its last gap-free run is {len(last.demand)} minutes but the "
            f"forecaster needs the last {lstm.min_history_min}; supply the recent minutes "
            "without a gap longer than 10 minutes")
    calibrator = OnlineCalibrator(lstm.quantiles, lstm.horizons_min, step_size)
    clock, seen = 0, 0
    for segment in series.segments:
        demand = segment.demand.astype(np.float64)
        origins = np.arange(lstm.min_history_min - 1, len(demand) - max(lstm.horizons_min),
                            origin_stride_min)
        if len(origins):
            raw = lstm.predict_many(demand, segment.minute_of_day(), origins)
            calibrate_segment(calibrator, raw, origins, demand,
                              local_scale(demand, origins, lstm.config), clock)
            seen += len(origins) * len(lstm.horizons_min)
        clock += len(demand)
    demand = last.demand.astype(np.float64)
    end = np.array([len(demand) - 1])
    raw = lstm.predict_many(demand, last.minute_of_day(), end)[0]
    quantiles = calibrator.calibrate(clock - 1, raw, float(local_scale(demand, end,
                                                                       lstm.config)[0]))
    return SeriesEndForecast(
        horizons_min=lstm.horizons_min,
        quantiles=lstm.quantiles,
        demand=quantiles,
        last_demand=float(demand[-1]),
        origin=None if last.start is None else last.start + pd.Timedelta(minutes=len(demand) - 1),
        size_gpus=series.size_gpus if size_gpus is None else size_gpus,
        outcomes_seen=seen,
    )
