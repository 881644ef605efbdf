"""Node-failure risk: probability that a node fails within the next `horizon_s`, from telemetry.

No public per-node failure telemetry exists, so the model is trained and scored on the
simulator's warning process (`rlalloc.env.failures.sample_node_telemetry`): it can only be as
right as that process is. The model is a logistic regression over the node's current windowed
telemetry (XID errors, double-bit ECC errors, readiness flaps, temperature excess) and the same
features `lag_steps` samples earlier, so it sees whether a warning episode is building up. It is
small enough to store as plain JSON numbers and to run on every node at every decision.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlalloc.env.failures import (
    STRESS_FAILURES_PER_GPU_DAY,
    FailureParams,
    NodeTelemetrySample,
)
from rlalloc.models import shipped

SHIPPED_RISK_DIR = shipped("risk")
"""Where `load_risk_model()` looks by default."""
RISK_MODEL_FILE = "risk_model.json"


@dataclass(frozen=True)
class RiskConfig:
    """How the risk model's training data is simulated and how the model is fitted."""

    horizon_s: float = 3600.0
    """Predict failure within this long: the longest warning lead of the simulator."""
    step_s: float = 60.0
    """Telemetry sampling interval (one decision per minute)."""
    lag_steps: int = 10
    """The model also reads the features this many steps earlier (a trend over 10 min)."""
    n_nodes: int = 64
    """Simulated nodes per data set."""
    duration_days: float = 14.0
    """Simulated days per data set."""
    failures_per_gpu_day: float = STRESS_FAILURES_PER_GPU_DAY
    """Failure rate of the simulated training data: the stress preset, so that two weeks hold
    a few hundred failures to learn from; the warning process itself is the default one."""
    train_seed: int = 0
    """Seed of the training telemetry."""
    test_seed: int = 1
    """Seed of the held-out telemetry the card's scores come from."""
    epochs: int = 200
    """Full-batch Adam steps."""
    learning_rate: float = 0.05
    """Adam learning rate."""

    def failure_params(self) -> FailureParams:
        """The simulator's failure process used for the data."""
        return FailureParams(failures_per_gpu_day=self.failures_per_gpu_day)


class RiskModel:
    """Logistic regression over log-scaled node telemetry windows."""

    def __init__(
        self,
        config: RiskConfig,
        feature_names: tuple[str, ...],
        mean: np.ndarray,
        std: np.ndarray,
        weights: np.ndarray,
        bias: float,
    ) -> None:
        """No alarm threshold here: the policies that read the risk decide where a node is at
        risk (`rlalloc.env.featurizer.RISKY_NODE_SCORE`), and the card scores the model there."""
        self.config = config
        self.feature_names = feature_names
        self.mean, self.std, self.weights, self.bias = mean, std, weights, bias

    def predict_proba(self, now: np.ndarray, earlier: np.ndarray) -> np.ndarray:
        """P(fail within horizon) per node from features now and `lag_steps` earlier.

        ``now`` and ``earlier`` are (..., F) in `feature_names` order; returns (...).
        """
        x = (window_inputs(now, earlier).astype(np.float64) - self.mean) / self.std
        return 1.0 / (1.0 + np.exp(-(x @ self.weights + self.bias)))

    def predict_sample(self, sample: NodeTelemetrySample) -> np.ndarray:
        """(T, n_nodes) risk over a whole telemetry sample (the first `lag_steps` read zeros)."""
        now, earlier = lagged(sample.features, self.config.lag_steps)
        return self.predict_proba(now, earlier)

    def save(self, directory: str | Path) -> None:
        """Write ``risk_model.json`` (config, feature names, scaling and weights)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        data = {
            "format_version": 1,
            "config": asdict(self.config),
            "feature_names": list(self.feature_names),
            "mean": self.mean.tolist(),
            "std": self.std.tolist(),
            "weights": self.weights.tolist(),
            "bias": self.bias,
        }
        text = json.dumps(data, indent=2, allow_nan=False)
        (directory / RISK_MODEL_FILE).write_text(text + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> RiskModel:
        """Inverse of `save`."""
        data: dict[str, Any] = json.loads((Path(directory) / RISK_MODEL_FILE).read_text())
        return cls(
            RiskConfig(**data["config"]),
            tuple(data["feature_names"]),
            np.asarray(data["mean"]),
            np.asarray(data["std"]),
            np.asarray(data["weights"]),
            float(data["bias"]),
        )


def load_risk_model(path: str | Path | None = None) -> RiskModel:
    """Load a saved risk model; ``None`` means the one shipped in ``models/risk``."""
    return RiskModel.load(SHIPPED_RISK_DIR if path is None else path)


def lagged(features: np.ndarray, lag_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """(T, N, F) features and the same shifted by ``lag_steps`` (zeros before the start)."""
    earlier = np.zeros_like(features)
    earlier[lag_steps:] = features[: len(features) - lag_steps]  # not [:-lag]: empty for 0
    return features, earlier


def window_inputs(now: np.ndarray, earlier: np.ndarray) -> np.ndarray:
    """Model inputs: signed log1p of the features now and their change since ``earlier``.

    The log keeps a burst of 30 XIDs from outweighing everything else.
    """
    return np.concatenate(
        [_signed_log1p(now), _signed_log1p(now - earlier)], axis=-1
    )


def _signed_log1p(values: np.ndarray) -> np.ndarray:
    """log1p of the magnitude, sign kept (temperature deltas can be negative)."""
    return np.sign(values) * np.log1p(np.abs(values))
