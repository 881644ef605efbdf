"""The lookahead behind `rlalloc headroom`: forks repeat the run exactly and leave the original
alone, the cost-to-go is the rest of the total JCT, a known-future lookahead is never worse
than its base, and the command rejects bad flags in one line and writes its report."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from rlalloc.agent.catalogue import MODELS_DIR
from rlalloc.agent.distill import load_recordings
from rlalloc.agent.evaluation import run_policy
from rlalloc.agent.lookahead import (
    Future,
    HistoryArrivals,
    LookaheadPolicy,
    cost_to_go,
    parse_future,
)
from rlalloc.agent.registry import load_policy
from rlalloc.cli import headroom as headroom_cmd
from rlalloc.cli.headroom import RECORDINGS_DIR, recording_path
from rlalloc.cli.main import main
from rlalloc.env.failures import FAILURE_PRESETS, FailureParams
from rlalloc.env.params import SimParams
from rlalloc.env.scenario import build_scenario
from rlalloc.env.simulator import Simulator
from rlalloc.env.workload.spec import JobSpec

from sim_helpers import GENERIC, run_decisions

SMALL = ("synthetic:30:3:3", "2x4")
"""A workload on which the lookahead deviates from elastic-srpt-0.25 (4 times, known future)."""
OTHER = "synthetic:40:3:3"
"""Another workload for SMALL's cluster, to draw sampled futures from."""


def _small_sim(failures: float = 0.0) -> Simulator:
    params = SimParams(failures=FailureParams(failures_per_gpu_day=failures))
    return build_scenario(*SMALL, seed=0).simulator(params, seed=0)


def _lookahead_jct(future: Future, history: HistoryArrivals | None = None) -> tuple[float, int]:
    """Average JCT and deviations of the lookahead over elastic-srpt-0.25 on SMALL."""
    sim = _small_sim()
    lookahead = LookaheadPolicy(lambda _state: sim, load_policy("elastic-srpt-0.25"),
                                [load_policy("elastic-srpt"), load_policy("elastic")],
                                future, history)
    result = run_policy(sim, lookahead.act)
    assert result.finished
    return result.metrics["avg_jct_s"], lookahead.deviations


def test_fork_repeats_the_run_with_the_same_failures_and_leaves_the_original_alone():
    policy = load_policy("elastic")
    reference = _small_sim(FAILURE_PRESETS["stress"] * 20)
    run_policy(reference, policy.act)
    assert reference.accounting.summary()["failures"] > 0  # the random draws matter here

    sim = _small_sim(FAILURE_PRESETS["stress"] * 20)
    run_decisions(sim, policy, 40)
    before = (sim.time_s, sim.jobs_in_system, sim.events_processed)
    fork = sim.fork()
    run_policy(fork, policy.act)
    assert (sim.time_s, sim.jobs_in_system, sim.events_processed) == before
    run_policy(sim, policy.act)
    jcts = [s.accounting.finished_jcts_s().tolist() for s in (fork, sim, reference)]
    assert jcts[0] == jcts[1] == jcts[2]


@pytest.mark.parametrize("known_s", [0.0, 1200.0])
def test_fork_knows_only_the_arrivals_within_its_horizon(known_s):
    sim = _small_sim()
    run_decisions(sim, load_policy("elastic"), 20)
    known = sum(j.submit_s <= sim.time_s + known_s for j in sim.workload.jobs)
    assert known < len(sim.workload.jobs) and sim.has_pending_arrivals
    fork = sim.fork(arrivals_known_s=known_s)
    cost_to_go(fork, load_policy("elastic"))
    assert fork.jobs_in_system == 0 and not fork.has_pending_arrivals
    assert len(fork.accounting.finished_jcts_s()) == known
    assert sim.has_pending_arrivals  # the original still expects the rest
    told = [j.submit_s for j in sim.workload.jobs if j.submit_s <= sim.time_s + known_s]
    last_hour = sum(fork.time_s - 3600.0 < t <= fork.time_s for t in told)
    assert fork.state().demand.arrivals_1h == last_hour  # arrivals it was not told of: none


def test_fork_told_the_real_arrivals_as_extra_jobs_repeats_the_known_future():
    policy = load_policy("elastic-srpt-0.25")
    scenario = build_scenario(*SMALL, seed=0)
    sim = _small_sim()
    run_decisions(sim, policy, 20)
    later = [row for row, job in enumerate(scenario.workload.jobs) if job.submit_s > sim.time_s]
    assert later and sim.jobs_in_system
    renamed = tuple(replace(scenario.workload.jobs[row], job_id=f"told/{row}") for row in later)
    told = sim.fork(0.0, renamed, tuple(scenario.speeds[row] for row in later))
    assert len(told.job_ids) == len(sim.job_ids) + len(later)
    assert cost_to_go(told, policy) == pytest.approx(cost_to_go(sim.fork(), policy), rel=1e-12)
    assert len(told.accounting.finished_jcts_s()) == len(scenario.workload.jobs)
    with pytest.raises(AssertionError, match="past"):
        sim.fork(0.0, (replace(renamed[0], submit_s=0.0),), scenario.speeds[:1])


def test_history_draws_the_next_hours_jobs_of_distinct_workloads_repeatably():
    history = [build_scenario("synthetic:40:2:4", "2x4", seed=seed) for seed in range(4)]
    draws = [HistoryArrivals.of_scenarios(history, 3600.0, samples=3, seed=7).draw(1800.0)
             for _ in range(2)]
    assert draws[0] == draws[1]
    names = set()
    for jobs, speeds in draws[0]:
        assert len(jobs) == len(speeds) > 0
        assert all(1800.0 < job.submit_s <= 5400.0 for job in jobs)
        names.add(jobs[0].job_id.split("/")[0])
    assert len(names) == 3  # three different history workloads


def test_sampled_future_drawn_from_the_workload_itself_is_the_known_future():
    history = HistoryArrivals.of_scenarios([build_scenario(*SMALL, seed=0)], 1e9, samples=3,
                                           seed=0)
    assert history.samples == 1
    sampled = _lookahead_jct(Future(1e9, sampled=True), history)
    assert sampled == _lookahead_jct(Future(math.inf))
    assert sampled[1] > 0  # it deviated, so the drawn jobs mattered


@pytest.mark.parametrize("text, future", [
    ("known", Future(math.inf)), ("none", Future(0.0)), ("1h", Future(3600.0)),
    ("1.5h", Future(5400.0)), ("30m", Future(1800.0)), ("sampled-2h", Future(7200.0, True))])
def test_parse_future(text, future):
    assert parse_future(text) == future


def test_cost_to_go_is_the_rest_of_the_total_jct():
    policy = load_policy("elastic-srpt-0.25")
    sim = _small_sim()
    run_decisions(sim, policy, 25)
    now = sim.time_s
    cost = cost_to_go(sim.fork(), policy)
    run_policy(sim, policy.act)
    submit = np.array([j.submit_s for j in sim.workload.jobs])
    finish = submit + sim.accounting.finished_jcts_s()  # all finished, in job order
    assert len(finish) == len(submit)
    spent_before = np.clip(np.minimum(finish, now) - submit, 0.0, None).sum()
    assert cost == pytest.approx(finish.sum() - submit.sum() - spent_before, rel=1e-9)


def test_known_future_lookahead_deviates_and_is_never_worse_than_its_base():
    base = load_policy("elastic-srpt-0.25")
    base_jct = run_policy(_small_sim(), base.act).metrics["avg_jct_s"]
    sim = _small_sim()
    lookahead = LookaheadPolicy(lambda _state: sim, base,
                                [load_policy("elastic-srpt"), load_policy("elastic")],
                                Future(math.inf))
    result = run_policy(sim, lookahead.act)
    assert result.finished and lookahead.deviations > 0
    assert lookahead.contested >= lookahead.deviations
    assert result.metrics["avg_jct_s"] < base_jct


def test_lookahead_without_alternatives_is_its_base():
    base = load_policy("elastic-srpt-0.25")
    sim = _small_sim()
    lookahead = LookaheadPolicy(lambda _state: sim, base, [], Future(0.0))
    reference = _small_sim()
    run_policy(reference, base.act)
    run_policy(sim, lookahead.act)
    assert lookahead.contested == 0
    assert sim.accounting.finished_jcts_s().tolist() == \
        reference.accounting.finished_jcts_s().tolist()


@pytest.mark.parametrize("flags, named", [(["--futures", "known,later"], "later"),
                                          (["--futures", "sampled-1h"], "--history"),
                                          (["--futures", "sampled-1h", "--workload", SMALL[0],
                                            "--history", SMALL[0]], "itself"),
                                          (["--samples", "0"], "--samples"),
                                          (["--base", "nope"], "nope"),
                                          (["--alternatives", ","], "--alternatives")])
def test_headroom_rejects_bad_flags_in_one_line(tmp_path, flags, named):
    proc = subprocess.run([sys.executable, "-m", "rlalloc.cli.main", "headroom", *flags,
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    # one line; argparse's own errors (--samples 0) come after its usage block
    assert len(lines) == 1
    assert named in lines[-1] and "Traceback" not in proc.stderr
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_headroom_writes_its_report(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "rlalloc.cli.main", "headroom", "--workload", SMALL[0], "--cluster",
         SMALL[1], "--futures", "known,none,1h,sampled-1h", "--history", SMALL[0],
         "--history", OTHER, "--jobs", "2", "--record", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300)
    # one past day (OTHER's; SMALL[0] is measured): 5 draws a decision were 1, said to be 5
    assert proc.returncode == 2 and "--samples 5: --history (less " in proc.stderr
    assert "holds 1 past day" in proc.stderr and not (tmp_path / "headroom.json").exists()
    proc = subprocess.run(
        [sys.executable, "-m", "rlalloc.cli.main", "headroom", "--workload", SMALL[0], "--cluster",
         SMALL[1], "--futures", "known,none,1h,sampled-1h", "--history", SMALL[0],
         "--history", OTHER, "--samples", "1", "--jobs", "2", "--record", "--out",
         str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "headroom.json").read_text())
    row = report["workloads"][SMALL[0]]
    for future in ("known", "none", "1h", "sampled-1h"):
        assert row[future]["change"] == pytest.approx(
            row[future]["avg_jct_s"] / row["base_avg_jct_s"] - 1.0)
    assert row["known"]["avg_jct_s"] < row["base_avg_jct_s"]
    assert row["sampled-1h"]["contested"] > 0
    assert report["history"] == [SMALL[0], OTHER]
    assert (tmp_path / "headroom.png").stat().st_size > 0
    assert "lookahead, future known" in (tmp_path / "headroom.md").read_text()
    for future in ("known", "none", "1h", "sampled-1h"):
        recording = load_recordings([recording_path(tmp_path, SMALL[0], future)],
                                    ("elastic-srpt-0.25", "elastic-srpt", "elastic"))
        assert recording.deviations().sum() == row[future]["deviations"]
    again = subprocess.run([sys.executable, "-m", "rlalloc.cli.main", "headroom",
                            "--workload", SMALL[0], "--record", "--out", str(tmp_path)],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "--force" in again.stderr
    assert json.loads((tmp_path / "headroom.json").read_text()) == report


def test_headroom_runs_a_learned_base_in_its_workers(tmp_path):
    """The parent loads the model to check --base before forking the workers; they hung for
    ever in torch's thread pool until each worker kept torch to one thread."""
    if not (MODELS_DIR / "ppo").is_dir():
        pytest.skip("models/ppo not trained yet")
    proc = subprocess.run(
        [sys.executable, "-m", "rlalloc.cli.main", "headroom", "--workload", SMALL[0], "--cluster",
         SMALL[1], "--base", "ppo", "--futures", "none", "--jobs", "2", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "headroom.json").read_text())
    assert report["workloads"][SMALL[0]]["base_avg_jct_s"] > 0


def _report(columns):
    """A headroom.json document of one workload with the given columns (as `summarise` makes)."""
    cell = {"avg_jct_s": 90.0, "change": -0.1, "contested": 3.0, "deviations": 1.0}
    return {"base": "elastic-srpt-0.25", "cluster": "2x4", "alternatives": ["elastic"],
            "history": [], "samples": 5, "columns": columns,
            "workloads": {"w.csv": {"base_avg_jct_s": 100.0, **dict.fromkeys(columns, cell)}},
            "mean": {"base_avg_jct_s": 100.0, **dict.fromkeys(columns, cell)}}


@pytest.mark.parametrize("columns, present, absent", [
    (["known", "none"], ["`lookahead, future known`: forks see every later arrival",
                         "`lookahead, future none`: "],
     ["history workloads", "sizes", "within the next"]),
    (["1h"], ["`lookahead, future 1h`: forks see the arrivals within the next 1h"],
     ["history workloads", "oracle", "sizes"]),
    (["sizes-known"], ["`base, sizes known`: the base alone"],
     ["history workloads", "Alternatives", "forks", "proposals differed"]),
])
def test_headroom_legend_describes_only_the_columns_present(columns, present, absent):
    legend = headroom_cmd.markdown(_report(columns)).split("\n")[2]
    for text in present:
        assert text in legend, text
    for text in absent:
        assert text not in legend, text


def test_headroom_report_names_units_and_plots_the_mean_with_each_change(tmp_path,
                                                                          monkeypatch):
    import matplotlib.figure

    drawn = {}
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda fig, path, **kw: drawn.__setitem__(path.name, fig))
    report = _report(["known", "sizes-known"])
    report["workloads"]["runs/v.csv"] = report["workloads"]["w.csv"]
    report["seed"] = 0
    table = headroom_cmd.markdown(report)
    assert "| workload | base alone (s) | lookahead, future known | base, sizes known |" in table
    assert "| w.csv | 100 |" in table  # a file in the working directory, no leading /
    headroom_cmd._plot(report, tmp_path / "headroom.png")
    figure = drawn["headroom.png"]
    ax = figure.axes[0]
    figure.canvas.draw()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["w.csv", "runs/v.csv",
                                                           "mean of workloads"]
    assert "elastic-srpt-0.25" in ax.get_title() and "2x4" in ax.get_title()
    assert "(%" in ax.get_ylabel()
    assert {text.get_text() for text in ax.texts} == {"-10.0%"}  # every bar labelled
    assert len(ax.texts) == 2 * 3
    assert ax.get_legend().get_window_extent().x0 >= ax.get_window_extent().x1


def _stopped_run(spec):
    """A headroom run that Ctrl-C stops (module level: the worker pool pickles it by name)."""
    raise KeyboardInterrupt


def test_headroom_force_record_keeps_old_recordings_until_its_runs_finish(tmp_path, monkeypatch):
    old = tmp_path / RECORDINGS_DIR / "earlier--none.npz"
    old.parent.mkdir()
    old.write_bytes(b"hours of lookahead")
    argv = ["headroom", "--workload", SMALL[0], "--cluster", SMALL[1], "--futures", "none",
            "--jobs", "1", "--record", "--force", "--out", str(tmp_path)]
    with monkeypatch.context() as patch:
        patch.setattr(headroom_cmd, "_run_one", _stopped_run)  # the forked worker inherits it
        assert main(argv) == 130
    assert old.read_bytes() == b"hours of lookahead"
    assert not list(tmp_path.glob(".staging-*"))
    assert main(argv) == 0
    assert [p.name for p in (tmp_path / RECORDINGS_DIR).iterdir()] == [
        recording_path(tmp_path, SMALL[0], "none").name]
    assert not list(tmp_path.glob(".staging-*"))


def _spec(job_id: str, submit_s: float) -> JobSpec:
    return JobSpec(job_id, submit_s, 1, 100.0, 1, 4, 30.0)


def test_history_draws_by_time_of_day_from_each_past_day_and_wraps_at_midnight():
    """A two-day workload is two past days; the drawn jobs keep their time of day, moved to
    the instant drawn for (a live clock's day 30 here); an hour from 23:30 takes 23:30-24:00
    and then 0:00-0:30 of the same day."""
    day = 86_400.0
    jobs = tuple(_spec(f"j{i}", t) for i, t in enumerate(
        [600.0, 84_700.0, day + 1200.0, day + 85_000.0]))
    history = HistoryArrivals([(jobs, (GENERIC,) * len(jobs))], 3600.0, samples=5, seed=0)
    assert history.samples == 2  # two past days, not one workload
    now = 30 * day + 84_600.0  # 23:30 on day 30
    drawn = {job.job_id: job.submit_s for future, _ in history.draw(now, 84_600.0)
             for job in future}
    assert drawn == {"history0/j1": now + 100.0, "history0/j3": now + 400.0,  # by 24:00
                     "history0/j0": now + 2400.0, "history0/j2": now + 3000.0}  # 0:10, 0:20
    assert all(job.submit_s > now for future, _ in history.draw(now, 84_600.0)
               for job in future)
