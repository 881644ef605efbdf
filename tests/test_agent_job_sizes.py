"""Job sizes for the elastic heuristics: the simulator's remaining work is conserved, known
sizes change the ranking as they should, a history learns each application's size, and
`rlalloc sizes fit` / `headroom --sizes` save, load, measure and refuse as documented."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from test_agent_heuristics import job, make_state

from rlalloc.agent.evaluation import run_policy
from rlalloc.agent.heuristics import ElasticConfig, ElasticPolicy
from rlalloc.agent.job_sizes import JobSizeHistory, learn_sizes
from rlalloc.agent.registry import load_policy
from rlalloc.agent.sized_policy import SIZES_FILE
from rlalloc.env.errors import UserError
from rlalloc.env.failures import FailureParams
from rlalloc.env.params import SimParams
from rlalloc.env.scenario import build_scenario
from rlalloc.env.state import ActionKind, JobStatus

from shared_data import POLLUX_WORKLOADS, needs_pollux

POLLUX = POLLUX_WORKLOADS
NO_FAILURES = SimParams(failures=FailureParams(failures_per_gpu_day=0.0))
R = JobStatus.RUNNING


def _cli(*argv: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlalloc.cli.main", *argv], capture_output=True,
                          text=True, timeout=timeout)


def test_remaining_work_starts_at_the_jobs_size_and_only_shrinks_to_zero():
    scenario = build_scenario("synthetic:30:3:3", "2x4", seed=0)
    sim = scenario.simulator(NO_FAILURES, seed=0)
    size = {spec.job_id: spec.work / speed.speed_1gpu
            for spec, speed in zip(scenario.workload.jobs, scenario.speeds, strict=True)}
    policy, last = load_policy("elastic"), {}
    while not sim.done:
        state = sim.state()
        ids = list(state.jobs.job_id)
        left = sim.remaining_work_s(ids)
        for job_id, work, run_s in zip(ids, left.tolist(), state.jobs.run_s.tolist(),
                                       strict=True):
            assert 0.0 <= work <= size[job_id] * (1 + 1e-9)
            assert work <= last.get(job_id, np.inf) + 1e-6  # no failures: nothing is lost
            if run_s == 0.0:
                assert work == pytest.approx(size[job_id])  # nothing done before a first start
            last[job_id] = work
        for _ in range(sim.params.max_actions_per_decision):
            action = policy.act(state)
            if action.kind == ActionKind.NOOP or not sim.apply(action):
                break
            state = sim.state()
        sim.advance()
    assert set(last) == set(size)  # every job was seen, then finished


def _two_new_jobs():
    """Two running jobs that scale alike and are too new to extrapolate: the estimate gives
    both an hour left, so the spare GPU goes to the first (older) one."""
    first = job("first", R, 1, placement=(0,), submit_s=0.0, scaling_alpha=0.0,
                scaling_beta=0.0, progress=0.001, run_s=60.0, restore_s=10.0)
    second = job("second", R, 1, placement=(1,), submit_s=10.0, scaling_alpha=0.0,
                 scaling_beta=0.0, progress=0.001, run_s=60.0, restore_s=10.0)
    return make_state([0, 0, 1], [first, second], gpus_per_node=1)


def test_known_sizes_send_the_spare_gpu_to_the_job_with_less_work_left():
    state = _two_new_jobs()
    config = ElasticConfig(remaining_power=0.25)
    assert ElasticPolicy(config).targets(state).tolist() == [2, 1]
    told = ElasticPolicy(config, remaining_work=lambda s, rows: np.array([1e6, 500.0])[rows])
    assert told.targets(state).tolist() == [1, 2]
    action = told.act(state)
    assert action.job_id == "second" and action.workers == 2
    # unknown (NaN) sizes keep the estimate from progress: an hour for the first job
    half = ElasticPolicy(config, remaining_work=lambda s, rows: np.array([np.nan, 7200.0])[rows])
    assert half.targets(state).tolist() == [2, 1]
    half = ElasticPolicy(config, remaining_work=lambda s, rows: np.array([np.nan, 1800.0])[rows])
    assert half.targets(state).tolist() == [1, 2]


@needs_pollux
def test_history_learns_each_applications_size_exactly():
    history = JobSizeHistory.fit([build_scenario(str(POLLUX / "workload-1.csv"), "16x4")])
    assert 5 <= len(history.work_s) <= 12  # one entry per application and batch size
    sim = build_scenario(str(POLLUX / "workload-2.csv"), "16x4").simulator(NO_FAILURES, 0)
    run_policy(sim, load_policy("elastic-srpt-0.25").act, limit_s=4 * 3600.0)
    state = sim.state()
    rows = np.arange(state.jobs.count)
    predicted = history.remaining_work(state, rows)
    seen = ~np.isnan(predicted)
    assert seen.sum() >= 0.8 * len(rows) and state.jobs.count >= 5
    truth = sim.remaining_work_s(list(state.jobs.job_id))
    np.testing.assert_allclose(predicted[seen], truth[seen], rtol=1e-4)


@needs_pollux
def test_jobs_without_an_application_stay_out_of_the_history(tmp_path):
    """In a trace of one's own cluster, jobs without an application share the generic curve
    whatever they run: one median would stand for all of their sizes, so they keep the
    estimate from progress; the profiled jobs beside them are learnt as ever."""
    trace = tmp_path / "jobs.csv"
    trace.write_text("job_id,submit_s,num_gpus,duration_s,application,batch_size\n"
                     "short,0,1,300,,\nlong,10,4,36000,,\nmid,20,2,3600,,\n"
                     "a,30,1,,cifar10,512\nb,40,2,,ncf,2048\n")
    history = JobSizeHistory.fit([build_scenario(str(trace), "4x4")])
    assert sorted(history.jobs.values()) == [1, 1]
    generic = build_scenario("synthetic:20", "4x4")
    with pytest.raises(UserError, match="no job names its application"):
        learn_sizes([generic], "--workload synthetic:20")


@needs_pollux
def test_sizes_fit_saves_a_policy_that_loads_by_path(tmp_path):
    out = tmp_path / "sized"
    proc = _cli("sizes", "fit", "--workload", str(POLLUX / "workload-1.csv"), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    # the hint names a workload: without one, evaluate runs the synthetic default, which
    # has no sizes to learn
    assert (f"`rlalloc evaluate --workload W [--workload W2 ...] --cluster 16x4 --policies "
            f"elastic-srpt-0.25,{out} --reference elastic-srpt-0.25`") in proc.stdout
    saved = json.loads((out / SIZES_FILE).read_text())
    assert saved["base"] == "elastic-srpt-0.25" and len(saved["curves"]) >= 5
    assert "workload-1.csv" in (out / "card.md").read_text()
    policy = load_policy(str(out))
    assert policy.name == "sized" and policy.remaining_work is not None
    history = JobSizeHistory.fit([build_scenario(str(POLLUX / "workload-1.csv"), "16x4")])
    sim = build_scenario(str(POLLUX / "workload-3.csv"), "16x4").simulator(NO_FAILURES, 0)
    run_policy(sim, policy.act, limit_s=2 * 3600.0)
    state = sim.state()
    rows = np.arange(state.jobs.count)
    np.testing.assert_array_equal(policy.remaining_times(state, rows),
                                  ElasticPolicy(ElasticConfig(remaining_power=0.25),
                                                remaining_work=history.remaining_work,
                                                speedups=policy.speedups)
                                  .remaining_times(state, rows))
    again = _cli("sizes", "fit", "--workload", str(POLLUX / "workload-2.csv"), "--out", str(out))
    assert again.returncode == 2 and "--force" in again.stderr
    assert json.loads((out / SIZES_FILE).read_text()) == saved
    (out / SIZES_FILE).write_text('{"format_version": 1, "base": "elastic"}')
    with pytest.raises(UserError, match="damaged size table"):
        load_policy(str(out))
    (out / SIZES_FILE).write_text("[1, 2]")  # valid JSON, not a table: was an AttributeError
    with pytest.raises(UserError, match="damaged size table"):
        load_policy(str(out))


@pytest.mark.parametrize("files, named", [
    ((SIZES_FILE, "policy.json"), "a size table .* and a trained model"),
    (("planner.json", SIZES_FILE), "a size table .* and a planner"),
    (("planner.json", "policy.json"), "a trained model .* and a planner"),
])
def test_a_directory_with_two_kinds_of_policy_is_refused(tmp_path, files, named):
    """`sizes fit --force` into a model's directory (or `train --force` into a size table's,
    which keeps sizes.json) left a model that silently ran as the sized heuristic."""
    for name in files:
        (tmp_path / name).write_text("{}")
    with pytest.raises(UserError, match=f"holds both {named}"):
        load_policy(str(tmp_path))


_PLANNER_FIT = ["planner", "fit", "--workload", "synthetic:8:1.0", "--workload", "synthetic"]


@pytest.mark.parametrize("kept, argv", [
    ("policy.json", ["sizes", "fit", "--workload", "synthetic:8:1.0", "--cluster", "2x4"]),
    (SIZES_FILE, ["train", "--workload", "synthetic:8:1.0", "--cluster", "2x4",
                  "--timesteps", "64"]),
    ("planner.json", ["sizes", "fit", "--workload", "synthetic:8:1.0", "--cluster", "2x4"]),
    ("planner.json", ["train", "--workload", "synthetic:8:1.0", "--cluster", "2x4",
                      "--timesteps", "64"]),
    (SIZES_FILE, _PLANNER_FIT),
    ("policy.json", _PLANNER_FIT),
])
def test_neither_command_writes_into_the_others_directory_even_with_force(tmp_path, kept,
                                                                          argv):
    """Both write card.md: `--force` of one into the other's directory replaced the other's
    card and left a directory that is neither policy."""
    (tmp_path / kept).write_text("{}")
    (tmp_path / "card.md").write_text("the other command's card")
    proc = _cli(*argv, "--out", str(tmp_path), "--force")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "which --force does not replace; choose another --out" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([kept, "card.md"])
    assert (tmp_path / "card.md").read_text() == "the other command's card"


@needs_pollux
def test_sizes_fit_card_names_the_jobs_and_cluster_and_older_tables_still_load(tmp_path):
    """card.md lists each entry by the application and batch size of its past jobs, not by
    speed-curve numbers, and keeps the cluster file as used; a sizes.json of an older rlalloc,
    without either, loads as before."""
    trace = tmp_path / "jobs.csv"
    trace.write_text("job_id,submit_s,num_gpus,duration_s,application,batch_size\n"
                     "a,30,1,,cifar10,512\nb,40,2,,ncf,2048\nc,50,1,,ncf,2048\n")
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("nodes:\n  - {count: 2, gpus: 4, rack: 7}\n")
    out = tmp_path / "sized"
    proc = _cli("sizes", "fit", "--workload", str(trace), "--cluster", str(cluster),
                "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    card = (out / "card.md").read_text()
    assert "| ncf (batch 2048) |" in card and "| cifar10 (batch 512) |" in card
    assert "alpha" not in card and "  rack: 7\n" in card
    saved = json.loads((out / SIZES_FILE).read_text())
    assert saved["cluster"] == str(cluster) and saved["cluster_file"]["shape"] == "2x4"
    kinds = sorted((k["application"], k["batch_size"]) for c in saved["curves"]
                   for k in c["kinds"])
    assert kinds == [("cifar10", 512), ("ncf", 2048)]
    sim = build_scenario(str(trace), "2x4").simulator(NO_FAILURES, 0)
    run_policy(sim, load_policy("elastic").act, limit_s=60.0)
    state = sim.state()
    rows = np.arange(state.jobs.count)
    told = load_policy(str(out)).remaining_work(state, rows)
    assert len(rows) == 2 and np.isfinite(told).all()
    older = {key: value for key, value in saved.items()
             if not key.startswith("cluster") and key != "profiles"}
    older["curves"] = [{k: v for k, v in c.items() if k != "kinds"} for c in saved["curves"]]
    (out / SIZES_FILE).write_text(json.dumps(older))
    np.testing.assert_array_equal(load_policy(str(out)).remaining_work(state, rows), told)


@pytest.mark.parametrize("argv, named", [
    (["--workload", "synthetic:20"], "same speed curve"),
    (["--workload", "synthetic:20", "--base", "tiresias"], "tiresias"),
    # --base takes a built-in elastic heuristic by name, never a saved model
    (["--workload", "synthetic:20", "--base", "elastik"],
     "--base elastik does not estimate job sizes; use one of the elastic heuristics elastic, "
     "reactive, proactive, elastic-srpt, elastic-srpt-0.25 or sia"),
])
def test_sizes_fit_refuses_in_one_line(tmp_path, argv, named):
    proc = _cli("sizes", "fit", *argv, "--out", str(tmp_path / "x"))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and named in lines[0]
    assert "saved model" not in lines[0]
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("flags, named", [
    (["--sizes", "exact"], "exact"),
    (["--sizes", "known", "--base", "tiresias"], "tiresias"),
    (["--sizes", "learned"], "--history"),
])
def test_headroom_sizes_rejects_bad_flags_in_one_line(tmp_path, flags, named):
    proc = _cli("headroom", "--workload", "synthetic:20", "--futures", "", *flags,
                "--out", str(tmp_path))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and named in lines[0]


@needs_pollux
def test_headroom_with_learned_sizes_matches_known_sizes_on_pollux(tmp_path):
    """In the Pollux workloads an application and batch size fix a job's size, so a history
    that has seen every kind of job in the workload knows its sizes exactly."""
    workload = str(POLLUX / "workload-7.csv")
    proc = _cli("headroom", "--workload", workload, "--history", str(POLLUX / "workload-1.csv"),
                "--history", str(POLLUX / "workload-2.csv"), "--futures", "",
                "--sizes", "known,learned", "--jobs", "2", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "headroom.json").read_text())
    row = report["workloads"][workload]
    assert report["columns"] == ["sizes-known", "sizes-learned"]
    assert row["sizes-learned"]["avg_jct_s"] == pytest.approx(row["sizes-known"]["avg_jct_s"],
                                                              rel=1e-6)
    assert row["sizes-known"]["avg_jct_s"] < row["base_avg_jct_s"]
    assert "base, sizes learned" in (tmp_path / "headroom.md").read_text()
