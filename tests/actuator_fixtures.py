"""Shared pieces of the actuator tests: a real Prometheus server, tiny twins, a tiny policy.

Imported by tests/test_actuator_*.py (there is no conftest for them on purpose: the fixtures
stay next to the tests that use them).
"""

from __future__ import annotations

import functools
import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import yaml

from rlalloc.actuator.config import ActuatorConfig, Queries
from rlalloc.actuator.crd_schema import PyTorchJobValidator
from rlalloc.actuator.k8s_names import PYTORCHJOB_CRD
from rlalloc.actuator.kube import KubeClient, api_client_from
from rlalloc.actuator.loop import Controller
from rlalloc.actuator.observe import MetricsSnapshot, PrometheusSource, RecordedMetrics
from rlalloc.actuator.twin.harness import (
    RunningTwin,
    actuator_settings,
    prometheus_config,
    start_twin,
)
from rlalloc.actuator.twin.kube_api import (
    NODES,
    PODS,
    PYTORCHJOBS,
    ApiServerThread,
    TwinKubeAPI,
    dump_kubeconfig,
    installed_crd,
)
from rlalloc.actuator.twin.render import cluster_objects, query_results
from rlalloc.env.cluster import uniform_cluster
from rlalloc.env.failures import FailureParams
from rlalloc.env.params import SimParams
from rlalloc.env.placement import choose_nodes, free_gpus_for
from rlalloc.env.scenario import Scenario, job_speeds
from rlalloc.env.signals import Signals
from rlalloc.env.state import NOOP, Action, ActionKind, ClusterState, JobStatus, Strategy
from rlalloc.env.workload.spec import JobSpec, Workload
from rlalloc.forecaster.signals import load_signals

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
SCRAPE_S = 0.25
"""Prometheus's scrape interval: four scrapes a second, so that what the actuator reads lags a
twin running at 80-160x real time by as few simulated seconds as it did at 20-40x with one."""
CYCLE_S = 0.25
"""The actuator's cycle interval against a twin (`twin_config`), as short as the scrapes."""
TICK_S = 0.05
"""The twin's tick (wall seconds) in `start_scraped_twin`: a few simulated seconds even at 160x."""

needs_prometheus = pytest.mark.skipif(not Path(PROMETHEUS).exists(),
                                      reason="the prometheus binary is not installed")


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrometheusServer:
    """/usr/bin/prometheus on 127.0.0.1, scraping `target` every `SCRAPE_S`, storage in `tmp`."""

    def __init__(self, tmp: Path, target: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._tmp = tmp
        self._config = tmp / "prometheus.yml"
        self._config.write_text(yaml.safe_dump(prometheus_config(target, SCRAPE_S)))
        self._process: subprocess.Popen | None = None

    def start(self) -> PrometheusServer:
        """Start (or restart) and wait until it is ready."""
        self._process = subprocess.Popen(
            [PROMETHEUS, f"--config.file={self._config}",
             f"--storage.tsdb.path={self._tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=(self._tmp / "prometheus.log").open("ab"))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"prometheus did not start; see {self._tmp / 'prometheus.log'}")

    def stop(self) -> None:
        """Stop the server (its data stays for a restart)."""
        if self._process is not None:
            self._process.terminate()
            self._process.wait(10)
            self._process = None

    def wait_for(self, query: str, timeout_s: float = 15.0) -> None:
        """Wait until `query` returns at least one series (the first scrapes are in)."""
        source = PrometheusSource(ActuatorConfig(prometheus_url=self.url))
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                if source._client.custom_query(query):
                    return
                time.sleep(0.05)
        finally:
            source.close()
        raise TimeoutError(f"no series for {query!r} after {timeout_s}s")


class EmptyPrometheus:
    """An HTTP server that answers every Prometheus instant query with no series and any other
    path with 404: a reachable Prometheus without data, and an "API server" serving nothing.
    A context manager; `url` is its base URL."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.startswith("/api/v1/query?"):
                    body, status = {"status": "success",
                                    "data": {"resultType": "vector", "result": []}}, 200
                else:
                    body, status = {"kind": "Status", "code": 404}, 404
                payload = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> EmptyPrometheus:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def job(name: str, submit_s: float, requested: int, min_workers: int, max_workers: int,
        work: float = 1e7, restore_s: float = 30.0, gpus_per_worker: int = 1) -> JobSpec:
    """A generic-speed job (1 iteration/s on one GPU; `work` iterations) asking for `requested`
    GPUs, workers of `gpus_per_worker` GPUs each."""
    return JobSpec(name, submit_s, requested, work, min_workers, max_workers, restore_s,
                   gpus_per_worker=gpus_per_worker)


def scenario(jobs: list[JobSpec], nodes: int = 4, gpus: int = 4) -> Scenario:
    """`jobs` on a uniform cluster of `nodes` x `gpus`."""
    workload = Workload("test", tuple(jobs))
    return Scenario(uniform_cluster(nodes, gpus), workload, job_speeds(workload, None))


def quiet_params(speed: float, tick_s: float) -> SimParams:
    """Simulator settings without random failures (the tests script theirs)."""
    return SimParams(decision_interval_s=max(speed * tick_s, 1.0),
                     failures=FailureParams(failures_per_gpu_day=0.0))


@functools.cache
def signals(kind: str = "standin") -> Signals:
    """The look-ahead signals, loaded once per test process: loading takes seconds (the
    forecaster package imports torch), which a twin at 60x would spend as minutes."""
    return load_signals(kind)


def start_quiet_twin(jobs: list[JobSpec], speed: float = 60.0, tick_s: float = 0.2,
                     nodes: int = 4, gpus: int = 4, metrics_port: int = 0) -> RunningTwin:
    """A twin of `jobs` without random failures (the default signals loaded before its clock
    starts), its exporter on `metrics_port` (0: any free port)."""
    signals()
    return start_twin(scenario(jobs, nodes, gpus), speed=speed, tick_s=tick_s,
                      params=quiet_params(speed, tick_s), metrics_port=metrics_port,
                      scrape_interval_s=SCRAPE_S)


def start_scraped_twin(tmp: Path, jobs: list[JobSpec], speed: float, nodes: int = 4,
                       gpus: int = 4) -> tuple[RunningTwin, PrometheusServer]:
    """A quiet twin of `jobs` ticking every `TICK_S`, and a Prometheus scraping it. Prometheus
    scrapes a new target only once its discovery, throttled to every five seconds, hands it
    over, so it starts first, on the port the twin's exporter will take, and the twin's clock
    only once Prometheus scrapes that port: the jobs' simulated timeline does not depend on how
    long that took. Returns once Prometheus has the twin's first sample."""
    port = free_port()
    prometheus = PrometheusServer(tmp, f"127.0.0.1:{port}").start()
    twin = None
    try:
        prometheus.wait_for("up")  # the twin's port is scraped (and down, for now)
        twin = start_quiet_twin(jobs, speed, TICK_S, nodes, gpus, metrics_port=port)
        prometheus.wait_for("rlalloc_twin_clock_seconds")
    except BaseException:
        prometheus.stop()
        if twin is not None:
            twin.stop()
        raise
    return twin, prometheus


def kube_client(tmp: Path, twin: RunningTwin, config: ActuatorConfig) -> KubeClient:
    """A `KubeClient` for the twin's API, configured through a kubeconfig file (the real path)."""
    kubeconfig = tmp / "kubeconfig"
    kubeconfig.write_text(dump_kubeconfig(twin.kube_url))
    return KubeClient(config, api_client_from(replace(config, kubeconfig=str(kubeconfig))))


def twin_config(twin_speed: float, prometheus_url: str, **overrides: object) -> ActuatorConfig:
    """Actuator settings for a twin at `twin_speed` (scaled windows, twin clock) + overrides."""
    settings = actuator_settings(twin_speed, prometheus_url, SCRAPE_S)
    settings["queries"] = Queries(**settings["queries"])
    settings.update(interval_s=CYCLE_S, cooldown_s=60.0, api_backoff_s=0.05,
                    lease_namespace="default", listen_port=0, prometheus_timeout_s=2.0)
    settings.update(overrides)
    return ActuatorConfig(**settings)


def twin_crd_validator() -> PyTorchJobValidator:
    """A validator of the PyTorchJob CRD the twin has installed: what the actuator checks its
    patches against when it runs against a twin."""
    return PyTorchJobValidator(installed_crd(), f"the twin's CRD {PYTORCHJOB_CRD}")


def controller(tmp: Path, twin: RunningTwin, config: ActuatorConfig, policy: object,
               identity: str = "actuator-0") -> Controller:
    """A controller wired to the twin's API and a real Prometheus, checking its patches
    against the CRD it read from the twin, as `rlalloc actuate` does in a cluster."""
    kube = kube_client(tmp, twin, config)
    validate = PyTorchJobValidator(kube.read_pytorchjob_crd(), "the twin's API")
    return Controller(config, kube, PrometheusSource(config), policy, identity, validate,
                      signals=signals(config.signals))


def served_state(state: ClusterState, edit: dict | None = None) -> ApiServerThread:
    """The twin's API holding a cluster in `state` (namespace "default"); `edit`: job name ->
    worker container resources to write instead of the rendered ones."""
    server = ApiServerThread(TwinKubeAPI()).start()
    names = {job_id: job_id for job_id in state.jobs.job_id}
    nodes, pods, jobs = cluster_objects(state, "default", names)
    for obj in jobs:
        if obj["metadata"]["name"] in (edit or {}):
            worker = obj["spec"]["pytorchReplicaSpecs"]["Worker"]
            worker["template"]["spec"]["containers"][0]["resources"] = (
                edit[obj["metadata"]["name"]])
    for resource, namespace, objects in ((NODES, None, nodes), (PODS, "default", pods),
                                         (PYTORCHJOBS, "default", jobs)):
        for obj in objects:
            server.call(server.api.put, resource, namespace, obj["metadata"]["name"], obj)
    return server


def state_controller(tmp_path: Path, server: ApiServerThread, state: ClusterState,
                     policy: object) -> Controller:
    """A controller (no leader election, no cooldown) acting on the cluster `served_state`
    serves, its Prometheus answers recorded from `state`."""
    config = ActuatorConfig(leader_election=False, cooldown_s=0.0, api_backoff_s=0.01)

    class Twinish:  # what kube_client needs of a twin
        kube_url = server.url

    names = {job_id: job_id for job_id in state.jobs.job_id}
    metrics = RecordedMetrics(MetricsSnapshot(
        query_results(state, "default", names, time.time()), state.time_s))
    return Controller(config, kube_client(tmp_path, Twinish, config), metrics, policy,
                      "actuator-0", twin_crd_validator())


def wait_until(predicate: object, timeout_s: float, step_s: float = 0.05) -> bool:
    """Poll `predicate()` until it is true or `timeout_s` passes; returns its last value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step_s)
    return bool(predicate())


class Scripted:
    """A policy that proposes `actions` in turn, then no-ops."""

    name = "scripted"

    def __init__(self, *actions: Action) -> None:
        self._actions = list(actions)

    def act(self, state: ClusterState) -> Action:
        """The next scripted action (NOOP once they are used up)."""
        return self._actions.pop(0) if self._actions else NOOP


class TinyElastic:
    """A small elastic policy with obvious answers, for tests (not a baseline).

    In order: move a running job off a warned node; start the oldest queued job on as many
    workers as it asked for and are free (at least its minimum); if a queued job still cannot
    start, shrink the largest job above its minimum to its minimum; otherwise grow a running
    job towards its maximum with the free GPUs. Workers are counted whole: a node's free GPUs
    hold free GPUs // the job's GPUs per worker of them. Placement: packed, as `choose_nodes`
    does.
    """

    name = "tiny-elastic"

    def act(self, state: ClusterState) -> Action:
        """The next action (see class docstring)."""
        jobs, nodes = state.jobs, state.nodes
        names = nodes.name
        warned = nodes.warned
        for row in range(jobs.count):
            placement = jobs.placement[row]
            risky = [n for n in set(placement) if warned[n]]
            if risky and jobs.status[row] != JobStatus.QUEUED:
                chosen = choose_nodes(state, row, int(jobs.workers[row]), Strategy.PACKED,
                                      exclude_node=risky[0])
                if chosen is not None and not any(warned[n] for n in chosen):
                    return Action(ActionKind.MIGRATE, jobs.job_id[row], len(chosen),
                                  tuple(names[n] for n in chosen), from_node=names[risky[0]])
        free = free_gpus_for(state, None)[~warned]
        per_worker = jobs.gpus_per_worker
        waiting = False
        for row in np.flatnonzero(jobs.status == JobStatus.QUEUED):
            want = min(int(jobs.requested_gpus[row] // per_worker[row]),
                       int(jobs.max_workers[row]), int((free // per_worker[row]).sum()))
            if want >= jobs.min_workers[row]:
                chosen = choose_nodes(state, int(row), want, Strategy.PACKED)
                if chosen is not None:
                    return Action(ActionKind.SCALE, jobs.job_id[row], want,
                                  tuple(names[n] for n in chosen))
            waiting = True
        if waiting:
            above = [r for r in range(jobs.count) if jobs.workers[r] > jobs.min_workers[r]]
            if above:
                row = max(above, key=lambda r: (jobs.workers[r], -r))
                low = int(jobs.min_workers[row])
                chosen = choose_nodes(state, row, low, Strategy.PACKED)
                if chosen is not None:
                    return Action(ActionKind.SCALE, jobs.job_id[row], low,
                                  tuple(names[n] for n in chosen))
            return NOOP
        for row in range(jobs.count):
            extra = int((free // per_worker[row]).sum())
            if jobs.status[row] == JobStatus.RUNNING and extra > 0 and (
                    jobs.workers[row] < jobs.max_workers[row]):
                want = int(min(jobs.max_workers[row], jobs.workers[row] + extra))
                chosen = choose_nodes(state, row, want, Strategy.PACKED)
                if chosen is not None:
                    return Action(ActionKind.SCALE, jobs.job_id[row], want,
                                  tuple(names[n] for n in chosen))
        return NOOP
