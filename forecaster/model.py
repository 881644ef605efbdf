"""The deployable demand forecaster: weights + config + normalisation stats, plain files only.

A saved model is a directory with ``weights.pt`` (a torch ``state_dict`` of tensors, loaded with
``weights_only=True``) and ``config.json`` (the `ForecasterConfig`, the `NormalisationStats`,
the input sizes and the quantile calibration). Nothing is pickled, so it loads across Python
and torch versions.

It forecasts quantiles of demand (`ForecasterConfig.quantiles`) at every horizon; the median
is the point forecast the simulator and actuator use (`rlalloc.forecaster.signals`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from rlalloc.forecaster.config import SHIPPED_MODEL_DIR, ForecasterConfig, NormalisationStats
from rlalloc.forecaster.features import build_inputs, local_scale
from rlalloc.forecaster.history import check_history
from rlalloc.forecaster.network import DemandLSTM
from rlalloc.forecaster.quantiles import MEDIAN, level_index, without_crossing
from rlalloc.forecaster.series import MINUTES_PER_DAY

FORMAT_VERSION = 2
WEIGHTS_FILE = "weights.pt"
CONFIG_FILE = "config.json"


class LSTMForecaster:
    """Forecast quantiles of demand (fraction of the cluster's GPUs) at each horizon."""

    def __init__(
        self,
        config: ForecasterConfig,
        stats: NormalisationStats,
        network: DemandLSTM,
        n_seq_features: int,
        n_scalar_features: int,
        calibration: np.ndarray | None = None,
    ) -> None:
        self.config = config
        self.stats = stats
        self.network = network.eval()
        self.n_seq_features = n_seq_features
        self.n_scalar_features = n_scalar_features
        shape = (len(config.horizons_min), len(config.quantiles))
        self.calibration = np.zeros(shape) if calibration is None else np.asarray(
            calibration, dtype=np.float64)
        """(H, Q) shift of each scaled quantile, fitted on the validation VCs (zero: none)."""
        if self.calibration.shape != shape or not np.isfinite(self.calibration).all():
            raise ValueError(f"calibration must be {shape} finite numbers")

    @property
    def quantiles(self) -> tuple[float, ...]:
        """Quantile levels along the last axis of what `predict` returns."""
        return self.config.quantiles

    @property
    def median_index(self) -> int:
        """Position of the median (the point forecast) among `quantiles`."""
        return level_index(self.config.quantiles, MEDIAN)

    @property
    def horizons_min(self) -> tuple[int, ...]:
        """Minutes ahead of each value `predict` returns."""
        return self.config.horizons_min

    @property
    def min_history_min(self) -> int:
        """Fewest per-minute samples `predict` needs."""
        return self.config.min_history_min

    def predict(self, history: np.ndarray, last_minute_of_day: int | None = None) -> np.ndarray:
        """Quantiles of demand at each horizon after the last sample of ``history``.

        ``history`` is per-minute demand, oldest first, at least `min_history_min` samples,
        all finite. ``last_minute_of_day`` (0..1439) is the minute of the last sample; required
        when the model uses the time of day. Returns a float64 array (len(horizons_min),
        len(quantiles)), non-decreasing along its last axis; column `median_index` is the
        point forecast.
        """
        demand = check_history(history, self.min_history_min)
        minute_of_day = self._minutes(len(demand), last_minute_of_day)
        return self.predict_many(demand, minute_of_day, np.array([len(demand) - 1]))[0]

    def predict_many(
        self, demand: np.ndarray, minute_of_day: np.ndarray, origins: np.ndarray
    ) -> np.ndarray:
        """Forecasts from many origins of one series at once, (len(origins), H, Q).

        The batched form of `predict`, for evaluation over a whole series.
        """
        outputs = []
        for chunk in np.array_split(origins, max(1, len(origins) // 4096)):
            outputs.append(self._scaled_quantiles(demand, minute_of_day, chunk)
                           * local_scale(demand, chunk, self.config)[:, None, None]
                           + demand[chunk, None, None])
        return np.concatenate(outputs).astype(np.float64)

    def _scaled_quantiles(
        self, demand: np.ndarray, minute_of_day: np.ndarray, origins: np.ndarray
    ) -> np.ndarray:
        """Calibrated quantiles of the change in units of `local_scale`, (N, H, Q)."""
        sequence, scalars = build_inputs(demand, minute_of_day, origins, self.config, self.stats)
        with torch.inference_mode():
            change = self.network(torch.from_numpy(sequence), torch.from_numpy(scalars))
        return without_crossing(change.numpy().astype(np.float64) + self.calibration)

    def _minutes(self, length: int, last_minute_of_day: int | None) -> np.ndarray:
        """Minute of day of every history sample (zeros when the model ignores time of day)."""
        if not self.config.use_time_of_day:
            return np.zeros(length, dtype=np.int64)
        if last_minute_of_day is None or not 0 <= last_minute_of_day < MINUTES_PER_DAY:
            raise ValueError(
                f"this forecaster uses the time of day: pass last_minute_of_day in 0..1439, "
                f"got {last_minute_of_day!r}"
            )
        return (last_minute_of_day - np.arange(length)[::-1]) % MINUTES_PER_DAY

    def save(self, directory: str | Path) -> None:
        """Write ``weights.pt`` and ``config.json`` into ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(self.network.state_dict(), directory / WEIGHTS_FILE)
        meta = {
            "format_version": FORMAT_VERSION,
            "config": self.config.to_json(),
            "stats": self.stats.to_json(),
            "n_seq_features": self.n_seq_features,
            "n_scalar_features": self.n_scalar_features,
            "calibration": self.calibration.tolist(),
        }
        text = json.dumps(meta, indent=2, allow_nan=False)
        (directory / CONFIG_FILE).write_text(text + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> LSTMForecaster:
        """Inverse of `save`."""
        directory = Path(directory)
        meta = json.loads((directory / CONFIG_FILE).read_text())
        if meta.get("format_version") != FORMAT_VERSION:
            version = meta.get("format_version")
            raise ValueError(f"{directory}: unsupported forecaster format {version}")
        config = ForecasterConfig.from_json(meta["config"])
        network = DemandLSTM(config, meta["n_seq_features"], meta["n_scalar_features"])
        state = torch.load(directory / WEIGHTS_FILE, map_location="cpu", weights_only=True)
        network.load_state_dict(state)
        return cls(
            config,
            NormalisationStats.from_json(meta["stats"]),
            network,
            meta["n_seq_features"],
            meta["n_scalar_features"],
            np.asarray(meta["calibration"], dtype=np.float64),
        )


def load_demand_forecaster(path: str | Path | None = None) -> LSTMForecaster:
    """Load a saved LSTM forecaster; ``None`` means the one shipped in ``models/forecaster``."""
    return LSTMForecaster.load(SHIPPED_MODEL_DIR if path is None else path)
