"""Faults of the actuator's inputs, each on its own: Prometheus down or slow, stale metrics,
Kubernetes API errors (409/429/5xx), a second replica, a malformed config."""

from __future__ import annotations

import http.server
import json
import logging
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from http import HTTPStatus
from pathlib import Path

import numpy as np
import pytest
import yaml
from prometheus_client import CollectorRegistry, start_http_server

from rlalloc.actuator import apply
from rlalloc.actuator.apply import placement_patch
from rlalloc.actuator.config import ActuatorConfig, Queries
from rlalloc.actuator.crd_schema import CRD_PATH_ENV
from rlalloc.actuator.guardrails import DecisionHistory, decide
from rlalloc.actuator.k8s_names import PYTORCHJOB_CRD
from rlalloc.actuator.kube import KubeClient, KubeError, api_client_from
from rlalloc.actuator.leader import LeaderElector
from rlalloc.actuator.loop import Controller
from rlalloc.actuator.observe import (
    MetricsSnapshot,
    ObserveError,
    PrometheusSource,
    RecordedMetrics,
)
from rlalloc.actuator.server import StatusServer
from rlalloc.actuator.state_builder import Ledger, Observation, build_state
from rlalloc.actuator.twin.exporter import NodeTelemetry, PodTelemetry, TelemetryFrame, TwinExporter
from rlalloc.actuator.twin.kube_api import (
    CRDS,
    EVENTS,
    INSTALLED_CRD_FILE,
    LEASES,
    NODES,
    PODS,
    PYTORCHJOBS,
    ApiServerThread,
    TwinKubeAPI,
    dump_kubeconfig,
)
from rlalloc.actuator.twin.render import cluster_objects, query_results
from rlalloc.agent.registry import load_policy
from rlalloc.cli.main import main as cli_main
from rlalloc.env.errors import UserError
from rlalloc.env.failures import STRESS_FAILURES_PER_GPU_DAY
from rlalloc.env.state import (
    Action,
    ActionKind,
    ClusterState,
    Demand,
    JobInfo,
    Jobs,
    JobStatus,
    NodeInfo,
    Nodes,
)

from actuator_fixtures import (
    EmptyPrometheus,
    PrometheusServer,
    Scripted,
    TinyElastic,
    controller,
    free_port,
    job,
    kube_client,
    needs_prometheus,
    start_quiet_twin,
    twin_config,
    twin_crd_validator,
    wait_until,
)

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------ a hand-made world
def _state(running_on: str = "node-0000") -> ClusterState:
    """Two 4-GPU nodes; job "j" runs 2 workers on `running_on`, job "q" waits for 2."""
    nodes = Nodes.from_records([NodeInfo("node-0000", 4, 2 if running_on == "node-0000" else 4),
                                NodeInfo("node-0001", 4, 2 if running_on == "node-0001" else 4)])
    where = 0 if running_on == "node-0000" else 1
    jobs = Jobs.from_records([
        JobInfo("j", JobStatus.RUNNING, 0.0, 2, 1, 4, workers=2, placement=(where, where),
                throughput=1.0),
        JobInfo("q", JobStatus.QUEUED, 10.0, 2, 2, 2)])
    return ClusterState(time_s=100.0, nodes=nodes, jobs=jobs, demand=Demand(pending_gpus=2))


def _world(tmp_path, state: ClusterState, **overrides: object):
    """A TwinKubeAPI holding `state`'s objects, a config and a KubeClient for it."""
    server = ApiServerThread(TwinKubeAPI()).start()
    names = {job_id: job_id for job_id in state.jobs.job_id}
    nodes, pods, jobs = cluster_objects(state, "default", names)
    for obj in nodes:
        server.call(server.api.put, NODES, None, obj["metadata"]["name"], obj)
    for obj in pods:
        server.call(server.api.put, PODS, "default", obj["metadata"]["name"], obj)
    for obj in jobs:
        server.call(server.api.put, PYTORCHJOBS, "default", obj["metadata"]["name"], obj)
    # no backoff of failed moves by default: the clock of this world stands still
    settings = {"api_backoff_s": 0.01, "api_retries": 3, "leader_election": False,
                "cooldown_s": 0.0, "move_backoff_s": 0.0, **overrides}
    config = ActuatorConfig(lease_namespace="default", **settings)

    class Twinish:  # what kube_client needs of a twin
        kube_url = server.url

    metrics = RecordedMetrics(MetricsSnapshot(
        query_results(state, "default", names, time.time()), state.time_s))
    return server, config, kube_client(tmp_path, Twinish, config), metrics


def _controller(config: ActuatorConfig, kube: KubeClient, metrics: object, policy: object,
                identity: str) -> Controller:
    """A controller checking its patches against the CRD the twin has installed."""
    return Controller(config, kube, metrics, policy, identity, twin_crd_validator())


def _writes(api: TwinKubeAPI) -> list[str]:
    return [f"{str(r.method.value).upper()} {r.url.path}" for r in list(api)
            if str(r.method.value).upper() != "GET"]


def _moves(api: TwinKubeAPI) -> list[str]:
    """Writes that change the cluster (not lease renewals or events)."""
    return [w for w in _writes(api) if "/leases" not in w and "/events" not in w]


# ------------------------------------------------------------------------------ Prometheus
@needs_prometheus
@pytest.mark.expensive
def test_prometheus_down_means_no_moves_unhealthy_and_recovery(tmp_path):
    twin = start_quiet_twin([job("a", 0, 4, 1, 8)], speed=60.0)
    prometheus = PrometheusServer(tmp_path, f"127.0.0.1:{twin.metrics_port}").start()
    try:
        prometheus.wait_for("rlalloc_twin_clock_seconds")
        ctl = controller(tmp_path, twin, twin_config(60.0, prometheus.url), TinyElastic())
        status = StatusServer("127.0.0.1", 0, ctl.metrics, ctl.health)
        status.start()
        healthz = f"http://127.0.0.1:{status.port}/healthz"
        assert ctl.run_cycle().observed and _http_status(healthz) == 200
        prometheus.stop()
        moves_before = len(_moves(twin.api))
        stop = threading.Event()
        thread = threading.Thread(target=ctl.run, args=(stop,), daemon=True)
        thread.start()
        assert wait_until(lambda: _http_status(healthz) == 503, 10)
        # a few more cycles while Prometheus is down (counted, not timed: a loaded machine
        # runs fewer of them in a given time)
        blind_cycles = ctl.metrics.errors.labels("observe")
        assert wait_until(lambda: blind_cycles._value.get() >= 3, 20), "the loop stopped"
        assert thread.is_alive(), "the loop must keep running without Prometheus"
        assert len(_moves(twin.api)) == moves_before, "no moves without Prometheus"
        assert ctl.health.ready()[0] is False
        assert _http_status(f"http://127.0.0.1:{status.port}/livez") == 200
        prometheus.start()
        assert wait_until(lambda: _http_status(healthz) == 200, 20), "did not recover"
        assert wait_until(lambda: len(_moves(twin.api)) > moves_before, 20), "no moves after"
        stop.set()
        thread.join(10)
        status.stop()
    finally:
        prometheus.stop()
        twin.stop()


def test_slow_prometheus_means_no_moves(tmp_path):
    # a server that accepts connections and never answers: every query times out
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    state = _state()
    server, config, kube, _ = _world(
        tmp_path, state, prometheus_url=f"http://127.0.0.1:{listener.getsockname()[1]}",
        prometheus_timeout_s=0.3)
    try:
        ctl = _controller(config, kube, PrometheusSource(config), TinyElastic(), "a-0")
        started = time.monotonic()
        report = ctl.run_cycle()
        assert not report.observed and "Prometheus" in report.error
        assert time.monotonic() - started < 5
        assert ctl.health.ready()[0] is False
        assert _writes(server.api) == []
    finally:
        listener.close()
        server.stop()


@needs_prometheus
def test_a_query_of_a_result_type_the_actuator_cannot_read_is_named(tmp_path):
    """A scalar clock (as the config's docstring allows) crashed the cycle with a TypeError
    traceback, and a range-vector query with a KeyError in the state builder."""
    prometheus = PrometheusServer(tmp_path, f"127.0.0.1:{free_port()}").start()
    try:
        prometheus.wait_for("up")  # the (unreachable) target's up series: a range has data

        def source(**queries: str) -> PrometheusSource:
            return PrometheusSource(ActuatorConfig(prometheus_url=prometheus.url,
                                                   queries=replace(Queries(), **queries)))

        before = time.time()
        snapshot = source(clock="time()").fetch(None, 0)
        assert before - 0.01 <= snapshot.clock_s <= time.time()  # Prometheus keeps ms
        with pytest.raises(ObserveError, match=r"query xid_errors \('up\[5m\]'\) returned a "
                                               r"range vector, not an instant vector;"):
            source(xid_errors="up[5m]").fetch(None, 0)
        with pytest.raises(ObserveError, match="returned a scalar, not an instant vector;"):
            source(xid_errors="scalar(vector(3))").fetch(None, 0)
        # scalar() of a series that is not there is NaN: a NaN clock turned cooldowns off
        with pytest.raises(ObserveError, match="returned nan, not a time; is the exporter"):
            source(clock="scalar(rlalloc_twin_clock_seconds)").fetch(None, 0)
    finally:
        prometheus.stop()


@needs_prometheus
def test_the_default_demand_query_counts_no_finished_pod(tmp_path):
    """kube-state-metrics exports a Succeeded pod's GPU request as long as the pod is kept:
    counted, a finished job read as demand."""
    exporter = TwinExporter()
    pods = [PodTelemetry("default", f"p{i}", "node-0000", phase)
            for i, phase in enumerate(("Running", "Pending", "Succeeded"))]
    node = NodeTelemetry("node-0000", 4, 1, 40.0, 0, 0.0, True, True, False)
    exporter.publish(TelemetryFrame(time.time(), nodes=(node,), pods=tuple(pods)))
    port = exporter.serve(0)
    prometheus = PrometheusServer(tmp_path, f"127.0.0.1:{port}").start()
    try:
        prometheus.wait_for("kube_pod_status_phase")
        source = PrometheusSource(ActuatorConfig(prometheus_url=prometheus.url))
        [sample] = source._client.custom_query(Queries().demand_history)
        assert float(sample["value"][1]) == 2 / 4  # the running and the pending pod's GPUs
    finally:
        prometheus.stop()
        exporter.stop()


def test_stale_metrics_are_missing():
    state = _state()
    names = {j: j for j in state.jobs.job_id}
    nodes, pods, jobs = cluster_objects(state, "default", names)
    now = 1_000.0
    results = query_results(state, "default", names, now)
    results["xid_errors"][1]["value"][1] = "3"  # node-0001 reports XIDs ...
    results["dcgm_last_sample"][1]["value"][1] = str(now - 600)  # ... but 10 minutes ago
    results["trainer_last_sample"][0]["value"][1] = str(now - 600)  # and so does job j
    config = ActuatorConfig(max_metric_age_s=60.0)
    built = build_state(Observation(state.time_s, nodes, pods, jobs, results), config, Ledger())
    assert built.nodes_without_telemetry == frozenset({"node-0001"})
    assert built.state.nodes.xid_errors_5m.tolist() == [0, 0]  # stale XIDs are not evidence
    row = built.state.job_index("default/j")
    assert built.state.jobs.status[row] == JobStatus.RESTARTING  # not known to be training
    assert built.state.jobs.throughput[row] == 0.0
    # and no new worker goes to the node whose telemetry is missing
    to_blind = Action(ActionKind.SCALE, "default/q", 2, ("node-0001", "node-0001"))
    cycle = decide(built.state, Scripted(to_blind), config, DecisionHistory(),
                   built.nodes_without_telemetry)
    assert not cycle.decisions[0].accepted
    assert "no fresh DCGM telemetry for node node-0001" in cycle.decisions[0].reason


def test_a_node_without_telemetry_holds_up_no_other_move():
    """node-a's exporter is down. Shown to the policy as usable, elastic proposed q1 there
    every cycle and proactive moved r off warned node-c onto it: both refused, and a refusal
    ends the cycle, so nothing else (the failover included) ever happened."""
    nodes = Nodes.from_records([
        NodeInfo("node-a", 4, 4), NodeInfo("node-b", 4, 4),
        NodeInfo("node-c", 4, 2, xid_errors_5m=3, failure_risk=0.9)])
    jobs = Jobs.from_records([
        JobInfo("default/r", JobStatus.RUNNING, 0.0, 2, 1, 2, workers=2, placement=(2, 2),
                throughput=2.0, progress=0.3, run_s=3600, attained_gpu_s=7200),
        JobInfo("default/q1", JobStatus.QUEUED, 6000.0, 4, 1, 4),
        JobInfo("default/q2", JobStatus.QUEUED, 6300.0, 4, 1, 4)])
    state = ClusterState(7200.0, nodes, jobs, Demand(pending_gpus=8))
    blind = frozenset({"node-a"})
    for name in ("elastic", "proactive"):
        cycle = decide(state, load_policy(name), ActuatorConfig(), DecisionHistory(), blind)
        assert cycle.decisions and all(d.accepted for d in cycle.decisions), name
        assert not any("node-a" in d.action.nodes for d in cycle.decisions), name
        if name == "proactive":
            assert cycle.decisions[0].action.kind == ActionKind.MIGRATE
    # the telemetry guardrail off: node-a is usable, and shown so
    cycle = decide(state, load_policy("elastic"),
                   ActuatorConfig(require_node_telemetry=False), DecisionHistory(), blind)
    assert any("node-a" in d.action.nodes for d in cycle.decisions)


def test_a_move_that_failed_after_its_first_write_waits_and_counts_once(tmp_path):
    """The resize's patch landed (the job restarts) but a pod deletion was refused: recorded
    as nothing, the job was resized again every cycle, cooldown and caps bypassed; counted as
    a change every time, each try spent the hour's disruption budget again. Now the job waits
    out its backoff, and the next try, the actuator's own of the same half-applied move, counts
    no second disruption."""
    state = _state()
    server, config, kube, metrics = _world(tmp_path, state, cooldown_s=300.0,
                                           max_actions_per_cycle=1, move_backoff_s=60.0)
    try:
        grow = _rename(Action(ActionKind.SCALE, "j", 3, ("node-0001",) * 3))
        again = _rename(Action(ActionKind.SCALE, "j", 4, ("node-0001",) * 4))
        ctl = _controller(config, kube, metrics, Scripted(grow, again), "a-0")
        server.api.inject_fault("DELETE", "/pods/", *[403] * 4)
        first = ctl.run_cycle()
        [(_, outcome)] = first.outcomes
        assert outcome == "failed" and "partly applied, a disruption counted once" in (
            first.lines[0])
        second = ctl.run_cycle()
        [(decision, outcome)] = second.outcomes
        assert outcome == "refused" and decision.reason == (
            "backoff: 1 failed try, next try in 60s")
        ctl._source = RecordedMetrics(replace(metrics.snapshot, clock_s=state.time_s + 61.0))
        third = ctl.run_cycle()
        [(decision, outcome)] = third.outcomes
        assert decision.retry and decision.action == grow and outcome == "failed"
        annotations = server.call(server.api.get, PYTORCHJOBS, "default", "j")["metadata"][
            "annotations"]
        assert annotations["rlalloc.io/disruptions"] == "100.0"  # the first try's, once
        assert json.loads(annotations["rlalloc.io/move-failures"])["failures"] == 2
    finally:
        server.stop()


def test_a_new_leader_keeps_the_cooldown_and_the_hours_disruptions(tmp_path):
    """The guardrails' history lived in the leader's memory only: after a restart or a
    handover (the shipped Deployment runs 2 replicas) the same job could be resized at once,
    cooldown and hourly cap bypassed. The jobs' annotations carry it across."""
    server, config, kube, metrics = _world(tmp_path, _state(), cooldown_s=300.0,
                                           max_disruptions_per_hour=1)
    try:
        grow = _rename(Action(ActionKind.SCALE, "j", 3, ("node-0000",) * 3))
        again = _rename(Action(ActionKind.SCALE, "j", 4, ("node-0000",) * 4))
        first = _controller(config, kube, metrics, Scripted(grow), "replica-a").run_cycle()
        assert [o for _, o in first.outcomes] == ["applied"]
        annotations = server.call(server.api.get, PYTORCHJOBS, "default", "j")["metadata"][
            "annotations"]
        assert (annotations["rlalloc.io/last-change"],
                annotations["rlalloc.io/disruptions"]) == ("100.0", "100.0")
        successor = _controller(config, kube, metrics, Scripted(again), "replica-b").run_cycle()
        [(decision, outcome)] = successor.outcomes
        assert outcome == "refused" and decision.reason.startswith("cooldown: changed 0s ago")
        no_cooldown = replace(config, cooldown_s=0.0)
        capped = _controller(no_cooldown, kube, metrics, Scripted(again), "replica-c").run_cycle()
        [(decision, outcome)] = capped.outcomes
        assert outcome == "refused" and decision.reason.startswith(
            "disruption cap: 1 disruptive moves in the last hour")
    finally:
        server.stop()


def test_a_scale_that_fails_records_no_change(tmp_path):
    """The history annotations written before a `/scale` that then failed held the job in
    cooldown (and counted a disruption) for a change that never happened."""
    server, config, kube, metrics = _world(tmp_path, _state(), cooldown_s=300.0,
                                           api_retries=0, max_actions_per_cycle=1)
    try:
        suspend = _rename(Action(ActionKind.SCALE, "j", 0, ()))
        server.api.inject_fault("PATCH", "/pytorchjobs/j/scale", 503)
        ctl = _controller(config, kube, metrics, Scripted(suspend, suspend), "a-0")
        [(_, outcome)] = ctl.run_cycle().outcomes
        assert outcome == "failed"
        annotations = server.call(server.api.get, PYTORCHJOBS, "default", "j")["metadata"][
            "annotations"]
        assert "rlalloc.io/requested-workers" in annotations  # the request, before any /scale
        assert "rlalloc.io/last-change" not in annotations
        [(_, outcome)] = ctl.run_cycle().outcomes  # no cooldown: tried again, and done
        assert outcome == "applied"
        annotations = server.call(server.api.get, PYTORCHJOBS, "default", "j")["metadata"][
            "annotations"]
        assert annotations["rlalloc.io/disruptions"] == "100.0"
    finally:
        server.stop()


def test_without_node_affinity_a_resize_keeps_the_placement_annotation_current(tmp_path):
    """The `/scale` path left `rlalloc.io/placement` naming an earlier placement."""
    server, config, kube, metrics = _world(tmp_path, _state(), node_affinity=False)
    try:
        server.call(server.api.patch, PYTORCHJOBS, "default", "j",
                    {"metadata": {"annotations": {"rlalloc.io/placement": "node-0001=2"}}})
        grow = _rename(Action(ActionKind.SCALE, "j", 3, ("node-0000",) * 3))
        suspend = _rename(Action(ActionKind.SCALE, "j", 0, ()))
        ctl = _controller(config, kube, metrics, Scripted(grow), "a-0")

        def placement() -> str | None:
            return server.call(server.api.get, PYTORCHJOBS, "default", "j")["metadata"][
                "annotations"].get("rlalloc.io/placement")

        assert [o for _, o in ctl.run_cycle().outcomes] == ["applied"]
        assert placement() == "node-0000=3"
        ctl._policy = Scripted(suspend)
        assert [o for _, o in ctl.run_cycle().outcomes] == ["applied"]
        assert placement() is None
    finally:
        server.stop()


def test_a_partly_applied_move_still_ends_the_cycle(tmp_path):
    """Recording it as a change skipped the `break`: q was then started onto the GPUs j's
    undeleted pods still held, as if j's move had happened."""
    state = _state()
    server, config, kube, metrics = _world(tmp_path, state)
    try:
        move = _rename(Action(ActionKind.SCALE, "j", 2, ("node-0001", "node-0001")))
        start = _rename(Action(ActionKind.SCALE, "q", 2, ("node-0000", "node-0000")))
        ctl = _controller(config, kube, metrics, Scripted(move, start), "a-0")
        server.api.inject_fault("DELETE", "/pods/", *[403] * 4)
        report = ctl.run_cycle()
        assert [(d.action.job_id, o) for d, o in report.outcomes] == [("default/j", "failed")]
        assert not any("/pytorchjobs/q" in write for write in _writes(server.api))
    finally:
        server.stop()


def test_a_new_leader_keeps_a_jobs_backoff_and_its_given_up_mark(tmp_path):
    """Kept in memory only, a restarted actuator or a new leader would try a failing move at
    once, and again up to the give-up, every time: the record is in the job's annotations."""
    server, config, kube, metrics = _world(tmp_path, _state(), move_backoff_s=60.0)
    try:
        start = _rename(Action(ActionKind.SCALE, "q", 2, ("node-0001", "node-0001")))
        server.api.inject_fault("PATCH", "/pytorchjobs/q", 403)
        first = _controller(config, kube, metrics, Scripted(start), "replica-a").run_cycle()
        assert [o for _, o in first.outcomes] == ["failed"]
        successor = _controller(config, kube, metrics, Scripted(start), "replica-b").run_cycle()
        [(decision, outcome)] = successor.outcomes
        assert outcome == "refused" and decision.reason.startswith("backoff: 1 failed try")
        # given up after one more failure (a replica whose limit is 2): marked for a person
        later = RecordedMetrics(replace(metrics.snapshot, clock_s=metrics.snapshot.clock_s + 61))
        server.api.inject_fault("PATCH", "/pytorchjobs/q", 403)
        third = _controller(replace(config, max_move_failures=2), kube, later, Scripted(start),
                            "replica-c").run_cycle()
        assert [o for _, o in third.outcomes] == ["failed"]
        assert "given up after 2 failed tries" in third.lines[0]
        q = server.call(server.api.get, PYTORCHJOBS, "default", "q")
        assert q["metadata"]["annotations"]["rlalloc.io/held"].startswith(
            "MoveGivenUp: scale default/q to 2 workers on [node-0001] failed 2 times (patch "
            "pytorchjob default/q: HTTP 403 Forbidden: injected HTTP 403) since ")
        events = server.call(server.api.list, EVENTS)
        assert [e["reason"] for e in events if e["reason"] == "MoveGivenUp"] == ["MoveGivenUp"]
        much_later = RecordedMetrics(replace(later.snapshot, clock_s=later.snapshot.clock_s + 1e5))
        fourth = _controller(config, kube, much_later, Scripted(start), "replica-d")
        [(decision, outcome)] = fourth.run_cycle().outcomes
        assert outcome == "refused" and decision.reason.startswith("move given up")
        # a person removes the mark: tried again at once (and applied: the API allows it now)
        server.call(server.api.patch, PYTORCHJOBS, "default", "q",
                    {"metadata": {"annotations": {"rlalloc.io/held": None}}})
        fourth._policy = Scripted(start)
        assert [o for _, o in fourth.run_cycle().outcomes] == ["applied"]
        annotations = server.call(server.api.get, PYTORCHJOBS, "default", "q")["metadata"][
            "annotations"]
        assert "rlalloc.io/move-failures" not in annotations
        assert "rlalloc.io/held" not in annotations
    finally:
        server.stop()


def _refused_failover(tmp_path, **settings):
    """A world in which j's failover off XID-warned node-0000 has just failed at its pod
    deletions (its affinity patched, the node cordoned): the server and the controller."""
    state = replace(_state(), nodes=replace(_state().nodes, xid_errors_5m=_xid([2, 0])))
    server, config, kube, metrics = _world(tmp_path, state, **settings)
    try:
        move = _rename(Action(ActionKind.MIGRATE, "j", 2, ("node-0001", "node-0001"),
                              from_node="node-0000"))
        server.api.inject_fault("DELETE", "/pods/", 403)
        ctl = _controller(config, kube, metrics, Scripted(move), "a-0")
        assert [o for _, o in ctl.run_cycle().outcomes] == ["failed"]
    except BaseException:
        server.stop()
        raise
    return server, ctl


def test_a_half_applied_failover_the_guardrails_no_longer_allow_is_rolled_back(tmp_path):
    """The failover pinned j to node-0001 and cordoned node-0000, then its pod deletions were
    refused; before its next try node-0001 was cordoned (by someone else): it cannot complete,
    so j is pinned back to where its workers are and node-0000 given back."""
    server, ctl = _refused_failover(tmp_path)
    try:
        assert server.call(server.api.get, NODES, None, "node-0000")["spec"]["unschedulable"]
        server.call(server.api.patch, NODES, None, "node-0001", {"spec": {"unschedulable": True}})
        report = ctl.run_cycle()
        [(decision, outcome)] = report.outcomes
        assert decision.retry and outcome == "refused"
        assert decision.reason == "node node-0001 is cordoned"
        j = server.call(server.api.get, PYTORCHJOBS, "default", "j")
        terms = j["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["affinity"][
            "nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms[0]["matchExpressions"][-1]["values"] == ["node-0000"]
        assert j["metadata"]["annotations"]["rlalloc.io/placement"] == "node-0000=2"
        record = json.loads(j["metadata"]["annotations"]["rlalloc.io/move-failures"])
        assert (record["pending"], record["cordoned"], record["failures"]) == (False, "", 1)
        assert not server.call(server.api.get, NODES, None, "node-0000")["spec"]["unschedulable"]
        assert any(e["reason"] == "MoveRolledBack" for e in server.call(server.api.list, EVENTS))
    finally:
        server.stop()


def test_a_failover_whose_write_went_unanswered_is_tried_again_by_the_actuator(tmp_path):
    """A 5xx after the retries (or no answer at all) may hide a write that landed: the
    failover's affinity patch, with the workers still on the failing node. Taken as half
    applied, the move is the actuator's to complete (or roll back), not left to the policy."""
    state = replace(_state(), nodes=replace(_state().nodes, xid_errors_5m=_xid([2, 0])))
    server, config, kube, metrics = _world(tmp_path, state)
    try:
        move = _rename(Action(ActionKind.MIGRATE, "j", 2, ("node-0001", "node-0001"),
                              from_node="node-0000"))
        server.api.inject_fault("PATCH", "/pytorchjobs/j", *[503] * (config.api_retries + 1))
        ctl = _controller(config, kube, metrics, Scripted(move), "a-0")
        assert [o for _, o in ctl.run_cycle().outcomes] == ["failed"]
        report = ctl.run_cycle()  # the policy has nothing more to say
        assert [(d.retry, o) for d, o in report.outcomes] == [(True, "applied")]
        assert server.call(server.api.list, PODS) == []
    finally:
        server.stop()


def test_a_half_applied_move_whose_workers_left_by_themselves_is_complete(tmp_path):
    server, ctl = _refused_failover(tmp_path, move_backoff_s=60.0)
    try:
        for pod in server.call(server.api.list, PODS):  # the operator moved them (an eviction)
            pod["spec"]["nodeName"] = "node-0001"
            server.call(server.api.put, PODS, "default", pod["metadata"]["name"], pod)
        assert ctl.run_cycle().outcomes == []  # complete: no try, no roll-back
        annotations = server.call(server.api.get, PYTORCHJOBS, "default", "j")["metadata"][
            "annotations"]
        assert "rlalloc.io/move-failures" not in annotations
        assert annotations["rlalloc.io/placement"] == "node-0001=2"
        assert server.call(server.api.get, NODES, None, "node-0000")["spec"]["unschedulable"]
    finally:
        server.stop()


class _Killed(BaseException):
    """The replica's process dying mid-move (no `except Exception` catches it)."""


def test_a_move_killed_after_its_first_write_is_completed_by_a_new_leader_counted_once(
        tmp_path):
    """A leader killed between a failover's placement patch and its pod deletions restarted
    nobody: no disruption is recorded, and the move is left recorded as in flight, which the
    next leader completes before asking its policy (which proposes nothing), counting the
    disruption once."""
    server, config, kube, metrics = _world(tmp_path, _state())
    try:
        move = _rename(Action(ActionKind.MIGRATE, "j", 2, ("node-0001", "node-0001"),
                              from_node="node-0000"))

        def killed(*args: object, **kwargs: object) -> bool:
            raise _Killed()

        kube.delete_pod = killed
        with pytest.raises(_Killed):
            _controller(config, kube, metrics, Scripted(move), "a").run_cycle()
        annotations = server.call(server.api.get, PYTORCHJOBS, "default", "j")["metadata"][
            "annotations"]
        assert annotations["rlalloc.io/disruptions"] == ""
        record = json.loads(annotations["rlalloc.io/move-failures"])
        assert (record["failures"], record["pending"], record["counted"]) == (0, True, False)
        new_leader = KubeClient(config, kube._core.api_client)
        report = _controller(config, new_leader, metrics, Scripted(), "b").run_cycle()
        assert [(d.retry, o) for d, o in report.outcomes] == [(True, "applied")]
        assert server.call(server.api.list, PODS) == []
        annotations = server.call(server.api.get, PYTORCHJOBS, "default", "j")["metadata"][
            "annotations"]
        assert annotations["rlalloc.io/disruptions"] == "100.0"
        assert "rlalloc.io/move-failures" not in annotations
    finally:
        server.stop()


def test_a_delete_whose_answer_was_lost_counts_as_deleted(tmp_path):
    """The first attempt deleted the pod but its answer was lost; the retry finds it gone:
    the pod was deleted by this call, a disruption to count, not one found gone already."""
    server, config, kube, _ = _world(tmp_path, _state())
    try:
        pod = server.call(server.api.get, PODS, "default", "j-worker-0")
        server.api.inject_lost_response("DELETE", "/pods/j-worker-0")
        assert kube.delete_pod("default", "j-worker-0", 0, pod["metadata"]["uid"])
        assert server.call(server.api.get, PODS, "default", "j-worker-0") is None
        assert not kube.delete_pod("default", "j-worker-0", 0, pod["metadata"]["uid"])
    finally:
        server.stop()


# --------------------------------------------------------------------------- Kubernetes API
def test_api_429_and_503_are_retried_and_the_move_applies_once(tmp_path):
    state = _state()
    server, config, kube, metrics = _world(tmp_path, state)
    try:
        server.api.inject_fault("PATCH", "/pytorchjobs/q", 429, 503, retry_after_s=0)
        start = Action(ActionKind.SCALE, "q", 2, ("node-0001", "node-0001"))
        ctl = _controller(config, kube, metrics, Scripted(_rename(start)), "a-0")
        report = ctl.run_cycle()
        assert [o for _, o in report.outcomes] == ["applied"]
        patches = [w for w in _writes(server.api) if w.startswith("PATCH")]
        assert len(patches) == 3  # two refused by the faults, one applied
        q = server.call(server.api.get, PYTORCHJOBS, "default", "q")
        assert q["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
        assert ctl.metrics.api_retries._value.get() == 2
    finally:
        server.stop()


def test_retries_of_lists_and_events_count_in_the_retry_metric(tmp_path):
    state = _state()
    server, config, kube, metrics = _world(tmp_path, state)
    try:
        server.api.inject_fault("GET", "/nodes", 503)  # the observe step's list, retried
        server.api.inject_fault("POST", "/events", 429, retry_after_s=0)
        start = Action(ActionKind.SCALE, "q", 2, ("node-0001", "node-0001"))
        ctl = _controller(config, kube, metrics, Scripted(_rename(start)), "a-0")
        report = ctl.run_cycle()
        assert report.observed and [o for _, o in report.outcomes] == ["applied"]
        assert ctl.metrics.api_retries._value.get() == 2
    finally:
        server.stop()


def test_api_5xx_beyond_the_retries_leaves_the_job_untouched(tmp_path):
    state = _state()
    server, config, kube, metrics = _world(tmp_path, state)
    try:
        server.api.inject_fault("PATCH", "/pytorchjobs/q", *[500] * (config.api_retries + 1))
        before = server.call(server.api.get, PYTORCHJOBS, "default", "q")
        start = Action(ActionKind.SCALE, "q", 2, ("node-0001", "node-0001"))
        ctl = _controller(config, kube, metrics, Scripted(_rename(start)), "a-0")
        report = ctl.run_cycle()
        assert [o for _, o in report.outcomes] == ["failed"]
        after = server.call(server.api.get, PYTORCHJOBS, "default", "q")
        # untouched but for the record of the failed try (its backoff, for any replica); a 5xx
        # may have landed all the same, so it is taken as half applied, to converge
        record = json.loads(after["metadata"]["annotations"].pop("rlalloc.io/move-failures"))
        assert (record["failures"], record["pending"], record["counted"]) == (1, True, False)
        del after["metadata"]["resourceVersion"], before["metadata"]["resourceVersion"]
        assert after == before
        assert ctl.metrics.errors.labels("act")._value.get() == 1
        events = server.call(server.api.list, EVENTS)
        assert [e["reason"] for e in events] == ["ActionFailed"]
    finally:
        server.stop()


def test_a_move_failing_every_cycle_is_one_event_counted_again(tmp_path):
    # a failed move is proposed again each cycle; its Events fold into one, as client-go's
    # recorder does, and a new one is made when that Event has gone (expired or deleted)
    state = _state()
    server, config, kube, metrics = _world(tmp_path, state)
    try:
        # each cycle: the move's patch, then the patch recording its failure (refused too)
        server.api.inject_fault("PATCH", "/pytorchjobs/q", *[403] * 6)
        start = _rename(Action(ActionKind.SCALE, "q", 2, ("node-0001", "node-0001")))
        ctl = _controller(config, kube, metrics, Scripted(), "a-0")
        for _ in range(2):
            ctl._policy = Scripted(start)
            assert [o for _, o in ctl.run_cycle().outcomes] == ["failed"]
        events = server.call(server.api.list, EVENTS)
        assert [(e["reason"], e["count"]) for e in events] == [("ActionFailed", 2)]
        assert events[0]["lastTimestamp"] >= events[0]["firstTimestamp"]
        server.call(server.api.remove, EVENTS, "default", events[0]["metadata"]["name"])
        ctl._policy = Scripted(start)
        assert [o for _, o in ctl.run_cycle().outcomes] == ["failed"]
        events = server.call(server.api.list, EVENTS)
        assert [(e["reason"], e["count"]) for e in events] == [("ActionFailed", 1)]
        assert ctl.metrics.errors.labels("event")._value.get() == 0
    finally:
        server.stop()


def test_failover_stops_before_deleting_pods_when_the_cordon_fails(tmp_path):
    state = replace(_state(), nodes=replace(_state().nodes, xid_errors_5m=_xid([2, 0])))
    server, config, kube, metrics = _world(tmp_path, state)
    try:
        server.api.inject_fault("PATCH", "/nodes/node-0000", *[503] * (config.api_retries + 1))
        move = Action(ActionKind.MIGRATE, "j", 2, ("node-0001", "node-0001"),
                      from_node="node-0000")
        ctl = _controller(config, kube, metrics, Scripted(_rename(move)), "a-0")
        report = ctl.run_cycle()
        assert [o for _, o in report.outcomes] == ["failed"]
        assert not any(w.startswith("DELETE") for w in _writes(server.api))
        assert len([p for p in server.call(server.api.list, PODS)]) == 2
        # half applied (the job pinned to node-0001): the actuator completes it on the next
        # cycle once the API is back, without the policy's asking
        report = ctl.run_cycle()
        assert [(d.retry, o) for d, o in report.outcomes] == [(True, "applied")]
        node = server.call(server.api.get, NODES, None, "node-0000")
        assert node["spec"]["unschedulable"] is True
        assert server.call(server.api.list, PODS) == []  # deleted; the operator recreates them
    finally:
        server.stop()


def test_api_409_is_retried(tmp_path):
    state = _state()
    server, config, kube, _ = _world(tmp_path, state)
    try:
        server.api.inject_fault("PATCH", "/nodes/node-0001", 409)
        kube.cordon("node-0001")
        assert server.call(server.api.get, NODES, None, "node-0001")["spec"]["unschedulable"]
        server.api.inject_fault("PATCH", "/nodes/node-0001", 403)
        with pytest.raises(KubeError) as err:
            kube.cordon("node-0001")
        assert err.value.status == 403  # not retryable: fails at once
    finally:
        server.stop()


# ------------------------------------------------------------------------- leader election
def test_only_the_leader_acts_and_a_standby_takes_over(tmp_path):
    state = _state()
    server, config, kube_a, metrics = _world(tmp_path, state)
    config = replace(config, leader_election=True, interval_s=1.0, lease_duration_s=2.0)
    try:
        kube_b = kube_client(tmp_path, type("T", (), {"kube_url": server.url}), config)
        start = _rename(Action(ActionKind.SCALE, "q", 2, ("node-0001", "node-0001")))
        a = _controller(config, kube_a, metrics, Scripted(start), "replica-a")
        b = _controller(config, kube_b, metrics, Scripted(start), "replica-b")
        reports = []

        def cycle(ctl: Controller) -> bool:
            reports.append(ctl.run_cycle())
            return reports[-1].leader

        assert cycle(a) and not cycle(b)
        assert [o for _, o in reports[0].outcomes] == ["applied"] and reports[1].outcomes == []
        assert b.health.ready() == (True, "standby: another replica holds the lease")
        healthy = "rlalloc_actuator_healthy"  # agrees with /healthz: no alert for a standby
        assert b.metrics.registry.get_sample_value(healthy) == 1.0
        assert cycle(a) and not cycle(b)  # a renews; b still stands by
        # a stops renewing (hangs): b takes over once the lease expires, and a may not act
        time.sleep(2.2)
        assert cycle(b) and not cycle(a)
        # b shuts down gracefully: a takes over at once
        b.shutdown()
        assert cycle(a)
        assert all(r.leader for r in reports if r.outcomes), "a standby acted"
        assert all(not r.observed for r in reports if not r.leader), "a standby observed"
    finally:
        server.stop()


def test_two_replicas_racing_for_an_expired_lease_get_one_leader(tmp_path):
    state = _state()
    server, config, kube_a, metrics = _world(tmp_path, state)
    config = replace(config, leader_election=True, interval_s=1.0, lease_duration_s=30.0)
    try:
        kube_b = kube_client(tmp_path, type("T", (), {"kube_url": server.url}), config)
        a = _controller(config, kube_a, metrics, Scripted(), "replica-a")
        b = _controller(config, kube_b, metrics, Scripted(), "replica-b")
        results: dict[str, bool] = {}
        barrier = threading.Barrier(2)

        def race(name: str, ctl: Controller) -> None:
            barrier.wait()
            results[name] = ctl.run_cycle().leader

        threads = [threading.Thread(target=race, args=(n, c)) for n, c in (("a", a), ("b", b))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert sorted(results.values()) == [False, True]
    finally:
        server.stop()


def test_a_slow_renewal_never_leaves_two_leaders(tmp_path):
    """A renewal retried for 1.5 s of a 2 s lease: the holder counted its lease from when the
    write returned, the standby from the renewTime written before it, so both led at once."""
    server, config, kube_a, _ = _world(tmp_path, _state(), lease_duration_s=2.0)
    now = [time.time()]

    class SlowRenewals:  # the holder's client: each lease write returns 1.5 s later
        def __getattr__(self, name: str) -> object:
            return getattr(kube_a, name)

        def patch_lease(self, *args: object) -> None:
            kube_a.patch_lease(*args)
            now[0] += 1.5

    try:
        kube_b = kube_client(tmp_path, type("T", (), {"kube_url": server.url}), config)
        a = LeaderElector(SlowRenewals(), config, "replica-a", clock=lambda: now[0])
        b = LeaderElector(kube_b, config, "replica-b", clock=lambda: now[0])
        assert a.try_acquire()
        now[0] += 0.5
        a.try_acquire()  # renews, returning at +2.0 s
        now[0] += 0.6  # 2.1 s after the renewTime it wrote: expired for the standby
        assert b.try_acquire()
        assert not a.is_leader
    finally:
        server.stop()


def test_no_move_is_retried_past_the_lease_margin(tmp_path):
    """A 2 s lease lets its holder act for 1.6 s after renewing; with 0.5 s backoff, retries
    of a failing write would go on to 7.5 s, landing after a standby may have taken over."""
    server, config, _, _ = _world(tmp_path, _state(), api_backoff_s=0.5, api_retries=4,
                                  leader_election=True, lease_duration_s=2.0, interval_s=1.0)
    now = [time.time()]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    try:
        kubeconfig = tmp_path / "kubeconfig"
        kube = KubeClient(config, api_client_from(replace(config, kubeconfig=str(kubeconfig))),
                          sleep=sleep)
        elector = LeaderElector(kube, config, "replica-a", clock=lambda: now[0])
        assert elector.try_acquire()
        server.api.inject_fault("PATCH", "/pytorchjobs/q", *[503] * 5)
        with pytest.raises(KubeError, match="not retried: the lease margin ends first"):
            with kube.within(elector.seconds_left):
                kube.patch_pytorchjob("default", "q", {"metadata": {"labels": {"x": "y"}}})
        # attempts at 0, 0.5 and 1.5 s; the next (3.5 s) would fall after the 1.6 s margin
        assert _writes(server.api).count("PATCH /apis/kubeflow.org/v1/namespaces/default/"
                                         "pytorchjobs/q") == 3
        now[0] += 1.0  # past the margin: nothing is sent at all
        with pytest.raises(KubeError, match="not sent, the lease margin ran out"):
            with kube.within(elector.seconds_left):
                kube.cordon("node-0001")
        assert not server.call(server.api.get, NODES, None, "node-0001")["spec"].get(
            "unschedulable")
        kube.cordon("node-0001")  # outside `within` calls are not bounded
        # a deadline that passes between the check and the request: a timeout of 0 was sent,
        # which the client takes for none at all
        with kube.within(lambda: 0.0):
            assert 0 < kube._timeout() <= 0.01
    finally:
        server.stop()


def test_the_leader_gives_a_failing_move_up_within_its_lease(tmp_path):
    server, config, kube, metrics = _world(tmp_path, _state(), api_backoff_s=0.5,
                                           api_retries=4, leader_election=True,
                                           lease_duration_s=2.0, interval_s=1.0)
    try:
        server.api.inject_fault("PATCH", "/pytorchjobs/q", *[503] * 10)
        start = _rename(Action(ActionKind.SCALE, "q", 2, ("node-0001", "node-0001")))
        report = _controller(config, kube, metrics, Scripted(start), "replica-a").run_cycle()
        [(_, outcome)] = report.outcomes
        assert outcome == "failed" and "lease margin" in report.lines[0]
        patches = [w for w in _writes(server.api) if "/pytorchjobs/q" in w]
        # the move's (not the 5 attempts that run to 7.5 s), then at most one recording its
        # failure, not retried either
        assert 1 <= len(patches) <= 4
    finally:
        server.stop()


def test_losing_the_race_for_the_lease_is_a_standby_not_a_warning(caplog):
    class RacedKube:  # another replica creates the Lease between our read and our create
        def read_lease(self, namespace: str, name: str) -> None:
            return None

        def create_lease(self, namespace: str, body: dict) -> None:
            raise KubeError(f"create lease {namespace}: HTTP 409 Conflict", 409)

    elector = LeaderElector(RacedKube(), ActuatorConfig(), "replica-b")
    with caplog.at_level(logging.DEBUG, logger="rlalloc.actuator.leader"):
        assert not elector.try_acquire()
    assert elector.last_error is None  # a standby, not blind
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "standby: another replica took the lease first")]


class _CountingPlanner:
    """Counts as the planner (`rlalloc.agent.lookahead.LookaheadPolicy`) does: every call contested,
    every other one deviating from its base; proposes nothing."""

    def __init__(self) -> None:
        self.contested = 0
        self.deviations = 0

    def act(self, state: ClusterState) -> Action:
        self.contested += 1
        self.deviations += self.contested % 2
        return Action(ActionKind.NOOP)


def test_once_dry_run_prints_each_move_from_to_and_a_summary(tmp_path, monkeypatch, capsys):
    server, *_ = _world(tmp_path, _state())
    start = _rename(Action(ActionKind.SCALE, "q", 2, ("node-0001", "node-0001")))
    too_big = _rename(Action(ActionKind.SCALE, "j", 9, ("node-0000",) * 9))
    out: list[str] = []
    try:
        with EmptyPrometheus() as prometheus:  # reachable, no telemetry: none required here
            code, err, logs = _actuate(tmp_path, monkeypatch, capsys, {
                "prometheus_url": prometheus.url, "require_node_telemetry": False,
                "kubeconfig": _kubeconfig(tmp_path, server.url)}, "--dry-run",
                policy=Scripted(start, too_big), stdout=out)
    finally:
        server.stop()
    assert (code, err) == (0, [])
    assert out == [
        "cycle 1: 2 decisions: 1 would be applied (dry run: nothing written), 1 refused by a "
        "guardrail",
        "  dry_run: scale default/q: 0 -> 2 workers, none -> node-0001=2",
        "  refused: scale default/j: 2 -> 9 workers, node-0000=2 -> node-0000=9 (9 workers is "
        "outside the job's elasticPolicy [1, 4])"]
    decided = [line for line in logs if "decision" in line]
    assert [(d["from_workers"], d["from_nodes"]) for d in decided] == [
        (0, []), (2, ["node-0000", "node-0000"])]
    assert [line["message"] for line in logs if "outcomes" in line] == [out[0]]


def test_a_planners_contested_and_deviating_decisions_are_reported(tmp_path, monkeypatch,
                                                                   capsys):
    server, *_ = _world(tmp_path, _state())
    out: list[str] = []
    try:
        with EmptyPrometheus() as prometheus:
            code, _, logs = _actuate(tmp_path, monkeypatch, capsys, {
                "prometheus_url": prometheus.url,
                "kubeconfig": _kubeconfig(tmp_path, server.url)}, "--dry-run",
                policy=_CountingPlanner(), stdout=out)
    finally:
        server.stop()
    summary = ("cycle 1: no move, the policy proposed none (dry run); planner: 1 contested, "
               "1 deviated from its base")
    assert (code, out) == (0, [summary])
    assert [(line["contested"], line["deviations"]) for line in logs
            if "contested" in line] == [(1, 1)]


def test_stop_retrying_ends_a_call_to_an_api_that_has_gone_at_once(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: every attempt is refused
    config = ActuatorConfig(api_retries=4, api_backoff_s=0.5)  # 7.5 s of backoff in all
    kube = kube_client(tmp_path, type("T", (), {"kube_url": url}), config)
    threading.Timer(0.3, kube.stop_retrying).start()  # SIGTERM in the first backoff
    started = time.monotonic()
    with pytest.raises(KubeError, match="after 2 attempts$"):
        kube.list_nodes()
    with pytest.raises(KubeError, match="after 1 attempt$"):  # later calls: one attempt
        kube.list_pods()
    assert time.monotonic() - started < 1.5


_ACTUATE_WITH_PLANNER = """\
import pathlib, sys, types
from rlalloc.cli.main import main
from rlalloc.env.state import Action, ActionKind

class Planner:
    def __init__(self):
        self.contested = self.deviations = 0

    def act(self, state):
        self.contested += 1
        self.deviations += self.contested % 2
        pathlib.Path(sys.argv[2]).touch()  # the test waits for a first decision
        return Action(ActionKind.NOOP)

registry = types.ModuleType("rlalloc.agent.registry")
registry.load_policy = lambda name: Planner()
sys.modules["rlalloc.agent.registry"] = registry
sys.exit(main(["actuate", "--config", sys.argv[1]]))
"""
"""`rlalloc actuate` with a policy that counts as the planner does (see `_CountingPlanner`)."""


@pytest.mark.parametrize("api_gone", [True, False])
def test_sigterm_exits_promptly_releasing_the_lease_if_the_api_is_there(tmp_path, api_gone):
    # With the API gone, the cycle under way and the release retried every call with the
    # default backoff (7.5 s each): the exit took ~13 s. Now each gets one attempt; with the
    # API there the Lease is still released, so a standby takes over at once.
    server, *_ = _world(tmp_path, _state())
    path = tmp_path / "actuator.yaml"
    with EmptyPrometheus() as prometheus:
        path.write_text(yaml.safe_dump({
            "prometheus_url": prometheus.url, "kubeconfig": _kubeconfig(tmp_path, server.url),
            "signals": "none", "listen_port": 0, "lease_namespace": "default",
            "interval_s": 1.0, "lease_duration_s": 30.0, "identity": "replica-a"}))
        asked = tmp_path / "asked"
        process = subprocess.Popen([sys.executable, "-c", _ACTUATE_WITH_PLANNER, str(path),
                                    str(asked)],
                                   cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)

        def holder() -> str:
            lease = server.call(server.api.get, LEASES, "default", "rlalloc-actuator")
            return ((lease or {}).get("spec") or {}).get("holderIdentity") or ""

        try:
            assert wait_until(lambda: holder() == "replica-a", 60), "never took the lease"
            # the Lease is taken before the cycle asks its policy: stopping the API at once
            # could leave a run that never decided (0 contested), as it did under load
            assert wait_until(asked.is_file, 60), "the policy was never asked"
            if api_gone:
                server.stop()
                time.sleep(1.5)  # the next cycle is under way, retrying the Lease
            started = time.monotonic()
            process.send_signal(signal.SIGTERM)
            _, stderr = process.communicate(timeout=60)
            took_s = time.monotonic() - started
        finally:
            process.kill()
            released = "" if api_gone else holder()
            server.stop()
    assert process.returncode == 0, stderr
    assert took_s < 3.0, stderr
    assert released == ""
    last = json.loads(stderr.splitlines()[-1])
    assert last["message"] == (f"actuator stopped; planner: {last['contested']} contested "
                               f"decisions, {last['deviations']} deviated from its base")
    assert last["contested"] >= 1


# -------------------------------------------------------------------------------- config
@pytest.mark.parametrize("text, expected", [
    ("interval_s: [1, 2\n", "not valid YAML at line"),
    ("intervall_s: 5\n", "unknown actuator setting 'intervall_s'"),
    ("interval_s: soon\n", "expected float for interval_s, got 'soon'"),
    ("max_disruptions_per_cycle: -1\n", "max_disruptions_per_cycle must be a finite number >= 0"),
    # NaN passed "< 0", and a NaN cooldown then refused nothing
    ("cooldown_s: .nan\n", "cooldown_s must be a finite number >= 0 (got nan)"),
    ("prometheus_timeout_s: .inf\n", "prometheus_timeout_s must be a finite number > 0 (got inf)"),
    ("queries:\n  xid: foo\n", "queries.xid is not a known signal"),
    ("signals: prophet\n", "signals must be one of none, standin, lstm (got 'prophet')"),
    # renewed once per cycle, a lease as long as the cycle lapses whenever a cycle runs late
    ("interval_s: 30\nlease_duration_s: 30\n", "lease_duration_s must be at least twice "
                                              "interval_s, as the Lease is renewed once per "
                                              "cycle (got 30 with interval_s 30)"),
    ("- a\n- b\n", "expected a mapping of settings"),
])
def test_malformed_config_is_one_clear_error_at_start_up(tmp_path, capsys, text, expected):
    path = tmp_path / "actuator.yaml"
    path.write_text(text)
    assert cli_main(["actuate", "--config", str(path), "--once"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rlalloc: error: ")
    assert str(path) in err[0] and expected in err[0]


def test_a_lease_left_short_by_a_longer_interval_flag_blames_the_flag(capsys):
    assert cli_main(["actuate", "--interval-s", "60", "--once"]) == 2
    assert capsys.readouterr().err.strip() == (
        "rlalloc: error: flag --interval-s: invalid actuator setting: lease_duration_s must be at "
        "least twice interval_s, as the Lease is renewed once per cycle (got 90 with interval_s "
        "60)")


def test_config_precedence_file_env_flags(tmp_path):
    from rlalloc.actuator.config import load_config

    path = tmp_path / "actuator.yaml"
    path.write_text("interval_s: 10\ndry_run: true\nnamespaces: [a, b]\n")
    config = load_config(path, {"RLALLOC_ACTUATOR_INTERVAL_S": "20"}, {"dry_run": None})
    assert (config.interval_s, config.dry_run, config.namespaces) == (20.0, True, ("a", "b"))
    config = load_config(path, {"RLALLOC_ACTUATOR_INTERVAL_S": "20"}, {"interval_s": "5"})
    assert config.interval_s == 5.0
    with pytest.raises(UserError) as refused:  # a user's mistake, one line, not a crash
        load_config(None, {"RLALLOC_ACTUATOR_DRY_RUN": "maybe"})
    assert str(refused.value) == ("environment variable RLALLOC_ACTUATOR_DRY_RUN: expected bool "
                                  "for dry_run, got 'maybe'")


def test_an_unknown_environment_variable_is_one_clear_error():
    from rlalloc.actuator.config import load_config

    assert load_config(None, {"RLALLOC_ACTUATOR_CONFIG": "x.yaml"}).interval_s == 30.0
    with pytest.raises(UserError) as err:
        load_config(None, {"RLALLOC_ACTUATOR_INTERVL_S": "3"})
    assert str(err.value).startswith(
        "environment variable RLALLOC_ACTUATOR_INTERVL_S: unknown actuator setting; did you "
        "mean RLALLOC_ACTUATOR_INTERVAL_S? use RLALLOC_ACTUATOR_<SETTING> for one of "
        "prometheus_url, ")
    assert str(err.value).endswith(", clock_speedup, or RLALLOC_ACTUATOR_CONFIG")


def test_service_link_variables_of_a_service_named_like_the_actuator_are_no_settings():
    from rlalloc.actuator.config import load_config

    # what Kubernetes puts into the pod for Services rlalloc-actuator (port "http" 8080) and
    # rlalloc-actuator-metrics in its namespace, unless enableServiceLinks is false
    links = {"RLALLOC_ACTUATOR_SERVICE_HOST": "10.96.0.12",
             "RLALLOC_ACTUATOR_SERVICE_PORT": "8080",
             "RLALLOC_ACTUATOR_SERVICE_PORT_HTTP": "8080",
             "RLALLOC_ACTUATOR_PORT": "tcp://10.96.0.12:8080",
             "RLALLOC_ACTUATOR_PORT_8080_TCP": "tcp://10.96.0.12:8080",
             "RLALLOC_ACTUATOR_PORT_8080_TCP_PROTO": "tcp",
             "RLALLOC_ACTUATOR_PORT_8080_TCP_PORT": "8080",
             "RLALLOC_ACTUATOR_PORT_8080_TCP_ADDR": "10.96.0.12",
             "RLALLOC_ACTUATOR_METRICS_SERVICE_HOST": "10.96.0.13",
             "RLALLOC_ACTUATOR_METRICS_PORT": "tcp://10.96.0.13:9090"}
    assert load_config(None, {**links, "RLALLOC_ACTUATOR_INTERVAL_S": "7"}).interval_s == 7.0
    # a misspelled setting that merely ends like one is still refused
    with pytest.raises(UserError, match="RLALLOC_ACTUATOR_STATUS_PORT: unknown actuator"):
        load_config(None, {"RLALLOC_ACTUATOR_STATUS_PORT": "9090"})


def test_a_bad_flag_is_blamed_on_the_flag_not_the_file(tmp_path, capsys):
    path = tmp_path / "actuator.yaml"
    path.write_text("cooldown_s: 10\n")
    assert cli_main(["actuate", "--config", str(path), "--interval-s", "-5", "--once"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("rlalloc: error: flag --interval-s: invalid actuator setting: interval_s "
                   "must be a finite number > 0 (got -5.0)")


# ----------------------------------------------------------------- set-up and --once errors
def _actuate(tmp_path, monkeypatch, capsys, settings: dict, *flags: str,
             policy: object | None = None, stdout: list[str] | None = None,
             once: bool = True, crd_file: Path | None = INSTALLED_CRD_FILE,
             ) -> tuple[int, list[str], list[dict]]:
    """`rlalloc actuate --once` (`once`; else the loop, for a test that must stop at start-up)
    in-process with `policy` (default: the tiny one), no look-ahead signals, any status port,
    no API retries and `settings`, RLALLOC_CRD_PATH set to `crd_file` (default: the CRD the twin
    has installed, so that an API server that is down or fake is met where the test means it
    to be; None: unset, the CRD is read from the cluster); its exit code, the stderr lines that
    are not JSON log lines, and the JSON log lines (its stdout lines into `stdout`)."""
    if crd_file is None:
        monkeypatch.delenv(CRD_PATH_ENV, raising=False)
    else:
        monkeypatch.setenv(CRD_PATH_ENV, str(crd_file))
    monkeypatch.setattr("rlalloc.cli.actuate.load_policy", lambda name: policy or TinyElastic())
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])  # the actuator installs its JSON handler here
    monkeypatch.setattr(root, "level", root.level)
    urllib3_log = logging.getLogger("urllib3")  # and quietens this one
    monkeypatch.setattr(urllib3_log, "level", urllib3_log.level)
    path = tmp_path / "actuator.yaml"
    path.write_text(yaml.safe_dump({"signals": "none", "listen_port": 0, "api_retries": 0,
                                    "lease_namespace": "default", **settings}))
    code = cli_main(["actuate", "--config", str(path), *(["--once"] if once else []), *flags])
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    if stdout is not None:
        stdout += captured.out.splitlines()
    return (code, [line for line in lines if not line.startswith("{")],
            [json.loads(line) for line in lines if line.startswith("{")])


@contextmanager
def _busy_port() -> Iterator[int]:
    """A port of 127.0.0.1 someone listens on."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        yield busy.getsockname()[1]


def _kubeconfig(tmp_path, url: str) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(dump_kubeconfig(url))
    return str(path)


@pytest.mark.parametrize("text, expected", [
    ("job_id,submit_s\na,0\n", "not usable ('str' object does not support item assignment)"),
    ("clusters: [1, 2\n", "not usable (while parsing a flow sequence"),
    (None, "no such file"),
])
def test_a_bad_kubeconfig_is_one_line_naming_it(tmp_path, monkeypatch, capsys, text, expected):
    path = tmp_path / "short.csv"
    if text is not None:
        path.write_text(text)
    code, err, _ = _actuate(tmp_path, monkeypatch, capsys, {"kubeconfig": str(path)}, "--dry-run")
    assert code == 2 and len(err) == 1
    assert err[0].startswith(f"rlalloc: error: kubeconfig {path}: {expected}")


@pytest.mark.parametrize("text, expected", [
    ("kind: ConfigMap\n", "is not a CustomResourceDefinition"),
    ("spec: [1, 2\n", "is not valid YAML"),
    (None, "cannot read the PyTorchJob CRD"),
])
def test_a_wrong_crd_file_is_one_line_at_start_up(tmp_path, monkeypatch, capsys, text,
                                                  expected):
    # every patch is validated against the CRD: a wrong file must stop the start-up, not
    # fail every cycle's first write (a dry run, which writes nothing, would never notice)
    crd = tmp_path / "crd.yaml"
    if text is not None:
        crd.write_text(text)
    code, err, _ = _actuate(tmp_path, monkeypatch, capsys, {
        "kubeconfig": _kubeconfig(tmp_path, f"http://127.0.0.1:{free_port()}")}, "--dry-run",
        crd_file=crd)
    assert code == 2 and len(err) == 1
    assert expected in err[0] and str(crd) in err[0] and "RLALLOC_CRD_PATH" in err[0]


def test_the_actuator_checks_its_patches_against_the_crd_the_cluster_has(tmp_path, monkeypatch,
                                                                        capsys):
    # no RLALLOC_CRD_PATH: the CRD is read from the cluster (the twin has it installed), and a
    # patch with a field it does not know is refused before it is sent
    server, *_ = _world(tmp_path, _state())
    start = _rename(Action(ActionKind.SCALE, "q", 2, ("node-0001", "node-0001")))

    def with_a_typo(*args: object) -> dict:
        patch = placement_patch(*args)
        patch["spec"]["pytorchReplicaSpecs"]["Worker"]["replica"] = 2
        return patch

    monkeypatch.setattr(apply, "placement_patch", with_a_typo)
    out: list[str] = []
    try:
        with EmptyPrometheus() as prometheus:
            code, err, _ = _actuate(tmp_path, monkeypatch, capsys, {
                "prometheus_url": prometheus.url, "require_node_telemetry": False,
                "kubeconfig": _kubeconfig(tmp_path, server.url)}, policy=Scripted(start),
                stdout=out, crd_file=None)
        read = [r.url.path for r in list(server.api) if "/customresourcedefinitions/" in
                r.url.path]
        moves = _moves(server.api)
        replicas = server.call(server.api.get, PYTORCHJOBS, "default", "q")["spec"][
            "pytorchReplicaSpecs"]["Worker"]["replicas"]
    finally:
        server.stop()
    assert (code, err) == (0, [])
    assert read == [f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{PYTORCHJOB_CRD}"]
    assert out[1] == (
        "  failed: scale default/q: 0 -> 2 workers, none -> node-0001=2 (PyTorchJob q violates "
        f"the CRD schema (the cluster's CRD {PYTORCHJOB_CRD}): "
        "spec.pytorchReplicaSpecs.Worker.replica: unknown field; try 1 of 5, the job's next "
        "in 60s)")
    # refused before it was sent: the one write records the failed try
    assert moves == ["PATCH /apis/kubeflow.org/v1/namespaces/default/pytorchjobs/q"]
    assert replicas == 0


def test_the_api_server_is_asked_to_refuse_unknown_fields(tmp_path):
    server, _, kube, _ = _world(tmp_path, _state())
    try:
        kube.patch_pytorchjob("default", "q", {"spec": {"pytorchReplicaSpecs": {"Worker": {
            "replicas": 2}}}})
        kube.scale_pytorchjob("default", "q", 1)
        with pytest.raises(KubeError, match="HTTP 422") as refused:
            kube.patch_pytorchjob("default", "q", {"spec": {"bogus": 1}})
        writes = [r for r in list(server.api) if str(r.method.value).upper() == "PATCH"]
        kube.cordon("node-0001")
        kube.uncordon("node-0001")
        kube.create_event("default", {"name": "q", "namespace": "default", "uid": "u"},
                          "Test", "m", False, "a-0")
        every_write = [r for r in list(server.api) if str(r.method.value).upper() != "GET"]
    finally:
        server.stop()
    assert refused.value.status == 422
    # the API server's own words: which field it refused
    assert str(refused.value).endswith("spec.bogus: unknown field")
    assert [r.url.query.get("fieldValidation") for r in writes] == ["Strict"] * 3
    # every write names its field manager, so managedFields tell the actuator's changes apart
    assert len(every_write) == 6
    assert {r.url.query.get("fieldManager") for r in every_write} == {"rlalloc-actuator"}


@pytest.mark.parametrize("status, said, fix", [
    # the API server's own message follows its status (the twin's injected fault says this)
    (403, ": injected HTTP 403",
     f"grant get on customresourcedefinitions named {PYTORCHJOB_CRD}, as the ClusterRole "
     "of actuator/deploy/20-rbac.yaml does, or set RLALLOC_CRD_PATH to a copy of the CRD"),
    (404, "", "the Kubeflow Training Operator's PyTorchJob CRD is not installed in this "
              "cluster; install the Training Operator, or point the kubeconfig at a cluster "
              "that has it"),
])
def test_a_crd_the_actuator_cannot_read_is_one_line_naming_the_fix(tmp_path, monkeypatch,
                                                                   capsys, status, said, fix):
    server, *_ = _world(tmp_path, _state())
    if status == 403:
        server.api.inject_fault("GET", "/customresourcedefinitions/", 403)
    else:
        server.call(server.api.remove, CRDS, None, PYTORCHJOB_CRD)
    try:
        code, err, _ = _actuate(tmp_path, monkeypatch, capsys, {
            "kubeconfig": _kubeconfig(tmp_path, server.url)}, "--dry-run", crd_file=None)
    finally:
        server.stop()
    assert code == 2 and err == [
        f"rlalloc: error: cannot read the PyTorchJob CRD from the Kubernetes API at {server.url} "
        f"(read customresourcedefinition {PYTORCHJOB_CRD}: HTTP {status} "
        f"{HTTPStatus(status).phrase}{said}); {fix}"]


def test_rlalloc_crd_path_wins_over_the_clusters_crd(tmp_path, monkeypatch, capsys):
    server, *_ = _world(tmp_path, _state())
    server.api.inject_fault("GET", "/customresourcedefinitions/", 403)  # would stop the start
    out: list[str] = []
    try:
        with EmptyPrometheus() as prometheus:
            code, err, _ = _actuate(tmp_path, monkeypatch, capsys, {
                "prometheus_url": prometheus.url, "require_node_telemetry": False,
                "kubeconfig": _kubeconfig(tmp_path, server.url)}, "--dry-run",
                policy=Scripted(), stdout=out, crd_file=INSTALLED_CRD_FILE)
        read = [r for r in list(server.api) if "/customresourcedefinitions/" in r.url.path]
    finally:
        server.stop()
    assert (code, err, read) == (0, [], [])
    assert out == ["cycle 1: no move, the policy proposed none (dry run)"]


def test_a_status_port_in_use_is_one_line_but_no_matter_for_once(tmp_path, monkeypatch, capsys):
    """The loop refuses a busy port before its first cycle; `--once` serves no probes, so the
    smoke test runs beside the actuator whose port it is (it failed on it)."""
    api = f"http://127.0.0.1:{free_port()}"
    with _busy_port() as port:
        settings = {"kubeconfig": _kubeconfig(tmp_path, api), "listen_host": "127.0.0.1",
                    "listen_port": port}
        code, err, _ = _actuate(tmp_path, monkeypatch, capsys, settings, "--dry-run",
                                once=False)
        assert code == 2 and err == [
            f"rlalloc: error: cannot serve /metrics, /healthz and /livez on 127.0.0.1:{port} "
            "(Address already in use); choose another --listen-port (0 = any free port)"]
        code, err, _ = _actuate(tmp_path, monkeypatch, capsys, settings, "--dry-run")
    # the cycle ran: it ends at the (absent) Prometheus, not at the port
    assert code == 2 and len(err) == 1 and err[0].startswith(
        "rlalloc: error: --once: cannot read Prometheus at")


def test_a_status_host_that_does_not_resolve_is_one_line_naming_why(tmp_path, monkeypatch,
                                                                     capsys):
    code, err, _ = _actuate(tmp_path, monkeypatch, capsys, {
        "kubeconfig": _kubeconfig(tmp_path, f"http://127.0.0.1:{free_port()}"),
        "listen_host": "nohost.invalid", "listen_port": 0}, "--dry-run", once=False)
    assert code == 2 and len(err) == 1
    assert "(Name or service not known); check listen_host and --listen-port" in err[0]


def test_once_names_an_unreachable_prometheus(tmp_path, monkeypatch, capsys):
    url = f"http://127.0.0.1:{free_port()}"
    code, err, logs = _actuate(tmp_path, monkeypatch, capsys, {
        "prometheus_url": url, "kubeconfig": _kubeconfig(tmp_path, url)}, "--dry-run")
    assert code == 2 and len(err) == 1
    assert err[0].startswith(f"rlalloc: error: --once: cannot read Prometheus at {url} (")
    assert "Connection refused" in err[0]
    assert err[0].endswith("check --prometheus-url and that Prometheus is up")
    # our own warning of the skipped cycle, not urllib3's of the retry it made inside
    warnings = [(line["logger"], line["message"]) for line in logs if line["level"] != "info"]
    assert len(warnings) == 1 and warnings[0][0] == "rlalloc.actuator", warnings
    assert warnings[0][1].startswith("cycle skipped, no moves: ")


class _JsonEverywhere(http.server.BaseHTTPRequestHandler):
    """Answers every GET with JSON that is not the Prometheus API's (a health endpoint, say)."""

    def do_GET(self) -> None:
        body = b'{"status": "ok"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        del args


def _exporter() -> http.server.HTTPServer:
    """A metrics exporter, like the twin's: its text page on every path."""
    server, _ = start_http_server(0, addr="127.0.0.1", registry=CollectorRegistry())
    return server


def _json_server() -> http.server.HTTPServer:
    """A server answering JSON that is not the Prometheus API's, on every path."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _JsonEverywhere)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize(("start_server", "reason"), [
    (_exporter, "the server answered, but not as the Prometheus HTTP API (not JSON); is this "
                "Prometheus's URL?)"),
    (_json_server, "the server answered JSON without the Prometheus HTTP API's data.result; "
                   "is this Prometheus's URL?)"),
], ids=["text", "json"])
def test_once_names_a_url_that_is_not_prometheus(tmp_path, monkeypatch, capsys, start_server,
                                                 reason):
    server = start_server()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        code, err, _ = _actuate(tmp_path, monkeypatch, capsys, {
            "prometheus_url": url, "kubeconfig": _kubeconfig(tmp_path, url)}, "--dry-run")
    finally:
        server.shutdown()
        server.server_close()
    assert code == 2 and len(err) == 1
    assert err[0].startswith(f"rlalloc: error: --once: cannot read Prometheus at {url} (")
    assert reason in err[0]


def test_a_clock_query_without_series_asks_whether_its_exporter_is_up():
    """A twin stopped under a running actuator leaves its clock series to go stale: the
    cycle's error should point at the exporter, not only say that a query came back empty."""
    with EmptyPrometheus() as server:
        source = PrometheusSource(ActuatorConfig(
            prometheus_url=server.url, queries=Queries(clock="rlalloc_twin_clock_seconds")))
        with pytest.raises(ObserveError, match="returned no series; is the exporter that "
                                               "serves it .* up, and is Prometheus scraping it"):
            source.fetch(None, 0)
        source.close()


def test_once_names_an_api_server_that_answers_404(tmp_path, monkeypatch, capsys):
    with EmptyPrometheus() as server:  # Prometheus without data; its 404s stand for the API
        code, err, _ = _actuate(tmp_path, monkeypatch, capsys, {
            "prometheus_url": server.url, "kubeconfig": _kubeconfig(tmp_path, server.url)},
            "--dry-run")
    assert code == 2 and len(err) == 1
    assert err[0].startswith(f"rlalloc: error: --once: cannot use the Kubernetes API at "
                             f"{server.url} (list nodes: HTTP 404")
    assert "PyTorchJob CRD installed" in err[0]


def test_once_names_an_api_server_that_is_down_even_for_the_lease(tmp_path, monkeypatch,
                                                                  capsys):
    url = f"http://127.0.0.1:{free_port()}"
    with EmptyPrometheus() as prometheus:
        code, err, _ = _actuate(tmp_path, monkeypatch, capsys, {
            "prometheus_url": prometheus.url, "kubeconfig": _kubeconfig(tmp_path, url)})
    assert code == 2 and len(err) == 1  # not taken for a standby, which would exit 0
    assert err[0].startswith(f"rlalloc: error: --once: cannot use the Kubernetes API at {url} "
                             "(read lease default/rlalloc-actuator")
    # the reason, not the name of urllib3's wrapper (MaxRetryError) around it
    assert "NewConnectionError" in err[0] and "Connection refused" in err[0]
    assert "MaxRetryError" not in err[0]
    assert err[0].endswith("check the kubeconfig and that the API server is up")


def test_once_names_a_tls_mismatch_with_the_api_server(tmp_path, monkeypatch, capsys):
    with EmptyPrometheus() as prometheus:  # a plain-HTTP server behind an https:// kubeconfig
        url = prometheus.url.replace("http://", "https://")
        code, err, _ = _actuate(tmp_path, monkeypatch, capsys, {
            "prometheus_url": prometheus.url, "kubeconfig": _kubeconfig(tmp_path, url)},
            "--dry-run")
    assert code == 2 and len(err) == 1
    assert f"cannot use the Kubernetes API at {url} (list nodes: SSLError: " in err[0]


@pytest.mark.parametrize("server", ["", "127.0.0.1:6443"])
def test_a_kubeconfig_without_a_server_url_is_one_line_at_start_up(tmp_path, monkeypatch,
                                                                   capsys, server):
    path = _kubeconfig(tmp_path, "http://127.0.0.1:1")
    doc = json.loads(open(path).read())
    doc["clusters"][0]["cluster"]["server"] = server
    with open(path, "w") as f:
        json.dump(doc, f)
    code, err, logs = _actuate(tmp_path, monkeypatch, capsys, {"kubeconfig": path}, "--dry-run")
    assert code == 2 and logs == [] and err == [  # refused before any cycle or warning
        f"rlalloc: error: kubeconfig {path}: the cluster's server is {server!r}, not an "
        "http:// or https:// URL; set clusters[].cluster.server to the API server's address "
        "(kubectl config view --raw > FILE)"]


@pytest.mark.parametrize("flag", ["--kube-port", "--metrics-port"])
def test_twin_port_in_use_is_one_line(tmp_path, capsys, flag):
    with _busy_port() as port:
        ports = {"--kube-port": "0", "--metrics-port": "0", flag: str(port)}
        code = cli_main(["twin", "--workload", "synthetic:3", "--cluster", "2x4",
                         "--duration-s", "1", "--out-dir", str(tmp_path / "twin"),
                         *[word for pair in ports.items() for word in pair]])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert f"on 127.0.0.1:{port} (Address already in use); choose another {flag}" in err[0]


def test_twin_takes_a_failure_rate_as_simulate_and_evaluate_do(tmp_path, capsys, monkeypatch):
    """--failures is a preset or failures per GPU-day, read by `parse_failure_rate`."""
    from rlalloc.actuator.twin import harness

    start_twin, rates = harness.start_twin, []

    def recording(scenario, **kwargs):
        rates.append(kwargs["params"].failures.failures_per_gpu_day)
        return start_twin(scenario, **kwargs)

    monkeypatch.setattr(harness, "start_twin", recording)
    for value in ("0.2", "stress"):
        assert cli_main(["twin", "--workload", "synthetic:3", "--cluster", "2x4", "--failures",
                         value, "--kube-port", "0", "--metrics-port", "0", "--duration-s", "1",
                         "--out-dir", str(tmp_path / value)]) == 0
    assert rates == [0.2, STRESS_FAILURES_PER_GPU_DAY]
    capsys.readouterr()


@pytest.mark.parametrize("argv, expected", [
    (["twin", "--failures", "often"], "--failures 'often': give failures per GPU-day, a number "
                                      "from 0 to 10"),
    (["twin", "--failures", "11"], "--failures '11': give failures per GPU-day"),
    (["twin", "--scrape-interval-s", "0"], "argument --scrape-interval-s: 0: must be > 0"),
    (["twin", "--metrics-port", "70000"],
     "argument --metrics-port: 70000: must be within [0, 65535]"),
    (["twin", "--prometheus-url", "localhost:9090"],  # `actuate` would refuse its actuator.yaml
     "flag --prometheus-url: invalid actuator setting: prometheus_url must start with http:// "
     "or https:// (got 'localhost:9090')"),
    (["twin", "--cluster", "3x4", "--fail-node", "node-9999:60:120"],
     "--fail-node node-9999: no such node in the cluster 3x4; its nodes are node-0000, "
     "node-0001, node-0002"),
    (["twin", "--fail-node", "node-9999:60:120"], "its nodes are node-0000 ... node-0007"),
    (["twin", "--namespace", "Bad_NS!"], "argument --namespace: 'Bad_NS!' cannot name a namespace"),
    (["bench", "actuator", "--nodes", "0"], "argument --nodes: 0: must be within [1, 100000]"),
    (["bench", "actuator", "--nodes", "-3"], "argument --nodes: -3: must be within [1, 100000]"),
    (["bench", "actuator", "--nodes", "9999999"], "--nodes: 9999999: must be within [1, 100000]"),
    (["bench", "actuator", "--repeats", "0"], "argument --repeats: 0: must be at least 1"),
    (["bench", "actuator", "--jobs", "-5"], "argument --jobs: -5: must be within [0, 1000000]"),
])
def test_bad_twin_and_bench_flags_are_one_line(tmp_path, capsys, argv, expected):
    # a twin that wrongly accepts its flags stops after a second instead of running on
    twin_flags = ["--kube-port", "0", "--metrics-port", "0", "--duration-s", "1", "--out-dir",
                  str(tmp_path)]
    assert cli_main([argv[0], *(twin_flags if argv[0] == "twin" else []), *argv[1:]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rlalloc: error: ") and expected in err[0]


# ------------------------------------------------------------------------------- helpers
def _rename(action: Action) -> Action:
    """`action` with the actuator's job id (namespace/name) for the hand-made world's job."""
    return replace(action, job_id=f"default/{action.job_id}")


def _xid(values: list[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.int32)


def _http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0

