"""The baselines and the planner with jobs of multi-GPU workers: they act in workers, value a
worker as its GPUs, never split one across nodes nor over-allocate a node, and finish every
job; on hand-made states whose right answer is obvious they give it."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from rlalloc.agent.catalogue import HEURISTICS
from rlalloc.agent.heuristics import (
    ElasticConfig,
    ElasticPolicy,
    StaticPolicy,
    TiresiasPolicy,
    gpu_budget,
)
from rlalloc.agent.job_sizes import curve_key
from rlalloc.agent.job_speeds import ProfiledSpeedups, assumed_shape
from rlalloc.agent.lookahead import HistoryArrivals
from rlalloc.agent.planner import history_arrivals, history_rows, planning_policy
from rlalloc.agent.registry import load_policy
from rlalloc.env.cluster import uniform_cluster
from rlalloc.env.failures import FailureParams
from rlalloc.env.params import SimParams
from rlalloc.env.placement import requested_workers
from rlalloc.env.scenario import Scenario
from rlalloc.env.simulator import Simulator
from rlalloc.env.state import (
    NOOP,
    Action,
    ActionKind,
    ClusterState,
    Demand,
    JobInfo,
    Jobs,
    JobStatus,
    NodeInfo,
    Nodes,
)
from rlalloc.env.workload.spec import JobSpec, Workload

from sim_helpers import GENERIC

Q, R = JobStatus.QUEUED, JobStatus.RUNNING
NO_FAILURES = SimParams(failures=FailureParams(failures_per_gpu_day=0.0))

# (GPUs per worker, requested GPUs, max workers, work in 1-GPU seconds): every worker size on
# 8-GPU nodes, requests of one worker and of several, some wider than a node
MIXED = [(1, 1, 8, 3_000.0), (4, 8, 4, 20_000.0), (2, 4, 4, 8_000.0), (8, 8, 2, 16_000.0),
         (1, 3, 8, 6_000.0), (2, 6, 4, 12_000.0), (4, 4, 4, 10_000.0), (8, 16, 2, 30_000.0),
         (1, 4, 8, 9_000.0), (2, 2, 4, 4_000.0), (4, 12, 4, 24_000.0), (1, 2, 8, 2_000.0),
         (8, 8, 2, 12_000.0), (2, 8, 4, 14_000.0), (4, 4, 2, 6_000.0), (1, 1, 8, 1_500.0)]


def mixed_scenario(rows: list[tuple[int, int, int, float]], nodes: int, gpus: int,
                   every_s: float = 400.0) -> Scenario:
    """Generic-speed jobs of `rows` submitted every `every_s` on `nodes` x `gpus`."""
    jobs = tuple(JobSpec(f"j{i}-k{k}", i * every_s, requested, work, 1, max_workers, 30.0,
                         gpus_per_worker=k)
                 for i, (k, requested, max_workers, work) in enumerate(rows))
    return Scenario(uniform_cluster(nodes, gpus), Workload("mixed", jobs),
                    (GENERIC,) * len(jobs))


def check_state(state: ClusterState) -> None:
    """No node over-allocated and every worker whole on its node."""
    nodes, jobs = state.nodes, state.jobs
    used = np.zeros(nodes.count, dtype=np.int64)
    for placement, k in zip(jobs.placement, jobs.gpus_per_worker.tolist(), strict=True):
        counts = np.bincount(np.asarray(placement, dtype=np.int64), minlength=nodes.count)
        assert (counts * k <= nodes.gpus_total).all(), ("worker split", placement, k)
        used += counts * k
    assert (nodes.gpus_free >= 0).all(), "negative free GPUs"
    assert (used <= nodes.gpus_total).all(), "GPU over-allocated"
    up = nodes.ready
    assert (used[up] + nodes.gpus_free[up] == nodes.gpus_total[up]).all(), "GPUs not conserved"


def checked(sim: Simulator, act: Callable[[ClusterState], Action],
            seen: list[tuple[ClusterState, Action]]) -> Callable[[ClusterState], Action]:
    """`act`, checking every state it sees and that every action it takes is valid there."""

    def decide(state: ClusterState) -> Action:
        check_state(state)
        action = act(state)
        assert sim.validate(action) == "", (action, sim.validate(action))
        if action.kind != ActionKind.NOOP:
            seen.append((state, action))
        return action

    return decide


@pytest.mark.parametrize("name", list(HEURISTICS))
def test_heuristic_runs_a_mixed_worker_workload_to_completion(name):
    sim = mixed_scenario(MIXED, 4, 8).simulator(NO_FAILURES, seed=0)
    sim.schedule_failure("node-0001", 3_000.0, warning_lead_s=1_200.0)  # restarts, evacuations
    seen: list[tuple[ClusterState, Action]] = []
    assert sim.run(checked(sim, load_policy(name).act, seen))
    check_state(sim.state())
    assert sim.accounting.jobs_completed == len(MIXED) and sim.invalid_actions == 0
    assert sim.accounting.failures >= 1
    for state, action in seen:
        row = state.job_index(action.job_id)
        assert action.workers == len(action.nodes)
        if name in ("static", "tiresias") and action.workers:
            assert action.workers == requested_workers(state, row)


def test_the_planner_runs_a_mixed_worker_workload_to_completion():
    """Its forks (copies rebuilt from the state) hold the same workers as the run."""
    scenario = mixed_scenario(MIXED, 4, 8, every_s=100.0)  # arrivals close enough to contest
    sim = scenario.simulator(NO_FAILURES, seed=0)
    base = ElasticPolicy(ElasticConfig(remaining_power=0.25), "base")
    alternatives = [ElasticPolicy(ElasticConfig(remaining_power=0.5)), ElasticPolicy()]
    history = HistoryArrivals.of_scenarios([scenario], 1e9, samples=1, seed=0)
    planner = planning_policy(base, alternatives, history, "planner")
    seen: list[tuple[ClusterState, Action]] = []
    assert sim.run(checked(sim, planner.act, seen))
    assert sim.accounting.jobs_completed == len(MIXED) and sim.invalid_actions == 0
    assert planner.contested > 0


def test_a_planners_history_keeps_each_jobs_worker_size():
    """The jobs its futures are drawn from are saved and read back with their workers' GPUs."""
    scenario = mixed_scenario(MIXED, 4, 8)
    jobs, _ = history_arrivals(history_rows(scenario))
    assert [j.gpus_per_worker for j in jobs] == [k for k, *_ in MIXED]
    assert [(j.requested_gpus, j.max_workers) for j in jobs] == [(r, m) for _, r, m, _ in MIXED]


# ---------------------------------------------------------------------------- hand-made states
def make_state(node_free: list[int], jobs: list[JobInfo], gpus_per_node: int = 4,
               warned: tuple[int, ...] = ()) -> ClusterState:
    """Nodes node-0.. with the given free GPUs; jobs as given (placements must agree)."""
    nodes = [NodeInfo(f"node-{i}", gpus_per_node, free, xid_errors_5m=3 if i in warned else 0)
             for i, free in enumerate(node_free)]
    return ClusterState(10_000.0, Nodes.from_records(nodes), Jobs.from_records(jobs), Demand())


def job(job_id: str, status: JobStatus, requested: int, k: int = 1,
        placement: tuple[int, ...] = (), submit_s: float = 0.0, max_workers: int = 16,
        min_workers: int = 1, **kw: object) -> JobInfo:
    """A job of `requested` GPUs in workers of `k` GPUs, on `placement` (a node per worker)."""
    return JobInfo(job_id, status, submit_s, requested, min_workers, max_workers,
                   workers=len(placement), placement=placement, gpus_per_worker=k, **kw)


def test_static_gives_each_worker_of_a_two_node_request_a_whole_node():
    state = make_state([4, 4], [job("a", Q, 8, k=4)])
    action = StaticPolicy().act(state)
    assert (action.job_id, action.workers, action.nodes) == ("a", 2, ("node-0", "node-1"))


def test_static_waits_when_the_free_gpus_hold_fewer_workers_than_requested():
    # 7 GPUs free, 8 asked for in 4-GPU workers: one worker fits, the request does not
    running = job("r", R, 1, placement=(1,))
    state = make_state([4, 3], [running, job("a", Q, 8, k=4, submit_s=1.0)])
    assert StaticPolicy().act(state) == NOOP


def test_tiresias_starts_a_request_in_workers():
    state = make_state([4, 4], [job("a", Q, 8, k=4)])
    action = TiresiasPolicy().act(state)
    assert (action.job_id, action.workers, action.nodes) == ("a", 2, ("node-0", "node-1"))


def test_tiresias_preempts_a_multi_gpu_job_that_attained_more_service():
    long_run = job("old", R, 4, k=4, placement=(0,), attained_gpu_s=4 * 20_000.0,
                   run_s=20_000.0)
    state = make_state([0], [long_run, job("new", Q, 4, k=4, submit_s=9_000.0)])
    assert TiresiasPolicy().act(state) == Action(ActionKind.SCALE, "old", 0, ())
    after = make_state([4], [job("old", Q, 4, k=4, attained_gpu_s=4 * 20_000.0,
                                 run_s=20_000.0), job("new", Q, 4, k=4, submit_s=9_000.0)])
    action = TiresiasPolicy().act(after)
    assert (action.job_id, action.workers, action.nodes) == ("new", 1, ("node-0",))


def test_tiresias_skips_a_worker_no_node_holds_and_starts_the_next_job():
    # 6 GPUs free as 3 + 3: the 4-GPU worker fits no node, the two 1-GPU workers do
    holders = [job("x", R, 1, placement=(0,), attained_gpu_s=10.0),
               job("y", R, 1, placement=(1,), attained_gpu_s=10.0)]
    state = make_state([3, 3], [*holders, job("big", Q, 4, k=4, submit_s=1.0),
                                job("small", Q, 2, submit_s=2.0)])
    action = TiresiasPolicy().act(state)
    assert (action.job_id, action.workers) == ("small", 2)


def test_elastic_gives_no_worker_where_no_node_has_its_gpus_free():
    # 3 GPUs free on every node (6 in all): a 4-GPU worker fits nowhere
    holders = [job(name, R, 1, placement=(node,), max_workers=1)
               for node, name in enumerate("xy")]
    state = make_state([3, 3], [*holders, job("c", Q, 4, k=4, max_workers=2)])
    for name in HEURISTICS:
        if isinstance(policy := load_policy(name), ElasticPolicy):
            assert policy.act(state) == NOOP, name
    freed = make_state([3, 4], [holders[0], job("c", Q, 4, k=4, max_workers=2)])
    action = ElasticPolicy().act(freed)
    assert (action.job_id, action.workers, action.nodes) == ("c", 1, ("node-1",))


def test_elastic_values_a_worker_as_its_gpus():
    """12 GPUs; `x` (4-GPU workers) scales worse per GPU than `y` (1-GPU workers): after each
    job's smallest size, the 7 GPUs left all go to `y`, though `x` gains most per worker."""
    x = job("x", Q, 4, k=4, max_workers=2, scaling_alpha=0.1, scaling_beta=0.0)
    y = job("y", Q, 1, max_workers=8, scaling_alpha=0.05, scaling_beta=0.0, submit_s=1.0)
    state = make_state([4, 4, 4], [x, y])
    policy = ElasticPolicy(ElasticConfig(worker_levels=(1, 2, 4, 8)))
    table = policy.size_table(state)
    assert table.of(0).tolist() == [1, 2]
    np.testing.assert_allclose(table.speedups[0, :2], [4 / 1.3, 8 / 1.7])  # n counts GPUs
    target = policy.targets(state, table)
    assert target.tolist() == [1, 8]
    assert int((target * state.jobs.gpus_per_worker).sum()) == gpu_budget(state) == 12


def test_elastic_grows_a_job_by_whole_workers_onto_a_node_that_holds_them():
    # `g` runs one 4-GPU worker on node-0; node-1 has 3 free, node-2 all 4: it grows there
    g = job("g", R, 4, k=4, placement=(0,), max_workers=2, scaling_alpha=0.0,
            scaling_beta=0.0, progress=0.1, run_s=1_000.0)
    state = make_state([0, 3, 4], [g, job("h", R, 1, placement=(1,), max_workers=1)])
    action = ElasticPolicy().act(state)
    assert (action.job_id, action.workers, action.nodes) == ("g", 2, ("node-0", "node-2"))


def test_reactive_restarts_a_failed_job_on_the_whole_workers_that_fit():
    failed = job("f", Q, 8, k=4, max_workers=2, run_s=500.0, progress=0.2)
    holders = [job("p", R, 1, placement=(1,), max_workers=1),
               job("q", R, 2, placement=(2, 2), max_workers=2, min_workers=2)]
    state = make_state([4, 3, 2], [failed, *holders])
    action = load_policy("reactive").act(state)
    assert (action.job_id, action.workers, action.nodes) == ("f", 1, ("node-0",))


def test_proactive_moves_a_multi_gpu_worker_to_a_node_that_holds_it_whole():
    on_warned = job("m", R, 4, k=4, placement=(0,), max_workers=1)
    holder = job("h", R, 1, placement=(1,), max_workers=1)
    state = make_state([0, 3, 4], [on_warned, holder], warned=(0,))
    action = load_policy("proactive").act(state)
    assert (action.kind, action.job_id, action.nodes, action.from_node) == (
        ActionKind.MIGRATE, "m", ("node-2",), "node-0")


def test_profiled_speedups_take_a_workers_gpus_on_its_node():
    assert assumed_shape(3, 2, 8, gpus_per_worker=4) == (8, 4)
    assert assumed_shape(3, 3, 8, gpus_per_worker=2) == (2, 2, 2)
    assert assumed_shape(2, 2, 6, gpus_per_worker=4) == (4, 4)  # one worker per 6-GPU node
    measured = {(8, 4): 9.0, (4, 4): 7.0, (4,): 4.0, (1,): 1.0}
    state = make_state([4, 4], [job("a", Q, 8, k=4, scaling_alpha=0.0, scaling_beta=0.0)])
    speedups = ProfiledSpeedups({curve_key(1.0, 0.0, 0.0): measured.__getitem__})
    got = speedups(state, np.array([0, 0]), np.array([1, 2]), np.array([1, 2]))
    np.testing.assert_allclose(got, [4.0, 7.0])
    assert math.isclose(float(ElasticPolicy(speedups=speedups)._speedup(state, 0, 2)), 7.0)
