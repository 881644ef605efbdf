"""Fit the LSTM forecaster on demand segments, keeping the epoch that validates best.

The validation windows are the tail of each training segment: their origins start where the
last training target ends, so no validation target is trained on. The test series is never
seen here.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from rlalloc.env.errors import UserError
from rlalloc.forecaster.config import ForecasterConfig, NormalisationStats
from rlalloc.forecaster.features import (
    build_inputs,
    build_targets,
    fit_stats,
    loss_weights,
    usable_origins,
)
from rlalloc.forecaster.model import LSTMForecaster
from rlalloc.forecaster.network import DemandLSTM
from rlalloc.forecaster.series import DemandSegment


@dataclass(frozen=True)
class TrainingReport:
    """What happened during training, for the model card."""

    train_windows: int
    validation_windows: int
    validation_mae_per_epoch: tuple[float, ...]
    """Validation MAE relative to the naive forecast's (1.0 = naive), horizons weighted alike."""
    best_epoch: int
    wall_time_s: float


def train_forecaster(
    segments: list[DemandSegment], config: ForecasterConfig, show_progress: bool = True
) -> tuple[LSTMForecaster, TrainingReport]:
    """Train on ``segments`` and return the best-validating model with a report."""
    started = time.perf_counter()
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    train_parts, val_parts = _split(segments, config)
    stats = fit_stats([p.demand for p in train_parts], config)
    train_set = _tensors(train_parts, config, stats, stride=config.train_stride_min)
    val_set = _tensors(val_parts, config, stats, stride=config.train_stride_min)
    if len(train_set[2]) == 0 or len(val_set[2]) == 0:
        raise UserError(
            f"not enough data: {len(train_set[2])} training and {len(val_set[2])} validation "
            f"windows; each series needs well over {config.min_history_min} minutes"
        )
    network = DemandLSTM(config, train_set[0].shape[-1], train_set[1].shape[-1])
    optimiser = torch.optim.Adam(network.parameters(), lr=config.learning_rate)
    n_batches = math.ceil(len(train_set[2]) / config.batch_size)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, config.epochs * n_batches)
    best_state, best_mae, best_epoch, curve = None, math.inf, -1, []
    for epoch in range(config.epochs):
        network.train()
        order = torch.from_numpy(rng.permutation(len(train_set[2])))
        batches = tqdm(
            order.split(config.batch_size),
            desc=f"epoch {epoch + 1}/{config.epochs}",
            disable=not show_progress,
            leave=False,
        )
        for index in batches:
            error = network(train_set[0][index], train_set[1][index]) - train_set[2][index]
            loss = (error.abs() * train_set[3][index]).mean()
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            scheduler.step()
            batches.set_postfix(loss=f"{loss.item():.3f}")
        val_mae = _validation_mae(network, val_set)
        curve.append(val_mae)
        if show_progress:
            tqdm.write(f"epoch {epoch + 1}: validation MAE (scaled) {val_mae:.4f}")
        if val_mae < best_mae:
            best_state, best_mae, best_epoch = copy.deepcopy(network.state_dict()), val_mae, epoch
    network.load_state_dict(best_state)
    forecaster = LSTMForecaster(
        config, stats, network, train_set[0].shape[-1], train_set[1].shape[-1]
    )
    report = TrainingReport(
        train_windows=len(train_set[2]),
        validation_windows=len(val_set[2]),
        validation_mae_per_epoch=tuple(curve),
        best_epoch=best_epoch + 1,
        wall_time_s=time.perf_counter() - started,
    )
    return forecaster, report


def _split(
    segments: list[DemandSegment], config: ForecasterConfig
) -> tuple[list[DemandSegment], list[DemandSegment]]:
    """Each segment's head trains, its tail (with its own warm-up history) validates."""
    train, val = [], []
    for segment in segments:
        n_val = int(len(segment.demand) * config.validation_fraction)
        cut = len(segment.demand) - n_val
        train.append(_slice(segment, 0, cut))
        # The validation part starts a history-length earlier, so its first origin is at `cut`.
        val.append(_slice(segment, max(0, cut - config.min_history_min), len(segment.demand)))
    return train, val


def _slice(segment: DemandSegment, lo: int, hi: int) -> DemandSegment:
    """Minutes [lo, hi) of a segment, with the minute of day carried along."""
    return DemandSegment(
        demand=segment.demand[lo:hi],
        start_minute_of_day=int(segment.minute_of_day()[lo]) if hi > lo else 0,
    )


def _tensors(
    parts: list[DemandSegment], config: ForecasterConfig, stats: NormalisationStats, stride: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stacked (sequence, scalars, targets, loss weights) over all parts."""
    seqs, scalars, targets, weights = [], [], [], []
    for part in parts:
        origins = usable_origins(len(part.demand), config, with_targets=True)[::stride]
        if len(origins) == 0:
            continue
        demand = part.demand.astype(np.float64)
        seq, scal = build_inputs(demand, part.minute_of_day(), origins, config, stats)
        seqs.append(seq)
        scalars.append(scal)
        targets.append(build_targets(demand, origins, config))
        weights.append(loss_weights(demand, origins, config, stats))
    if not seqs:
        empty = torch.zeros(0)
        return empty, empty, empty, empty
    return (
        torch.from_numpy(np.concatenate(seqs)),
        torch.from_numpy(np.concatenate(scalars)),
        torch.from_numpy(np.concatenate(targets)),
        torch.from_numpy(np.concatenate(weights)),
    )


def _validation_mae(
    network: DemandLSTM, data: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
) -> float:
    """Weighted absolute error on the validation windows (1.0 = the naive forecast's error).

    Where demand never moves in the validation windows (a cluster that stayed full), the naive
    forecast is exact and nothing can be relative to it: the error is then the weighted
    absolute one, which still ranks the epochs (the divisor is the same for all of them)."""
    network.eval()
    with torch.inference_mode():
        errors = [
            ((network(s, c) - t).abs() * w).sum().item()
            for s, c, t, w in zip(*(part.split(4096) for part in data), strict=True)
        ]
    naive = (data[2].abs() * data[3]).sum().item()
    return sum(errors) / naive if naive > 0 else sum(errors) / len(data[2])
