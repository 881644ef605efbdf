"""The act step: an accepted `Action` -> Kubernetes writes.

- Scale (n > 0) with node affinity on: one JSON merge patch of the PyTorchJob setting
  `Worker.replicas`, the pod template's required node affinity (the policy's nodes, added to
  every existing node-selector term so the user's own constraints still hold) and the placement
  annotation (per-node counts). One request, so the count and the placement change together or
  not at all. Existing workers on nodes the new placement does not use are then deleted, so the
  training operator recreates them where the affinity says.
- Scale with node affinity off, and every suspend (n = 0): the `/scale` subresource, after
  a merge patch of the annotations below and, where rlalloc has not yet recorded it, the
  requested workers (the request is otherwise read from `Worker.replicas`, which the scale
  overwrites).
- Every change is also recorded in the job's annotations (`rlalloc.io/last-change`,
  `rlalloc.io/disruptions`: `guardrails.history_annotations`), read back each cycle, so that the
  cooldown and the hourly disruption cap hold across a restart or a new leader: in the placement
  patch, or after the `/scale` or the move's deletions.
- Migrate (failover): pin the job to its new nodes (as above), cordon the failing node, then
  delete the job's pods there and on any other node the new placement leaves — with grace 0
  when the node is unreachable, since a pod stuck Terminating on a dead kubelet would block its
  replacement. Pods are deleted by uid, so a retried delete cannot hit the operator's
  replacement of the same name. Each step is idempotent and safe on its own, and the
  disruptive one comes last. A failure after a first write that landed (a resize patched, a
  pod deletion refused) still changed the job: `Applier.changed` says so, and the loop counts
  it against the job's cooldown and the disruption caps, or a missing `pods/delete` permission
  restarted the same job every cycle.

Every PyTorchJob patch is validated against the Training Operator's CRD schema before it is
sent (`validate`: in `rlalloc actuate`, the CRD the cluster has installed), and sent with strict
field validation, so the API server refuses a field it does not know instead of dropping it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

from rlalloc.actuator.config import ActuatorConfig
from rlalloc.actuator.guardrails import history_annotations
from rlalloc.actuator.k8s_names import (
    HOSTNAME_LABEL,
    PLACEMENT_ANNOTATION,
    REQUESTED_WORKERS_ANNOTATION,
    format_placement,
)
from rlalloc.actuator.kube import KubeClient
from rlalloc.actuator.state_builder import BuiltState, JobRef, PodRef
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

    def apply(self, action: Action, built: BuiltState, disruptive: bool = False) -> None:
        """Carry out `action` (`disruptive`: it restarts running workers); raises `KubeError`
        (or a validation error) when it could not (`changed` says whether a write had landed by
        then). The change is recorded in the job's annotations
        (`guardrails.history_annotations`), so the cooldown and the disruption cap outlive this
        process: in the placement patch that is the change, or, for `/scale` and a move without
        node affinity, once the change is made (an annotation written before a `/scale` that
        then failed held a job in cooldown for a change that never happened)."""
        self.changed = False
        ref = built.jobs[action.job_id]
        row = built.state.job_index(action.job_id)
        requested = int(built.state.jobs.requested_gpus[row])
        recorded = history_annotations(ref.obj["metadata"].get("annotations") or {},
                                       built.state.time_s, disruptive)
        if action.kind == ActionKind.SCALE and (action.workers == 0
                                                or not self._config.node_affinity):
            if first := request_annotation(ref, requested):
                # before the first /scale: read back from `Worker.replicas` afterwards, the
                # request would be the size rlalloc chose (0 after a suspend), not the user's
                self._patch(ref, {"metadata": {"annotations": first}}, changes_job=False)
            self._kube.scale_pytorchjob(ref.namespace, ref.name, action.workers)
            self.changed = True
            self._patch(ref, {"metadata": {"annotations": recorded}}, changes_job=False)
            return
        if self._config.node_affinity:
            patch = placement_patch(ref, action, requested)
            patch["metadata"]["annotations"].update(recorded)
            self._patch(ref, patch)
        if action.kind == ActionKind.MIGRATE and (
                action.from_node not in built.state.nodes.name
                or not built.state.nodes.cordoned[built.state.nodes.name.index(action.from_node)]):
            self._kube.cordon(action.from_node)
            self.changed = True
        # every pod on a failing node goes, with grace 0 where it is unreachable (one the operator
        # removes itself, of an index beyond the count, would stay Terminating on a dead kubelet
        # and block its name); a pinned move's placement may leave healthy nodes too, whose
        # pods keep running there (the affinity is IgnoredDuringExecution) unless deleted
        leaving = [p for p in ref.pods if p.node == action.from_node]
        if self._config.node_affinity:
            leaving += [p for p in misplaced_pods(ref.pods, action) if p not in leaving]
        for pod in leaving:
            grace = 0 if pod.node in built.unreachable_nodes else self._config.pod_grace_s
            self._kube.delete_pod(pod.namespace, pod.name, grace, pod.uid)
            self.changed = True
        if not self._config.node_affinity:
            self._patch(ref, {"metadata": {"annotations": recorded}}, changes_job=False)

    def _patch(self, ref: JobRef, patch: dict, changes_job: bool = True) -> None:
        """Merge-patch the PyTorchJob, validated as it would be stored (`changes_job`: False
        for annotations alone, which change nothing that runs)."""
        self._validate(merge_patch(ref.obj, patch))
        self._kube.patch_pytorchjob(ref.namespace, ref.name, patch)
        self.changed |= changes_job


def request_annotation(ref: JobRef, requested_workers: int) -> dict[str, str]:
    """The requested-workers annotation to add on rlalloc's first change of the job (none once
    it is there): from then on `Worker.replicas` is rlalloc's choice, not the user's."""
    if REQUESTED_WORKERS_ANNOTATION in (ref.obj["metadata"].get("annotations") or {}):
        return {}
    return {REQUESTED_WORKERS_ANNOTATION: str(requested_workers)}


def placement_patch(ref: JobRef, action: Action, requested_workers: int) -> dict:
    """Merge patch pinning the job's workers to `action.nodes` (and recording the request)."""
    annotations = {PLACEMENT_ANNOTATION: format_placement(action.nodes),
                   **request_annotation(ref, requested_workers)}
    worker = (ref.obj.get("spec", {}).get("pytorchReplicaSpecs") or {}).get("Worker") or {}
    pod_spec = (worker.get("template") or {}).get("spec") or {}
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    ours = {"key": HOSTNAME_LABEL, "operator": "In", "values": sorted(set(action.nodes))}
    terms = []
    for term in required.get("nodeSelectorTerms") or [{}]:
        expressions = [e for e in term.get("matchExpressions") or []
                       if e.get("key") != HOSTNAME_LABEL]
        terms.append({**term, "matchExpressions": expressions + [ours]})
    return {
        "metadata": {"annotations": annotations},
        "spec": {"pytorchReplicaSpecs": {"Worker": {
            "replicas": len(action.nodes),
            "template": {"spec": {"affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": terms}}}}},
        }}},
    }


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
