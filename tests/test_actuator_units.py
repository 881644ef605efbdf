"""Tiny worlds with obvious answers for the actuator's pure parts: guardrails, state building,
the patches it writes, and its deployment manifests; and the twin's API and Prometheus config
as kubectl, the kubernetes client and promtool read them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
import urllib.request
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml
from packaging.requirements import Requirement

from rlalloc.actuator.apply import merge_patch, misplaced_pods, placement_patch
from rlalloc.actuator.config import (
    NORMAL_BUSY_RISE_C,
    NORMAL_IDLE_TEMPERATURE_C,
    ActuatorConfig,
    load_config,
)
from rlalloc.actuator.guardrails import (
    DecisionHistory,
    decide,
    history_annotations,
    policy_view,
    recorded_history,
    rule_of,
)
from rlalloc.actuator.k8s_names import (
    HOSTNAME_LABEL,
    PLACEMENT_ANNOTATION,
    PYTORCHJOB_CRD,
    REQUESTED_WORKERS_ANNOTATION,
)
from rlalloc.actuator.state_builder import JobRef, Ledger, Observation, PodRef, build_state
from rlalloc.actuator.twin.harness import actuator_settings, prometheus_config, prometheus_duration
from rlalloc.actuator.twin.kube_api import (
    NODES,
    PODS,
    PYTORCHJOBS,
    ApiServerThread,
    TwinKubeAPI,
    dump_kubeconfig,
)
from rlalloc.actuator.twin.render import (
    cluster_objects,
    pod_object,
    query_results,
    telemetry_results,
)
from rlalloc.env.errors import UserError
from rlalloc.env.failures import NODE_FEATURE_NAMES
from rlalloc.env.params import SimParams
from rlalloc.env.state import (
    NOOP,
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
from rlalloc.forecaster.signals import load_signals

from actuator_fixtures import Scripted, twin_crd_validator

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "actuator" / "deploy"


def _world(time_s: float = 1000.0) -> ClusterState:
    """node-a: 4 GPUs, 2 used by "run" (min 1, max 4); node-b: 4 free; "wait" queued (2..4)."""
    nodes = Nodes.from_records([NodeInfo("node-a", 4, 2), NodeInfo("node-b", 4, 4)])
    jobs = Jobs.from_records([
        JobInfo("run", JobStatus.RUNNING, 0.0, 2, 1, 4, workers=2, placement=(0, 0),
                throughput=2.0),
        JobInfo("wait", JobStatus.QUEUED, 10.0, 4, 2, 4)])
    return ClusterState(time_s=time_s, nodes=nodes, jobs=jobs, demand=Demand(pending_gpus=4))


def _decide(*actions: Action, config: ActuatorConfig | None = None,
            history: DecisionHistory | None = None, state: ClusterState | None = None):
    config = config or ActuatorConfig(cooldown_s=300.0)
    return decide(state or _world(), Scripted(*actions), config, history or DecisionHistory())


def scale(job: str, *nodes: str) -> Action:
    return Action(ActionKind.SCALE, job, len(nodes), tuple(nodes))


# ------------------------------------------------------------------------------ guardrails
def test_guardrails_accept_a_valid_start_and_account_its_gpus():
    cycle = _decide(scale("wait", "node-b", "node-b", "node-b", "node-b"),
                    scale("run", "node-a", "node-a", "node-b"))  # node-b is full by then
    assert [d.accepted for d in cycle.decisions] == [True, False]
    assert cycle.decisions[1].reason == "not enough free GPUs on node-b: needs 1, 0 free"
    assert cycle.projected.nodes.gpus_free.tolist() == [2, 0]
    assert cycle.projected.jobs.status.tolist() == [JobStatus.RUNNING, JobStatus.RESTARTING]
    assert cycle.projected.demand.pending_gpus == 0


@pytest.mark.parametrize("action, reason, rule", [
    (scale("wait", *["node-b"] * 5), "5 workers is outside the job's elasticPolicy [2, 4]",
     "elastic_range"),
    (scale("wait", "node-b"), "1 workers is outside the job's elasticPolicy [2, 4]",
     "elastic_range"),
    (scale("ghost", "node-b"), "job ghost is not managed", "unmanaged"),
    (scale("run", "node-a", "node-a"), "placement unchanged", "invalid_action"),
    (Action(ActionKind.SCALE, "wait", 0, ()), "the job is already suspended", "invalid_action"),
    (scale("run", "node-c", "node-c"), "unknown node node-c", "invalid_action"),
    (Action(ActionKind.MIGRATE, "run", 2, ("node-a", "node-b"), from_node="node-a"),
     "the new placement still uses node-a", "invalid_action"),
    (Action(ActionKind.MIGRATE, "wait", 2, ("node-b", "node-b"), from_node="node-a"),
     "the job is not running", "invalid_action"),
])
def test_guardrails_refuse_with_a_reason(action, reason, rule):
    decision = _decide(action).decisions[0]
    assert not decision.accepted and decision.reason.startswith(reason)
    assert rule_of(decision.reason) == rule  # the refusals metric's label for this guardrail


def test_guardrails_refuse_cordoned_and_down_nodes():
    world = _world()
    cordoned = replace(world, nodes=replace(world.nodes, cordoned=world.nodes.cordoned | [0, 1]))
    assert _decide(scale("wait", "node-b", "node-b"), state=cordoned).decisions[0].reason == \
        "node node-b is cordoned"
    down = replace(world, nodes=replace(world.nodes, ready=world.nodes.ready & [True, False]))
    assert _decide(scale("wait", "node-b", "node-b"), state=down).decisions[0].reason == \
        "node node-b is not Ready"


def test_cooldown_holds_a_job_but_not_its_failover():
    history = DecisionHistory({"run": 900.0})
    grow = scale("run", "node-a", "node-a", "node-a")
    assert _decide(grow, history=history).decisions[0].reason.startswith("cooldown: changed 100s")
    move = Action(ActionKind.MIGRATE, "run", 2, ("node-b", "node-b"), from_node="node-a")
    assert _decide(move, history=history).decisions[0].accepted


def test_disruption_caps_per_cycle_and_per_hour():
    config = ActuatorConfig(cooldown_s=0.0, max_disruptions_per_cycle=1,
                            max_disruptions_per_hour=3)
    shrink = scale("run", "node-a")
    move = Action(ActionKind.MIGRATE, "run", 1, ("node-b",), from_node="node-a")
    cycle = _decide(shrink, move, config=config)
    assert [d.accepted for d in cycle.decisions] == [True, False]
    assert cycle.decisions[1].reason.startswith("disruption cap: 1 disruptive moves per cycle")
    busy_hour = DecisionHistory({}, (100.0, 200.0, 300.0))  # 3 in the last hour (t=1000)
    assert _decide(shrink, config=config, history=busy_hour).decisions[0].reason.startswith(
        "disruption cap: 3 disruptive moves in the last hour")
    old = DecisionHistory({}, (-3000.0, -2900.0, -2800.0))  # more than an hour ago
    assert _decide(shrink, config=config, history=old).decisions[0].accepted
    # starting a queued job disrupts nobody and is not capped
    start = scale("wait", "node-b", "node-b")
    assert _decide(start, config=config, history=busy_hour).decisions[0].accepted


def test_a_refused_job_is_hidden_and_the_policy_asked_again():
    """A refusal ended the cycle, and a policy shown the same state next cycle proposed the same
    thing: one job in its cooldown (or over the hour's disruption cap) held every other job's
    start up for as long. The refused job leaves the policy's view for the rest of the cycle."""
    shown: list[tuple[str, ...]] = []

    class GrowFirst:  # grows "run" while it sees it, else starts "wait"
        def act(self, state: ClusterState) -> Action:
            shown.append(tuple(state.jobs.job_id))
            if "run" in state.jobs.job_id:
                return scale("run", "node-a", "node-a", "node-a")
            if state.jobs.workers[state.job_index("wait")] == 0:
                return scale("wait", "node-b", "node-b")
            return NOOP

    cycle = decide(_world(), GrowFirst(), ActuatorConfig(cooldown_s=300.0),
                   DecisionHistory({"run": 900.0}))
    assert [(d.action.job_id, d.accepted) for d in cycle.decisions] == [
        ("run", False), ("wait", True)]
    assert cycle.decisions[0].reason.startswith("cooldown")
    assert shown == [("run", "wait"), ("wait",), ("wait",)]
    assert cycle.projected.jobs.workers.tolist() == [2, 2]  # "run" untouched, still there
    # a hidden queued job leaves no queue behind in the demand the policy sees
    view = policy_view(_world(), ActuatorConfig(), frozenset(), frozenset({"wait"}))
    assert (list(view.jobs.job_id), view.demand.pending_gpus) == (["run"], 0)


def test_the_history_annotations_keep_the_hour_and_survive_a_users_edit():
    current = {"rlalloc.io/disruptions": "100.0,soon,nan,3000.5,1e12"}
    written = history_annotations(current, 4000.0, disruptive=True)
    # 100 s is over an hour ago, 1e12 no time of a change (a hand edit): neither is kept
    assert written == {"rlalloc.io/last-change": "4000.0",
                       "rlalloc.io/disruptions": "3000.5,4000.0"}
    assert history_annotations({}, 50.0, disruptive=False)["rlalloc.io/disruptions"] == ""
    history = recorded_history({"a": written, "b": {"rlalloc.io/last-change": "x"}, "c": {}},
                               4000.0)
    assert history == DecisionHistory({"a": 4000.0}, (3000.5, 4000.0))
    merged = DecisionHistory({"a": 4100.0, "d": 10.0}, (4000.0, 4050.0)).merge(history)
    assert merged == DecisionHistory({"a": 4100.0, "d": 10.0}, (3000.5, 4000.0, 4050.0))
    # a far-future cooldown or disruption (a hand edit, a clock set back) held a job in
    # cooldown, or filled the hour's cap, for ever; a few seconds ahead (clock skew) is now
    edited = recorded_history({"a": {"rlalloc.io/last-change": "1e12",
                                     "rlalloc.io/disruptions": ",".join(["1e12"] * 20)},
                               "b": {"rlalloc.io/last-change": "4010.0"}}, 4000.0)
    assert edited == DecisionHistory({"b": 4000.0}, ())


def test_two_disruptions_of_one_cycle_count_twice():
    """Moves of one cycle share its time: kept as a set, the two counted once after the next
    merge, and the hourly cap let twice its number through."""
    two = DecisionHistory().record("a", 1000.0, True).record("b", 1000.0, True)
    read_back = recorded_history({"a": history_annotations({}, 1000.0, True),
                                  "b": history_annotations({}, 1000.0, True)}, 1030.0)
    assert two.merge(read_back).disruptions_s == (1000.0, 1000.0)
    assert read_back.merge(DecisionHistory()).disruptions_s == (1000.0, 1000.0)
    config = ActuatorConfig(cooldown_s=0.0, max_disruptions_per_hour=2)
    shrink = scale("run", "node-a")
    assert _decide(shrink, config=config, history=two.merge(read_back)).decisions[0].reason \
        .startswith("disruption cap: 2 disruptive moves in the last hour")


# -------------------------------------------------------------------------- state building
def _observe(state: ClusterState, extra_pods: list[dict] = (), ledger: Ledger = Ledger(),
             time_s: float | None = None):
    names = {j: j for j in state.jobs.job_id}
    nodes, pods, jobs = cluster_objects(state, "ns", names)
    results = query_results(state, "ns", names, 5000.0)
    return build_state(Observation(state.time_s if time_s is None else time_s, nodes,
                                   pods + list(extra_pods), jobs, results),
                       ActuatorConfig(), ledger)


def test_state_counts_unmanaged_pods_and_ignores_unmanaged_jobs():
    state = _world()
    stranger = pod_object("other", "someone-else", 0, "node-b", running=True)
    built = _observe(state, [stranger])
    assert built.state.nodes.gpus_free.tolist() == [2, 3]  # the stranger's GPU is not free
    assert built.state.jobs.job_id == ("ns/run", "ns/wait")
    names = {j: j for j in state.jobs.job_id}
    nodes, pods, jobs = cluster_objects(state, "ns", names)
    del jobs[1]["metadata"]["labels"]["rlalloc.io/managed"]
    built = build_state(Observation(state.time_s, nodes, pods, jobs, {}), ActuatorConfig(),
                        Ledger())
    assert built.state.jobs.job_id == ("ns/run",)


def test_a_request_outside_the_elastic_range_is_kept_within_it():
    """Policies rely on min <= request <= max, as every simulated workload has it; a
    PyTorchJob annotated outside its elasticPolicy must not break that."""
    state = _world()  # "wait": request 4 within 2..4
    nodes, pods, jobs = cluster_objects(state, "ns", {j: j for j in state.jobs.job_id})
    for value, expected in (("16", 4), ("1", 2), ("3", 3)):
        jobs[1]["metadata"]["annotations"][REQUESTED_WORKERS_ANNOTATION] = value
        built = build_state(Observation(state.time_s, nodes, pods, jobs, {}), ActuatorConfig(),
                            Ledger())
        assert built.state.jobs.requested_gpus.tolist()[1] == expected


def test_ledger_integrates_gpu_seconds_and_counts_restarts():
    first = _observe(_world(time_s=1000.0))
    assert first.state.jobs.attained_gpu_s.tolist() == [0.0, 0.0]
    second = _observe(_world(time_s=1100.0), ledger=first.ledger)
    assert second.state.jobs.attained_gpu_s.tolist() == [200.0, 0.0]  # 2 workers x 100 s
    assert second.state.jobs.run_s.tolist() == [100.0, 0.0]
    world = _world(time_s=1200.0)
    moved = replace(world, jobs=replace(world.jobs, placement=((1, 1), ())))
    third = _observe(moved, ledger=second.ledger)
    assert third.state.jobs.restarts.tolist() == [1, 0]
    assert third.state.jobs.attained_gpu_s.tolist() == [400.0, 0.0]


def _stopped(world: ClusterState, node_a_ready: bool) -> ClusterState:
    """`world` after "run" lost its workers, with node-a Ready or not."""
    jobs = replace(world.jobs, status=world.jobs.status.copy(), workers=world.jobs.workers * 0,
                   placement=((), ()), throughput=world.jobs.throughput * 0)
    jobs.status[0] = JobStatus.QUEUED
    nodes = replace(world.nodes, ready=world.nodes.ready & [node_a_ready, True],
                    gpus_free=world.nodes.gpus_total.copy())
    return replace(world, jobs=jobs, nodes=nodes)


def test_a_job_that_lost_its_node_shows_its_checkpointed_progress():
    """A silent trainer keeps its last progress after a resize or suspension (it checkpointed
    on SIGTERM), but a job whose node became unreachable resumes from its latest checkpoint,
    as the simulator rolls it back; a trainer that exports no checkpoint step keeps it too."""
    world = _world(time_s=1000.0)
    world = replace(world, jobs=replace(world.jobs, progress=np.array([0.6, 0.0], np.float32)))
    names = {j: j for j in world.jobs.job_id}
    nodes, pods, jobs = cluster_objects(world, "ns", names)
    running = {}
    for exported in (True, False):
        results = query_results(world, "ns", names, 5000.0,
                                checkpointed=np.array([0.5, 0.0]) if exported else None)
        assert ("trainer_checkpoint_step" in results) == exported
        running[exported] = build_state(
            Observation(1000.0, nodes, pods, jobs, results), ActuatorConfig(), Ledger())
        assert running[exported].state.jobs.progress[0] == pytest.approx(0.6)
    shown = {}
    for exported, ready in ((True, True), (True, False), (False, False)):
        later = _stopped(_world(time_s=1100.0), node_a_ready=ready)
        shown[exported, ready] = _observe(later, ledger=running[exported].ledger,
                                          time_s=1100.0).state.jobs.progress[0]
    assert shown[True, True] == pytest.approx(0.6)  # resized or suspended: nothing lost
    assert shown[True, False] == pytest.approx(0.5)  # node gone: back to the checkpoint
    assert shown[False, False] == pytest.approx(0.6)  # no checkpoint step exported


def test_time_since_checkpoint_counts_only_while_training_as_in_the_simulator():
    # "run" last checkpointed 2 h ago: that is work at risk while it trains, none while it
    # restores (the simulator counts training seconds since the checkpoint or the restart)
    world = _world(time_s=10_000.0)
    names = {j: j for j in world.jobs.job_id}
    nodes, pods, jobs = cluster_objects(world, "ns", names)
    since = {}
    for training in (True, False):
        results = query_results(world, "ns", names, 10_000.0)
        results["trainer_last_checkpoint"][0]["value"][1] = repr(10_000.0 - 7200.0)
        if not training:
            results["trainer_throughput"][0]["value"][1] = "0.0"
        built = build_state(Observation(10_000.0, nodes, pods, jobs, results), ActuatorConfig(),
                            Ledger())
        expected = JobStatus.RUNNING if training else JobStatus.RESTARTING
        assert built.state.jobs.status[0] == expected
        since[training] = built.state.jobs.since_checkpoint_s[0]
    assert since == {True: pytest.approx(7200.0), False: 0.0}


def test_unreachable_nodes_are_not_ready_and_have_no_free_gpus():
    world = _world()
    down = replace(world, nodes=replace(world.nodes, ready=world.nodes.ready & [True, False]))
    built = _observe(down)
    assert built.unreachable_nodes == frozenset({"node-b"})
    assert built.state.nodes.gpus_free.tolist() == [2, 0]


# --------------------------------------------------------------------------- look-ahead signals
def _signals_world() -> tuple[ClusterState, list[dict], list[dict], list[dict]]:
    state = _world()
    names = {j: j for j in state.jobs.job_id}
    return (state, *cluster_objects(state, "ns", names))


def test_failure_risk_is_the_models_on_now_and_earlier_features():
    signals = load_signals("standin")
    state, nodes, pods, jobs = _signals_world()
    warning = np.zeros((2, len(NODE_FEATURE_NAMES)), dtype=np.float32)
    warning[1] = [3, 5, 1, 0, 6.0, 4.0]  # node-b: XIDs, an ECC error, running hot
    calm = np.zeros_like(warning)
    results = query_results(state, "ns", {j: j for j in state.jobs.job_id}, 5000.0,
                            features=warning)
    earlier = telemetry_results(state.nodes.name, calm, 5000.0 - signals.risk_lag_s)
    built = build_state(Observation(state.time_s, nodes, pods, jobs, results,
                                    earlier_metrics=earlier), ActuatorConfig(), Ledger(),
                        signals)
    healthy = signals.node_risk(calm[:1], calm[:1])[0]
    expected = signals.node_risk(warning[1:], calm[1:])[0]
    assert built.state.nodes.failure_risk[0] == pytest.approx(healthy, rel=1e-6)
    assert built.state.nodes.failure_risk[1] == pytest.approx(expected, rel=1e-6)
    assert expected > healthy
    assert built.state.nodes.xid_errors_5m.tolist() == [0, 3]
    assert built.state.nodes.temperature_delta_30m_c.tolist() == [0.0, 4.0]
    # the same readings with stale DCGM samples: no signal, a healthy node's risk
    results["dcgm_last_sample"][1]["value"][1] = str(5000.0 - 600)
    built = build_state(Observation(state.time_s, nodes, pods, jobs, results,
                                    earlier_metrics=earlier), ActuatorConfig(), Ledger(),
                        signals)
    assert built.state.nodes.failure_risk.tolist() == pytest.approx([healthy, healthy], rel=1e-6)
    # without signals the risk is zero, as in the simulator without a model
    built = build_state(Observation(state.time_s, nodes, pods, jobs, results), ActuatorConfig(),
                        Ledger())
    assert built.state.nodes.failure_risk.tolist() == [0.0, 0.0]


def test_demand_forecast_pads_a_short_history_like_the_simulator():
    signals = load_signals("standin")
    state, nodes, pods, jobs = _signals_world()
    history = np.array([0.2, 0.4, 0.5])  # far fewer minutes than the forecast wants
    obs = Observation(state.time_s, nodes, pods, jobs, {}, demand_history=history)
    built = build_state(obs, ActuatorConfig(), Ledger(), signals)
    minute_of_day = int(state.time_s // 60) % 1440
    assert built.state.demand.forecast_gpus == pytest.approx(
        tuple(signals.demand_forecast(history, minute_of_day)))
    assert any(built.state.demand.forecast_gpus)
    empty = build_state(replace(obs, demand_history=np.array([])), ActuatorConfig(), Ledger(),
                        signals)
    assert empty.state.demand.forecast_gpus == (0.0, 0.0, 0.0)


def test_default_temperature_normal_is_the_simulators():
    params = SimParams()
    assert NORMAL_IDLE_TEMPERATURE_C == params.base_temperature_c
    assert NORMAL_BUSY_RISE_C == params.busy_temperature_rise_c
    # the twin's settings shrink the offsets of the excess queries with the windows
    settings = actuator_settings(100.0, "http://prometheus:9090")
    assert settings["clock_speedup"] == 100.0
    assert "offset 18s" in settings["queries"]["temperature_excess_delta"]
    assert "30m" not in settings["queries"]["temperature_excess_delta"]


@pytest.mark.parametrize("setting", [{"lease_namespace": "Bad NS/x"},
                                     {"namespaces": ("team-a", "Team_B")}])
def test_namespaces_that_kubernetes_would_not_accept_are_refused(setting):
    # the API server answers a bad namespace with a 404, which read as "no Kubernetes API"
    with pytest.raises(UserError, match=f"{next(iter(setting))}: .* cannot name a namespace"):
        ActuatorConfig(**setting)


def test_signals_setting_is_validated():
    assert ActuatorConfig().signals == "standin"  # as in simulation
    with pytest.raises(UserError, match="signals must be one of none, standin, lstm"):
        ActuatorConfig(signals="prophet")


# ------------------------------------------------------------------------------ writes
def _ref(obj: dict, pods: tuple[PodRef, ...] = ()) -> JobRef:
    return JobRef("ns", obj["metadata"]["name"], "uid", obj, pods)


def test_placement_patch_is_valid_and_keeps_the_users_own_affinity():
    state = _world()
    _, _, jobs = cluster_objects(state, "ns", {"run": "run", "wait": "wait"})
    job = jobs[1]
    del job["metadata"]["annotations"][REQUESTED_WORKERS_ANNOTATION]
    user_term = {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                                       "values": ["A100"]}]}
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["affinity"] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [user_term]}}}
    patch = placement_patch(_ref(job), scale("wait", "node-b", "node-b", "node-a"), 4)
    merged = merge_patch(job, patch)
    twin_crd_validator()(merged)
    worker = merged["spec"]["pytorchReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 3
    terms = worker["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [
        user_term["matchExpressions"][0],
        {"key": HOSTNAME_LABEL, "operator": "In", "values": ["node-a", "node-b"]}]}]
    annotations = merged["metadata"]["annotations"]
    assert annotations[PLACEMENT_ANNOTATION] == "node-a=1,node-b=2"
    assert annotations[REQUESTED_WORKERS_ANNOTATION] == "4"


def _apply_over_http(tmp_path: Path, state: ClusterState, actions: list[Action],
                     config: ActuatorConfig, edit=lambda pods, jobs: None) -> tuple:
    """Serve `state` from a twin API (its pod and job objects edited by `edit`), carry out
    `actions` with an `Applier` over a real `KubeClient`, and return (the state built from the
    API afterwards, the objects the API then holds by kind)."""
    from rlalloc.actuator.apply import Applier
    from rlalloc.actuator.kube import KubeClient, api_client_from

    names = {j: j for j in state.jobs.job_id}
    nodes, pods, jobs = cluster_objects(state, "default", names)
    edit(pods, jobs)
    server = ApiServerThread(TwinKubeAPI()).start()
    try:
        for resource, objects in ((NODES, nodes), (PODS, pods), (PYTORCHJOBS, jobs)):
            for obj in objects:
                server.call(server.api.put, resource, obj["metadata"].get("namespace"),
                            obj["metadata"]["name"], obj)
        (tmp_path / "kubeconfig").write_text(dump_kubeconfig(server.url))
        kube = KubeClient(config, api_client_from(replace(
            config, kubeconfig=str(tmp_path / "kubeconfig"))))

        def observe() -> object:
            return build_state(Observation(state.time_s, kube.list_nodes(), kube.list_pods(),
                                           kube.list_pytorchjobs(), {}), config, Ledger())

        built = observe()
        for action in actions:
            Applier(kube, config, twin_crd_validator()).apply(
                replace(action, job_id=f"default/{action.job_id}"), built)
        held = {"pods": {(p["metadata"]["name"], p["spec"].get("nodeName"))
                         for p in kube.list_pods()},
                "nodes": {n["metadata"]["name"]: bool(n["spec"].get("unschedulable"))
                          for n in kube.list_nodes()},
                "replicas": {j["metadata"]["name"]: j["spec"]["pytorchReplicaSpecs"]["Worker"][
                    "replicas"] for j in kube.list_pytorchjobs()}}
        return observe().state, held
    finally:
        server.stop()


@pytest.mark.parametrize("node_affinity", [True, False])
@pytest.mark.parametrize("elastic", [True, False])
def test_a_suspended_job_keeps_its_request_and_range(tmp_path, node_affinity, elastic):
    # "run" (request 2, 1..4) never changed by rlalloc before (no request annotation yet):
    # suspending it through /scale sets its replicas to 0, which must not become its request
    def unannotated(pods: list[dict], jobs: list[dict]) -> None:
        del jobs[0]["metadata"]["annotations"][REQUESTED_WORKERS_ANNOTATION]
        if not elastic:
            del jobs[0]["spec"]["elasticPolicy"]

    config = ActuatorConfig(node_affinity=node_affinity)
    after, held = _apply_over_http(tmp_path, _world(), [scale("run")], config, unannotated)
    assert held["replicas"]["run"] == 0
    jobs = after.jobs
    assert jobs.requested_gpus[0] == 2
    assert (jobs.min_workers[0], jobs.max_workers[0]) == ((1, 4) if elastic else (2, 2))


def _run_on_a_and_b() -> ClusterState:
    """"run" holds 1 GPU on node-a and 1 on node-b; node-c is free."""
    nodes = Nodes.from_records([NodeInfo("node-a", 4, 3), NodeInfo("node-b", 4, 3),
                                NodeInfo("node-c", 4, 4)])
    jobs = Jobs.from_records([JobInfo("run", JobStatus.RUNNING, 0.0, 2, 1, 4, workers=2,
                                      placement=(0, 1), throughput=2.0)])
    return ClusterState(time_s=1000.0, nodes=nodes, jobs=jobs, demand=Demand())


def test_a_move_deletes_every_pod_its_new_placement_leaves_and_cordons_the_failing_node(
        tmp_path):
    # the move off node-a pins "run" to node-c: its worker on node-b must go too
    move = Action(ActionKind.MIGRATE, "run", 2, ("node-c", "node-c"), from_node="node-a")
    _, held = _apply_over_http(tmp_path, _run_on_a_and_b(), [move], ActuatorConfig())
    assert held["pods"] == set()  # both workers go: the operator recreates them on node-c
    assert held["nodes"] == {"node-a": True, "node-b": False, "node-c": False}


def test_a_move_deletes_a_pod_on_the_failing_node_beyond_the_worker_count(tmp_path):
    # worker-1 is gone (still terminating from an earlier move, say): worker-2 on the failing
    # node has an index the operator would remove itself, with a grace a dead kubelet never
    # honours; the move must delete it as it does every pod there
    def renumbered(pods: list[dict], jobs: list[dict]) -> None:
        second = pods[1]
        second["metadata"]["name"] = "run-worker-2"
        second["metadata"]["labels"]["training.kubeflow.org/replica-index"] = "2"

    move = Action(ActionKind.MIGRATE, "run", 2, ("node-a", "node-c"), from_node="node-b")
    _, held = _apply_over_http(tmp_path, _run_on_a_and_b(), [move], ActuatorConfig(),
                               renumbered)
    assert held["pods"] == {("run-worker-0", "node-a")}


def test_a_delete_retried_after_the_pod_was_replaced_spares_the_replacement(tmp_path):
    # the delete of run-worker-1 went through but its answer was lost; the operator recreated
    # the worker under the same name; the retry, by name alone, killed the replacement
    from rlalloc.actuator.kube import KubeClient, api_client_from

    state = _world()
    server = _serve(state)
    try:
        (tmp_path / "kubeconfig").write_text(dump_kubeconfig(server.url))
        config = ActuatorConfig()
        kube = KubeClient(config, api_client_from(replace(
            config, kubeconfig=str(tmp_path / "kubeconfig"))))
        [first] = [p for p in kube.list_pods() if p["metadata"]["name"] == "run-worker-1"]
        replacement = {**first, "metadata": {
            k: v for k, v in first["metadata"].items() if k not in ("uid", "resourceVersion")}}
        server.call(server.api.remove, PODS, "default", "run-worker-1")
        server.call(server.api.put, PODS, "default", "run-worker-1", replacement)
        kube.delete_pod("default", "run-worker-1", 0, uid=first["metadata"]["uid"])  # no error
        [kept] = [p for p in kube.list_pods() if p["metadata"]["name"] == "run-worker-1"]
        assert kept["metadata"]["uid"] != first["metadata"]["uid"]
        kube.delete_pod("default", "run-worker-1", 0, uid=kept["metadata"]["uid"])
        assert "run-worker-1" not in {p["metadata"]["name"] for p in kube.list_pods()}
    finally:
        server.stop()


def test_the_projected_state_has_a_moved_jobs_failing_node_cordoned():
    # after the move off node-a is accepted, starting "wait" there is refused in the same cycle
    move = Action(ActionKind.MIGRATE, "run", 2, ("node-b", "node-b"), from_node="node-a")
    decided = _decide(move, scale("wait", "node-a", "node-a"))
    assert [d.accepted for d in decided.decisions] == [True, False]
    assert decided.decisions[1].reason == "node node-a is cordoned"


def test_misplaced_pods_leave_highest_index_first():
    pods = (PodRef("ns", "j-worker-0", "node-a", 0), PodRef("ns", "j-worker-1", "node-a", 1),
            PodRef("ns", "j-worker-2", "node-c", 2))
    # 3 workers, two on node-b and one on node-a: worker-1 and worker-2 must move
    leaving = misplaced_pods(pods, scale("j", "node-a", "node-b", "node-b"))
    assert [p.name for p in leaving] == ["j-worker-1", "j-worker-2"]
    # shrink to 1 on node-a: the operator removes 1 and 2 itself, 0 stays
    assert misplaced_pods(pods, scale("j", "node-a")) == []


# ------------------------------------------------------------------------------ manifests
def test_pods_are_deleted_with_at_least_the_trainer_manifests_grace():
    # a delete's grace replaces the pod's: 30 s SIGKILLed the trainer, whose manifest budgets
    # 30 s (trainer) < 35 s (torchrun) < 45 s (pod), while it wrote its final checkpoint
    manifest = yaml.safe_load((ROOT / "trainer_jobs" / "manifests" /
                               "pytorchjob-elastic.yaml").read_text())
    pod = manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert ActuatorConfig().pod_grace_s >= pod["terminationGracePeriodSeconds"]


def test_deploy_manifests_are_consistent(tmp_path):
    docs = [d for path in sorted(DEPLOY.glob("*.yaml"))
            for d in yaml.safe_load_all(path.read_text()) if d]
    kinds = {d["kind"] for d in docs}
    assert {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap",
            "Deployment"} <= kinds
    config_map = next(d for d in docs if d["kind"] == "ConfigMap")
    path = tmp_path / "actuator.yaml"
    path.write_text(config_map["data"]["actuator.yaml"])
    config = load_config(path, {})
    assert config.dry_run is True  # ships safe
    rules = {(group, resource, *rule.get("resourceNames", [])): set(rule["verbs"])
             for d in docs if d["kind"] in ("ClusterRole", "Role") for rule in d["rules"]
             for group in rule["apiGroups"] for resource in rule["resources"]}
    assert rules == {  # exactly what actuator/kube.py calls
        ("", "nodes"): {"list", "patch"}, ("", "pods"): {"list", "delete"},
        ("", "events"): {"create", "patch"}, ("kubeflow.org", "pytorchjobs"): {"list", "patch"},
        ("kubeflow.org", "pytorchjobs/scale"): {"patch"},
        ("apiextensions.k8s.io", "customresourcedefinitions", PYTORCHJOB_CRD): {"get"},
        ("coordination.k8s.io", "leases"): {"get", "create", "patch"}}
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    pod_spec = deployment["spec"]["template"]["spec"]
    assert pod_spec["enableServiceLinks"] is False  # no stray RLALLOC_ACTUATOR_* variables
    container = pod_spec["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"


# ------------------------------------------------------------------ the twin, as tools see it
def _serve(state: ClusterState) -> ApiServerThread:
    """A twin API holding `state`'s nodes, pods and PyTorchJobs."""
    server = ApiServerThread(TwinKubeAPI()).start()
    nodes, pods, jobs = cluster_objects(state, "default", {j: j for j in state.jobs.job_id})
    for resource, objects in ((NODES, nodes), (PODS, pods), (PYTORCHJOBS, jobs)):
        for obj in objects:
            server.call(server.api.put, resource, obj["metadata"].get("namespace"),
                        obj["metadata"]["name"], obj)
    return server


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def test_twin_api_discovery_and_lists_read_like_a_real_api_server():
    from kubernetes import client as k8s
    from kubernetes import dynamic

    server = _serve(_world())
    try:
        core = _get_json(f"{server.url}/api/v1")
        assert core["groupVersion"] == "v1"  # as the API server writes it: kubectl needs it
        assert {r["name"]: r["singularName"] for r in core["resources"]} == {
            "pods": "pod", "nodes": "node", "events": "event"}
        jobs = _get_json(f"{server.url}/apis/kubeflow.org/v1/pytorchjobs")
        assert (jobs["kind"], jobs["apiVersion"]) == ("PyTorchJobList", "kubeflow.org/v1")
        configuration = k8s.Configuration()
        configuration.host = server.url
        discovered = dynamic.DynamicClient(k8s.ApiClient(configuration)).resources
        for api_version, kind, names in (("v1", "Pod", ["run-worker-0", "run-worker-1"]),
                                         ("v1", "Node", ["node-a", "node-b"]),
                                         ("v1", "Event", []),
                                         ("kubeflow.org/v1", "PyTorchJob", ["run", "wait"]),
                                         ("apiextensions.k8s.io/v1", "CustomResourceDefinition",
                                          [PYTORCHJOB_CRD])):
            listing = discovered.get(api_version=api_version, kind=kind).get()
            assert (listing.kind, listing.apiVersion) == (f"{kind}List", api_version)
            assert sorted(item.metadata.name for item in listing.items) == names
    finally:
        server.stop()


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_the_documented_kubectl_command_reads_the_twin(tmp_path):
    server = _serve(_world())
    try:
        (tmp_path / "kubeconfig").write_text(dump_kubeconfig(server.url))
        shown = subprocess.run(
            ["kubectl", "--kubeconfig", str(tmp_path / "kubeconfig"), "get",
             "pytorchjobs,pods,events,nodes", "-o", "name"],
            capture_output=True, text=True, timeout=30)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.split() == [
            "pytorchjob.kubeflow.org/run", "pytorchjob.kubeflow.org/wait", "pod/run-worker-0",
            "pod/run-worker-1", "node/node-a", "node/node-b"]
    finally:
        server.stop()


def test_twin_configs_write_durations_prometheus_accepts(tmp_path):
    assert [prometheus_duration(s) for s in (1.0, 30, 0.5, 0.0004)] == ["1s", "30s", "500ms",
                                                                         "1ms"]
    config = prometheus_config("127.0.0.1:9401", 0.5)
    assert config["global"]["scrape_interval"] == "500ms"
    # 5 simulated minutes at 1000x are 0.3 s, less than 4 scrapes: the window is 4 scrapes
    queries = actuator_settings(1000.0, "http://127.0.0.1:9090", 0.1)["queries"]
    assert "[400ms]" in queries["xid_errors"] and "offset 1800ms" in queries[
        "temperature_excess_delta"]
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed: the configs were not checked by Prometheus")
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    rules = [{"record": f"rlalloc:{name}", "expr": query} for name, query in queries.items()]
    rules = {"groups": [{"name": "actuator", "rules": rules}]}
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    for check in (["check", "config", "prometheus.yml"], ["check", "rules", "rules.yml"]):
        checked = subprocess.run([promtool, *check], cwd=tmp_path, capture_output=True,
                                 text=True, timeout=30)
        assert checked.returncode == 0, checked.stdout + checked.stderr


def test_twin_default_ports_leave_the_training_example_its_own():
    from rlalloc.cli.main import build_parser

    args = build_parser(["twin"]).parse_args(["twin"])
    # run side by side as documented, the twin and the example trainer must not share a port
    documented = {int(port) for path in (ROOT / "docs" / "trainer_jobs.md",
                                         ROOT / "trainer_jobs" / "manifests" /
                                         "pytorchjob-elastic.yaml")
                  for port in re.findall(r"--metrics-port[= ](\d+)", path.read_text())}
    assert documented and not documented & {args.kube_port, args.metrics_port}


@pytest.mark.parametrize("command, without_default", [
    ("twin", {"-h", "--force", "--fail-node"}),
    ("actuate", {"-h", "--once"}),
    ("bench actuator", {"-h", "--out", "--force"}),
])
def test_help_shows_every_default(monkeypatch, capsys, command, without_default):
    from rlalloc.cli.main import main

    monkeypatch.setenv("COLUMNS", "200")  # no line breaks inside a default
    with pytest.raises(SystemExit) as exited:
        main([*command.split(), "--help"])
    assert exited.value.code == 0
    options = capsys.readouterr().out.split("options:")[1].split("\n\n")[0]
    for block in re.split(r"\n(?=  -)", options.strip("\n")):
        flag = block.split()[0].rstrip(",")
        assert flag in without_default or "(default: " in block, block


def _bound_nodes(api: TwinKubeAPI, job_name: str) -> list[str]:
    """Nodes the API shows `job_name`'s worker pods bound to (sorted; Pending ones left out)."""
    return sorted(p["spec"]["nodeName"] for p in api.list(PODS)
                  if p["metadata"]["name"].startswith(f"{job_name}-worker-")
                  and p["spec"].get("nodeName"))


def test_twin_shows_a_job_the_simulator_failed_as_pending_in_the_same_tick(caplog):
    # "a" runs on node-0000 and node-0001; the simulator fails node-0001 on its own (as its
    # random failures do) and requeues "a". The API must show a's workers Pending at once (not
    # still bound, holding GPUs the simulator freed), and the twin must not hand the simulator
    # the old placement again: it refused that as "not enough free GPUs on node-0001". The
    # scheduler then binds them anew, within the affinity, on the node that is still up.
    from rlalloc.actuator.twin.runtime import Twin

    from actuator_fixtures import job, quiet_params, scenario

    sim = scenario([job("a", 0, 2, 2, 2)], nodes=2, gpus=4).simulator(quiet_params(60.0, 0.2))
    api = TwinKubeAPI()
    twin = Twin(sim, api, speed=60.0)
    twin.tick(0.2)
    name = twin.job_name("a")
    obj = api.get(PYTORCHJOBS, "default", name)
    api.patch(PYTORCHJOBS, "default", name, placement_patch(
        JobRef("default", name, "", obj, ()), scale("a", "node-0000", "node-0001"), 2))
    twin.tick(0.2)
    assert _bound_nodes(api, name) == ["node-0000", "node-0001"] == [
        sim.node_names[i] for i in sim.state().jobs.placement[0]]
    sim.schedule_failure("node-0001", sim.time_s + 1.0)
    with caplog.at_level("WARNING", logger="rlalloc.actuator.twin.runtime"):
        twin.tick(0.2)  # the failure: the simulator releases a's GPUs on both nodes
        assert sim.state().jobs.placement[0] == ()
        assert _bound_nodes(api, name) == []
        twin.tick(0.2)  # the scheduler binds them again where the affinity allows
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    assert _bound_nodes(api, name) == ["node-0000", "node-0000"] == [
        sim.node_names[i] for i in sim.state().jobs.placement[0]]


def test_a_stopped_twin_closes_both_its_ports():
    import socket

    from rlalloc.actuator.twin.harness import start_twin

    from actuator_fixtures import job, quiet_params, scenario

    running = start_twin(scenario([job("a", 0, 1, 1, 1)], nodes=1, gpus=1),
                         params=quiet_params(60.0, 0.2))
    ports = [running.metrics_port, int(running.kube_url.rsplit(":", 1)[1])]
    with urllib.request.urlopen(f"http://127.0.0.1:{ports[0]}/metrics", timeout=5) as response:
        assert b"rlalloc_twin_clock_seconds" in response.read()
    running.stop()
    for port in ports:  # a test run starts dozens of twins: none may keep listening
        with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
            probe.connect(("127.0.0.1", port))


# ------------------------------------------------------------------------------ benchmark
def test_bench_measures_a_cycle():
    from rlalloc.cli.bench_actuator import measure, synthetic_state

    from actuator_fixtures import TinyElastic

    result = measure(TinyElastic(), n_nodes=50, n_jobs=100, repeats=1)
    assert result["cycle_s"] > 0 and result["nodes"] == 50 and result["jobs"] == 100
    assert result["cycle_s"] == pytest.approx(result["build_state_s"]
                                              + result["policy_and_guardrails_s"])
    # the timed state holds one pod per placed worker, and the cycle is a full one: with queued
    # jobs and free GPUs the policy always has a next proposal, up to the per-cycle cap
    assert result["pods"] == int(synthetic_state(50, 100, 0).jobs.workers.sum())
    assert result["decisions_per_cycle"] == ActuatorConfig().max_actions_per_cycle


def test_bench_cli_writes_cycle_s(tmp_path, capsys):
    pytest.importorskip("rlalloc.agent.registry")
    from rlalloc.cli.bench_actuator import synthetic_state
    from rlalloc.cli.main import main

    out = tmp_path / "bench.json"
    assert main(["bench", "actuator", "--nodes", "20", "--jobs", "40", "--repeats", "1",
                 "--policy", "static", "--out", str(out)]) == 0
    assert capsys.readouterr().out.rstrip().endswith(f"wrote {out}")  # as every bench says
    result = yaml.safe_load(out.read_text())
    assert (result["nodes"], result["jobs"], result["policy"]) == (20, 40, "static")
    assert result["cycle_s"] > 0  # really timed
    # the busy cluster of those sizes, rendered: one pod per placed worker
    assert result["pods"] == int(synthetic_state(20, 40, 0).jobs.workers.sum())


def test_actuator_needs_neither_the_simulator_nor_the_training_stack():
    import subprocess
    import sys

    code = ("import sys, rlalloc.cli.actuate, actuator.loop, rlalloc.cli.bench_actuator; "
            "print(' '.join(sorted(sys.modules)))")
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True).stdout.split())
    forbidden = {"rlalloc.env.simulator", "rlalloc.env.scenario", "rlalloc.env.gym_env", "torch",
                 "stable_baselines3", "sb3_contrib", "rlalloc.trainer_jobs.train",
                 "rlalloc.actuator.twin.runtime"}
    assert not loaded & forbidden, loaded & forbidden


def test_the_twins_api_keeps_only_its_latest_requests():
    # kmock logs every request in its root and in the reaction that served it, for good: a
    # twin demo serving for hours grew ~7 KB a request (measured with tracemalloc)
    api = TwinKubeAPI(requests_kept=5)
    server = ApiServerThread(api).start()
    try:
        for path in ["/api/v1/pods", "/api/v1/nodes", "/api"] * 7:
            with urllib.request.urlopen(server.url + path, timeout=10) as response:
                response.read()
        logged = server.call(lambda: [r.url.path for r in api])
        longest = server.call(lambda: max(len(list(reaction)) for reaction in api._payloads))
    finally:
        server.stop()
    assert logged == ["/api/v1/nodes", "/api", "/api/v1/pods", "/api/v1/nodes", "/api"]
    assert longest <= 5 + 1  # a reaction logs the request under way after the cut


def test_the_ray_cluster_runs_the_ray_of_its_image_and_shares_one_volume():
    root = Path(__file__).resolve().parents[1] / "actuator" / "raycluster"
    claim, cluster = yaml.safe_load_all((root / "raycluster.yaml").read_text())
    pinned = re.search(r"ARG RAY_VERSION=(\S+)", (root.parents[1] / "Dockerfile").read_text())[1]
    assert cluster["kind"] == "RayCluster" and cluster["spec"]["rayVersion"] == pinned
    # a driver installed with the [ray] extra can match it (`ray.init` refuses another Ray)
    extra = tomllib.loads((root.parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["ray"]
    assert [Requirement(r).specifier.contains(pinned) for r in extra] == [True]
    groups = [cluster["spec"]["headGroupSpec"], *cluster["spec"]["workerGroupSpecs"]]
    for group in groups:
        pod = group["template"]["spec"]
        [container] = pod["containers"]
        assert container["volumeMounts"] == [{"name": "work", "mountPath": "/work"}]
        assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == \
            claim["metadata"]["name"]
        assert {"name": "OMP_NUM_THREADS", "value": "1"} in container["env"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
