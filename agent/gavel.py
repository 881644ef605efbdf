"""`gavel`: Gavel's heterogeneity-aware least-attained-service policy and its round-based
mechanism (Narayanan et al., "Heterogeneity-Aware Cluster Scheduling Policies for Deep Learning
Workloads", OSDI'20).

The policy (paper section 4.1, "max-min fairness as LAS"; the artifact's
``scheduler/policies/max_min_fairness.py``, `MaxMinFairnessPolicyWithPerf`) is a linear
program over X[j, t], the share of time job j spends on GPU type t with its requested workers
(Gavel keeps each job's scale factor fixed)::

    maximise  min_j  s_j * sum_t thr[j, t] X[j, t] / thr(j, X^equal_j)
    s.t.      sum_t X[j, t] <= 1,   sum_j s_j X[j, t] <= GPUs of type t,   0 <= X <= 1

with s_j the job's GPUs and thr(j, X^equal_j) its throughput on an equal time share of every
type (the paper's normaliser, e.g. X^equal = [0.5, 0.5] on one V100 and one K80), solved by
`scipy.optimize.linprog` (HiGHS). It is recomputed when jobs arrive or a type's room changes,
and at the next round start after jobs finish (`plan_holds`).

The mechanism (paper section 5; the artifact's ``scheduler/scheduler.py``,
`_update_priorities`, `_schedule_jobs_on_workers_helper`, `_reset_time_run_so_far`): every
round (`GavelConfig.round_s`, Gavel's default 6 minutes) each job's priority on type t is
X[j, t] divided by the share of the type's job-time it has received so far (X * 1e9 while
that is 0; every job starts with half a round on every type, as Gavel seeds it), ties broken
by the deficit carried over the last reset and then X. Types are filled from the fastest,
each with its jobs in priority order, skipping a job already placed this round, one with no
throughput there, and one that does not fit (Gavel's `continue`). Received time is reset,
and the shortfall carried as a deficit, when the allocation is recomputed at least
`reset_interval_s` (Gavel's `minimum_time_between_allocation_resets`, 1,920 s) after the last
reset. A job scheduled again on its type keeps its GPUs (Gavel's lease extension).

Simplifications (docs/agent.md, "Clusters of several GPU types"):
- a round ends at the first decision point at or after its end (the simulator asks the policy
  at events and every `decision_interval_s`);
- when jobs arrive or finish mid-round, the GPUs left idle are filled at once (by the new
  allocation's priorities after an arrival, the round's allocation after a completion),
  without preempting the round's jobs; Gavel leaves them idle until the round ends; Gavel
  recomputes the allocation at once when a job finishes, here at the next round (a solve per
  job that leaves cost a second per actuator cycle at 1,024 GPUs);
- a request that no single type can hold is cut to the most workers one type holds (Gavel
  would never run it); a worker of k GPUs is placed whole on one node (the greedy checks room
  node by node, where Gavel counts GPUs);
- throughputs are the state's scaling curves packed onto the type's nodes, not Gavel's
  measured oracle; received time is counted per job (not per GPU) from the allocations the
  policy sees, as Gavel's `_job_time_so_far` counts a job's rounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_array

from rlalloc.agent.type_plans import (
    Plan,
    TypeTable,
    cluster_key,
    fastest_type_order,
    next_action,
    plan_holds,
    take_room,
)
from rlalloc.env.placement import job_gpu_type, requested_workers
from rlalloc.env.state import Action, ClusterState


@dataclass(frozen=True, slots=True)
class GavelConfig:
    """Gavel's knobs, with the artifact's defaults."""

    round_s: float = 360.0
    """Round length (Gavel's ``time_per_iteration``, 360 s = 6 minutes): how long a round's
    schedule stands before priorities pick the next."""
    reset_interval_s: float = 1920.0
    """Least time between resets of received time (Gavel's
    ``minimum_time_between_allocation_resets``)."""


class GavelPolicy:
    """Heterogeneity-aware max-min fairness (LAS) with Gavel's rounds (module docstring).

    Not a pure function of the state, as Gavel is not: it remembers the time each job has
    received on each type, the allocation and the round's schedule."""

    name = "gavel"
    remembers = True

    def __init__(self, config: GavelConfig | None = None) -> None:
        self.config = config or GavelConfig()
        self._forget(())

    def _forget(self, types: tuple[str, ...]) -> None:
        """Start afresh on a cluster of `types` (a first call, or another cluster)."""
        self._types = types
        self._key: object = None
        self._allocation: dict[str, np.ndarray] = {}
        self._received: dict[str, np.ndarray] = {}
        """Seconds each job has run on each type since the last reset (plus Gavel's seed)."""
        self._deficit: dict[str, np.ndarray] = {}
        self._type_time = np.zeros(len(types))
        """Seconds all jobs together have run on each type since the last reset."""
        self._reset_s: float | None = None
        self._round_end_s = -math.inf
        self._plan: Plan = {}
        self._seen: tuple[float, dict[str, int]] | None = None
        """When the policy last looked, and the type index each job then ran on."""

    # ----------------------------------------------------------------- rounds
    def act(self, state: ClusterState) -> Action:
        """Count the time received since the last call; recompute the allocation if jobs
        arrived or the room changed (if jobs only left, at the next round: `plan_holds`);
        pick the round's jobs if a round starts (or fill GPUs the change left idle); then one
        step towards the round's schedule."""
        self._observe(state)
        key = cluster_key(state)
        new_round = state.time_s >= self._round_end_s
        if key != self._key or new_round:
            table = TypeTable.of(state)
            if not plan_holds(self._key, key) or (new_round and key != self._key):
                self._reallocate(state, table)
                self._key = key
            present = set(state.jobs.job_id)
            keep = {} if new_round else {job_id: target for job_id, target in self._plan.items()
                                         if job_id in present}
            self._plan = self._schedule(state, table, self._allocation, keep)
            if new_round:
                self._round_end_s = state.time_s + self.config.round_s
        return next_action(state, self._plan)

    def plan(self, state: ClusterState) -> Plan:
        """A round's schedule for `state` from scratch: the allocation (the LP) and the jobs
        its priorities pick, from the time received so far (`round_solve_s` times this)."""
        table = TypeTable.of(state)
        return self._schedule(state, table, max_min_allocation(state, table), {})

    def _observe(self, state: ClusterState) -> None:
        """Credit each job the seconds since the last call on the type it ran on then (what
        it was given then held until now: the simulator asks at every change)."""
        types = state.nodes.type_names
        if types != self._types:
            self._forget(types)
        now = state.time_s
        if self._seen is not None and now > self._seen[0]:
            elapsed = now - self._seen[0]
            for job_id, t in self._seen[1].items():
                if job_id in self._received:
                    self._received[job_id][t] += elapsed
                    self._type_time[t] += elapsed
        for job_id in state.jobs.job_id:
            if job_id not in self._received:
                self._received[job_id] = np.full(len(types), self._seed_s)
                self._deficit[job_id] = np.zeros(len(types))
        index = {t: i for i, t in enumerate(types)}
        jobs = state.jobs
        self._seen = (now, {jobs.job_id[row]: index[job_gpu_type(state, row)]
                            for row in range(jobs.count) if jobs.placement[row]})

    @property
    def _seed_s(self) -> float:
        """Time every job starts with on every type (Gavel's half a round)."""
        return self.config.round_s / 2.0

    def _reallocate(self, state: ClusterState, table: TypeTable) -> None:
        """Forget finished jobs, reset received time if due, and solve the allocation."""
        present = set(state.jobs.job_id)
        for memory in (self._received, self._deficit):
            for job_id in [j for j in memory if j not in present]:
                del memory[job_id]
        now, seed = state.time_s, self._seed_s
        if self._reset_s is None or now - self._reset_s >= self.config.reset_interval_s:
            elapsed = 0.0 if self._reset_s is None else now - self._reset_s
            for job_id, received in self._received.items():
                owed = self._allocation.get(job_id, 0.0) * elapsed
                self._deficit[job_id] += owed - (received - seed)
                received[:] = seed
            self._type_time[:] = seed * len(self._received)
            self._reset_s = now
        self._allocation = max_min_allocation(state, table)

    # ----------------------------------------------------------------- the schedule
    def _schedule(self, state: ClusterState, table: TypeTable,
                  allocation: dict[str, np.ndarray], keep: Plan) -> Plan:
        """Gavel's greedy round: the `keep` jobs where they are, then per type from the
        fastest, jobs by (priority, deficit, allocation) while they fit."""
        jobs, types = state.jobs, table.types
        if jobs.count == 0:
            return {}
        workers, thr = fixed_throughputs(state, table)
        rooms = [list(room) for room in table.node_room]
        per_worker = table.gpus_per_worker.tolist()
        index = {t: i for i, t in enumerate(types)}
        plan: Plan = {}
        for row, job_id in enumerate(jobs.job_id):
            target = keep.get(job_id)
            if target is not None and take_room(rooms[index[target[0]]], target[1],
                                                per_worker[row]):
                plan[job_id] = target
        priority, deficit, x = self._priorities(jobs.job_id, allocation, len(types))
        submit = jobs.submit_s.tolist()
        for t in fastest_type_order(types):
            order = sorted(range(jobs.count), key=lambda r: (
                -priority[r, t], -deficit[r, t], -x[r, t], submit[r], r))
            for row in order:
                job_id = jobs.job_id[row]
                if job_id in plan or thr[row, t] <= 0:
                    continue
                if take_room(rooms[t], int(workers[row]), per_worker[row]):
                    plan[job_id] = (types[t], int(workers[row]))
        return plan

    def _priorities(self, job_ids: tuple[str, ...], allocation: dict[str, np.ndarray],
                    n_types: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(priority, deficit, allocation), each (jobs, types): Gavel's `_update_priorities`,
        X / (the job's share of the type's job-time since the last reset), X * 1e9 while that
        share is 0, and 0 where X is 0."""
        zeros = np.zeros(n_types)
        x = np.stack([allocation.get(j, zeros) for j in job_ids])
        received = np.stack([self._received.get(j, zeros + self._seed_s) for j in job_ids])
        deficit = np.stack([self._deficit.get(j, zeros) for j in job_ids])
        type_time = self._type_time if len(self._type_time) == n_types else zeros  # unseen
        with np.errstate(divide="ignore", invalid="ignore"):
            fraction = np.where(type_time > 0, received / type_time, 0.0)
            priority = np.where(x <= 0, 0.0, np.where(fraction > 0, x / fraction, x * 1e9))
        return priority, deficit, x


def fixed_throughputs(state: ClusterState, table: TypeTable) -> tuple[np.ndarray, np.ndarray]:
    """Each job's fixed worker count (its request, within its elastic range, cut to the most
    workers one type holds) and its throughput with them on each type, (jobs, types), 0 on a
    type that cannot hold them."""
    jobs, n_types = state.jobs, len(table.types)
    rows = np.arange(jobs.count)
    slots = table.worker_slots()
    wanted = np.clip(requested_workers(state, rows), jobs.min_workers, jobs.max_workers)
    workers = np.maximum(np.minimum(wanted, slots.max(axis=1, initial=0)),
                         jobs.min_workers).astype(np.int64)
    thr = np.zeros((jobs.count, n_types))
    for t in range(n_types):
        thr[:, t] = np.where(slots[:, t] >= workers, table.throughput(rows, t, workers), 0.0)
    return workers, thr


def max_min_allocation(state: ClusterState, table: TypeTable) -> dict[str, np.ndarray]:
    """Gavel's heterogeneity-aware max-min fairness LP (module docstring) by job id: each
    job's share of time on each type with its fixed workers. Jobs no type holds get zeros."""
    jobs, n_types = state.jobs, len(table.types)
    workers, thr = fixed_throughputs(state, table)
    allocation = {job_id: np.zeros(n_types) for job_id in jobs.job_id}
    active = np.flatnonzero(thr.max(axis=1, initial=0.0) > 0)
    if not len(active):
        return allocation
    thr = thr[active]
    gpus = (workers * table.gpus_per_worker)[active].astype(np.float64)
    equal_share = thr.mean(axis=1)  # thr(j, X^equal_j): an equal time share of every type
    weight = thr * (gpus / equal_share)[:, None]
    n = len(active)
    n_vars = n * n_types + 1  # X row-major, then z
    z = n_vars - 1
    job_of = np.repeat(np.arange(n), n_types)
    var = np.arange(n * n_types)
    type_of = np.tile(np.arange(n_types), n)
    # z - sum_t w[j,t] X[j,t] <= 0;  sum_t X[j,t] <= 1;  sum_j gpus_j X[j,t] <= capacity_t
    row_idx = np.concatenate([np.arange(n), job_of, n + job_of, 2 * n + type_of])
    col_idx = np.concatenate([np.full(n, z), var, var, var])
    values = np.concatenate([np.ones(n), -weight.ravel(), np.ones(n * n_types),
                             np.repeat(gpus, n_types)])
    a_ub = coo_array((values, (row_idx, col_idx)), shape=(2 * n + n_types, n_vars)).tocsr()
    b_ub = np.concatenate([np.zeros(n), np.ones(n), table.capacity.astype(np.float64)])
    bounds = np.zeros((n_vars, 2))
    bounds[:-1, 1] = (thr.ravel() > 0).astype(np.float64)
    bounds[-1] = (0.0, np.inf)
    cost = np.zeros(n_vars)
    cost[z] = -1.0
    result = linprog(cost, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs")
    if result.status != 0:
        return allocation
    # rounded: equal shares that the solver returns a hair apart tie, as they should
    shares = np.round(np.clip(result.x[:-1], 0.0, 1.0), 6).reshape(n, n_types)
    for i, row in enumerate(active.tolist()):
        allocation[jobs.job_id[row]] = shares[i]
    return allocation
