"""The act step: an accepted `Action` -> Kubernetes writes.

- Scale (n > 0) with node affinity on: one JSON merge patch of the PyTorchJob setting
  `Worker.replicas`, the pod template's required node affinity (the policy's nodes, added to
  every existing node-selector term so the user's own constraints still hold) and the placement
  annotation (workers per node: a worker of k GPUs is one pod, placed whole on one node, so the
  counts are of workers whatever k is). One request, so the count and the placement change
  together or not at all. Existing workers on nodes the new placement does not use are then
  deleted, so the training operator recreates them where the affinity says.
- Scale with node affinity off, and every suspend (n = 0): the `/scale` subresource, after
  a merge patch of the annotations below and, where rlalloc has not yet recorded it, the
  requested workers (the request is otherwise read from `Worker.replicas`, which the scale
  overwrites). The placement annotation is then set to the policy's nodes (a preference only,
  unpinned), or removed by a suspend, so it does not go on naming an earlier placement.
- Every change is also recorded in the job's annotations (`rlalloc.io/last-change`,
  `rlalloc.io/disruptions`: `guardrails.history_annotations`), read back each cycle, so that the
  cooldown and the hourly disruption cap hold across a restart or a new leader: in the placement
  patch, or after the `/scale` or the move's deletions. A placement patch with later writes to
  come (a cordon, deletions) records the move as in flight instead (`in_flight_record`, the
  job's failed-moves record, half applied) and no disruption; a last write after the
  deletions records the disruption, if one happened, and clears the record. A replica killed
  in between leaves the record, from which the next leader completes the move (a retry), and
  no disruption recorded for workers nobody restarted.
- Migrate (failover): pin the job to its new nodes (as above), cordon the failing node, then
  delete the job's pods there and on any other node the new placement leaves — with grace 0
  when the node is unreachable, since a pod stuck Terminating on a dead kubelet would block its
  replacement. Pods are deleted by uid, so a retried delete cannot hit the operator's
  replacement of the same name. Each step is idempotent and safe on its own, and the
  disruptive one comes last. A failure after a first write that landed (a resize patched, a
  pod deletion refused) leaves the move half applied: `Applier.changed` says so, and
  `Applier.disrupted` whether running workers were restarted by then (a pod deleted, the worker
  count of a running job changed), and `Applier.unanswered` whether the failed write may have
  landed all the same (no answer, a 5xx); the loop tries the same move again after its backoff
  (`failed_moves`), which completes it, or rolls it back (`Applier.roll_back`).
- A success also removes the record of the job's failed tries and its mark
  (`failed_moves.record_annotations`), in the same write as the history.

Every PyTorchJob patch is validated against the Training Operator's CRD schema before it is
sent (`validate`: in `rlalloc actuate`, the CRD the cluster has installed), and sent with strict
field validation, so the API server refuses a field it does not know instead of dropping it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

from rlalloc.actuator.config import ActuatorConfig
from rlalloc.actuator.failed_moves import MoveFailure, record_annotations, same_move
from rlalloc.actuator.guardrails import history_annotations
from rlalloc.actuator.k8s_names import (
    HOSTNAME_LABEL,
    PLACEMENT_ANNOTATION,
    REQUESTED_WORKERS_ANNOTATION,
    format_placement,
)
from rlalloc.actuator.kube import KubeClient, KubeError
from rlalloc.actuator.state_builder import BuiltState, JobRef, PodRef
from rlalloc.env.placement import requested_workers
from rlalloc.env.state import Action, ActionKind


class Applier:
    """Carries out accepted actions on the cluster through a `KubeClient`."""

    def __init__(self, kube: KubeClient, config: ActuatorConfig,
                 validate: Callable[[dict], None]) -> None:
        """`validate`: raises `PyTorchJobValidationError` for a PyTorchJob the CRD would refuse
        (a `crd_schema.PyTorchJobValidator`)."""
        self._kube = kube
        self._config = config
        self._validate = validate
        self.changed = False
        """Whether the last `apply` wrote anything to the cluster, also when it then failed."""
        self.disrupted = False
        """Whether the last `apply` restarted running workers, also when it then failed: a pod
        deleted, or the worker count of a job with workers changed."""
        self.cordoned = ""
        """The node the last `apply` cordoned ("" none)."""
        self.unanswered = False
        """Whether the write the last `apply` failed on may have landed all the same: no
        answer, or a 5xx after the retries (the API server may have committed it)."""

    def apply(self, action: Action, built: BuiltState, counted: bool = False,
              record: MoveFailure | None = None) -> None:
        """Carry out `action` (`counted`: it counts against the hourly disruption budget;
        `record`: the job's record of failed tries, `failed_moves`);
        raises `KubeError` (or a validation error) when it could not (`changed`, `disrupted`
        and `cordoned` say what had landed by then). The change is recorded in the job's
        annotations (`guardrails.history_annotations`), so the cooldown and the disruption cap
        outlive this process: in the placement patch that is the change, or, for `/scale` and a
        move without node affinity, once the change is made (an annotation written before a
        `/scale` that then failed held a job in cooldown for a change that never happened)."""
        self.changed, self.disrupted, self.cordoned = False, False, ""
        self.unanswered = False
        try:
            self._write(action, built, counted, record)
        except KubeError as err:
            self.unanswered = err.status == 0 or err.status >= 500
            raise

    def _write(self, action: Action, built: BuiltState, counted: bool,
               record: MoveFailure | None) -> None:
        """The writes of `apply`, in order, each setting what it changed."""
        ref = built.jobs[action.job_id]
        row = built.state.job_index(action.job_id)
        jobs = built.state.jobs
        requested = int(requested_workers(built.state, row))
        running = bool(jobs.workers[row] > 0)
        current = ref.obj["metadata"].get("annotations") or {}
        recorded = {**history_annotations(current, built.state.time_s, counted),
                    **{key: None for key in record_annotations(None) if key in current}}
        if action.kind == ActionKind.SCALE and (action.workers == 0
                                                or not self._config.node_affinity):
            if first := request_annotation(ref, requested):
                # before the first /scale: read back from `Worker.replicas` afterwards, the
                # request would be the size rlalloc chose (0 after a suspend), not the user's
                self._patch(ref, {"metadata": {"annotations": first}}, changes_job=False)
            self._kube.scale_pytorchjob(ref.namespace, ref.name, action.workers)
            self.changed = True
            self.disrupted = running and action.workers != worker_replicas(ref)
            recorded[PLACEMENT_ANNOTATION] = format_placement(action.nodes) or None
            self._patch(ref, {"metadata": {"annotations": recorded}}, changes_job=False)
            return
        cordon = action.kind == ActionKind.MIGRATE and not is_cordoned(built, action.from_node)
        leftover = leftover_pods(ref, action, self._config.node_affinity)
        in_flight = self._config.node_affinity and bool(cordon or leftover)
        if self._config.node_affinity:
            patch = placement_patch(ref, action, requested)
            resized = running and len(action.nodes) != worker_replicas(ref)
            if in_flight:  # the disruption is recorded by the write after the deletions
                patch["metadata"]["annotations"].update({
                    **history_annotations(current, built.state.time_s, counted and resized),
                    **record_annotations(in_flight_record(record, action, built.state.time_s,
                                                          counted and resized))})
            else:
                patch["metadata"]["annotations"].update(recorded)
            self._patch(ref, patch)
            self.disrupted = resized
        if cordon:
            self._kube.cordon(action.from_node)
            self.changed, self.cordoned = True, action.from_node
        for pod in leftover:
            grace = 0 if pod.node in built.unreachable_nodes else self._config.pod_grace_s
            if self._kube.delete_pod(pod.namespace, pod.name, grace, pod.uid):
                self.changed, self.disrupted = True, True
        if in_flight:
            self._patch(ref, {"metadata": {"annotations": {
                **history_annotations(current, built.state.time_s, counted and self.disrupted),
                **record_annotations(None)}}}, changes_job=False)
        if not self._config.node_affinity:
            recorded[PLACEMENT_ANNOTATION] = format_placement(action.nodes)
            self._patch(ref, {"metadata": {"annotations": recorded}}, changes_job=False)

    def roll_back(self, action: Action, built: BuiltState, cordoned: str,
                  annotations: dict[str, str | None]) -> None:
        """Undo what a half-applied `action` changed, to a consistent state: lift the cordon
        it set (`cordoned`), unless the job's workers have left that node (it was drained,
        and a node being drained stays cordoned), then pin the job to the nodes its workers
        are on now (with node affinity; the placement annotation likewise), writing
        `annotations` (the failure record) in the same patch. Its worker count stays (a
        resize's changed count is undone by no write: that would restart the job again).
        Raises `KubeError` (or a validation error) when it could not; each step is
        idempotent."""
        ref = built.jobs[action.job_id]
        if cordoned and is_cordoned(built, cordoned) and any(
                p.node == cordoned for p in ref.pods):
            self._kube.uncordon(cordoned)
        patch = (pin_patch(ref, tuple(p.node for p in ref.pods)) if self._config.node_affinity
                 else {"metadata": {"annotations": {}}})
        patch["metadata"]["annotations"].update(annotations)
        self._patch(ref, patch, changes_job=False)

    def annotate(self, ref: JobRef, annotations: dict[str, str | None]) -> None:
        """Merge-patch the job's `annotations` (None removes one): records, nothing that
        runs."""
        self._patch(ref, {"metadata": {"annotations": annotations}}, changes_job=False)

    def _patch(self, ref: JobRef, patch: dict, changes_job: bool = True) -> None:
        """Merge-patch the PyTorchJob, validated as it would be stored (`changes_job`: False
        for annotations alone, which change nothing that runs)."""
        self._validate(merge_patch(ref.obj, patch))
        self._kube.patch_pytorchjob(ref.namespace, ref.name, patch)
        self.changed |= changes_job


def in_flight_record(record: MoveFailure | None, action: Action, now_s: float,
                     counted: bool) -> MoveFailure:
    """The record a move's first write leaves on its job while its later writes are to come
    (the cordon, the deletions): half applied, its failed tries (`record`'s) unchanged, and
    `counted` when that write restarted running workers and counted it (or an earlier try of
    the same move did). A replica that dies before the move's last write leaves it there, and
    the next leader completes the move (a retry) instead of leaving it half applied."""
    same = record is not None and same_move(record.action, action)
    return MoveFailure(
        action=action, failures=record.failures if record else 0,
        last_s=record.last_s if record else now_s, error=record.error if record else "",
        pending=True, counted=counted or (same and record.counted),
        cordoned=record.cordoned if record else "")


def request_annotation(ref: JobRef, requested_workers: int) -> dict[str, str]:
    """The requested-workers annotation to add on rlalloc's first change of the job (none once
    it is there): from then on `Worker.replicas` is rlalloc's choice, not the user's."""
    if REQUESTED_WORKERS_ANNOTATION in (ref.obj["metadata"].get("annotations") or {}):
        return {}
    return {REQUESTED_WORKERS_ANNOTATION: str(requested_workers)}


def placement_patch(ref: JobRef, action: Action, requested_workers: int) -> dict:
    """Merge patch pinning the job's workers to `action.nodes` (and recording the request)."""
    patch = pin_patch(ref, action.nodes)
    patch["metadata"]["annotations"].update(request_annotation(ref, requested_workers))
    patch["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = len(action.nodes)
    return patch


def pin_patch(ref: JobRef, nodes: tuple[str, ...]) -> dict:
    """Merge patch of the job's required node affinity and placement annotation: its workers
    on `nodes` (one name a worker), added to every node-selector term of the user's so their
    own constraints still hold; with no `nodes`, rlalloc's constraint and annotation
    removed."""
    worker = (ref.obj.get("spec", {}).get("pytorchReplicaSpecs") or {}).get("Worker") or {}
    pod_spec = (worker.get("template") or {}).get("spec") or {}
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    ours = ([{"key": HOSTNAME_LABEL, "operator": "In", "values": sorted(set(nodes))}]
            if nodes else [])
    terms = []
    for term in required.get("nodeSelectorTerms") or [{}]:
        expressions = [e for e in term.get("matchExpressions") or []
                       if e.get("key") != HOSTNAME_LABEL] + ours
        if expressions or any(v for k, v in term.items() if k != "matchExpressions"):
            terms.append({**term, "matchExpressions": expressions})
    return {
        "metadata": {"annotations": {PLACEMENT_ANNOTATION: format_placement(nodes) or None}},
        "spec": {"pytorchReplicaSpecs": {"Worker": {
            "template": {"spec": {"affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": (
                    {"nodeSelectorTerms": terms} if terms else None)}}}},
        }}},
    }


def worker_replicas(ref: JobRef) -> int:
    """The job's `Worker.replicas` as read (the count the operator runs)."""
    worker = (ref.obj.get("spec", {}).get("pytorchReplicaSpecs") or {}).get("Worker") or {}
    return int(worker.get("replicas", 1))


def is_cordoned(built: BuiltState, node: str) -> bool:
    """Whether `node` was cordoned when the cluster was read (a node not listed is not)."""
    names = built.state.nodes.name
    return node in names and bool(built.state.nodes.cordoned[names.index(node)])


def leftover_pods(ref: JobRef, action: Action, node_affinity: bool) -> list[PodRef]:
    """The job's pods `action` still has to delete: every one on the node it leaves (with
    grace 0 where that is unreachable: one the operator removes itself, of an index beyond
    the count, would stay Terminating on a dead kubelet and block its name), and, with node
    affinity, those on nodes its placement does not give them, which keep running there (the
    affinity is IgnoredDuringExecution) unless deleted. None left: the move is complete."""
    leaving = [p for p in ref.pods if p.node == action.from_node] if action.from_node else []
    if node_affinity:
        leaving += [p for p in misplaced_pods(ref.pods, action) if p not in leaving]
    return leaving


def misplaced_pods(pods: tuple[PodRef, ...], action: Action) -> list[PodRef]:
    """Pods the operator keeps after the resize (index < n) but on nodes the placement does not
    give them; the highest indices leave first, as the operator scales down."""
    room: dict[str, int] = {}
    for node in action.nodes:
        room[node] = room.get(node, 0) + 1
    leaving = []
    for pod in sorted(pods, key=lambda p: p.index):
        if pod.index >= action.workers:
            continue  # removed by the operator itself
        if room.get(pod.node, 0) > 0:
            room[pod.node] -= 1
        else:
            leaving.append(pod)
    return leaving


def merge_patch(target: dict, patch: dict) -> dict:
    """RFC 7386 JSON merge patch of `target` (a new dict; `target` is not changed)."""
    result = copy.deepcopy(target)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merge_patch(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result
