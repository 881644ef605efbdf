"""The baselines behave as named, on tiny hand-made clusters whose right answer is obvious."""

from __future__ import annotations

import numpy as np
import pytest

from rlalloc.agent.catalogue import HEURISTICS
from rlalloc.agent.heuristics import (
    ElasticConfig,
    ElasticPolicy,
    StaticPolicy,
    TiresiasConfig,
    TiresiasPolicy,
    gpu_budget,
)
from rlalloc.agent.policy import Policy
from rlalloc.agent.registry import load_policy
from rlalloc.env.failures import FailureParams
from rlalloc.env.params import SimParams
from rlalloc.env.scenario import build_scenario
from rlalloc.env.state import (
    NOOP,
    ActionKind,
    ClusterState,
    Demand,
    JobInfo,
    Jobs,
    JobStatus,
    NodeInfo,
    Nodes,
)

Q, R = JobStatus.QUEUED, JobStatus.RUNNING


def make_state(node_free: list[int], jobs: list[JobInfo], time_s: float = 10_000.0,
               warned: tuple[int, ...] = (), gpus_per_node: int = 4) -> ClusterState:
    """Nodes node-0.. with the given free GPUs; jobs as given (placements must agree)."""
    nodes = [NodeInfo(f"node-{i}", gpus_per_node, free, xid_errors_5m=3 if i in warned else 0)
             for i, free in enumerate(node_free)]
    return ClusterState(time_s, Nodes.from_records(nodes), Jobs.from_records(jobs), Demand())


def job(job_id: str, status: JobStatus, requested: int, placement: tuple[int, ...] = (),
        submit_s: float = 0.0, max_workers: int = 16, min_workers: int = 1,
        **kw: object) -> JobInfo:
    return JobInfo(job_id, status, submit_s, requested, min_workers, max_workers,
                   workers=len(placement), placement=placement, **kw)


def test_every_heuristic_satisfies_the_protocol():
    for name in HEURISTICS:
        policy = load_policy(name)
        assert isinstance(policy, Policy) and policy.name == name


def test_static_starts_the_head_job_with_exactly_its_request():
    state = make_state([4, 4], [job("a", Q, 4, submit_s=1.0), job("b", Q, 1, submit_s=2.0)])
    action = StaticPolicy().act(state)
    assert action.kind == ActionKind.SCALE and action.job_id == "a" and action.workers == 4
    assert set(action.nodes) == {"node-0"} or set(action.nodes) == {"node-1"}  # packed


def test_static_is_strict_fifo_no_backfill():
    # 3 free GPUs: the head job wants 4, so the 1-GPU job behind it must wait too
    state = make_state([3, 0], [job("big", Q, 4, submit_s=1.0), job("small", Q, 1, submit_s=2.0),
                                job("r", R, 4, placement=(1, 1, 1, 1), submit_s=0.0)])
    assert StaticPolicy().act(state) == NOOP


def test_static_never_resizes_running_jobs():
    # a running 1-GPU job with 7 idle GPUs around it stays at 1 GPU
    state = make_state([3, 4], [job("r", R, 1, placement=(0,), scaling_alpha=0.0,
                                    scaling_beta=0.0)])
    assert StaticPolicy().act(state) == NOOP


def test_tiresias_preempts_a_long_running_job_for_a_new_one():
    long_running = job("old", R, 8, placement=(0,) * 4 + (1,) * 4, submit_s=0.0,
                       attained_gpu_s=200_000.0, run_s=25_000.0)
    new = job("new", Q, 4, submit_s=9_000.0)
    state = make_state([0, 0], [long_running, new])
    action = TiresiasPolicy().act(state)
    assert action.kind == ActionKind.SCALE and action.job_id == "old" and action.workers == 0
    # once the old job is suspended, the new one starts on its request
    suspended = job("old", Q, 8, submit_s=0.0, attained_gpu_s=200_000.0, run_s=25_000.0)
    after = make_state([4, 4], [suspended, new])
    action = TiresiasPolicy().act(after)
    assert action.job_id == "new" and action.workers == 4


def test_tiresias_is_fifo_within_a_queue_and_does_not_preempt_peers():
    first = job("first", R, 8, placement=(0,) * 4 + (1,) * 4, submit_s=0.0,
                attained_gpu_s=1_000.0, run_s=125.0)
    second = job("second", Q, 4, submit_s=100.0)
    # both in the top queue: the running older job keeps its GPUs
    assert TiresiasPolicy().act(make_state([0, 0], [first, second])) == NOOP


def test_tiresias_skips_a_job_that_does_not_fit_and_starts_the_next():
    # Tiresias' scheduler walks the priority order past jobs too big for the cluster: the
    # 8-GPU head job can never fit 4 GPUs, so the 2-GPU job behind it starts (static waits)
    state = make_state([4], [job("big", Q, 8, submit_s=0.0), job("small", Q, 2, submit_s=1.0)])
    action = TiresiasPolicy().act(state)
    assert action.job_id == "small" and action.workers == 2
    assert StaticPolicy().act(state) == NOOP


def test_tiresias_never_preempts_a_restoring_job():
    # a demoted job that is still restoring keeps its GPUs (it has not had its lease yet); the
    # same job running is preempted for the new top-queue job
    def state_with(status: JobStatus) -> ClusterState:
        demoted = job("demoted", status, 4, placement=(0,) * 4, submit_s=0.0,
                      attained_gpu_s=200_000.0, run_s=20_000.0)
        return make_state([0], [demoted, job("new", Q, 4, submit_s=9_000.0)])

    assert TiresiasPolicy().act(state_with(JobStatus.RESTARTING)) == NOOP
    action = TiresiasPolicy().act(state_with(R))
    assert action.job_id == "demoted" and action.workers == 0


def test_tiresias_promotes_a_starving_job():
    demoted = job("starved", Q, 4, submit_s=0.0, attained_gpu_s=80_000.0, run_s=1_000.0)
    fresh = job("fresh", R, 4, placement=(0,) * 4, submit_s=9_500.0, attained_gpu_s=400.0,
                run_s=100.0)
    # waited 9,000 s >= 8 x 1,000 s run: promoted above the fresh top-queue job, FIFO first
    policy = TiresiasPolicy(TiresiasConfig(promote_knob=8.0))
    order = policy.priority_order(make_state([0], [demoted, fresh]))
    assert order.tolist() == [0, 1]


def test_elastic_gives_a_spare_gpu_to_the_job_that_scales_best():
    linear = job("linear", R, 1, placement=(0,), scaling_alpha=0.0, scaling_beta=0.0,
                 progress=0.5, run_s=5_000.0, restore_s=10.0)
    flat = job("flat", R, 1, placement=(1,), scaling_alpha=2.0, scaling_beta=2.0,
               progress=0.5, run_s=5_000.0, restore_s=10.0)
    state = make_state([1, 3], [linear, flat], gpus_per_node=4)
    targets = ElasticPolicy().targets(state)
    assert targets[0] > 1 and targets[1] == 1
    action = ElasticPolicy().act(state)
    assert action.kind == ActionKind.SCALE and action.job_id == "linear" and action.workers > 1


def test_elastic_srpt_gives_the_spare_gpu_to_the_job_nearest_completion():
    # equal scaling: elastic breaks the tie by age, elastic-srpt by remaining work
    early = job("early", R, 1, placement=(0,), submit_s=0.0, scaling_alpha=0.0,
                scaling_beta=0.0, progress=0.1, run_s=1_000.0, restore_s=10.0)
    nearly = job("nearly", R, 1, placement=(1,), submit_s=100.0, scaling_alpha=0.0,
                 scaling_beta=0.0, progress=0.9, run_s=9_000.0, restore_s=10.0)
    state = make_state([0, 0, 1], [early, nearly], gpus_per_node=1)
    assert ElasticPolicy().targets(state).tolist() == [2, 1]
    assert load_policy("elastic-srpt").targets(state).tolist() == [1, 2]
    action = load_policy("elastic-srpt").act(state)
    assert action.job_id == "nearly" and action.workers == 2


def test_elastic_does_not_resize_when_the_restore_costs_more_than_it_saves():
    # 90% done after 9,000 s: ~1,000 s left; a 2,000 s restore cannot pay for itself
    nearly_done = job("done-soon", R, 1, placement=(0,), scaling_alpha=0.0, scaling_beta=0.0,
                      progress=0.9, run_s=9_000.0, restore_s=2_000.0)
    assert ElasticPolicy().act(make_state([3], [nearly_done])) == NOOP


@pytest.mark.parametrize("name", ["elastic", "reactive", "proactive", "elastic-srpt"])
def test_elastic_does_not_grow_a_job_whose_work_is_done(name):
    # the actuator reads progress 1.0 while a finished trainer saves its last checkpoint: no
    # time left to save, so no grow (the grow rule divided by that 0 and crashed)
    done = job("done", R, 1, placement=(0,), scaling_alpha=0.0, scaling_beta=0.0,
               progress=1.0, run_s=9_000.0, restore_s=10.0)
    assert load_policy(name).act(make_state([3], [done])) == NOOP
    # the same job with work left does grow: the 0 is what stops it
    busy = job("busy", R, 1, placement=(0,), scaling_alpha=0.0, scaling_beta=0.0,
               progress=0.5, run_s=9_000.0, restore_s=10.0)
    assert load_policy(name).act(make_state([3], [busy])).workers == 4


def test_elastic_shrinks_a_wide_job_to_admit_a_queued_one():
    wide = job("wide", R, 4, placement=(0, 0, 0, 0), scaling_alpha=0.1, scaling_beta=0.1,
               progress=0.5, run_s=1_000.0)
    state = make_state([0], [wide, job("queued", Q, 1, submit_s=5_000.0)])
    action = ElasticPolicy().act(state)
    assert action.job_id == "wide" and 1 <= action.workers < 4


def test_reactive_restarts_a_failed_job_at_once_on_fewer_gpus():
    # the failed job asked for 4; only 2 are free: reactive restarts it on 2 right away
    failed = job("failed", Q, 4, submit_s=0.0, run_s=3_000.0, progress=0.3,
                 attained_gpu_s=12_000.0, restarts=1)
    other = job("other", R, 2, placement=(0, 0), submit_s=10.0, run_s=3_000.0, progress=0.3,
                scaling_alpha=5.0, scaling_beta=5.0)
    state = make_state([2], [failed, other])
    action = load_policy("reactive").act(state)
    assert action.job_id == "failed" and action.workers == 2


def test_proactive_plans_a_failed_job_first_as_reactive_does():
    # no node at risk: proactive is reactive; it ranked the failed job (much attained service)
    # last among the queued, and restarted it on 1 GPU instead of 2
    failed = job("failed", Q, 4, attained_gpu_s=50_000.0, run_s=3_000.0, progress=0.3)
    new = [job(f"new-{i}", Q, 1, submit_s=100.0 + i) for i in range(4)]
    state = make_state([4, 4], [failed, *new])
    reactive, proactive = load_policy("reactive"), load_policy("proactive")
    assert proactive.targets(state).tolist() == reactive.targets(state).tolist()
    assert proactive.act(state) == reactive.act(state)
    assert reactive.act(state).job_id == "failed"


def test_proactive_moves_a_job_off_a_warned_node():
    on_warned = job("victim", R, 2, placement=(0, 0), run_s=600.0, progress=0.2)
    state = make_state([2, 4], [on_warned], warned=(0,))
    action = load_policy("proactive").act(state)
    assert action.kind == ActionKind.MIGRATE and action.from_node == "node-0"
    assert "node-0" not in action.nodes and len(action.nodes) == 2
    # the non-proactive variants leave it where it is
    assert load_policy("reactive").act(state).kind != ActionKind.MIGRATE


def test_proactive_moves_a_job_past_a_node_at_risk_by_its_score_alone():
    # node-1 is the tightest fit but at risk by score (not warned); node-2 is healthy: the move
    # went nowhere, since every placement found landed on node-1
    on_warned = job("victim", R, 4, placement=(0,) * 4, run_s=600.0, progress=0.2)
    nodes = Nodes.from_records([NodeInfo("node-0", 4, 0, xid_errors_5m=3),
                                NodeInfo("node-1", 4, 4, failure_risk=0.6),
                                NodeInfo("node-2", 4, 4)])
    state = ClusterState(10_000.0, nodes, Jobs.from_records([on_warned]), Demand())
    action = load_policy("proactive").act(state)
    assert (action.kind, action.nodes, action.from_node) == (
        ActionKind.MIGRATE, ("node-2",) * 4, "node-0")


@pytest.mark.parametrize("name", list(HEURISTICS))
def test_heuristic_runs_a_workload_to_completion(name):
    scenario = build_scenario("synthetic:40:1.2", "4x4", seed=1)
    sim = scenario.simulator(seed=1)
    sim.run(load_policy(name).act)
    summary = sim.accounting.summary()
    assert summary["jobs_completed"] == 40 and sim.invalid_actions == 0
    if name == "static":
        assert summary["restarts_per_job"] == 0.0


def test_static_allocations_match_requests_throughout():
    scenario = build_scenario("synthetic:30:1.0", "4x4", seed=2)
    sim = scenario.simulator(seed=2)
    policy = StaticPolicy()

    def checked(state: ClusterState):
        running = state.jobs.status != int(Q)
        assert np.array_equal(state.jobs.workers[running], state.jobs.requested_gpus[running])
        return policy.act(state)

    sim.run(checked)


def test_elastic_config_is_respected_for_levels():
    state = make_state([4, 4], [job("a", Q, 3, submit_s=0.0, max_workers=8,
                                    scaling_alpha=0.0, scaling_beta=0.0)])
    sizes = ElasticPolicy(ElasticConfig(worker_levels=(1, 2, 4))).size_table(state).of(0)
    assert sizes.tolist() == [1, 2, 3, 4]


def test_size_table_drops_duplicates_and_sizes_outside_min_max():
    state = make_state([8, 8], [job("a", Q, 4, submit_s=0.0, min_workers=2, max_workers=6),
                                job("b", Q, 3, submit_s=1.0, min_workers=3, max_workers=3)])
    table = ElasticPolicy(ElasticConfig(worker_levels=(1, 2, 4, 8))).size_table(state)
    assert table.of(0).tolist() == [2, 4]
    assert table.of(1).tolist() == [3]
    assert table.sizes[1].tolist() == [3, 0, 0, 0, 0]
    assert table.speedups[1, 1:].tolist() == [0.0] * 4


def _cordoned_node_0(jobs: list[JobInfo], free_on_node_1: int) -> ClusterState:
    """node-0 cordoned by an operator (maintenance) with its jobs still running there."""
    nodes = Nodes.from_records([NodeInfo("node-0", 4, 0, cordoned=True),
                                NodeInfo("node-1", 4, free_on_node_1)])
    return ClusterState(10_000.0, nodes, Jobs.from_records(jobs), Demand())


def test_elastic_gives_a_queued_job_all_it_can_use_beside_a_cordoned_nodes_job():
    # the job on the cordoned node holds its 4 GPUs there; the 4 free ones are all b's
    state = _cordoned_node_0([
        job("a", R, 4, placement=(0, 0, 0, 0), max_workers=4, run_s=1_000.0, progress=0.5,
            throughput=1.0),
        job("b", Q, 4, submit_s=100.0, max_workers=4)], free_on_node_1=4)
    policy = ElasticPolicy()
    assert policy.targets(state).tolist() == [4, 4]  # a is not planned to shrink
    action = policy.act(state)
    assert (action.job_id, action.workers, action.nodes) == ("b", 4, ("node-1",) * 4)


def test_tiresias_does_not_preempt_for_the_gpus_a_cordoned_node_holds():
    # both fit as they run: the cordoned node's job does not take the other's GPUs
    state = _cordoned_node_0([
        job("a", R, 4, placement=(0, 0, 0, 0), run_s=100.0, attained_gpu_s=400.0),
        job("c", R, 4, placement=(1, 1, 1, 1), submit_s=50.0, run_s=100.0,
            attained_gpu_s=400.0)], free_on_node_1=0)
    assert TiresiasPolicy().act(state) == NOOP


def test_a_failed_nodes_leftover_pods_add_nothing_to_the_budget():
    # the actuator still lists a job's pods on a node that went NotReady until they are evicted:
    # those GPUs are gone, not held, so the free node's 4 GPUs are all the budget
    nodes = Nodes.from_records([NodeInfo("node-0", 4, 0, ready=False, cordoned=True),
                                NodeInfo("node-1", 4, 4)])
    jobs = Jobs.from_records([job("a", R, 4, placement=(0, 0, 0, 0), run_s=100.0)])
    assert gpu_budget(ClusterState(10_000.0, nodes, jobs, Demand())) == 4


def test_another_tenants_gpus_are_not_in_the_budget():
    # node-1's 4 GPUs are held by a pod rlalloc does not manage (the actuator lists them as not
    # free): the long-running job's 4 are all there is, so the new job needs them
    long_running = job("old", R, 4, placement=(0,) * 4, attained_gpu_s=200_000.0, run_s=25_000.0)
    new = job("new", Q, 4, submit_s=9_000.0)
    state = make_state([0, 0], [long_running, new])
    assert gpu_budget(state) == 4
    action = TiresiasPolicy().act(state)
    assert (action.job_id, action.workers) == ("old", 0)
    assert ElasticPolicy().targets(state).tolist() == [2, 2]  # shared, not 4 each


def test_the_budget_of_a_simulated_cluster_is_every_usable_gpu():
    # the simulator has no other tenants and requeues a failed node's jobs at once, so its
    # figures do not depend on how the budget is counted
    params = SimParams(failures=FailureParams(failures_per_gpu_day=2.0))
    sim = build_scenario("synthetic:40:1.5", "4x4", seed=3).simulator(params, seed=3)
    seen_down = 0

    def decide(state: ClusterState):
        nonlocal seen_down
        usable = state.nodes.ready & ~state.nodes.cordoned
        assert gpu_budget(state) == int(state.nodes.gpus_total[usable].sum())
        seen_down += int(not state.nodes.ready.all())
        return ElasticPolicy().act(state)

    assert sim.run(decide)
    assert seen_down > 10
