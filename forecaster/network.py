"""The LSTM network: reads the block-averaged lookback, then an MLP adds the scalar inputs."""

from __future__ import annotations

import torch
from torch import nn

from rlalloc.forecaster.config import ForecasterConfig


class DemandLSTM(nn.Module):
    """LSTM over the lookback blocks, its last state joined with the scalar inputs.

    Outputs one scaled demand change per horizon (see `rlalloc.forecaster.features`).
    """

    def __init__(self, config: ForecasterConfig, n_seq_features: int,
                 n_scalar_features: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(n_seq_features, config.hidden_size, batch_first=True)
        self.head = nn.Sequential(
            nn.Linear(config.hidden_size + n_scalar_features, config.head_size),
            nn.ReLU(),
            nn.Linear(config.head_size, len(config.horizons_min)),
        )

    def forward(self, sequence: torch.Tensor, scalars: torch.Tensor) -> torch.Tensor:
        """(N, steps, F_seq), (N, F_scalar) -> (N, n_horizons) scaled changes."""
        _, (hidden, _) = self.lstm(sequence)
        return self.head(torch.cat([hidden[-1], scalars], dim=-1))
