"""Tiny hand-made worlds and an invariant checker shared by the simulator tests."""

from __future__ import annotations

import numpy as np

from rlalloc.env.cluster import uniform_cluster
from rlalloc.env.params import SimParams
from rlalloc.env.placement import choose_nodes
from rlalloc.env.profiles import GENERIC_SCALING
from rlalloc.env.simulator import JobSpeed, Simulator
from rlalloc.env.state import NOOP, Action, ActionKind, ClusterState, JobStatus, Strategy
from rlalloc.env.workload.spec import JobSpec, Workload

GENERIC = JobSpeed(GENERIC_SCALING.iterations_per_s, 1.0, GENERIC_SCALING.alpha,
                   GENERIC_SCALING.beta)


def job(job_id: str, submit_s: float, gpus: int, work: float, restore_s: float = 30.0,
        max_workers: int = 8, gpus_per_worker: int = 1) -> JobSpec:
    """A generic-speed job (work in single-GPU seconds) of `gpus` GPUs in workers of
    `gpus_per_worker`; `max_workers` counts workers."""
    return JobSpec(job_id, submit_s, gpus, work, 1, max_workers, restore_s,
                   gpus_per_worker=gpus_per_worker)


def simulator(jobs: list[JobSpec], nodes: int = 2, gpus: int = 4, seed: int = 0,
              params: SimParams | None = None) -> Simulator:
    """A simulator over `jobs` on `nodes` x `gpus`, with failures off unless `params` say."""
    from rlalloc.env.failures import FailureParams

    params = params or SimParams(failures=FailureParams(failures_per_gpu_day=0.0))
    return Simulator(uniform_cluster(nodes, gpus), Workload("test", tuple(jobs)),
                     [GENERIC] * len(jobs), params, seed)


def fifo(state: ClusterState) -> Action:
    """Strict FIFO with requested GPUs, packed (the test's own reference policy)."""
    jobs = state.jobs
    queued = np.flatnonzero(jobs.status == JobStatus.QUEUED)
    if not len(queued):
        return NOOP
    row = int(queued[np.argmin(jobs.submit_s[queued])])
    workers = int(jobs.requested_gpus[row] // jobs.gpus_per_worker[row])
    nodes = choose_nodes(state, row, workers, Strategy.PACKED)
    if nodes is None:
        return NOOP
    return Action(ActionKind.SCALE, jobs.job_id[row], workers,
                  tuple(state.nodes.name[n] for n in nodes))


def check_invariants(state: ClusterState) -> None:
    """What must hold in every state the simulator hands out."""
    nodes, jobs = state.nodes, state.jobs
    used = np.zeros(nodes.count, dtype=np.int64)
    for placement, per_worker in zip(jobs.placement, jobs.gpus_per_worker.tolist(), strict=True):
        for node in placement:
            used[node] += per_worker  # a worker's GPUs are all on its node
    assert (nodes.gpus_free >= 0).all(), "negative free GPUs"
    up = nodes.ready
    assert (used[up] + nodes.gpus_free[up] == nodes.gpus_total[up]).all(), "GPUs not conserved"
    assert (used <= nodes.gpus_total).all(), "GPU over-allocated"
    assert (used[~up] == 0).all(), "a job runs on a node that is down"
    assert (jobs.workers == np.array([len(p) for p in jobs.placement])).all()
    queued = jobs.status == JobStatus.QUEUED
    assert (jobs.workers[queued] == 0).all()
    assert ((jobs.workers[~queued] >= jobs.min_workers[~queued])
            & (jobs.workers[~queued] <= jobs.max_workers[~queued])).all()
    assert ((jobs.progress >= 0) & (jobs.progress <= 1)).all()


def check_accounting(sim: Simulator, state: ClusterState) -> None:
    """The levels the run's metrics integrate (allocated, training, up and queued GPUs) agree
    with the state: gpu_util, goodput and energy are only as right as these."""
    nodes, jobs, acc = state.nodes, state.jobs, sim.accounting
    gpus = jobs.workers * jobs.gpus_per_worker
    assert acc.alloc_gpus == int(gpus.sum())
    assert acc.busy_gpus == int(gpus[jobs.status == JobStatus.RUNNING].sum())
    assert acc.up_gpus == int(nodes.gpus_total[nodes.ready].sum())
    queued = jobs.status == JobStatus.QUEUED
    assert acc.queued_gpus == state.demand.pending_gpus == int(jobs.requested_gpus[queued].sum())


class WorkLedger:
    """Checks work conservation across the states of one run: a job's progress never exceeds
    its work and never decreases except by a node failure's rollback (which re-queues it)."""

    def __init__(self, sim: Simulator) -> None:
        self._sim = sim
        self._progress: dict[str, float] = {}
        self._failures = 0

    def check(self, state: ClusterState) -> None:
        """Compare `state` with the states seen before."""
        jobs = state.jobs
        failed = self._sim.accounting.failures > self._failures
        self._failures = self._sim.accounting.failures
        assert ((jobs.progress >= 0) & (jobs.progress <= 1)).all()
        for row, job_id in enumerate(jobs.job_id):
            now, before = float(jobs.progress[row]), self._progress.get(job_id, 0.0)
            if now < before - 1e-6:
                assert failed and jobs.status[row] == JobStatus.QUEUED, (job_id, before, now)
            self._progress[job_id] = now


def run_decisions(sim: Simulator, policy: object, decisions: int) -> None:
    """Drive `sim` with `policy` for `decisions` decision points (as `run_policy` does)."""
    for _ in range(decisions):
        for _ in range(sim.params.max_actions_per_decision):
            action = policy.act(sim.state())
            if action.kind == ActionKind.NOOP or not sim.apply(action):
                break
        sim.advance()


def place_on_type(sim: Simulator, job_id: str, workers: int, gpu_type: str) -> None:
    """Start or move `job_id` to `workers` workers packed on nodes of `gpu_type` (must fit)."""
    state = sim.state()
    nodes = choose_nodes(state, state.job_index(job_id), workers, Strategy.PACKED,
                         gpu_type=gpu_type)
    assert nodes is not None
    assert sim.apply(Action(ActionKind.SCALE, job_id, workers,
                            tuple(state.nodes.name[n] for n in nodes)))
