"""What `rlalloc twin` shows a user: its live lines (a node's warning, failure and repair at
their simulated time, finished jobs), its closing summary, and the columns `kubectl get` prints
of its objects. Tiny worlds: one or two jobs on two nodes, failures scripted."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
import types
import urllib.request
from pathlib import Path

import pytest

from rlalloc.actuator.twin import runtime
from rlalloc.actuator.twin.kube_api import (
    EVENTS,
    NODES,
    PODS,
    PYTORCHJOBS,
    ApiServerThread,
    TwinKubeAPI,
    dump_kubeconfig,
)
from rlalloc.actuator.twin.runtime import _HEALTH_KINDS, ScriptedFailure, Twin, TwinEvent
from rlalloc.actuator.twin.tables import human_age
from rlalloc.env.failures import HealthEvent, WarningEpisode

from actuator_fixtures import job, quiet_params, scenario

ROOT = Path(__file__).resolve().parents[1]
TICK_S = 0.2
SPEED = 60.0


def _twin(jobs: list, events: list[TwinEvent]) -> Twin:
    """A twin of `jobs` on 2 x 4 GPUs without random failures, telling `events` what happens."""
    sim = scenario(jobs, nodes=2, gpus=4).simulator(quiet_params(SPEED, TICK_S))
    twin = Twin(sim, TwinKubeAPI(), speed=SPEED, on_event=events.append)
    twin.tick(TICK_S)  # the jobs submitted at 0 arrive
    return twin


def _start(twin: Twin, sim_id: str, workers: int) -> str:
    """Ask for `workers` replicas of job `sim_id` as the actuator would, and tick once so the
    twin's scheduler binds them; returns the PyTorchJob's name."""
    name = twin.job_name(sim_id)
    twin.api.patch(PYTORCHJOBS, "default", name,
                   {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": workers}}}})
    twin.tick(TICK_S)
    return name


def _run_until(twin: Twin, sim_s: float) -> None:
    while twin.sim.time_s < sim_s and not twin.sim.done:
        twin.tick(TICK_S)


# ------------------------------------------------------------------------- simulator hook
def test_the_simulator_tells_its_health_listener_what_takes_effect_and_a_fork_tells_nobody():
    from sim_helpers import job as sim_job
    from sim_helpers import simulator

    sim = simulator([sim_job("a", 0, 4, 1e6)])
    told: list[tuple[str, int, float]] = []
    sim.health_listener = lambda event, t: told.append((event.kind, event.node, t))
    sim.schedule_failure("node-0001", 100.0, warning_lead_s=40.0)
    # the node is down then: no second failure, and no repair of it (as the failure process
    # draws them: the node is back repair_s after the failure that took it down)
    sim.schedule_failure("node-0001", 150.0)
    fork = sim.fork()
    assert fork.health_listener is None
    repair_s = sim.params.failures.repair_s
    while sim.time_s < 150.0 + repair_s + 1:
        sim.advance()
        assert sim.state().nodes.ready[1] == (not 100.0 <= sim.time_s < 100.0 + repair_s)
    assert told == [("warn", 1, 60.0), ("fail", 1, 100.0), ("repair", 1, 100.0 + repair_s)]
    while fork.time_s < 200.0:
        fork.advance()  # its failure happens too, unreported
    assert len(told) == 3


# ------------------------------------------------------------------------------ the twin
def test_the_twin_tells_a_scripted_failure_as_it_happens_with_the_jobs_it_requeued():
    events: list[TwinEvent] = []
    twin = _twin([job("a", 0, 4, 4, 4), job("b", 0, 4, 4, 4, work=600.0)], events)
    name_a = _start(twin, "a", 4)
    name_b = _start(twin, "b", 4)
    on_node = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in twin.api.list(PODS)}
    node_a = on_node[f"{name_a}-worker-0"]
    warn_s, fail_s = twin.sim.time_s + 60.0, twin.sim.time_s + 300.0
    twin.script_failure(ScriptedFailure(node_a, warn_s, fail_s))
    _run_until(twin, fail_s + twin.sim.params.failures.repair_s + SPEED * TICK_S)
    health = [e for e in events if e.kind != "finished"]
    assert health == [TwinEvent(warn_s, "warning", node_a),
                      TwinEvent(fail_s, "failed", node_a, (name_a,)),
                      TwinEvent(fail_s + twin.sim.params.failures.repair_s, "repaired", node_a)]
    finished = [e for e in events if e.kind == "finished"]
    assert [e.subject for e in finished] == [name_b]
    # told at the tick that mirrors the completion: the job is gone from the API by then
    assert finished[0].time_s >= 600.0 / 4
    summary = twin.summary()
    assert (summary.failures, summary.warnings, summary.scripted_failures,
            summary.scripted_pending, summary.jobs_requeued) == (1, 1, 1, 0, 1)
    assert (summary.jobs_finished, summary.jobs_in_system, summary.jobs_to_arrive) == (1, 1, 0)
    assert summary.simulated_s == twin.sim.time_s


def test_a_readiness_flap_is_held_for_three_scrape_intervals(monkeypatch):
    """With Prometheus scraping every 5 s, a flap held 3 wall seconds (as it was whatever the
    interval) was missed by most scrapes; it must stay visible for more than two of them."""
    wall = [1000.0]
    monkeypatch.setattr(runtime, "time", types.SimpleNamespace(monotonic=lambda: wall[0]))
    sim = scenario([job("a", 0, 4, 4, 4)], nodes=2, gpus=4).simulator(quiet_params(SPEED, TICK_S))
    twin = Twin(sim, TwinKubeAPI(), speed=SPEED, scrape_interval_s=5.0)
    node = twin.sim.state().nodes.name[0]
    flap_s = twin.sim.time_s + 30.0  # a false alarm with one readiness flap
    twin.sim._push_health(HealthEvent(flap_s - 20.0, "warn", 0,
                                      WarningEpisode(0, flap_s - 20.0, flap_s + 600.0, None,
                                                     flap_s=[flap_s])))

    def flaps() -> int:
        return int(twin.sim.state().nodes.ready_flaps_60m[0])

    while flaps() == 0:
        twin.tick(TICK_S)
    before = flaps()

    def ready_metric(after_s: float) -> bool:
        wall[0] = flapped_at + after_s
        twin.tick(0.0)  # mirrors again without simulating: no new flap
        assert flaps() == before
        return next(n for n in twin.frame.nodes if n.name == node).ready_metric

    flapped_at = wall[0]
    assert [ready_metric(t) for t in (0.0, 14.9, 15.1)] == [False, False, True]


def test_a_scripted_failure_of_a_node_already_down_is_no_failure_and_not_the_scripts():
    # node-0000 fails by the failure process (scheduled on the simulator, as its draws are);
    # the failure scripted 50 s later finds it down, so the simulator fails nothing: the one
    # failure is the random one. The summary used to count it as scripted.
    from rlalloc.cli.twin import _summary_text

    twin = _twin([job("a", 0, 4, 4, 4)], [])
    name = _start(twin, "a", 4)
    node = twin.api.get(PODS, "default", f"{name}-worker-0")["spec"]["nodeName"]
    now = twin.sim.time_s
    twin.sim.schedule_failure(node, now + 100.0)
    late = ScriptedFailure(node, now + 120.0, now + 150.0)
    twin.script_failure(late)
    _run_until(twin, now + 300.0)
    summary = twin.summary()
    assert (summary.failures, summary.scripted_failures, summary.scripted_pending,
            summary.scripted_found_down) == (1, 1, 0, 1)
    assert twin.failure_hits == {}
    text = _summary_text(summary, 5.0, SPEED)
    assert "node failures: 1 (0 scripted, 1 from --failures)" in text
    assert "1 scripted failure(s) came while the node was already down" in text


def test_each_scripted_failure_of_one_node_is_counted_once_with_its_own_hits():
    # node X is scripted to fail twice: once with job a on it, and again after its repair,
    # with nothing on it; a third failure scripted while it is down adds nothing. The hits
    # used to be kept per node, the second failure overwriting the first.
    twin = _twin([job("a", 0, 4, 4, 4, work=1e7)], [])
    name = _start(twin, "a", 4)
    node = twin.api.get(PODS, "default", f"{name}-worker-0")["spec"]["nodeName"]
    repair_s = twin.sim.params.failures.repair_s
    now = twin.sim.time_s
    first = ScriptedFailure(node, now + 60.0, now + 100.0)
    while_down = ScriptedFailure(node, now + 150.0, now + 200.0)
    second = ScriptedFailure(node, now + repair_s + 200.0, now + repair_s + 300.0)
    for failure in (first, while_down, second):
        twin.script_failure(failure)
    # requeued by the first failure, a is bound again on the other node (X is down): the
    # second failure, after X's repair, hits nothing
    _run_until(twin, now + 2 * repair_s + 400.0)
    assert twin.failure_hits == {first: (name,), second: ()}
    summary = twin.summary()
    assert (summary.failures, summary.scripted_failures, summary.scripted_pending,
            summary.scripted_found_down) == (2, 3, 0, 1)


def test_the_printed_prometheus_command_listens_where_the_actuator_looks():
    from rlalloc.cli.twin import prometheus_command

    out = Path("twin")
    base = "prometheus --config.file=twin/prometheus.yml --storage.tsdb.path=twin/tsdb"
    assert prometheus_command(out, "http://127.0.0.1:9090") == base
    assert prometheus_command(out, "http://127.0.0.1:9091") == (
        base + " --web.listen-address=:9091")
    assert prometheus_command(out, "http://prometheus.local/prom/") == (
        base + " --web.listen-address=:80 --web.route-prefix=/prom")
    # TLS needs a certificate the twin has none of: the command says where it goes
    assert prometheus_command(out, "https://127.0.0.1:9090").startswith(
        base + " --web.config.file=WEB_CONFIG.yml  # with tls_server_config")


def test_the_summary_counts_the_actuators_events_by_reason_repeats_included():
    twin = _twin([job("a", 0, 4, 1, 4), job("b", 3600, 4, 1, 4)], [])
    twin.script_failure(ScriptedFailure("node-0000", 500.0, 600.0))
    for name, reason, count in (("e1", "Started", 1), ("e2", "Scaled", 2),
                                ("e3", "Started", 1)):
        twin.api.put(EVENTS, "default", name, {"metadata": {"name": name}, "reason": reason,
                                               "count": count})
    summary = twin.summary()
    assert summary.actuator_events == {"Started": 2, "Scaled": 2}
    assert (summary.failures, summary.scripted_pending, summary.jobs_to_arrive) == (0, 1, 1)


def test_the_twins_pods_carry_their_phase_and_node():
    twin = _twin([job("a", 0, 4, 4, 8)], [])
    name = _start(twin, "a", 4)
    pods = twin.api.list(PODS)
    assert len(pods) == 4
    assert {(p["status"]["phase"], p["spec"]["nodeName"]) for p in pods} == {
        ("Running", twin.sim.node_names[twin.sim.state().jobs.placement[0][0]])}
    twin.api.patch(PYTORCHJOBS, "default", name,
                   {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 8}}}})
    twin.tick(TICK_S)  # 8 workers of 1 GPU fit on the two nodes: all bound
    assert sorted(p["spec"].get("nodeName", "") for p in twin.api.list(PODS)
                  if p["metadata"]["name"].startswith(name)) == ["node-0000"] * 4 + [
        "node-0001"] * 4


# ------------------------------------------------------------------------- kubectl tables
def _table(url: str) -> dict:
    request = urllib.request.Request(url, headers={
        "Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.load(response)


def _serving(twin: Twin) -> ApiServerThread:
    return ApiServerThread(twin.api).start()


def test_kubectl_tables_show_pod_status_and_node_with_ages_on_the_twins_clock():
    twin = _twin([job("a", 0, 4, 2, 2), job("b", 0, 4, 4, 8)], [])
    name = _start(twin, "a", 2)
    _start(twin, "b", 4)
    twin.api.patch(PYTORCHJOBS, "default", twin.job_name("b"),  # more than fit: one Pending
                   {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 7}}}})
    twin.tick(TICK_S)
    _run_until(twin, twin.sim.time_s + 600.0)
    server = _serving(twin)
    try:
        table = _table(f"{server.url}/api/v1/namespaces/default/pods")
        # a plain list (what kmock answers) made kubectl print NAME and AGE only
        assert table["kind"] == "Table"
        header = [c["name"] for c in table["columnDefinitions"]]
        wide = {c["name"] for c in table["columnDefinitions"] if c["priority"] == 1}
        assert {"Status", "Node"} <= set(header) and "Node" in wide and "Status" not in wide
        rows = {row["cells"][0]: dict(zip(header, row["cells"], strict=True))
                for row in table["rows"]}
        for pod in twin.api.list(PODS):
            row = rows[pod["metadata"]["name"]]
            assert row["Status"] == pod["status"]["phase"]
            assert row["Node"] == pod["spec"].get("nodeName", "<none>")
        assert {r["Status"] for r in rows.values()} == {"Running", "Pending"}
        # a's pods were created ~600 simulated seconds ago: aged on the twin's clock, not the
        # wall clock (a fraction of a second) nor from 1970 (the twin's epoch here)
        assert rows[f"{name}-worker-0"]["Age"] == "10m"
        plain = json.load(urllib.request.urlopen(
            f"{server.url}/api/v1/namespaces/default/pods", timeout=5))
        assert plain["kind"] == "PodList"  # clients that ask for objects still get objects
    finally:
        server.stop()


def test_kubectl_table_of_a_cordoned_node_says_scheduling_disabled():
    twin = _twin([job("a", 0, 4, 1, 4)], [])
    node = twin.api.get(NODES, None, "node-0001")
    twin.api.put(NODES, None, "node-0001", {**node, "spec": {"unschedulable": True}})
    server = _serving(twin)
    try:
        table = _table(f"{server.url}/api/v1/nodes")
        status = {row["cells"][0]: row["cells"][1] for row in table["rows"]}
        assert status == {"node-0000": "Ready", "node-0001": "Ready,SchedulingDisabled"}
    finally:
        server.stop()


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_get_pods_wide_shows_status_and_node(tmp_path):
    twin = _twin([job("a", 0, 4, 2, 2)], [])
    name = _start(twin, "a", 2)
    server = _serving(twin)
    try:
        (tmp_path / "kubeconfig").write_text(dump_kubeconfig(server.url))
        shown = subprocess.run(["kubectl", "--kubeconfig", str(tmp_path / "kubeconfig"), "get",
                                "pods", "-o", "wide"], capture_output=True, text=True,
                               timeout=30)
        assert shown.returncode == 0, shown.stderr
        header, *lines = shown.stdout.splitlines()
        assert header.split()[:3] == ["NAME", "READY", "STATUS"] and "NODE" in header.split()
        node = twin.api.get(PODS, "default", f"{name}-worker-0")["spec"]["nodeName"]
        assert [line.split()[0] for line in lines] == [f"{name}-worker-0", f"{name}-worker-1"]
        assert all("Running" in line.split() and node in line.split() for line in lines)
    finally:
        server.stop()


def test_ages_read_as_the_api_server_writes_them():
    # known answers of Kubernetes' duration.HumanDuration
    assert [human_age(s) for s in (-5, 0, 59, 119, 120, 200, 600, 3 * 3600 - 60, 3 * 3600,
                                   5 * 3600 + 60, 30 * 3600, 50 * 3600, 8 * 86_400,
                                   3 * 365 * 86_400)] == [
        "<invalid>", "0s", "59s", "119s", "2m", "3m20s", "10m", "179m", "3h", "5h1m", "30h",
        "2d2h", "8d", "3y"]


# ------------------------------------------------------------------------------ command
def _argv(out: Path, *flags: str) -> list[str]:
    return ["twin", "--workload", "synthetic:5", "--cluster", "2x4", "--failures", "none",
            "--kube-port", "0", "--metrics-port", "0", "--out-dir", str(out), *flags]


def test_twin_command_prints_the_scripted_failure_and_a_summary(tmp_path, capsys):
    from rlalloc.cli.main import main

    assert main(_argv(tmp_path / "twin", "--fail-node", "node-0001:30:90",
                      "--duration-s", "3", "--prometheus-url", "http://127.0.0.1:9091")) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.strip().startswith("prometheus --config.file=")
               and line.endswith(" --web.listen-address=:9091") for line in lines), lines
    live = [line for line in lines if line.startswith("[sim ")]
    assert live[:2] == ["[sim 0:00:30] node-0001 warns: XID errors (the simulator's sign of a "
                        "coming failure)", "[sim 0:01:30] node-0001 failed; no job was running "
                        "on it"]
    end = lines.index(next(line for line in lines if line.startswith("twin stopped after")))
    stopped = re.fullmatch(r"twin stopped after 0:0([2-5]):\d\d of simulated time "
                           r"\((\d+) s at 60x\)", lines[end])  # wall seconds: 3 + start-up
    assert stopped and int(stopped[2]) >= 3, lines[end]
    summary = "\n".join(lines[end:])
    assert "node failures: 1 (1 scripted, 0 from --failures) after 1 warning(s)" in summary
    assert "actuator: no Events recorded" in summary


def test_twin_command_stopped_by_sigterm_prints_its_summary(tmp_path):
    out = tmp_path / "twin"
    script = f"import sys\nfrom rlalloc.cli.main import main\nsys.exit(main({_argv(out)!r}))\n"
    process = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (out / "actuator.yaml").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 0, stderr
    assert "twin stopped after" in stdout and "jobs: 0 finished" in stdout, stdout


def test_the_simulator_tells_its_listener_no_warning_episode_end():
    """Warning episodes end ("calm", false alarms included) without a line for the user: the
    listener hears warnings, failures and repairs only, so the twin maps every kind it hears."""
    from rlalloc.env.failures import FAILURE_PRESETS, FailureParams
    from rlalloc.env.params import SimParams
    from rlalloc.env.scenario import build_scenario

    params = SimParams(failures=FailureParams(failures_per_gpu_day=FAILURE_PRESETS["stress"] * 50))
    sim = build_scenario("synthetic:40:1.0", "4x4", seed=1).simulator(params, 1)
    heard: list[str] = []
    sim.health_listener = lambda event, _t: heard.append(event.kind)
    while sim.time_s < 5 * 86_400.0 and not sim.done:
        sim.advance()
    assert {"warn", "fail", "repair"} <= set(heard) and set(heard) <= set(_HEALTH_KINDS)
