"""Job speeds from the applications' profiles (`rlalloc.agent.job_speeds`): the speed-ups an elastic
heuristic ranks growth by, on hand-made curves and on the Pollux profiles."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from test_agent_heuristics import job, make_state

from rlalloc.agent.evaluation import run_policy
from rlalloc.agent.heuristics import ElasticConfig, ElasticPolicy, curve_speedups
from rlalloc.agent.job_sizes import JobSizeHistory, curve_key
from rlalloc.agent.job_speeds import (
    PROFILES_DIR,
    ProfiledSpeedups,
    assumed_shape,
    read_copied_profiles,
)
from rlalloc.agent.registry import load_policy
from rlalloc.agent.sized_policy import SIZES_FILE
from rlalloc.env.errors import UserError
from rlalloc.env.failures import FailureParams
from rlalloc.env.params import SimParams
from rlalloc.env.placement import placement_shape
from rlalloc.env.profiles import DEFAULT_PROFILES_ROOT
from rlalloc.env.scenario import build_scenario
from rlalloc.env.state import JobStatus

from shared_data import POLLUX_WORKLOADS, needs_pollux

POLLUX = POLLUX_WORKLOADS
NO_FAILURES = SimParams(failures=FailureParams(failures_per_gpu_day=0.0))
R = JobStatus.RUNNING


@pytest.mark.parametrize("workers, nodes, shape", [
    (6, 2, (4, 2)),        # the fewest nodes: packed onto full ones
    (8, 2, (4, 4)),
    (6, 3, (2, 2, 2)),     # more nodes than needed: spread evenly
    (7, 3, (3, 2, 2)),
    (2, 5, (1, 1)),        # never more nodes than workers
    (3, 1, (3,)),
])
def test_assumed_shape_packs_on_the_fewest_nodes_and_spreads_otherwise(workers, nodes,
                                                                         shape):
    assert assumed_shape(workers, nodes, 4) == shape


def _two_linear_jobs(gpus_per_node: int = 1):
    """Two running 1-GPU jobs, on nodes 0 and 1, whose curves both say they scale perfectly,
    with one spare GPU; they differ only in speed on one GPU, so each has its own curve."""
    first = job("first", R, 1, placement=(0,), submit_s=0.0, speed_1gpu=1.0,
                scaling_alpha=0.0, scaling_beta=0.0, progress=0.001, run_s=60.0, restore_s=10.0)
    second = job("second", R, 1, placement=(1,), submit_s=10.0, speed_1gpu=2.0,
                 scaling_alpha=0.0, scaling_beta=0.0, progress=0.001, run_s=60.0,
                 restore_s=10.0)
    free = [0, 0, 1] if gpus_per_node == 1 else [gpus_per_node - 1] * 2
    return make_state(free, [first, second], gpus_per_node=gpus_per_node)


def test_profiled_speedups_replace_the_curve_only_for_jobs_with_a_profile():
    state = _two_linear_jobs(gpus_per_node=2)
    # measured: 1 GPU 10 it/s; a second GPU on the same node adds half; another node adds 1
    measured = {(1,): 10.0, (2,): 15.0, (1, 1): 11.0}
    speedups = ProfiledSpeedups({curve_key(1.0, 0.0, 0.0): measured.__getitem__})
    rows = np.array([[0], [1]])
    workers, nodes = np.array([[1, 2, 2, 0]]), np.array([[1, 1, 2, 1]])
    got = speedups(state, rows, workers, nodes)
    np.testing.assert_allclose(got[0], [1.0, 1.5, 1.1, 0.0])
    np.testing.assert_allclose(got[1], curve_speedups(state, np.array([1]), workers[0],
                                                      nodes[0]))
    assert got.shape == (2, 4)


def test_a_heuristic_told_speeds_grows_the_job_its_profile_says_scales():
    """By the curves both jobs gain alike and the older one gets the spare GPU; the first
    job's profile says a second GPU gains it nothing, so told speeds, the second job gets it."""
    state = _two_linear_jobs()
    config = ElasticConfig(remaining_power=0.25)
    assert ElasticPolicy(config).targets(state).tolist() == [2, 1]
    flat = ProfiledSpeedups({curve_key(1.0, 0.0, 0.0): lambda shape: 10.0})
    told = ElasticPolicy(config, speedups=flat)
    assert told.targets(state).tolist() == [1, 2]
    action = told.act(state)
    assert action.job_id == "second" and action.workers == 2


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlalloc.cli.main", *argv], capture_output=True,
                          text=True, timeout=300)


@needs_pollux
def test_sizes_fit_tells_the_heuristic_each_jobs_measured_speed(tmp_path):
    """A saved size table carries its applications' profiles; the heuristic it loads ranks by
    the speed-ups the simulator runs the jobs at, not the fitted curve; without the copies it
    is a one-line error, and a table saved before them keeps the curve."""
    out = tmp_path / "sized"
    proc = _cli("sizes", "fit", "--workload", str(POLLUX / "workload-1.csv"), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    saved = json.loads((out / SIZES_FILE).read_text())
    assert saved["profiles"] and sorted(p.name for p in (out / PROFILES_DIR).iterdir()
                                        if p.is_dir()) == saved["profiles"]
    assert "Apache License" in (out / PROFILES_DIR / "LICENSE").read_text()
    assert "speed-ups from the profiles of" in proc.stdout
    assert "measured profiles" in (out / "card.md").read_text()
    policy = load_policy(str(out))
    assert isinstance(policy.speedups, ProfiledSpeedups)
    scenario = build_scenario(str(POLLUX / "workload-3.csv"), "16x4")
    sim = scenario.simulator(NO_FAILURES, 0)
    run_policy(sim, policy.act, limit_s=2 * 3600.0)
    state, speeds = sim.state(), dict(zip((j.job_id for j in scenario.workload.jobs),
                                          scenario.speeds, strict=True))
    checked, off = 0, []
    for row in np.flatnonzero(state.jobs.workers > 1).tolist():
        placement = state.jobs.placement[row]
        shape = placement_shape(placement)
        n, k = len(placement), len(shape)
        if assumed_shape(n, k, 4) != shape:
            continue
        model = speeds[state.jobs.job_id[row]].iterations_per_s
        told = policy.speedups(state, np.array([row]), np.array([n]), np.array([k]))[0]
        assert told == pytest.approx(model(shape) / model((1,)), rel=1e-9)
        curve = curve_speedups(state, np.array([row]), np.array([n]), np.array([k]))[0]
        off.append(abs(curve / told - 1.0))
        checked += 1
    assert checked >= 3 and max(off) > 0.01  # the curve is not the profile on these jobs
    shutil.rmtree(out / PROFILES_DIR / saved["profiles"][0])
    with pytest.raises(UserError, match=f"profiles of {saved['profiles'][0]} are missing; "
                                        "copy .* or fit it again with `rlalloc sizes fit`"):
        load_policy(str(out))
    older = {key: value for key, value in saved.items() if key != "profiles"}
    (out / SIZES_FILE).write_text(json.dumps(older))
    assert load_policy(str(out)).speedups is curve_speedups


@needs_pollux
@pytest.mark.parametrize("damage", ["abc", "0"])
def test_a_copied_profile_whose_step_time_is_damaged_is_one_line_at_load(tmp_path, damage):
    """The profiles build their throughput models on first use: a step time that is not a
    number, or 0, loaded fine and ended the run in a pandas TypeError or a ZeroDivisionError
    at its first resize."""
    copies = tmp_path / "policy" / PROFILES_DIR / "ncf"
    shutil.copytree(DEFAULT_PROFILES_ROOT / "ncf", copies)
    placements = copies / "placements.csv"
    header, *rows = placements.read_text().splitlines()
    step = header.split(",").index("step_time")
    damaged = [",".join(value if i != step else damage for i, value in enumerate(row.split(",")))
               for row in rows]
    placements.write_text("\n".join([header, *damaged]) + "\n")
    key = (1.0, 0.0, 0.0)
    sizes = JobSizeHistory({key: 100.0}, {key: 1}, {key: (("ncf", 256),)})
    with pytest.raises(UserError, match=r"copied profiles cannot be read \(.*\); fit it again "
                                        "with `rlalloc sizes fit`$"):
        read_copied_profiles(tmp_path / "policy", ["ncf"], sizes, "rlalloc sizes fit")


@needs_pollux
def test_a_copied_profile_with_a_bad_cell_is_one_line(tmp_path):
    """A copy that parses as CSV but holds a placement that is not a number was a bare
    ValueError out of the profile loader."""
    copies = tmp_path / "policy" / PROFILES_DIR / "ncf"
    shutil.copytree(DEFAULT_PROFILES_ROOT / "ncf", copies)
    placements = copies / "placements.csv"
    header, first, *rest = placements.read_text().splitlines(keepends=True)
    placements.write_text("".join([header, "x" + first.split(",", 1)[1], *rest]))
    sizes = JobSizeHistory({}, {}, {})
    with pytest.raises(UserError, match=r"copied profiles cannot be read \(.*\); fit it again "
                                        "with `rlalloc sizes fit`$"):
        read_copied_profiles(tmp_path / "policy", ["ncf"], sizes, "rlalloc sizes fit")


@needs_pollux
def test_sizes_fit_speeds_curves_saves_the_sizes_alone(tmp_path):
    """`--speeds curves` writes the size-told heuristic on the curves (the README's row to
    compare with), and replacing a fit with profiles leaves none of its copies behind."""
    out = tmp_path / "sized"
    workload = str(POLLUX / "workload-1.csv")
    assert _cli("sizes", "fit", "--workload", workload, "--out", str(out)).returncode == 0
    assert (out / PROFILES_DIR).is_dir()
    proc = _cli("sizes", "fit", "--workload", workload, "--speeds", "curves", "--out", str(out),
                "--force")
    assert proc.returncode == 0, proc.stderr
    assert "speed-ups from the state's curves" in proc.stdout
    assert json.loads((out / SIZES_FILE).read_text())["profiles"] == []
    assert not (out / PROFILES_DIR).exists()
    assert load_policy(str(out)).speedups is curve_speedups
    bad = _cli("sizes", "fit", "--workload", workload, "--speeds", "exact", "--out",
               str(tmp_path / "other"))
    assert bad.returncode == 2 and bad.stderr.count("\n") <= 2 and "--speeds" in bad.stderr
