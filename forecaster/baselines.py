"""Classical forecasts the LSTM must beat, computed from many origins of one series at once.

* ``naive``: the last value, for every horizon (demand is sticky; this is the one to beat).
* ``seasonal_naive``: the value one day before the target minute.
* ``moving_average``: the mean of the last ``window_min`` minutes.
* ``holt_winters``: additive damped-trend, additive daily-season exponential smoothing from
  statsmodels. Its smoothing parameters are fitted on the *training* series (like the LSTM's
  weights) and then run, fixed, over the evaluated series; the h-step forecast from every origin
  is read off the filtered level, trend and season states.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass

import numpy as np
from statsmodels.tsa.holtwinters import ExponentialSmoothing

from rlalloc.forecaster.series import MINUTES_PER_DAY

MOVING_AVERAGE_WINDOW_MIN = 30
"""Window of the moving-average baseline: long enough to smooth job churn, short enough to track."""
HOLT_WINTERS_MIN_HISTORY_MIN = 2 * MINUTES_PER_DAY
"""Fewest minutes Holt-Winters can start from: statsmodels' heuristic initial states need two
full daily seasons, both to fit the parameters and to filter a series."""
HOLT_WINTERS_INIT_DAYS = 5
"""Days statsmodels' heuristic initial states average at most (fewer in a shorter series)."""
HOLT_WINTERS_FIT_DAYS = 7
"""Days of training series the Holt-Winters parameters are fitted on: a bound on the fit's
time, which grows with each day (docs/forecaster.md, "Cost")."""


@dataclass(frozen=True)
class HoltWintersParams:
    """Smoothing parameters of the Holt-Winters baseline (statsmodels' names)."""

    smoothing_level: float
    smoothing_trend: float
    smoothing_seasonal: float
    damping_trend: float
    residual_std: float = 0.0
    """Spread of the fit's one-step errors: the scale of its prediction intervals
    (`rlalloc.forecaster.quantile_baselines`)."""

    def smoothing(self) -> dict[str, float]:
        """The smoothing parameters, as statsmodels' ``fit`` takes them."""
        return {k: v for k, v in asdict(self).items() if k != "residual_std"}

    def to_json(self) -> dict[str, float]:
        """Plain-JSON form, saved next to the LSTM so evaluation uses the same fit."""
        return asdict(self)


def naive(demand: np.ndarray, origins: np.ndarray, horizons_min: tuple[int, ...]) -> np.ndarray:
    """Last observed value at every horizon, (N, H)."""
    return np.repeat(demand[origins, None], len(horizons_min), axis=1)


def seasonal_naive(
    demand: np.ndarray, origins: np.ndarray, horizons_min: tuple[int, ...]
) -> np.ndarray:
    """Value one day before each target minute, (N, H); origins need a day of history."""
    return np.stack([demand[origins + h - MINUTES_PER_DAY] for h in horizons_min], axis=1)


def moving_average(
    demand: np.ndarray,
    origins: np.ndarray,
    horizons_min: tuple[int, ...],
    window_min: int = MOVING_AVERAGE_WINDOW_MIN,
) -> np.ndarray:
    """Mean of the last ``window_min`` minutes at every horizon, (N, H)."""
    cumsum = np.concatenate([[0.0], np.cumsum(demand)])
    mean = (cumsum[origins + 1] - cumsum[origins + 1 - window_min]) / window_min
    return np.repeat(mean[:, None], len(horizons_min), axis=1)


def fit_holt_winters(demand: np.ndarray) -> HoltWintersParams:
    """Fit the smoothing parameters on the last `HOLT_WINTERS_FIT_DAYS` days of ``demand``,
    and the spread of its one-step errors there."""
    recent = demand[-HOLT_WINTERS_FIT_DAYS * MINUTES_PER_DAY :].astype(np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # statsmodels' convergence chatter; the fit is checked
        fitted = _model(recent).fit()
    params = {k: float(fitted.params[k]) for k in HoltWintersParams.__dataclass_fields__
              if k != "residual_std"}
    params["residual_std"] = float(np.sqrt(fitted.sse / len(recent)))
    if not all(np.isfinite(v) for v in params.values()):
        raise ValueError(f"Holt-Winters fit gave non-finite parameters {params}")
    return HoltWintersParams(**params)


def holt_winters(
    demand: np.ndarray,
    origins: np.ndarray,
    horizons_min: tuple[int, ...],
    params: HoltWintersParams,
) -> np.ndarray:
    """Holt-Winters forecasts from every origin with fixed ``params``, (N, H).

    Each origin's filter starts from statsmodels' heuristic initial states of the days before
    it, as statsmodels' own forecast from the series cut there would: its first
    min(`HOLT_WINTERS_INIT_DAYS`, whole days so far) days. So origins must lie at least two
    days in. (Taken from the whole series, forecasts from origins in days 2-5 used demand after
    them.) One filter runs per number of days, not per origin.
    """
    if origins.min() < HOLT_WINTERS_MIN_HISTORY_MIN - 1:
        raise ValueError("Holt-Winters origins need two days of history for initial states")
    series = demand.astype(np.float64)
    days = np.minimum((origins + 1) // MINUTES_PER_DAY, HOLT_WINTERS_INIT_DAYS)
    forecasts = np.empty((len(origins), len(horizons_min)))
    for k in np.unique(days).tolist():
        rows = np.flatnonzero(days == k)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            first = _model(series[: k * MINUTES_PER_DAY]).fit(
                optimized=False, **params.smoothing()).params
            states = _model(series, known=(first["initial_level"], first["initial_trend"],
                                           first["initial_seasons"])).fit(
                optimized=False, **params.smoothing())
        at = origins[rows]
        for column, h in enumerate(horizons_min):
            damped_sum = sum(params.damping_trend**i for i in range(1, h + 1))
            forecasts[rows, column] = (states.level[at] + damped_sum * states.trend[at]
                                       + states.season[at + h - MINUTES_PER_DAY])
    return forecasts


def _model(demand: np.ndarray,
           known: tuple[float, float, np.ndarray] | None = None) -> ExponentialSmoothing:
    """The one Holt-Winters specification used for both fitting and filtering: initial states
    by statsmodels' heuristic, or `known` ones (level, trend, one day of seasons)."""
    initial = ({"initialization_method": "heuristic"} if known is None else
               {"initialization_method": "known", "initial_level": known[0],
                "initial_trend": known[1], "initial_seasonal": known[2]})
    return ExponentialSmoothing(
        demand,
        trend="add",
        damped_trend=True,
        seasonal="add",
        seasonal_periods=MINUTES_PER_DAY,
        **initial,
    )
