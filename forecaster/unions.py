"""Training clusters made of real ones: the union of a few training series over the minutes they
share.

A cluster the forecaster never saw can move more often than every one it trained on: more teams
share it, so jobs arrive and leave more often, each a smaller share of it. Pooling training
clusters makes such clusters out of measured demand: their GPUs add up, so the union's demand
is the size-weighted mean of their demand fractions, at the minutes all of them cover. The
network trains on the unions beside the real series (`ForecasterConfig.union_sizes`); the
baselines, the choice of epoch and the calibration stay on real clusters only.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import pandas as pd

from rlalloc.forecaster.config import ForecasterConfig
from rlalloc.forecaster.series import DemandSegment, DemandSeries

_MINUTE = pd.Timedelta(minutes=1)


def training_segments(series: Sequence[DemandSeries],
                      config: ForecasterConfig) -> list[DemandSegment]:
    """The segments of ``series``, then the unions of every group of `config.union_sizes` of
    them (at most `config.max_unions` groups, drawn with `config.seed` when there are more)."""
    groups = [group for size in config.union_sizes
              for group in itertools.combinations(range(len(series)), size)]
    if len(groups) > config.max_unions:
        chosen = np.random.default_rng(config.seed).choice(len(groups), config.max_unions,
                                                           replace=False)
        groups = [groups[i] for i in sorted(chosen)]
    shortest = config.min_history_min + max(config.horizons_min) + 1
    unions = [segment for group in groups
              for segment in union_segments([series[i] for i in group], shortest)]
    return [segment for one in series for segment in one.segments] + unions


def union_segments(group: Sequence[DemandSeries], min_minutes: int) -> list[DemandSegment]:
    """The union of ``group``'s clusters over every run of at least ``min_minutes`` minutes that
    all of them cover. Segments without timestamps, and a group mixing zone-aware with naive
    times (which naive times mean would be a guess), share no minutes."""
    stamped = [[s for s in one.segments if s.start is not None] for one in group]
    if len({s.start.tzinfo is None for segments in stamped for s in segments}) > 1:
        return []
    unions = []
    for parts in itertools.product(*stamped):
        first = max(part.start for part in parts)
        end = min(part.start + len(part.demand) * _MINUTE for part in parts)
        length = (end - first) // _MINUTE
        if length < min_minutes:
            continue
        gpus = sum(one.size_gpus * _window(part, first, length)
                   for one, part in zip(group, parts, strict=True))
        unions.append(DemandSegment(
            demand=(gpus / sum(one.size_gpus for one in group)).astype(np.float32),
            start_minute_of_day=first.hour * 60 + first.minute,
            start=first,
        ))
    return unions


def _window(segment: DemandSegment, first: pd.Timestamp, length: int) -> np.ndarray:
    """``length`` minutes of ``segment``'s demand from ``first``, in float64."""
    offset = (first - segment.start) // _MINUTE
    return segment.demand[offset:offset + length].astype(np.float64)
