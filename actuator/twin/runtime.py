"""The digital twin's engine: the simulator in accelerated real time, shown as a cluster.

Every tick (`tick_s` of wall time, `speed` x that of simulated time) the twin

1. reads what the actuator wrote to the Kubernetes API and reacts as the training operator and
   the scheduler would: a changed `Worker.replicas` (patch or /scale) adds or removes worker
   pods; a deleted pod is recreated; pending pods are bound to schedulable nodes with free GPUs
   (all of a pod's GPUs, its job's GPUs per worker, on its node) — the placement annotation's
   per-node counts first, within the node affinity — and a job only starts once at least
   `minReplicas` of its workers can run (gang scheduling to the minimum).
   The resulting placement is handed to the simulator as a scale action, so the job pays its
   restore time and runs at the placement's speed;
2. advances the simulator to the new target time (arrivals, completions, failures happen there;
   a failure requeues every job on the node from its checkpoint, so those jobs' workers turn
   Pending at once, on every node, as the simulator has freed all their GPUs);
3. mirrors the simulator's jobs, pods and nodes back into the API (new jobs arrive as
   PyTorchJobs with zero replicas: starting them is the actuator's call) and publishes the
   telemetry frame of the exporter.

The clock the twin shows (objects, trainer timestamps, `rlalloc_twin_clock_seconds`) is
`epoch_s` + simulated seconds. `script_failure` adds a deterministic failure to the simulator's
own failure process (`Simulator.schedule_failure`), so it is the simulator's failure in every
respect: the node reports XID errors from `warn_at_s`, goes down at `fail_at_s`, requeuing every
job still on it from its checkpoint, and is repaired `repair_s` later.

What happens is told as it happens (`on_event`, a `TwinEvent` each: a node's warning, failure
and repair at their simulated time, from the simulator's `health_listener`; a job's completion
at the tick that mirrors it) and summed up by `Twin.summary`, so that `rlalloc twin` can show a
user the failure they scripted and what the actuator did about it.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from rlalloc.actuator.k8s_names import HOSTNAME_LABEL, PLACEMENT_ANNOTATION, parse_placement
from rlalloc.actuator.twin.exporter import JobTelemetry, NodeTelemetry, PodTelemetry, TelemetryFrame
from rlalloc.actuator.twin.kube_api import EVENTS, NODES, PODS, PYTORCHJOBS, TwinKubeAPI
from rlalloc.actuator.twin.render import (
    TOTAL_STEPS,
    k8s_name,
    node_object,
    pod_object,
    state_job_object,
)
from rlalloc.env.failures import HealthEvent
from rlalloc.env.simulator import Simulator
from rlalloc.env.state import Action, ActionKind, ClusterState, JobStatus

log = logging.getLogger(__name__)

FLAP_HOLD_SCRAPES = 3.0
"""Scrape intervals a readiness flap stays visible in the kube-state-metrics series: more than
two, so at least one scrape sees it whatever the phase of the scrapes against the ticks."""


@dataclass
class _Pod:
    index: int
    node: str | None = None
    """None while Pending."""


@dataclass
class _Job:
    sim_id: str
    name: str
    pods: list[_Pod] = field(default_factory=list)
    written_pods: set[str] = field(default_factory=set)
    """Names of its pod objects in the API."""
    finished: bool = False


@dataclass(frozen=True)
class ScriptedFailure:
    """A node that warns (XID errors) from `warn_at_s` and fails at `fail_at_s` (sim seconds)."""

    node: str
    warn_at_s: float
    fail_at_s: float


@dataclass(frozen=True)
class TwinEvent:
    """Something a user watching the twin wants to know of, at simulated second `time_s`."""

    time_s: float
    kind: str
    """"warning" (a node starts reporting XID errors), "failed", "repaired" (its `subject` is
    the node) or "finished" (the subject is the PyTorchJob)."""
    subject: str
    requeued: tuple[str, ...] = ()
    """For "failed": the jobs that still had workers on the node, requeued from their
    checkpoints."""


@dataclass(frozen=True)
class TwinSummary:
    """What a twin's run came to, for the lines `rlalloc twin` ends with."""

    simulated_s: float
    jobs_finished: int
    jobs_in_system: int
    jobs_to_arrive: int
    warnings: int
    failures: int
    """Nodes that went down: scripted or drawn by the failure process."""
    scripted_failures: int
    """Failures scripted (`script_failure`), whether they have happened yet or not."""
    scripted_pending: int
    """Of those, the ones still to happen."""
    scripted_found_down: int
    """Of those, the ones whose node was already down at their time (failed before, by the
    failure process or another scripted failure): the simulator fails no node twice, so they
    add no failure of their own."""
    jobs_requeued: int
    """Times a failure hit a job (requeued it from its checkpoint)."""
    actuator_events: dict[str, int]
    """Events clients recorded in the API (the actuator: Started, Scaled, Migrated,
    ActionRefused, ...), by reason, repeats counted."""


_HEALTH_KINDS = {"warn": "warning", "fail": "failed", "repair": "repaired"}
"""`TwinEvent.kind` of each simulator health event kind a user is told of."""


class Twin:
    """The simulator mirrored into a `TwinKubeAPI` and an exporter frame (see module docstring).

    All methods run in the API server's thread (`ApiServerThread.call` / `every`).
    """

    def __init__(self, sim: Simulator, api: TwinKubeAPI, namespace: str = "default",
                 speed: float = 60.0, epoch_s: float = 0.0,
                 on_event: Callable[[TwinEvent], None] | None = None,
                 scrape_interval_s: float = 1.0) -> None:
        """`scrape_interval_s`: the Prometheus scrape interval, so that a readiness flap is
        held in the exporter long enough to be scraped (`FLAP_HOLD_SCRAPES`)."""
        self.sim = sim
        self.api = api
        self.on_event = on_event
        """Told each `TwinEvent` as it happens (in the twin's thread; keep it quick)."""
        self.event_counts: Counter[str] = Counter()
        """`TwinEvent` kinds so far."""
        sim.health_listener = self._on_health
        api.clock_s = lambda: self.clock_s  # the API's ages and timestamps: the twin's time
        self.namespace = namespace
        self.speed = speed
        self.epoch_s = epoch_s
        self._flap_hold_s = FLAP_HOLD_SCRAPES * scrape_interval_s
        self.frame = TelemetryFrame(epoch_s)
        self.failure_hits: dict[ScriptedFailure, tuple[str, ...]] = {}
        """Each scripted failure that took effect -> names of the jobs that still had workers
        on its node when it failed. Keyed by the failure, not the node: a node may be scripted
        to fail more than once."""
        self._target_s = sim.time_s
        self._jobs: dict[str, _Job] = {}
        self._scripted: list[ScriptedFailure] = []
        """Scripted failures that have not taken effect yet."""
        self._scripted_found_down: list[ScriptedFailure] = []
        """Scripted failures that came while their node was down (see `TwinSummary`)."""
        self._scripted_count = 0
        self._xid_code: dict[str, int] = {}
        self._xid_seen: dict[str, int] = {}
        self._ecc_total: dict[str, float] = {}
        self._ecc_seen: dict[str, int] = {}
        self._flaps_seen: dict[str, int] = {}
        self._flap_until: dict[str, float] = {}
        self._written: dict[tuple, dict] = {}
        self._mirror(self.sim.state())

    @property
    def clock_s(self) -> float:
        """The twin's clock: epoch + simulated seconds."""
        return self.epoch_s + max(self._target_s, self.sim.time_s)

    def job_name(self, sim_id: str) -> str:
        """The PyTorchJob name of a simulator job."""
        return self._jobs[sim_id].name if sim_id in self._jobs else k8s_name(sim_id)

    def script_failure(self, failure: ScriptedFailure) -> None:
        """Add a scripted warning-then-failure (see module docstring); ValueError for a node
        the cluster lacks or a failure before the twin's simulated now."""
        if failure.node not in self.sim.node_index:
            raise ValueError(f"no node {failure.node!r} in the cluster")
        if not self.sim.time_s <= failure.fail_at_s < float("inf"):
            raise ValueError(f"node {failure.node} would fail at simulated second "
                             f"{failure.fail_at_s:g}, not after the twin's now "
                             f"({self.sim.time_s:g})")
        lead_s = failure.fail_at_s - min(failure.warn_at_s, failure.fail_at_s)
        self.sim.schedule_failure(failure.node, failure.fail_at_s, warning_lead_s=lead_s)
        self._scripted.append(failure)
        self._scripted_count += 1

    def summary(self) -> TwinSummary:
        """The run so far (see `TwinSummary`)."""
        actuator_events: Counter[str] = Counter()
        for event in self.api.list(EVENTS):
            actuator_events[str(event.get("reason", ""))] += int(event.get("count") or 1)
        finished = self.sim.accounting.jobs_completed
        return TwinSummary(
            simulated_s=self.sim.time_s, jobs_finished=finished,
            jobs_in_system=self.sim.jobs_in_system,
            jobs_to_arrive=len(self.sim.job_ids) - finished - self.sim.jobs_in_system,
            warnings=self.event_counts["warning"], failures=self.event_counts["failed"],
            scripted_failures=self._scripted_count, scripted_pending=len(self._scripted),
            scripted_found_down=len(self._scripted_found_down),
            jobs_requeued=self.sim.accounting.failures,
            actuator_events=dict(actuator_events))

    def tick(self, wall_dt_s: float) -> None:
        """React to the API, advance `wall_dt_s` x speed simulated seconds, mirror back."""
        self._react()
        self._target_s += wall_dt_s * self.speed
        while not self.sim.done and self.sim.time_s < self._target_s:
            self.sim.advance()
        self._settle_scripted()
        self._mirror(self.sim.state())

    # --------------------------------------------------------------- operator + scheduler
    def _react(self) -> None:
        state = self.sim.state()
        cordoned = {n["metadata"]["name"] for n in self.api.list(NODES)
                    if (n.get("spec") or {}).get("unschedulable")}
        usable = {name for i, name in enumerate(state.nodes.name)
                  if state.nodes.ready[i] and name not in cordoned}
        live_pods = {p["metadata"]["name"] for p in self.api.list(PODS)
                     if p["metadata"].get("namespace") == self.namespace}
        for row, sim_id in enumerate(state.jobs.job_id):
            job = self._jobs.get(sim_id)
            obj = self.api.get(PYTORCHJOBS, self.namespace, job.name) if job else None
            if obj is None:
                continue
            state = self._reconcile(state, row, job, obj, usable, live_pods)

    def _reconcile(self, state: ClusterState, row: int, job: _Job, obj: dict,
                   usable: set[str], live_pods: set[str]) -> ClusterState:
        worker = obj["spec"]["pytorchReplicaSpecs"]["Worker"]
        low, high = int(state.jobs.min_workers[row]), int(state.jobs.max_workers[row])
        desired = min(max(int(worker.get("replicas", 0)), 0), high)
        pods = [p for p in job.pods
                if f"{job.name}-worker-{p.index}" in live_pods or p.node is None]
        pods = [p for p in pods if p.index < desired]
        have = {p.index for p in pods}
        pods += [_Pod(i) for i in range(desired) if i not in have]
        pods.sort(key=lambda p: p.index)
        names = state.nodes.name
        index = {name: i for i, name in enumerate(names)}
        per_worker = int(state.jobs.gpus_per_worker[row])  # each pod's GPUs, on one node
        free = state.nodes.gpus_free.astype(np.int64).copy()
        # its own GPUs are re-bound below
        np.add.at(free, list(state.jobs.placement[row]), per_worker)
        for pod in pods:
            if pod.node is not None:
                free[index[pod.node]] -= per_worker
        pending = [p for p in pods if p.node is None]
        if pending:
            allowed = _affinity_hosts(worker) or set(names)
            wanted = parse_placement((obj["metadata"].get("annotations") or {}).get(
                PLACEMENT_ANNOTATION, ""))
            for pod in pods:
                if pod.node is not None and wanted.get(pod.node, 0) > 0:
                    wanted[pod.node] -= 1
            bindings = _bind(len(pending), free // per_worker, names, usable & allowed, wanted)
            bound = len(pods) - len(pending)
            if bindings and bound + len(bindings) >= max(low, 1):
                for pod, node in zip(pending, bindings, strict=False):
                    pod.node = node
        running = [p for p in pods if p.node is not None]
        if 0 < len(running) < low:
            for pod in running:
                pod.node = None  # a partial gang cannot train: hand its GPUs back
            running = []
        job.pods = pods
        placement = tuple(sorted(index[p.node] for p in running))
        if placement == state.jobs.placement[row]:
            return state
        action = Action(ActionKind.SCALE, job.sim_id, len(placement),
                        tuple(names[i] for i in placement))
        if not self.sim.apply(action):
            log.warning("twin: simulator refused %s (%s)", action.describe(),
                        self.sim.validate(action))
            for pod in running:
                pod.node = None
            return state
        return self.sim.state()

    @staticmethod
    def _unbind_if_requeued(state: ClusterState, row: int, job: _Job) -> None:
        """Set Pending the workers of a job whose GPUs the simulator took back on its own: a
        node failure requeues every job on the node (all its workers, on every node). Left
        bound, the pods would show GPUs as used that the simulator has freed, and the next
        reconcile would hand it the old placement again, which it refuses ("not enough free
        GPUs" on the failed node). Only the simulator's failures take GPUs: every other change
        the twin makes itself, so a job's bound pods are otherwise within its placement."""
        held = Counter(state.nodes.name[i] for i in state.jobs.placement[row])
        bound = Counter(p.node for p in job.pods if p.node is not None)
        if bound - held:
            log.info("twin: %s lost its GPUs to a node failure; its workers are Pending",
                     job.name)
            for pod in job.pods:
                pod.node = None

    def _settle_scripted(self) -> None:
        """Set aside the scripted failures whose time has passed without the simulator telling
        of them (`_on_health` takes those it tells of): their node was already down, so they
        are no failure of their own and must not be counted as one. Strictly past: a failure
        due at the simulator's very now may not have been handled yet."""
        for failure in [f for f in self._scripted if f.fail_at_s < self.sim.time_s]:
            self._scripted.remove(failure)
            self._scripted_found_down.append(failure)
            log.info("twin: scripted failure of %s at %g s found the node already down",
                     failure.node, failure.fail_at_s)

    def _take_scripted(self, node: str, time_s: float) -> ScriptedFailure | None:
        """The scripted failure behind a failure of `node` at `time_s`, no longer pending; None
        for one of the failure process. `script_failure` schedules it at exactly its
        `fail_at_s`, so the time tells them apart."""
        for failure in self._scripted:
            if failure.node == node and failure.fail_at_s == time_s:
                self._scripted.remove(failure)
                return failure
        return None

    def _jobs_on(self, node: str) -> list[str]:
        """Names of the jobs with a worker bound to `node` (until the next mirror: also those
        a failure of the node has just requeued)."""
        return [job.name for job in self._jobs.values() if any(p.node == node for p in job.pods)]

    def _on_health(self, event: HealthEvent, time_s: float) -> None:
        """The simulator's `health_listener`: a node's warning, failure or repair, told as a
        `TwinEvent` (runs inside `sim.advance`, before the twin mirrors the change, so the
        pods still show which jobs a failure hit)."""
        kind = _HEALTH_KINDS[event.kind]  # the simulator tells no "calm" (an episode's end)
        node = self.sim.node_names[event.node]
        hits = tuple(self._jobs_on(node)) if kind == "failed" else ()
        scripted = self._take_scripted(node, time_s) if kind == "failed" else None
        if scripted is not None:
            self.failure_hits[scripted] = hits
            log.info("twin: node %s failed as scripted (jobs hit: %s)", node,
                     ", ".join(hits) or "none")
        self._report(TwinEvent(time_s, kind, node, hits))

    def _report(self, event: TwinEvent) -> None:
        """Count `event` and tell `on_event` of it."""
        self.event_counts[event.kind] += 1
        if self.on_event is not None:
            self.on_event(event)

    # ----------------------------------------------------------------------------- mirror
    def _mirror(self, state: ClusterState) -> None:
        nodes, jobs = state.nodes, state.jobs
        cordoned = {n["metadata"]["name"]: bool((n.get("spec") or {}).get("unschedulable"))
                    for n in self.api.list(NODES)}
        for i, name in enumerate(nodes.name):
            ready = bool(nodes.ready[i])
            self._write(NODES, None, name, node_object(
                name, int(nodes.gpus_total[i]), nodes.gpu_type[i], int(nodes.rack[i]), ready,
                cordoned.get(name, False)))
        active = set(jobs.job_id)
        for row, sim_id in enumerate(jobs.job_id):
            if sim_id not in self._jobs:
                self._jobs[sim_id] = _Job(sim_id, k8s_name(sim_id))
                self.api.put(PYTORCHJOBS, self.namespace, self._jobs[sim_id].name,
                             state_job_object(state, row, self.namespace,
                                              self._jobs[sim_id].name, 0, self.epoch_s))
            self._unbind_if_requeued(state, row, self._jobs[sim_id])
            self._mirror_job(state, row, self._jobs[sim_id])
        for job in self._jobs.values():
            if job.sim_id not in active and not job.finished:
                job.finished = True
                self._report(TwinEvent(self.sim.time_s, "finished", job.name))
                for pod_name in job.written_pods:
                    self._remove(PODS, self.namespace, pod_name)
                job.pods, job.written_pods = [], set()
                self.api.patch(PYTORCHJOBS, self.namespace, job.name, {"status": {
                    "conditions": [{"type": "Succeeded", "status": "True",
                                    "reason": "PyTorchJobSucceeded"}],
                    "replicaStatuses": {"Worker": {"active": 0, "succeeded": 1}}}})
        self.frame = self._telemetry(state, cordoned)

    def _mirror_job(self, state: ClusterState, row: int, job: _Job) -> None:
        existing = {f"{job.name}-worker-{p.index}" for p in job.pods}
        for pod_name in job.written_pods - existing:
            self._remove(PODS, self.namespace, pod_name)
        job.written_pods = existing
        restoring = state.jobs.status[row] != JobStatus.RUNNING
        per_worker = int(state.jobs.gpus_per_worker[row])
        for pod in job.pods:
            self._write(PODS, self.namespace, f"{job.name}-worker-{pod.index}",
                        pod_object(self.namespace, job.name, pod.index, pod.node,
                                   running=pod.node is not None, gpus=per_worker))
        active = sum(1 for p in job.pods if p.node is not None)
        condition = ("Running" if active and not restoring else
                     "Restarting" if active else "Created")
        self._write_status(job, {"replicaStatuses": {"Worker": {"active": active}},
                                 "conditions": [{"type": condition, "status": "True"}]})

    def _write_status(self, job: _Job, status: dict) -> None:
        key = (PYTORCHJOBS, self.namespace, job.name)
        if self._written.get(key) != status:
            self.api.patch(PYTORCHJOBS, self.namespace, job.name, {"status": status})
            self._written[key] = status

    def _write(self, resource: object, namespace: str | None, name: str, obj: dict) -> None:
        """Create or update an object the twin owns, only when it changed (keeps the
        actuator-owned `spec.unschedulable` of nodes as it is)."""
        key = (resource, namespace, name)
        if self._written.get(key) == obj and self.api.get(resource, namespace, name) is not None:
            return
        self.api.put(resource, namespace, name, obj)
        self._written[key] = obj

    def _remove(self, resource: object, namespace: str | None, name: str) -> None:
        self.api.remove(resource, namespace, name)
        self._written.pop((resource, namespace, name), None)

    # -------------------------------------------------------------------------- telemetry
    def _telemetry(self, state: ClusterState, cordoned: dict[str, bool]) -> TelemetryFrame:
        nodes, jobs = state.nodes, state.jobs
        checkpointed = self.sim.checkpointed_progress()  # `state` is the simulator's now
        now = self.clock_s
        wall = time.monotonic()
        node_frames = []
        for i, name in enumerate(nodes.name):
            xid = int(nodes.xid_errors_5m[i])
            if xid > self._xid_seen.get(name, 0):
                self._xid_code[name] = 79 if self._xid_code.get(name) != 79 else 48
            self._xid_seen[name] = xid
            ecc = int(nodes.ecc_errors_30m[i])
            self._ecc_total[name] = (self._ecc_total.get(name, 0.0)
                                     + max(ecc - self._ecc_seen.get(name, 0), 0))
            self._ecc_seen[name] = ecc
            flaps = int(nodes.ready_flaps_60m[i])
            if flaps > self._flaps_seen.get(name, 0):
                self._flap_until[name] = wall + self._flap_hold_s
            self._flaps_seen[name] = flaps
            ready = bool(nodes.ready[i])
            used = int(nodes.gpus_total[i] - nodes.gpus_free[i]) if ready else 0
            node_frames.append(NodeTelemetry(
                name=name, gpus=int(nodes.gpus_total[i]), gpus_used=used,
                temperature_c=float(nodes.temperature_c[i]),
                xid_code=self._xid_code.get(name, 0), ecc_total=self._ecc_total[name],
                ready=ready, ready_metric=ready and wall >= self._flap_until.get(name, 0.0),
                unschedulable=cordoned.get(name, False)))
        job_frames, pod_frames = [], []
        for row, sim_id in enumerate(jobs.job_id):
            job = self._jobs[sim_id]
            for pod in job.pods:
                pod_frames.append(PodTelemetry(self.namespace, f"{job.name}-worker-{pod.index}",
                                               pod.node or "", "Running" if pod.node
                                               else "Pending", int(jobs.gpus_per_worker[row])))
            if jobs.workers[row] == 0:
                continue
            running = jobs.status[row] == JobStatus.RUNNING
            job_frames.append(JobTelemetry(
                self.namespace, job.name, float(jobs.throughput[row]) if running else 0.0,
                float(jobs.progress[row]) * TOTAL_STEPS, TOTAL_STEPS, int(jobs.workers[row]),
                now - float(jobs.since_checkpoint_s[row]), float(checkpointed[row]) * TOTAL_STEPS))
        return TelemetryFrame(now, tuple(node_frames), tuple(job_frames), tuple(pod_frames))


def _affinity_hosts(worker: dict) -> set[str]:
    """Host names allowed by the pod template's required node affinity (empty: any)."""
    affinity = ((worker.get("template") or {}).get("spec") or {}).get("affinity") or {}
    required = ((affinity.get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    hosts: set[str] = set()
    for term in required.get("nodeSelectorTerms") or []:
        for expression in term.get("matchExpressions") or []:
            if expression.get("key") == HOSTNAME_LABEL and expression.get("operator") == "In":
                hosts |= set(expression.get("values") or [])
    return hosts


def _bind(count: int, free: np.ndarray, names: tuple[str, ...], allowed: set[str],
          wanted: dict[str, int]) -> list[str]:
    """Nodes for `count` pending pods, given the pods each node has room for (`free`: its free
    GPUs // a pod's GPUs, so a pod's GPUs are all on its node): the wanted per-node counts
    first, then the allowed node with the most room (packing the job on few nodes). May
    return fewer than `count`."""
    free = free.copy()
    index = {name: i for i, name in enumerate(names)}
    chosen: list[str] = []
    for node, count_wanted in sorted(wanted.items()):
        if node not in allowed or node not in index:
            continue
        take = min(count_wanted, int(free[index[node]]), count - len(chosen))
        chosen += [node] * max(take, 0)
        free[index[node]] -= max(take, 0)
    candidates = [index[n] for n in allowed if n in index]
    while len(chosen) < count and candidates:
        best = max(candidates, key=lambda i: (free[i], -i))
        take = min(int(free[best]), count - len(chosen))
        if take <= 0:
            break
        chosen += [names[best]] * take
        free[best] -= take
    return chosen
