"""The job description every workload source produces and the simulator consumes.

Work is measured in *iterations of the job's own throughput model*: a job with a measured
profile (Pollux application) counts optimizer steps at its global batch size; a job without one
uses the generic scaling model, whose single-GPU speed is 1 iteration per second, so its work is
the trace's run time converted to single-GPU seconds. Either way the simulator finishes a job
exactly when ``work`` iterations are done at the rate its placement gives.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One training job as submitted."""

    job_id: str
    submit_s: float
    """Submission time, seconds from the start of the workload."""
    requested_gpus: int
    """GPUs the user asked for (what the `static` policy gives)."""
    work: float
    """Iterations to completion (see module docstring for the unit)."""
    min_workers: int
    max_workers: int
    """Elastic range: the job may run with any worker count in [min_workers, max_workers]."""
    restore_s: float
    """Checkpoint-restore time paid on every (re)start, resize or move."""
    application: str | None = None
    """Name of the measured profile (bert, cifar10, ...) or None for the generic scaling model."""
    batch_size: int | None = None
    """Global batch size, kept fixed across resizes (profiled jobs only)."""
    scaling: tuple[float, float] | None = None
    """(alpha, beta) of the generic curve for a job without a profile; None: the curve fitted
    to the Pollux profiles (`rlalloc.env.profiles.GENERIC_SCALING`). A generator whose jobs
    scale otherwise (LLM training on NVLink and a 400 Gb/s fabric) says so here."""
    gpus_per_worker: int = 1
    """GPUs each worker holds, all on one node (a pod requesting `nvidia.com/gpu: k`, torchrun
    `--nproc-per-node k`). `min_workers`, `max_workers` and every action count workers;
    `requested_gpus` counts GPUs, a multiple of it."""
    fixed_batch: bool = False
    """The job keeps `batch_size` even where profiled jobs tune theirs (``--efficiency
    adaptive``): Sia's ``scale-gpus`` and ``rigid`` jobs (`rlalloc.env.workload.pollux`)."""


@dataclass(frozen=True, slots=True)
class Workload:
    """A named, submit-time-ordered list of jobs."""

    name: str
    jobs: tuple[JobSpec, ...]

    def __post_init__(self) -> None:
        submit = [j.submit_s for j in self.jobs]
        assert submit == sorted(submit), "Workload jobs must be ordered by submit time"
        assert all(j.gpus_per_worker >= 1 and j.requested_gpus % j.gpus_per_worker == 0
                   for j in self.jobs), "requested_gpus must be whole workers"
