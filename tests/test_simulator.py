"""The simulator's invariants: GPUs conserved, work conserved, lost work, determinism."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from rlalloc.env.cluster import ClusterSpec, NodeSpec, uniform_cluster
from rlalloc.env.errors import UserError
from rlalloc.env.failures import (
    FAILURE_PRESETS,
    FailureParams,
    HealthEvent,
    WarningEpisode,
    node_features,
    parse_failure_rate,
)
from rlalloc.env.params import GPU_POWER_W, SimParams
from rlalloc.env.simulator import GiveUp, Simulator, time_limit_s
from rlalloc.env.state import NOOP, Action, ActionKind, ClusterState, JobStatus
from rlalloc.env.workload.spec import Workload
from rlalloc.forecaster.signals import load_signals

from shared_data import POLLUX_WORKLOADS
from sim_helpers import (
    GENERIC,
    WorkLedger,
    check_accounting,
    check_invariants,
    fifo,
    job,
    simulator,
)


def run_checked(sim, policy) -> None:
    """Run to completion, checking the invariants in every state handed to the policy."""

    def checked(state):
        check_invariants(state)
        return policy(state)

    sim.run(checked)


def finish_times(sim) -> dict[str, float]:
    acc = sim.accounting
    return {job_id: float(acc._finish[i]) for i, job_id in enumerate(sim.job_ids)}


def test_job_finishes_exactly_when_its_work_is_done():
    # one 2-GPU job on one node: speed from the generic model for shape (2,)
    sim = simulator([job("a", 10.0, 2, work=1000.0)])
    sim.run(fifo)
    rate = GENERIC.iterations_per_s((2,))
    assert finish_times(sim)["a"] == pytest.approx(10.0 + 1000.0 / rate, rel=1e-9)
    assert sim.accounting.summary()["avg_queue_s"] == 0.0


def test_packed_is_faster_than_spread_for_the_same_gpus():
    assert GENERIC.iterations_per_s((4,)) > GENERIC.iterations_per_s((2, 2))
    spread = simulator([job("a", 0.0, 4, work=4000.0)])
    nodes = ("node-0000", "node-0000", "node-0001", "node-0001")
    assert spread.apply(Action(ActionKind.SCALE, "a", 4, nodes)) is False  # not yet submitted
    spread.advance()
    assert spread.apply(Action(ActionKind.SCALE, "a", 4, nodes))
    spread.run(lambda s: NOOP)
    packed = simulator([job("a", 0.0, 4, work=4000.0)])
    packed.run(fifo)
    assert finish_times(packed)["a"] < finish_times(spread)["a"]


def test_resize_pays_restore_and_conserves_work():
    sim = simulator([job("a", 0.0, 1, work=3000.0, restore_s=40.0)])
    sim.advance()  # arrival
    assert sim.apply(fifo(sim.state()))
    while sim.time_s < 500.0:
        sim.advance()
    t_resize = sim.time_s
    done = t_resize * GENERIC.iterations_per_s((1,))
    assert sim.apply(Action(ActionKind.SCALE, "a", 4, ("node-0001",) * 4))
    sim.run(lambda s: NOOP)
    expected = t_resize + 40.0 + (3000.0 - done) / GENERIC.iterations_per_s((4,))
    assert finish_times(sim)["a"] == pytest.approx(expected, rel=1e-9)
    assert sim.accounting.summary()["restarts_per_job"] == 1.0


def test_failure_loses_exactly_the_work_since_the_last_checkpoint():
    interval = 600.0
    params = SimParams(checkpoint_interval_s=interval,
                       failures=FailureParams(failures_per_gpu_day=0.0))
    sim = simulator([job("a", 0.0, 2, work=50_000.0, restore_s=20.0)], params=params)
    sim.schedule_failure("node-0000", 1500.0)
    sim.advance()
    assert sim.apply(fifo(sim.state()))  # packed: both workers on node-0000
    rate = GENERIC.iterations_per_s((2,))
    while sim.time_s < 900.0:
        sim.advance()
    # what the twin exports as the trainer's checkpoint step: at 900 s, the 600 s checkpoint
    assert sim.checkpointed_progress()[0] == pytest.approx(600.0 * rate / 50_000.0, rel=1e-6)
    assert sim.state().jobs.progress[0] == pytest.approx(900.0 * rate / 50_000.0, rel=1e-6)
    while sim.time_s < 1500.0:
        sim.advance()
    state = sim.state()
    # checkpoints at 600 and 1200: 300 s of training lost, progress back to 1200 s worth
    assert state.jobs.status[0] == 0
    assert state.jobs.progress[0] == pytest.approx(1200.0 * rate / 50_000.0, rel=1e-6)
    assert sim.checkpointed_progress()[0] == pytest.approx(state.jobs.progress[0], rel=1e-6)
    summary = sim.accounting.summary()
    assert summary["lost_gpu_hours"] == pytest.approx(2 * 300.0 / 3600.0)
    assert summary["failures"] == 1
    assert not state.nodes.ready[0] and state.nodes.gpus_free[0] == 0
    # it restarts on the healthy node, pays its restore and finishes the remaining work
    assert sim.apply(fifo(state))
    assert set(sim.state().jobs.placement[0]) == {1}
    sim.run(lambda s: NOOP)
    remaining = 50_000.0 - 1200.0 * rate
    assert finish_times(sim)["a"] == pytest.approx(1500.0 + 20.0 + remaining / rate, rel=1e-9)
    summary = sim.accounting.summary()
    assert summary["progress_preserved"] == pytest.approx(
        1 - 300.0 / (1500.0 + remaining / rate), rel=1e-6)
    assert summary["mean_recovery_s"] == pytest.approx(20.0)


def test_migration_moves_a_job_without_losing_work():
    sim = simulator([job("a", 0.0, 2, work=9000.0, restore_s=50.0)])
    sim.schedule_failure("node-0000", 2000.0, warning_lead_s=1200.0)
    sim.advance()
    assert sim.apply(fifo(sim.state()))
    while not sim.state().nodes.warned[0]:
        sim.advance()
    t = sim.time_s
    assert 800.0 <= t < 2000.0
    assert sim.apply(Action(ActionKind.MIGRATE, "a", 2, ("node-0001",) * 2,
                            from_node="node-0000"))
    sim.run(lambda s: NOOP)
    summary = sim.accounting.summary()
    assert summary["lost_gpu_hours"] == 0.0 and summary["progress_preserved"] == 1.0
    rate = GENERIC.iterations_per_s((2,))
    assert finish_times(sim)["a"] == pytest.approx(9000.0 / rate + 50.0, rel=1e-9)


def test_metrics_of_a_resize_and_a_failure_during_the_restore_by_hand():
    """gpu_util, gpu_busy_util, goodput, lost GPU-hours, ettr, recovery and energy against their
    definitions (env/metrics.py) on one job: 2 GPUs on node 0, grown to 4 there at 600 s, hit
    by node 0's failure at 620 s while it restores, restarted on node 1 at 620 s."""
    sim = simulator([job("a", 0.0, 2, work=5000.0, restore_s=40.0)])
    sim.schedule_failure("node-0000", 620.0)
    sim.advance()
    assert sim.apply(fifo(sim.state()))
    while sim.time_s < 600.0:
        sim.advance()
    assert sim.apply(Action(ActionKind.SCALE, "a", 4, ("node-0000",) * 4))
    sim.advance()
    assert sim.time_s == 620.0 and sim.state().jobs.status[0] == 0
    assert sim.apply(Action(ActionKind.SCALE, "a", 4, ("node-0001",) * 4))
    sim.run(lambda s: NOOP)
    end = 660.0 + (5000.0 - 600.0 * GENERIC.iterations_per_s((2,))) / GENERIC.iterations_per_s((4,))
    assert end < 620.0 + FailureParams().repair_s  # node 0 stays down to the end
    alloc = 2 * 600.0 + 4 * 20.0 + 4 * (end - 620.0)
    busy = 2 * 600.0 + 4 * (end - 660.0)
    m = sim.accounting.summary()
    assert m["makespan_s"] == pytest.approx(end, rel=1e-12)
    assert m["gpu_util"] == pytest.approx(alloc / (8 * end), rel=1e-9)
    assert m["gpu_busy_util"] == pytest.approx(busy / (8 * end), rel=1e-9)
    assert m["goodput"] == pytest.approx(busy / alloc, rel=1e-9)  # the restore lost no training
    assert m["lost_gpu_hours"] == pytest.approx(4 * 20.0 / 3600.0, rel=1e-9)
    assert m["progress_preserved"] == 1.0 and m["failures"] == 1
    assert m["ettr"] == pytest.approx((600.0 + end - 660.0) / end, rel=1e-9)
    assert m["mean_recovery_s"] == pytest.approx(40.0) and m["restarts_per_job"] == 2.0
    idle_w, busy_w = GPU_POWER_W["T4"]
    idle_j = 8 * idle_w * 620.0 + 4 * idle_w * (end - 620.0)  # node 0 down from 620 s
    assert m["energy_kwh"] == pytest.approx((idle_j + (busy_w - idle_w) * busy) / 3.6e6,
                                            rel=1e-9)


def test_energy_charges_each_busy_gpu_at_its_own_type():
    """On a mixed cluster a job on the A100 node draws A100 power, not the cluster average."""
    cluster = ClusterSpec((NodeSpec("a100-0", 4, "A100", 0), NodeSpec("t4-0", 4, "T4", 0)))
    sim = Simulator(cluster, Workload("mixed", (job("a", 0.0, 4, work=1000.0),)), [GENERIC],
                    SimParams(failures=FailureParams(failures_per_gpu_day=0.0)))
    sim.advance()
    assert sim.apply(Action(ActionKind.SCALE, "a", 4, ("a100-0",) * 4))
    sim.run(lambda s: NOOP)
    end = 1000.0 / GENERIC.iterations_per_s((4,))
    watts = 4 * GPU_POWER_W["A100"][1] + 4 * GPU_POWER_W["T4"][0]
    assert sim.accounting.summary()["energy_kwh"] == pytest.approx(watts * end / 3.6e6,
                                                                   rel=1e-9)


class _TwoEpochs:
    """A made-up statistical-efficiency model: 1 unit of progress a second up to 450, twice as
    fast from there to the end at 550 (whatever the placement)."""

    epoch_ends = np.array([450.0, 550.0])

    def epoch_at(self, progress: float) -> int:
        return min(int(np.searchsorted(self.epoch_ends, progress, side="right")), 1)

    def progress_per_s(self, shape: tuple[int, ...], epoch: int) -> float:
        return 1.0 + epoch

    def curve(self, epoch: int) -> tuple[float, float, float]:
        return 1.0 + epoch, 0.0, 0.0


def test_a_finish_scheduled_by_an_epoch_end_ends_the_run_and_its_energy_there():
    """The epoch end (t=450) is no decision point, so the finish it schedules (t=500) falls
    before the tick at 600 being processed to: the clock and the energy stop at the finish."""
    speed = dataclasses.replace(GENERIC, epochs=_TwoEpochs())
    sim = Simulator(uniform_cluster(1, 4), Workload("epochs", (job("a", 0.0, 4, 550.0, 0.0),)),
                    [speed], SimParams(failures=FailureParams(failures_per_gpu_day=0.0)))
    sim.run(fifo)
    assert finish_times(sim)["a"] == pytest.approx(500.0, rel=1e-12)
    assert sim.time_s == pytest.approx(500.0, rel=1e-12)
    watts = 4 * GPU_POWER_W["T4"][1]
    assert sim.accounting.summary()["energy_kwh"] == pytest.approx(watts * 500.0 / 3.6e6,
                                                                   rel=1e-9)


def test_an_ended_warning_reaches_the_risk_model_as_long_as_its_earlier_reading_does():
    # flaps in the last hour count; the risk model also reads the telemetry risk_lag_s
    # earlier, which Prometheus still holds after the hour: the simulator must as well
    signals = load_signals("standin")
    sim = Simulator(uniform_cluster(2, 4), Workload("test", (job("a", 0.0, 1, 1e6),)),
                    [GENERIC], SimParams(failures=FailureParams(failures_per_gpu_day=0.0)),
                    signals=signals)
    episode = WarningEpisode(0, 100.0, 400.0, None, flap_s=[399.0])  # a false alarm
    sim._push_health(HealthEvent(100.0, "warn", 0, episode))
    healthy = sim.state().nodes.failure_risk[1]
    params = sim.params.failures
    checked = 0
    while sim.time_s < 399.0 + 3600.0 + signals.risk_lag_s:  # the flap's last earlier reading
        sim.advance()
        if not 400.0 + 3600.0 < sim.time_s < 399.0 + 3600.0 + signals.risk_lag_s:
            continue  # the hour after the episode, or past the flap's reach
        checked += 1
        now = node_features(episode, sim.time_s, params)
        earlier = node_features(episode, sim.time_s - signals.risk_lag_s, params)
        assert sum(earlier) > 0  # the flaps are still in the earlier reading's hour
        expected = signals.node_risk(np.asarray([now], np.float32),
                                     np.asarray([earlier], np.float32))[0]
        assert sim.state().nodes.failure_risk[0] == pytest.approx(expected, rel=1e-6)
        assert expected != pytest.approx(healthy)
    assert checked >= 1


def test_a_warning_longer_than_the_time_to_the_failure_starts_now():
    """schedule_failure with a lead beyond now used to push a warning into the past, and the
    clock went backwards (AssertionError in the accounting)."""
    sim = simulator([job("a", 0.0, 2, work=50_000.0)])
    sim.advance()
    assert sim.apply(fifo(sim.state()))
    while sim.time_s < 1000.0:
        sim.advance()
    now = sim.time_s
    sim.schedule_failure("node-0000", now + 100.0, warning_lead_s=600.0)
    sim.advance()
    assert sim.time_s == now and sim.state().nodes.warned[0]
    while sim.time_s < now + 100.0:
        sim.advance()
    assert not sim.state().nodes.ready[0] and sim.accounting.failures == 1


def test_a_fork_told_no_future_arrivals_ends_with_its_known_jobs():
    """A fork that knows only the jobs submitted so far is done when they have finished:
    `run` used to advance past them and fail on an empty event queue."""
    sim = simulator([job("a", 0.0, 2, work=500.0), job("b", 5000.0, 2, work=500.0)])
    sim.advance()
    assert sim.apply(fifo(sim.state()))
    fork = sim.fork(arrivals_known_s=0.0)
    assert fork.run(fifo)
    assert fork.done and fork.jobs_in_system == 0 and not fork.has_pending_arrivals
    assert fork.time_s < 5000.0 and fork.accounting.jobs_completed == 1
    assert not sim.done and sim.run(fifo) and sim.accounting.jobs_completed == 2


def test_invalid_actions_change_nothing_and_are_counted():
    """Each refusal names its own reason: an action refused for another reason than the one
    it was built to break (say, a size check lost behind a capacity check) shows here. Job a
    (max 4 workers) queues, c runs on 2 of node-0000's 4 GPUs."""
    sim = simulator([job("a", 0.0, 2, work=100.0, max_workers=4),
                     job("c", 0.0, 2, work=10_000.0)])
    sim.advance()
    assert sim.apply(Action(ActionKind.SCALE, "c", 2, ("node-0000",) * 2))
    before = sim.state()
    bad = [
        (Action(ActionKind.SCALE, "zzz", 1, ("node-0000",)), "job 'zzz' is not in the system"),
        # 5 GPUs are free for it (4 + 1): only its max_workers refuses this one
        (Action(ActionKind.SCALE, "a", 5, ("node-0000",) + ("node-0001",) * 4),
         "5 workers is outside [1, 4]"),
        (Action(ActionKind.SCALE, "a", 3, ("node-0000",) * 3),
         "not enough free GPUs on node-0000"),                            # c holds 2 of its 4
        (Action(ActionKind.SCALE, "a", 1, ("nowhere",)), "unknown node 'nowhere'"),
        (Action(ActionKind.SCALE, "a", 0, ()), "job is already suspended"),
        (Action(ActionKind.MIGRATE, "a", 1, ("node-0001",), from_node="node-0000"),
         "job is not running"),
        (Action(ActionKind.MIGRATE, "c", 2, ("node-0000",) * 2, from_node="node-0001"),
         "job has no worker on 'node-0001'"),
        (Action(ActionKind.MIGRATE, "c", 2, ("node-0000", "node-0001"), from_node="node-0000"),
         "the new placement still uses the node to leave"),
        (Action(ActionKind.MIGRATE, "c", 1, ("node-0001",), from_node="node-0000"),
         "a migration keeps the worker count"),
        (Action(ActionKind.SCALE, "c", 2, ("node-0000",) * 2), "placement unchanged"),
    ]
    for action, reason in bad:
        assert sim.validate(action) == reason, action
        assert sim.apply(action) is False
    assert sim.invalid_actions == len(bad) and sim.actions_taken == 1
    after = sim.state()
    assert after.time_s == before.time_s
    assert (after.nodes.gpus_free == before.nodes.gpus_free).all()
    assert after.jobs.placement == before.jobs.placement == ((), (0, 0))
    assert (after.jobs.status == before.jobs.status).all()
    # the same job and node names in a valid action are accepted: the refusals were the values
    assert sim.validate(Action(ActionKind.SCALE, "a", 4, ("node-0001",) * 4)) == ""


@pytest.mark.parametrize("failures", [0.0, 5.0])
def test_invariants_hold_under_random_valid_actions(failures):
    from rlalloc.env.featurizer import Featurizer

    params = SimParams(failures=FailureParams(failures_per_gpu_day=failures))
    rng = np.random.default_rng(3)
    jobs = [job(f"j{i}", float(i * 60), int(rng.choice([1, 2, 4])),
                float(rng.uniform(200, 3000))) for i in range(40)]
    sim = simulator(jobs, nodes=3, params=params)
    featurizer = Featurizer()
    ledger = WorkLedger(sim)
    random_moves = 0

    def random_policy(state):
        # mostly FIFO so jobs finish; now and then any valid action (resize, move, suspend)
        nonlocal random_moves
        check_accounting(sim, state)
        ledger.check(state)
        if rng.random() < 0.3:
            random_moves += 1
            mask = featurizer.action_mask(state)
            return featurizer.decode(state, int(rng.choice(np.flatnonzero(mask))))
        return fifo(state)

    run_checked(sim, random_policy)
    summary = sim.accounting.summary()
    assert summary["jobs_completed"] == 40
    # each job finished once, no sooner than on its fastest placement from its submission
    finish = sim.accounting._finish
    assert np.isfinite(finish).all() and sim.done and sim.jobs_in_system == 0
    fastest = max(GENERIC.iterations_per_s((n,)) for n in range(1, 9))
    ideal_s = np.array([j.work for j in jobs]) / fastest
    assert (finish - np.array([j.submit_s for j in jobs]) >= ideal_s).all()
    assert random_moves > 10
    assert summary["invalid_actions"] == 0  # the mask is exact
    assert 0 < summary["gpu_busy_util"] <= summary["gpu_util"] <= 1
    if failures:
        assert summary["failures"] > 0 and summary["progress_preserved"] < 1


def test_same_seed_gives_identical_metrics_and_different_seed_differs():
    params = SimParams(failures=FailureParams(failures_per_gpu_day=3.0))
    rng = np.random.default_rng(0)
    jobs = [job(f"j{i}", float(i * 30), int(rng.choice([1, 2])),
                float(rng.uniform(500, 5000))) for i in range(60)]

    def metrics(seed):
        sim = simulator(jobs, nodes=2, params=params, seed=seed)
        sim.run(fifo)
        return sim.accounting.summary()

    first = metrics(1)
    assert first == metrics(1)
    assert first != metrics(2)  # the failure process depends on the seed


def test_a_seed_gives_the_same_run_in_processes_with_other_hash_seeds(tmp_path):
    """Set or dict order that leaked into decisions would differ between processes (Python
    salts str hashes per process) while a run repeated in one process would still agree."""
    def simulate(hash_seed: str) -> dict:
        out = tmp_path / hash_seed
        subprocess.run([sys.executable, "-m", "rlalloc.cli.main", "simulate", "--workload",
                        "synthetic:40:1.5", "--cluster", "3x4", "--policy", "elastic",
                        "--failures", "5", "--seed", "3", "--out", str(out)],
                       env={**os.environ, "PYTHONHASHSEED": hash_seed}, check=True,
                       capture_output=True, timeout=120)
        return json.loads((out / "metrics.json").read_text())

    first = simulate("1")
    assert first["failures"] > 0 and first == simulate("12345")


def test_snapshot_is_not_changed_by_later_simulation():
    sim = simulator([job("a", 0.0, 1, work=5000.0), job("b", 100.0, 2, work=5000.0)])
    sim.advance()
    sim.apply(fifo(sim.state()))
    snapshot = sim.state()
    frozen = {f.name: getattr(snapshot.jobs, f.name) for f in dataclasses.fields(snapshot.jobs)}
    copies = {k: np.array(v, copy=True) if isinstance(v, np.ndarray) else v
              for k, v in frozen.items()}
    sim.run(fifo)
    for name, value in copies.items():
        now = getattr(snapshot.jobs, name)
        assert (np.array_equal(now, value) if isinstance(value, np.ndarray) else now == value), name


def test_dataclasses_replace_works_on_a_simulator_built_state():
    """The guardrails replace columns of a state; a snapshot's deferred columns (computed
    when first read) are carried over as read, the replaced one changed."""
    sim = simulator([job("a", 0.0, 1, work=5000.0), job("b", 100.0, 2, work=5000.0)])
    sim.advance()
    sim.apply(fifo(sim.state()))
    state = sim.state()
    workers = state.jobs.workers + 1
    jobs = dataclasses.replace(state.jobs, workers=workers)
    assert np.array_equal(jobs.workers, workers)
    assert np.array_equal(jobs.progress, state.jobs.progress)
    nodes = dataclasses.replace(state.nodes, cordoned=~state.nodes.cordoned)
    assert np.array_equal(nodes.cordoned, ~state.nodes.cordoned)
    assert np.array_equal(nodes.gpu_util, state.nodes.gpu_util)
    demand = dataclasses.replace(state.demand, pending_gpus=7)
    assert demand.pending_gpus == 7 and demand.forecast_gpus == state.demand.forecast_gpus
    replaced = dataclasses.replace(state, jobs=jobs, nodes=nodes)
    assert replaced.jobs is jobs and replaced.time_s == state.time_s


def test_bench_sim_writes_every_figure(tmp_path, capsys):
    """`rlalloc bench sim` on a small trace: the JSON has the issue's figures, the replay saw
    every arrival and completion, and the PPO run spent part (not all) of its time in the env."""
    import json

    from rlalloc.cli.main import main

    trace = POLLUX_WORKLOADS / "workload-1.csv"
    if not trace.is_file():
        pytest.skip("shared Pollux workloads absent")
    out = tmp_path / "new-dir" / "sim.json"  # a missing directory is created
    argv = ["bench", "sim", "--trace", str(trace), "--cluster", "16x4", "--env-steps", "300",
            "--ppo-steps", "64", "--out", str(out)]
    assert main(argv) == 0
    figures = json.loads(out.read_text())
    # earlier figures are kept unless --force, and the refusal comes before the measuring
    assert main(argv) == 2 and json.loads(out.read_text()) == figures
    # a directory is named as the problem (not as an existing file that --force would replace)
    assert main([*argv[:-1], str(out.parent)]) == 2
    assert "is a directory" in capsys.readouterr().err
    for key in ("philly_replay_s", "events_per_s", "env_steps_per_s", "peak_rss_mb"):
        assert figures[key] > 0, key
    assert figures["events"] >= 2 * figures["jobs"] == 320
    assert figures["ppo_steps"] >= 64 and 0 < figures["ppo_env_share"] < 1


def test_bench_sim_replays_a_synthetic_workload(tmp_path, capsys):
    """`--trace synthetic:...` (what the error for a missing trace suggests) replays the
    generator's jobs, and bad generator numbers are a one-line error before any measuring."""
    import json

    from rlalloc.cli.main import main

    out = tmp_path / "sim.json"
    assert main(["bench", "sim", "--trace", "synthetic:30:1:2", "--cluster", "4x4",
                 "--env-steps", "10", "--ppo-steps", "0", "--out", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["jobs"] == 30 and figures["events"] >= 2 * 30
    capsys.readouterr()
    assert main(["bench", "sim", "--trace", "synthetic:x", "--cluster", "4x4",
                 "--env-steps", "10", "--ppo-steps", "0"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "synthetic:x" in error[0], error


# --- stuck runs, --failures, the simulate and bench commands' checks ---------------------------


@pytest.mark.timeout(30)
def test_a_run_whose_policy_never_starts_a_job_stops_at_the_time_limit():
    sim = simulator([job("a", 0.0, 1, work=600.0, restore_s=30.0)])
    # 20x (arrival span 0 + the job alone on one GPU, 600 s, plus a restore, 30 s)
    assert time_limit_s(sim) == pytest.approx(20 * 630.0)
    assert sim.run(lambda s: NOOP) is False
    assert time_limit_s(sim) < sim.time_s <= time_limit_s(sim) + SimParams().decision_interval_s
    assert simulator([job("a", 0.0, 1, work=600.0)]).run(fifo) is True


def test_a_run_stopped_at_the_time_limit_reports_utilisation_over_its_whole_span():
    # a finishes at once; b is resized at every restore's end and never trains: the integrals
    # run to the stop, so must the makespan they are divided by (it ended at a's finish)
    sim = simulator([job("a", 0.0, 1, work=600.0), job("b", 0.0, 2, work=3600.0)], nodes=1)

    def thrash_b(state: ClusterState) -> Action:
        jobs = state.jobs
        for row in np.flatnonzero(np.asarray(jobs.job_id) == "b").tolist():
            if jobs.status[row] == JobStatus.RUNNING:
                workers = 1 if jobs.workers[row] == 2 else 2
                return Action(ActionKind.SCALE, "b", workers, ("node-0000",) * workers)
        return fifo(state)

    assert sim.run(thrash_b) is False
    metrics = sim.accounting.summary()
    assert metrics["jobs_completed"] == 1
    assert metrics["makespan_s"] == pytest.approx(sim.time_s)
    assert 0.0 < metrics["gpu_busy_util"] <= metrics["gpu_util"] <= 1.0


def test_a_run_is_given_up_once_its_average_jct_is_sure_to_exceed_the_bound():
    # nothing ever starts: the two jobs' time in the system grows 2 s a second, so the average
    # JCT passes 1,000 s at 1,000 s, long before the time limit; a run that finishes under the
    # bound is not touched by it
    step = SimParams().decision_interval_s
    idle = simulator([job("a", 0.0, 1, work=600.0), job("b", 0.0, 1, work=600.0)])
    assert idle.run(lambda s: NOOP, give_up=GiveUp(avg_jct_s=1_000.0)) is False
    assert 1_000.0 <= idle.time_s <= 1_000.0 + step < time_limit_s(idle)
    # one job left waiting while the rest finish: the longest wait gives it up
    stranded = simulator([job("a", 0.0, 1, work=600.0), job("b", 0.0, 1, work=600.0)])

    def only_a(state: ClusterState) -> Action:
        queued = [job_id for job_id, status in zip(state.jobs.job_id, state.jobs.status,
                                                   strict=True) if status == JobStatus.QUEUED]
        return Action(ActionKind.SCALE, "a", 1, ("node-0000",)) if "a" in queued else NOOP

    assert stranded.run(only_a, give_up=GiveUp(job_s=5_000.0)) is False
    assert stranded.accounting.jobs_completed == 1
    assert 5_000.0 <= stranded.time_s <= 5_000.0 + step < time_limit_s(stranded)
    assert stranded.longest_in_system_s() == pytest.approx(stranded.time_s)
    bounded, free = (simulator([job("a", 0.0, 1, work=600.0)]) for _ in range(2))
    assert bounded.run(fifo, give_up=GiveUp(avg_jct_s=1_000.0)) and free.run(fifo)
    assert bounded.accounting.summary() == free.accounting.summary()
    # no bound on a fork whose jobs all came in as extra jobs (inf x 0 jobs made it NaN,
    # and the run stopped before its first decision)
    fork = simulator([]).fork(extra_jobs=[job("x", 0.0, 1, work=600.0)], extra_speeds=[GENERIC])
    assert fork.run(fifo) and fork.accounting.jobs_completed == 1


def test_the_time_limit_leaves_room_for_a_job_longer_than_a_month():
    days_40 = 40 * 86_400.0
    sim = simulator([job("a", 0.0, 1, work=days_40), job("b", 3600.0, 1, work=60.0)])
    assert time_limit_s(sim) >= 2 * days_40


def _every_policy_is(monkeypatch, name: str, act) -> None:
    """Make every policy name load a policy called `name` that answers `act(state)`."""
    stub = SimpleNamespace(name=name, act=act)
    monkeypatch.setattr("rlalloc.agent.registry.load_policy", lambda _: stub)


def _never_finishes(monkeypatch) -> None:
    """Make every policy name load a policy that never starts a job."""
    _every_policy_is(monkeypatch, "idle", lambda state: NOOP)


def test_simulate_reports_unfinished_jobs_at_the_time_limit(tmp_path, monkeypatch, capsys):
    import json

    from rlalloc.cli.main import main
    from rlalloc.cli.simulate import UNFINISHED_EXIT_CODE

    _never_finishes(monkeypatch)
    workload = tmp_path / "jobs.csv"
    workload.write_text("job_id,submit_s,num_gpus,duration_s\na,0,1,600\nb,60,1,600\n")
    out = tmp_path / "out"
    argv = ["simulate", "--workload", str(workload), "--cluster", "1x1", "--failures", "none",
            "--out", str(out)]
    assert main(argv) == UNFINISHED_EXIT_CODE == 3
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["finished"] is False and metrics["jobs_unfinished"] == 2
    assert metrics["jobs_completed"] == 0 and metrics["time_limit_s"] > 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "rlalloc:" in line]
    assert len(warnings) == 1 and "warning: idle left 2 of 2 jobs unfinished" in warnings[0]


def test_simulate_stopped_by_ctrl_c_leaves_no_new_directory(tmp_path, monkeypatch, capsys):
    from rlalloc.cli.main import main

    def stop(state):
        raise KeyboardInterrupt

    _every_policy_is(monkeypatch, "stopped", stop)
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "notes.txt").write_text("mine")
    for out in (tmp_path / "new" / "out", existing / "out", existing):
        assert main(["simulate", "--workload", "synthetic:3", "--out", str(out)]) == 130
        assert "rlalloc: interrupted" in capsys.readouterr().err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == [
        Path("existing"), Path("existing/notes.txt")]
    assert (existing / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e9", "-1", "abc", ""])
def test_bad_failure_rates_are_one_line_errors(text):
    with pytest.raises(UserError) as info:
        parse_failure_rate(text)
    message = str(info.value)
    assert f"--failures {text!r}" in message and "0 to 10" in message and "\n" not in message


def test_failure_rates_and_presets():
    assert parse_failure_rate("stress") == FAILURE_PRESETS["stress"]
    assert parse_failure_rate("0.2") == 0.2 and parse_failure_rate("10") == 10.0


@pytest.mark.parametrize("flags", [["--seed", "-1"], ["--failures", "nan"],
                                   ["--checkpoint-interval", "inf"]])
def test_simulate_refuses_bad_numbers_before_running(tmp_path, capsys, flags):
    from rlalloc.cli.main import main

    out = tmp_path / "out"
    code = main(["simulate", "--workload", "synthetic:3", "--out", str(out), *flags])
    assert code == 2 and not out.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flags[0] in err[0]


@pytest.mark.parametrize("argv, help_of", [
    (["simulate", "--workloda", "x"], "(see rlalloc simulate --help)"),
    (["sizes", "fit", "--workload", "a.csv", "--bogus"], "(see rlalloc sizes fit --help)"),
    (["--bogus", "simulate"], "(see rlalloc --help)"),
])
def test_an_unknown_flag_points_to_the_help_of_the_command_given_it(capsys, argv, help_of):
    from rlalloc.cli.main import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unrecognized arguments" in err[0] and err[0].endswith(help_of)


@pytest.mark.parametrize("command, shown", [
    (["train"], ["--failures FAILURES failures per GPU-day or none|default|stress (default: "
                 "none, unlike simulate and evaluate)",
                 "(default: 100000), rounded up to whole rollouts"]),
    (["evaluate"], ["synthetic draws too; default: 3)"]),
    (["twin"], ["(default: stress, 0.05 per GPU-day", "`default` is the Llama 3 rate "
                "(0.00047 per GPU-day, the default of simulate and evaluate)"]),
])
def test_help_shows_the_defaults_that_differ_between_commands(capsys, monkeypatch, command,
                                                              shown):
    from rlalloc.cli.main import main

    monkeypatch.setenv("COLUMNS", "1000")  # one line per flag
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert all(part in text for part in shown), text


@pytest.mark.parametrize("flags", [["--policy", "nope"], ["--cluster", "4x0"],
                                   ["--env-cluster", "abc"], ["--trace", "/no/such.csv"],
                                   ["--trace", __file__]])  # a file, but no workload's header
def test_bench_sim_checks_its_flags_before_measuring(monkeypatch, tmp_path, capsys, flags):
    from rlalloc.cli.main import main

    def measured(*args, **kwargs):
        raise AssertionError("a benchmark ran before the flags were checked")

    trace = tmp_path / "trace.csv"
    trace.write_text("job_id,submit_s,num_gpus,duration_s\na,0,1,60\n")
    monkeypatch.setattr("rlalloc.cli.bench_sim.bench_env_steps", measured)
    monkeypatch.setattr("rlalloc.cli.bench_sim.DEFAULT_TRACE", trace)
    assert main(["bench", "sim", "--ppo-steps", "0", *flags]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and flags[1] in error[0], error


def test_the_failure_process_has_its_documented_rates_and_warnings():
    """env/failures.py: a node of g GPUs fails as a Poisson process at g x the per-GPU-day rate
    but never while down (repair_s), so accepted failures come at lambda / (1 + lambda x
    repair); warned_share of them are warned 600-3,600 s ahead (a warning is cut at the start
    of the 7-day chunk drawn); false alarms come at lambda x warned_share x 1.0 and calm
    after false_warning_duration_s. Pulled in uneven steps, the events are the same ones."""
    from rlalloc.env.failures import SECONDS_PER_DAY, NodeHealthTimeline

    params = FailureParams(failures_per_gpu_day=0.5)  # 8-GPU nodes: lambda = 4 per day
    days, nodes = 60, 4
    end_s = days * SECONDS_PER_DAY
    whole = NodeHealthTimeline(params, np.full(nodes, 8), np.random.default_rng(5))
    events = whole.events_until(end_s)
    stepped = NodeHealthTimeline(params, np.full(nodes, 8), np.random.default_rng(5))
    pulled, t = [], 0.0
    while t < end_s:
        t_next = min(t + 4620.0, end_s)
        batch = stepped.events_until(t_next)
        assert all(t <= e.time_s < t_next for e in batch)
        pulled += batch
        t = t_next
    assert pulled == events
    assert [e.time_s for e in events] == sorted(e.time_s for e in events)

    fails = [e for e in events if e.kind == "fail"]
    repairs = {(e.node, e.time_s) for e in events if e.kind == "repair"}
    for node in range(nodes):
        times = [e.time_s for e in fails if e.node == node]
        assert all(later - earlier >= params.repair_s
                   for earlier, later in zip(times, times[1:], strict=False))
    # every failure is repaired repair_s later (those near the end: after end_s)
    assert all((e.node, e.time_s + params.repair_s) in repairs
               for e in fails if e.time_s + params.repair_s < end_s)
    rate = 4.0 / (1 + 4.0 * params.repair_s / SECONDS_PER_DAY)  # 3 per node-day
    # 720 expected (Poisson sd ~27): 960 without the dead time, 120 without the GPU count
    assert len(fails) == pytest.approx(rate * days * nodes, rel=0.12)

    warnings = [e for e in events if e.kind == "warn"]
    warned = {(e.node, e.episode.fail_s): e for e in warnings if e.episode.fail_s is not None}
    assert set(warned) <= {(e.node, e.time_s) for e in fails}
    assert len(warned) / len(fails) == pytest.approx(params.warned_share, abs=0.06)
    chunk_s = NodeHealthTimeline.CHUNK_S
    for (_, fail_s), warn in warned.items():
        lead_s = fail_s - warn.time_s
        assert (params.warning_lead_min_s <= lead_s <= params.warning_lead_max_s
                or (0 < lead_s < params.warning_lead_min_s and warn.time_s % chunk_s == 0))
    false_alarms = [e for e in warnings if e.episode.fail_s is None]
    assert len(false_alarms) == pytest.approx(4.0 * 0.6 * 1.0 * days * nodes, rel=0.15)
    calms = {(e.node, e.time_s) for e in events if e.kind == "calm"}
    assert all((e.node, e.time_s + params.false_warning_duration_s) in calms
               for e in false_alarms if e.time_s + params.false_warning_duration_s < end_s)


def test_a_warning_episodes_temperature_does_not_tell_when_it_ends():
    """The excess ramped to `temp_rise_c` exactly at the episode's end, so the excess and its
    30-min change gave the failure time away (t + (rise - excess) x 1800 / change): episodes
    of different lengths must look alike until the shorter one ends."""
    params = FailureParams()
    short = WarningEpisode(0, 1000.0, 1000.0 + 900.0, 1900.0)
    long = WarningEpisode(0, 1000.0, 1000.0 + 4000.0, 5000.0)
    for t in (1100.0, 1500.0, 1899.0):
        assert node_features(short, t, params) == node_features(long, t, params)
    assert 0 < node_features(long, 1899.0, params)[4] < params.temp_rise_c
    assert node_features(long, 4999.0, params)[4] == params.temp_rise_c  # capped
