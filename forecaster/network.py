"""The LSTM network: reads the block-averaged lookback, then an MLP adds the scalar inputs."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

from rlalloc.forecaster.config import ForecasterConfig
from rlalloc.forecaster.quantiles import MEDIAN, level_index


class DemandLSTM(nn.Module):
    """LSTM over the lookback blocks, its last state joined with the scalar inputs.

    Outputs, per horizon, one scaled demand change per quantile level (see
    `rlalloc.forecaster.features`), non-decreasing over the levels by construction: the median
    plus cumulative softplus steps up to the higher levels and down to the lower ones.
    """

    def __init__(self, config: ForecasterConfig, n_seq_features: int,
                 n_scalar_features: int) -> None:
        super().__init__()
        self.n_horizons = len(config.horizons_min)
        self.n_levels = len(config.quantiles)
        self.median = level_index(config.quantiles, MEDIAN)
        self.lstm = nn.LSTM(n_seq_features, config.hidden_size, batch_first=True)
        self.head = nn.Sequential(
            nn.Linear(config.hidden_size + n_scalar_features, config.head_size),
            nn.ReLU(),
            nn.Linear(config.head_size, self.n_horizons * self.n_levels),
        )

    def forward(self, sequence: torch.Tensor, scalars: torch.Tensor) -> torch.Tensor:
        """(N, steps, F_seq), (N, F_scalar) -> (N, n_horizons, n_levels) scaled changes."""
        _, (hidden, _) = self.lstm(sequence)
        raw = self.head(torch.cat([hidden[-1], scalars], dim=-1))
        raw = raw.view(-1, self.n_horizons, self.n_levels)
        centre = raw[..., self.median : self.median + 1]
        up = torch.cumsum(functional.softplus(raw[..., self.median + 1 :]), dim=-1)
        down = torch.cumsum(functional.softplus(raw[..., : self.median]).flip(-1), dim=-1)
        return torch.cat([centre - down.flip(-1), centre, centre + up], dim=-1)
