"""The planning policy: a simulator rebuilt from a `ClusterState` stands where the cluster
stands and runs on as the original would, the planner served from it decides like the
in-simulator lookahead, and `rlalloc planner fit` saves, loads and refuses as documented."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from test_agent_job_sizes import NO_FAILURES

from rlalloc.agent.evaluation import run_policy
from rlalloc.agent.heuristics import ElasticConfig, ElasticPolicy
from rlalloc.agent.lookahead import (
    Future,
    HistoryArrivals,
    LookaheadPolicy,
    ModelArrivals,
    cost_to_go,
)
from rlalloc.agent.planner import (
    ARRIVALS_FILE,
    PLANNER_FILE,
    PROFILES_DIR,
    drawn_from,
    history_arrivals,
    planning_policy,
)
from rlalloc.agent.registry import load_policy
from rlalloc.cli.evaluate import _planner_warnings
from rlalloc.env.errors import UserError
from rlalloc.env.rebuild import curve_speed, simulator_from_state
from rlalloc.env.scenario import Scenario, build_scenario
from rlalloc.env.simulator import Simulator
from rlalloc.env.state import Action, ActionKind, ClusterState, Jobs, JobStatus, Nodes

from shared_data import POLLUX_WORKLOADS, needs_pollux
from sim_helpers import run_decisions

POLLUX = POLLUX_WORKLOADS
SMALL = ("synthetic:40:3:3", "1x4")


def _cli(*argv: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlalloc.cli.main", *argv], capture_output=True,
                          text=True, timeout=timeout)


def _sim_at_decision(decisions: int, seed: int = 3) -> Simulator:
    """A small synthetic run (generic jobs: the state's curve is their exact speed model)
    after `decisions` decision points of elastic-srpt-0.25."""
    sim = build_scenario(*SMALL, seed=seed).simulator(NO_FAILURES, seed)
    run_decisions(sim, load_policy("elastic-srpt-0.25"), decisions)
    return sim


def _true_remaining(sim: Simulator) -> np.ndarray:
    return sim.remaining_work_s(list(sim.state().jobs.job_id))


def test_rebuilt_simulator_shows_the_state_it_was_built_from():
    sim = _sim_at_decision(25)
    state = sim.state()
    assert (state.jobs.status == JobStatus.RUNNING).any() and (state.jobs.workers == 0).any()
    rebuilt = simulator_from_state(state, _true_remaining(sim))
    again = rebuilt.state()
    assert again.time_s == state.time_s
    for column in ("job_id", "status", "workers", "placement", "requested_gpus", "min_workers",
                   "max_workers", "restarts"):
        assert list(getattr(again.jobs, column)) == list(getattr(state.jobs, column)), column
    for column in ("progress", "attained_gpu_s", "run_s", "speed_1gpu", "scaling_alpha"):
        np.testing.assert_allclose(getattr(again.jobs, column), getattr(state.jobs, column),
                                   rtol=1e-6, err_msg=column)
    assert list(again.nodes.gpus_free) == list(state.nodes.gpus_free)
    np.testing.assert_allclose(rebuilt.remaining_work_s(list(state.jobs.job_id)),
                               _true_remaining(sim), rtol=1e-5)


def test_rebuilt_simulator_runs_the_rest_as_the_original_would():
    """With the true sizes and the jobs' exact speed model, the copy's future under a policy is
    the original's without later arrivals: the same job-seconds to the end."""
    policy = load_policy("elastic-srpt-0.25")
    for decisions in (10, 25, 40):
        sim = _sim_at_decision(decisions)
        state = sim.state()
        if (state.jobs.status == JobStatus.RESTARTING).any():
            continue  # the copy pays a restore in progress again (module docstring)
        rebuilt = simulator_from_state(state, _true_remaining(sim))
        assert cost_to_go(rebuilt, policy) == pytest.approx(cost_to_go(sim.fork(0.0), policy),
                                                            rel=1e-4)
        break
    else:
        pytest.fail("no decision point without a restoring job")


def test_cordoned_and_down_nodes_take_no_new_workers_in_the_copy():
    """A cordoned node's jobs run on, but as they leave its GPUs stay free; a down node
    (not Ready) loses its jobs to the queue and gets nothing."""
    sim = build_scenario("synthetic:40:3:3", "3x4", seed=3).simulator(NO_FAILURES, 3)
    policy = load_policy("elastic")
    run_policy(sim, policy.act, limit_s=1800.0)
    state = sim.state()
    busy = int(np.argmin(state.nodes.gpus_free))
    assert state.nodes.gpus_free[busy] < state.nodes.gpus_total[busy]
    state.nodes.cordoned[busy] = True
    down = (busy + 1) % 3
    on_down = {job for job, nodes in zip(state.jobs.job_id, state.jobs.placement, strict=True)
               if down in nodes}
    assert on_down
    state.nodes.ready[down] = False
    rebuilt = simulator_from_state(state, _true_remaining(sim))
    copy = rebuilt.state().jobs
    assert {job for job, workers in zip(copy.job_id, copy.workers, strict=True)
            if workers == 0} >= on_down
    free = [int(state.nodes.gpus_free[busy])]
    while not rebuilt.done:
        for _ in range(rebuilt.params.max_actions_per_decision):
            action = policy.act(rebuilt.state())
            if action.kind == ActionKind.NOOP or not rebuilt.apply(action):
                break
        nodes = rebuilt.state().nodes
        free.append(int(nodes.gpus_free[busy]))
        assert nodes.cordoned[busy] and not nodes.ready[down]
        assert not any(down in placement for placement in rebuilt.state().jobs.placement)
        rebuilt.advance()
    assert free == sorted(free) and free[-1] == state.nodes.gpus_total[busy]


def _as_read_live(state: ClusterState, days: int, foreign_gpus: dict[int, int] | None = None
                  ) -> ClusterState:
    """`state` as the actuator would build it `days` whole days later on a wall clock (Unix
    seconds), with `foreign_gpus` (node -> GPUs) held by pods it does not manage."""
    shift = days * 86_400.0
    jobs = Jobs.from_records([replace(state.jobs.record(i), submit_s=state.jobs.submit_s[i]
                                      + shift) for i in range(state.jobs.count)])
    nodes = [state.nodes.record(i) for i in range(len(state.nodes.name))]
    for node, gpus in (foreign_gpus or {}).items():
        nodes[node] = replace(nodes[node], gpus_free=nodes[node].gpus_free - gpus)
    return ClusterState(time_s=state.time_s + shift, nodes=Nodes.from_records(nodes), jobs=jobs,
                        demand=state.demand, time_of_day_s=state.time_of_day_s)


def test_a_state_read_on_a_wall_clock_rebuilds_into_the_same_copy():
    """At Unix time (1.7e9 s) the copy starts at midnight of the oldest job's day: it records
    nothing of the decades before, and its future is the simulated state's."""
    sim = _sim_at_decision(25)
    state = sim.state()
    live = _as_read_live(state, days=20_000)
    assert live.time_s > 1.7e9
    policy = load_policy("elastic-srpt-0.25")
    copies = [simulator_from_state(s, _true_remaining(sim)) for s in (state, live)]
    assert copies[1].state().time_of_day_s == pytest.approx(state.time_of_day_s)
    assert copies[1].time_s < 86_400.0 and len(copies[1].accounting.series["t"]) <= 1
    assert cost_to_go(copies[1], policy) == pytest.approx(cost_to_go(copies[0], policy),
                                                          rel=1e-9)


def test_gpus_of_pods_the_state_does_not_manage_stay_taken_in_the_copy():
    sim = build_scenario("synthetic:40:3:3", "3x4", seed=3).simulator(NO_FAILURES, 3)
    run_policy(sim, load_policy("elastic").act, limit_s=600.0)
    state = sim.state()
    node = int(np.argmax(state.nodes.gpus_free))
    assert state.nodes.gpus_free[node] >= 1
    shared = _as_read_live(state, days=0, foreign_gpus={node: 1})
    copy = simulator_from_state(shared, _true_remaining(sim)).state()
    assert list(copy.nodes.gpus_free) == list(shared.nodes.gpus_free)


def test_a_suspended_job_pays_its_restore_to_start_again_in_the_copy():
    """A job that ran before and holds no GPUs now (suspended, or requeued by a failure)
    resumes from a checkpoint, in the copy as in the cluster."""
    sim = _sim_at_decision(25)
    running = next(job for job, status in zip(sim.state().jobs.job_id, sim.state().jobs.status,
                                               strict=True) if status == JobStatus.RUNNING)
    assert sim.apply(Action(ActionKind.SCALE, running, 0))
    state = sim.state()
    copy = simulator_from_state(state, _true_remaining(sim))
    row = state.jobs.job_id.index(running)
    again = Action(ActionKind.SCALE, running, 1, (state.nodes.name[
        int(np.argmax(state.nodes.gpus_free))],))
    for world in (sim.fork(), copy):
        assert world.apply(again)
        after = world.state().jobs
        assert after.status[row] == JobStatus.RESTARTING
        assert after.restarts[row] == state.jobs.restarts[row] + 1


def _told(config: ElasticConfig, scenario: Scenario) -> ElasticPolicy:
    """`config` told each job's true size by its id, also for a job drawn from history (whose
    id carries a ``history<k>/`` prefix)."""
    size_s = {job.job_id: job.work / speed.speed_1gpu
              for job, speed in zip(scenario.workload.jobs, scenario.speeds, strict=True)}

    def remaining(state: ClusterState, rows: np.ndarray) -> np.ndarray:
        total = np.array([size_s[state.jobs.job_id[row].rsplit("/", 1)[-1]]
                          for row in rows.tolist()])
        return (1.0 - state.jobs.progress[rows].astype(np.float64)) * total

    return ElasticPolicy(config, "told", remaining)


def test_planner_from_the_state_decides_like_the_lookahead_in_the_simulator():
    """Drawing its one future from the workload itself, the planner (forks of a copy rebuilt
    from the state) makes the lookahead's decisions (forks of the run's own simulator) and
    ends with the same JCT: the rebuild loses nothing a controller needs."""
    scenario = build_scenario(*SMALL, seed=3)
    results = []
    for served in (False, True):
        sim = scenario.simulator(NO_FAILURES, 3)
        base = _told(ElasticConfig(remaining_power=0.25), scenario)
        alternatives = [_told(ElasticConfig(remaining_power=0.5), scenario),
                        _told(ElasticConfig(), scenario)]
        history = HistoryArrivals.of_scenarios([scenario], 1e9, samples=1, seed=0)
        policy = (planning_policy(base, alternatives, history, "planner") if served else
                  LookaheadPolicy(lambda _state, sim=sim: sim, base, alternatives,
                                  Future(math.inf)))
        result = run_policy(sim, policy.act)
        assert result.finished
        results.append((result.metrics["avg_jct_s"], policy.contested, policy.deviations))
    (in_sim_jct, in_sim_contested, in_sim_deviations), (served_jct, contested, deviations) = results
    assert deviations > 0
    assert (contested, deviations) == (in_sim_contested, in_sim_deviations)
    assert served_jct == pytest.approx(in_sim_jct, rel=1e-6)


@needs_pollux
def test_planner_fit_saves_a_policy_that_loads_and_plans(tmp_path):
    out = tmp_path / "planner"
    workloads = [str(POLLUX / f"workload-{i}.csv") for i in (1, 2)]
    proc = _cli("planner", "fit", "--workload", workloads[0], "--workload", workloads[1],
                "--samples", "2", "--horizon", "30m", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "futures come from arrivals between 0:0" in proc.stdout  # the Pollux 8-hour days
    # the hint compares it with its base told the same sizes, not with the plain base
    assert "--reference SIZED --seeds 1 --failures none" in proc.stdout
    assert f"rlalloc sizes fit --workload {workloads[0]}" in proc.stdout
    saved = json.loads((out / PLANNER_FILE).read_text())
    assert saved["samples"] == 2 and saved["horizon_s"] == 1800.0
    assert [len(w["jobs"]) for w in saved["history"]] == [160, 160]
    assert saved["gpu_types"] == [] and not any(w["type_curves"] for w in saved["history"])
    assert "workload-2.csv" in (out / "card.md").read_text()
    assert saved["profiles"] and sorted(p.name for p in (out / PROFILES_DIR).iterdir()
                                        if p.is_dir()) == saved["profiles"]
    planner = load_policy(str(out))
    assert planner.name == "planner" and planner.history.samples == 2
    # evaluated on a workload it draws from, its futures hold the run's own next hour
    third = str(POLLUX / "workload-3.csv")
    assert drawn_from(out, {w: build_scenario(w, "16x4") for w in (workloads[1], third)}) == [
        workloads[1]]
    [warning] = _planner_warnings(["static", str(out)], [third, workloads[1]], "16x4")
    assert warning.startswith(f"{out} was fitted on {workloads[1]}: it draws its futures")
    sim = build_scenario(str(POLLUX / "workload-3.csv"), "16x4").simulator(NO_FAILURES, 0)
    # told the profiles' speed-ups, its heuristics first disagree after 3 h on workload-3
    run_policy(sim, planner.act, limit_s=4 * 3600.0)
    assert planner.contested > 0 and sim.invalid_actions == 0
    # the copy runs the jobs on their profiles: with the sizes exact (the table knows every
    # Pollux curve), it is the original without later arrivals, once no job is restoring
    while (sim.state().jobs.status == JobStatus.RESTARTING).any():
        sim.advance()
    assert cost_to_go(planner.sim_at(sim.state()), planner.base) == pytest.approx(
        cost_to_go(sim.fork(0.0), planner.base), rel=1e-4)
    short = tmp_path / "workload-3-first-30.csv"  # simulate says how often it left its base
    short.write_text("".join((POLLUX / "workload-3.csv").read_text().splitlines(True)[:31]))
    simulated = _cli("simulate", "--workload", str(short), "--cluster", "16x4", "--policy",
                     str(out), "--failures", "none", "--out", str(tmp_path / "sim"))
    assert simulated.returncode == 0, simulated.stderr
    # (its heuristics agree on these first 30 jobs: counted 0, but counted)
    counts = json.loads((tmp_path / "sim" / "metrics.json").read_text())["lookahead"]
    assert (f"planner left its base at {counts['deviations']} of the {counts['contested']} "
            "decisions") in simulated.stdout
    profiles = out / PROFILES_DIR
    shutil.rmtree(profiles / saved["profiles"][0])  # the planner would quietly use the curve
    with pytest.raises(UserError, match=f"profiles of {saved['profiles'][0]} are missing"):
        load_policy(str(out))
    shutil.rmtree(profiles)
    with pytest.raises(UserError, match="copied profiles cannot be read .*fit it again"):
        load_policy(str(out))
    again = _cli("planner", "fit", "--workload", workloads[0], "--workload", workloads[1],
                 "--samples", "2", "--out", str(out))
    assert again.returncode == 2 and "--force" in again.stderr
    # 5 draws a decision from 2 past days were 2 draws, the card still saying 5
    more = _cli("planner", "fit", "--workload", workloads[0], "--workload", workloads[1],
                "--out", str(out), "--force")
    assert more.returncode == 2 and more.stderr.strip() == (
        "rlalloc: error: --samples 5: --workload holds 2 past days to draw futures from, and "
        "each decision draws distinct ones; pass --samples 2 or more history")
    assert json.loads((out / PLANNER_FILE).read_text()) == saved
    forced = _cli("planner", "fit", "--workload", workloads[1], "--workload", workloads[0],
                  "--samples", "2", "--horizon", "30m", "--out", str(out), "--force")
    assert forced.returncode == 0, forced.stderr
    assert sorted(p.name for p in profiles.iterdir() if p.is_dir()) == saved["profiles"]
    forced = _cli("planner", "fit", "--workload", workloads[1], "--workload", workloads[0],
                  "--samples", "2", "--out", str(out), "--force")
    assert forced.returncode == 0, forced.stderr  # over read-write copies of read-only data
    for damaged in ('{"format_version": 1, "base": "elastic"}', "[1, 2]",
                    (out / PLANNER_FILE).read_text().replace('"elastic-srpt"', '"static"', 1),
                    # sia can be told sizes but estimates none to rebuild a fork from
                    (out / PLANNER_FILE).read_text().replace('"elastic-srpt"', '"sia"', 1)):
        (out / PLANNER_FILE).write_text(damaged)
        with pytest.raises(UserError, match=f"{PLANNER_FILE}: .*fit it again") as err:
            load_policy(str(out))
        assert "\n" not in str(err.value)


@needs_pollux
def test_planner_fit_with_arrivals_draws_history_jobs_in_the_next_horizon(tmp_path):
    out = tmp_path / "planner"
    workloads = [str(POLLUX / f"workload-{i}.csv") for i in (1, 2)]
    fit = ["planner", "fit", "--workload", workloads[0], "--workload", workloads[1],
           "--horizon", "30m", "--out", str(out)]
    proc = _cli(*fit, "--futures", "arrivals", "--samples", "3")  # more than the past days
    assert proc.returncode == 0, proc.stderr
    assert f"{ARRIVALS_FILE} (over 2 past days" in proc.stdout
    assert json.loads((out / PLANNER_FILE).read_text())["futures"] == "arrivals"
    assert "arrivals model" in (out / "card.md").read_text()
    planner = load_policy(str(out))
    assert isinstance(planner.history, ModelArrivals) and planner.history.samples == 3
    history = {(job.requested_gpus, job.min_workers, job.max_workers, round(job.work))
               for w in workloads for job in build_scenario(w, "16x4").workload.jobs}
    sim = build_scenario(str(POLLUX / "workload-3.csv"), "16x4").simulator(NO_FAILURES, 0)
    run_decisions(sim, planner.base, 60)
    state = sim.state()
    futures = planner.history.futures(state.time_s, state)
    assert len(futures) == 3 and any(jobs for jobs, _ in futures)
    for jobs, speeds in futures:
        assert len(speeds) == len(jobs) and len({job.job_id for job in jobs}) == len(jobs)
        assert all(state.time_s < job.submit_s <= state.time_s + 1800.0 for job in jobs)
        assert {(job.requested_gpus, job.min_workers, job.max_workers, round(job.work))
                for job in jobs} <= history
    planner.act(state)  # forks told the drawn jobs run
    again = _cli(*fit, "--samples", "2", "--force")  # past days: the model must not stay
    assert again.returncode == 0, again.stderr
    assert not (out / ARRIVALS_FILE).exists()
    assert isinstance(load_policy(str(out)).history, HistoryArrivals)


@pytest.mark.parametrize("argv, named", [
    (["--workload", "synthetic", "--workload", "synthetic:30"], "application"),
    (["--workload", "synthetic"], "at least two"),
    (["--workload", "a", "--workload", "b", "--base", "static"], "--base static"),
    # sia can be told sizes (`sizes fit`), but estimates none a fork could be rebuilt from
    (["--workload", "a", "--workload", "b", "--base", "sia"], "--base sia: the planner"),
    (["--workload", "a", "--workload", "b", "--alternatives", "elastic,tiresias"],
     "--alternatives tiresias"),
    (["--workload", "a", "--workload", "b", "--alternatives", ""], "--alternatives: give"),
    (["--workload", "a", "--workload", "b", "--alternatives", "elastic,elastic-srpt-0.25"],
     "other than --base elastic-srpt-0.25"),
    (["--workload", "a", "--workload", "b", "--workload", "a"], "--workload: a is given twice"),
    (["--workload", "a", "--workload", "b", "--horizon", "sampled-1h"], "--horizon"),
    (["--workload", "a", "--workload", "b", "--samples", "0"], "--samples"),
])
def test_planner_fit_refuses_in_one_line(tmp_path, argv, named):
    proc = _cli("planner", "fit", *argv, "--out", str(tmp_path / "p"))
    assert proc.returncode == 2, proc.stderr
    assert named in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "p" / PLANNER_FILE).exists()


@pytest.mark.timeout(60)
def test_a_copy_where_a_queued_job_can_never_start_costs_infinity_not_for_ever():
    """A node down in the copy stays down: a queued job of 8 minimum workers on the 4 GPUs left
    never starts, and `cost_to_go` advanced the clock for ever, freezing every contested
    decision of the planner (evaluate, simulate, the actuator's loop)."""
    from rlalloc.env.workload.spec import JobSpec

    from sim_helpers import simulator

    base = load_policy("elastic-srpt-0.25")
    sim = simulator([JobSpec("a", 0.0, 4, 5000.0, 1, 8, 30.0),
                     JobSpec("big", 10.0, 8, 5000.0, 8, 8, 30.0)], nodes=2, gpus=4)
    sim.advance()
    for _ in range(3):
        sim.apply(base.act(sim.state()))
        sim.advance()
    sim._fail_node(1, sim.time_s)
    state = sim.state()
    copy = simulator_from_state(state, base.remaining_work_s(state, np.arange(state.jobs.count)))
    assert cost_to_go(copy, base) == math.inf


def test_a_running_job_at_progress_one_is_rebuilt_finishing_not_as_zero_work():
    """The actuator reads progress 1 for a trainer that logged its last step while its pod
    still runs: the copy got a job of no work, progress 0/0, a warning every cycle."""
    import warnings

    from rlalloc.env.workload.spec import JobSpec

    from sim_helpers import simulator

    base = load_policy("elastic-srpt-0.25")
    sim = simulator([JobSpec("a", 0.0, 4, 5000.0, 1, 8, 30.0),
                     JobSpec("b", 10.0, 2, 5000.0, 1, 8, 30.0)], nodes=2, gpus=4)
    for _ in range(4):
        sim.apply(base.act(sim.state()))
        sim.advance()
    state = sim.state()
    columns = {name: getattr(state.jobs, name) for name in Jobs.__dataclass_fields__}
    columns["progress"] = np.array(columns["progress"], dtype=np.float32)
    columns["progress"][0] = 1.0
    state = replace(state, jobs=Jobs(**columns))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        copy = simulator_from_state(state, base.remaining_work_s(state, np.arange(2)))
        rebuilt = copy.state().jobs.progress
        assert np.isfinite(rebuilt).all() and rebuilt[0] >= 1.0 - 1e-6
        assert math.isfinite(cost_to_go(copy, base))


@needs_pollux
def test_a_planner_fitted_on_a_mixed_cluster_draws_jobs_at_their_speed_on_each_type(tmp_path):
    """A job drawn into a future runs on each GPU type at its own speed there, as the history
    workload ran it, not at the reference type's speed on every type."""
    out, cluster = tmp_path / "planner", "16x4:T4+16x4:A100"
    workloads = [str(POLLUX / f"workload-{i}.csv") for i in (1, 2)]
    proc = _cli("planner", "fit", "--workload", workloads[0], "--workload", workloads[1],
                "--cluster", cluster, "--samples", "2", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    saved = json.loads((out / PLANNER_FILE).read_text())
    assert saved["gpu_types"] == ["T4", "A100"]
    for entry, workload in zip(saved["history"], workloads, strict=True):
        truth = build_scenario(workload, cluster).speeds
        _, speeds = history_arrivals(entry["jobs"], curve_speed, saved["gpu_types"],
                                     entry["type_curves"])
        for speed, exact in zip(speeds, truth, strict=True):
            for gpu_type in ("T4", "A100"):
                assert speed.on_type(gpu_type).speed_1gpu == pytest.approx(
                    exact.on_type(gpu_type).speed_1gpu)
    planner = load_policy(str(out))
    ratios = {round(speed.on_type("A100").iterations_per_s((1,))
                    / speed.on_type("T4").iterations_per_s((1,)), 6)
              for _, speeds in planner.history.draw(3 * 3600.0) for speed in speeds}
    assert len(ratios) > 1 and min(ratios) > 1.0  # per application, faster on the A100
