"""End to end: the actuator against the digital twin, through a real Prometheus and real HTTP.

The twin runs the simulator at 60-100x real time, exports its telemetry under the real exporter
names, serves Nodes/Pods/PyTorchJobs through kmock and moves workers when the actuator writes.
Every PyTorchJob the actuator writes is validated against the Training Operator's CRD by the
twin's API (a 422 would fail the move and these tests).
"""

from __future__ import annotations

import re
import threading

import pytest
import yaml

from rlalloc.actuator.twin.kube_api import EVENTS, NODES, PODS, PYTORCHJOBS
from rlalloc.actuator.twin.runtime import ScriptedFailure
from rlalloc.env.state import ActionKind

from actuator_fixtures import (
    PrometheusServer,
    TinyElastic,
    controller,
    job,
    needs_prometheus,
    start_quiet_twin,
    start_scraped_twin,
    twin_config,
    wait_until,
)

pytestmark = [needs_prometheus, pytest.mark.expensive]

SPEED = 80.0
"""Twin clock speed-up: the actuator's cycles and Prometheus's scrapes (a quarter second each)
keep up on a loaded 2-core machine (at 60x with cycles and scrapes of a second, the simulated
clock outran the cycles when other jobs shared the CPU), yet a short test."""
FAILOVER_SPEED = 2 * SPEED
"""Speed-up of the twin in the failover test: its 1,600 simulated seconds in ten of wall time."""


def _replicas(twin: object, name: str) -> int:
    obj = twin.call(twin.api.get, PYTORCHJOBS, "default", name)
    return int(obj["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"])


def _worker_nodes(twin: object, name: str) -> list[str]:
    pods = twin.call(twin.api.list, PODS)
    return sorted(p["spec"].get("nodeName", "") for p in pods
                  if p["metadata"]["name"].startswith(f"{name}-worker-"))


def _applied_workers(twin: object) -> dict[str, list[tuple[str, int]]]:
    """Per job, the (reason, workers) of the actuator's applied moves in the order it made
    them, read from the Normal Events it recorded (names end in their creation time in ns; a
    move repeated exactly is folded into its Event's count, so it is listed `count` times)."""
    events = sorted(twin.call(twin.api.list, EVENTS),
                    key=lambda e: int(e["metadata"]["name"].rsplit(".", 1)[1], 16))
    applied: dict[str, list[tuple[str, int]]] = {}
    for event in events:
        if event["type"] == "Normal":
            workers = int(re.match(r"scale \S+ to (\d+) workers", event["message"]).group(1))
            applied.setdefault(event["involvedObject"]["name"], []).extend(
                [(event["reason"], workers)] * event["count"])
    return applied


def _run(ctl: object, stop: threading.Event) -> threading.Thread:
    thread = threading.Thread(target=ctl.run, args=(stop,), daemon=True)
    thread.start()
    return thread


def test_scales_up_when_gpus_free_and_down_when_the_queue_grows(tmp_path):
    # 16 GPUs. "a" arrives alone: started, then grown to its maximum of 8 while GPUs are free.
    # At t=600 s, "b" (8) and "c" (6..8) arrive: b takes the 8 free GPUs, c cannot start, so the
    # policy shrinks "a" to its minimum and c starts on the 7 GPUs that frees.
    twin, prometheus = start_scraped_twin(tmp_path, [job("a", 0, 4, 1, 8), job("b", 600, 8, 8, 8),
                                                     job("c", 600, 8, 6, 8)], SPEED)
    stop = threading.Event()
    try:
        ctl = controller(tmp_path, twin, twin_config(SPEED, prometheus.url), TinyElastic())
        thread = _run(ctl, stop)
        assert wait_until(lambda: _replicas(twin, "a") == 8, 90), "a was not grown to 8"
        # the twin exports the checkpoint step a job resumes from after losing a node
        prometheus.wait_for('rlalloc_trainer_last_checkpoint_step{job="a"} '
                            '<= rlalloc_trainer_step{job="a"}')
        assert wait_until(lambda: _replicas(twin, "a") == 1 and _replicas(twin, "c") == 7
                          and _replicas(twin, "b") == 8, 120), "the queue did not shrink a"
        assert wait_until(lambda: twin.call(lambda: all(
            s == 1 for s in twin.twin.sim.state().jobs.status)), 10), "jobs are not running"
        stop.set()
        thread.join(10)
        assert not thread.is_alive()
        # exactly the obvious moves, in order, each recorded as an Event on its job: no move
        # repeated or undone (the cooldown holds a job the cluster has not caught up with yet)
        assert _applied_workers(twin) == {"a": [("Started", 4), ("Scaled", 8), ("Scaled", 1)],
                                          "b": [("Started", 8)], "c": [("Started", 7)]}
        assert ctl.metrics.decisions.labels("scale", "applied")._value.get() == 5
    finally:
        stop.set()
        prometheus.stop()
        twin.stop()


def test_xid_errors_drain_the_node_before_it_fails(tmp_path):
    # One 4-worker job packs onto node-0000. Once it runs there, the node starts reporting XID
    # errors and fails 1,400 simulated seconds later. The actuator must cordon the node and move
    # the job before the failure (the twin records which jobs a failure hits).
    twin, prometheus = start_scraped_twin(tmp_path, [job("a", 0, 4, 4, 4)], FAILOVER_SPEED)
    stop = threading.Event()
    try:
        ctl = controller(tmp_path, twin, twin_config(FAILOVER_SPEED, prometheus.url),
                         TinyElastic())
        thread = _run(ctl, stop)
        assert wait_until(lambda: _worker_nodes(twin, "a") == ["node-0000"] * 4, 10)
        now = twin.call(lambda: twin.twin.sim.time_s)
        fail_at = now + 1500.0
        failure = ScriptedFailure("node-0000", now + 100.0, fail_at)
        twin.call(twin.twin.script_failure, failure)
        assert wait_until(lambda: twin.call(lambda: twin.twin.sim.time_s) > fail_at + 100, 120)
        stop.set()
        thread.join(10)
        node = twin.call(twin.api.get, NODES, None, "node-0000")
        assert node["spec"].get("unschedulable") is True, "the warned node was not cordoned"
        assert twin.call(lambda: twin.twin.failure_hits) == {failure: ()}
        assert "node-0000" not in _worker_nodes(twin, "a")
        assert twin.call(lambda: int(twin.twin.sim.state().jobs.status[0])) == 1  # running
        migrated = ctl.metrics.decisions.labels("migrate", "applied")._value.get()
        assert migrated == 1
    finally:
        stop.set()
        prometheus.stop()
        twin.stop()


def test_dry_run_writes_nothing(tmp_path):
    twin = start_quiet_twin([job("a", 0, 4, 1, 8)], speed=60.0)
    prometheus = PrometheusServer(tmp_path, f"127.0.0.1:{twin.metrics_port}").start()
    try:
        prometheus.wait_for("rlalloc_twin_clock_seconds")
        ctl = controller(tmp_path, twin, twin_config(60.0, prometheus.url, dry_run=True),
                         TinyElastic())
        reports = [ctl.run_cycle() for _ in range(3)]
        assert all(r.observed for r in reports)
        outcomes = [o for r in reports for _, o in r.outcomes]
        # the first cycle would start the job; later cycles would repeat it, but the cooldown
        # (kept in dry run as if the action had happened) refuses that
        assert outcomes[0] == "dry_run" and set(outcomes) <= {"dry_run", "refused"}
        assert reports[0].outcomes[0][0].action.kind == ActionKind.SCALE
        methods = {str(r.method.value).upper() for r in list(twin.api)}
        assert methods == {"GET"}, f"dry run sent {methods - {'GET'}}"
        assert _replicas(twin, "a") == 0
    finally:
        prometheus.stop()
        twin.stop()


def test_twin_command_writes_a_runnable_demo(tmp_path, capsys):
    import json

    from rlalloc.actuator.config import load_config
    from rlalloc.cli.main import main

    out = tmp_path / "twin"
    argv = ["twin", "--workload", "synthetic:5", "--cluster", "2x4", "--kube-port", "0",
            "--metrics-port", "0", "--duration-s", "1", "--out-dir", str(out)]
    (out / "tsdb").mkdir(parents=True)  # Prometheus's, beside the twin's files: not in the way
    assert main(argv) == 0
    first = (out / "kubeconfig").read_text()
    # the files point at the ports this twin really bound (asked for any free one: not ":0"),
    # and the actuator accepts its settings file, which names that kubeconfig
    shown = capsys.readouterr().out
    api_url = json.loads(first)["clusters"][0]["cluster"]["server"]
    target = yaml.safe_load((out / "prometheus.yml").read_text())["scrape_configs"][0][
        "static_configs"][0]["targets"][0]
    assert re.fullmatch(r"http://127\.0\.0\.1:[1-9]\d*", api_url), api_url
    assert re.fullmatch(r"127\.0\.0\.1:[1-9]\d*", target) and target != api_url[7:], target
    assert api_url in shown and f"http://{target}/metrics" in shown, shown
    assert load_config(out / "actuator.yaml", {}).kubeconfig == str(out / "kubeconfig")
    # a second twin would point the first one's files at its own ports: refused, then --force
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"rlalloc: error: --out-dir {out}: already holds kubeconfig, prometheus.yml, "
                   "actuator.yaml; pass --force to replace them or choose another directory"]
    assert (out / "kubeconfig").read_text() == first
    assert main([*argv, "--force"]) == 0
    settings = yaml.safe_load((out / "actuator.yaml").read_text())
    assert settings["queries"]["clock"] == "rlalloc_twin_clock_seconds"
    assert "[5s]" in settings["queries"]["xid_errors"]  # 5 simulated minutes at 60x
    config = yaml.safe_load((out / "prometheus.yml").read_text())
    assert config["scrape_configs"][0]["honor_labels"] is True
    assert "clusters" in yaml.safe_load((out / "kubeconfig").read_text())


def test_actuate_command_runs_a_dry_cycle_against_the_twin(tmp_path, monkeypatch, capsys):
    import json
    import logging

    from rlalloc.actuator.twin.harness import actuator_settings
    from rlalloc.actuator.twin.kube_api import dump_kubeconfig
    from rlalloc.cli.main import main

    monkeypatch.setattr("rlalloc.cli.actuate.load_policy", lambda name: TinyElastic())
    root = logging.getLogger()  # the actuator installs its JSON handler here: restored after
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setattr(logging.getLogger("urllib3"), "level", logging.getLogger("urllib3").level)
    monkeypatch.delenv("RLALLOC_CRD_PATH", raising=False)  # the CRD is read from the twin
    twin = start_quiet_twin([job("a", 0, 4, 1, 8)], speed=60.0)
    prometheus = PrometheusServer(tmp_path, f"127.0.0.1:{twin.metrics_port}").start()
    try:
        prometheus.wait_for("rlalloc_twin_clock_seconds")
        (tmp_path / "kubeconfig").write_text(dump_kubeconfig(twin.kube_url))
        settings = actuator_settings(60.0, prometheus.url)
        settings.update(kubeconfig=str(tmp_path / "kubeconfig"), listen_port=0)
        (tmp_path / "actuator.yaml").write_text(yaml.safe_dump(settings))
        assert main(["actuate", "--config", str(tmp_path / "actuator.yaml"), "--once",
                     "--dry-run"]) == 0
        assert {str(r.method.value).upper() for r in list(twin.api)} == {"GET"}
        # the cycle really ran: it listed the cluster and logged the start it would have made
        # ("a" queued on an empty cluster), marked as a dry run
        listed = {r.url.path.rsplit("/", 1)[-1] for r in list(twin.api)}
        assert {"nodes", "pods", "pytorchjobs", "pytorchjobs.kubeflow.org"} <= listed
        logged = [json.loads(line) for line in capsys.readouterr().err.splitlines()
                  if line.startswith("{")]
        decisions = [(e["decision"], e["job"], e["workers"], e["outcome"], e["dry_run"])
                     for e in logged if "decision" in e]
        assert decisions == [("scale", "default/a", 4, "dry_run", True)]
    finally:
        prometheus.stop()
        twin.stop()


def _twin_argv(out: object, *extra: str) -> list[str]:
    return ["twin", "--workload", "synthetic:5", "--cluster", "2x4", "--kube-port", "0",
            "--metrics-port", "0", "--duration-s", "0.2", "--out-dir", str(out), *extra]


def test_twin_command_gives_back_the_signal_handlers(tmp_path):
    # run() installs its own SIGINT/SIGTERM handlers to stop cleanly; it used to leave them in
    # place, so in a process that goes on (a test session) Ctrl-C only set a dead Event
    import signal

    from rlalloc.cli.main import main

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    assert main(_twin_argv(tmp_path / "twin")) == 0
    assert {s: signal.getsignal(s) for s in before} == before


@pytest.mark.parametrize(("flags", "named"), [
    (["--fail-node", "node-0000:nan:inf"], "--fail-node"),  # used to run, never failing
    (["--fail-node", "node-0000:0:inf"], "--fail-node"),
    (["--fail-node", "node-0000:-20:-10"], "--fail-node"),  # before the twin's clock
    (["--fail-node", ":1:2"], "NODE"),  # used to say FAIL_S must come after WARN_S
    (["--duration-s", "-1"], "--duration-s"),  # used to run until Ctrl-C
    (["--duration-s", "nan"], "--duration-s"),
])
def test_twin_command_refuses_impossible_failure_times_and_durations(tmp_path, capsys, flags,
                                                                      named):
    from rlalloc.cli.main import main

    assert main(_twin_argv(tmp_path / "twin", *flags)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0], err
    assert not (tmp_path / "twin").exists()


def test_twin_command_that_cannot_write_its_files_is_one_line_and_closes_its_ports(
        tmp_path, capsys):
    # --out-dir's actuator.yaml is a directory: the files cannot be written. That used to be a
    # traceback (IsADirectoryError) that left the twin's two ports open in the calling process
    # and the demo files half replaced.
    import socket

    from rlalloc.cli.main import main

    out = tmp_path / "twin"
    out.mkdir()
    (out / "kubeconfig").write_text("old")
    (out / "actuator.yaml").mkdir()
    ports = []
    for _ in range(2):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            ports.append(probe.getsockname()[1])
    argv = [*_twin_argv(out, "--force"), "--kube-port", str(ports[0]), "--metrics-port",
            str(ports[1])]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "actuator.yaml" in err[0], err
    assert (out / "kubeconfig").read_text() == "old"
    assert sorted(p.name for p in out.iterdir()) == ["actuator.yaml", "kubeconfig"]
    for port in ports:
        with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
            probe.connect(("127.0.0.1", port))


def test_twin_command_stopped_by_sigterm_while_starting_is_one_line(tmp_path):
    # SIGTERM before the twin serves (here: while it starts its servers) stops it as Ctrl-C
    # does: one line, exit 130, and the --out-dir it created removed. It used to kill the
    # process outright (no handler was installed until the twin served), leaving the directory.
    import subprocess
    import sys

    out = tmp_path / "twin"
    script = (
        "import os, signal, sys, time\n"
        "import rlalloc.actuator.twin.harness as harness\n"
        "def start_twin(*args, **kwargs):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(5)\n"
        "harness.start_twin = start_twin\n"
        "from rlalloc.cli.main import main\n"
        f"sys.exit(main({_twin_argv(out)!r}))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip().splitlines() == ["rlalloc: interrupted"]
    assert not out.exists()


def test_twin_command_takes_a_failure_scripted_for_its_first_seconds(tmp_path, capsys):
    # the first tick jumps the simulator to its next event (~13 s in): a failure at 1 s was
    # refused as "not after the twin's now" whenever that tick ran before it was scheduled
    from rlalloc.cli.main import main

    for attempt in range(3):
        assert main(_twin_argv(tmp_path / f"demo-{attempt}",
                               "--fail-node", "node-0000:0:1")) == 0, capsys.readouterr().err
