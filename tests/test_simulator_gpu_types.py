"""Clusters that mix GPU types: speed by each type's profile, one type per job, a move between
types paid as a restart, and the fallback speeds where no profile exists."""

from __future__ import annotations

import numpy as np
import pytest

from rlalloc.env.cluster import parse_cluster
from rlalloc.env.errors import UserError
from rlalloc.env.failures import FailureParams
from rlalloc.env.gpu_types import RELATIVE_SPEED, fastest_first, reference_type
from rlalloc.env.params import GPU_POWER_W, SimParams
from rlalloc.env.placement import choose_nodes, job_gpu_type
from rlalloc.env.profiles import DEFAULT_PROFILES_ROOT, fit_relative_speeds, load_profiles
from rlalloc.env.scenario import build_scenario, job_speeds
from rlalloc.env.simulator import Simulator
from rlalloc.env.state import NOOP, Action, ActionKind, JobStatus, Strategy
from rlalloc.env.workload.spec import JobSpec, Workload

from sim_helpers import check_accounting, check_invariants, place_on_type

MIXED = "1x4:T4+1x4:A100"
NO_FAILURES = SimParams(failures=FailureParams(failures_per_gpu_day=0.0))


@pytest.fixture(scope="module")
def profiles():
    return load_profiles(DEFAULT_PROFILES_ROOT)


def _profiled(job_id: str, app: str, batch: int, gpus: int, submit_s: float = 0.0,
              profiles=None) -> JobSpec:
    work = profiles[app].work_iterations(batch)
    return JobSpec(job_id, submit_s, gpus, work, 1, 4, 50.0, application=app, batch_size=batch)


def _sim(cluster: str, jobs: list[JobSpec], profiles) -> Simulator:
    spec = parse_cluster(cluster)
    workload = Workload("w", tuple(jobs))
    speeds = job_speeds(workload, profiles, [n.gpu_type for n in spec.nodes])
    return Simulator(spec, workload, speeds, NO_FAILURES)


@pytest.mark.parametrize("app,batch", [("bert", 96), ("ncf", 4096), ("imagenet", 800)])
def test_a100_is_faster_than_t4_exactly_by_the_profiles_ratio(profiles, app, batch):
    sim = _sim(MIXED, [_profiled("a", app, batch, 2, profiles=profiles),
                       _profiled("b", app, batch, 2, profiles=profiles)], profiles)
    sim.advance()
    place_on_type(sim, "a", 2, "A100")
    place_on_type(sim, "b", 2, "T4")
    rate = dict(zip(sim.job_ids, sim.columns.rate, strict=True))
    on = profiles[app].on_type
    expected = (on["A100"].throughput(batch).iterations_per_s((2,))
                / on["T4"].throughput(batch).iterations_per_s((2,)))
    assert rate["a"] / rate["b"] == pytest.approx(expected, rel=1e-9)
    assert expected != pytest.approx(1.0, abs=0.05)  # the types really differ for this job


def test_state_carries_each_jobs_curve_per_type(profiles):
    jobs = [_profiled("a", "bert", 96, 2, profiles=profiles), _profiled("g", "ncf", 4096, 1,
                                                                         profiles=profiles)]
    sim = _sim("2x4:T4+1x8:A100+1x8:RTX2080Ti", jobs, profiles)
    sim.advance()
    state = sim.state()
    speeds = state.type_speeds
    assert speeds is not None and speeds.gpu_types == ("T4", "A100", "RTX2080Ti")
    for row, job_id in enumerate(state.jobs.job_id):
        speed = sim._speeds[sim.job_ids.index(job_id)]
        for col, gpu_type in enumerate(speeds.gpu_types):
            assert speeds.speed_1gpu[row, col] == pytest.approx(
                speed.on_type(gpu_type).iterations_per_s((1,)), rel=1e-6)
        # the jobs' own curve is the reference (slowest) type's
        assert state.jobs.speed_1gpu[row] == speeds.speed_1gpu[row, speeds.column("T4")]
    assert _sim("2x4", jobs, profiles).state().type_speeds is None


def test_a_job_never_spans_types_and_a_type_move_pays_its_restore(profiles):
    sim = _sim(MIXED, [_profiled("a", "cifar10", 256, 2, profiles=profiles)], profiles)
    sim.advance()
    state = sim.state()
    mixed = Action(ActionKind.SCALE, "a", 2, ("node-0000", "node-0001"))
    assert sim.validate(mixed).startswith("a job runs on one GPU type at a time")
    assert not sim.apply(mixed)
    place_on_type(sim, "a", 2, "T4")
    sim.advance()
    sim.advance()
    row = sim.job_ids.index("a")
    assert sim.columns.status[row] == JobStatus.RUNNING
    t, done_before = sim.time_s, sim._progress(row, sim.time_s)
    # growing keeps the job on its type unless the caller names another one
    state = sim.state()
    grown = choose_nodes(state, state.job_index("a"), 4, Strategy.PACKED)
    assert grown is not None and {state.nodes.gpu_type[n] for n in grown} == {"T4"}
    place_on_type(sim, "a", 2, "A100")
    assert sim.columns.status[row] == JobStatus.RESTARTING
    assert sim.columns.busy_from_s[row] == pytest.approx(t + 50.0)  # the restore, then A100
    assert sim.columns.done[row] == pytest.approx(done_before)  # checkpointed: nothing lost
    assert job_gpu_type(sim.state(), 0) == "A100"


def test_random_type_moves_keep_every_invariant_and_every_job_finishes(profiles):
    rng = np.random.default_rng(5)
    apps = [("bert", 96), ("cifar10", 256), ("ncf", 4096), ("imagenet", 800),
            ("deepspeech2", 40), ("yolov3", 64), ("gpt_pmp", 96)]
    jobs = []
    for i in range(24):
        app, batch = apps[i % len(apps)]
        spec = _profiled(f"j{i}", app, batch, 1, submit_s=i * 200.0, profiles=profiles)
        jobs.append(JobSpec(spec.job_id, spec.submit_s, spec.requested_gpus,
                            spec.work * 0.02, 1, 4, 30.0, app, batch))
    sim = _sim("2x4:T4+1x8:RTX2080Ti+1x8:A100", jobs, profiles)
    moves = 0

    def policy(state):
        nonlocal moves
        check_invariants(state)
        check_accounting(sim, state)
        for placement in state.jobs.placement:
            assert len({state.nodes.gpu_type[n] for n in placement}) <= 1
        if not state.jobs.count or rng.random() < 0.4:
            return NOOP
        row = int(rng.integers(state.jobs.count))
        gpu_type = str(rng.choice(state.nodes.type_names))
        workers = int(rng.integers(1, 5))
        nodes = choose_nodes(state, row, workers, Strategy.PACKED, gpu_type=gpu_type)
        if nodes is None or nodes == state.jobs.placement[row]:
            return NOOP
        moves += 1
        return Action(ActionKind.SCALE, state.jobs.job_id[row], workers,
                      tuple(state.nodes.name[n] for n in nodes))

    sim.run(policy)
    summary = sim.accounting.summary()
    assert summary["jobs_completed"] == len(jobs) and summary["invalid_actions"] == 0
    assert moves > 20


def test_a_job_without_a_profile_is_timed_on_the_slowest_type(profiles):
    generic = JobSpec("g", 0.0, 1, 100.0, 1, 1, 10.0)
    speed = job_speeds(Workload("w", (generic,)), profiles, ["A100", "T4", "H100"])[0]
    assert speed.speed_1gpu == 1.0  # on T4, the reference
    for gpu_type in ("A100", "H100"):
        assert speed.on_type(gpu_type).iterations_per_s((1,)) == pytest.approx(
            RELATIVE_SPEED[gpu_type])
    uniform = job_speeds(Workload("w", (generic,)), profiles, ["H100"])[0]
    assert uniform.by_type is None and uniform.iterations_per_s((1,)) == 1.0


def test_an_unprofiled_type_falls_back_to_the_nearest_measured_one(profiles):
    gpt = profiles["gpt_pmp"]
    assert set(gpt.on_type) == {"RTX2080Ti", "A100"}
    on_t4, _ = gpt.speed_on("T4", 96)
    on_rtx, _ = gpt.speed_on("RTX2080Ti", 96)
    assert on_t4.iterations_per_s((8,)) == pytest.approx(
        on_rtx.iterations_per_s((8,)) * RELATIVE_SPEED["T4"] / RELATIVE_SPEED["RTX2080Ti"])
    on_h100, _ = profiles["bert"].speed_on("H100", 96)
    on_a100, _ = profiles["bert"].speed_on("A100", 96)
    assert on_h100.iterations_per_s((2,)) == pytest.approx(
        on_a100.iterations_per_s((2,)) * RELATIVE_SPEED["H100"] / RELATIVE_SPEED["A100"])


def test_relative_speeds_match_a_refit_and_cover_every_known_type(profiles):
    assert set(RELATIVE_SPEED) == set(GPU_POWER_W)
    for gpu_type, ratio in fit_relative_speeds(profiles).items():
        assert RELATIVE_SPEED[gpu_type] == pytest.approx(ratio, abs=0.006), gpu_type
    assert reference_type(["A100", "T4", "A100"]) == "T4"
    assert fastest_first(["T4", "A100", "RTX2080Ti"]) == ["A100", "RTX2080Ti", "T4"]


def test_a_queued_job_starts_on_the_fastest_type_that_holds_it(profiles):
    sim = _sim("1x8:T4+1x4:A100", [_profiled("a", "bert", 96, 4, profiles=profiles)], profiles)
    sim.advance()
    state = sim.state()
    row = state.job_index("a")
    on_a100 = choose_nodes(state, row, 4, Strategy.PACKED)
    assert {state.nodes.gpu_type[n] for n in on_a100} == {"A100"}
    on_t4 = choose_nodes(state, row, 8, Strategy.PACKED)  # only the T4 node holds 8
    assert {state.nodes.gpu_type[n] for n in on_t4} == {"T4"}
    assert choose_nodes(state, row, 9, Strategy.PACKED) is None  # 12 GPUs, but not on one type


def test_the_action_mask_is_exact_on_a_mixed_cluster(profiles):
    """Every action the featurizer leaves unmasked is one the simulator accepts: a job's
    capacity is counted on its own type (or the roomiest type for a job holding none)."""
    from rlalloc.env.featurizer import Featurizer

    rng = np.random.default_rng(2)
    jobs = [JobSpec(f"j{i}", i * 120.0, int(rng.choice([1, 2, 4])), float(rng.uniform(300, 3000)),
                    1, 8, 30.0) for i in range(40)]
    spec = parse_cluster("1x4:T4+1x8:RTX2080Ti+1x4:A100")
    workload = Workload("w", tuple(jobs))
    sim = Simulator(spec, workload, job_speeds(workload, None, [n.gpu_type for n in spec.nodes]),
                    SimParams(failures=FailureParams(failures_per_gpu_day=4.0)), seed=1)
    featurizer = Featurizer()
    taken = 0

    def policy(state):
        nonlocal taken
        check_invariants(state)
        mask = featurizer.action_mask(state)
        if rng.random() < 0.3:
            return NOOP
        index = int(rng.choice(np.flatnonzero(mask)))
        action = featurizer.decode(state, index)
        assert index == 0 or action.kind != ActionKind.NOOP, index  # unmasked: it fits
        taken += action.kind != ActionKind.NOOP
        return action

    sim.run(policy)
    summary = sim.accounting.summary()
    assert summary["jobs_completed"] == len(jobs) and taken > 50
    assert summary["invalid_actions"] == 0


def test_a_mixed_state_rebuilds_with_each_jobs_speed_per_type(profiles):
    from rlalloc.env.rebuild import simulator_from_state

    sim = _sim(MIXED, [_profiled("a", "bert", 96, 2, profiles=profiles),
                       _profiled("b", "ncf", 4096, 2, profiles=profiles)], profiles)
    sim.advance()
    place_on_type(sim, "a", 2, "A100")
    state = sim.state()
    copy = simulator_from_state(state, np.array([3600.0, 3600.0]))
    again = copy.state()
    assert again.type_speeds is not None
    assert again.type_speeds.gpu_types == state.type_speeds.gpu_types
    assert np.allclose(again.type_speeds.speed_1gpu, state.type_speeds.speed_1gpu)
    assert again.jobs.placement == state.jobs.placement
    row = copy.job_ids.index("a")
    # the copy runs job a at its A100 curve, not at the reference (T4) one
    col = state.type_speeds.column("A100")
    from rlalloc.env.featurizer import speedup
    expected = float(state.type_speeds.speed_1gpu[0, col]) * float(speedup(
        2, 1, state.type_speeds.scaling_alpha[0, col], state.type_speeds.scaling_beta[0, col]))
    assert copy._speeds[row].on_type("A100").iterations_per_s((2,)) == pytest.approx(expected)


def test_a_job_larger_than_any_one_type_is_refused_by_the_loader(tmp_path):
    csv = tmp_path / "w.csv"
    csv.write_text("name,time,application,num_replicas,batch_size\nbert-0,0,bert,32,96\n")
    assert build_scenario(str(csv), "8x4").workload.jobs[0].requested_gpus == 32
    with pytest.raises(UserError, match="24 GPUs of the cluster's largest GPU type"):
        build_scenario(str(csv), "6x4:T4+3x8:RTX2080Ti+2x8:A100")
