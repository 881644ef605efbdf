"""The twin's Prometheus exporter: the simulator's telemetry under the real exporters' names.

One HTTP endpoint serves what, in a cluster, three exporters would: dcgm-exporter (per GPU,
labelled Hostname/gpu/UUID), kube-state-metrics (node conditions, unschedulable, allocatable
GPUs, pod phases and GPU requests) and each training job's rank-0 exporter (labelled job,
namespace, rank). The runtime publishes a `TelemetryFrame` per tick; a scrape renders the
latest one. A node can be *frozen* to imitate an exporter that stopped updating: its DCGM
samples keep their old values and carry the old timestamp.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric

from rlalloc.env.telemetry_names import (
    DCGM_ECC_DBE_VOLATILE,
    DCGM_GPU_TEMP,
    DCGM_GPU_UTIL,
    DCGM_HOSTNAME_LABEL,
    DCGM_ROW_REMAP_FAILURE,
    DCGM_XID_ERRORS,
    KSM_NODE_CONDITION,
    KSM_NODE_UNSCHEDULABLE,
    KSM_POD_PHASE,
    TRAINER_LAST_CHECKPOINT_STEP,
    TRAINER_LAST_CHECKPOINT_TIME,
    TRAINER_SAMPLES_PER_S,
    TRAINER_STEP,
    TRAINER_TOTAL_STEPS,
    TRAINER_WORLD_SIZE,
)

CLOCK_METRIC = "rlalloc_twin_clock_seconds"
"""The twin's simulated clock (Unix seconds); the actuator reads it through `queries.clock`."""
_PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")


@dataclass(frozen=True)
class NodeTelemetry:
    """One node's exported values."""

    name: str
    gpus: int
    gpus_used: int
    temperature_c: float
    xid_code: int
    """Last XID error seen (0: none yet); a change is a new XID."""
    ecc_total: float
    """Double-bit ECC errors since the driver loaded (a counter)."""
    ready: bool
    ready_metric: bool
    """kube-state-metrics' Ready=true value (dips for a moment on a readiness flap)."""
    unschedulable: bool


@dataclass(frozen=True)
class JobTelemetry:
    """One training job's rank-0 exporter values."""

    namespace: str
    name: str
    samples_per_s: float
    step: float
    total_steps: float
    world_size: int
    last_checkpoint_s: float
    checkpoint_step: float
    """Step in the latest complete checkpoint (where the job resumes after a node failure)."""


@dataclass(frozen=True)
class PodTelemetry:
    """One pod as kube-state-metrics sees it."""

    namespace: str
    name: str
    node: str
    phase: str
    gpus: int = 1
    """GPUs the pod requests (its job's GPUs per worker)."""


@dataclass(frozen=True)
class TelemetryFrame:
    """Everything exported at one moment."""

    clock_s: float
    nodes: tuple[NodeTelemetry, ...] = ()
    jobs: tuple[JobTelemetry, ...] = ()
    pods: tuple[PodTelemetry, ...] = ()


@dataclass
class _Frozen:
    node: NodeTelemetry
    wall_s: float


@dataclass(eq=False)
class TwinExporter:
    """A prometheus_client collector over the latest `TelemetryFrame`."""

    frame: TelemetryFrame = field(default_factory=lambda: TelemetryFrame(0.0))
    _frozen: dict[str, _Frozen] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: WSGIServer | None = None

    def publish(self, frame: TelemetryFrame) -> None:
        """Make `frame` what the next scrape sees."""
        with self._lock:
            self.frame = frame

    def freeze(self, node: str, wall_s: float) -> None:
        """Keep exporting `node`'s current DCGM values, stamped `wall_s` (a stuck exporter)."""
        with self._lock:
            for telemetry in self.frame.nodes:
                if telemetry.name == node:
                    self._frozen[node] = _Frozen(telemetry, wall_s)

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve /metrics on `port` (0 = any free port); returns the port."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        self._server, _thread = start_http_server(port, addr=host, registry=registry)
        return self._server.server_address[1]

    def stop(self) -> None:
        """Stop serving and close the port (a no-op when not serving)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def collect(self) -> Iterator[Metric]:
        """The metric families of the latest frame (called by prometheus_client on a scrape)."""
        with self._lock:
            frame, frozen = self.frame, dict(self._frozen)
        dcgm_labels = (DCGM_HOSTNAME_LABEL, "gpu", "UUID")
        util = GaugeMetricFamily(DCGM_GPU_UTIL, "GPU utilization (in %).", labels=dcgm_labels)
        temp = GaugeMetricFamily(DCGM_GPU_TEMP, "GPU temperature (in C).", labels=dcgm_labels)
        xid = GaugeMetricFamily(DCGM_XID_ERRORS, "Value of the last XID error encountered.",
                                labels=dcgm_labels)
        ecc = GaugeMetricFamily(DCGM_ECC_DBE_VOLATILE, "Total number of double-bit volatile "
                                "ECC errors.", labels=dcgm_labels)
        remap = GaugeMetricFamily(DCGM_ROW_REMAP_FAILURE, "Whether remapping of rows has "
                                  "failed", labels=dcgm_labels)
        for node in frame.nodes:
            stamp = None
            if node.name in frozen:
                node, stamp = frozen[node.name].node, frozen[node.name].wall_s
            for gpu in range(node.gpus):
                labels = [node.name, str(gpu), f"GPU-{node.name}-{gpu}"]
                util.add_metric(labels, 100.0 if gpu < node.gpus_used else 0.0, stamp)
                temp.add_metric(labels, node.temperature_c, stamp)
                xid.add_metric(labels, float(node.xid_code) if gpu == 0 else 0.0, stamp)
                ecc.add_metric(labels, node.ecc_total if gpu == 0 else 0.0, stamp)
                remap.add_metric(labels, 0.0, stamp)
        yield from (util, temp, xid, ecc, remap)
        yield from self._kube_state(frame)
        yield from self._trainers(frame)
        clock = GaugeMetricFamily(CLOCK_METRIC, "The digital twin's simulated clock.")
        clock.add_metric([], frame.clock_s)
        yield clock

    @staticmethod
    def _kube_state(frame: TelemetryFrame) -> Iterator[Metric]:
        condition = GaugeMetricFamily(KSM_NODE_CONDITION, "The condition of a cluster node.",
                                      labels=("node", "condition", "status"))
        unschedulable = GaugeMetricFamily(KSM_NODE_UNSCHEDULABLE,
                                          "Whether a node can schedule new pods.", labels=("node",))
        allocatable = GaugeMetricFamily("kube_node_status_allocatable",
                                        "The allocatable for different resources of a node.",
                                        labels=("node", "resource", "unit"))
        for node in frame.nodes:
            for status, value in (("true", node.ready_metric), ("false", not node.ready),
                                  ("unknown", False)):
                condition.add_metric([node.name, "Ready", status], float(value))
            unschedulable.add_metric([node.name], float(node.unschedulable))
            allocatable.add_metric([node.name, "nvidia_com_gpu", "integer"], float(node.gpus))
        phase = GaugeMetricFamily(KSM_POD_PHASE, "The pods current phase.",
                                  labels=("namespace", "pod", "phase"))
        requests = GaugeMetricFamily("kube_pod_container_resource_requests",
                                     "The number of requested resource by a container.",
                                     labels=("namespace", "pod", "container", "node",
                                             "resource", "unit"))
        for pod in frame.pods:
            for name in _PHASES:
                phase.add_metric([pod.namespace, pod.name, name], float(name == pod.phase))
            requests.add_metric([pod.namespace, pod.name, "pytorch", pod.node, "nvidia_com_gpu",
                                 "integer"], float(pod.gpus))
        yield from (condition, unschedulable, allocatable, phase, requests)

    @staticmethod
    def _trainers(frame: TelemetryFrame) -> Iterator[Metric]:
        labels = ("job", "namespace", "rank")
        families = {
            "samples_per_s": GaugeMetricFamily(TRAINER_SAMPLES_PER_S, "Training samples per "
                                               "second, whole job", labels=labels),
            "step": GaugeMetricFamily(TRAINER_STEP, "Optimizer steps completed", labels=labels),
            "total_steps": GaugeMetricFamily(TRAINER_TOTAL_STEPS, "Steps the job is configured "
                                             "to run", labels=labels),
            "world_size": GaugeMetricFamily(TRAINER_WORLD_SIZE, "Workers in the current "
                                            "rendezvous", labels=labels),
            "last_checkpoint_s": GaugeMetricFamily(TRAINER_LAST_CHECKPOINT_TIME, "Unix time of "
                                                   "the latest checkpoint commit, or of the "
                                                   "(re)start if later", labels=labels),
            "checkpoint_step": GaugeMetricFamily(TRAINER_LAST_CHECKPOINT_STEP, "Step stored in "
                                                 "the latest complete checkpoint", labels=labels),
        }
        for job in frame.jobs:
            for key, family in families.items():
                family.add_metric([job.name, job.namespace, "0"], float(getattr(job, key)))
        yield from families.values()
