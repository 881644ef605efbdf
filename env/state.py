"""`ClusterState` and `Action`: the contract between whoever observes a cluster and whoever decides.

The simulator builds a `ClusterState` every decision step; the actuator builds the very same
object from Prometheus and the Kubernetes API. Policies and the featurizer see nothing else, so a
policy trained offline runs unchanged in the cluster. This module therefore imports only numpy
and must never depend on simulator internals.

The state is a struct of arrays (one numpy array per field, one row per node or job) rather than
a list of records: the simulator snapshots it hundreds of thousands of times per trace replay,
and copying a few arrays is much cheaper than building thousands of objects. `NodeInfo` /
`JobInfo` records are offered for readable single-row access and for building a state by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import IntEnum
from functools import cached_property

import numpy as np


class JobStatus(IntEnum):
    """Where a job is in its life cycle."""

    QUEUED = 0
    """Waiting for GPUs (never started, suspended, or stopped by a failure)."""
    RUNNING = 1
    """Training on its allocated GPUs."""
    RESTARTING = 2
    """Allocated, but restoring from its checkpoint after a start, resize or move."""


class Strategy(IntEnum):
    """How a scale action chooses nodes for the job's workers."""

    PACKED = 0
    """Fewest nodes, best fit (prefers nodes whose free GPUs match the need)."""
    SPREAD = 1
    """Fill the most fragmented free GPUs first, keeping whole nodes free for big jobs."""


class ActionKind(IntEnum):
    """The three things an allocation policy can do."""

    NOOP = 0
    SCALE = 1
    """Run job J with n workers on the given nodes (n = 0 suspends it; from queued, starts it)."""
    MIGRATE = 2
    """Move job J's workers off node N (checkpoint first: no work lost, pays the restore)."""


_SCALE, _MIGRATE = ActionKind.SCALE, ActionKind.MIGRATE


@dataclass(frozen=True, slots=True)
class Action:
    """One allocation decision; `nodes` lists the node name of each worker of the new placement."""

    kind: ActionKind
    job_id: str = ""
    workers: int = 0
    nodes: tuple[str, ...] = ()
    from_node: str = ""
    """MIGRATE only: the node the job must leave."""

    def __post_init__(self) -> None:
        if self.kind == _SCALE:
            assert self.job_id and len(self.nodes) == self.workers, self
        elif self.kind == _MIGRATE:
            assert self.job_id and self.from_node and self.nodes, self

    def describe(self) -> str:
        """Human-readable form for logs and Kubernetes Events."""
        if self.kind == ActionKind.NOOP:
            return "no-op"
        hosts = ",".join(sorted(set(self.nodes)))
        if self.kind == ActionKind.SCALE:
            return f"scale {self.job_id} to {self.workers} workers on [{hosts}]"
        return f"migrate {self.job_id} off {self.from_node} to [{hosts}]"


NOOP = Action(ActionKind.NOOP)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One node, as a record (see `Nodes` for the meaning of each field)."""

    name: str
    gpus_total: int
    gpus_free: int
    gpu_type: str = "T4"
    rack: int = 0
    ready: bool = True
    cordoned: bool = False
    xid_errors_5m: int = 0
    ecc_errors_30m: int = 0
    ready_flaps_60m: int = 0
    temperature_c: float = 50.0
    temperature_delta_30m_c: float = 0.0
    gpu_util: float = 0.0
    failure_risk: float = 0.0


@dataclass(frozen=True)
class Nodes:
    """All nodes, one array element per node (same order in every field)."""

    name: tuple[str, ...]
    gpus_total: np.ndarray
    """int32: GPUs on the node."""
    gpus_free: np.ndarray
    """int32: GPUs not allocated to any job (0 for a node that is down or cordoned)."""
    gpu_type: tuple[str, ...]
    rack: np.ndarray
    """int32: rack (or switch) id; cross-rack placements are slower."""
    ready: np.ndarray
    """bool: Kubernetes Ready condition (False while the node is down)."""
    cordoned: np.ndarray
    """bool: unschedulable (cordoned by an operator or by the actuator's failover)."""
    xid_errors_5m: np.ndarray
    """int32: new XID errors in the last 5 minutes (`changes(DCGM_FI_DEV_XID_ERRORS[5m])`)."""
    ecc_errors_30m: np.ndarray
    """int32: new uncorrectable ECC errors in the last 30 minutes."""
    ready_flaps_60m: np.ndarray
    """int32: Ready -> NotReady transitions in the last hour."""
    temperature_c: np.ndarray
    """float32: mean GPU temperature."""
    temperature_delta_30m_c: np.ndarray
    """float32: temperature change over the last 30 minutes."""
    gpu_util: np.ndarray
    """float32: mean GPU utilisation in [0, 1]."""
    failure_risk: np.ndarray
    """float32: estimated probability of failing within the risk model's horizon (0 if none)."""

    @property
    def count(self) -> int:
        """Number of nodes."""
        return len(self.name)

    @cached_property
    def type_names(self) -> tuple[str, ...]:
        """The GPU types of the nodes, each once, in the order their first node appears (more
        than one: a mixed cluster, where a job runs on one type at a time)."""
        return tuple(dict.fromkeys(self.gpu_type))

    @cached_property
    def warned(self) -> np.ndarray:
        """bool: telemetry shows warning signs (any XID, ECC error or flap in its window)."""
        return (self.xid_errors_5m > 0) | (self.ecc_errors_30m > 0) | (self.ready_flaps_60m > 0)

    def record(self, i: int) -> NodeInfo:
        """Node `i` as a `NodeInfo`."""
        return NodeInfo(**{f.name: _scalar(getattr(self, f.name)[i]) for f in fields(NodeInfo)})

    @staticmethod
    def from_records(records: list[NodeInfo]) -> Nodes:
        """Build the arrays from records (the actuator's and the tests' way in)."""
        return Nodes(**_columns(records, Nodes))


@dataclass(frozen=True, slots=True)
class JobInfo:
    """One job, as a record (see `Jobs` for the meaning of each field)."""

    job_id: str
    status: JobStatus
    submit_s: float
    requested_gpus: int
    min_workers: int
    max_workers: int
    workers: int = 0
    placement: tuple[int, ...] = ()
    speed_1gpu: float = 1.0
    scaling_alpha: float = 0.05
    scaling_beta: float = 0.1
    throughput: float = 0.0
    progress: float = 0.0
    attained_gpu_s: float = 0.0
    run_s: float = 0.0
    since_checkpoint_s: float = 0.0
    restore_s: float = 60.0
    restarts: int = 0
    gpus_per_worker: int = 1


@dataclass(frozen=True)
class Jobs:
    """Jobs in the system (queued, running or restarting), one array element per job."""

    job_id: tuple[str, ...]
    status: np.ndarray
    """int8: `JobStatus` value."""
    submit_s: np.ndarray
    """float64: submission time on the state's clock."""
    requested_gpus: np.ndarray
    """int32: GPUs the user asked for."""
    min_workers: np.ndarray
    max_workers: np.ndarray
    """int32: elastic range (PyTorchJob elasticPolicy minReplicas/maxReplicas)."""
    workers: np.ndarray
    """int32: workers allocated now (0 when queued)."""
    placement: tuple[tuple[int, ...], ...]
    """Node index of each worker (sorted; a worker's GPUs are all on its node); empty when
    queued."""
    speed_1gpu: np.ndarray
    scaling_alpha: np.ndarray
    scaling_beta: np.ndarray
    """float32: the job's scaling curve, iterations/s = speed_1gpu * n / (1 + a(n-1) + b n [k>1])
    for n workers on k nodes (fitted to its profile; the generic fit when it has none)."""
    throughput: np.ndarray
    """float32: measured iterations/s now (0 when queued or restarting)."""
    progress: np.ndarray
    """float32: share of the job's work done, in [0, 1]."""
    attained_gpu_s: np.ndarray
    """float64: GPU-seconds of service received so far (Tiresias' attained service)."""
    run_s: np.ndarray
    """float64: seconds spent allocated so far."""
    since_checkpoint_s: np.ndarray
    """float32: seconds of training since the last checkpoint (work at risk on a failure)."""
    restore_s: np.ndarray
    """float32: checkpoint-restore time paid on a start, resize or move."""
    restarts: np.ndarray
    """int32: (re)starts after the first one: resizes, moves and failures."""
    gpus_per_worker: np.ndarray
    """int32: GPUs each worker holds, all on one node; a job holds `workers * gpus_per_worker`
    GPUs, and `min_workers`, `max_workers`, `workers` and `placement` count workers."""

    @property
    def count(self) -> int:
        """Number of jobs."""
        return len(self.job_id)

    def record(self, i: int) -> JobInfo:
        """Job `i` as a `JobInfo`."""
        values = {f.name: _scalar(getattr(self, f.name)[i]) for f in fields(JobInfo)}
        values["status"] = JobStatus(values["status"])
        return JobInfo(**values)

    @staticmethod
    def from_records(records: list[JobInfo]) -> Jobs:
        """Build the arrays from records (the actuator's and the tests' way in)."""
        return Jobs(**_columns(records, Jobs))


@dataclass(frozen=True)
class Demand:
    """Cluster-level demand signals and forecasts."""

    pending_gpus: int = 0
    """GPUs requested by queued jobs."""
    arrivals_1h: int = 0
    """Jobs submitted in the last hour."""
    forecast_gpus: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """Forecast demand (running + pending GPUs, as a share of the cluster) 5, 15, 60 min ahead."""


@dataclass(frozen=True)
class TypeSpeeds:
    """Each job's scaling curve on each GPU type of a cluster that mixes types.

    A job runs on one type at a time, and its speed on a type is that type's measured profile
    (or the documented fallback, `rlalloc.env.gpu_types`), so one curve per job cannot say
    where it should go. Row ``j`` of each array is job ``j`` of `Jobs`; column ``t`` is
    `gpu_types[t]`. On a one-type cluster the state has none: `Jobs`' curve is that type's.
    """

    gpu_types: tuple[str, ...]
    """The cluster's types, in the order their first node appears."""
    speed_1gpu: np.ndarray
    """float32 (jobs, types): iterations per second on one GPU of the type."""
    scaling_alpha: np.ndarray
    scaling_beta: np.ndarray
    """float32 (jobs, types): the curve on that type, as `Jobs.scaling_alpha`/`scaling_beta`."""

    def of_rows(self, rows: np.ndarray) -> TypeSpeeds:
        """The table of the jobs `rows` only (a state shown without some of its jobs)."""
        return TypeSpeeds(self.gpu_types, self.speed_1gpu[rows], self.scaling_alpha[rows],
                          self.scaling_beta[rows])

    def column(self, gpu_type: str) -> int:
        """Index of `gpu_type` in `gpu_types` (raises ValueError for a type not in the cluster)."""
        return self.gpu_types.index(gpu_type)


@dataclass(frozen=True)
class ClusterState:
    """Everything a policy may know about the cluster at one decision point."""

    time_s: float
    """Seconds on the state's clock (simulated time, or Unix time in the cluster)."""
    nodes: Nodes
    jobs: Jobs
    demand: Demand
    time_of_day_s: float = 0.0
    """Seconds since local midnight (demand has a daily cycle)."""
    type_speeds: TypeSpeeds | None = None
    """Each job's curve per GPU type where the cluster mixes types; None on a one-type cluster
    (then `Jobs`' curve is the speed on that type)."""

    def job_index(self, job_id: str) -> int:
        """Row of `job_id` in `jobs` (raises KeyError if the job is not in the state)."""
        try:
            return self.jobs.job_id.index(job_id)
        except ValueError as err:
            raise KeyError(job_id) from err


_DTYPES = {"int": np.int32, "float": np.float64, "bool": np.bool_}


def _scalar(value: object) -> object:
    return value.item() if isinstance(value, np.generic) else value


def _columns(records: list, table: type) -> dict[str, object]:
    """Turn records into the column arrays of `table` (tuple columns stay tuples).

    The dtype of each array follows the record's annotation; the table's annotation says
    whether a column is a tuple (names, placements) or an array.
    """
    record_type = NodeInfo if table is Nodes else JobInfo
    record_types = {f.name: f.type for f in fields(record_type)}
    columns: dict[str, object] = {}
    for f in fields(table):
        values = [getattr(r, f.name) for r in records]
        if f.type.startswith("tuple"):
            columns[f.name] = tuple(values)
        elif f.name == "status":
            columns[f.name] = np.asarray([int(v) for v in values], dtype=np.int8)
        else:
            columns[f.name] = np.asarray(values, dtype=_DTYPES[record_types[f.name]])
    return columns
