"""Quantile forecasts of the classical baselines, fitted on the training clusters.

* naive and seasonal naive: the point forecast (`rlalloc.forecaster.baselines`) plus the
  empirical quantiles of its errors on the training series at each horizon (``actual -
  forecast``: for naive, the past changes), either over all origins or by the origin's hour of
  day (`ResidualQuantiles`);
* Holt-Winters: its point forecast plus the analytic prediction interval of the additive
  damped-trend model (Hyndman et al., *Forecasting with Exponential Smoothing*, class 1):
  the h-step error variance is sigma^2 (1 + sum_{j<h} c_j^2) with c_j = alpha (1 + beta
  phi_j), phi_j = phi + ... + phi^j (the seasonal term enters only at whole days, beyond every
  horizon), sigma the one-step residual spread of the fit; Gaussian quantiles.

All are fixed at training: evaluation only applies them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from rlalloc.forecaster import baselines
from rlalloc.forecaster.baselines import HoltWintersParams
from rlalloc.forecaster.quantiles import without_crossing
from rlalloc.forecaster.series import MINUTES_PER_DAY, DemandSegment

HOURS_PER_DAY = 24
RESIDUAL_STRIDE_MIN = 5
"""Distance between the training origins whose errors make the empirical quantiles."""
PointForecast = Callable[[np.ndarray, np.ndarray, tuple[int, ...]], np.ndarray]
"""(demand, origins, horizons) -> (N, H) point forecasts, as the functions of `baselines`."""


@dataclass(frozen=True)
class ResidualQuantiles:
    """Empirical quantiles of a point forecast's errors on the training series."""

    levels: tuple[float, ...]
    horizons_min: tuple[int, ...]
    overall: np.ndarray
    """(H, Q) quantiles of actual - forecast over all training origins."""
    by_hour: np.ndarray
    """(24, H, Q) the same by the origin's hour of day."""

    def apply(self, point: np.ndarray, minute_of_day: np.ndarray, hourly: bool) -> np.ndarray:
        """Quantile forecasts (N, H, Q) from point forecasts (N, H) made at origins whose
        minute of day is ``minute_of_day`` (N,); ``hourly`` picks the by-hour quantiles."""
        offsets = self.by_hour[minute_of_day // 60] if hourly else self.overall[None]
        return point[..., None] + offsets

    def to_json(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return {"levels": list(self.levels), "horizons_min": list(self.horizons_min),
                "overall": self.overall.tolist(), "by_hour": self.by_hour.tolist()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ResidualQuantiles:
        """Inverse of `to_json`; a table of the wrong shape or with a non-finite entry is a
        ValueError."""
        levels, horizons = tuple(data["levels"]), tuple(data["horizons_min"])
        overall = np.asarray(data["overall"], dtype=np.float64)
        by_hour = np.asarray(data["by_hour"], dtype=np.float64)
        shape = (len(horizons), len(levels))
        if overall.shape != shape or by_hour.shape != (HOURS_PER_DAY, *shape):
            raise ValueError(f"residual quantiles of shape {overall.shape} / {by_hour.shape}, "
                             f"expected {shape} / {(HOURS_PER_DAY, *shape)}")
        if not (np.isfinite(overall).all() and np.isfinite(by_hour).all()):
            raise ValueError("residual quantiles are not all finite")
        return cls(levels, horizons, overall, by_hour)


def fit_residual_quantiles(
    forecast: PointForecast,
    segments: list[DemandSegment],
    levels: tuple[float, ...],
    horizons_min: tuple[int, ...],
) -> ResidualQuantiles:
    """Quantiles of ``forecast``'s errors over the training ``segments`` (origins a day in,
    so seasonal naive has its day; every `RESIDUAL_STRIDE_MIN` minutes), overall and by hour."""
    errors, hours = [], []
    for segment in segments:
        demand = segment.demand.astype(np.float64)
        origins = np.arange(MINUTES_PER_DAY, len(demand) - max(horizons_min),
                            RESIDUAL_STRIDE_MIN)
        if len(origins) == 0:
            continue
        actual = np.stack([demand[origins + h] for h in horizons_min], axis=1)
        errors.append(actual - forecast(demand, origins, horizons_min))
        hours.append(segment.minute_of_day()[origins] // 60)
    if not errors:
        raise ValueError("no training segment is longer than a day plus the longest horizon")
    error, hour = np.concatenate(errors), np.concatenate(hours)
    overall = np.quantile(error, levels, axis=0).T
    by_hour = np.stack([np.quantile(error[hour == h], levels, axis=0).T if (hour == h).any()
                        else overall for h in range(HOURS_PER_DAY)])
    return ResidualQuantiles(tuple(levels), tuple(horizons_min), overall, by_hour)


def holt_winters_std(params: HoltWintersParams, horizons_min: tuple[int, ...]) -> np.ndarray:
    """Standard deviation of the h-step Holt-Winters forecast error at each horizon, (H,)."""
    alpha, beta, phi = params.smoothing_level, params.smoothing_trend, params.damping_trend
    out = []
    for horizon in horizons_min:
        damped = np.cumsum(phi ** np.arange(1, horizon))  # phi_j for j = 1..h-1
        c = alpha * (1.0 + beta * damped)
        out.append(params.residual_std * np.sqrt(1.0 + np.sum(c**2)))
    return np.asarray(out)


def holt_winters_quantiles(point: np.ndarray, params: HoltWintersParams,
                           horizons_min: tuple[int, ...],
                           levels: tuple[float, ...]) -> np.ndarray:
    """Gaussian quantile forecasts (N, H, Q) around Holt-Winters' point forecasts (N, H)."""
    z = np.array([NormalDist().inv_cdf(level) for level in levels])
    spread = holt_winters_std(params, horizons_min)
    return without_crossing(point[..., None] + spread[None, :, None] * z[None, None, :])


@dataclass(frozen=True)
class FittedBaselines:
    """Everything the baselines learn from the training series, saved as ``baselines.json``."""

    holt_winters: HoltWintersParams
    naive: ResidualQuantiles
    """Quantiles of past changes (the naive forecast's errors)."""
    seasonal_naive: ResidualQuantiles
    """Quantiles of the seasonal naive forecast's errors."""

    def to_json(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return {"holt_winters": self.holt_winters.to_json(), "naive": self.naive.to_json(),
                "seasonal_naive": self.seasonal_naive.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FittedBaselines:
        """Inverse of `to_json`."""
        return cls(HoltWintersParams(**data["holt_winters"]),
                   ResidualQuantiles.from_json(data["naive"]),
                   ResidualQuantiles.from_json(data["seasonal_naive"]))


def fit_baselines(segments: list[DemandSegment], holt_winters: HoltWintersParams,
                  levels: tuple[float, ...], horizons_min: tuple[int, ...]) -> FittedBaselines:
    """The empirical error quantiles of naive and seasonal naive on the training ``segments``,
    with the Holt-Winters fit made on them."""
    return FittedBaselines(
        holt_winters=holt_winters,
        naive=fit_residual_quantiles(baselines.naive, segments, levels, horizons_min),
        seasonal_naive=fit_residual_quantiles(baselines.seasonal_naive, segments, levels,
                                              horizons_min),
    )
