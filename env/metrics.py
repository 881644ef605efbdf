"""Run accounting: the time integrals and per-job records behind every reported metric.

The simulator calls the hooks below as things happen; `summary()` turns them into the metrics
that `rlalloc simulate` and `rlalloc evaluate` report (keys in `METRIC_KEYS`). Definitions:

- JCT: finish - submit. Queueing delay: first start - submit.
- makespan_s: last finish - first submit; for a run stopped before every job finished (at
  the time limit), the time it stopped - first submit, the span the integrals cover.
- gpu_util: allocated GPU-seconds / (cluster GPUs x makespan); gpu_busy_util counts only GPUs
  that are training (not restoring).
- goodput: training GPU-seconds whose progress was kept / allocated GPU-seconds.
- lost_gpu_hours: GPU time thrown away by failures (work since the last checkpoint, and restore
  time in progress when the node failed).
- restarts_per_job: re-starts after the first start (resizes, moves, resumes, failures) per job.
- mean_recovery_s: time from a failure to the affected job training again.
- progress_preserved: 1 - training GPU-seconds lost to failures / training GPU-seconds run.
- ettr: effective training time ratio, sum of kept training time / sum of (finish - first start).
- energy_kwh: sum over GPUs of their own type's busy or idle power (see
  `rlalloc.env.params.GPU_POWER_W`) from time 0 of the trace to the end of the run; down nodes draw
  nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from rlalloc.env.job_columns import JobColumns
from rlalloc.env.params import DEFAULT_GPU_POWER_W, GPU_POWER_W, SimParams

METRIC_KEYS = (
    "jobs_completed", "avg_jct_s", "p50_jct_s", "p95_jct_s", "p99_jct_s", "avg_queue_s",
    "makespan_s", "gpu_util", "gpu_busy_util", "goodput", "lost_gpu_hours", "restarts_per_job",
    "mean_recovery_s", "progress_preserved", "ettr", "energy_kwh", "failures",
    "invalid_actions",
)
"""Every metric of one run, in report order."""


class RunCounts(Protocol):
    """The two live counts `RunAccounting` reads of the run it accounts for."""

    @property
    def jobs_in_system(self) -> int:
        """Jobs submitted and not finished."""
        ...

    @property
    def invalid_actions(self) -> int:
        """Actions refused so far."""
        ...


class RunAccounting:
    """Integrates cluster-wide quantities over time and keeps per-job milestones."""

    def __init__(self, jobs: JobColumns, gpus_total: np.ndarray, gpu_types: Sequence[str],
                 params: SimParams, counts: RunCounts) -> None:
        """`jobs`: the simulator's job table (read, never written); `gpus_total` and
        `gpu_types`: per node; `counts`: the simulator's live counts."""
        self._jobs = jobs
        self._counts = counts
        self._params = params
        total = int(gpus_total.sum())
        self.total_gpus = total
        # per node, what training adds to one GPU's idle draw, and the whole node's idle draw:
        # GPUs are charged at their own node's type, not at a cluster average (which would
        # charge a mixed cluster's busy A100s like its T4s)
        watts = [GPU_POWER_W.get(t, DEFAULT_GPU_POWER_W) for t in gpu_types]
        self._gpu_extra_w = [busy - idle for idle, busy in watts]
        self._node_gpus = gpus_total.tolist()
        self._node_idle_w = [idle * gpus for (idle, _), gpus in
                             zip(watts, self._node_gpus, strict=True)]
        # current levels
        self.alloc_gpus = 0
        self.busy_gpus = 0
        self.up_gpus = total
        self.queued_gpus = 0
        self.queued_jobs = 0
        self.up_idle_w = float(sum(self._node_idle_w))
        """Idle draw of the GPUs of the nodes that are up."""
        self.busy_extra_w = 0.0
        """What the training GPUs draw beyond their idle power."""
        # integrals
        self._t = 0.0
        self.alloc_gpu_s = 0.0
        self.busy_gpu_s = 0.0
        self.jobs_in_system_s = 0.0
        self.lost_gpu_s = 0.0
        self.lost_train_gpu_s = 0.0
        self.energy_j = 0.0
        # per job (grown by `add_jobs`)
        for name, column in _job_columns(0).items():
            setattr(self, name, column)
        self._recoveries: list[float] = []
        self.failures = 0
        self.jobs_completed = 0
        self.first_submit = 0.0
        # time series for plots and the demand forecaster
        self._next_sample = 0.0
        self.series: dict[str, list[float]] = {"t": [], "alloc_gpus": [], "busy_gpus": [],
                                               "queued_jobs": [], "jobs_in_system": []}
        self._demand: list[float] = []
        self._next_demand = 0.0

    def add_jobs(self, n: int) -> None:
        """Room for the milestones of `n` more jobs, the simulator's newest rows."""
        if len(self._finish) == 0 and n:
            self.first_submit = float(self._jobs.submit_s[0])
        for name, column in _job_columns(n).items():
            setattr(self, name, np.concatenate([getattr(self, name), column]))

    # --- integration ---------------------------------------------------------------------
    def start_at(self, t: float) -> None:
        """Begin the integrals and time series at `t` rather than 0 (a simulator started where
        a live cluster stands, `Simulator.start_as_found`): nothing before it is recorded."""
        assert self._t == 0.0, "start_at must come before any time passes"
        self._t = self._next_sample = self._next_demand = t

    def advance(self, t: float) -> None:
        """Integrate the current levels from the last call up to time t."""
        dt = t - self._t
        if dt < 0:
            raise AssertionError(f"time went backwards: {self._t} -> {t}")
        if dt == 0:
            return
        while self._next_sample <= t:
            self._sample(self._next_sample)
            self._next_sample += self._params.series_interval_s
        while self._next_demand <= t:
            self._demand.append((self.alloc_gpus + self.queued_gpus) / max(self.total_gpus, 1))
            self._next_demand += 60.0
        self.alloc_gpu_s += self.alloc_gpus * dt
        self.busy_gpu_s += self.busy_gpus * dt
        self.energy_j += (self.up_idle_w + self.busy_extra_w) * dt
        self.jobs_in_system_s += self._counts.jobs_in_system * dt
        self._t = t

    def _sample(self, t: float) -> None:
        series = self.series
        series["t"].append(t)
        series["alloc_gpus"].append(self.alloc_gpus)
        series["busy_gpus"].append(self.busy_gpus)
        series["queued_jobs"].append(float(self.queued_jobs))
        series["jobs_in_system"].append(float(self._counts.jobs_in_system))

    @property
    def demand_minutes(self) -> int:
        """Per-minute demand samples recorded so far."""
        return len(self._demand)

    def demand_history(self, minutes: int, upto: int | None = None) -> np.ndarray:
        """The last `minutes` per-minute demand samples before sample `upto` (default: all so
        far; fewer early in a run): (allocated + pending GPUs) / cluster GPUs, as the forecaster
        defines demand."""
        end = len(self._demand) if upto is None else upto
        return np.asarray(self._demand[max(0, end - minutes):end])

    # --- hooks -----------------------------------------------------------------------------
    def change(self, alloc: int = 0, queued_gpus: int = 0, queued_jobs: int = 0) -> None:
        """Levels change now (the caller has advanced the clock already)."""
        self.queued_jobs += queued_jobs
        self.alloc_gpus += alloc
        self.queued_gpus += queued_gpus
        self._check_levels()

    def gpus_busy(self, placement: tuple[int, ...], gpus_per_worker: int, busy: bool) -> None:
        """The GPUs of `placement` (a node index per worker of `gpus_per_worker` GPUs) start
        (`busy`) or stop training now."""
        sign = gpus_per_worker if busy else -gpus_per_worker
        self.busy_gpus += sign * len(placement)
        self.busy_extra_w += sign * sum(map(self._gpu_extra_w.__getitem__, placement))
        self._check_levels()

    def node_up(self, node: int, up: bool) -> None:
        """The GPUs of `node` come back from repair (`up`) or go down (and draw nothing) now."""
        sign = 1 if up else -1
        self.up_gpus += sign * self._node_gpus[node]
        self.up_idle_w += sign * self._node_idle_w[node]
        self._check_levels()

    def _check_levels(self) -> None:
        assert 0 <= self.busy_gpus <= self.alloc_gpus <= self.up_gpus <= self.total_gpus, (
            self.busy_gpus, self.alloc_gpus, self.up_gpus, self.total_gpus)

    def job_started(self, row: int, t: float) -> None:
        """First allocation of the job."""
        self._first_start[row] = t

    def training_started(self, row: int, t: float) -> None:
        """The job's restore finished; it trains from now on."""
        self._train_from[row] = t
        if not np.isnan(self._failed_at[row]):
            self._recoveries.append(t - self._failed_at[row])
            self._failed_at[row] = np.nan

    def training_stopped(self, row: int, t: float) -> None:
        """The job stops training (resize, move, suspension, failure or completion)."""
        if not np.isnan(self._train_from[row]):
            self._train_s[row] += t - self._train_from[row]
            self._train_from[row] = np.nan

    def job_failed(self, row: int, t: float, lost_gpu_s: float, lost_train_s: float,
                   gpus: int) -> None:
        """A node failure hit the job, which held `gpus` GPUs: record what it lost."""
        self.failures += 1
        self.lost_gpu_s += lost_gpu_s
        self.lost_train_gpu_s += lost_train_s * gpus
        self._lost_train_s[row] += lost_train_s
        if np.isnan(self._failed_at[row]):
            self._failed_at[row] = t

    def job_finished(self, row: int, t: float) -> None:
        """The job completed its work."""
        self._finish[row] = t
        self.jobs_completed += 1

    # --- results ---------------------------------------------------------------------------
    def energy_kwh(self) -> float:
        """GPU energy so far: busy GPUs at their type's busy power, other up GPUs at idle power."""
        return self.energy_j / 3.6e6

    def finished_jcts_s(self) -> np.ndarray:
        """JCT of every job finished so far, in job order (what the JCT metrics and a CDF
        plot are taken over)."""
        done = ~np.isnan(self._finish)
        return self._finish[done] - self._jobs.submit_s[done]

    def summary(self) -> dict[str, float]:
        """All metrics of `METRIC_KEYS` for the run so far.

        JCTs, queueing and restarts are over the finished jobs and, in a run stopped before
        every job finished (the time limit, a give-up), the jobs still in the system, each at
        its time there so far: a lower bound of what it would have been. Over the finished jobs
        alone a policy that stalls looked fastest of all (none finished: 0 s)."""
        done = ~np.isnan(self._finish)
        counted = done | (self._jobs.submit_s <= self._t)
        submit = self._jobs.submit_s[counted]
        jct = np.where(done, self._finish, self._t)[counted] - submit
        queue = np.where(np.isnan(self._first_start), self._t, self._first_start)[counted] - submit
        # a run stopped before every job finished (at the time limit) spans up to now, as the
        # integrals do: its last finish made a stuck run's utilisation 15x the cluster
        end = float(np.nanmax(self._finish)) if done.size and done.all() else self._t
        makespan = max(end - self.first_submit, 0.0)
        capacity = self.total_gpus * makespan
        kept_train_gpu_s = self.busy_gpu_s - self.lost_train_gpu_s
        wall = float(np.sum(self._finish[done] - self._first_start[done]))
        kept_train_s = float(np.sum(self._train_s[done] - self._lost_train_s[done]))

        def pct(q: float) -> float:
            return float(np.percentile(jct, q)) if len(jct) else 0.0

        return {
            "jobs_completed": int(done.sum()),
            "avg_jct_s": float(jct.mean()) if len(jct) else 0.0,
            "p50_jct_s": pct(50),
            "p95_jct_s": pct(95),
            "p99_jct_s": pct(99),
            "avg_queue_s": float(queue.mean()) if len(queue) else 0.0,
            "makespan_s": makespan,
            "gpu_util": self.alloc_gpu_s / capacity if capacity else 0.0,
            "gpu_busy_util": self.busy_gpu_s / capacity if capacity else 0.0,
            "goodput": kept_train_gpu_s / self.alloc_gpu_s if self.alloc_gpu_s else 0.0,
            "lost_gpu_hours": self.lost_gpu_s / 3600.0,
            "restarts_per_job": (float(self._jobs.restarts[counted].mean()) if counted.any()
                                 else 0.0),
            "mean_recovery_s": float(np.mean(self._recoveries)) if self._recoveries else 0.0,
            "progress_preserved": (1.0 - self.lost_train_gpu_s / self.busy_gpu_s
                                   if self.busy_gpu_s else 1.0),
            "ettr": kept_train_s / wall if wall else 0.0,
            "energy_kwh": self.energy_kwh(),
            "failures": self.failures,
            "invalid_actions": self._counts.invalid_actions,
        }


def _job_columns(n: int) -> dict[str, np.ndarray]:
    """`RunAccounting`'s per-job milestones for `n` jobs that have not started."""
    return {"_first_start": np.full(n, np.nan), "_finish": np.full(n, np.nan),
            "_train_from": np.full(n, np.nan), "_train_s": np.zeros(n),
            "_lost_train_s": np.zeros(n), "_failed_at": np.full(n, np.nan)}
