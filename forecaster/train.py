"""Fit the LSTM forecaster on demand segments with the pinball loss, keeping the epoch that
validates best, then calibrate its quantiles on the validation windows.

Validation is either separate series (other clusters: `forecast train --val-series`, which is
how the shipped model is chosen and calibrated) or, without them, the tail of each training
segment, whose origins start where the last training target ends so no validation target is
trained on. The evaluation series are never seen here.
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
from rlalloc.forecaster.quantiles import MEDIAN, level_index
from rlalloc.forecaster.series import DemandSegment


@dataclass(frozen=True)
class TrainingReport:
    """What happened during training, for the model card."""

    train_windows: int
    validation_windows: int
    validation_pinball_per_epoch: tuple[float, ...]
    """Validation pinball loss, mean over levels and windows, each horizon in units of its
    typical change (so the horizons weigh alike)."""
    best_epoch: int
    wall_time_s: float
    validation_coverage: tuple[tuple[float, ...], ...] = ()
    """Per horizon, per level: share of validation targets at or below the quantile before
    calibration (calibration brings it to the level)."""


def train_forecaster(
    segments: list[DemandSegment],
    config: ForecasterConfig,
    show_progress: bool = True,
    validation: list[DemandSegment] | None = None,
) -> tuple[LSTMForecaster, TrainingReport]:
    """Train on ``segments`` and return the best-validating, calibrated model with a report.

    ``validation``: segments of other series that choose the epoch and calibrate the
    quantiles; without them, the tail of every training segment does.
    """
    started = time.perf_counter()
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    train_parts, val_parts = (segments, validation) if validation else _split(segments, config)
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
    levels = torch.tensor(config.quantiles, dtype=torch.float32)
    best_state, best_loss, best_epoch, curve = None, math.inf, -1, []
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
            predicted = network(train_set[0][index], train_set[1][index])
            loss = _pinball(predicted, train_set[2][index], train_set[3][index], levels).mean()
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            scheduler.step()
            batches.set_postfix(loss=f"{loss.item():.3f}")
        predicted = _predict(network, val_set)
        val_loss = _pinball(predicted, val_set[2], val_set[3], levels).mean().item()
        curve.append(val_loss)
        if show_progress:
            tqdm.write(f"epoch {epoch + 1}: validation pinball loss {val_loss:.4f}")
        if val_loss < best_loss:
            best_state, best_loss, best_epoch = copy.deepcopy(network.state_dict()), val_loss, epoch
    network.load_state_dict(best_state)
    residual = (val_set[2][..., None] - _predict(network, val_set)).numpy().astype(np.float64)
    calibration = _calibration(residual, config)
    forecaster = LSTMForecaster(
        config, stats, network, train_set[0].shape[-1], train_set[1].shape[-1], calibration
    )
    report = TrainingReport(
        train_windows=len(train_set[2]),
        validation_windows=len(val_set[2]),
        validation_pinball_per_epoch=tuple(curve),
        best_epoch=best_epoch + 1,
        wall_time_s=time.perf_counter() - started,
        validation_coverage=tuple(tuple(np.mean(residual[:, h] <= 0, axis=0).tolist())
                                  for h in range(residual.shape[1])),
    )
    return forecaster, report


def _calibration(residual: np.ndarray, config: ForecasterConfig) -> np.ndarray:
    """(H, Q) shifts that make each level's quantile cover its share of the validation
    targets (the level-quantile of the residuals, conformal-style); the median is left as
    trained, and everything is zero when calibration is off."""
    shift = np.zeros(residual.shape[1:])
    if not config.calibrate:
        return shift
    for column, level in enumerate(config.quantiles):
        if column != level_index(config.quantiles, MEDIAN):
            shift[:, column] = np.quantile(residual[:, :, column], level, axis=0)
    return shift


def _pinball(predicted: torch.Tensor, target: torch.Tensor, weight: torch.Tensor,
             levels: torch.Tensor) -> torch.Tensor:
    """Pinball loss per window, horizon and level, (N, H, Q), weighted into demand units per
    horizon's typical change (`loss_weights`)."""
    error = target[..., None] - predicted
    return torch.maximum(levels * error, (levels - 1.0) * error) * weight[..., None]


def _predict(network: DemandLSTM, data: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The network's scaled quantiles for every window of ``data``, in chunks."""
    network.eval()
    with torch.inference_mode():
        return torch.cat([network(s, c) for s, c in zip(data[0].split(4096),
                                                        data[1].split(4096), strict=True)])


def _split(
    segments: list[DemandSegment], config: ForecasterConfig
) -> tuple[list[DemandSegment], list[DemandSegment]]:
    """Each segment's head trains, its tail (with its own warm-up history) validates: the
    validation without separate validation series."""
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
