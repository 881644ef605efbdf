"""The same policy makes the same decisions through the actuator as inside the simulator.

A simulator episode (with stress-level failures, so warnings and moves happen) is recorded:
every state a policy was shown and the action it answered. Each recorded state is then turned
into what a cluster in that state shows — Nodes, Pods and PyTorchJobs served over real HTTP by
the twin's API, and the answers Prometheus gives to the default queries — and the actuator's
observe path (list calls, query results, state builder with its ledger) rebuilds the state.
The policy, asked by the actuator's decide step, must answer the very same action.

The look-ahead signals are on in both worlds (the commands' default, "standin", and the
actuator's): Prometheus' answers carry the node telemetry the simulator's risk model saw, now
and `risk_lag_s` earlier, and the per-minute demand history its forecast read, so the rebuilt
state's failure risk and demand forecast must be the simulator's too.

This needs the cluster to be observed at every decision point, as the actuator's ledger
integrates GPU-seconds between observations the way the simulator does between its events.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import replace
from typing import NamedTuple

import numpy as np
import pytest

from rlalloc.actuator.config import ActuatorConfig
from rlalloc.actuator.loop import Controller
from rlalloc.actuator.observe import MetricsSnapshot
from rlalloc.actuator.twin.kube_api import NODES, PODS, PYTORCHJOBS, ApiServerThread, TwinKubeAPI
from rlalloc.actuator.twin.render import cluster_objects, k8s_name, query_results, telemetry_results
from rlalloc.env.failures import FailureParams
from rlalloc.env.params import SimParams
from rlalloc.env.scenario import Scenario, build_scenario
from rlalloc.env.simulator import Simulator
from rlalloc.env.state import NOOP, Action, ActionKind, ClusterState
from rlalloc.env.workload.spec import JobSpec
from rlalloc.forecaster.signals import default_signals

from actuator_fixtures import TinyElastic, kube_client, twin_crd_validator

NAMESPACE = "default"
MAX_DECISIONS = 100
SEED = 2
"""With this seed the episode has warned nodes, failures and (for tiny-elastic) moves."""


def _policies() -> list:
    """TinyElastic, plus the project's heuristics when the agent package provides them."""
    policies = [pytest.param(TinyElastic, id="tiny-elastic")]
    try:
        registry = importlib.import_module("rlalloc.agent.registry")
        make = {name: (lambda n=name: registry.load_policy(n))
                for name in ("static", "tiresias", "elastic", "proactive", "elastic-srpt-0.25",
                             "gavel", "sia")}
    except ImportError:
        try:
            heuristics = importlib.import_module("rlalloc.agent.heuristics")
            make = {"static": heuristics.StaticPolicy, "tiresias": heuristics.TiresiasPolicy,
                    "proactive": lambda: heuristics.ElasticPolicy(
                        heuristics.ElasticConfig(proactive=True), "proactive")}
        except (ImportError, AttributeError):
            make = {}
    policies += [pytest.param(factory, id=name) for name, factory in make.items()]
    if make and importlib.util.find_spec("rlalloc.agent.planner"):
        policies.append(pytest.param(_planner, id="planner"))
    return policies


def _planner() -> object:
    """The planning policy over the elastic heuristics (sizes estimated from progress), its
    futures drawn from two other synthetic workloads: it forks a simulator rebuilt from the
    state it is shown, so the actuator's state must rebuild into the same copy."""
    from rlalloc.agent.catalogue import HEURISTICS
    from rlalloc.agent.heuristics import ElasticPolicy
    from rlalloc.agent.lookahead import HistoryArrivals
    from rlalloc.agent.planner import planning_policy

    base, *alternatives = [HEURISTICS[name]() for name in
                           ("elastic-srpt-0.25", "elastic-srpt", "elastic")]
    assert all(isinstance(policy, ElasticPolicy) for policy in (base, *alternatives))
    history = HistoryArrivals.of_scenarios(
        [build_scenario("synthetic:30:1.2", "8x4", seed=seed, signals=default_signals())
         for seed in (5, 6)], 3600.0,
        samples=2, seed=0)
    return planning_policy(base, alternatives, history, "planner")


WORKLOADS = ("one-gpu-workers", "multi-gpu-workers", "mixed-gpu-types")
"""The synthetic workload as generated, with two jobs in three made of multi-GPU workers, and
as generated on a cluster of T4 and A100 nodes (each job's curve per type in the state)."""
_CLUSTERS = {"mixed-gpu-types": "4x4:T4+2x8:A100"}
"""The cluster of a workload where it is not 8x4 (the same 32 GPUs)."""
_GPUS_PER_WORKER = (1, 2, 4)
"""GPUs per worker of the multi-GPU workload's jobs, in turn (4: a whole node of 8x4)."""


def _scenario(workload: str = WORKLOADS[0]) -> Scenario:
    """30 synthetic jobs on 8x4 GPUs, submitted at distinct whole seconds (the API's
    timestamps have second precision); for "multi-gpu-workers", the second and third of every
    three jobs have workers of 2 and 4 GPUs (`_whole_workers`)."""
    base = build_scenario("synthetic:30:1.2", _CLUSTERS.get(workload, "8x4"), seed=SEED,
                          signals=default_signals())
    jobs, last = [], -1.0
    for i, spec in enumerate(base.workload.jobs):
        submit = max(float(round(spec.submit_s)), last + 1.0)
        spec = replace(spec, submit_s=submit)
        if workload == "multi-gpu-workers":
            spec = _whole_workers(spec, _GPUS_PER_WORKER[i % 3], base.cluster.total_gpus)
        jobs.append(spec)
        last = submit
    return replace(base, workload=replace(base.workload, jobs=tuple(jobs)))


def _whole_workers(spec: JobSpec, gpus_per_worker: int, cluster_gpus: int) -> JobSpec:
    """`spec` (a job of one-GPU workers) as a job of `gpus_per_worker`-GPU workers asking for
    about as many GPUs: its request rounded up to whole workers, its range to those that fit
    the cluster."""
    k = gpus_per_worker
    most = cluster_gpus // k
    workers = min(max(-(-spec.requested_gpus // k), 1), most)
    low = min(max(spec.min_workers // k, 1), workers)
    high = max(min(spec.max_workers // k, most), workers)
    return replace(spec, requested_gpus=workers * k, min_workers=low, max_workers=high,
                   gpus_per_worker=k)


class _Seen(NamedTuple):
    """One decision point of the simulator: what it showed the policy and what it read."""

    state: ClusterState
    action: Action
    telemetry: np.ndarray
    """(nodes, F) telemetry features its risk model saw now ..."""
    telemetry_earlier: np.ndarray
    """... and `risk_lag_s` earlier."""
    demand_history: np.ndarray
    """The per-minute demand its forecast read."""


def _sim_telemetry(sim: Simulator, lag_s: float) -> tuple[np.ndarray, np.ndarray]:
    """The features behind the simulator's failure risk now and `lag_s` earlier."""
    return sim.node_telemetry(sim.time_s), sim.node_telemetry(sim.time_s - lag_s)


def _record(policy: object, workload: str) -> list[_Seen]:
    """Every decision point of a simulator run of `workload`, up to MAX_DECISIONS policy
    calls."""
    params = SimParams(failures=FailureParams(failures_per_gpu_day=3.0))
    scenario = _scenario(workload)
    signals = scenario.signals
    assert signals.node_risk is not None and signals.demand_forecast is not None
    sim = scenario.simulator(params, seed=SEED)
    recorded: list[_Seen] = []

    def recording(state: ClusterState) -> Action:
        action = policy.act(state)
        now, earlier = _sim_telemetry(sim, signals.risk_lag_s)
        recorded.append(_Seen(state, action, now, earlier,
                              sim.accounting.demand_history(signals.history_min)))
        if len(recorded) >= MAX_DECISIONS:
            raise StopIteration
        return action

    try:
        sim.run(recording)
    except StopIteration:
        pass
    return recorded


class _Replay:
    """MetricsSource answering, for the current recorded state, what Prometheus would."""

    snapshot: MetricsSnapshot

    def fetch(self, risk_lag_s: float | None, demand_minutes: int) -> MetricsSnapshot:
        return self.snapshot


def _show(api: TwinKubeAPI, state: ClusterState, names: dict[str, str],
          finished: set[str]) -> None:
    """Make the API hold exactly the objects of a cluster in `state` (+ finished jobs)."""
    nodes, pods, jobs = cluster_objects(state, NAMESPACE, names)
    for resource, namespace in ((PODS, NAMESPACE), (PYTORCHJOBS, NAMESPACE), (NODES, None)):
        for obj in api.list(resource):
            api.remove(resource, namespace, obj["metadata"]["name"])
    for obj in nodes:
        api.put(NODES, None, obj["metadata"]["name"], obj)
    for obj in pods:
        api.put(PODS, NAMESPACE, obj["metadata"]["name"], obj)
    for obj in jobs:
        api.put(PYTORCHJOBS, NAMESPACE, obj["metadata"]["name"], obj)
    for job_id in finished:
        # a finished job still counts as an arrival of the last hour
        done = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                "metadata": {"name": names[job_id], "namespace": NAMESPACE,
                             "labels": {"rlalloc.io/managed": "true"},
                             "creationTimestamp": _submit_stamp[job_id]},
                "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 0, "template": {}}}},
                "status": {"conditions": [{"type": "Succeeded", "status": "True"}]}}
        api.put(PYTORCHJOBS, NAMESPACE, names[job_id], done)


_submit_stamp: dict[str, str] = {}


@pytest.mark.expensive
@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("make_policy", _policies())
def test_actuator_decides_like_the_simulator(tmp_path, make_policy, workload):
    recorded = _record(make_policy(), workload)
    assert len(recorded) == MAX_DECISIONS
    if workload == "multi-gpu-workers":  # multi-GPU workers ran, and were placed whole
        assert any(point.state.jobs.workers[point.state.jobs.gpus_per_worker > 1].any()
                   for point in recorded)
    if workload == "mixed-gpu-types":  # jobs ran on both types, each on one
        types = {point.state.nodes.gpu_type[n] for point in recorded
                 for placement in point.state.jobs.placement for n in placement}
        assert types == {"T4", "A100"}
    kinds = {point.action.kind for point in recorded}
    # the signals were there to reproduce: nodes with telemetry and a demand forecast
    assert any(point.telemetry.any() for point in recorded)
    assert any(any(point.state.demand.forecast_gpus) for point in recorded)
    assert ActionKind.SCALE in kinds
    if make_policy is TinyElastic:
        assert ActionKind.MIGRATE in kinds
    names = {j.job_id: k8s_name(j.job_id) for j in _scenario(workload).workload.jobs}
    server = ApiServerThread(TwinKubeAPI()).start()
    config = ActuatorConfig(dry_run=True, max_actions_per_cycle=1, leader_election=False,
                            max_metric_age_s=60.0, signals="standin")

    class Twinish:
        kube_url = server.url

    replay = _Replay()
    actuator = Controller(config, kube_client(tmp_path, Twinish, config), replay,
                          make_policy(), "parity",
                          twin_crd_validator())  # signals loaded from the config
    lag_s = _scenario(workload).signals.risk_lag_s
    seen: set[str] = set()
    mismatches = []
    unseen = 0
    try:
        for step, point in enumerate(recorded):
            state, expected = point.state, point.action
            current = set(state.jobs.job_id)
            for row, job_id in enumerate(state.jobs.job_id):
                _submit_stamp[job_id] = cluster_objects(state, NAMESPACE, names)[2][row][
                    "metadata"]["creationTimestamp"]
            finished = seen - current
            seen |= current
            server.call(_show, server.api, state, names, finished)
            evaluated_at = time.time()
            replay.snapshot = MetricsSnapshot(
                query_results(state, NAMESPACE, names, evaluated_at, features=point.telemetry),
                state.time_s, demand_history=point.demand_history,
                earlier=telemetry_results(state.nodes.name, point.telemetry_earlier,
                                          evaluated_at - lag_s))
            report = actuator.run_cycle()
            assert report.observed, report.error
            rebuilt = report.built.state
            _assert_same_state(state, rebuilt, names)
            got = report.outcomes[0][0].action if report.outcomes else NOOP
            if make_policy is _planner and not np.allclose(rebuilt.jobs.progress,
                                                           state.jobs.progress, atol=1e-6):
                unseen += 1  # a stopped job's rollback (see _assert_same_state)
                continue
            if _translate(expected, names) != got:
                mismatches.append((step, expected.describe(), got.describe()))
    finally:
        server.stop()
    assert mismatches == [], f"{len(mismatches)} of {len(recorded)} decisions differ: " \
                             f"{mismatches[:5]}"
    # The planner rebuilds its copy from every job's progress, a stopped job's included, and
    # its forks turn a small difference there into another choice; where the actuator's state
    # is the simulator's it must decide alike, and that is nearly everywhere. The heuristics
    # are compared at every point.
    assert unseen <= len(recorded) // 10


def _translate(action: Action, names: dict[str, str]) -> Action:
    if action.kind == ActionKind.NOOP:
        return action
    return replace(action, job_id=f"{NAMESPACE}/{names[action.job_id]}")


def _assert_same_state(sim: ClusterState, rebuilt: ClusterState, names: dict[str, str]) -> None:
    """The rebuilt state carries the simulator's values (floats to float32 precision)."""
    assert rebuilt.jobs.job_id == tuple(f"{NAMESPACE}/{names[j]}" for j in sim.jobs.job_id)
    assert rebuilt.nodes.name == sim.nodes.name
    assert rebuilt.nodes.gpu_type == sim.nodes.gpu_type
    assert (rebuilt.type_speeds is None) == (sim.type_speeds is None)
    if sim.type_speeds is not None:
        assert rebuilt.type_speeds.gpu_types == sim.type_speeds.gpu_types
        for column in ("speed_1gpu", "scaling_alpha", "scaling_beta"):
            np.testing.assert_allclose(getattr(rebuilt.type_speeds, column),
                                       getattr(sim.type_speeds, column), rtol=1e-6,
                                       err_msg=column)
    for column in ("gpus_total", "gpus_free", "rack", "ready", "cordoned", "xid_errors_5m",
                   "ecc_errors_30m", "ready_flaps_60m"):
        np.testing.assert_array_equal(getattr(rebuilt.nodes, column),
                                      getattr(sim.nodes, column), err_msg=column)
    for column in ("temperature_c", "temperature_delta_30m_c", "gpu_util", "failure_risk"):
        np.testing.assert_allclose(getattr(rebuilt.nodes, column), getattr(sim.nodes, column),
                                   rtol=1e-6, atol=1e-6, err_msg=column)
    for column in ("status", "requested_gpus", "min_workers", "max_workers", "workers",
                   "restarts", "gpus_per_worker"):
        np.testing.assert_array_equal(getattr(rebuilt.jobs, column), getattr(sim.jobs, column),
                                      err_msg=column)
    assert rebuilt.jobs.placement == sim.jobs.placement
    for column in ("submit_s", "speed_1gpu", "scaling_alpha", "scaling_beta", "throughput",
                   "attained_gpu_s", "run_s", "since_checkpoint_s", "restore_s"):
        np.testing.assert_allclose(getattr(rebuilt.jobs, column), getattr(sim.jobs, column),
                                   rtol=1e-5, atol=1e-3, err_msg=column)
    # progress is exported by running trainers only; a stopped job keeps its last reading
    # (after a failure the simulator rolls back to the checkpoint; these rendered results
    # carry no checkpoint step, without which the actuator cannot, and with one it rolls back
    # to the last cycle's reading only: test_actuator_units covers the rollback)
    allocated = sim.jobs.workers > 0
    np.testing.assert_allclose(rebuilt.jobs.progress[allocated], sim.jobs.progress[allocated],
                               rtol=1e-5, atol=1e-6, err_msg="progress")
    assert rebuilt.demand.pending_gpus == sim.demand.pending_gpus
    assert rebuilt.demand.arrivals_1h == sim.demand.arrivals_1h
    np.testing.assert_allclose(rebuilt.demand.forecast_gpus, sim.demand.forecast_gpus,
                               rtol=1e-9, atol=1e-12, err_msg="forecast_gpus")
    assert rebuilt.time_of_day_s == pytest.approx(sim.time_of_day_s)


def test_a_scripted_failure_is_the_simulators_own(tmp_path):
    # The twin's --fail-node failure must be the simulator's failure, as `--failures` ones are:
    # the node is down in the simulator too (its GPUs are not offered), the job on it loses the
    # work since its checkpoint and is requeued, and the node is repaired after `repair_s`.
    # The twin used to fake it on its side only: the simulator kept the node up, the job kept
    # its progress (it was merely re-scaled) and the node stayed down for ever.
    from rlalloc.actuator.apply import placement_patch
    from rlalloc.actuator.state_builder import JobRef
    from rlalloc.actuator.twin.runtime import ScriptedFailure, Twin

    from actuator_fixtures import job, quiet_params, scenario

    params = quiet_params(60.0, 1.0)
    sim = scenario([job("a", 0, 2, 2, 2, work=1e5)], nodes=2, gpus=2).simulator(params)
    api = TwinKubeAPI()
    twin = Twin(sim, api, speed=60.0)
    twin.tick(1.0)
    name = twin.job_name("a")
    obj = api.get(PYTORCHJOBS, NAMESPACE, name)
    api.patch(PYTORCHJOBS, NAMESPACE, name, placement_patch(
        JobRef(NAMESPACE, name, "", obj, ()),
        Action(ActionKind.SCALE, "a", 2, ("node-0000", "node-0000")), 2))
    fail_at = sim.time_s + params.checkpoint_interval_s + 600.0  # 10 minutes past a checkpoint
    failure = ScriptedFailure("node-0000", fail_at - 300.0, fail_at)
    twin.script_failure(failure)
    while sim.time_s < fail_at - 60.0:
        twin.tick(1.0)
    assert sim.state().jobs.placement[0] == (0, 0)
    checkpointed = float(sim.checkpointed_progress()[0])
    assert float(sim.state().jobs.progress[0]) > checkpointed + 1e-3
    assert sim.state().nodes.xid_errors_5m[0] > 0  # the warning is the simulator's too
    while sim.time_s < fail_at:
        twin.tick(1.0)
    state = sim.state()
    assert not state.nodes.ready[0], "the simulator does not know node-0000 failed"
    assert float(state.jobs.progress[0]) == pytest.approx(checkpointed), "no work was lost"
    assert twin.failure_hits == {failure: (name,)}
    node = api.get(NODES, None, "node-0000")
    assert node["status"]["conditions"][0]["status"] != "True"
    while sim.time_s < fail_at + params.failures.repair_s + 60.0:
        twin.tick(10.0)
    node = api.get(NODES, None, "node-0000")
    assert node["status"]["conditions"][0]["status"] == "True", "never repaired"
    assert sim.state().nodes.ready[0]
