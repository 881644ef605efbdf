"""Turn a demand history into the LSTM's inputs and targets.

One function builds the inputs for training (many origins at once) and for `predict` (one
origin), so the deployed path cannot drift from the trained one. The network predicts the
*change* from the last observed value: that makes "no change" (the naive forecast) its zero
point, and what it learns is only when and how demand moves — mean reversion after a burst,
the daily cycle (seen through the value one day earlier and the time of day). Every change
is measured in units of the series' own recent volatility (`local_scale`), so that a model
trained on a calm cluster sees a jumpy one in familiar units.
"""

from __future__ import annotations

import numpy as np

from rlalloc.forecaster.config import ForecasterConfig, NormalisationStats
from rlalloc.forecaster.series import MINUTES_PER_DAY


def fit_stats(segments: list[np.ndarray], config: ForecasterConfig) -> NormalisationStats:
    """Normalisation scales from the training segments only."""
    values = np.concatenate(segments).astype(np.float64)
    target_scale = []
    for horizon in config.horizons_min:
        changes = np.concatenate([s[horizon:] - s[:-horizon] for s in segments])
        target_scale.append(float(max(np.mean(np.abs(changes)), 1e-3)))
    return NormalisationStats(
        level_mean=float(values.mean()),
        level_std=float(max(values.std(), 1e-3)),
        change_scale=target_scale[-1],
        target_scale=tuple(target_scale),
    )


def usable_origins(length: int, config: ForecasterConfig, with_targets: bool) -> np.ndarray:
    """Indices of the last observed minute at which a full input window (and target) exists."""
    first = config.min_history_min - 1
    last = length - 1 - (max(config.horizons_min) if with_targets else 0)
    return np.arange(first, last + 1)


def local_scale(demand: np.ndarray, origins: np.ndarray, config: ForecasterConfig) -> np.ndarray:
    """Spread of demand over each origin's lookback, floored: the unit of all change values.

    Measuring changes in units of the cluster's own recent volatility is what lets a model
    trained on a calm cluster forecast a jumpy one (and vice versa).
    """
    cumsum = np.concatenate([[0.0], np.cumsum(demand)])
    cumsum_sq = np.concatenate([[0.0], np.cumsum(demand**2)])
    lo, hi = origins + 1 - config.lookback_min, origins + 1
    mean = (cumsum[hi] - cumsum[lo]) / config.lookback_min
    mean_sq = (cumsum_sq[hi] - cumsum_sq[lo]) / config.lookback_min
    return np.maximum(np.sqrt(np.maximum(mean_sq - mean**2, 0.0)), config.min_scale)


def build_inputs(
    demand: np.ndarray,
    minute_of_day: np.ndarray,
    origins: np.ndarray,
    config: ForecasterConfig,
    stats: NormalisationStats,
) -> tuple[np.ndarray, np.ndarray]:
    """Sequence and scalar inputs for every origin (the index of the last observed minute).

    Returns ``sequence`` (N, lookback/block, F_seq) — block means of the lookback relative to
    the last value, and the time of day — and ``scalars`` (N, F_scalar) — the last level, the
    last 1- and 5-minute changes, per horizon the demand one day before the target minute
    relative to now, the local scale, and the time of day now. Changes are in units of
    `local_scale`.
    """
    demand = demand.astype(np.float64)
    cumsum = np.concatenate([[0.0], np.cumsum(demand)])
    last = demand[origins]
    scale = local_scale(demand, origins, config)
    n_blocks = config.lookback_min // config.block_min
    # Block j covers minutes (origin - lookback, origin] split into equal blocks, oldest first.
    block_ends = origins[:, None] - config.lookback_min + config.block_min * (
        np.arange(n_blocks)[None, :] + 1
    )
    block_means = (cumsum[block_ends + 1] - cumsum[block_ends + 1 - config.block_min]) / (
        config.block_min
    )
    seq_parts = [(block_means - last[:, None]) / scale[:, None]]
    scalar_parts = [
        (last - stats.level_mean) / stats.level_std,
        np.log(scale / stats.change_scale),
        (last - demand[origins - 1]) / scale,
        (last - demand[origins - 5]) / scale,
    ]
    width = config.seasonal_halfwidth_min
    for horizon in config.horizons_min:
        centre = origins + horizon - config.seasonal_lag_min
        seasonal = (cumsum[centre + width + 1] - cumsum[centre - width]) / (2 * width + 1)
        scalar_parts.append((seasonal - last) / scale)
    if config.use_time_of_day:
        seq_parts.extend(_time_of_day(minute_of_day[block_ends]))
        scalar_parts.extend(_time_of_day(minute_of_day[origins]))
    sequence = np.stack(seq_parts, axis=-1).astype(np.float32)
    scalars = np.stack(scalar_parts, axis=-1).astype(np.float32)
    return sequence, scalars


def build_targets(demand: np.ndarray, origins: np.ndarray, config: ForecasterConfig) -> np.ndarray:
    """Change from the last value to each horizon in units of `local_scale`, (N, n_horizons)."""
    demand = demand.astype(np.float64)
    scale = local_scale(demand, origins, config)
    columns = [(demand[origins + h] - demand[origins]) / scale for h in config.horizons_min]
    return np.stack(columns, axis=-1).astype(np.float32)


def loss_weights(
    demand: np.ndarray, origins: np.ndarray, config: ForecasterConfig, stats: NormalisationStats
) -> np.ndarray:
    """Per-sample, per-horizon weights that turn the error on scaled targets back into demand
    units (divided by each horizon's typical change, so the horizons count alike): training
    then minimises the MAE that evaluation reports."""
    scale = local_scale(demand.astype(np.float64), origins, config)
    return (scale[:, None] / np.asarray(stats.target_scale)[None, :]).astype(np.float32)


def _time_of_day(minute_of_day: np.ndarray) -> list[np.ndarray]:
    """Sine and cosine of the daily phase: midnight and 23:59 are neighbours."""
    phase = 2.0 * np.pi * minute_of_day / MINUTES_PER_DAY
    return [np.sin(phase), np.cos(phase)]
