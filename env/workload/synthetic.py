"""The embedded default workload: jobs drawn to match published Philly statistics, no files needed.

Every number below is a published fact about the Microsoft Philly trace (Jeon et al., ATC'19,
as reduced to one row per job by the Pollux artifact), not a copy of the trace:

* GPUs per job: the six common sizes and their counts (`PHILLY_GPU_MIX`); the 23 jobs of 12, 24,
  64 and 128 GPUs are left out. Sizes larger than the simulated cluster are dropped and the rest
  renormalised, so the generator works on any cluster.
* Run time: log-normal with Philly's median (1,144 s) and mean (13,136 s), so
  ``mu = ln(median)`` and ``sigma = sqrt(2 ln(mean / median))`` (= 2.21), optionally truncated
  (redrawn) above `SyntheticConfig.max_duration_s`. Run time is drawn independently of the GPU
  count; in Philly, multi-GPU jobs run longer (median 17,410 s at 4 GPUs, 1,117 s at 1 GPU).
* Arrivals: a Poisson process whose rate follows Philly's hour-of-day submission profile
  (`PHILLY_HOURLY_FACTORS`), scaled so that the offered load, requested GPU-seconds over
  cluster GPU-seconds during the arrival span, equals `SyntheticConfig.load`. Conditioned on
  the number of jobs, Poisson arrival times are independent draws from the rate's shape, which
  is how they are sampled.

Jobs are generic (no profile): work is run time at the generic model's speed on the request
packed on nodes, exactly as for Philly rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlalloc.env.cluster import ClusterSpec
from rlalloc.env.errors import UserError
from rlalloc.env.profiles import GENERIC_RESTORE_S
from rlalloc.env.workload.spec import JobSpec, Workload
from rlalloc.env.workload.table import (
    MAX_DURATION_S,
    MIN_WORKERS,
    generic_max_workers,
    generic_work,
)

PHILLY_GPU_MIX: tuple[tuple[int, int], ...] = (
    (1, 76627),
    (2, 1818),
    (4, 1870),
    (8, 1643),
    (16, 199),
    (32, 67),
)
"""(GPUs requested, number of Philly jobs) of the 82,247 jobs in the Pollux reduction."""
PHILLY_MEDIAN_DURATION_S = 1144.0
"""Median Philly run time."""
PHILLY_MEAN_DURATION_S = 13136.0
"""Mean Philly run time."""
PHILLY_HOURLY_FACTORS: tuple[float, ...] = (
    1.274, 0.985, 1.119, 1.103, 0.700, 1.153, 1.673, 2.089, 1.109, 1.006, 1.024, 0.869,
    0.749, 0.705, 0.638, 0.649, 0.882, 0.668, 0.801, 0.728, 1.016, 0.917, 1.134, 1.010,
)
"""Submissions in each hour of the day (hour 0 first) relative to the hourly mean, measured once
from the 82,247 timestamps of shared/data/traces/pollux/philly.csv (trace clock, 2017-09-04 to
2017-12-22); the peak at hours 6-7 is twice the mean, the trough at 14-15 two thirds of it."""
SECONDS_PER_HOUR = 3600.0
MAX_JOBS = 100_000
"""Most jobs one generated workload may have (Philly has 82,247)."""
LOAD_RANGE = (0.01, 100.0)
"""Offered loads accepted. Below 0.01 the arrival span (and the hourly rate table over it)
grows without use; above 100 every job arrives at once anyway."""
MIN_MAX_DURATION_S = 0.1 * SECONDS_PER_HOUR
"""Smallest run-time cap: 6 minutes, under which 30 % of draws still fall; a cap far below the
median (1,144 s) would have the redraw loop spin for ever."""


@dataclass(frozen=True)
class SyntheticConfig:
    """Parameters of the generated workload; defaults reproduce the Philly statistics above."""

    num_jobs: int = 1000
    """Jobs to generate."""
    load: float = 0.8
    """Offered load: requested GPU-seconds / (cluster GPUs x arrival span). 0.8 keeps a static
    FIFO allocation busy with queues that come and go rather than grow without bound."""
    seed: int = 0
    """Seed of the numpy Generator; the same config always gives the same jobs."""
    max_duration_s: float | None = None
    """Redraw run times above this (None: untruncated, matching Philly's mean). Philly's longest
    job ran 4.6e6 s (53 days); set e.g. 7 * 86400 for shorter episodes."""
    median_duration_s: float = PHILLY_MEDIAN_DURATION_S
    """Median run time of the log-normal."""
    mean_duration_s: float = PHILLY_MEAN_DURATION_S
    """Mean run time of the (untruncated) log-normal; must exceed the median."""
    gpu_mix: tuple[tuple[int, int], ...] = PHILLY_GPU_MIX
    """(GPUs, weight) pairs of the job-size distribution."""
    hourly_factors: tuple[float, ...] = PHILLY_HOURLY_FACTORS
    """24 relative arrival rates, hour 0 first; the workload starts at hour 0."""

    def __post_init__(self) -> None:
        """Reject configurations that cannot be generated, or not in reasonable time; the
        messages use the names of ``synthetic:NUM_JOBS:LOAD:MAX_HOURS``, the way users set
        them (NaN and infinities fail every range check)."""
        check_source_fields("synthetic", self.num_jobs, self.load, self.max_duration_s,
                            self.hourly_factors)
        if not self.mean_duration_s > self.median_duration_s > 0:
            raise UserError("synthetic workload: need mean_duration_s > median_duration_s > 0")

    @property
    def sigma(self) -> float:
        """Log-normal shape: mean / median = exp(sigma^2 / 2)."""
        return lognormal_sigma(self.median_duration_s, self.mean_duration_s)


def check_source_fields(source: str, num_jobs: int, load: float, max_duration_s: float | None,
                        hourly_factors: tuple[float, ...]) -> None:
    """One-line `UserError` unless the fields every generator shares can be generated, in
    reasonable time: NUM_JOBS, LOAD and MAX_HOURS of ``SOURCE:NUM_JOBS:LOAD:MAX_HOURS`` (named
    so in the message, with `source`, the way users set them; NaN and infinities fail every
    range check) and the 24 hourly arrival factors."""
    if not 1 <= num_jobs <= MAX_JOBS:
        raise UserError(f"{source} workload: NUM_JOBS must be 1..{MAX_JOBS:,}, not {num_jobs}")
    low, high = LOAD_RANGE
    if not low <= load <= high:
        raise UserError(f"{source} workload: LOAD (offered load) must be in "
                        f"[{low:g}, {high:g}], not {load:g}")
    if max_duration_s is not None and not MIN_MAX_DURATION_S <= max_duration_s <= MAX_DURATION_S:
        low_h, high_h = MIN_MAX_DURATION_S / SECONDS_PER_HOUR, MAX_DURATION_S / SECONDS_PER_HOUR
        raise UserError(f"{source} workload: MAX_HOURS (the run-time cap) must be in "
                        f"[{low_h:g}, {high_h:g}] hours, not {max_duration_s / SECONDS_PER_HOUR:g}")
    if len(hourly_factors) != 24 or min(hourly_factors) < 0:
        raise UserError(f"{source} workload: hourly_factors needs 24 values >= 0")


def lognormal_sigma(median_s: float, mean_s: float) -> float:
    """Shape of the log-normal with this median and mean: mean / median = exp(sigma^2 / 2)."""
    return float(np.sqrt(2.0 * np.log(mean_s / median_s)))


def generate(config: SyntheticConfig, cluster: ClusterSpec) -> Workload:
    """Draw `config.num_jobs` jobs for `cluster`; reproducible from `config.seed`."""
    rng = np.random.default_rng(config.seed)
    total, limit = cluster.total_gpus, cluster.job_gpus()
    sizes = np.array([g for g, _ in config.gpu_mix if g <= limit], dtype=np.int64)
    if sizes.size == 0:
        raise UserError(f"synthetic workload: no job size in gpu_mix fits the {limit} GPUs "
                        "one job can hold on this cluster")
    weights = np.array([w for g, w in config.gpu_mix if g <= limit], dtype=float)
    gpus = rng.choice(sizes, size=config.num_jobs, p=weights / weights.sum())
    duration_s = _lognormal_durations(rng, config)

    span_s = float((gpus * duration_s).sum()) / (total * config.load)
    submit_s = np.sort(arrival_times(rng, config.hourly_factors, span_s, config.num_jobs))
    work = generic_work(duration_s, gpus, cluster.max_gpus_per_node)
    max_workers = generic_max_workers(gpus, limit)
    jobs = tuple(
        JobSpec(
            job_id=f"synthetic-{i}",
            submit_s=submit,
            requested_gpus=requested,
            work=job_work,
            min_workers=MIN_WORKERS,
            max_workers=upper,
            restore_s=GENERIC_RESTORE_S,
        )
        for i, (submit, requested, job_work, upper) in enumerate(
            zip(submit_s.tolist(), gpus.tolist(), work.tolist(), max_workers.tolist(),
                strict=True)
        )
    )
    name = f"synthetic-{config.num_jobs}-load{config.load:g}-seed{config.seed}"
    return Workload(name, jobs)


def _lognormal_durations(rng: np.random.Generator, config: SyntheticConfig) -> np.ndarray:
    mu, sigma = np.log(config.median_duration_s), config.sigma
    duration_s = rng.lognormal(mu, sigma, size=config.num_jobs)
    if config.max_duration_s is not None:
        too_long = duration_s > config.max_duration_s
        while too_long.any():
            duration_s[too_long] = rng.lognormal(mu, sigma, size=int(too_long.sum()))
            too_long = duration_s > config.max_duration_s
    return duration_s


def arrival_times(
    rng: np.random.Generator, hourly_factors: tuple[float, ...], span_s: float, count: int
) -> np.ndarray:
    """`count` independent times in [0, span_s) with density proportional to the hourly rate.

    The cumulative rate is piecewise linear between hour boundaries, so inverting it by linear
    interpolation is exact."""
    boundaries = np.append(np.arange(0.0, span_s, SECONDS_PER_HOUR), span_s)
    hours = np.arange(boundaries.size - 1)
    rate = np.asarray(hourly_factors)[hours % 24]
    cumulative = np.concatenate([[0.0], np.cumsum(rate * np.diff(boundaries))])
    return np.interp(rng.uniform(0.0, cumulative[-1], size=count), cumulative, boundaries)
