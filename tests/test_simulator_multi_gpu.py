"""Jobs of multi-GPU workers in the simulator: whole workers per node, k GPUs each, everywhere."""

from __future__ import annotations

import numpy as np
import pytest

from rlalloc.env.cluster import parse_cluster, uniform_cluster
from rlalloc.env.failures import FailureParams
from rlalloc.env.params import SimParams
from rlalloc.env.placement import choose_nodes
from rlalloc.env.profiles import profiles_or_default
from rlalloc.env.scenario import job_speeds
from rlalloc.env.simulator import Simulator
from rlalloc.env.state import Action, ActionKind, JobStatus, Strategy
from rlalloc.env.workload.spec import JobSpec, Workload

from sim_helpers import WorkLedger, check_accounting, check_invariants, fifo, job, simulator

NO_FAILURES = SimParams(failures=FailureParams(failures_per_gpu_day=0.0))


def scale(job_id: str, nodes: list[str]) -> Action:
    return Action(ActionKind.SCALE, job_id, len(nodes), tuple(nodes))


def test_two_4_gpu_workers_on_2x4_run_on_both_nodes_and_finish_when_the_profile_says():
    profiles = profiles_or_default(None)
    batch, work, restore = 256, 2000.0, 30.0
    spec = JobSpec("bert-2x4", 0.0, 8, work, 1, 2, restore, application="bert",
                   batch_size=batch, gpus_per_worker=4)
    workload = Workload("test", (spec,))
    sim = Simulator(uniform_cluster(2, 4), workload, job_speeds(workload, profiles), NO_FAILURES)
    placements = set()

    def policy(state):
        placements.update(p for p in state.jobs.placement if p)
        return fifo(state)

    sim.run(policy)
    assert placements == {(0, 1)}  # one 4-GPU worker on each node
    rate = profiles["bert"].throughput(batch).iterations_per_s((4, 4))
    finish = float(sim.accounting._finish[0])
    assert finish == pytest.approx(work / rate, rel=1e-9)  # first start pays no restore
    # four GPUs on each node: all 8 busy while it trained
    assert sim.accounting.summary()["gpu_busy_util"] == pytest.approx(1.0)
    assert rate != profiles["bert"].throughput(batch).iterations_per_s((8,))


def test_a_worker_is_never_split_and_a_job_holds_k_gpus_per_worker():
    sim = simulator([job("a", 0.0, 8, work=1e6, max_workers=3, gpus_per_worker=4)],
                    nodes=3, gpus=6)
    sim.advance()
    state = sim.state()
    assert state.jobs.gpus_per_worker.tolist() == [4]
    # two workers of 4 GPUs do not fit on one 6-GPU node, even though 8 GPUs <= 2 x 6 do
    assert sim.validate(scale("a", ["node-0000", "node-0000"])) == (
        "not enough free GPUs on node-0000")
    assert choose_nodes(state, 0, 2, Strategy.PACKED) == (0, 1)
    assert choose_nodes(state, 0, 4, Strategy.PACKED) is None  # 3 nodes hold 3 such workers
    assert sim.apply(scale("a", ["node-0000", "node-0001", "node-0002"]))
    state = sim.state()
    assert state.nodes.gpus_free.tolist() == [2, 2, 2]
    assert sim.accounting.alloc_gpus == 12
    check_invariants(state)
    check_accounting(sim, state)


def test_a_failed_node_stops_exactly_the_jobs_with_workers_on_it():
    """3 nodes of 8: a (one 4-GPU worker on node 0), b (4-GPU workers on nodes 0 and 1),
    c (4-GPU workers on nodes 1 and 2). Node 0 fails: a and b lose their work since the last
    checkpoint on every GPU they held and requeue; c trains on, untouched."""
    interval = 600.0
    params = SimParams(checkpoint_interval_s=interval,
                       failures=FailureParams(failures_per_gpu_day=0.0))
    sim = simulator([job(name, 0.0, 4 * n, work=1e6, max_workers=2, gpus_per_worker=4)
                     for name, n in (("a", 1), ("b", 2), ("c", 2))], nodes=3, gpus=8,
                    params=params)
    sim.schedule_failure("node-0000", 900.0)
    sim.advance()
    assert sim.apply(scale("a", ["node-0000"]))
    assert sim.apply(scale("b", ["node-0000", "node-0001"]))
    assert sim.apply(scale("c", ["node-0001", "node-0002"]))
    while sim.time_s < 900.0:
        sim.advance()
    state = sim.state()
    check_invariants(state)
    status = dict(zip(state.jobs.job_id, state.jobs.status.tolist(), strict=True))
    assert status == {"a": JobStatus.QUEUED, "b": JobStatus.QUEUED, "c": JobStatus.RUNNING}
    assert state.jobs.placement[2] == (1, 2)
    assert state.nodes.gpus_free.tolist() == [0, 4, 4]
    # 300 s since the 600 s checkpoint, lost on a's 4 GPUs and b's 8
    assert sim.accounting.summary()["lost_gpu_hours"] == pytest.approx(12 * 300.0 / 3600.0)
    assert sim.accounting.failures == 2


@pytest.mark.parametrize("failures", [0.0, 5.0])
def test_invariants_hold_for_mixed_worker_sizes_under_random_valid_actions(failures):
    """Random workloads of 1-, 2-, 4- and 8-GPU workers on 4x8 (and a 6-GPU node, where an
    8-GPU worker never fits and two 4-GPU workers do not): every placement `choose_nodes`
    proposes is valid, no GPU is ever over-allocated, no worker split, work conserved."""
    params = SimParams(failures=FailureParams(failures_per_gpu_day=failures))
    rng = np.random.default_rng(7)
    jobs = []
    for i in range(40):
        k = int(rng.choice([1, 2, 4, 8]))
        workers = int(rng.choice([1, 2, 3]))
        jobs.append(job(f"j{i}", float(i * 90), workers * k, float(rng.uniform(500, 6000)),
                        max_workers=4, gpus_per_worker=k))
    base = simulator(jobs, params=params)
    sim = Simulator(parse_cluster("4x8+1x6"), base.workload, base._speeds, params, 0)
    ledger = WorkLedger(sim)
    moves = 0

    def random_policy(state):
        nonlocal moves
        check_invariants(state)
        check_accounting(sim, state)
        ledger.check(state)
        for row, per_worker in enumerate(state.jobs.gpus_per_worker.tolist()):
            for node in set(state.jobs.placement[row]):
                held = state.jobs.placement[row].count(node) * per_worker
                assert held <= state.nodes.gpus_total[node], "a worker split across nodes"
        if rng.random() < 0.4 and state.jobs.count:
            row = int(rng.integers(state.jobs.count))
            workers = int(rng.integers(state.jobs.min_workers[row],
                                       state.jobs.max_workers[row] + 1))
            strategy = Strategy(int(rng.integers(2)))
            nodes = choose_nodes(state, row, workers, strategy)
            if nodes is not None and nodes != state.jobs.placement[row]:
                action = Action(ActionKind.SCALE, state.jobs.job_id[row], workers,
                                tuple(state.nodes.name[n] for n in nodes))
                assert sim.validate(action) == "", action
                moves += 1
                return action
        return fifo(state)

    sim.run(random_policy)
    summary = sim.accounting.summary()
    assert summary["jobs_completed"] == 40 and summary["invalid_actions"] == 0
    assert moves > 20
    assert 0 < summary["gpu_busy_util"] <= summary["gpu_util"] <= 1
    if failures:
        assert summary["failures"] > 0


def test_same_seed_same_run_with_multi_gpu_workers():
    params = SimParams(failures=FailureParams(failures_per_gpu_day=2.0))

    def run(seed: int) -> dict:
        jobs = [job(f"j{i}", float(i * 200), 8 if i % 2 else 4, 3000.0, max_workers=2,
                    gpus_per_worker=4) for i in range(12)]
        sim = simulator(jobs, nodes=3, gpus=8, params=params, seed=seed)
        sim.run(fifo)
        return sim.accounting.summary()

    assert run(1) == run(1)
    assert run(1) != run(2)

