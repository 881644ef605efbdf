"""Online calibration of quantile forecasts: each level's coverage held to its level on any
series, by learning an additive offset from the outcomes as they become known.

A calibration fitted once, on other series, carries their spread: on a series that moves more
(or less) than those, a 0.9-quantile covers less (or more) than 90 %. Quantile tracking (the
proportional part of conformal PID control, Angelopoulos, Barber and Bates, NeurIPS 2023; an
additive-offset form of Gibbs and Candes' Adaptive Conformal Inference, NeurIPS 2021) fixes
that per series: after each outcome y of a level-tau forecast f + offset,

    offset += step * (tau - [y <= f + offset])

so a miss raises the offset by step * tau and a hit lowers it by step * (1 - tau); the
offset stays bounded, so the share of hits converges to tau whatever the series does (the
shortfall after T outcomes is at most the offset's range over step * T). The offset is kept in
units of the series' recent volatility at each origin (the unit the LSTM forecasts changes in,
`rlalloc.forecaster.features.local_scale`), so a constant step serves calm and jumpy VCs
alike; a step that grew with the latest errors would instead weigh misses, which come with
large errors, above hits, and over-cover.

Only what is known is used: a forecast made at minute t for t + h is updated once the demand
at t + h has been observed, and the calibrator refuses to forecast from a minute earlier than
one it has already observed. The median is left as forecast (it is the point forecast; its
error is MAE's, not a coverage), and calibrated levels are kept from crossing it or each other.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from rlalloc.forecaster.quantiles import MEDIAN, level_index

DEFAULT_STEP_SIZE = 0.002
"""The LSTM's offset step per outcome, in units of the series' recent volatility; chosen on
the validation VCs only (docs/experiments/2026-11-27-forecaster-quantiles.md)."""
OFFSET_LIMIT = 5.0
"""Largest offset, in units of the series' recent volatility. A level held at the median
(where most outcomes equal it, its coverage exceeds its level whatever its offset) would
otherwise wind its offset down without end, and miss for as long after the series wakes up."""


@dataclass(frozen=True)
class _Pending:
    """A forecast whose outcome is not known yet."""

    target_minute: int
    issued: np.ndarray
    """(Q,) the forecast handed out (offsets added, kept from crossing), whose hits count."""


class OnlineCalibrator:
    """Additive per-horizon, per-level offsets for one series' quantile forecasts, learned from
    that series' outcomes as they arrive. Feed it in time order: `observe` every minute's
    demand once known, `calibrate` each raw forecast as it is made."""

    def __init__(self, levels: tuple[float, ...], horizons_min: tuple[int, ...],
                 step_size: float = DEFAULT_STEP_SIZE) -> None:
        if not step_size >= 0.0:
            raise ValueError(f"step_size must be a non-negative number, got {step_size!r}")
        self.levels = tuple(levels)
        self.horizons_min = tuple(horizons_min)
        self.step_size = step_size
        self.median_index = level_index(self.levels, MEDIAN)
        self.offsets = np.zeros((len(self.horizons_min), len(self.levels)))
        """(H, Q) what each level's raw forecast is shifted by; the median's stays 0."""
        self._target = np.asarray(self.levels, dtype=np.float64)
        self._tracked = np.arange(len(self.levels)) != self.median_index
        self._pending: list[deque[_Pending]] = [deque() for _ in self.horizons_min]
        self._last_observed: int | None = None

    def calibrate(self, origin_minute: int, raw: np.ndarray, scale: float) -> np.ndarray:
        """The calibrated quantiles (H, Q) of a raw forecast (H, Q) made at ``origin_minute``
        (the minute of its last known sample), where the series' recent volatility is
        ``scale`` (> 0, the unit of the offsets); remembered until its outcomes are observed.

        A ValueError if ``origin_minute`` precedes a minute already observed: the offsets then
        hold outcomes that were not known at that origin."""
        if self._last_observed is not None and origin_minute < self._last_observed:
            raise ValueError(f"forecast from minute {origin_minute} after minute "
                             f"{self._last_observed} was observed: feed the calibrator in "
                             "time order")
        if not scale > 0.0:
            raise ValueError(f"scale must be a positive number, got {scale!r}")
        shifted = np.asarray(raw, dtype=np.float64) + self.offsets * scale
        issued = _monotone_from_median(shifted, self.median_index)
        for k, horizon in enumerate(self.horizons_min):
            self._pending[k].append(_Pending(origin_minute + horizon, issued[k]))
        return issued

    def observe(self, minute: int, demand: float) -> None:
        """The demand at ``minute`` is now known: update the offsets of every forecast that
        targeted it. Forecasts whose target passed unobserved are dropped."""
        if self._last_observed is not None and minute <= self._last_observed:
            raise ValueError(f"minute {minute} observed after minute {self._last_observed}")
        self._last_observed = minute
        for k, pending in enumerate(self._pending):
            while pending and pending[0].target_minute <= minute:
                forecast = pending.popleft()
                if forecast.target_minute == minute:
                    self._update(k, forecast, demand)

    def _update(self, k: int, forecast: _Pending, demand: float) -> None:
        """One outcome at horizon ``k``: every level's offset, one step each, scored on what
        was issued, and kept within `OFFSET_LIMIT`."""
        hit = (demand <= forecast.issued).astype(np.float64)
        step = np.where(self._tracked, self.step_size * (self._target - hit), 0.0)
        self.offsets[k] = np.clip(self.offsets[k] + step, -OFFSET_LIMIT, OFFSET_LIMIT)


def _monotone_from_median(values: np.ndarray, median: int) -> np.ndarray:
    """(H, Q) ``values`` with no crossing and the median column unchanged: each level above
    the median raised to the highest one below it, each level under it lowered likewise."""
    out = values.copy()
    out[:, median:] = np.maximum.accumulate(values[:, median:], axis=1)
    out[:, :median + 1] = np.minimum.accumulate(values[:, median::-1], axis=1)[:, ::-1]
    return out


def calibrate_segment(calibrator: OnlineCalibrator, raw: np.ndarray, origins: np.ndarray,
                      demand: np.ndarray, scales: np.ndarray, clock: int = 0) -> np.ndarray:
    """Raw forecasts (N, H, Q) made at ``origins`` (increasing indices into ``demand``, a
    gap-free run), where the series' recent volatility is ``scales`` (N,), calibrated as a
    forecaster running through the run would: before each origin every minute up to it is
    observed, and no later one. Every outcome of the run is observed at the end, so that the
    calibrator's state carries to the series' next run. ``clock`` is the calibrator's minute
    of ``demand[0]`` (later than any it observed)."""
    out = np.empty(raw.shape, dtype=np.float64)
    seen = 0
    for i, origin in enumerate(origins):
        for minute in range(seen, int(origin) + 1):
            calibrator.observe(clock + minute, float(demand[minute]))
        seen = int(origin) + 1
        out[i] = calibrator.calibrate(clock + int(origin), raw[i], float(scales[i]))
    for minute in range(seen, len(demand)):
        calibrator.observe(clock + minute, float(demand[minute]))
    return out
