"""What the heterogeneity-aware baselines (`gavel`, `sia`) share: each job's throughput on
each GPU type of a cluster, each type's room, and the actions that carry a cluster to a plan.

Both solve an optimisation once per scheduling round and give each job a GPU type and a worker
count, or nothing (it waits). A `Plan` says that by job id; `next_action` then proposes, one
call at a time, the change that moves the cluster towards it: suspensions first, then starts,
resizes and moves onto the planned type (each placed by `choose_nodes(..., gpu_type=...)`, so
no placement ever spans types), and, where two planned moves wait on each other's GPUs, the
suspension that breaks the cycle. A job whose target is where it runs is never touched.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from rlalloc.agent.heuristics import suspend_action
from rlalloc.env.featurizer import speedup
from rlalloc.env.gpu_types import fastest_first
from rlalloc.env.placement import choose_nodes, free_gpus_for, job_gpu_type
from rlalloc.env.state import NOOP, Action, ActionKind, ClusterState, JobStatus, Strategy

Target = tuple[str, int]
"""Where a plan puts a job: (GPU type, workers)."""
Plan = dict[str, Target]
"""A round's allocation by job id; a job not in it holds no GPUs (it waits)."""

_QUEUED = int(JobStatus.QUEUED)


@contextlib.contextmanager
def c_stdout_silenced() -> Iterator[None]:
    """The process's stdout (file descriptor 1) on /dev/null meanwhile. HiGHS, as scipy bundles
    it, prints a debug line (``HighsMipSolverData::transformNewIntegerFeasibleSolution ...``)
    from C on some integer solves, past `sys.stdout`: it broke `evaluate`'s progress bar and
    would reach a user's piped output. C's buffer is flushed before fd 1 comes back, so a line
    buffered during the solve is dropped too; where fd 1 cannot be duplicated (closed), nothing
    is redirected."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        ctypes.CDLL(None).fflush(None)
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


@runtime_checkable
class RoundPlanner(Protocol):
    """A policy that plans whole rounds: `plan` solves one from scratch (no cache, no change
    to the policy's memory), which `act` caches until the round ends."""

    name: str

    def plan(self, state: ClusterState) -> Plan:
        """The allocation this policy would give `state` at the start of a round."""
        ...


def round_solve_s(policy: RoundPlanner, state: ClusterState) -> float:
    """Wall-clock seconds `policy` takes to solve one round for `state` (`RoundPlanner.plan`:
    the optimisation and its inputs, as `act` pays once per round): what `rlalloc bench`
    reports as the solve time per round."""
    start = time.perf_counter()
    policy.plan(state)
    return time.perf_counter() - start


def cluster_key(state: ClusterState) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """What invalidates a round's plan before the round ends: the jobs in the system (an
    arrival or a completion) and the GPUs of usable nodes per type (a failure, a repair, a
    cordon)."""
    nodes = state.nodes
    usable = (nodes.ready & ~nodes.cordoned).tolist()
    per_type = dict.fromkeys(nodes.type_names, 0)
    for gpu_type, gpus, ok in zip(nodes.gpu_type, nodes.gpus_total.tolist(), usable, strict=True):
        if ok:
            per_type[gpu_type] += gpus
    return state.jobs.job_id, tuple(per_type.values())


def plan_holds(planned: object, now: tuple[tuple[str, ...], tuple[int, ...]]) -> bool:
    """Whether a plan made for the `cluster_key` `planned` still holds at `now`: the same
    room per type and no job it did not plan for. A job that left (finished, or hidden by the
    actuator's guardrails after a refusal) only leaves its share to the next round; solving
    again for each would cost a solve per refusal in an actuator cycle."""
    if not isinstance(planned, tuple):
        return False
    jobs, room = planned
    return room == now[1] and set(now[0]) <= set(jobs)


@dataclass(frozen=True)
class TypeTable:
    """Per GPU type of a state's cluster (in `Nodes.type_names` order): each job's scaling
    curve there and the room a plan may use there.

    The room of a node is its free GPUs if it is usable (up, not cordoned) plus the GPUs the
    state's jobs hold on it if it is up: `rlalloc.agent.heuristics.gpu_budget` per type and
    per node, so that a plan counts neither other tenants' GPUs nor loses a cordoned node's
    running jobs."""

    types: tuple[str, ...]
    speed_1gpu: np.ndarray
    alpha: np.ndarray
    beta: np.ndarray
    """float64 (jobs, types): `TypeSpeeds`' curves (on a one-type cluster, `Jobs`')."""
    gpus_per_worker: np.ndarray
    """int64 (jobs,): each job's worker size."""
    gpus_per_node: np.ndarray
    """int64 (types,): GPUs of the type's largest usable node (0 when none is usable)."""
    node_room: tuple[tuple[int, ...], ...]
    """Per type, the room of each of its usable nodes."""
    capacity: np.ndarray
    """int64 (types,): GPUs a plan may give out on the type (the room of its up nodes)."""

    @staticmethod
    def of(state: ClusterState) -> TypeTable:
        """The table of `state`."""
        nodes, jobs = state.nodes, state.jobs
        types = nodes.type_names
        if state.type_speeds is None:
            columns = [np.asarray(c, dtype=np.float64)[:, None]
                       for c in (jobs.speed_1gpu, jobs.scaling_alpha, jobs.scaling_beta)]
        else:
            speeds = state.type_speeds
            order = [speeds.column(t) for t in types]
            columns = [np.asarray(c, dtype=np.float64)[:, order]
                       for c in (speeds.speed_1gpu, speeds.scaling_alpha, speeds.scaling_beta)]
        held = [0] * nodes.count
        for placement, k in zip(jobs.placement, jobs.gpus_per_worker.tolist(), strict=True):
            for node in placement:
                held[node] += k
        free = free_gpus_for(state, None).tolist()
        up, usable = nodes.ready.tolist(), (nodes.ready & ~nodes.cordoned).tolist()
        index = {t: i for i, t in enumerate(types)}
        rooms: list[list[int]] = [[] for _ in types]
        capacity = np.zeros(len(types), dtype=np.int64)
        per_node = np.zeros(len(types), dtype=np.int64)
        for node, gpu_type in enumerate(nodes.gpu_type):
            t = index[gpu_type]
            room = free[node] + (held[node] if up[node] else 0)
            capacity[t] += room
            if usable[node]:
                rooms[t].append(room)
                per_node[t] = max(per_node[t], int(nodes.gpus_total[node]))
        return TypeTable(types, *columns, jobs.gpus_per_worker.astype(np.int64), per_node,
                         tuple(tuple(r) for r in rooms), capacity)

    def worker_slots(self) -> np.ndarray:
        """int64 (jobs, types): workers of each job's size the usable nodes of each type hold,
        each worker on one node (computed once per distinct worker size)."""
        sizes, job_size = np.unique(self.gpus_per_worker, return_inverse=True)
        per_size = np.array([[sum(room // size for room in rooms) for rooms in self.node_room]
                             for size in sizes.tolist()], dtype=np.int64)
        return per_size.reshape(len(sizes), len(self.types))[job_size]

    def throughput(self, rows: np.ndarray, t: int, workers: np.ndarray) -> np.ndarray:
        """Iterations per second of jobs `rows` with `workers` workers on type `t`, packed onto
        its nodes (each holding as many whole workers as fit in its GPUs); 0 for 0 workers."""
        k = self.gpus_per_worker[rows]
        per_node = np.maximum(int(self.gpus_per_node[t]) // k, 1)
        nodes = -(-np.asarray(workers) // per_node)
        return self.speed_1gpu[rows, t] * speedup(workers * k, nodes, self.alpha[rows, t],
                                                  self.beta[rows, t])


def take_room(room: list[int], workers: int, gpus_per_worker: int) -> bool:
    """Take `workers` workers of `gpus_per_worker` GPUs out of the nodes' `room` (changed in
    place) if they fit, packed as `choose_nodes` packs (the tightest node that holds the rest,
    else the roomiest whole); False, and `room` unchanged, if they do not."""
    slots = [r // gpus_per_worker for r in room]
    if sum(slots) < workers:
        return False
    need = workers
    while need > 0:
        fits = [(s, node) for node, s in enumerate(slots) if s >= need]
        node = min(fits)[1] if fits else max(range(len(slots)), key=slots.__getitem__)
        take = min(need, slots[node])
        slots[node] -= take
        room[node] -= take * gpus_per_worker
        need -= take
    return True


def current_targets(state: ClusterState) -> Plan:
    """Where each job holding GPUs runs now, as a plan (what keeping everything would be)."""
    jobs = state.jobs
    return {jobs.job_id[row]: (job_gpu_type(state, row), int(jobs.workers[row]))
            for row in range(jobs.count) if jobs.placement[row]}


def next_action(state: ClusterState, plan: Plan) -> Action:
    """The next change towards `plan`: suspend a job it does not run; else start, resize or
    move a job whose target differs from where it runs, shrinks first (they only free GPUs),
    if its target fits; else suspend a job whose target does not fit yet and whose GPUs would
    let another waiting target fit (two moves waiting on each other, as a swap of types);
    else nothing (the rest waits for GPUs to free)."""
    jobs = state.jobs
    held = [row for row in range(jobs.count) if jobs.placement[row]]
    for row in held:
        if jobs.job_id[row] not in plan:
            return suspend_action(state, row)
    now = current_targets(state)
    pending = [row for row in range(jobs.count)
               if (target := plan.get(jobs.job_id[row])) is not None
               and now.get(jobs.job_id[row]) != target]
    pending.sort(key=lambda row: (not _shrinks(now.get(jobs.job_id[row]),
                                               plan[jobs.job_id[row]]), row))
    blocked = []
    for row in pending:
        gpu_type, workers = plan[jobs.job_id[row]]
        nodes = choose_nodes(state, row, workers, Strategy.PACKED, gpu_type=gpu_type)
        if nodes is not None:
            names = state.nodes.name
            return Action(ActionKind.SCALE, jobs.job_id[row], workers,
                          tuple(names[n] for n in nodes))
        blocked.append(row)
    for holder in (row for row in blocked if jobs.placement[row]):
        if any(_fits_if_released(state, row, holder, plan[jobs.job_id[row]])
               for row in blocked if row != holder):
            return suspend_action(state, holder)
    return NOOP


def _shrinks(now: Target | None, target: Target) -> bool:
    return now is not None and now[0] == target[0] and target[1] < now[1]


def _fits_if_released(state: ClusterState, row: int, holder: int, target: Target) -> bool:
    """Would job `row`'s target fit if job `holder` released its GPUs (its own counting free)?"""
    free = free_gpus_for(state, row)
    k = int(state.jobs.gpus_per_worker[holder])
    for node in state.jobs.placement[holder]:
        free[node] += k
    gpu_type, workers = target
    per_worker = int(state.jobs.gpus_per_worker[row])
    nodes = state.nodes
    usable = (nodes.ready & ~nodes.cordoned).tolist()
    return sum(f // per_worker for f, t, ok in zip(free.tolist(), nodes.gpu_type, usable,
                                                   strict=True) if t == gpu_type and ok) >= workers


def fastest_type_order(types: Iterable[str]) -> list[int]:
    """Indices of `types` from the fastest to the slowest (`rlalloc.env.gpu_types`)."""
    names = list(types)
    return [names.index(t) for t in fastest_first(names)]
