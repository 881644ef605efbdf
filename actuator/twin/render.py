"""What a cluster in a given `ClusterState` looks like to the actuator: Kubernetes objects and the
answers Prometheus gives to the default queries. Pure functions, no simulator.

The twin's runtime mirrors the simulator through `node_object`, `pytorchjob_object` and
`pod_object`; the parity test and the benchmark turn whole recorded states into objects and query
results with `cluster_objects` and `query_results` (and `telemetry_results` for the node telemetry
read `risk_lag_s` earlier), the inverse of what the state builder does.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

import numpy as np

from rlalloc.actuator.config import NORMAL_BUSY_RISE_C, NORMAL_IDLE_TEMPERATURE_C
from rlalloc.actuator.gpu_products import TWIN_PRODUCTS
from rlalloc.actuator.job_curves import TYPE_SPEEDS_ANNOTATION, format_type_speeds
from rlalloc.actuator.k8s_names import (
    ALPHA_ANNOTATION,
    BETA_ANNOTATION,
    HOSTNAME_LABEL,
    JOB_NAME_LABEL,
    PYTORCHJOB_GROUP,
    PYTORCHJOB_KIND,
    PYTORCHJOB_VERSION,
    REPLICA_INDEX_LABEL,
    REPLICA_TYPE_LABEL,
    REQUESTED_WORKERS_ANNOTATION,
    RESTORE_ANNOTATION,
    SPEED_ANNOTATION,
)
from rlalloc.actuator.state_builder import MetricResults
from rlalloc.env.failures import NODE_FEATURE_NAMES
from rlalloc.env.placement import requested_workers
from rlalloc.env.state import ClusterState, JobStatus
from rlalloc.env.telemetry_names import APPLICATION_LABEL, DCGM_HOSTNAME_LABEL, MANAGED_LABEL

GPU_RESOURCE = "nvidia.com/gpu"
RACK_LABEL = "topology.rlalloc.io/rack"
GPU_TYPE_LABEL = "nvidia.com/gpu.product"
TOTAL_STEPS = 1_000_000.0
"""Steps the twin's jobs claim to run (the trainer's step gauge is progress x this)."""
TRAINER_IMAGE = "ghcr.io/rlalloc/trainer-jobs:0.1.0"


def k8s_name(job_id: str) -> str:
    """A DNS-1123 name for a simulator job id (lower case, [a-z0-9-], at most 63 characters)."""
    name = re.sub(r"[^a-z0-9-]+", "-", job_id.lower()).strip("-")
    return name[:63] or "job"


def timestamp(unix_s: float) -> str:
    """Kubernetes timestamp (second precision, as the API server writes it)."""
    return datetime.fromtimestamp(int(unix_s), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_object(name: str, gpus: int, gpu_type: str, rack: int, ready: bool,
                unschedulable: bool = False) -> dict:
    """A Node with `gpus` allocatable GPUs and a Ready condition, labelled with the product
    GPU Feature Discovery writes for a GPU of `gpu_type` (`TWIN_PRODUCTS`)."""
    node = {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {HOSTNAME_LABEL: name, RACK_LABEL: str(rack),
                                              GPU_TYPE_LABEL: TWIN_PRODUCTS[gpu_type]}},
        "spec": {},
        "status": {"allocatable": {GPU_RESOURCE: str(gpus), "cpu": "32", "memory": "256Gi"},
                   "capacity": {GPU_RESOURCE: str(gpus)},
                   "conditions": [{"type": "Ready", "status": "True" if ready else "Unknown",
                                   "reason": "KubeletReady" if ready else "NodeStatusUnknown"}]},
    }
    if unschedulable:
        node["spec"]["unschedulable"] = True
    return node


def pytorchjob_object(namespace: str, name: str, replicas: int, min_workers: int,
                      max_workers: int, requested: int, created_s: float, speed_1gpu: float,
                      scaling_alpha: float, scaling_beta: float, restore_s: float,
                      application: str = "", gpus_per_worker: int = 1) -> dict:
    """An elastic PyTorchJob managed by rlalloc (valid against the v1.9.0 CRD): `requested`
    workers, each a pod of `gpus_per_worker` GPUs running as many processes
    (`nprocPerNode`)."""
    labels = {MANAGED_LABEL: "true"}
    if application:
        labels[APPLICATION_LABEL] = application
    return {
        "apiVersion": f"{PYTORCHJOB_GROUP}/{PYTORCHJOB_VERSION}", "kind": PYTORCHJOB_KIND,
        "metadata": {
            "name": name, "namespace": namespace, "labels": labels,
            "creationTimestamp": timestamp(created_s),
            "annotations": {REQUESTED_WORKERS_ANNOTATION: str(requested),
                            SPEED_ANNOTATION: repr(float(speed_1gpu)),
                            ALPHA_ANNOTATION: repr(float(scaling_alpha)),
                            BETA_ANNOTATION: repr(float(scaling_beta)),
                            RESTORE_ANNOTATION: repr(float(restore_s))}},
        "spec": {
            "elasticPolicy": {"minReplicas": int(min_workers), "maxReplicas": int(max_workers),
                              "rdzvBackend": "c10d", "maxRestarts": 100},
            "nprocPerNode": str(gpus_per_worker),
            "pytorchReplicaSpecs": {"Worker": {
                "replicas": int(replicas), "restartPolicy": "OnFailure",
                "template": {"metadata": {"labels": dict(labels)}, "spec": {"containers": [{
                    "name": "pytorch", "image": TRAINER_IMAGE,
                    "resources": {"requests": {GPU_RESOURCE: gpus_per_worker},
                                  "limits": {GPU_RESOURCE: gpus_per_worker}},
                }]}},
            }},
        },
    }


def state_job_object(state: ClusterState, row: int, namespace: str, name: str, replicas: int,
                     epoch_s: float) -> dict:
    """`pytorchjob_object` of job `row` of `state` with `replicas` workers, annotated with its
    curve and, on a mixed cluster, its curve per GPU type (`TYPE_SPEEDS_ANNOTATION`)."""
    jobs = state.jobs
    obj = pytorchjob_object(
        namespace, name, replicas, int(jobs.min_workers[row]), int(jobs.max_workers[row]),
        int(requested_workers(state, row)), epoch_s + float(jobs.submit_s[row]),
        float(jobs.speed_1gpu[row]), float(jobs.scaling_alpha[row]),
        float(jobs.scaling_beta[row]), float(jobs.restore_s[row]),
        gpus_per_worker=int(jobs.gpus_per_worker[row]))
    if state.type_speeds is not None:
        obj["metadata"]["annotations"][TYPE_SPEEDS_ANNOTATION] = format_type_speeds(
            state.type_speeds, row)
    return obj


def pod_object(namespace: str, job: str, index: int, node: str | None, running: bool,
               gpus: int = 1) -> dict:
    """Worker pod `index` of PyTorchJob `job` requesting `gpus` GPUs, bound to `node` (None:
    Pending)."""
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{job}-worker-{index}", "namespace": namespace,
                     "labels": {JOB_NAME_LABEL: job, REPLICA_TYPE_LABEL: "worker",
                                REPLICA_INDEX_LABEL: str(index), MANAGED_LABEL: "true"}},
        "spec": {"containers": [{"name": "pytorch", "image": TRAINER_IMAGE, "resources": {
            "requests": {GPU_RESOURCE: str(gpus)}, "limits": {GPU_RESOURCE: str(gpus)}}}]},
        "status": {"phase": "Running" if node and running else "Pending"},
    }
    if node:
        pod["spec"]["nodeName"] = node
    return pod


def cluster_objects(state: ClusterState, namespace: str, names: dict[str, str],
                    epoch_s: float = 0.0) -> tuple[list[dict], list[dict], list[dict]]:
    """(nodes, pods, PyTorchJobs) of a cluster in `state`; `names` maps job ids to object names.

    Worker i of a job runs on the i-th node of its (sorted) placement, a pod of the job's GPUs
    per worker.
    """
    nodes, jobs = state.nodes, state.jobs
    node_objects = [node_object(nodes.name[i], int(nodes.gpus_total[i]), nodes.gpu_type[i],
                                int(nodes.rack[i]), bool(nodes.ready[i]),
                                bool(nodes.cordoned[i])) for i in range(nodes.count)]
    pods, job_objects = [], []
    for row in range(jobs.count):
        name = names[jobs.job_id[row]]
        per_worker = int(jobs.gpus_per_worker[row])
        job_objects.append(state_job_object(state, row, namespace, name, int(jobs.workers[row]),
                                            epoch_s))
        for index, node in enumerate(jobs.placement[row]):
            pods.append(pod_object(namespace, name, index, nodes.name[node], True, per_worker))
    return node_objects, pods, job_objects


def state_features(state: ClusterState) -> np.ndarray:
    """(nodes, F) telemetry features (`NODE_FEATURE_NAMES`) as far as `state` shows them: XIDs
    in 30 minutes are taken as those in 5, the temperature excess is over the default queries'
    normal (idle + rise x utilisation)."""
    nodes = state.nodes
    excess = nodes.temperature_c - (NORMAL_IDLE_TEMPERATURE_C
                                    + NORMAL_BUSY_RISE_C * nodes.gpu_util)
    columns = {"xid_5m": nodes.xid_errors_5m, "xid_30m": nodes.xid_errors_5m,
               "ecc_30m": nodes.ecc_errors_30m, "flaps_60m": nodes.ready_flaps_60m,
               "temp_excess_c": excess, "temp_excess_delta_30m": nodes.temperature_delta_30m_c}
    return np.stack([np.asarray(columns[name], dtype=np.float32) for name in NODE_FEATURE_NAMES],
                    axis=1)


def telemetry_results(node_names: tuple[str, ...], features: np.ndarray,
                      evaluated_at_s: float) -> MetricResults:
    """What Prometheus answers to the node-telemetry queries (`observe.RISK_QUERIES`) for nodes
    with `features` (`NODE_FEATURE_NAMES` order), every DCGM sample fresh."""
    column = {name: features[:, i] for i, name in enumerate(NODE_FEATURE_NAMES)}

    def per_node(values: np.ndarray, label: str = DCGM_HOSTNAME_LABEL) -> list[dict]:
        return [{"metric": {label: name}, "value": [evaluated_at_s, repr(float(values[i]))]}
                for i, name in enumerate(node_names)]

    return {
        "xid_errors": per_node(column["xid_5m"]),
        "xid_errors_30m": per_node(column["xid_30m"]),
        "ecc_errors": per_node(column["ecc_30m"]),
        "row_remap_failures": per_node(np.zeros(len(node_names))),
        "ready_flaps": per_node(column["flaps_60m"], "node"),
        "temperature_excess": per_node(column["temp_excess_c"]),
        "temperature_excess_delta": per_node(column["temp_excess_delta_30m"]),
        "dcgm_last_sample": per_node(np.full(len(node_names), evaluated_at_s)),
    }


def query_results(state: ClusterState, namespace: str, names: dict[str, str],
                  evaluated_at_s: float, epoch_s: float = 0.0, job_label: str = "job",
                  features: np.ndarray | None = None,
                  checkpointed: np.ndarray | None = None) -> MetricResults:
    """What Prometheus answers to the default `Queries` for a cluster in `state`, every sample
    fresh: the twin exporter's values for node telemetry and trainer metrics. `features`: the
    nodes' telemetry features, when known beyond what the state shows (`state_features`).
    `checkpointed`: each job's checkpointed progress (`Simulator.checkpointed_progress`), which
    the state does not carry; without it no checkpoint step is answered, as from a trainer
    that exports none."""
    nodes, jobs = state.nodes, state.jobs

    def per_node(values: np.ndarray) -> list[dict]:
        return [{"metric": {DCGM_HOSTNAME_LABEL: nodes.name[i]},
                 "value": [evaluated_at_s, repr(float(values[i]))]} for i in range(nodes.count)]

    allocated = [r for r in range(jobs.count) if jobs.workers[r] > 0]

    def per_job(values: list[float]) -> list[dict]:
        return [{"metric": {"namespace": namespace, job_label: names[jobs.job_id[r]]},
                 "value": [evaluated_at_s, repr(float(v))]} for r, v in zip(allocated, values,
                                                                            strict=True)]

    now = epoch_s + state.time_s
    features = state_features(state) if features is None else features
    return {
        "gpu_util": per_node(nodes.gpu_util),
        "gpu_temperature": per_node(nodes.temperature_c),
        **telemetry_results(nodes.name, features, evaluated_at_s),
        "trainer_throughput": per_job([float(jobs.throughput[r])
                                       if jobs.status[r] == JobStatus.RUNNING else 0.0
                                       for r in allocated]),
        "trainer_step": per_job([float(jobs.progress[r]) * TOTAL_STEPS for r in allocated]),
        "trainer_total_steps": per_job([TOTAL_STEPS] * len(allocated)),
        "trainer_last_checkpoint": per_job([now - float(jobs.since_checkpoint_s[r])
                                            for r in allocated]),
        "trainer_last_sample": per_job([evaluated_at_s] * len(allocated)),
        **({} if checkpointed is None else {"trainer_checkpoint_step": per_job(
            [float(checkpointed[r]) * TOTAL_STEPS for r in allocated])}),
    }
