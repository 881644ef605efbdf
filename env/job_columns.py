"""The simulator's per-job state as a table: one numpy column per quantity, one row per job.

The simulator owns and updates it; its accounting (`rlalloc.env.metrics.RunAccounting`) reads
it. Rows are in the order jobs were added; a fork's new jobs are appended (`extend`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Protocol

import numpy as np

from rlalloc.env.workload.spec import JobSpec

NOT_SUBMITTED = -1
"""`status` of a job whose arrival has not happened yet (beyond `JobStatus`'s codes)."""


class SpeedCurve(Protocol):
    """The curve of a job's speed model the table keeps (`rlalloc.env.simulator.JobSpeed`)."""

    @property
    def speed_1gpu(self) -> float: ...
    @property
    def scaling_alpha(self) -> float: ...
    @property
    def scaling_beta(self) -> float: ...
    def on_type(self, gpu_type: str) -> SpeedCurve: ...


@dataclass(eq=False)
class JobColumns:
    """Each job's request, speed model and current allocation, as the simulator keeps them."""

    submit_s: np.ndarray
    requested_gpus: np.ndarray
    min_workers: np.ndarray
    max_workers: np.ndarray
    work: np.ndarray
    """Iterations to finish."""
    restore_s: np.ndarray
    speed_1gpu: np.ndarray
    scaling_alpha: np.ndarray
    scaling_beta: np.ndarray
    status: np.ndarray
    """A `JobStatus` code, `NOT_SUBMITTED`, or the simulator's finished code."""
    workers: np.ndarray
    rate: np.ndarray
    """Iterations per second while training."""
    done: np.ndarray
    """Iterations done at the anchor (checkpointed)."""
    anchor_s: np.ndarray
    """When the current allocation began."""
    busy_from_s: np.ndarray
    """When the restore ends and training starts."""
    attained_gpu_s: np.ndarray
    """GPU-seconds up to the anchor."""
    run_s: np.ndarray
    """Allocated seconds up to the anchor."""
    restarts: np.ndarray
    """Re-starts after the first start (resizes and failures)."""
    gpus_per_worker: np.ndarray
    type_curves: np.ndarray
    """float32 (jobs, types, 3): (speed on one GPU, alpha, beta) on each GPU type of a mixed
    cluster (`rlalloc.env.state.TypeSpeeds`); no types on a one-type cluster."""
    version: np.ndarray
    """Bumped at every allocation change: events of an older allocation are stale."""
    started_once: np.ndarray

    @classmethod
    def of(cls, jobs: Sequence[JobSpec], speeds: Sequence[SpeedCurve],
           gpu_types: Sequence[str] = ()) -> JobColumns:
        """The rows of `jobs`, as they stand before arrival; `gpu_types` are a mixed cluster's
        (each speed's `on_type` gives its curve there), () on a one-type cluster."""
        n = len(jobs)
        curves = [[(c.speed_1gpu, c.scaling_alpha, c.scaling_beta)
                   for c in (s.on_type(t) for t in gpu_types)] for s in speeds]
        return cls(
            submit_s=np.array([j.submit_s for j in jobs], dtype=np.float64),
            requested_gpus=np.array([j.requested_gpus for j in jobs], dtype=np.int32),
            min_workers=np.array([j.min_workers for j in jobs], dtype=np.int32),
            max_workers=np.array([j.max_workers for j in jobs], dtype=np.int32),
            work=np.array([j.work for j in jobs], dtype=np.float64),
            restore_s=np.array([j.restore_s for j in jobs], dtype=np.float32),
            speed_1gpu=np.array([s.speed_1gpu for s in speeds], dtype=np.float32),
            scaling_alpha=np.array([s.scaling_alpha for s in speeds], dtype=np.float32),
            scaling_beta=np.array([s.scaling_beta for s in speeds], dtype=np.float32),
            status=np.full(n, NOT_SUBMITTED, dtype=np.int8),
            workers=np.zeros(n, dtype=np.int32),
            rate=np.zeros(n, dtype=np.float64),
            done=np.zeros(n, dtype=np.float64),
            anchor_s=np.zeros(n, dtype=np.float64),
            busy_from_s=np.zeros(n, dtype=np.float64),
            attained_gpu_s=np.zeros(n, dtype=np.float64),
            run_s=np.zeros(n, dtype=np.float64),
            restarts=np.zeros(n, dtype=np.int32),
            gpus_per_worker=np.array([j.gpus_per_worker for j in jobs], dtype=np.int32),
            type_curves=np.array(curves, dtype=np.float32).reshape(n, len(gpu_types), 3),
            version=np.zeros(n, dtype=np.int64),
            started_once=np.zeros(n, dtype=bool),
        )

    def extend(self, more: JobColumns) -> None:
        """Append the rows of `more`, in place (whoever reads this table sees them)."""
        for column in fields(self):
            setattr(self, column.name, np.concatenate([getattr(self, column.name),
                                                       getattr(more, column.name)]))
