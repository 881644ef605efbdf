"""Observation (Kubernetes objects + Prometheus query results) -> `ClusterState`: pure, no I/O.

The actuator's half of the state contract: the simulator builds a `ClusterState` from its own
arrays, this module builds the same object from what a live cluster shows, so a policy cannot
tell the two apart. Current facts (which pods run where, what is cordoned, what is Ready) come
from the API objects, which are fresher than kube-state-metrics; telemetry and history (XID/ECC
counts, temperatures, flaps, trainer throughput and checkpoints) come from Prometheus.

The look-ahead signals are computed as the simulator computes them, by the same functions
(`rlalloc.forecaster.signals`): each node's failure risk from its telemetry features
(`NODE_FEATURE_NAMES`) now and `risk_lag_s` earlier, and the demand forecast from the
per-minute demand history.

What neither source keeps — GPU-seconds a job has received, time it has been allocated, how
often it restarted — is integrated here across cycles in a `Ledger` (workers x GPUs per worker x
elapsed time), the same way the simulator accumulates it; it restarts from zero when the actuator
restarts.

A job's GPUs per worker (`Jobs.gpus_per_worker`) are what its worker pod template requests
(`worker_gpus`); its requested GPUs are its requested workers times that.

Stale or absent samples are *missing*: a node without fresh DCGM samples gets no telemetry (and
`nodes_without_telemetry` names it so the guardrails keep new workers off it); a job without
fresh trainer samples has no throughput and is not counted as running; its progress is the last
one read (a suspended job exports nothing, and does not progress), unless a node it ran on became
unreachable or vanished: then it is the progress in its latest checkpoint read, which it resumes
from, as the simulator rolls a job hit by a node failure back to its checkpoint. A node without
fresh telemetry gets the failure risk of a healthy node (no signal is not evidence); readings
from `risk_lag_s` ago that were stale then count as zeros.

A node's GPU type is its product label (`ActuatorConfig.gpu_type_label`, GPU Feature Discovery's
``nvidia.com/gpu.product``) mapped by the config's product table (`gpu_products`); a node
without the label is of `default_gpu_type`. A node whose label no row matches is *untyped*:
`untyped_nodes` names it (the loop warns once per node) and the guardrails keep new workers off
it, as they do a node without telemetry. It stays in the state, typed `default_gpu_type` so that
every node names a type the simulator knows: left out, its managed jobs' pods would vanish from
their placements (read as a lost node, their progress rolled back to a checkpoint, their GPUs
placed twice), and cordoned in the state, it would read as cordoned in the cluster, which the
apply step relies on (a failover off it would leave the failing node uncordoned).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
from kubernetes.utils.quantity import parse_quantity

from rlalloc.actuator.config import ActuatorConfig
from rlalloc.actuator.gpu_products import gpu_type_of
from rlalloc.actuator.job_curves import (
    TYPE_SPEEDS_ANNOTATION,
    parse_type_speeds,
    type_speeds_table,
)
from rlalloc.actuator.k8s_names import (
    ALPHA_ANNOTATION,
    BETA_ANNOTATION,
    JOB_NAME_LABEL,
    REPLICA_INDEX_LABEL,
    REPLICA_TYPE_LABEL,
    REQUESTED_WORKERS_ANNOTATION,
    RESTORE_ANNOTATION,
    SPEED_ANNOTATION,
)
from rlalloc.env.failures import NODE_FEATURE_NAMES
from rlalloc.env.signals import NO_SIGNALS, Signals
from rlalloc.env.state import ClusterState, Demand, JobInfo, Jobs, JobStatus, NodeInfo, Nodes

MetricResults = dict[str, list[dict]]
"""Query name (a `Queries` field) -> Prometheus instant-vector result (`data.result`)."""

_JOB_DEFAULTS = JobInfo("", JobStatus.QUEUED, 0.0, 1, 1, 1)
_NODE_DEFAULTS = NodeInfo("", 0, 0)
_TERMINAL_PHASES = ("Succeeded", "Failed")
_COUNT_FEATURES = {"xid_5m": ("xid_errors",), "xid_30m": ("xid_errors_30m",),
                   "ecc_30m": ("ecc_errors", "row_remap_failures")}
"""DCGM count features: the sum of these queries per node, rounded (the simulator counts)."""
_TEMPERATURE_FEATURES = {"temp_excess_c": "temperature_excess",
                         "temp_excess_delta_30m": "temperature_excess_delta"}
assert set(NODE_FEATURE_NAMES) == {*_COUNT_FEATURES, *_TEMPERATURE_FEATURES, "flaps_60m"}, \
    NODE_FEATURE_NAMES


@dataclass(frozen=True)
class Observation:
    """Everything one cycle read, as plain JSON-like data (what the APIs returned)."""

    time_s: float
    """The cluster's clock when the observation was taken (Unix seconds)."""
    nodes: list[dict]
    pods: list[dict]
    """Pods of all namespaces (all of them use GPUs, managed or not)."""
    jobs: list[dict]
    """PyTorchJobs (filtered here by the opt-in label and namespaces)."""
    metrics: MetricResults
    demand_history: np.ndarray | None = None
    """Per-minute demand, oldest first, the last sample at the current minute (None when the
    signals have no demand forecast)."""
    earlier_metrics: MetricResults = field(default_factory=dict)
    """The node-telemetry queries `risk_lag_s` earlier (empty when there is no risk model)."""


@dataclass(frozen=True)
class JobRecord:
    """What the ledger remembers of one job between cycles."""

    attained_gpu_s: float = 0.0
    run_s: float = 0.0
    restarts: int = 0
    placement: tuple[str, ...] = ()
    """Node name of each worker at the last observation."""
    started: bool = False
    progress: float = 0.0
    """Last progress read from the trainer (kept while the job holds no GPUs and exports
    nothing: a suspended job does not progress)."""
    checkpointed: float | None = None
    """Progress in the job's latest checkpoint read (None: its trainer exports none)."""


@dataclass(frozen=True)
class Ledger:
    """Per-job history integrated across cycles (see module docstring)."""

    time_s: float | None = None
    jobs: dict[str, JobRecord] = field(default_factory=dict)


@dataclass(frozen=True)
class PodRef:
    """A worker pod of a managed job, as the apply step needs it."""

    namespace: str
    name: str
    node: str
    index: int
    uid: str = ""
    """The pod's uid: a delete names it, so that a retried one cannot hit the replacement."""


@dataclass(frozen=True)
class JobRef:
    """A managed PyTorchJob as the apply step needs it: its address, object and pods."""

    namespace: str
    name: str
    uid: str
    obj: dict
    """The PyTorchJob as read (to validate patched versions against the CRD)."""
    pods: tuple[PodRef, ...]
    """Its live worker pods bound to a node."""


@dataclass(frozen=True)
class BuiltState:
    """The state a policy sees, plus what the guardrails and the apply step need beside it."""

    state: ClusterState
    ledger: Ledger
    jobs: dict[str, JobRef]
    """job_id -> the job's objects."""
    nodes_without_telemetry: frozenset[str]
    unreachable_nodes: frozenset[str]
    """Nodes whose Ready condition is Unknown or False (pods there are deleted with grace 0)."""
    unmanageable: dict[str, str] = field(default_factory=dict)
    """Opted-in jobs left alone, job_id -> why (`worker_gpus`: their workers' GPU request is
    invalid, or larger than any node): their GPUs count as another tenant's."""
    untyped_nodes: dict[str, str] = field(default_factory=dict)
    """Nodes whose product label no row of `gpu_products` matches, node -> the label's value
    (see the module docstring): no new workers go there."""


def job_id_of(namespace: str, name: str) -> str:
    """The `ClusterState` job id of a PyTorchJob."""
    return f"{namespace}/{name}"


def parse_time(text: str) -> float:
    """Unix seconds of a Kubernetes timestamp (RFC 3339, e.g. ``2024-05-01T12:00:00Z``)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def build_state(obs: Observation, config: ActuatorConfig, ledger: Ledger,
                signals: Signals = NO_SIGNALS) -> BuiltState:
    """The `ClusterState` for `obs` with the look-ahead `signals`, and the ledger updated to
    `obs.time_s`."""
    now = obs.time_s
    fresh_nodes = _fresh(obs.metrics.get("dcgm_last_sample", []), (config.node_label,),
                         config.max_metric_age_s)
    node_names, node_records, unreachable, untyped = _nodes(obs, config, fresh_nodes, signals)
    node_index = {name: i for i, name in enumerate(node_names)}
    workers_by_job = _worker_pods(obs.pods, node_index)
    fresh_jobs = _fresh(obs.metrics.get("trainer_last_sample", []),
                        ("namespace", config.trainer_job_label), config.max_metric_age_s)
    trainer = {name: _values(obs.metrics.get(name, []), ("namespace", config.trainer_job_label))
               for name in ("trainer_throughput", "trainer_step", "trainer_total_steps",
                            "trainer_last_checkpoint", "trainer_checkpoint_step")}
    gone = set(unreachable)

    managed, arrivals_1h = [], 0
    unmanageable: dict[str, str] = {}
    namespaces = set(config.namespaces)
    for obj in obs.jobs:
        meta = obj.get("metadata", {})
        if (meta.get("labels") or {}).get(config.managed_label) != "true":
            continue
        if namespaces and meta.get("namespace") not in namespaces:
            continue
        created = parse_time(meta["creationTimestamp"]) if meta.get("creationTimestamp") else now
        if now - 3600.0 < created <= now:
            arrivals_1h += 1
        if _finished(obj):
            continue
        per_worker, problem = worker_gpus(obj, config.gpu_resource)
        problem = problem or _too_big_problem(per_worker, node_records, config.gpu_resource)
        curves, curve_problem = parse_type_speeds(
            (meta.get("annotations") or {}).get(TYPE_SPEEDS_ANNOTATION))
        problem = problem or curve_problem
        if problem:
            unmanageable[job_id_of(meta.get("namespace", "default"), meta.get("name", ""))] = (
                problem)
        else:
            managed.append((created, meta.get("name", ""), obj, per_worker, curves))
    managed.sort(key=lambda item: (item[0], item[1]))

    job_records: list[JobInfo] = []
    refs: dict[str, JobRef] = {}
    records: dict[str, JobRecord] = {}
    dt = max(now - ledger.time_s, 0.0) if ledger.time_s is not None else 0.0
    for created, name, obj, per_worker, _ in managed:
        namespace = obj["metadata"].get("namespace", "default")
        job_id = job_id_of(namespace, name)
        pods = workers_by_job.get((namespace, name), [])
        placement = tuple(sorted(node_index[p.node] for p in pods))
        names = tuple(sorted(p.node for p in pods))
        key = (namespace, name)
        fresh = key in fresh_jobs
        throughput = trainer["trainer_throughput"].get(key, 0.0) if fresh else 0.0
        step = trainer["trainer_step"].get(key, 0.0) if fresh else 0.0
        total = trainer["trainer_total_steps"].get(key, 0.0) if fresh else 0.0
        checkpoint = trainer["trainer_last_checkpoint"].get(key) if fresh else None
        replicas = _worker_replicas(obj)
        all_running = all(p.running for p in pods)
        if not pods:
            status = JobStatus.QUEUED
        elif throughput > 0 and all_running and len(pods) == replicas:
            status = JobStatus.RUNNING
        else:
            status = JobStatus.RESTARTING
        previous = ledger.jobs.get(job_id, JobRecord())
        held = len(previous.placement)
        lost_node = any(node in gone or node not in node_index for node in previous.placement)
        progress, checkpointed = _progress(
            previous, step, total,
            trainer["trainer_checkpoint_step"].get(key) if fresh else None, lost_node)
        record = JobRecord(
            attained_gpu_s=previous.attained_gpu_s + held * per_worker * dt,
            run_s=previous.run_s + (dt if held else 0.0),
            restarts=previous.restarts + int(bool(names) and names != previous.placement
                                              and previous.started),
            placement=names, started=previous.started or bool(names), progress=progress,
            checkpointed=checkpointed)
        records[job_id] = record
        annotations = obj["metadata"].get("annotations") or {}
        annotated = _annotated_request(annotations)
        min_w, max_w = _elastic_range(obj, replicas, annotated)
        job_records.append(JobInfo(
            job_id=job_id, status=status, submit_s=created,
            requested_gpus=_requested(annotated, replicas, min_w, max_w) * per_worker,
            min_workers=min_w, max_workers=max_w, workers=len(pods), placement=placement,
            speed_1gpu=_float(annotations, SPEED_ANNOTATION, _JOB_DEFAULTS.speed_1gpu),
            scaling_alpha=_float(annotations, ALPHA_ANNOTATION, _JOB_DEFAULTS.scaling_alpha),
            scaling_beta=_float(annotations, BETA_ANNOTATION, _JOB_DEFAULTS.scaling_beta),
            throughput=throughput if status == JobStatus.RUNNING else 0.0,
            progress=progress,
            attained_gpu_s=record.attained_gpu_s, run_s=record.run_s,
            # training seconds at risk, as the simulator counts them: none unless training
            since_checkpoint_s=(max(now - checkpoint, 0.0) if checkpoint is not None
                                and status == JobStatus.RUNNING else 0.0),
            restore_s=_float(annotations, RESTORE_ANNOTATION, _JOB_DEFAULTS.restore_s),
            restarts=record.restarts, gpus_per_worker=per_worker))
        refs[job_id] = JobRef(namespace, name, obj["metadata"].get("uid", ""), obj,
                              tuple(PodRef(p.namespace, p.name, p.node, p.index, p.uid)
                                    for p in pods))

    jobs = Jobs.from_records(job_records)
    queued = jobs.status == int(JobStatus.QUEUED)
    forecast_gpus = _forecast(obs, signals)
    demand = Demand(pending_gpus=int(jobs.requested_gpus[queued].sum()),
                    arrivals_1h=arrivals_1h, forecast_gpus=forecast_gpus)
    nodes = Nodes.from_records(node_records)
    type_speeds = (type_speeds_table(jobs, [item[4] for item in managed], nodes.type_names)
                   if len(nodes.type_names) > 1 else None)
    state = ClusterState(time_s=now, nodes=nodes, jobs=jobs, demand=demand,
                         time_of_day_s=now % 86_400.0, type_speeds=type_speeds)
    fresh_names = {key[0] for key in fresh_nodes}
    return BuiltState(state=state, ledger=Ledger(now, records), jobs=refs,
                      nodes_without_telemetry=frozenset(node_names) - fresh_names,
                      unreachable_nodes=frozenset(unreachable), unmanageable=unmanageable,
                      untyped_nodes=untyped)


def _progress(previous: JobRecord, step: float, total: float, checkpoint_step: float | None,
              lost_node: bool) -> tuple[float, float | None]:
    """(progress, checkpointed progress) of a job this cycle. A reporting trainer gives both.
    A silent one keeps the last readings: a resize, move or suspension checkpoints on SIGTERM
    and loses nothing, but a job that lost a node (`lost_node`) resumes from its latest
    checkpoint, so its progress falls back to that one, as in the simulator."""
    if total > 0:
        checkpointed = (previous.checkpointed if checkpoint_step is None
                        else min(checkpoint_step / total, 1.0))
        return min(step / total, 1.0), checkpointed
    if lost_node and previous.checkpointed is not None:
        return previous.checkpointed, previous.checkpointed
    return previous.progress, previous.checkpointed


# ------------------------------------------------------------------------------------ signals
def _forecast(obs: Observation, signals: Signals) -> tuple[float, float, float]:
    """Demand 5/15/60 minutes ahead, as the simulator asks for it: the per-minute history and
    the minute of the day of its last sample (zeros without a forecast or history)."""
    history = obs.demand_history
    if signals.demand_forecast is None or history is None or not len(history):
        return (0.0, 0.0, 0.0)
    minute_of_day = int(obs.time_s // 60.0) % 1440
    values = signals.demand_forecast(np.asarray(history, dtype=np.float64), minute_of_day)
    return (float(values[0]), float(values[1]), float(values[2]))


def node_features(metrics: MetricResults, names: tuple[str, ...], config: ActuatorConfig,
                  fresh: set) -> np.ndarray:
    """(nodes, F) telemetry features in `NODE_FEATURE_NAMES` order from one time's query
    results; a node whose DCGM samples are not `fresh` has zero DCGM features (its flaps come
    from kube-state-metrics and still count)."""
    label = config.node_label
    features = np.zeros((len(names), len(NODE_FEATURE_NAMES)), dtype=np.float32)
    values = {query: _values(metrics.get(query, []), (label,))
              for queries in _COUNT_FEATURES.values() for query in queries}
    values.update({query: _values(metrics.get(query, []), (label,))
                   for query in _TEMPERATURE_FEATURES.values()})
    flaps = _values(metrics.get("ready_flaps", []), ("node",))
    for i, name in enumerate(names):
        key = (name,)
        row = {"flaps_60m": round(flaps.get(key, 0.0))}
        if key in fresh:
            for feature, queries in _COUNT_FEATURES.items():
                row[feature] = sum(round(values[q].get(key, 0.0)) for q in queries)
            for feature, query in _TEMPERATURE_FEATURES.items():
                row[feature] = values[query].get(key, 0.0)
        features[i] = [row.get(feature, 0.0) for feature in NODE_FEATURE_NAMES]
    return features


def _failure_risk(signals: Signals, now: np.ndarray, earlier: np.ndarray,
                  has_telemetry: np.ndarray) -> np.ndarray:
    """Risk per node as the simulator computes it: the model on (now, earlier) for nodes with a
    signal, the risk of all-zero telemetry (a healthy node) for the others."""
    if signals.node_risk is None:
        return np.zeros(len(now), dtype=np.float32)
    zeros = np.zeros((1, now.shape[1]), dtype=np.float32)
    risk = np.full(len(now), float(signals.node_risk(zeros, zeros)[0]), dtype=np.float32)
    signal = has_telemetry & ((now != 0).any(axis=1) | (earlier != 0).any(axis=1))
    if signal.any():
        risk[signal] = signals.node_risk(now[signal], earlier[signal])
    return risk


# ---------------------------------------------------------------------------------------- nodes
def _nodes(obs: Observation, config: ActuatorConfig, fresh: set, signals: Signals
           ) -> tuple[tuple[str, ...], list[NodeInfo], list[str], dict[str, str]]:
    """(names, records, unreachable nodes, untyped nodes -> their product label) of the
    nodes."""
    label = config.node_label
    util = _values(obs.metrics.get("gpu_util", []), (label,))
    temperature = _values(obs.metrics.get("gpu_temperature", []), (label,))
    used = _gpus_in_use(obs.pods, config.gpu_resource)
    nodes = sorted(obs.nodes, key=lambda n: n["metadata"]["name"])
    racks = _rack_numbers(nodes, config.rack_label)
    node_names = tuple(n["metadata"]["name"] for n in nodes)
    features = node_features(obs.metrics, node_names, config, fresh)
    fresh_earlier = _fresh(obs.earlier_metrics.get("dcgm_last_sample", []), (label,),
                           config.max_metric_age_s)
    earlier = node_features(obs.earlier_metrics, node_names, config, fresh_earlier)
    risk = _failure_risk(signals, features, earlier,
                         np.array([(name,) in fresh for name in node_names], dtype=bool))
    column = {name: i for i, name in enumerate(NODE_FEATURE_NAMES)}
    records, unreachable, untyped = [], [], {}
    for i, node in enumerate(nodes):
        name = node["metadata"]["name"]
        labels = node["metadata"].get("labels") or {}
        total = _gpu_quantity(((node.get("status") or {}).get("allocatable") or {}).get(
            config.gpu_resource))
        ready = _ready(node)
        if not ready:
            unreachable.append(name)
        key = (name,)
        has_telemetry = key in fresh
        product = labels.get(config.gpu_type_label, "")
        gpu_type = gpu_type_of(product, config.gpu_products) if product else None
        if product and gpu_type is None:
            untyped[name] = product
        records.append(NodeInfo(
            name=name, gpus_total=total,
            gpus_free=max(total - used.get(name, 0), 0) if ready else 0,
            gpu_type=gpu_type or config.default_gpu_type,
            rack=racks[name], ready=ready,
            cordoned=bool((node.get("spec") or {}).get("unschedulable", False)),
            xid_errors_5m=int(features[i, column["xid_5m"]]),
            ecc_errors_30m=int(features[i, column["ecc_30m"]]),
            ready_flaps_60m=int(features[i, column["flaps_60m"]]),
            temperature_c=(temperature.get(key, _NODE_DEFAULTS.temperature_c) if has_telemetry
                           else _NODE_DEFAULTS.temperature_c),
            temperature_delta_30m_c=float(features[i, column["temp_excess_delta_30m"]]),
            gpu_util=util.get(key, 0.0) if has_telemetry else 0.0,
            failure_risk=float(risk[i])))
    return node_names, records, unreachable, untyped


def _ready(node: dict) -> bool:
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


def _rack_numbers(nodes: list[dict], rack_label: str) -> dict[str, int]:
    """Rack per node: the label as an integer, or the rank of its value among all values."""
    values = {n["metadata"]["name"]: (n["metadata"].get("labels") or {}).get(rack_label, "0")
              for n in nodes}
    if all(v.lstrip("-").isdigit() for v in values.values()):
        return {name: int(v) for name, v in values.items()}
    rank = {v: i for i, v in enumerate(sorted(set(values.values())))}
    return {name: rank[v] for name, v in values.items()}


# ----------------------------------------------------------------------------------------- pods
@dataclass(frozen=True, slots=True)
class _Pod:
    namespace: str
    name: str
    node: str
    index: int
    running: bool
    uid: str


def _gpus_in_use(pods: Iterable[dict], resource: str) -> dict[str, int]:
    """GPUs requested by the live pods bound to each node (terminating pods still hold theirs)."""
    used: dict[str, int] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in _TERMINAL_PHASES:
            continue
        gpus = 0
        for container in pod["spec"].get("containers") or []:
            resources = container.get("resources") or {}
            request = (resources.get("requests") or {}).get(resource)
            # the request, or the limit that stands for it (the API server has checked both)
            gpus += _gpu_quantity(request if request is not None
                                  else (resources.get("limits") or {}).get(resource))
        if gpus:
            used[node] = used.get(node, 0) + gpus
    return used


def _worker_pods(pods: Iterable[dict], node_index: dict[str, int]) -> dict[tuple, list[_Pod]]:
    """Live, bound, not-terminating worker pods of each (namespace, job name)."""
    by_job: dict[tuple, list[_Pod]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        job = labels.get(JOB_NAME_LABEL)
        if not job or labels.get(REPLICA_TYPE_LABEL, "worker").lower() != "worker":
            continue
        node = (pod.get("spec") or {}).get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        if not node or node not in node_index or phase in _TERMINAL_PHASES:
            continue
        if meta.get("deletionTimestamp"):
            continue
        index = labels.get(REPLICA_INDEX_LABEL, "0")
        by_job.setdefault((meta.get("namespace", "default"), job), []).append(
            _Pod(meta.get("namespace", "default"), meta["name"], node,
                 int(index) if index.isdigit() else 0, phase == "Running", meta.get("uid", "")))
    return by_job


# ----------------------------------------------------------------------------------------- jobs
def _finished(obj: dict) -> bool:
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") in ("Succeeded", "Failed") and condition.get("status") == "True":
            return True
    return False


def worker_gpus(obj: dict, resource: str) -> tuple[int, str]:
    """(GPUs each worker pod of a PyTorchJob requests, why rlalloc cannot manage the job: ""
    when it can). The GPUs are the worker template's containers' requests of `resource`, a
    limit alone standing for the request, as Kubernetes takes it; a request that differs from
    its limit (a GPU cannot be overcommitted: Kubernetes refuses such a pod), a quantity that
    is not a whole number, or no GPU at all is a problem. A worker is placed whole, all of its
    GPUs on one node, so every count of the job's GPUs is its workers times this."""
    worker = ((obj.get("spec") or {}).get("pytorchReplicaSpecs") or {}).get("Worker") or {}
    containers = ((worker.get("template") or {}).get("spec") or {}).get("containers") or []
    gpus = 0
    for container in containers:
        resources = container.get("resources") or {}
        request = (resources.get("requests") or {}).get(resource)
        limit = (resources.get("limits") or {}).get(resource)
        where = f"container {container.get('name', '')!r} of its worker pods"
        try:
            request_gpus, limit_gpus = _gpu_quantity(request), _gpu_quantity(limit)
        except ValueError as err:
            return 0, (f"{where} asks for {err.args[0]} {resource}, not a whole number of "
                       "GPUs; rlalloc leaves the job alone")
        if request is not None and limit is not None and request_gpus != limit_gpus:
            return 0, (f"{where} requests {request} {resource} with a limit of {limit}; a GPU "
                       "request must equal its limit (Kubernetes refuses such a pod), so "
                       "rlalloc leaves the job alone")
        gpus += request_gpus if request is not None else limit_gpus
    if gpus < 1:
        return 0, (f"its worker pods request no {resource}; rlalloc places GPU workers only, "
                   "so it leaves the job alone")
    return gpus, ""


def _gpu_quantity(value: object) -> int:
    """A whole number of GPUs from a Kubernetes quantity (0 when absent); ValueError(`value`)
    for one that is not a whole, non-negative number (``1.5``, ``500m``, ``abc``)."""
    if value is None or value == "":
        return 0
    try:
        quantity = parse_quantity(value)
    except ValueError:
        raise ValueError(value) from None
    if not quantity.is_finite() or quantity.is_signed() or quantity % 1:
        raise ValueError(value)
    return int(quantity)


def _too_big_problem(gpus_per_worker: int, nodes: list[NodeInfo], resource: str) -> str:
    """Why a job of `gpus_per_worker`-GPU workers cannot run on any of `nodes` ("" when the
    largest node holds one of its workers): a worker's GPUs must all be on one node."""
    largest = max(nodes, key=lambda node: node.gpus_total, default=None)
    if largest is None or gpus_per_worker <= largest.gpus_total:
        return ""
    return (f"its worker pods request {gpus_per_worker} {resource} each, more than any node "
            f"has (the largest, {largest.name}, has {largest.gpus_total}); a worker's GPUs "
            "must all be on one node, so rlalloc leaves the job alone")


def _worker_replicas(obj: dict) -> int:
    worker = ((obj.get("spec") or {}).get("pytorchReplicaSpecs") or {}).get("Worker") or {}
    return int(worker.get("replicas", 1))


def _annotated_request(annotations: dict) -> int | None:
    """The requested workers rlalloc recorded on its first change of the job (`Applier`), if
    it has changed it: from then on `Worker.replicas` is rlalloc's choice, not the user's."""
    value = annotations.get(REQUESTED_WORKERS_ANNOTATION, "")
    return int(value) if value.isdigit() else None


def _elastic_range(obj: dict, replicas: int, annotated: int | None) -> tuple[int, int]:
    """elasticPolicy min/max replicas; a job without one may only keep its requested count
    (the annotated one: a suspended job's replicas are 0)."""
    elastic = (obj.get("spec") or {}).get("elasticPolicy") or {}
    fixed = annotated if annotated else max(replicas, 1)
    low = int(elastic.get("minReplicas", fixed))
    return low, max(int(elastic.get("maxReplicas", fixed)), low)


def _requested(annotated: int | None, replicas: int, min_workers: int,
               max_workers: int) -> int:
    """The job's requested workers: the annotated request, else its replicas, kept within its
    elastic range. The simulator's workloads guarantee min <= request <= max and the policies
    rely on it (a request the range cannot hold gave elastic no size for the job, which it then
    suspended); a PyTorchJob annotated outside its elasticPolicy cannot break that."""
    requested = (annotated if annotated is not None
                 else replicas if replicas > 0 else min_workers)
    return min(max(requested, min_workers), max_workers)


def _float(annotations: dict, key: str, default: float) -> float:
    try:
        return float(annotations[key])
    except (KeyError, ValueError):
        return default


# -------------------------------------------------------------------------------------- metrics
def _values(results: list[dict], labels: tuple[str, ...]) -> dict[tuple, float]:
    """Series value by label values; series missing a label, or NaN, are skipped."""
    out: dict[tuple, float] = {}
    for series in results:
        metric = series.get("metric", {})
        key = tuple(metric.get(label) for label in labels)
        if None in key:
            continue
        value = float(series["value"][1])
        if value == value:  # not NaN
            out[key] = value
    return out


def _fresh(results: list[dict], labels: tuple[str, ...], max_age_s: float) -> set:
    """Keys whose newest sample (query value, from timestamp()) is at most `max_age_s` older
    than the query's evaluation time."""
    fresh = set()
    for series in results:
        metric = series.get("metric", {})
        key = tuple(metric.get(label) for label in labels)
        evaluated_at, sample_time = float(series["value"][0]), float(series["value"][1])
        if None not in key and evaluated_at - sample_time <= max_age_s:
            fresh.add(key)
    return fresh

