"""Fitting the node-failure risk model on simulated telemetry (torch is needed only here).

Inference (`rlalloc.forecaster.risk.RiskModel`) is plain numpy, so the simulator and the actuator
load the shipped model without torch.
"""

from __future__ import annotations

import numpy as np
import torch

from rlalloc.env.failures import NodeTelemetrySample, sample_node_telemetry
from rlalloc.forecaster.risk import RiskConfig, RiskModel, lagged, window_inputs


def simulate(config: RiskConfig, seed: int) -> NodeTelemetrySample:
    """One simulated telemetry data set."""
    return sample_node_telemetry(
        config.failure_params(),
        n_nodes=config.n_nodes,
        duration_s=config.duration_days * 86_400.0,
        step_s=config.step_s,
        seed=seed,
    )


def train_risk_model(config: RiskConfig, sample: NodeTelemetrySample) -> RiskModel:
    """Fit the logistic regression on every up node-minute of ``sample``."""
    torch.manual_seed(config.train_seed)
    now, earlier = lagged(sample.features, config.lag_steps)
    up = ~sample.down
    x = window_inputs(now, earlier)[up].astype(np.float64)
    y = sample.labels(config.horizon_s)[up].astype(np.float32)
    mean, std = x.mean(axis=0), np.maximum(x.std(axis=0), 1e-6)
    inputs = torch.from_numpy(((x - mean) / std).astype(np.float32))
    targets = torch.from_numpy(y)
    linear = torch.nn.Linear(inputs.shape[1], 1)
    optimiser = torch.optim.Adam(linear.parameters(), lr=config.learning_rate)
    for _ in range(config.epochs):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            linear(inputs).squeeze(-1), targets
        )
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    return RiskModel(
        config,
        tuple(sample.feature_names),
        mean,
        std,
        linear.weight.detach().numpy()[0].astype(np.float64),
        float(linear.bias.item()),
    )
