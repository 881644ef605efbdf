"""The demand forecaster's knobs and the normalisation statistics that travel with its weights.

Both are frozen dataclasses saved as JSON next to the weights (`config.json`), so a shipped
model can be re-trained from its card and loaded without pickled Python objects.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from rlalloc.forecaster.quantiles import QUANTILE_LEVELS
from rlalloc.models import shipped

SHIPPED_MODEL_DIR = shipped("forecaster")
"""The shipped forecaster (LSTM + stand-in) that the loaders default to."""

HORIZONS_MIN: tuple[int, ...] = (5, 15, 60)
"""Forecast horizons, minutes ahead: what the allocator plans over (a restart, a queue, an hour)."""


@dataclass(frozen=True)
class ForecasterConfig:
    """Input window, network size and training schedule of the LSTM demand forecaster."""

    horizons_min: tuple[int, ...] = HORIZONS_MIN
    """Minutes ahead to forecast; the network has one output per horizon and quantile level."""
    quantiles: tuple[float, ...] = QUANTILE_LEVELS
    """Quantile levels forecast at every horizon (ascending, the median among them)."""
    lookback_min: int = 360
    """Recent history the LSTM reads: long enough to see the current level settle (6 h)."""
    block_min: int = 5
    """The lookback is averaged in blocks of this many minutes: 72 LSTM steps instead of 360."""
    seasonal_lag_min: int = 1440
    """Lag of the seasonal input: demand one day before each target minute."""
    seasonal_halfwidth_min: int = 10
    """The seasonal input is the mean over +-this many minutes, to damp single-minute noise."""
    min_scale: float = 0.02
    """Floor of the local volatility scale (fraction of the cluster), so flat spells don't
    blow small changes up."""
    use_time_of_day: bool = True
    """Feed sin/cos of the minute of day (then `predict` needs the last sample's minute)."""
    hidden_size: int = 32
    """LSTM hidden units; small on purpose: one month of data per cluster."""
    head_size: int = 64
    """Units of the MLP that maps LSTM state + scalar inputs to the horizon outputs."""
    epochs: int = 8
    """Passes over the training windows."""
    batch_size: int = 256
    """Windows per optimiser step."""
    learning_rate: float = 2e-3
    """Adam learning rate (cosine-decayed to zero over the run)."""
    train_stride_min: int = 3
    """Distance between consecutive training origins; 1 would only repeat near-identical windows."""
    validation_fraction: float = 0.1
    """Tail of every training segment held out to pick the best epoch and calibrate, when no
    validation series are given."""
    seed: int = 0
    """Seed of weight initialisation and batch order."""
    union_sizes: tuple[int, ...] = ()
    """Also train on the union of every group of this many training series, their GPUs pooled
    over the minutes they share (`rlalloc.forecaster.unions`): clusters that move more often
    than any one of them. Off by default: they help on clusters busier than the training
    ones and cost on calm ones (docs/forecaster.md); `forecast train --unions` sets (2,)."""
    max_unions: int = 32
    """At most this many unions (drawn with `seed` when there are more groups), so training
    time grows with the number of series, not with its square."""
    calibrate: bool = True
    """Shift each quantile except the median, per horizon, by the residual quantile on the
    validation VCs (conformal-style), so coverage holds on clusters never trained on."""

    @property
    def min_history_min(self) -> int:
        """Shortest history `predict` accepts: one day plus the seasonal averaging window."""
        return max(self.lookback_min, self.seasonal_lag_min + self.seasonal_halfwidth_min)

    def to_json(self) -> dict[str, Any]:
        """Plain-JSON form (tuples become lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ForecasterConfig:
        """Inverse of `to_json`; unknown keys are an error so a stale file is noticed."""
        names = {f.name for f in fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown forecaster config keys {sorted(unknown)}")
        values = dict(data)
        values["horizons_min"] = tuple(values.get("horizons_min", HORIZONS_MIN))
        values["quantiles"] = tuple(values.get("quantiles", QUANTILE_LEVELS))
        values["union_sizes"] = tuple(values.get("union_sizes", ()))
        return cls(**values)


@dataclass(frozen=True)
class NormalisationStats:
    """Scales learned from the training series, applied identically at inference."""

    level_mean: float
    """Mean demand fraction of the training series."""
    level_std: float
    """Standard deviation of demand."""
    change_scale: float
    """Typical 60-minute change of the training series: the reference for the log of the
    local volatility scale fed to the network."""
    target_scale: tuple[float, ...] = field(default_factory=tuple)
    """Per horizon: mean absolute change of the training series, so that every horizon weighs
    alike in the training loss."""

    def to_json(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NormalisationStats:
        """Inverse of `to_json`."""
        return cls(**{**data, "target_scale": tuple(data["target_scale"])})
