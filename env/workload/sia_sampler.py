"""New workloads sampled from the Philly trace the way the Sia authors (SOSP'23) sampled theirs,
for training and evaluating policies on heterogeneous clusters such as Sia's default
``6x4:T4+3x8:RTX2080Ti+2x8:A100``.

The method is the Sia artifact's (siasosp23/artifacts, ``sia-simulator/utils/generate_workload.py``
``generate_v2``, with ``Application.get_configurations`` in ``sia-simulator/applications.py``): a
fork of the Pollux generator (`rlalloc.env.workload.pollux_sampler`), re-implemented here over
our profiles with that sampler's machinery. What differs from Pollux's:

* **One absolute window.** Jobs (the same Philly rows: ran at least a minute, under 1,000
  GPU-hours) are those submitted strictly between ``start_hour`` and ``start_hour + hours``
  hours after the earliest such row, not at that time of day on any day; a job's submit offset
  is its submit time minus the window's opening. The trace's first weeks are nearly empty (the
  artifact's default window, hours 2-10, holds 3 jobs), so the start has no default here.
* **No ncf, no gpt_pmp.** A job's model follows its GPU-time: under 1 h cifar10 (the artifact
  comments out Pollux's cifar10-or-ncf choice), under 10 h deepspeech2 or bert (half each),
  under 100 h yolov3, else imagenet. The generator has no rule that emits gpt_pmp, whose
  profiles (RTX2080Ti and A100 only) serve Sia's hybrid-parallel experiments.
* **Configurations priced on RTX2080Ti, 8-GPU nodes, at most 14 GPUs.** Pollux's rule (per
  worker count the validated batch size with the shortest run, offered where that run is under
  12 h and the speed-up per worker against one GPU lies strictly between 0.5 and 0.8, else one
  GPU at its best batch size) on the ``rtx`` profiles (``base_gpu_type``), worker counts 1 and
  the even counts below ``MAX_NUM_GPUS = 16`` packed onto 8-GPU nodes.

Not reproduced: the artifact's random stream (seed S is not the authors' seed S), a GPU count it
redraws for yolov3 and imagenet jobs and never uses, and its interpolation of step times: speeds
come from `rlalloc.env.profiles`, so where the two interpolate differently a configuration can
differ.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rlalloc.env.errors import UserError
from rlalloc.env.profiles import AppProfile
from rlalloc.env.workload.pollux_sampler import (
    ConfigurationRules,
    Tiers,
    draw_jobs,
    model_configurations,
)

SIA_GPU_HOUR_TIERS: Tiers = ((1.0, ("cifar10",)), (10.0, ("deepspeech2", "bert")),
                             (100.0, ("yolov3",)), (float("inf"), ("imagenet",)))
"""(upper bound of a Philly job's GPU-hours, models it may become), in increasing order."""
SIA_RULES = ConfigurationRules(worker_counts=(1, *range(2, 16, 2)), gpus_per_node=8,
                               gpu_type="RTX2080Ti")
"""The artifact's configuration rules: ``get_configurations(0.5, 0.8, max_gpus=16,
ngpus_per_node=8)`` on the RTX 2080 Ti profiles."""


@dataclass(frozen=True)
class SiaSampleConfig:
    """What one Sia-style workload looks like: `num_jobs` jobs from the `hours`-hour window that
    opens `start_hour` hours after the trace's earliest job."""

    start_hour: int
    num_jobs: int = 160
    hours: int = 8
    seed: int = 0


def sia_model_configurations(
    profiles: Mapping[str, AppProfile],
) -> dict[str, list[tuple[int, int]]]:
    """`configurations` of every model Sia's method draws, by `SIA_RULES`: computed once, drawn
    from by every `sample_sia_workload`. UserError if the profiles lack a model or its RTX2080Ti
    measurements."""
    return model_configurations(profiles, SIA_GPU_HOUR_TIERS, SIA_RULES)


def sample_sia_workload(
    pool: pd.DataFrame, options_of: Mapping[str, list[tuple[int, int]]], config: SiaSampleConfig
) -> pd.DataFrame:
    """One Pollux-format workload drawn from `pool` (`read_philly_pool`) by Sia's method, each
    job's GPUs and batch size from its model's `options_of` (`sia_model_configurations`)."""
    offset = pool["since_first_s"].to_numpy() - config.start_hour * 3600
    in_window = np.flatnonzero((offset > 0) & (offset < config.hours * 3600))
    if len(in_window) < config.num_jobs:
        raise UserError(f"only {len(in_window)} Philly jobs fall in the {config.hours} h window "
                        f"opening {config.start_hour} h after the trace's first job; ask for "
                        "fewer jobs, a longer window or a later, busier start")
    return draw_jobs(in_window, offset, pool["gpu_hours"].to_numpy(), SIA_GPU_HOUR_TIERS,
                     options_of, config.num_jobs, config.seed)
