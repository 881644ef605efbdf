"""Event-driven simulator of a GPU cluster running elastic training jobs.

Time jumps from event to event (arrivals, restore completions, job completions, node warnings,
failures and repairs) and to periodic decision ticks. Between events nothing changes but the
jobs' progress, which is linear in time, so it is computed in closed form when needed instead of
being stepped. A decision point hands the policy a `ClusterState` snapshot; the policy answers
with an `Action`, which `apply` validates and carries out.

Job state lives in numpy columns indexed by job number (one row per job of the workload) so a
snapshot is a handful of fancy-indexed copies, not a loop over Python objects; this is what makes
replaying the 82k-job Philly trace take seconds.

Work accounting (the invariants the tests check):
- a job's progress grows at exactly its throughput model's rate for its placement, from the end
  of its restore until its next change; it completes when progress reaches its work;
- with a statistical-efficiency model (`JobSpeed.epochs`, `rlalloc.env.efficiency`) the rate also
  changes at each epoch end: a silent event (its own heap, never a decision point) that
  re-bases the job's progress and refreshes the curve policies see;
- a failure rolls progress back to the last periodic checkpoint (lost = work since then);
- a resize, move or suspension checkpoints first and loses nothing, but pays the restore time.
"""

from __future__ import annotations

import bisect
import copy
import heapq
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from rlalloc.env.cluster import ClusterSpec
from rlalloc.env.failures import (
    NODE_FEATURE_NAMES,
    HealthEvent,
    NodeHealthTimeline,
    WarningEpisode,
    node_features,
)
from rlalloc.env.job_columns import JobColumns
from rlalloc.env.metrics import RunAccounting
from rlalloc.env.params import SimParams
from rlalloc.env.placement import placement_shape
from rlalloc.env.signals import NO_SIGNALS, Signals
from rlalloc.env.snapshot import SnapshotDemand, SnapshotJobs, SnapshotNodes
from rlalloc.env.state import (
    Action,
    ActionKind,
    ClusterState,
    Demand,
    JobStatus,
    Nodes,
    TypeSpeeds,
)
from rlalloc.env.workload.spec import JobSpec, Workload

ThroughputFn = Callable[[tuple[int, ...]], float]
"""Iterations per second of one job for a placement shape (GPUs per node, largest first)."""

_ARRIVAL, _RESTORED, _COMPLETE, _HEALTH, _EPOCH_END = 0, 1, 2, 3, 4
_QUEUED, _RUNNING, _RESTARTING = (int(JobStatus.QUEUED), int(JobStatus.RUNNING),
                                  int(JobStatus.RESTARTING))
_NOOP, _SCALE = ActionKind.NOOP, ActionKind.SCALE
_FINISHED = 3  # job status code beyond JobStatus (and NOT_SUBMITTED)
_LINGER_S = 3600.0
"""An ended warning episode stays visible in windowed counts for an hour (the longest window),
and `Signals.risk_lag_s` more in the risk model's earlier reading (`_node_health`)."""


class EpochRates(Protocol):
    """A job whose training rate also changes with its epoch (`rlalloc.env.efficiency`)."""

    @property
    def epoch_ends(self) -> np.ndarray:
        """Progress at the end of each epoch, ascending; the last is the job's work."""
        ...

    def epoch_at(self, progress: float) -> int:
        """The epoch a job at `progress` is in."""
        ...

    def progress_per_s(self, shape: tuple[int, ...], epoch: int) -> float:
        """Progress per second on `shape` during `epoch`."""
        ...

    def curve(self, epoch: int) -> tuple[float, float, float]:
        """What policies see during `epoch`: (speed on one GPU, scaling alpha, beta)."""
        ...


@dataclass(frozen=True, slots=True)
class FoundJob:
    """A job as a live cluster has it, for `Simulator.start_as_found`."""

    done: float
    """Iterations trained (in the job's `JobSpec.work` unit)."""
    nodes: tuple[str, ...] = ()
    """The node of each worker; () while queued."""
    restore_left_s: float = 0.0
    """Restore still to pay before it trains (0 for a job already training)."""
    started: bool = False
    """Whether it has run before (placed now, suspended or requeued): a start then pays the
    restore, as a restart does."""
    attained_gpu_s: float = 0.0
    """GPU-seconds it has held."""
    run_s: float = 0.0
    """Seconds it has held GPUs."""
    restarts: int = 0
    """Restarts so far."""


@dataclass(frozen=True, slots=True)
class JobSpeed:
    """How fast one job runs: the exact model the simulator uses, and the curve policies see."""

    iterations_per_s: ThroughputFn
    """Progress per second by placement; with `epochs`, the first epoch's (not simulated)."""
    speed_1gpu: float
    scaling_alpha: float
    scaling_beta: float
    epochs: EpochRates | None = None
    """When set, the simulator takes the rate from here, and the curve policies see, changing
    both at every epoch end."""
    by_type: Mapping[str, JobSpeed] | None = None
    """On a cluster that mixes GPU types: the job's speed on each of them (a job runs on one
    type at a time). This object's own model and curve are then those on the cluster's
    reference type (`rlalloc.env.gpu_types.reference_type`). None on a one-type cluster."""

    def on_type(self, gpu_type: str) -> JobSpeed:
        """The speed on `gpu_type`: from `by_type` on a mixed cluster, else this one."""
        return self if self.by_type is None else self.by_type[gpu_type]


@dataclass(frozen=True)
class GiveUp:
    """When a run is hopeless enough to stop it (`Simulator.run`): once its average JCT is
    sure to exceed `avg_jct_s`, a job has been in the system longer than `job_s`, or it has
    taken `decisions` decision points (a policy that restarts jobs at every one moves the
    clock by little more than their restores, so the bounds in time come only after very
    many decisions)."""

    avg_jct_s: float = math.inf
    job_s: float = math.inf
    decisions: float = math.inf


class Simulator:
    """Replays a workload on a cluster; see the module docstring for the model."""

    def __init__(self, cluster: ClusterSpec, workload: Workload, speeds: Sequence[JobSpeed],
                 params: SimParams | None = None, seed: int = 0,
                 signals: Signals = NO_SIGNALS) -> None:
        assert len(speeds) == len(workload.jobs), (len(speeds), len(workload.jobs))
        self.params = params or SimParams()
        self.cluster = cluster
        self.workload = workload
        self._signals = signals
        self._forecast_cache: tuple[int, tuple[float, float, float]] = (-1, (0.0, 0.0, 0.0))
        rng = np.random.default_rng(seed)
        self.time_s = 0.0

        # --- nodes -------------------------------------------------------------------------
        n_nodes = len(cluster.nodes)
        self.node_names = tuple(n.name for n in cluster.nodes)
        self.node_index = {name: i for i, name in enumerate(self.node_names)}
        self._gpus_total = np.array([n.gpus for n in cluster.nodes], dtype=np.int32)
        self._gpus_free = self._gpus_total.copy()
        self._gpu_types = tuple(n.gpu_type for n in cluster.nodes)
        self._type_names = tuple(dict.fromkeys(self._gpu_types))
        """The cluster's GPU types in the order their first node appears; more than one makes
        the cluster mixed (per-type speeds, one type per job)."""
        self._racks = np.array([n.rack for n in cluster.nodes], dtype=np.int32)
        self._snapshot_totals = self._gpus_total.copy()
        self._zero_telemetry = np.zeros((n_nodes, len(NODE_FEATURE_NAMES)), dtype=np.float32)
        self._zero_counts = np.zeros((n_nodes, 4), dtype=np.int32)
        self._healthy_risk: float | None = None
        self._snapshot_racks = self._racks.copy()
        self._down = np.zeros(n_nodes, dtype=bool)
        self._repair_s = np.full(n_nodes, np.inf)
        """When each down node's failure is repaired (inf: up, or down with no repair due)."""
        self._cordoned = np.zeros(n_nodes, dtype=bool)
        self._episodes: dict[int, WarningEpisode] = {}
        self._node_jobs: list[set[int]] = [set() for _ in range(n_nodes)]
        self._health = NodeHealthTimeline(self.params.failures, self._gpus_total, rng)
        self._health_pulled_until = 0.0
        self._health_events: dict[int, HealthEvent] = {}
        self.health_listener: Callable[[HealthEvent, float], None] | None = None
        """Told of each node health change as it takes effect (a warning starts, a node fails
        or comes back from repair), with its simulated time: for a live view such as the
        digital twin's, which would otherwise have to guess them from snapshots."""

        # --- jobs: one row each, in numpy columns (`JobColumns`); filled by `_add_jobs` -----
        self.job_ids: tuple[str, ...] = ()
        self._job_row: dict[str, int] = {}
        self._speeds: tuple[JobSpeed, ...] = ()
        self._placement: list[tuple[int, ...]] = []  # node indices per worker, sorted
        self._submit_list: list[float] = []  # submit times, sorted, for arrival counts
        self.columns = JobColumns.of((), (), self._mixed_types)
        """Each job's request, speed model and allocation, one row per job (read-only outside
        the simulator: its accounting reads it)."""
        self._active: dict[int, None] = {}  # jobs in the system, in arrival order
        # snapshot caches, dropped when membership (None rows) or allocations change
        self._snapshot_rows: np.ndarray | None = None
        self._snapshot_static: dict[str, object] = {}
        self._snapshot_alloc: dict[str, object] | None = None
        self._snapshot_nodes: Nodes | None = None
        self._snapshot_health: _NodeHealth | None = None

        self.accounting = RunAccounting(self.columns, self._gpus_total, self._gpu_types,
                                        self.params, counts=self)
        self._events: list[tuple[float, int, int, int, int]] = []
        # Epoch ends change a job's rate but are not decision points: kept apart from `_events`
        # so that `advance` never stops at one.
        self._epoch_ends: list[tuple[float, int, int, int, int]] = []
        self._seq = 0
        self._arrivals_pending = 0
        self._add_jobs(workload.jobs, speeds)
        self._demand_history: list[float] = []
        self.invalid_actions = 0
        self.actions_taken = 0
        self.events_processed = 0
        self.decisions = 0

    # ------------------------------------------------------------------ public API
    @property
    def done(self) -> bool:
        """True when every job of the workload (of a fork: that it knows of) has finished.

        Counted as 'no job in the system and none to arrive' rather than as completions, so
        that a fork told only a horizon of arrivals ends (`run`, `advance`) when its known jobs
        have finished instead of waiting for arrivals it dropped.
        """
        return not self._active and not self._arrivals_pending

    @property
    def jobs_in_system(self) -> int:
        """Jobs submitted and not finished (the quantity whose time integral is the total JCT)."""
        return len(self._active)

    @property
    def has_pending_arrivals(self) -> bool:
        """True while some job of the workload (of a fork: that it knows of) is yet to arrive."""
        return self._arrivals_pending > 0

    def advance(self) -> float:
        """Move the clock to the next decision point and process the events on the way.

        The next decision point is the next event or the next periodic tick, whichever comes
        first; when no job is in the system the clock jumps straight to the next arrival.
        Returns the simulated seconds elapsed.
        """
        start = self.time_s
        if self.done:
            return 0.0
        tick = self.time_s + self.params.decision_interval_s
        self._pull_health_events(tick)
        next_event = self._events[0][0] if self._events else math.inf
        if self._active:
            target = min(next_event, tick)
        else:  # idle cluster: jump to the next event, health events on the way included
            assert next_event < math.inf, "no events left but jobs are unfinished"
            self._pull_health_events(next_event)
            target = self._events[0][0]
        self._process_until(target)
        return self.time_s - start

    def run(self, policy: Callable[[ClusterState], Action],
            on_progress: Callable[[int], None] | None = None,
            limit_s: float | None = None, give_up: GiveUp = GiveUp()) -> bool:
        """Run to the end: at each decision point ask `policy` until it says no-op.

        A policy that never finishes some job would keep the clock ticking for ever, so the
        run also stops once the clock passes `limit_s` (default `time_limit_s`); and, for a
        caller that only needs to know a run is hopeless, once the jobs' time in the system
        so far per job of the workload (a lower bound of the average JCT the run would end
        with) exceeds `give_up.avg_jct_s`, one job has been in the system longer than
        `give_up.job_s`, or it has taken `give_up.decisions` decision points. Returns whether
        every job finished.
        """
        limit = time_limit_s(self) if limit_s is None else limit_s
        # every job, a fork's added ones too (inf x 0 jobs would be NaN, which stops at once)
        give_up_s = (math.inf if math.isinf(give_up.avg_jct_s)
                     else give_up.avg_jct_s * len(self.job_ids))
        completed = 0
        while (not self.done and self.time_s <= limit
               and self.accounting.jobs_in_system_s <= give_up_s
               and self.longest_in_system_s() <= give_up.job_s
               and self.decisions < give_up.decisions):
            self.decisions += 1
            for _ in range(self.params.max_actions_per_decision):
                action = policy(self.state())
                if action.kind == _NOOP or not self.apply(action):
                    break
            self.advance()
            if on_progress is not None and self.accounting.jobs_completed != completed:
                on_progress(self.accounting.jobs_completed - completed)
                completed = self.accounting.jobs_completed
        return self.done

    def longest_in_system_s(self) -> float:
        """How long the job longest in the system has been there (0 when none is): the
        oldest arrival still active, as `_active` keeps arrival order."""
        oldest = next(iter(self._active), None)
        return 0.0 if oldest is None else self.time_s - float(self.columns.submit_s[oldest])

    def apply(self, action: Action) -> bool:
        """Carry out `action` now; an invalid one changes nothing, is counted, returns False."""
        if action.kind == _NOOP:
            return True
        reason = self._validate(action)
        if reason:
            self.invalid_actions += 1
            return False
        row = self._job_row[action.job_id]
        nodes = tuple(sorted(self.node_index[n] for n in action.nodes))
        self.actions_taken += 1
        self._reallocate(row, nodes)
        return True

    def schedule_failure(self, node_name: str, time_s: float,
                         warning_lead_s: float = 0.0) -> None:
        """Make `node_name` fail at `time_s` (after a warning episode of `warning_lead_s`).

        For tests, demos and the digital twin: the failure follows the same path as one drawn
        by the failure process (lost work, restart, repair after `repair_s`). A warning that
        would have begun before now begins now, as the failure process shortens a warning
        cut by the start of its time chunk: the simulator's clock never goes back.
        """
        assert time_s >= self.time_s and warning_lead_s >= 0, (time_s, self.time_s,
                                                                warning_lead_s)
        node = self.node_index[node_name]
        events = []
        if warning_lead_s > 0:
            start_s = max(time_s - warning_lead_s, self.time_s)
            episode = WarningEpisode(node, start_s, time_s, time_s)
            episode.xid_s.extend(np.linspace(episode.start_s, time_s, 8, endpoint=False))
            events.append(HealthEvent(episode.start_s, "warn", node, episode))
        events.append(HealthEvent(time_s, "fail", node))
        events.append(HealthEvent(time_s + self.params.failures.repair_s, "repair", node))
        for event in events:
            self._push_health(event)

    def start_as_found(self, time_s: float, found: Sequence[FoundJob],
                       down: Sequence[str] = (), cordoned: Sequence[str] = ()) -> None:
        """Put this fresh simulator where a live cluster stands at `time_s`: every job of the
        workload (all submitted by then) is as `found` says, in workload order; the `down`
        nodes are down and the `cordoned` ones cordoned.

        A simulator rebuilt from a `ClusterState` (`rlalloc.env.rebuild`) starts this way, so that a
        controller can fork it for lookahead. Nothing before `time_s` is simulated or
        accounted: the jobs arrive at `time_s`, and the time series start there. It needs a
        simulator without failures, whose health process would start at time 0.
        """
        assert self.time_s == 0.0 and not self._active, "start_as_found needs a fresh simulator"
        assert self.params.failures.failures_per_gpu_day == 0, "start_as_found draws no failures"
        assert len(found) == len(self.job_ids), (len(found), len(self.job_ids))
        assert all(t <= time_s for t in self._submit_list), "every job must be submitted"
        self._events, self._arrivals_pending = [], 0
        self.accounting.start_at(time_s)
        self.time_s = time_s
        self._health_pulled_until = time_s
        for name in down:
            node = self.node_index[name]
            self._down[node], self._gpus_free[node] = True, 0
        for name in cordoned:
            self._cordoned[self.node_index[name]] = True
        for row, job in enumerate(found):
            self._arrive(row)
            self.columns.done[row] = job.done
            self.columns.attained_gpu_s[row] = job.attained_gpu_s
            self.columns.run_s[row] = job.run_s
            self.columns.restarts[row] = job.restarts
            self.columns.started_once[row] = job.started
            if job.nodes:
                self._allocate(row, tuple(sorted(self.node_index[n] for n in job.nodes)),
                               time_s, job.restore_left_s)
        self._health_changed()

    def _arrive(self, row: int) -> None:
        """The job joins the queue."""
        self.columns.status[row] = _QUEUED
        self._active[row] = None
        self._snapshot_rows = None
        self.accounting.change(queued_gpus=int(self.columns.requested_gpus[row]), queued_jobs=1)

    def fork(self, arrivals_known_s: float = math.inf, extra_jobs: Sequence[JobSpec] = (),
             extra_speeds: Sequence[JobSpeed] = ()) -> Simulator:
        """An independent copy of this simulator at this instant, for lookahead.

        The inputs that never change (cluster, workload, speed models, signals, parameters) are
        shared; everything else, the failure process's random state included, is copied, so a
        fork run under the same policy repeats this run exactly (common random numbers). The
        fork knows the arrivals of the next `arrivals_known_s` seconds only (0: just the jobs
        submitted so far, as a live controller sees them); without the rest it is done when
        the jobs it knows of have finished (`jobs_in_system` 0, no `has_pending_arrivals`).
        `extra_jobs` (with their `extra_speeds`; none submitted before now, ids new) arrive in
        the fork as well: a sampled future in place of the unknown one.
        """
        shared = (self.cluster, self.workload, self._speeds, self._signals, self.params)
        memo: dict[int, object] = {id(item): item for item in shared}
        memo[id(self.health_listener)] = None  # a fork's health changes are hypothetical
        fork = copy.deepcopy(self, memo)
        horizon = self.time_s + arrivals_known_s
        if self._submit_list and horizon < self._submit_list[-1]:
            fork._events = [event for event in fork._events
                            if event[1] != _ARRIVAL or event[0] <= horizon]
            heapq.heapify(fork._events)
            fork._arrivals_pending = sum(event[1] == _ARRIVAL for event in fork._events)
            fork._submit_list = [t for t in self._submit_list if t <= horizon]
        if extra_jobs:
            fork._add_jobs(extra_jobs, extra_speeds)
        return fork

    def _add_jobs(self, jobs: Sequence[JobSpec], speeds: Sequence[JobSpeed]) -> None:
        """Append `jobs` as new rows, not yet submitted, and schedule their arrivals."""
        assert len(speeds) == len(jobs), (len(speeds), len(jobs))
        assert all(job.submit_s >= self.time_s for job in jobs), "jobs submitted in the past"
        first = len(self.job_ids)
        self.job_ids = (*self.job_ids, *(job.job_id for job in jobs))
        self._job_row.update((job.job_id, row) for row, job in enumerate(jobs, start=first))
        assert len(self._job_row) == len(self.job_ids), "job ids must be unique"
        self._speeds = (*self._speeds, *speeds)
        self._placement.extend(() for _ in jobs)
        self.columns.extend(JobColumns.of(jobs, speeds, self._mixed_types))
        self._submit_list = sorted(self._submit_list + [job.submit_s for job in jobs])
        self.accounting.add_jobs(len(jobs))
        for row, job in enumerate(jobs, start=first):
            self._push(job.submit_s, _ARRIVAL, row, 0)
        self._arrivals_pending += len(jobs)

    @property
    def _mixed_types(self) -> tuple[str, ...]:
        """The cluster's GPU types where it has more than one, else ()."""
        return self._type_names if len(self._type_names) > 1 else ()

    def remaining_work_s(self, job_ids: Sequence[str]) -> np.ndarray:
        """Seconds each job still needs on one GPU, at its current one-GPU speed.

        The simulator knows every job's size; a live cluster does not, and policies estimate
        it from progress. This is the oracle behind `rlalloc headroom --sizes known`: what
        knowing job sizes would be worth.
        """
        rows = [self._job_row[job_id] for job_id in job_ids]
        left = np.array([self.columns.work[r] - self._progress(r, self.time_s) for r in rows],
                        dtype=np.float64)
        return np.maximum(left, 0.0) / self.columns.speed_1gpu[rows]

    def validate(self, action: Action) -> str:
        """Why `action` cannot be carried out now ("" when it can)."""
        return self._validate(action) if action.kind != _NOOP else ""

    def state(self) -> ClusterState:
        """A snapshot of everything a policy may see, as it would be read from a live cluster.

        Columns that only change on arrivals/completions or on re-allocations are cached and
        shared between snapshots until they change; the time-dependent ones are computed when
        first read (`rlalloc.env.snapshot`). Snapshot arrays are read-only by contract: policies
        must not write to them.
        """
        t = self.time_s
        if self._snapshot_rows is None:
            self._refresh_membership_columns()
        if self._snapshot_alloc is None:
            self._refresh_allocation_columns()
        static, alloc = self._snapshot_static, self._snapshot_alloc
        jobs = SnapshotJobs.lazy(
            {
                "job_id": static["job_id"], "status": alloc["status"],
                "submit_s": static["submit_s"], "requested_gpus": static["requested_gpus"],
                "min_workers": static["min_workers"], "max_workers": static["max_workers"],
                "workers": alloc["workers"], "placement": alloc["placement"],
                "speed_1gpu": static["speed_1gpu"], "scaling_alpha": static["scaling_alpha"],
                "scaling_beta": static["scaling_beta"], "restore_s": static["restore_s"],
                "restarts": alloc["restarts"], "gpus_per_worker": static["gpus_per_worker"],
            },
            alloc["inputs"], t, self.params.checkpoint_interval_s,
        )
        return ClusterState(time_s=t, nodes=self._node_snapshot(), jobs=jobs,
                            demand=self._demand(), time_of_day_s=t % 86_400.0,
                            type_speeds=static["type_speeds"])

    def _refresh_membership_columns(self) -> None:
        rows = np.fromiter(self._active, dtype=np.int64, count=len(self._active))
        self._snapshot_rows = rows
        self._snapshot_static = {
            "job_id": _pick(self.job_ids, rows),
            "submit_s": self.columns.submit_s[rows],
            "requested_gpus": self.columns.requested_gpus[rows],
            "min_workers": self.columns.min_workers[rows],
            "max_workers": self.columns.max_workers[rows],
            "speed_1gpu": self.columns.speed_1gpu[rows],
            "scaling_alpha": self.columns.scaling_alpha[rows],
            "scaling_beta": self.columns.scaling_beta[rows],
            "restore_s": self.columns.restore_s[rows],
            "gpus_per_worker": self.columns.gpus_per_worker[rows],
            "work": self.columns.work[rows],
            "type_speeds": self._type_speeds(rows),
        }
        self._snapshot_alloc = None

    def _type_speeds(self, rows: np.ndarray) -> TypeSpeeds | None:
        if not self._mixed_types:
            return None
        curves = self.columns.type_curves[rows]
        return TypeSpeeds(self._type_names, curves[:, :, 0], curves[:, :, 1], curves[:, :, 2])

    def _refresh_allocation_columns(self) -> None:
        rows = self._snapshot_rows
        self._snapshot_alloc = {
            "status": self.columns.status[rows],
            "workers": self.columns.workers[rows],
            "placement": _pick(self._placement, rows),
            "restarts": self.columns.restarts[rows],
            "inputs": {
                "done": self.columns.done[rows], "rate": self.columns.rate[rows],
                "busy_from": self.columns.busy_from_s[rows], "anchor": self.columns.anchor_s[rows],
                "attained": self.columns.attained_gpu_s[rows], "run_s": self.columns.run_s[rows],
                "work": self._snapshot_static["work"],
            },
        }

    # ------------------------------------------------------------------ actions
    def _validate(self, action: Action) -> str:
        row = self._job_row.get(action.job_id, -1)
        if row < 0 or row not in self._active:
            return f"job {action.job_id!r} is not in the system"
        try:
            nodes = [self.node_index[n] for n in action.nodes]
        except KeyError as err:
            return f"unknown node {err.args[0]!r}"
        if action.kind == _SCALE:
            n = action.workers
            low, high = self.columns.min_workers[row], self.columns.max_workers[row]
            if n and not low <= n <= high:
                return f"{n} workers is outside [{low}, {high}]"
            if n == 0 and self.columns.status[row] == _QUEUED:
                return "job is already suspended"
        else:
            if self.columns.status[row] == _QUEUED:
                return "job is not running"
            src = self.node_index.get(action.from_node, -1)
            if src not in self._placement[row]:
                return f"job has no worker on {action.from_node!r}"
            if src in nodes:
                return "the new placement still uses the node to leave"
            if len(nodes) != self.columns.workers[row]:
                return "a migration keeps the worker count"
        if tuple(sorted(nodes)) == self._placement[row]:
            return "placement unchanged"
        if self._mixed_types and len({self._gpu_types[node] for node in nodes}) > 1:
            return "a job runs on one GPU type at a time; place all its workers on one type"
        own, per_worker = self._placement[row], int(self.columns.gpus_per_worker[row])
        for node in sorted(set(nodes)):  # a placement touches a few nodes: no arrays needed
            if (self._down[node] or self._cordoned[node] or nodes.count(node) * per_worker
                    > self._gpus_free[node] + own.count(node) * per_worker):
                return f"not enough free GPUs on {self.node_names[node]}"
        return ""

    def _reallocate(self, row: int, nodes: tuple[int, ...]) -> None:
        """Checkpoint the job (no loss), release its GPUs and start it on `nodes` (may be ())."""
        t = self.time_s
        if self.columns.status[row] != _QUEUED:
            self.columns.done[row] = self._progress(row, t)
            self._release(row, t)
        if not nodes:
            return
        restarted = self.columns.started_once[row]
        if restarted:
            self.columns.restarts[row] += 1
        pays_restore = restarted or self.params.first_start_restore
        restore = float(self.columns.restore_s[row]) if pays_restore else 0.0
        self._allocate(row, nodes, t, restore)

    def _allocate(self, row: int, nodes: tuple[int, ...], t: float, restore: float) -> None:
        per_worker = int(self.columns.gpus_per_worker[row])
        rate = self._training_rate(row, nodes)
        assert rate > 0, (self.job_ids[row], nodes, rate)
        for node in nodes:
            self._gpus_free[node] -= per_worker
            self._node_jobs[node].add(row)
            assert self._gpus_free[node] >= 0, ("GPU over-allocated", self.node_names[node])
        self._placement[row] = nodes
        self.columns.workers[row] = len(nodes)
        self.columns.rate[row] = rate
        self.columns.anchor_s[row] = t
        self.columns.busy_from_s[row] = t + restore
        self.columns.version[row] += 1
        self.columns.status[row] = _RESTARTING
        self._allocation_changed()
        if not self.columns.started_once[row]:
            self.columns.started_once[row] = True
            self.accounting.job_started(row, t)
        self.accounting.change(alloc=len(nodes) * per_worker,
                               queued_gpus=-int(self.columns.requested_gpus[row]), queued_jobs=-1)
        if restore > 0:
            self._push(t + restore, _RESTORED, row, int(self.columns.version[row]))
        else:
            self._on_restored(row, t)

    def _release(self, row: int, t: float) -> None:
        """Free the job's GPUs; its progress must already be stored in `_done`."""
        held = t - self.columns.anchor_s[row]
        per_worker = int(self.columns.gpus_per_worker[row])
        gpus = int(self.columns.workers[row]) * per_worker
        self.columns.attained_gpu_s[row] += gpus * held
        self.columns.run_s[row] += held
        if self.columns.status[row] == _RUNNING:
            self.accounting.training_stopped(row, t)
            self.accounting.gpus_busy(self._placement[row], per_worker, busy=False)
        self.accounting.change(alloc=-gpus, queued_gpus=int(self.columns.requested_gpus[row]),
                               queued_jobs=1)
        for node in self._placement[row]:
            self._gpus_free[node] += per_worker
            self._node_jobs[node].discard(row)
        self._placement[row] = ()
        self.columns.workers[row] = 0
        self.columns.rate[row] = 0.0
        self.columns.version[row] += 1
        self.columns.status[row] = _QUEUED
        self._allocation_changed()

    def _training_rate(self, row: int, nodes: tuple[int, ...]) -> float:
        """Progress per second on `nodes` (a node per worker, all of one GPU type) from the
        job's current progress on, checkpoint stalls included."""
        speed = self._speeds[row].on_type(self._gpu_types[nodes[0]])
        shape = placement_shape(nodes, int(self.columns.gpus_per_worker[row]))
        if speed.epochs is None:
            rate = speed.iterations_per_s(shape)
        else:
            rate = speed.epochs.progress_per_s(shape, speed.epochs.epoch_at(self.columns.done[row]))
        interval = self.params.checkpoint_interval_s
        return rate * interval / (interval + self.params.checkpoint_stall_s)

    def _progress(self, row: int, t: float) -> float:
        columns = self.columns
        if columns.status[row] != _RUNNING:
            return float(columns.done[row])
        return float(columns.done[row] + columns.rate[row] * (t - columns.busy_from_s[row]))

    def checkpointed_progress(self) -> np.ndarray:
        """Progress in each job's latest checkpoint now, in `state()`'s job order: what a job
        hit by a node failure resumes from (a trainer exports it as
        `rlalloc_trainer_last_checkpoint_step`; so does the digital twin)."""
        if self._snapshot_rows is None:
            self._refresh_membership_columns()
        rows = self._snapshot_rows
        done = np.array([self._last_checkpoint(int(row), self.time_s)[0] for row in rows])
        return np.minimum(done / self.columns.work[rows], 1.0)

    def _last_checkpoint(self, row: int, t: float) -> tuple[float, float]:
        """(progress, time) of the job's latest checkpoint at time t."""
        if self.columns.status[row] != _RUNNING:
            return float(self.columns.done[row]), float(self.columns.anchor_s[row])
        interval = self.params.checkpoint_interval_s
        trained = math.floor((t - self.columns.busy_from_s[row]) / interval) * interval
        return (float(self.columns.done[row] + self.columns.rate[row] * trained),
                float(self.columns.busy_from_s[row] + trained))

    def _allocation_changed(self) -> None:
        self._snapshot_alloc = None
        self._snapshot_nodes = None

    def _health_changed(self) -> None:
        self._snapshot_health = None
        self._snapshot_nodes = None

    # ------------------------------------------------------------------ events
    def _push(self, t: float, kind: int, a: int, b: int,
              heap: list[tuple[float, int, int, int, int]] | None = None) -> None:
        """Schedule an event on `heap` (default: the decision-making `_events`)."""
        self._seq += 1
        heapq.heappush(self._events if heap is None else heap, (t, kind, self._seq, a, b))

    def _pull_health_events(self, until: float) -> None:
        if until <= self._health_pulled_until:
            return
        for event in self._health.events_until(until):
            self._push_health(event)
        self._health_pulled_until = until

    def _push_health(self, event: HealthEvent) -> None:
        self._push(event.time_s, _HEALTH, self._seq + 1, 0)
        self._health_events[self._seq] = event

    def _process_until(self, target: float) -> None:
        events, epoch_ends = self._events, self._epoch_ends
        while True:
            # An epoch end may schedule a completion before the next event: look again each time.
            while epoch_ends and epoch_ends[0][0] <= min(target, events[0][0] if events
                                                         else math.inf):
                t, _, _, a, b = heapq.heappop(epoch_ends)
                if b == self.columns.version[a]:
                    self.accounting.advance(t)
                    self.time_s = t
                    self._on_epoch_end(a, t)
            if not events or events[0][0] > target:
                break
            t, kind, _, a, b = heapq.heappop(events)
            self.events_processed += 1
            self.accounting.advance(t)
            self.time_s = t
            if kind == _ARRIVAL:
                self._arrivals_pending -= 1
                self._arrive(a)
            elif kind == _RESTORED:
                if b == self.columns.version[a]:
                    self._on_restored(a, t)
            elif kind == _COMPLETE:
                if b == self.columns.version[a]:
                    self._on_complete(a, t)
                    if self.done:
                        # the run ends at its last finish, so do its integrals (energy), not at
                        # the tick an epoch end left as the target when it scheduled the finish
                        target = t
            else:
                self._on_health(self._health_events.pop(a), t)
        self.accounting.advance(target)
        self.time_s = target

    def _on_restored(self, row: int, t: float) -> None:
        self.columns.status[row] = _RUNNING
        self._allocation_changed()
        self.accounting.gpus_busy(self._placement[row], int(self.columns.gpus_per_worker[row]),
                                  busy=True)
        self.accounting.training_started(row, t)
        self._schedule_run_end(row, t)

    def _schedule_run_end(self, row: int, t: float) -> None:
        """Push the end of the job's constant-rate stretch from `t`: its completion, or its
        current epoch's end when the rate changes there."""
        work, done = self.columns.work[row], self.columns.done[row]
        epochs = self._speeds[row].epochs
        end = work if epochs is None else min(work, epochs.epoch_ends[epochs.epoch_at(done)])
        at = t + (end - done) / self.columns.rate[row]
        if end < work:
            self._push(at, _EPOCH_END, row, int(self.columns.version[row]), self._epoch_ends)
        else:
            self._push(at, _COMPLETE, row, int(self.columns.version[row]))

    def _on_epoch_end(self, row: int, t: float) -> None:
        """The job's rate changes with its new epoch. Trainers checkpoint at an epoch's end, so
        the periodic checkpoint clock restarts there, as after a restore."""
        epochs = self._speeds[row].epochs
        end = epochs.epoch_ends[epochs.epoch_at(self.columns.done[row])]
        assert abs(self._progress(row, t) - end) <= 1e-6 * max(1.0, end)
        self.columns.done[row] = end
        self.columns.busy_from_s[row] = t
        self.columns.rate[row] = self._training_rate(row, self._placement[row])
        columns = self.columns
        epoch = epochs.epoch_at(end)
        columns.speed_1gpu[row], columns.scaling_alpha[row], columns.scaling_beta[row] = (
            epochs.curve(epoch))
        for column, gpu_type in enumerate(self._mixed_types):
            columns.type_curves[row, column] = self._speeds[row].on_type(gpu_type).epochs.curve(
                epoch)
        self._snapshot_rows = None  # the curve columns changed
        self._allocation_changed()
        self._schedule_run_end(row, t)

    def _on_complete(self, row: int, t: float) -> None:
        work = self.columns.work[row]
        assert abs(self._progress(row, t) - work) <= 1e-6 * max(1.0, work)
        self.columns.done[row] = self.columns.work[row]
        self._release(row, t)
        self.columns.status[row] = _FINISHED
        self.accounting.change(queued_gpus=-int(self.columns.requested_gpus[row]), queued_jobs=-1)
        del self._active[row]
        self._snapshot_rows = None
        self.accounting.job_finished(row, t)

    def _on_health(self, event: HealthEvent, t: float) -> None:
        node = event.node
        if event.kind == "warn":
            self._episodes[node] = event.episode
            self._health_changed()
        elif event.kind == "calm":
            pass  # the episode lingers in windowed counts; dropped in _node_snapshot
        elif event.kind == "fail":
            if self._down[node]:
                return  # a node that is down cannot fail again (nor be repaired of it)
            self._repair_s[node] = t + self.params.failures.repair_s
            self._fail_node(node, t)
        elif event.kind == "repair":
            if not self._down[node] or t < self._repair_s[node] - 1e-6:
                return  # the repair of a failure ignored above
            self._repair_s[node] = np.inf
            self._down[node] = False
            self._gpus_free[node] = self._gpus_total[node]
            self._health_changed()
            self.accounting.node_up(node, up=True)
        if self.health_listener is not None and event.kind != "calm":
            self.health_listener(event, t)

    def _fail_node(self, node: int, t: float) -> None:
        for row in sorted(self._node_jobs[node]):
            ckpt_progress, ckpt_time = self._last_checkpoint(row, t)
            lost_work = self._progress(row, t) - ckpt_progress
            since = t - max(ckpt_time, float(self.columns.anchor_s[row]))
            gpus = int(self.columns.workers[row] * self.columns.gpus_per_worker[row])
            self.accounting.job_failed(row, t, lost_gpu_s=gpus * since,
                                       lost_train_s=lost_work / max(self.columns.rate[row], 1e-12),
                                       gpus=gpus)
            self.columns.done[row] = ckpt_progress
            self._release(row, t)
        self._down[node] = True
        self._gpus_free[node] = 0
        self._health_changed()
        self.accounting.node_up(node, up=False)

    # ------------------------------------------------------------------ observation parts
    def _node_snapshot(self) -> Nodes:
        """Node columns; cached while no allocation, health or telemetry change happened."""
        if self._snapshot_nodes is not None and not self._episodes:
            return self._snapshot_nodes
        health = self._node_health()
        self._snapshot_nodes = SnapshotNodes.lazy(
            {
                "name": self.node_names, "gpus_total": self._snapshot_totals,
                "gpus_free": self._gpus_free.copy(), "gpu_type": self._gpu_types,
                "rack": self._snapshot_racks, "ready": health.ready, "cordoned": health.cordoned,
                "xid_errors_5m": health.xid_errors_5m, "ecc_errors_30m": health.ecc_errors_30m,
                "ready_flaps_60m": health.ready_flaps_60m,
                "temperature_delta_30m_c": health.temperature_delta_30m_c,
                "failure_risk": health.failure_risk,
            },
            (self.params.base_temperature_c, self.params.busy_temperature_rise_c),
            health.temperature_excess,
        )
        return self._snapshot_nodes

    def _node_health(self) -> _NodeHealth:
        """The health columns of the node snapshot. While no node has a warning episode they
        change only on a failure or repair, so consecutive snapshots share the same arrays
        (which lets the featurizer reuse what it derived from them)."""
        if self._snapshot_health is not None and not self._episodes:
            return self._snapshot_health
        t = self.time_s
        for node, episode in list(self._episodes.items()):
            if t - episode.end_s > _LINGER_S + self._signals.risk_lag_s:
                del self._episodes[node]
        if self._episodes:
            telemetry = self.node_telemetry(t)
            counts = telemetry[:, :4].astype(np.int32)
            temp_excess, temp_delta = telemetry[:, 4], telemetry[:, 5]
        else:  # healthy cluster: all-zero telemetry, shared
            telemetry = self._zero_telemetry
            counts, temp_excess, temp_delta = self._zero_counts, 0.0, telemetry[:, 5]
        self._snapshot_health = _NodeHealth(
            ready=~self._down, cordoned=self._cordoned.copy(), xid_errors_5m=counts[:, 0],
            ecc_errors_30m=counts[:, 2], ready_flaps_60m=counts[:, 3],
            temperature_excess=temp_excess, temperature_delta_30m_c=temp_delta,
            failure_risk=self._node_risks(telemetry))
        return self._snapshot_health

    def _forecast(self, minutes: int) -> tuple[float, float, float]:
        """Demand forecast from the first `minutes` per-minute samples (the history is append-only,
        so a snapshot that captured `minutes` gets its own forecast however late it asks)."""
        forecast = self._signals.demand_forecast
        if forecast is None or minutes == 0:
            return (0.0, 0.0, 0.0)
        if self._forecast_cache[0] != minutes:
            history = self.accounting.demand_history(self._signals.history_min, upto=minutes)
            values = forecast(history, int((minutes - 1) % 1440))
            self._forecast_cache = (minutes, (float(values[0]), float(values[1]),
                                              float(values[2])))
        return self._forecast_cache[1]

    def _node_risks(self, telemetry: np.ndarray) -> np.ndarray:
        """Failure risk per node from telemetry now and `risk_lag_s` earlier (0 without a model).

        Healthy nodes all share one risk (that of all-zero telemetry), computed once.
        """
        node_risk = self._signals.node_risk
        if node_risk is None:
            return self._zero_telemetry[:, 0]
        if self._healthy_risk is None:
            zeros = self._zero_telemetry[:1]
            self._healthy_risk = float(node_risk(zeros, zeros)[0])
        risk = np.full(len(self.node_names), self._healthy_risk, dtype=np.float32)
        if self._episodes:
            nodes = list(self._episodes)
            earlier = self.node_telemetry(self.time_s - self._signals.risk_lag_s)
            risk[nodes] = node_risk(telemetry[nodes], earlier[nodes])
        return risk

    def node_telemetry(self, time_s: float) -> np.ndarray:
        """(nodes, features) telemetry in `NODE_FEATURE_NAMES` order at `time_s` (<= now), as
        the nodes' current warning episodes produce it; the risk model's input."""
        telemetry = np.zeros((len(self.node_names), len(NODE_FEATURE_NAMES)), dtype=np.float32)
        for node, episode in self._episodes.items():
            telemetry[node] = node_features(episode, time_s, self.params.failures)
        return telemetry

    def _demand(self) -> Demand:
        lo = bisect.bisect_right(self._submit_list, self.time_s - 3600.0)
        hi = bisect.bisect_right(self._submit_list, self.time_s)
        minutes = self.accounting.demand_minutes
        return SnapshotDemand.lazy(self.accounting.queued_gpus, int(hi - lo),
                                   lambda: self._forecast(minutes))


@dataclass(frozen=True, slots=True)
class _NodeHealth:
    """Health and telemetry columns of a node snapshot (see `Nodes` for each field)."""

    ready: np.ndarray
    cordoned: np.ndarray
    xid_errors_5m: np.ndarray
    ecc_errors_30m: np.ndarray
    ready_flaps_60m: np.ndarray
    temperature_excess: np.ndarray | float
    """Degrees above the utilisation-driven temperature (warning episodes only)."""
    temperature_delta_30m_c: np.ndarray
    failure_risk: np.ndarray


DEFAULT_LIMIT_FACTOR = 20.0
"""A run is declared stuck after this many times the time it could need at worst (the two
bounds of `time_limit_s`)."""
STUCK_MIN_S = 30 * 86_400.0
"""Simulated time beyond the scaled arrival span that a large workload's run gets at least."""


def time_limit_s(sim: Simulator) -> float:
    """Simulated seconds after which a run is declared stuck: the lesser of two bounds that a
    policy which runs every job does not reach.

    * `DEFAULT_LIMIT_FACTOR` x (arrival span + every job's solo time, its run time on one GPU
      plus one restore): that many times running the jobs one after another on one GPU (a
      profiled job on its request can be ~5x slower than on one GPU: ncf). It keeps a small
      workload's stuck run short: 3 jobs stop after about a simulated day, not a month.
    * `DEFAULT_LIMIT_FACTOR` x arrival span + `STUCK_MIN_S`, or twice the longest solo time if
      that is more: it keeps a large trace's stuck run finite in practice (Philly's serial
      time is 57 years).
    """
    jobs = sim.workload.jobs
    span = (jobs[-1].submit_s - jobs[0].submit_s) if jobs else 0.0
    solo_s = sim.columns.work / sim.columns.speed_1gpu + sim.columns.restore_s
    if not len(solo_s):
        return STUCK_MIN_S
    serial = DEFAULT_LIMIT_FACTOR * (span + float(solo_s.sum()))
    return min(serial, DEFAULT_LIMIT_FACTOR * span + max(STUCK_MIN_S, 2 * float(solo_s.max())))


def _pick(items: Sequence, rows: np.ndarray) -> tuple:
    """`tuple(items[r] for r in rows)` at C speed (a hot path of every snapshot)."""
    if len(rows) == 0:
        return ()
    picked = operator.itemgetter(*rows.tolist())(items)
    return picked if len(rows) > 1 else (picked,)
