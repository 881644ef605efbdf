"""A modern LLM-fleet workload: jobs of 8-GPU workers drawn from published figures, no files needed.

The scenario beside the Philly-like generator (`rlalloc.env.workload.synthetic`), for clusters of
8-GPU nodes such as ``128x8:H100``. Three kinds of job (`FleetJobClass`), as LLM development
clusters run them (Hu et al., NSDI'24, "Characterization of Large Language Model Development in
the Datacenter", Shanghai AI Lab's Acme; Kokolis et al., HPCA'25, "Revisiting Reliability in
Large-Scale Machine Learning Research Clusters", Meta's RSC-1 and RSC-2):

* ``pretrain``: few, days long, one node to hundreds of GPUs; they take most of the GPU time;
* ``finetune``: hours, one or two nodes;
* ``eval``: most of the jobs, minutes to an hour, one node, a few of them on one GPU.

What is published and checked, and what is a choice:

* Node and worker: 8 GPUs per server (Llama 3, Dubey et al. 2024: Grand Teton servers of 8 H100
  joined by NVLink); each job's worker is a whole node (`FleetConfig.gpus_per_worker`), so
  `requested_gpus` is a multiple of 8, except the single-GPU evaluation jobs, one 1-GPU worker.
* Scale: Acme's public summary (InternLM/AcmeTrace ``data/cluster_summary.csv``) gives, for its
  pre-training cluster Kalos, 19,907 GPU jobs in six months, 26.8 GPUs per job on average, a
  median of 1 GPU, at most 1,024 GPUs, and a longest run of 625,740 s (7.2 days; 14 days on
  Seren). Kokolis et al.: over 4 million jobs on 16k + 8k A100s, most of them small, while the
  large ones are the most exposed to failures. Both papers say pre-training takes most of the
  GPU time and small jobs (evaluation) most of the job count; neither share by job kind could
  be checked here against the papers' own figures, so the class shares, sizes and run times
  below are *choices* that reproduce those two qualitative facts (the defaults give
  pre-training 90 % of the GPU time, fine-tuning 8 %, evaluation 2 %, with 75 % of the jobs
  evaluations).
* Run time: log-normal per class with the class's median and mean (``sigma =
  sqrt(2 ln(mean / median))``), truncated at `FleetConfig.max_duration_s` (by default Acme's
  longest run, 14 days: `ACME_LONGEST_RUN_S`): drawn by the inverse CDF below the cap, exactly
  the redrawn distribution of the Philly-like generator, but without its redraw loop, which a
  cap far below the pre-training median would spin in.
* Arrivals: a Poisson process with Philly's hour-of-day profile (Jeon et al., ATC'19, measured
  from the Philly trace: `PHILLY_HOURLY_FACTORS`), scaled so the offered load, requested
  GPU-seconds over cluster GPU-seconds during the arrival span, equals `FleetConfig.load`, as in
  the Philly-like generator (`arrival_times`).
* Restore times and elastic ranges are choices (no published figure checked): see the fields.

Failures are not part of the workload: the node failure process (`rlalloc.env.failures`,
Llama 3's 4.7e-4 failures per GPU-day by default) and the checkpoint interval
(`SimParams.checkpoint_interval_s`) are the simulator's, the knobs to study checkpointing on
this workload with. Jobs are generic (no profile): work is run time at the generic model's speed
on the request packed on nodes, as for every generated job. That curve, fitted to the Pollux T4
profiles, runs a job spread over nodes slower than on one node, unlike LLM training: a job run
as requested takes its drawn time, but a policy that shrinks pre-training gains from the curve,
not from the workload (docs/workloads.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr, ndtri

from rlalloc.env.cluster import ClusterSpec
from rlalloc.env.errors import UserError
from rlalloc.env.profiles import GENERIC_RESTORE_S, GenericScaling
from rlalloc.env.workload.spec import JobSpec, Workload
from rlalloc.env.workload.synthetic import (
    PHILLY_HOURLY_FACTORS,
    SECONDS_PER_HOUR,
    arrival_times,
    check_source_fields,
    lognormal_sigma,
)
from rlalloc.env.workload.table import MAX_RESTORE_S, SECONDS_PER_DAY, generic_work

FLEET = "synthetic-fleet"
"""Source name of this generator, and the prefix of its messages."""
ACME_LONGEST_RUN_S = 1_209_604.0
"""Longest GPU job of Acme's Seren cluster in six months (14 days; Kalos's: 625,740 s, 7.2
days), from InternLM/AcmeTrace ``data/cluster_summary.csv``: the default run-time cap."""
GPUS_PER_SERVER = 8
"""GPUs per server of the Llama 3 training clusters (Grand Teton, 8 H100 joined by NVLink) and
of Acme's and RSC's A100 servers alike: the worker size of every multi-GPU job here."""


LLM_SCALING = GenericScaling(alpha=5e-6, beta=5e-6)
"""The fleet's speed curve, ``n / (1 + alpha (n-1) + beta n [nodes > 1])``: LLM training on
NVLink servers and a 400 Gb/s fabric scales almost linearly. Llama 3's 405B run (Dubey et al.
2024, and Balaji, SC'24) reached 430 TFLOPS per GPU on 8,192 H100s and 400 on 16,384 at the
same 16M-token batch: 93 % per-GPU efficiency kept when the GPUs double, which this curve
reproduces (alpha + beta = 1e-5; the split between the two is a choice). On the curve fitted to
Pollux's T4 profiles (`GENERIC_SCALING`) 256 GPUs on 32 nodes would run only 2.5x one GPU, so
shrinking every job would look like a gain."""


@dataclass(frozen=True)
class FleetJobClass:
    """One kind of job of the fleet: its share of jobs, sizes, run times and restore time."""

    name: str
    """Job kind, also the prefix of its jobs' ids (``pretrain-12``)."""
    share: float
    """Weight of this kind among the jobs (the weights of a config need not add up to 1)."""
    gpu_mix: tuple[tuple[int, float], ...]
    """(GPUs, weight) pairs of its sizes; sizes beyond the cluster are dropped, the rest
    renormalised."""
    median_duration_s: float
    mean_duration_s: float
    """Median and mean of its (untruncated) log-normal run time."""
    restore_s: float
    """Checkpoint-restore time paid on every (re)start, resize or move."""

    def __post_init__(self) -> None:
        """Reject a class that cannot be drawn from (one line naming the class)."""
        where = f"{FLEET} workload: job class {self.name!r}"
        if not self.share > 0:
            raise UserError(f"{where}: share must be > 0, not {self.share:g}")
        if not self.gpu_mix or any(g < 1 or not w > 0 for g, w in self.gpu_mix):
            raise UserError(f"{where}: gpu_mix needs (GPUs >= 1, weight > 0) pairs")
        if not self.mean_duration_s > self.median_duration_s > 0:
            raise UserError(f"{where}: need mean_duration_s > median_duration_s > 0")
        if not 0 <= self.restore_s <= MAX_RESTORE_S:
            raise UserError(f"{where}: restore_s must be in [0, {MAX_RESTORE_S:g}] s")


PRETRAIN = FleetJobClass(
    "pretrain", share=0.04,
    gpu_mix=((8, 0.15), (16, 0.20), (32, 0.25), (64, 0.20), (128, 0.12), (256, 0.06), (512, 0.02)),
    median_duration_s=1.5 * SECONDS_PER_DAY, mean_duration_s=2.5 * SECONDS_PER_DAY,
    restore_s=300.0,
)
"""Pre-training runs: one node to 512 GPUs (Acme's largest jobs took 1,024), a median of 1.5
days and a mean of 2.5 (Acme's longest runs: 7.2 days on Kalos, 14 on Seren; a run as long as
Llama 3's 54 days is out of reach of a few simulated weeks). Share, sizes, run times and the
5-minute restore are choices."""
FINETUNE = FleetJobClass(
    "finetune", share=0.21, gpu_mix=((8, 0.7), (16, 0.3)),
    median_duration_s=3 * SECONDS_PER_HOUR, mean_duration_s=6 * SECONDS_PER_HOUR,
    restore_s=120.0,
)
"""Fine-tuning: one or two nodes, hours (median 3 h, mean 6 h); every figure a choice."""
EVAL = FleetJobClass(
    "eval", share=0.75, gpu_mix=((1, 0.1), (8, 0.9)),
    median_duration_s=15 * 60.0, mean_duration_s=30 * 60.0,
    restore_s=GENERIC_RESTORE_S,
)
"""Evaluation: most of the jobs, one node (a tenth on one GPU), minutes (median 15 min, mean
30 min); Acme's median GPU job ran about 2 minutes, failed jobs included. Figures are choices."""
DEFAULT_CLASSES = (PRETRAIN, FINETUNE, EVAL)


@dataclass(frozen=True)
class FleetConfig:
    """Parameters of the generated fleet workload; see the module docstring for the sources."""

    num_jobs: int = 2000
    """Jobs to generate."""
    load: float = 0.8
    """Offered load: requested GPU-seconds / (cluster GPUs x arrival span), as in the
    Philly-like generator."""
    seed: int = 0
    """Seed of the numpy Generator; the same config always gives the same jobs."""
    max_duration_s: float | None = ACME_LONGEST_RUN_S
    """Truncate every class's run times here (None: untruncated, whose pre-training tail
    reaches past a month); e.g. 24 h for short episodes, which cuts pre-training most."""
    classes: tuple[FleetJobClass, ...] = DEFAULT_CLASSES
    """The job kinds and their figures."""
    gpus_per_worker: int = GPUS_PER_SERVER
    """GPUs of each worker of a job of at least that many GPUs (its sizes must be multiples of
    it); a smaller job is one worker of its size."""
    min_worker_share: float = 0.25
    """Least share of its requested workers a job may shrink to (at least one): a model-parallel
    group must still hold the model. A choice."""
    max_worker_factor: float = 2.0
    """Most workers a job may grow to, as a multiple of its request (capped by the cluster's
    worker slots): growth stays within one doubling of the data-parallel degree. A choice."""
    hourly_factors: tuple[float, ...] = PHILLY_HOURLY_FACTORS
    """24 relative arrival rates, hour 0 first; the workload starts at hour 0."""
    scaling: GenericScaling = LLM_SCALING
    """Every job's speed curve (no job has a measured profile)."""

    def __post_init__(self) -> None:
        """Reject configurations that cannot be generated (one-line `UserError`s named as the
        fields of ``synthetic-fleet:NUM_JOBS:LOAD:MAX_HOURS`` where they are one)."""
        check_source_fields(FLEET, self.num_jobs, self.load, self.max_duration_s,
                            self.hourly_factors)
        if not self.classes:
            raise UserError(f"{FLEET} workload: needs at least one job class")
        if self.gpus_per_worker < 1:
            raise UserError(f"{FLEET} workload: gpus_per_worker must be >= 1")
        k = self.gpus_per_worker
        for job_class in self.classes:
            split = [g for g, _ in job_class.gpu_mix if g > k and g % k]
            if split:
                raise UserError(f"{FLEET} workload: job class {job_class.name!r} asks {split[0]} "
                                f"GPUs, not whole {k}-GPU workers")
        if not 0 < self.min_worker_share <= 1 or not self.max_worker_factor >= 1:
            raise UserError(f"{FLEET} workload: need 0 < min_worker_share <= 1 and "
                            "max_worker_factor >= 1")

    def worker_gpus(self, gpus: int) -> int:
        """GPUs per worker of a job of `gpus` GPUs."""
        return min(gpus, self.gpus_per_worker)


def generate_fleet(config: FleetConfig, cluster: ClusterSpec) -> Workload:
    """Draw `config.num_jobs` fleet jobs for `cluster`; reproducible from `config.seed`."""
    mixes = _fitting_mixes(config, cluster)
    rng = np.random.default_rng(config.seed)
    shares = np.array([c.share for c in config.classes])
    kind = rng.choice(len(config.classes), size=config.num_jobs, p=shares / shares.sum())
    gpus = np.zeros(config.num_jobs, dtype=np.int64)
    duration_s = np.zeros(config.num_jobs)
    for index, job_class in enumerate(config.classes):
        rows = np.flatnonzero(kind == index)
        sizes, weights = mixes[index]
        gpus[rows] = rng.choice(sizes, size=rows.size, p=weights)
        duration_s[rows] = _truncated_lognormal(rng, job_class, config.max_duration_s, rows.size)

    span_s = float((gpus * duration_s).sum()) / (cluster.total_gpus * config.load)
    submit_s = np.sort(arrival_times(rng, config.hourly_factors, span_s, config.num_jobs))
    work = generic_work(duration_s, gpus, cluster.max_gpus_per_node, config.scaling)
    slots = {k: worker_slots(cluster, k) for k in {config.worker_gpus(g) for g in gpus.tolist()}}
    jobs = tuple(
        _job(config, slots, f"{config.classes[c].name}-{i}", submit, requested, job_work,
             config.classes[c].restore_s)
        for i, (submit, c, requested, job_work) in enumerate(
            zip(submit_s.tolist(), kind.tolist(), gpus.tolist(), work.tolist(), strict=True))
    )
    name = f"{FLEET}-{config.num_jobs}-load{config.load:g}-seed{config.seed}"
    return Workload(name, jobs)


def worker_slots(cluster: ClusterSpec, gpus_per_worker: int) -> int:
    """Workers of `gpus_per_worker` GPUs one job can hold at once (no worker split across
    nodes, all on one GPU type: `ClusterSpec.job_gpus`)."""
    return cluster.job_gpus(gpus_per_worker) // gpus_per_worker


def _fitting_mixes(
    config: FleetConfig, cluster: ClusterSpec
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each class's (sizes, probabilities) that `cluster` can run, or a one-line `UserError`
    when its nodes are smaller than a worker or a class has no size that fits."""
    k = config.gpus_per_worker
    if cluster.max_gpus_per_node < k:
        raise UserError(f"{FLEET} workload: its jobs run {k}-GPU workers and the largest node "
                        f"of the cluster has {cluster.max_gpus_per_node} GPUs; simulate nodes "
                        f"of {k} GPUs, e.g. --cluster 128x{k}:H100")
    mixes = []
    for job_class in config.classes:
        fits = [(g, w) for g, w in job_class.gpu_mix
                if g // config.worker_gpus(g) <= worker_slots(cluster, config.worker_gpus(g))]
        if not fits:
            raise UserError(f"{FLEET} workload: no size of job class {job_class.name!r} fits "
                            f"the cluster's {cluster.total_gpus} GPUs; simulate a larger one")
        weights = np.array([w for _, w in fits], dtype=float)
        mixes.append((np.array([g for g, _ in fits], dtype=np.int64), weights / weights.sum()))
    return mixes


def _truncated_lognormal(
    rng: np.random.Generator, job_class: FleetJobClass, cap_s: float | None, count: int
) -> np.ndarray:
    """`count` run times of `job_class`'s log-normal conditioned on not exceeding `cap_s`
    (None: unconditioned), by the inverse CDF: a uniform draw below the cap's quantile."""
    mu = math.log(job_class.median_duration_s)
    sigma = lognormal_sigma(job_class.median_duration_s, job_class.mean_duration_s)
    top = 1.0 if cap_s is None else float(ndtr((math.log(cap_s) - mu) / sigma))
    quantiles = rng.uniform(0.0, top, size=count)
    return np.minimum(np.exp(mu + sigma * ndtri(quantiles)), cap_s or np.inf)


def _job(config: FleetConfig, slots: dict[int, int], job_id: str, submit_s: float,
         requested: int, work: float, restore_s: float) -> JobSpec:
    """One job of `requested` GPUs in whole workers, with the config's elastic range capped by
    `slots`, the cluster's workers by GPUs per worker."""
    k = config.worker_gpus(requested)
    workers = requested // k
    least = max(1, math.ceil(workers * config.min_worker_share))
    most = max(workers, min(math.floor(workers * config.max_worker_factor), slots[k]))
    return JobSpec(job_id=job_id, submit_s=submit_s, requested_gpus=requested, work=work,
                   min_workers=least, max_workers=most, restore_s=restore_s,
                   scaling=(config.scaling.alpha, config.scaling.beta), gpus_per_worker=k)
