"""Failed moves: when a job's next try may come, what the tries cost the disruption budget, and
when the actuator gives a move up. Pure, no I/O (the loop makes the writes).

A move that fails, wholly or after its first writes landed (a failover that patched the job's
affinity and cordoned the node, then could not delete the pods), is not tried again every cycle:
the job waits `move_backoff_s`, doubled with each further failure up to `move_backoff_max_s`,
and a success resets it. The tries of one move count once against the hourly disruption budget,
and only once one of them restarted running workers (a failover whose pod deletions were all
refused disrupted nobody): the cap protects jobs from churn, and the actuator's own failures
spent it for the whole cluster. After `max_move_failures` consecutive failures the move is given
up: a half-applied one is rolled back, the job is marked (`HELD_ANNOTATION`, an Event) and left
alone until its state changes (`job_fingerprint`) or someone removes the mark.

The record lives in the job's annotations (`MOVE_FAILURES_ANNOTATION`), read back every cycle,
so a restarted actuator or a new leader keeps a job's backoff and mark instead of starting
over, which would be a tight loop of tries again.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from rlalloc.actuator.config import ActuatorConfig
from rlalloc.actuator.k8s_names import HELD_ANNOTATION, MOVE_FAILURES_ANNOTATION
from rlalloc.actuator.state_builder import JobRef
from rlalloc.env.state import Action, ActionKind

GIVEN_UP_REASON = "MoveGivenUp"
"""Reason of the Event, and first word of the mark, of a move given up."""
_MAX_DOUBLINGS = 60
"""The backoff's exponent stops here (2.0 ** a large count overflows; the cap is long reached)."""
_ERROR_CHARS = 300
"""Of a failure's error, what the record and the mark keep."""


@dataclass(frozen=True)
class MoveFailure:
    """A job's failing move, as remembered between its tries."""

    action: Action
    """The move (the latest one tried)."""
    failures: int
    """Consecutive failed tries of the job's moves."""
    last_s: float
    """Cluster time (Unix seconds) of the latest try."""
    error: str = ""
    """Why the latest try failed."""
    pending: bool = False
    """Half applied: a try's first writes landed and its last did not; a later try completes
    it, or it is rolled back."""
    counted: bool = False
    """A try restarted running workers, which counted against the hourly disruption budget:
    later tries of the same move do not count again."""
    cordoned: str = ""
    """The node a try cordoned, which a roll-back lifts ("" none)."""
    held_since: float | None = None
    """When the move was given up (the job is left alone); None while it is tried."""
    fingerprint: str = ""
    """The job's state when the move was given up (`job_fingerprint`)."""

    @property
    def held(self) -> bool:
        """The move was given up and the job is left alone."""
        return self.held_since is not None


def backoff_s(failures: int, config: ActuatorConfig) -> float:
    """How long a job waits after `failures` consecutive failed tries before the next one:
    `move_backoff_s`, doubled for each failure after the first, at most `move_backoff_max_s`
    (0 before any failure)."""
    if failures <= 0:
        return 0.0
    doubled = config.move_backoff_s * 2.0 ** min(failures - 1, _MAX_DOUBLINGS)
    return min(doubled, config.move_backoff_max_s)


def next_try_s(record: MoveFailure, now_s: float, config: ActuatorConfig) -> float:
    """Cluster time from which the job of `record` may be changed again, seen at `now_s`: a
    latest try recorded ahead of now (a hand edit, a clock set back) is taken as now, so no
    record holds a job back longer than `move_backoff_max_s`."""
    return min(record.last_s, now_s) + backoff_s(record.failures, config)


def waiting_reason(record: MoveFailure, now_s: float, config: ActuatorConfig) -> str:
    """Why the job of `record` may not be changed at `now_s` ("" when it may): its move was
    given up, or it is in its backoff."""
    if record.held:
        return (f"move given up after {record.failures} failed tries: the job is left alone "
                f"until it, its pods or its nodes change, or {HELD_ANNOTATION} is removed")
    wait = next_try_s(record, now_s, config) - now_s
    if wait > 0:
        tries = "try" if record.failures == 1 else "tries"
        return f"backoff: {record.failures} failed {tries}, next try in {wait:.0f}s"
    return ""


def same_move(a: Action, b: Action) -> bool:
    """Whether `a` and `b` are tries of one move: the same job and kind, and the same node to
    leave (a failover) or the same worker count (a resize), wherever the policy puts it."""
    return (a.job_id, a.kind, a.from_node if a.kind == ActionKind.MIGRATE else a.workers) == (
        b.job_id, b.kind, b.from_node if b.kind == ActionKind.MIGRATE else b.workers)


def counts_against_budget(record: MoveFailure | None, action: Action, disruptive: bool) -> bool:
    """Whether a try of `action` (`disruptive`: it restarts running workers) is a new
    disruption for the hourly budget: not when an earlier try of the same move counted one."""
    return disruptive and not (record is not None and record.counted
                               and same_move(record.action, action))


def after_failure(record: MoveFailure | None, action: Action, now_s: float, error: str, *,
                  changed: bool, counted: bool, cordoned: str) -> MoveFailure:
    """The record once a try of `action` at `now_s` failed with `error`: one failure more;
    half applied if a write changed the job, or may have (`changed`), now or in an earlier try
    not rolled back; `counted` if this try counted a disruption, or an earlier try of the same
    move did; the node it cordoned (`cordoned`), or the one an earlier try did."""
    same = record is not None and same_move(record.action, action)
    return MoveFailure(
        action=action, failures=(record.failures if record else 0) + 1, last_s=now_s,
        error=" ".join(error.split())[:_ERROR_CHARS],
        pending=changed or (record is not None and record.pending),
        counted=counted or (same and record.counted),
        cordoned=cordoned or (record.cordoned if record is not None else ""))


def give_up(record: MoveFailure, now_s: float, fingerprint: str) -> MoveFailure:
    """`record` once its move is given up at `now_s`, the job being in state `fingerprint`."""
    return replace(record, held_since=now_s, fingerprint=fingerprint)


def job_fingerprint(ref: JobRef, ready: Mapping[str, bool]) -> str:
    """A digest of what makes a given-up move worth another try when it changes: the job's spec
    (but for the node affinity, which rlalloc writes itself, a roll-back too), its worker pods
    (name, uid and node: one deleted, recreated or moved), and whether each node in `ready`
    (those of the move and of its workers) is Ready. Neither the cordons (a roll-back lifts
    one) nor telemetry (XID counts change every cycle) are in it."""
    spec = copy.deepcopy(ref.obj.get("spec") or {})
    worker = (spec.get("pytorchReplicaSpecs") or {}).get("Worker") or {}
    ((worker.get("template") or {}).get("spec") or {}).pop("affinity", None)
    state = {"spec": spec, "pods": sorted((p.name, p.uid, p.node) for p in ref.pods),
             "ready": sorted(ready.items())}
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()[:16]


def nodes_involved(ref: JobRef, action: Action) -> set[str]:
    """The nodes whose readiness a given-up move depends on: its own and its job's workers'."""
    return set(action.nodes) | ({action.from_node} - {""}) | {p.node for p in ref.pods}


def release_reason(record: MoveFailure, annotations: Mapping[str, str], fingerprint: str,
                   recorded: bool) -> str:
    """Why the hold of a given-up move ends ("" when the job stays held): the job's state is
    no longer `record.fingerprint`, or someone removed the mark from its `annotations` (only
    when the record was read from them, `recorded`: a mark whose write failed was never
    there)."""
    if not record.held:
        return ""
    if fingerprint != record.fingerprint:
        return "the job, its pods or its nodes changed since it was given up"
    if recorded and HELD_ANNOTATION not in annotations:
        return f"{HELD_ANNOTATION} was removed"
    return ""


def held_text(record: MoveFailure) -> str:
    """The mark a person reads on the job (`HELD_ANNOTATION`): why and since when."""
    since = datetime.fromtimestamp(record.held_since or 0.0, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    tries = "time" if record.failures == 1 else "times"
    return (f"{GIVEN_UP_REASON}: {record.action.describe()} failed {record.failures} {tries} "
            f"({record.error}) since {since}")


def record_annotations(record: MoveFailure | None) -> dict[str, str | None]:
    """The annotations (a merge patch's: None removes one) that record `record` on its job,
    or clear the record (None)."""
    if record is None:
        return {MOVE_FAILURES_ANNOTATION: None, HELD_ANNOTATION: None}
    action = record.action
    document = {"move": {"kind": ActionKind(action.kind).name.lower(), "workers": action.workers,
                         "nodes": list(action.nodes), "from": action.from_node},
                "failures": record.failures, "last_s": record.last_s, "error": record.error,
                "pending": record.pending, "counted": record.counted,
                "cordoned": record.cordoned, "held_since": record.held_since,
                "fingerprint": record.fingerprint}
    return {MOVE_FAILURES_ANNOTATION: json.dumps(document, separators=(",", ":")),
            HELD_ANNOTATION: held_text(record) if record.held else None}


def recorded_failure(annotations: Mapping[str, str], job_id: str) -> MoveFailure | None:
    """The record of `job_id`'s failing move in its `annotations` (`record_annotations`), or
    None: none there, or one that is not readable (a user's edit must not stop the actuator)."""
    text = annotations.get(MOVE_FAILURES_ANNOTATION)
    if not text:
        return None
    try:
        document = json.loads(text)
        move = document["move"]
        kind = ActionKind[str(move["kind"]).upper()]
        if kind not in (ActionKind.SCALE, ActionKind.MIGRATE):
            return None
        action = Action(kind, job_id, int(move["workers"]),
                        tuple(str(node) for node in move["nodes"]), str(move.get("from") or ""))
        held_since = document.get("held_since")
        return MoveFailure(
            action=action, failures=int(document["failures"]),
            last_s=float(document["last_s"]), error=str(document.get("error") or ""),
            pending=bool(document.get("pending")), counted=bool(document.get("counted")),
            cordoned=str(document.get("cordoned") or ""),
            held_since=None if held_since is None else float(held_since),
            fingerprint=str(document.get("fingerprint") or ""))
    except (ValueError, KeyError, TypeError, AttributeError, AssertionError):
        return None
