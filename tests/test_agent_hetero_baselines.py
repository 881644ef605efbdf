"""The heterogeneity-aware baselines `gavel` and `sia` on hand-made states whose right answer
is known (worked out in each test), and in short simulations of a cluster that mixes T4 and
A100 nodes: they never exceed a type's GPUs, never place a job across types, survive a node
failure and finish every job."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from rlalloc.agent.gavel import GavelConfig, GavelPolicy, max_min_allocation
from rlalloc.agent.heuristics import ElasticPolicy
from rlalloc.agent.job_sizes import JobSizeHistory, curve_key
from rlalloc.agent.registry import load_policy
from rlalloc.agent.residual import residual_teachers
from rlalloc.agent.sia import (
    SiaPolicy,
    realloc_factors,
    sia_configurations,
    sia_gpu_counts,
    size_weights,
)
from rlalloc.agent.type_plans import Plan, TypeTable, next_action, round_solve_s
from rlalloc.env.cluster import parse_cluster
from rlalloc.env.failures import FailureParams
from rlalloc.env.params import SimParams
from rlalloc.env.profiles import cached_profiles, default_profiles_root
from rlalloc.env.scenario import Scenario, build_scenario, job_speeds
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
    TypeSpeeds,
)
from rlalloc.env.workload.spec import JobSpec, Workload

from sim_helpers import check_invariants

Q, R, RS = JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.RESTARTING
NO_FAILURES = SimParams(failures=FailureParams(failures_per_gpu_day=0.0))
POLICIES = ("gavel", "sia")


# ---------------------------------------------------------------------------- hand-made states
def job(job_id: str, status: JobStatus = Q, requested: int = 1, placement: tuple[int, ...] = (),
        low: int = 1, high: int = 1, k: int = 1, **kw: object) -> JobInfo:
    """A job of `requested` GPUs in workers of `k`, elastic over [low, high] workers."""
    return JobInfo(job_id, status, kw.pop("submit_s", 0.0), requested, low, high,
                   workers=len(placement), placement=placement, gpus_per_worker=k, **kw)


def mixed_state(jobs: list[JobInfo], speeds: list[tuple[float, float]], gpus: int = 1,
                free: tuple[int, int] | None = None, time_s: float = 10_000.0,
                alpha: float = 0.0, **node_kw: object) -> ClusterState:
    """One T4 node (node 0) and one A100 node (node 1) of `gpus` GPUs each; job j runs
    `speeds[j]` = (T4, A100) iterations/s on one GPU, scaling by `alpha` on both."""
    held = [0, 0]
    for j in jobs:
        for node in j.placement:
            held[node] += j.gpus_per_worker
    free = free or (gpus - held[0], gpus - held[1])
    nodes = Nodes.from_records([NodeInfo("t4", gpus, free[0], gpu_type="T4"),
                                NodeInfo("a100", gpus, free[1], gpu_type="A100", **node_kw)])
    n = len(jobs)
    table = TypeSpeeds(("T4", "A100"), np.asarray(speeds, dtype=np.float32),
                       np.full((n, 2), alpha, dtype=np.float32), np.zeros((n, 2), np.float32))
    return ClusterState(time_s, nodes, Jobs.from_records(jobs), Demand(), type_speeds=table)


def placed_type(state: ClusterState, action: Action) -> set[str]:
    """The GPU types of an action's nodes."""
    names = state.nodes.name
    return {state.nodes.gpu_type[names.index(n)] for n in action.nodes}


@pytest.mark.parametrize("name", POLICIES)
def test_the_a100_goes_to_the_job_that_gains_from_it(name):
    """`a` runs 10x faster on the A100, `b` 0.8x: the only max-min optimum (and Sia's) puts
    `a` on the A100 and `b` on the T4, and the first action starts `a` there."""
    state = mixed_state([job("a"), job("b")], [(1.0, 10.0), (1.0, 0.8)])
    policy = load_policy(name)
    assert policy.plan(state) == {"a": ("A100", 1), "b": ("T4", 1)}
    action = policy.act(state)
    assert (action.job_id, action.nodes) == ("a", ("a100",))


def test_sia_gives_the_a100_to_the_job_that_gains_ten_times():
    """10x against 1.2x: G ** -0.5 sums to 10 ** -0.5 + 1 = 1.32 with `a` on the A100,
    1 + 1.2 ** -0.5 = 1.91 the other way round, so Sia puts `a` there."""
    state = mixed_state([job("a"), job("b")], [(1.0, 10.0), (1.0, 1.2)])
    assert SiaPolicy().plan(state) == {"a": ("A100", 1), "b": ("T4", 1)}


def test_gavel_time_shares_the_a100_when_both_jobs_gain_from_it():
    """10x against 1.2x, normalised by each job's throughput on half of each type (5.5 and
    1.1): `a` on the A100 alone gives `b` only 1 / 1.1 = 0.91, and max-min equalises the two at
    y = 0.5 of the A100 each (1.82 - 1.64 y = 0.91 + 0.18 y). Rounds then alternate it: `a`
    first (ties go to the older row), then `b`, whose share of the A100 is now the smaller."""
    state = mixed_state([job("a"), job("b")], [(1.0, 10.0), (1.0, 1.2)])
    allocation = max_min_allocation(state, TypeTable.of(state))
    assert np.allclose(allocation["a"], [0.5, 0.5]) and np.allclose(allocation["b"], [0.5, 0.5])
    policy = GavelPolicy()
    assert _settle(policy, state) == {"a": "A100", "b": "T4"}
    after_a_round = mixed_state([job("a", R, placement=(1,)), job("b", R, placement=(0,))],
                                [(1.0, 10.0), (1.0, 1.2)], time_s=10_000.0 + 360.0)
    assert _settle(policy, after_a_round) == {"a": "T4", "b": "A100"}


def _settle(policy: object, state: ClusterState) -> dict[str, str]:
    """Apply `policy`'s actions to `state` by hand until it says no-op; each job's type."""
    placed = {j: state.nodes.gpu_type[p[0]] for j, p in zip(state.jobs.job_id,
                                                              state.jobs.placement, strict=True)
              if p}
    for _ in range(8):
        action = policy.act(state)
        if action == NOOP:
            return placed
        rows = [state.jobs.record(r) for r in range(state.jobs.count)]
        row = state.job_index(action.job_id)
        nodes = tuple(sorted(state.nodes.name.index(n) for n in action.nodes))
        status = R if nodes else Q
        rows[row] = job(action.job_id, status, placement=nodes,
                        submit_s=rows[row].submit_s)
        speeds = state.type_speeds.speed_1gpu.tolist()
        state = mixed_state(rows, speeds, time_s=state.time_s)
        if nodes:
            placed[action.job_id] = placed_type(state, action).pop()
        else:
            placed.pop(action.job_id, None)
    raise AssertionError("no no-op after 8 actions")


def test_sia_keeps_a_running_job_whose_restart_costs_more_than_the_a100_gains():
    """`b` runs on the T4 and would gain 1.2x on the idle A100. After 5 restarts of 150 s in
    1,000 s its re-allocation factor is (1000 - 750) / 1150 = 0.22, so the A100 is worth
    (1.2 * 0.22) ** -0.5 = 1.95 against staying's 1: it stays. A fresh job (factor ~1) moves:
    1.2 ** -0.5 = 0.91 < 1."""
    tired = job("b", R, placement=(0,), restarts=5, restore_s=150.0, submit_s=9_000.0)
    state = mixed_state([tired], [(1.0, 1.2)])
    assert realloc_factors(state)[0] == pytest.approx(250.0 / 1150.0)
    assert SiaPolicy().plan(state) == {"b": ("T4", 1)}
    assert SiaPolicy().act(state) == NOOP
    fresh = job("b", R, placement=(0,), restarts=0, restore_s=150.0, submit_s=-1e6)
    moved = SiaPolicy().act(mixed_state([fresh], [(1.0, 1.2)]))
    assert (moved.job_id, moved.nodes) == ("b", ("a100",))


def test_sia_keeps_a_restoring_job_where_it_is():
    """A job restoring from its checkpoint keeps its configuration (Sia's constraint) even
    where a move would pay."""
    restoring = job("b", RS, placement=(0,), submit_s=-1e6)
    state = mixed_state([restoring], [(1.0, 5.0)])
    assert SiaPolicy().plan(state) == {"b": ("T4", 1)}


def test_sia_configurations_follow_its_gpu_counts_in_whole_workers():
    """On 4-GPU nodes Sia's counts are 1, 2, 4, then whole nodes; a job of 2-GPU workers
    takes those that are whole workers within its range; a rigid job (min = max) its one
    size, normalised so the slowest type is worth its GPUs."""
    assert sia_gpu_counts(4, 3) == [1, 2, 4, 8, 12]
    assert sia_gpu_counts(8, 2) == [1, 2, 4, 8, 16]
    state = mixed_state([job("pairs", requested=4, low=1, high=8, k=2),
                         job("rigid", requested=3, low=3, high=3)],
                        [(1.0, 2.0), (1.0, 3.0)], gpus=4)
    configs = sia_configurations(state, TypeTable.of(state))
    pairs = configs.row == 0
    assert configs.workers[pairs].tolist() == [1, 2, 1, 2]  # 2 and 4 GPUs on each type
    assert configs.goodput[pairs][0] == pytest.approx(2.0)  # its lowest = its worker's GPUs
    rigid = configs.row == 1
    assert configs.workers[rigid].tolist() == [3, 3]
    assert configs.goodput[rigid].tolist() == pytest.approx([3.0, 9.0])


@pytest.mark.parametrize("name", POLICIES)
def test_plans_fit_each_type_and_leave_no_job_waiting_that_fits(name):
    """Five elastic jobs on 4 T4 + 4 A100 GPUs: every job is planned (Sia's lambda_n, Gavel's
    greedy), no type gets more GPUs than it has, and the first action is on one type."""
    jobs = [job(f"j{i}", low=1, high=4, submit_s=float(i)) for i in range(5)]
    state = mixed_state(jobs, [(1.0, 1.0 + i) for i in range(5)], gpus=4, alpha=0.05)
    plan = load_policy(name).plan(state)
    assert set(plan) == {f"j{i}" for i in range(5)}
    for gpu_type in ("T4", "A100"):
        assert sum(w for t, w in plan.values() if t == gpu_type) <= 4
    action = load_policy(name).act(state)
    assert action.kind == ActionKind.SCALE and len(placed_type(state, action)) == 1


@pytest.mark.parametrize("name", POLICIES)
def test_a_cordoned_type_gets_no_new_job(name):
    """The A100 node is cordoned: both jobs go to the T4s, the faster one first."""
    state = mixed_state([job("a"), job("b")], [(1.0, 10.0), (1.0, 5.0)], gpus=2, free=(2, 0),
                        cordoned=True)
    assert load_policy(name).plan(state) == {"a": ("T4", 1), "b": ("T4", 1)}


@pytest.mark.parametrize("name", POLICIES)
def test_one_type_clusters_work_without_type_speeds(name):
    """On a one-type cluster the state has no `TypeSpeeds`: the jobs' own curves are used."""
    nodes = Nodes.from_records([NodeInfo(f"n{i}", 4, 4) for i in range(2)])
    jobs = Jobs.from_records([job("a", requested=2, low=1, high=8, scaling_alpha=0.02),
                              job("b", requested=4, low=1, high=8, k=2, scaling_alpha=0.3)])
    state = ClusterState(100.0, nodes, jobs, Demand())
    plan = load_policy(name).plan(state)
    assert set(plan) == {"a", "b"} and all(t == "T4" for t, _ in plan.values())
    assert plan["a"][1] + 2 * plan["b"][1] <= 8


def test_two_moves_that_wait_on_each_other_are_untangled():
    """The plan swaps `a` (on the T4) and `b` (on the A100) on full one-GPU nodes: neither
    move fits, so one job is suspended, the other moves, and the first starts on its type."""
    state = mixed_state([job("a", R, placement=(0,)), job("b", R, placement=(1,))],
                        [(1.0, 1.0), (1.0, 1.0)])
    plan: Plan = {"a": ("A100", 1), "b": ("T4", 1)}
    assert next_action(state, plan) == Action(ActionKind.SCALE, "a", 0, ())
    state = mixed_state([job("a"), job("b", R, placement=(1,))], [(1.0, 1.0), (1.0, 1.0)])
    assert next_action(state, plan) == Action(ActionKind.SCALE, "b", 1, ("t4",))
    state = mixed_state([job("a"), job("b", R, placement=(0,))], [(1.0, 1.0), (1.0, 1.0)])
    assert next_action(state, plan) == Action(ActionKind.SCALE, "a", 1, ("a100",))


@pytest.mark.parametrize("name", POLICIES)
def test_solving_is_deterministic_and_timed(name):
    jobs = [job(f"j{i}", requested=1 + i % 3, low=1, high=4, submit_s=float(i))
            for i in range(9)]
    state = mixed_state(jobs, [(1.0, 1.0 + 0.5 * i) for i in range(9)], gpus=4, alpha=0.1)
    assert load_policy(name).plan(state) == load_policy(name).plan(state)
    assert round_solve_s(load_policy(name), state) > 0.0


@pytest.mark.parametrize(("round_s", "a100_job"), [(360.0, "a"), (60.0, "b")])
def test_gavel_keeps_a_rounds_schedule_until_the_round_ends(round_s, a100_job):
    """A minute after the first round's schedule (`a` on the A100), Gavel's 6-minute round
    still stands; a 1-minute round has ended and hands the A100 to `b`."""
    speeds = [(1.0, 10.0), (1.0, 1.2)]
    policy = GavelPolicy(GavelConfig(round_s=round_s))
    assert _settle(policy, mixed_state([job("a"), job("b")], speeds))["a"] == "A100"
    later = mixed_state([job("a", R, placement=(1,)), job("b", R, placement=(0,))], speeds,
                        time_s=10_060.0)
    assert _settle(policy, later)[a100_job] == "A100"


# ---------------------------------------------------------------------------- simulations
MIXED_CLUSTER = "1x4:T4+1x4:A100"


def generic_scenario() -> Scenario:
    """Ten generic jobs (one of 2-GPU workers, one rigid) on one T4 and one A100 node."""
    rows = [(1, 1, 4, 2_000.0), (2, 4, 2, 6_000.0), (1, 2, 4, 3_000.0), (1, 1, 4, 1_500.0),
            (1, 3, 3, 4_000.0), (1, 1, 4, 2_500.0), (1, 2, 4, 5_000.0), (1, 1, 4, 1_000.0),
            (2, 2, 2, 3_000.0), (1, 1, 4, 2_000.0)]
    jobs = tuple(JobSpec(f"j{i}", i * 300.0, requested, work,
                         high if i == 4 else 1, high, 30.0, gpus_per_worker=k)
                 for i, (k, requested, high, work) in enumerate(rows))
    cluster = parse_cluster(MIXED_CLUSTER)
    workload = Workload("mixed-types", jobs)
    return Scenario(cluster, workload, job_speeds(workload, None, ("T4", "A100")))


def checked_run(scenario: Scenario, name: str, fail_a100_at_s: float | None = None
                ) -> tuple[object, list[tuple[ClusterState, Action]]]:
    """Run `name` on `scenario`, checking every state and action on the way."""
    sim = scenario.simulator(NO_FAILURES, seed=0)
    if fail_a100_at_s is not None:
        sim.schedule_failure("node-0001", fail_a100_at_s)
    policy = load_policy(name)
    seen: list[tuple[ClusterState, Action]] = []

    def decide(state: ClusterState) -> Action:
        check_invariants(state)
        action = policy.act(state)
        assert sim.validate(action) == "", (action, sim.validate(action))
        if action.kind != ActionKind.NOOP:
            assert len(placed_type(state, action)) <= 1, action
            seen.append((state, action))
        return action

    assert sim.run(decide)
    return sim, seen


@pytest.mark.parametrize("name", POLICIES)
def test_a_mixed_cluster_runs_every_job_through_a_failure(name):
    scenario = generic_scenario()
    sim, seen = checked_run(scenario, name, fail_a100_at_s=1_200.0)
    assert sim.accounting.jobs_completed == len(scenario.workload.jobs)
    assert sim.invalid_actions == 0 and sim.accounting.failures >= 1  # jobs it stopped
    assert {t for state, action in seen for t in placed_type(state, action)} == {"T4", "A100"}
    again, _ = checked_run(scenario, name, fail_a100_at_s=1_200.0)  # deterministic
    assert again.accounting.summary() == sim.accounting.summary()


@pytest.mark.parametrize("name", POLICIES)
def test_the_job_that_gains_most_starts_on_the_a100(name):
    """bert runs 5.5x faster on an A100 than on a T4, ncf 0.75x: bert's first placement is on
    the A100; every job finishes."""
    profiles = cached_profiles(default_profiles_root())
    jobs = (JobSpec("bert", 0.0, 1, 3_000.0, 1, 4, 60.0, "bert", 12),
            JobSpec("ncf", 0.0, 1, 30_000.0, 1, 4, 60.0, "ncf", 256),
            JobSpec("yolov3", 100.0, 2, 300.0, 1, 4, 60.0, "yolov3", 8))
    workload = Workload("apps", jobs)
    scenario = Scenario(parse_cluster(MIXED_CLUSTER), workload,
                        job_speeds(workload, profiles, ("T4", "A100")))
    sim, seen = checked_run(scenario, name)
    assert sim.accounting.jobs_completed == 3
    first = next(action for _, action in seen if action.job_id == "bert")
    assert set(first.nodes) == {"node-0001"}


@pytest.mark.parametrize("name", POLICIES)
def test_a_lookahead_over_a_remembering_base_leaves_the_real_ones_memory_alone(name):
    """The planner runs its base in forks of the simulator: gavel's received time and sia's
    round plan learnt there must not leak into the real run (`for_a_fork` copies them)."""
    import copy

    from rlalloc.agent.lookahead import cost_to_go
    from rlalloc.agent.policy import for_a_fork

    policy = load_policy(name)
    assert for_a_fork(policy) is not policy
    elastic = load_policy("elastic")
    assert for_a_fork(elastic) is elastic  # a function of the state alone is shared
    sim = generic_scenario().simulator(SimParams(failures=FailureParams(
        failures_per_gpu_day=0.0)))
    sim.advance()
    policy.act(sim.state())
    before = copy.deepcopy(policy.__dict__)
    assert np.isfinite(cost_to_go(sim.fork(), for_a_fork(policy)))
    after = policy.__dict__
    assert before.keys() == after.keys()
    for key, value in before.items():
        assert repr(after[key]) == repr(value), key


def test_a_solvers_c_level_print_is_kept_off_stdout_and_stdout_comes_back(capfd):
    import ctypes

    from rlalloc.agent.type_plans import c_stdout_silenced

    libc = ctypes.CDLL(None)
    with c_stdout_silenced():
        libc.printf(b"HighsMipSolverData debug line\n")
    libc.printf(b"after\n")
    libc.fflush(None)
    assert capfd.readouterr().out == "after\n"


def test_a_residual_teacher_that_remembers_starts_each_episode_afresh():
    from rlalloc.agent.residual import make_residual
    from rlalloc.env.gym_env import ClusterAllocEnv

    def residual_env() -> ClusterAllocEnv:
        env = ClusterAllocEnv(("synthetic:30:2:2",), "2x4:T4+1x4:A100",
                              params=SimParams(failures=FailureParams(failures_per_gpu_day=0.0)))
        return make_residual(env, ("gavel", "elastic"))

    used, fresh = residual_env(), residual_env()
    used.reset(seed=5)
    for _ in range(300):  # gavel's rounds, received time and plan of a first episode
        used.step(used.featurizer.follow_index)
    assert used.sim.time_s > 6 * 60.0
    first, _ = used.reset(seed=9)  # the clock starts again at zero
    expected, _ = fresh.reset(seed=9)
    np.testing.assert_array_equal(first, expected)
    for _ in range(60):  # and the episodes go on alike
        first = used.step(used.featurizer.follow_index)[0]
        expected = fresh.step(fresh.featurizer.follow_index)[0]
        np.testing.assert_array_equal(first, expected)


def test_sia_keeps_running_jobs_where_waiting_ones_tie_with_them():
    """Eight identical one-GPU jobs, four GPUs: every way of running four of them costs the
    same once rounded, so the program's tie-break decides. Sia keeps the four that run where
    they are (`keep_bonus`); without it HiGHS swapped running and waiting jobs round after
    round (10 restarts per job on a light Sia-style workload)."""
    running = [job(f"r{i}", R, placement=(i % 2,), submit_s=5_000.0 + i) for i in range(4)]
    waiting = [job(f"w{i}", submit_s=9_000.0 + i) for i in range(4)]
    for order in (running + waiting, waiting + running):
        state = mixed_state(order, [(1.0, 1.0)] * 8, gpus=2)
        plan = SiaPolicy().plan(state)
        assert {j for j, (_, workers) in plan.items() if workers} == {f"r{i}" for i in range(4)}
        assert all(plan[f"r{i}"] == (("T4", "A100")[i % 2], 1) for i in range(4))


# ------------------------------------------------------------------------- sia told job sizes
def told(left: dict[str, float]) -> SiaPolicy:
    """`sia` told each job's remaining work by name (NaN: a job the table does not know)."""
    return SiaPolicy(remaining_work=lambda state, rows: np.array(
        [left.get(state.jobs.job_id[row], np.nan) for row in rows.tolist()]))


def test_sia_told_sizes_gives_the_a100_to_the_job_with_less_work_left():
    """Two jobs alike but in size, one 4-GPU T4 node and one 4-GPU A100 node (3x a T4): each
    takes a whole node, and which takes the A100 is all the program decides. Weighted by
    rank in remaining work (1 and 1/2), the A100 (cost -0.81 against the T4's -0.60) goes to
    the shorter job, whichever it is and in whichever order the jobs come."""
    jobs = [job("a", high=4), job("b", high=4)]
    for order in (jobs, jobs[::-1]):
        state = mixed_state(order, [(1.0, 3.0)] * 2, gpus=4)
        for short, long in (("a", "b"), ("b", "a")):
            plan = told({short: 600.0, long: 60_000.0}).plan(state)
            assert plan == {short: ("A100", 4), long: ("T4", 4)}


def test_sia_told_no_size_it_knows_plans_as_sia_does():
    """With every size unknown, every weight is 1: the plans are Sia's own, in the hand-made
    states above."""
    states = [mixed_state([job("a"), job("b")], [(1.0, 10.0), (1.0, 0.8)]),
              mixed_state([job("a", high=4), job("b", high=4)], [(1.0, 3.0)] * 2, gpus=4),
              mixed_state([job(f"r{i}", R, placement=(i % 2,)) for i in range(4)]
                          + [job(f"w{i}") for i in range(4)], [(1.0, 1.0)] * 8, gpus=2)]
    for state in states:
        assert told({}).plan(state) == SiaPolicy().plan(state)


def test_size_weights_rank_shortest_first_and_fill_unknown_sizes_with_the_median():
    weights = size_weights(np.array([30.0, 10.0, 20.0, 20.0]), 1.0)
    np.testing.assert_allclose(weights, [0.25, 1.0, 0.625, 0.625])  # tied jobs share a rank
    np.testing.assert_allclose(size_weights(np.array([5.0, np.nan, 1.0]), 2.0),
                               [(1 / 3) ** 2, (2 / 3) ** 2, 1.0])
    np.testing.assert_array_equal(size_weights(np.full(3, np.nan), 1.0), np.ones(3))


def test_sizes_fit_base_sia_saves_a_sia_that_runs_every_job(tmp_path):
    """`rlalloc sizes fit --base sia` on a past workload with named applications: the saved
    policy loads by path as a sia told that workload's sizes, and runs it on a mixed cluster
    to the end, every state valid."""
    trace = tmp_path / "past.csv"
    trace.write_text("job_id,submit_s,num_gpus,duration_s,application,batch_size\n"
                     "a,0,1,600,cifar10,128\nb,60,2,3600,bert,12\nc,120,1,1800,ncf,256\n"
                     "d,180,2,900,cifar10,128\n")
    out = tmp_path / "sia-sized"
    proc = subprocess.run([sys.executable, "-m", "rlalloc.cli.main", "sizes", "fit",
                           "--workload", str(trace), "--cluster", MIXED_CLUSTER, "--base", "sia",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    policy = load_policy(str(out))
    assert isinstance(policy, SiaPolicy) and policy.name == "sia-sized"
    scenario = build_scenario(str(trace), MIXED_CLUSTER)
    sim = scenario.simulator(NO_FAILURES, seed=0)
    sizes_seen = []

    def decide(state: ClusterState) -> Action:
        check_invariants(state)
        sizes_seen.append(policy.remaining_work(state, np.arange(state.jobs.count)))
        return policy.act(state)

    assert sim.run(decide) and sim.accounting.jobs_completed == 4
    assert all(np.isfinite(sizes).all() for sizes in sizes_seen if len(sizes))


def test_a_residual_sia_teacher_is_told_the_learnt_sizes():
    """`train --residual sia,... --learn-sizes`: the sia teacher plans with the table's sizes
    (the A100 to the job of the smaller kind, where sia told nothing gives it to the other);
    the elastic teacher is told them as before."""
    state = mixed_state([job("a", high=4), job("b", high=4)], [(1.0, 3.0)] * 2, gpus=4)
    kinds = {"a": (1.0, 0.0, 0.0), "b": (1.0, 0.1, 0.0)}  # two kinds of job, by speed curve
    state = ClusterState(state.time_s, state.nodes, Jobs.from_records(
        [job(name, high=4, speed_1gpu=speed, scaling_alpha=alpha, scaling_beta=beta)
         for name, (speed, alpha, beta) in kinds.items()]), Demand(),
        type_speeds=state.type_speeds)
    sizes = JobSizeHistory({curve_key(*kinds["a"]): 500.0, curve_key(*kinds["b"]): 50_000.0},
                           {curve_key(*kinds["a"]): 3, curve_key(*kinds["b"]): 3})
    sia, elastic = residual_teachers(("sia", "elastic"), sizes)
    assert isinstance(sia, SiaPolicy) and isinstance(elastic, ElasticPolicy)
    assert SiaPolicy().plan(state)["b"] == ("A100", 4)  # told nothing, sia's tie goes to b
    assert sia.plan(state) == {"a": ("A100", 4), "b": ("T4", 4)}
