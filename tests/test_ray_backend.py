"""The Ray execution backend (`rlalloc.env.ray_cluster`): the same results as local processes on a
real local Ray cluster, failures reported with the run they were, and bad --ray input refused in
one line before anything is written."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rlalloc.agent.lookahead import LookaheadPolicy, fork_on, parse_future
from rlalloc.agent.registry import load_policy
from rlalloc.env.errors import UserError
from rlalloc.env.execution import LocalProcesses
from rlalloc.env.failures import FailureParams
from rlalloc.env.params import SimParams
from rlalloc.env.scenario import build_scenario

ray = pytest.importorskip("ray")

WORKLOAD = "synthetic:24:2:2"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _cli(*argv: str, env: dict[str, str] | None = None, cwd: Path | None = None,
         ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlalloc.cli.main", *argv], capture_output=True,
                          text=True, timeout=300, env=env, cwd=cwd)


@pytest.fixture(scope="module")
def ray_address():
    """A Ray head on this machine, as a user starts one (`ray start --head`), stopped with its
    every process after the module. Without token authentication: a client names the address
    (RAY_ADDRESS or --ray HOST:PORT), and Ray then never reads a token this machine may hold
    from another cluster (~/.ray/auth_token)."""
    port = _free_port()
    head = subprocess.Popen([str(Path(sys.executable).parent / "ray"), "start", "--head",
                             "--block", "--port", str(port), "--num-cpus", "2",
                             "--include-dashboard=false", "--disable-usage-stats"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert head.poll() is None and time.monotonic() < deadline, "ray start failed"
            time.sleep(0.2)
    yield f"127.0.0.1:{port}"
    if ray.is_initialized():
        ray.shutdown()
    os.killpg(head.pid, signal.SIGKILL)
    head.wait(60)


@pytest.fixture
def joined(ray_address):
    """This process joined to the module's Ray cluster, as a command's --ray does."""
    from rlalloc.env.ray_cluster import RayTasks, connect

    connect(ray_address)
    # the test's own functions go by value: the cluster's workers cannot import this module
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield RayTasks()


@pytest.mark.expensive
def test_evaluate_on_ray_writes_the_same_results_as_local_processes(ray_address, tmp_path):
    # `auto` joins the cluster RAY_ADDRESS names; a relative workload path is read in the
    # driver's working directory on the workers too
    (tmp_path / "w.csv").write_text("job_id,submit_s,num_gpus,duration_s,min_gpus,max_gpus\n"
                                    + "".join(f"j{i},{300 * i},{1 + i % 4},{1800 + 600 * i},1,8\n"
                                              for i in range(12)))
    common = ("evaluate", "--workload", "w.csv", "--workload", WORKLOAD, "--cluster", "2x4",
              "--policies", "static,elastic,tiresias", "--seeds", "2", "--force")
    local = _cli(*common, "--jobs", "2", "--out", "local", cwd=tmp_path)
    assert local.returncode == 0, local.stderr
    env = {**os.environ, "RAY_ADDRESS": ray_address}
    remote = _cli(*common, "--ray", "auto", "--out", "on-ray", env=env, cwd=tmp_path)
    assert remote.returncode == 0, remote.stderr
    for name in ("results.json", "runs.csv"):
        assert (tmp_path / "on-ray" / name).read_text() == (tmp_path / "local" / name).read_text()
    report = json.loads((tmp_path / "on-ray" / "results.json").read_text())
    assert set(report["policies"]) == {"static", "elastic", "tiresias"}


def test_a_failed_run_is_named_and_a_lost_worker_is_retried(joined, tmp_path):
    marker = tmp_path / "first-try"
    assert list(joined.map(_dies_on_first_try, [(str(marker), 3)])) == [9]
    assert marker.exists()  # the first try ran, died, and the retry gave the result
    with pytest.raises(UserError, match=r"^item 2: two is refused$"):
        list(joined.map(_refuses_two, [1, 2, 3], describe=lambda x: f"item {x}"))
    with pytest.raises(ZeroDivisionError) as err:  # a bug keeps its traceback, named
        list(joined.map(_inverse, [1, 0], describe=lambda x: f"item {x}"))
    assert err.value.__notes__ == ["rlalloc: this failed in the run of item 0"]


def _dies_on_first_try(task: tuple[str, int]) -> int:
    marker, value = task
    if not os.path.exists(marker):
        Path(marker).touch()
        os._exit(1)  # the worker process dies, as on a lost node
    return value * value


def _refuses_two(value: int) -> int:
    if value == 2:
        raise UserError("two is refused")
    return value


def _inverse(value: int) -> float:
    return 1 / value


def test_a_planners_forks_on_ray_weigh_and_decide_as_in_this_process(joined):
    sims = [build_scenario("synthetic:40:3:3", "1x4", seed=0).simulator(
        SimParams(failures=FailureParams(failures_per_gpu_day=0.0)), 0) for _ in range(2)]
    policies = [LookaheadPolicy(lambda _state, sim=sim: sim, load_policy("elastic-srpt-0.25"),
                                [load_policy("elastic-srpt"), load_policy("elastic")],
                                parse_future("known"))
                for sim in sims]
    fork_on(policies[1], joined)
    assert isinstance(policies[0].forks, LocalProcesses)
    weighed = 0
    while weighed < 4 and not sims[0].done:
        states = [sim.state() for sim in sims]
        actions = [policy.act(state) for policy, state in zip(policies, states, strict=True)]
        assert actions[0] == actions[1]
        if policies[0].last_costs:
            weighed += 1
            assert policies[0].last_costs.keys() == policies[1].last_costs.keys()
            for action, costs in policies[0].last_costs.items():
                np.testing.assert_array_equal(costs, policies[1].last_costs[action])
            for policy in policies:
                policy.last_costs = {}
        for sim in sims:
            if actions[0].kind.name == "NOOP" or not sim.apply(actions[0]):
                sim.advance()
    assert weighed > 0 and policies[0].contested == policies[1].contested
    with pytest.raises(UserError, match="elastic forks nothing"):
        fork_on(load_policy("elastic"), joined)


@pytest.mark.parametrize("command", [
    ("evaluate", "--policies", "static"),
    ("headroom",),
    ("simulate", "--policy", "static"),
])
def test_an_address_where_nothing_answers_is_refused_in_one_line(command, tmp_path):
    out = tmp_path / "out"
    proc = _cli(*command, "--workload", WORKLOAD, "--cluster", "2x4",
                "--ray", f"127.0.0.1:{_free_port()}", "--out", str(out))
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("rlalloc: error: --ray 127.0.0.1:") and "nothing answers" in line
    assert not out.exists()


def test_the_actuator_refuses_an_address_where_nothing_answers_before_it_starts():
    proc = _cli("actuate", "--ray", f"127.0.0.1:{_free_port()}", "--once", "--dry-run")
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("rlalloc: error: --ray 127.0.0.1:") and "nothing answers" in line


def test_ray_not_installed_is_refused_in_one_line(tmp_path):
    shadow = tmp_path / "shadow"
    shadow.mkdir()  # a `ray` that fails to import, as where the extra is not installed
    (shadow / "ray.py").write_text("raise ModuleNotFoundError(\"No module named 'ray'\", "
                                   "name='ray')\n")
    env = {**os.environ, "PYTHONPATH": str(shadow)}
    out = tmp_path / "out"
    proc = _cli("evaluate", "--workload", WORKLOAD, "--policies", "static", "--ray", "auto",
                "--out", str(out), env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("rlalloc: error: --ray needs the [ray] extra (ray is not "
                                   "installed); pip install 'rlalloc[ray]', or leave out --ray "
                                   "to run on this machine")
    assert not out.exists()


def test_simulate_refuses_ray_for_a_policy_that_forks_nothing(ray_address, tmp_path):
    env = {**os.environ, "RAY_ADDRESS": ray_address}
    proc = _cli("simulate", "--workload", WORKLOAD, "--cluster", "2x4", "--policy", "elastic",
                "--ray", "auto", "--out", str(tmp_path / "out"), env=env)
    assert proc.returncode == 2 and "elastic forks nothing" in proc.stderr
    assert not (tmp_path / "out").exists()
