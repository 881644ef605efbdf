"""New Pollux-style workloads sampled from the Philly trace the way the Pollux authors sampled
``workload-1..8``, so a policy can train on many more than the six published training workloads.

The method is the Pollux artifact's (petuum/adaptdl, ``simulator/workload.py``, Apache-2.0),
re-implemented over our profiles:

* Jobs are drawn from ``philly.csv`` rows that ran at least a minute and used under 1,000
  GPU-hours, submitted within ``hours`` hours of ``start_hour`` on any day; a job's submit offset
  is its time of day minus ``start_hour`` (the published workloads: hours 2-10, 160 jobs; the 1.5x
  set draws 240).
* A job's model follows its Philly GPU-time: under 1 h cifar10 or ncf, under 10 h deepspeech2 or
  bert (half each), under 100 h yolov3, else imagenet.
* Its GPUs and batch size are one of the model's *configurations*: for each worker count packed
  onto 4-GPU nodes, the validated batch size with the shortest run, kept where that run is under
  12 h and the scaling efficiency against one GPU lies between 0.5 and 0.8 (users ask for what
  still scales reasonably). A model with none runs on one GPU at its best batch size.

Draws are not the artifact's random stream: seed S here does not reproduce ``workload-S``; it
gives a different workload from the same distribution.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from rlalloc.env.errors import UserError
from rlalloc.env.profiles import AppProfile, packed_shape
from rlalloc.env.workload.philly import PHILLY_COLUMNS, submit_timestamps
from rlalloc.env.workload.pollux import POLLUX_COLUMNS
from rlalloc.env.workload.table import MAX_DURATION_S, read_table, seconds

WORKER_COUNTS = (1, 2, 4, 6, 8, 12, 16, 24, 32, 48)
"""Worker counts a configuration may ask for (the artifact's list)."""
GPUS_PER_NODE = 4
"""Configurations are priced on the Pollux cluster's 4-GPU nodes."""
MAX_RUN_S = 12 * 3600.0
"""A configuration whose run at its best batch size exceeds this is not offered."""
SCALING_EFFICIENCY = (0.5, 0.8)
"""Open interval of speed-up per worker against one GPU a configuration must lie in."""
GPU_HOUR_TIERS = ((1.0, ("cifar10", "ncf")), (10.0, ("deepspeech2", "bert")),
                  (100.0, ("yolov3",)), (float("inf"), ("imagenet",)))
"""(upper bound of a Philly job's GPU-hours, models it may become), in increasing order."""

Tiers = tuple[tuple[float, tuple[str, ...]], ...]
"""GPU-hour tiers as `GPU_HOUR_TIERS` writes them."""


@dataclass(frozen=True)
class ConfigurationRules:
    """How `configurations` prices what a user would submit: worker counts tried, in order,
    packed onto nodes of `gpus_per_node`, at the speed measured on `gpu_type`."""

    worker_counts: tuple[int, ...] = WORKER_COUNTS
    gpus_per_node: int = GPUS_PER_NODE
    gpu_type: str | None = None
    """The GPU type whose profile prices a run; None: the profile as loaded (T4 for the Pollux
    models, the files Pollux measured)."""


POLLUX_RULES = ConfigurationRules()
"""The Pollux artifact's rules: its worker counts on 4-GPU nodes, on its own (T4) profiles."""


@dataclass(frozen=True)
class SampleConfig:
    """What one sampled workload looks like."""

    num_jobs: int = 160
    start_hour: int = 2
    hours: int = 8
    seed: int = 0


def configurations(
    profile: AppProfile, rules: ConfigurationRules = POLLUX_RULES
) -> list[tuple[int, int]]:
    """(workers, global batch size) pairs a user of this model would submit (module docstring),
    priced by `rules`."""
    if rules.gpu_type is not None:
        profile = profile.on_type[rules.gpu_type]
    sizes = profile.validated_batch_sizes
    offered: list[tuple[int, int]] = []
    base_run_s = base_batch = None
    for workers in rules.worker_counts:
        if workers * profile.min_local_bsz > sizes[-1]:
            break
        shape = packed_shape(workers, rules.gpus_per_node)
        runs = {b: profile.work_iterations(b) / profile.throughput(b).iterations_per_s(shape)
                for b in sizes if -(-b // workers) >= profile.min_local_bsz}
        best_batch = min(runs, key=runs.__getitem__)
        if workers == 1:
            base_run_s, base_batch = runs[best_batch], best_batch
            continue
        efficiency = base_run_s / runs[best_batch] / workers
        low, high = SCALING_EFFICIENCY
        if runs[best_batch] < MAX_RUN_S and low < efficiency < high:
            offered.append((workers, best_batch))
    return offered or [(1, base_batch)]


def read_philly_pool(path: Path) -> pd.DataFrame:
    """The Philly rows a workload may draw from: ``time_of_day_s``, ``since_first_s`` (seconds
    after the earliest of these rows) and ``gpu_hours`` per job."""
    path = Path(path)
    df = read_table(path, (*PHILLY_COLUMNS, "gpu_time"), "Philly")
    stamps = submit_timestamps(path, df)
    # gpu_time needs no bound of its own: jobs over 1,000 GPU-hours are left out below
    numbers = pd.DataFrame({"duration": seconds(path, df, "duration", MAX_DURATION_S),
                            "gpu_time": seconds(path, df, "gpu_time", math.inf)})
    keep = (numbers["duration"] >= 60) & (numbers["gpu_time"] < 1000 * 3600)
    stamps = stamps[keep]
    time_of_day_s = stamps.dt.hour * 3600 + stamps.dt.minute * 60 + stamps.dt.second
    since_first_s = (stamps - stamps.min()).dt.total_seconds()
    return pd.DataFrame({"time_of_day_s": time_of_day_s.to_numpy(dtype=np.int64),
                         "since_first_s": since_first_s.to_numpy(dtype=np.int64),
                         "gpu_hours": numbers["gpu_time"][keep].to_numpy() / 3600.0})


def model_configurations(
    profiles: Mapping[str, AppProfile], tiers: Tiers = GPU_HOUR_TIERS,
    rules: ConfigurationRules = POLLUX_RULES,
) -> dict[str, list[tuple[int, int]]]:
    """`configurations` of every model of `tiers` by `rules`: computed once, drawn from by every
    sampled workload. UserError if the profiles lack one of the models, or its profile on
    `rules.gpu_type`."""
    models = [model for _, tier in tiers for model in tier]
    missing = sorted(set(models) - set(profiles))
    if missing:
        raise UserError(f"the profiles lack {', '.join(missing)}; point --profiles at the full "
                        "Pollux app_profiles folder")
    if rules.gpu_type is not None:
        unmeasured = sorted(m for m in models if rules.gpu_type not in profiles[m].on_type)
        if unmeasured:
            raise UserError(f"the profiles lack {rules.gpu_type} measurements of "
                            f"{', '.join(unmeasured)}; point --profiles at a folder that has "
                            "them (the shipped profiles do)")
    return {model: configurations(profiles[model], rules) for model in models}


def sample_workload(
    pool: pd.DataFrame, options_of: Mapping[str, list[tuple[int, int]]], config: SampleConfig
) -> pd.DataFrame:
    """One Pollux-format workload (columns `POLLUX_COLUMNS`) drawn from `pool`, each job's GPUs
    and batch size from its model's `options_of` (`model_configurations`)."""
    offset = (pool["time_of_day_s"].to_numpy() - config.start_hour * 3600) % 86400
    in_window = np.flatnonzero(offset < config.hours * 3600)
    if len(in_window) < config.num_jobs:
        raise UserError(f"only {len(in_window)} Philly jobs fall in the {config.hours} h window; "
                        "ask for fewer jobs or a longer window")
    return draw_jobs(in_window, offset, pool["gpu_hours"].to_numpy(), GPU_HOUR_TIERS, options_of,
                     config.num_jobs, config.seed)


def draw_jobs(
    in_window: np.ndarray, offset_s: np.ndarray, gpu_hours: np.ndarray, tiers: Tiers,
    options_of: Mapping[str, list[tuple[int, int]]], num_jobs: int, seed: int,
) -> pd.DataFrame:
    """A Pollux-format workload of `num_jobs` of the pool rows `in_window` (indices), drawn
    uniformly without replacement by generator `seed`: each job submitted at its `offset_s`,
    its model the one (or one of those, uniformly) of its `gpu_hours` tier, its GPUs and batch
    size one of the model's `options_of`, uniformly. Jobs are named in submit order."""
    rng = np.random.default_rng(seed)
    rows = rng.choice(in_window, size=num_jobs, replace=False)
    records = []
    for time_s, hours in zip(offset_s[rows].tolist(), gpu_hours[rows].tolist(), strict=True):
        models = next(m for bound, m in tiers if hours < bound)
        model = models[int(rng.integers(len(models)))]
        workers, batch = options_of[model][int(rng.integers(len(options_of[model])))]
        records.append((int(time_s), model, workers, batch))
    records.sort(key=lambda r: r[0])
    return pd.DataFrame(
        [(f"{model}-{i}", t, model, w, b) for i, (t, model, w, b) in enumerate(records)],
        columns=list(POLLUX_COLUMNS),
    )
