"""The lookahead behind `rlalloc headroom`: forks repeat the run exactly and leave the original
alone, the cost-to-go is the rest of the total JCT, a known-future lookahead is never worse
than its base, and the command rejects bad flags in one line and writes its report."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from agent.evaluation import finished_jcts_s, run_policy
from agent.lookahead import LookaheadPolicy, cost_to_go, parse_future
from agent.registry import load_policy
from env.failures import FAILURE_PRESETS, FailureParams
from env.params import SimParams
from env.scenario import build_scenario
from env.simulator import Simulator
from env.state import ActionKind

SMALL = ("synthetic:30:3:3", "2x4")
"""A workload on which the lookahead deviates from elastic-srpt-0.25 (4 times, known future)."""


def _small_sim(failures: float = 0.0) -> Simulator:
    params = SimParams(failures=FailureParams(failures_per_gpu_day=failures))
    return build_scenario(*SMALL, seed=0).simulator(params, seed=0)


def _run_decisions(sim: Simulator, policy, decisions: int) -> None:
    """Drive `sim` with `policy` for `decisions` decision points (as `run_policy` does)."""
    for _ in range(decisions):
        for _ in range(sim.params.max_actions_per_decision):
            action = policy.act(sim.state())
            if action.kind == ActionKind.NOOP or not sim.apply(action):
                break
        sim.advance()


def test_fork_repeats_the_run_with_the_same_failures_and_leaves_the_original_alone():
    policy = load_policy("elastic")
    reference = _small_sim(FAILURE_PRESETS["stress"] * 20)
    run_policy(reference, policy.act)
    assert reference.accounting.summary()["failures"] > 0  # the random draws matter here

    sim = _small_sim(FAILURE_PRESETS["stress"] * 20)
    _run_decisions(sim, policy, 40)
    before = (sim.time_s, sim.jobs_in_system, sim.events_processed)
    fork = sim.fork()
    run_policy(fork, policy.act)
    assert (sim.time_s, sim.jobs_in_system, sim.events_processed) == before
    run_policy(sim, policy.act)
    assert finished_jcts_s(fork) == finished_jcts_s(sim) == finished_jcts_s(reference)


@pytest.mark.parametrize("known_s", [0.0, 1200.0])
def test_fork_knows_only_the_arrivals_within_its_horizon(known_s):
    sim = _small_sim()
    _run_decisions(sim, load_policy("elastic"), 20)
    known = sum(j.submit_s <= sim.time_s + known_s for j in sim.workload.jobs)
    assert known < len(sim.workload.jobs) and sim.has_pending_arrivals
    fork = sim.fork(arrivals_known_s=known_s)
    cost_to_go(fork, load_policy("elastic"))
    assert fork.jobs_in_system == 0 and not fork.has_pending_arrivals
    assert len(finished_jcts_s(fork)) == known
    assert sim.has_pending_arrivals  # the original still expects the rest


@pytest.mark.parametrize("text, seconds", [("known", math.inf), ("none", 0.0), ("1h", 3600.0),
                                           ("1.5h", 5400.0), ("30m", 1800.0)])
def test_parse_future(text, seconds):
    assert parse_future(text) == seconds


def test_cost_to_go_is_the_rest_of_the_total_jct():
    policy = load_policy("elastic-srpt-0.25")
    sim = _small_sim()
    _run_decisions(sim, policy, 25)
    now = sim.time_s
    cost = cost_to_go(sim.fork(), policy)
    run_policy(sim, policy.act)
    submit = np.array([j.submit_s for j in sim.workload.jobs])
    finish = submit + np.array(finished_jcts_s(sim))  # all finished, in job order
    assert len(finish) == len(submit)
    spent_before = np.clip(np.minimum(finish, now) - submit, 0.0, None).sum()
    assert cost == pytest.approx(finish.sum() - submit.sum() - spent_before, rel=1e-9)


def test_known_future_lookahead_deviates_and_is_never_worse_than_its_base():
    base = load_policy("elastic-srpt-0.25")
    base_jct = run_policy(_small_sim(), base.act).metrics["avg_jct_s"]
    sim = _small_sim()
    lookahead = LookaheadPolicy(sim, base, [load_policy("elastic-srpt"), load_policy("elastic")],
                                math.inf)
    result = run_policy(sim, lookahead.act)
    assert result.finished and lookahead.deviations > 0
    assert lookahead.contested >= lookahead.deviations
    assert result.metrics["avg_jct_s"] < base_jct


def test_lookahead_without_alternatives_is_its_base():
    base = load_policy("elastic-srpt-0.25")
    sim = _small_sim()
    lookahead = LookaheadPolicy(sim, base, [], 0.0)
    reference = _small_sim()
    run_policy(reference, base.act)
    run_policy(sim, lookahead.act)
    assert lookahead.contested == 0
    assert finished_jcts_s(sim) == finished_jcts_s(reference)


@pytest.mark.parametrize("flags, named", [(["--futures", "known,later"], "later"),
                                          (["--base", "nope"], "nope"),
                                          (["--alternatives", ","], "--alternatives")])
def test_headroom_rejects_bad_flags_in_one_line(tmp_path, flags, named):
    proc = subprocess.run([sys.executable, "-m", "env.cli", "headroom", *flags,
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and "Traceback" not in proc.stderr


def test_headroom_writes_its_report(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "env.cli", "headroom", "--workload", SMALL[0], "--cluster",
         SMALL[1], "--futures", "known,none,1h", "--jobs", "2", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "headroom.json").read_text())
    row = report["workloads"][SMALL[0]]
    for future in ("known", "none", "1h"):
        assert row[future]["change"] == pytest.approx(
            row[future]["avg_jct_s"] / row["base_avg_jct_s"] - 1.0)
    assert row["known"]["avg_jct_s"] < row["base_avg_jct_s"]
    assert (tmp_path / "headroom.png").stat().st_size > 0
    assert "lookahead, future known" in (tmp_path / "headroom.md").read_text()
    again = subprocess.run([sys.executable, "-m", "env.cli", "headroom", "--workload", SMALL[0],
                            "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "--force" in again.stderr
    assert json.loads((tmp_path / "headroom.json").read_text()) == report
