"""The control loop: observe -> build state -> decide (policy + guardrails) -> act, every cycle.

Everything with side effects is injected (Kubernetes client, metrics source, policy), so the
same loop runs in the cluster, against the digital twin and in tests. A cycle that cannot observe
(Prometheus or the API down or slow) makes no move and turns /healthz red, and the loop keeps
going; a standby replica only tries to take the lease. Only actions that changed the job (applied,
or, in dry-run, would have been, or failed after a first write landed) enter the guardrails'
history.

A move that fails is bounded, not free (`failed_moves`): its job waits out a backoff before any
next try, the tries count once against the hourly disruption budget (none that restarted no
running worker), and after `max_move_failures` the move is given up, the job marked (Event
`MoveGivenUp`, annotation `rlalloc.io/held`) and left alone until it changes. A half-applied
move is completed by the next try, or, once given up or refused by the guardrails, rolled back
(`Applier.roll_back`): the job pinned to where its workers are, the cordon it set lifted. The
record is kept in the job's annotations, so a restart or a new leader goes on from it.

Each decision is logged as one JSON line showing the move from -> to (or why a guardrail refused
it), and a cycle that decided anything adds one summary line (`cycle_summary`): idle cycles log
nothing, so the log does not grow by a line every `interval_s`. A policy that weighs
alternatives against a base heuristic (the planner) is asked, through `WeighsAlternatives`, how
many of the cycle's decisions were contested and how many deviated from its base.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

from rlalloc.actuator.apply import Applier, leftover_pods
from rlalloc.actuator.config import ActuatorConfig
from rlalloc.actuator.crd_schema import PyTorchJobValidationError
from rlalloc.actuator.events import EventRecorder
from rlalloc.actuator.failed_moves import (
    GIVEN_UP_REASON,
    MoveFailure,
    after_failure,
    backoff_s,
    give_up,
    held_text,
    job_fingerprint,
    next_try_s,
    nodes_involved,
    record_annotations,
    recorded_failure,
    release_reason,
)
from rlalloc.actuator.guardrails import (
    Decision,
    DecisionHistory,
    Policy,
    decide,
    history_annotations,
    recorded_history,
    rule_of,
)
from rlalloc.actuator.k8s_names import format_placement
from rlalloc.actuator.kube import KubeClient, KubeError, involved_pytorchjob
from rlalloc.actuator.leader import LeaderElector
from rlalloc.actuator.observe import DEFAULT_HISTORY_MIN, MetricsSource, ObserveError
from rlalloc.actuator.server import ActuatorMetrics, Health
from rlalloc.actuator.state_builder import BuiltState, Ledger, Observation, build_state
from rlalloc.env.signals import Signals
from rlalloc.env.state import Action, ActionKind
from rlalloc.forecaster.signals import load_signals

log = logging.getLogger("rlalloc.actuator")

APPLIED, REFUSED, FAILED, DRY_RUN = "applied", "refused", "failed", "dry_run"


@runtime_checkable
class WeighsAlternatives(Protocol):
    """A policy that weighs alternatives against a base heuristic and counts how it went: the
    planner (`rlalloc.agent.lookahead.LookaheadPolicy`). Recognised by these attributes, so that the
    actuator imports no agent code."""

    contested: int
    """Decisions so far where its candidates differed."""
    deviations: int
    """Of those, the ones where it did not follow its base heuristic."""


@dataclass
class CycleReport:
    """What one cycle did (for tests and the benchmark)."""

    leader: bool = False
    observed: bool = False
    error: str = ""
    cause: ObserveError | KubeError | None = None
    """Why the cycle could not observe (or, as a follower, reach the Lease); None when it
    could."""
    outcomes: list[tuple[Decision, str]] = field(default_factory=list)
    """Each decision with its outcome (applied, refused, failed, dry_run)."""
    built: BuiltState | None = None
    lines: list[str] = field(default_factory=list)
    """Each decision as its log line says it (`decision_line`: the move, why it failed)."""
    cycle: int = 0
    """The cycle's number, from 1."""
    contested: int | None = None
    """Of this cycle's calls to a `WeighsAlternatives` policy, those contested (None: the
    policy does not count them)."""
    deviations: int | None = None
    """Of those, the ones where it did not follow its base heuristic."""


class Controller:
    """One actuator replica."""

    def __init__(self, config: ActuatorConfig, kube: KubeClient, metrics_source: MetricsSource,
                 policy: Policy, identity: str, validate: Callable[[dict], None],
                 signals: Signals | None = None, metrics: ActuatorMetrics | None = None,
                 health: Health | None = None) -> None:
        """`validate`: checks each PyTorchJob patch against the CRD before it is sent (a
        `crd_schema.PyTorchJobValidator`); `signals`: the look-ahead functions (default:
        `load_signals(config.signals)`)."""
        self.config = config
        self.identity = identity
        self.metrics = metrics or ActuatorMetrics()
        self.health = health or Health(stale_after_s=5 * config.interval_s + 60.0)
        self._kube = kube
        self._source = metrics_source
        self._policy = policy
        self._signals = load_signals(config.signals) if signals is None else signals
        self._applier = Applier(kube, config, validate)
        self._events = EventRecorder(kube)
        self._elector = (LeaderElector(kube, config, identity)
                         if config.leader_election and not config.dry_run else None)
        self._ledger = Ledger()
        self._history = DecisionHistory()
        self._told_unmanageable: set[str] = set()
        """Opted-in jobs left alone whose warning is out (said once, again if they return)."""
        self._told_untyped: dict[str, str] = {}
        """Nodes of an unknown GPU product whose warning is out, node -> the product (said
        once, again if the node returns or shows another product)."""
        self._failures: dict[str, MoveFailure] = {}
        """Job id -> its failing move (`failed_moves`), as written to the job's annotations or,
        where that write failed, only here."""
        self._unwritten: set[str] = set()
        """Jobs whose latest record could not be written: theirs is the one above, not the one
        their annotations hold."""
        self._cycle = 0

    # ------------------------------------------------------------------------- one cycle
    def run_cycle(self) -> CycleReport:
        """Observe, decide and (if leader and not dry-run) act once."""
        retries_before = self._kube.retries_done
        try:
            return self._run_cycle()
        finally:  # every retry of the cycle: lists, the Lease and Events too, not only moves
            self.metrics.api_retries.inc(self._kube.retries_done - retries_before)

    def _run_cycle(self) -> CycleReport:
        started = time.perf_counter()
        self._cycle += 1
        report = CycleReport(cycle=self._cycle)
        report.leader = self._elector.try_acquire() if self._elector else not self.config.dry_run
        self.metrics.leader.set(int(report.leader))
        if self._elector and not report.leader:
            if self._elector.last_error is not None:
                return self._blind(report, self._elector.last_error)
            self._set_health(True, "standby: another replica holds the lease")
            return report
        try:
            built = self._observe()
        except (ObserveError, KubeError) as err:
            return self._blind(report, err)
        report.observed, report.built = True, built
        self._ledger = built.ledger
        # what the jobs' annotations record too: a restarted or new leader's memory is empty
        self._history = self._history.merge(recorded_history(
            {job_id: ref.obj["metadata"].get("annotations") or {}
             for job_id, ref in built.jobs.items()}, built.state.time_s))
        for job_id in built.unmanageable.keys() - self._told_unmanageable:
            log.warning("job %s is opted in but not managed: %s", job_id,
                        built.unmanageable[job_id], extra={"event": {"job": job_id}})
        self._told_unmanageable = set(built.unmanageable)
        for node, product in sorted(built.untyped_nodes.items() - self._told_untyped.items()):
            log.warning("node %s: its GPU product %s=%s matches no gpu_products pattern, so "
                        "rlalloc places no new workers there; add a pattern for it (and its "
                        "simulator GPU type) to gpu_products in the actuator config", node,
                        self.config.gpu_type_label, product,
                        extra={"event": {"node": node, "product": product}})
        self._told_untyped = dict(built.untyped_nodes)
        self._failures = self._read_failures(built)
        self._converge(built)
        counts_before = self.policy_counts()
        decided = decide(built.state, self._policy, self.config, self._history,
                         built.nodes_without_telemetry, self._failures,
                         frozenset(built.untyped_nodes))
        counts_after = self.policy_counts()
        if counts_before is not None and counts_after is not None:
            report.contested = counts_after[0] - counts_before[0]
            report.deviations = counts_after[1] - counts_before[1]
        history = self._history
        for decision in decided.decisions:
            job_id, now = decision.action.job_id, built.state.time_s
            outcome, detail, tried = self._carry_out(decision, built)
            if outcome in (APPLIED, DRY_RUN):
                history = history.record(job_id, now, decision.counted)
                self._failures.pop(job_id, None)  # a success resets the backoff
                self._unwritten.discard(job_id)
            elif tried:
                history, detail = self._failed(decision, detail, built, history)
            elif outcome == REFUSED and decision.retry:
                self._roll_back(self._failures[job_id], built, decision.reason)
            report.outcomes.append((decision, outcome))
            report.lines.append(self._report(decision, outcome, detail, built))
            if outcome == FAILED:
                break  # later actions were decided assuming this one happened
        self._history = history
        if report.outcomes or report.contested:
            log.info("%s", cycle_summary(report, self.config.dry_run), extra={"event": {
                "cycle": self._cycle, "identity": self.identity,
                "outcomes": _outcome_counts(report),
                **({} if report.contested is None else {
                    "contested": report.contested, "deviations": report.deviations})}})
        elapsed = time.perf_counter() - started
        self.metrics.cycle_seconds.observe(elapsed)
        self.metrics.last_success.set(time.time())
        self._set_health(True, "ok")
        return report

    def _set_health(self, ok: bool, reason: str) -> None:
        """Record a cycle's outcome for /healthz and in the healthy gauge, so the two agree (an
        alert on the gauge must not fire for a healthy standby)."""
        self.health.set(ok, reason)
        self.metrics.healthy.set(int(ok))

    def _blind(self, report: CycleReport, err: ObserveError | KubeError) -> CycleReport:
        """End a cycle that cannot see the cluster: no moves, /healthz red, the loop goes on."""
        self.metrics.errors.labels("observe").inc()
        self._set_health(False, f"cannot observe the cluster: {err}")
        log.warning("cycle skipped, no moves: %s", err,
                    extra={"event": {"cycle": self._cycle, "identity": self.identity}})
        report.error, report.cause = str(err), err
        return report

    def _observe(self) -> BuiltState:
        signals = self._signals
        snapshot = self._source.fetch(
            risk_lag_s=signals.risk_lag_s if signals.node_risk is not None else None,
            demand_minutes=(signals.history_min or DEFAULT_HISTORY_MIN
                            if signals.demand_forecast is not None else 0))
        observation = Observation(
            time_s=snapshot.clock_s, nodes=self._kube.list_nodes(), pods=self._kube.list_pods(),
            jobs=self._kube.list_pytorchjobs(), metrics=snapshot.results,
            demand_history=snapshot.demand_history, earlier_metrics=snapshot.earlier)
        return build_state(observation, self.config, self._ledger, signals)

    def _carry_out(self, decision: Decision, built: BuiltState) -> tuple[str, str, bool]:
        """The outcome, its detail, and whether the move was tried and failed (its error is
        the detail; `Applier.changed` and the rest say what had landed)."""
        if not decision.accepted:
            self.metrics.refused.labels(rule_of(decision.reason)).inc()
            return REFUSED, decision.reason, False
        if self.config.dry_run:
            return DRY_RUN, "dry run: nothing written", False
        if not self._may_write():
            return FAILED, "lost the lease before acting", False
        try:
            with self._within_lease():
                self._applier.apply(decision.action, built, decision.counted,
                                    self._failures.get(decision.action.job_id))
        except (KubeError, PyTorchJobValidationError) as err:
            self.metrics.errors.labels("act").inc()
            return FAILED, str(err), True
        return APPLIED, "", False

    # ------------------------------------------------------------------ failed moves
    def _may_write(self) -> bool:
        """Whether this replica may write now: not in dry run, and holding the lease."""
        return not self.config.dry_run and (self._elector is None or self._elector.is_leader)

    def _within_lease(self) -> contextlib.AbstractContextManager[None]:
        """Bound the calls of the block by the lease margin (see `KubeClient.within`)."""
        return self._kube.within(self._elector.seconds_left if self._elector else None)

    def _failed(self, decision: Decision, error: str, built: BuiltState,
                history: DecisionHistory) -> tuple[DecisionHistory, str]:
        """Account for a try of `decision` that failed with `error`: the guardrails' history
        (a change if a write landed, a disruption only if it restarted running workers and
        the move had not counted one), the job's record (`failed_moves.after_failure`, given up
        after `max_move_failures`), both written to the job; returns the history and the
        decision's detail."""
        action, applier, now = decision.action, self._applier, built.state.time_s
        counted = applier.disrupted and decision.counted
        fix: dict[str, str | None] = {}
        if applier.changed:
            history = history.record(action.job_id, now, counted)
            # the first write recorded the change and, for a move that counts, a disruption:
            # correct that to what happened
            fix = history_annotations(_annotations(built, action.job_id), now, counted)
        # a write without an answer may have landed: converged as a half-applied move is
        record = after_failure(self._failures.get(action.job_id), action, now, error,
                               changed=applier.changed or applier.unanswered, counted=counted,
                               cordoned=applier.cordoned)
        if applier.changed:
            cost = ("no running worker restarted, nothing counted" if not applier.disrupted
                    else "a disruption counted once" if counted
                    else "its disruption counted by an earlier try")
            error = f"partly applied, {cost}: {error}"
        if record.failures >= self.config.max_move_failures:
            record = give_up(record, now, "")  # its fingerprint: the next cycle's observation
            note = (f"; given up after {record.failures} failed tries, the job is left alone "
                    f"until it changes (see {GIVEN_UP_REASON})")
            self._event(built, action.job_id, GIVEN_UP_REASON, held_text(record) + (
                "; to be rolled back to where its workers are" if record.pending else "")
                + "; left alone until the job, its worker pods or its nodes' readiness "
                "change: fix the cause, then remove the annotation rlalloc.io/held to retry "
                "now", warning=True)
        else:
            note = (f"; try {record.failures} of {self.config.max_move_failures}, the job's "
                    f"next in {backoff_s(record.failures, self.config):.0f}s")
        self._store(record, built, fix)
        return history, error + note

    def _read_failures(self, built: BuiltState) -> dict[str, MoveFailure]:
        """The managed jobs' records of failing moves: the annotations' (a restarted or new
        leader's memory is empty), or this replica's where its write failed. A given-up move
        whose job changed (`failed_moves.release_reason`) is released: forgotten, or, if half
        applied and not yet rolled back, tried again from its first try; one given up in the
        last cycle takes this cycle's state as the one to wait for a change of."""
        records: dict[str, MoveFailure] = {}
        for job_id in built.jobs:
            annotations = _annotations(built, job_id)
            recorded = job_id not in self._unwritten
            record = (recorded_failure(annotations, job_id) if recorded
                      else self._failures.get(job_id))
            if record is None:
                continue
            fingerprint = self._fingerprint(built, record)
            if record.held and not record.fingerprint:
                record = replace(record, fingerprint=fingerprint)
                if not record.pending:  # (a roll-back, this cycle, writes it with the rest)
                    self._store(record, built)
            if why := release_reason(record, annotations, fingerprint, recorded):
                log.info("job %s: %s, its given-up move may be tried again", job_id, why,
                         extra={"event": {"job": job_id, "cycle": self._cycle}})
                record = (replace(record, failures=0, held_since=None, fingerprint="")
                          if record.pending else None)
                self._store(record, built, job_id=job_id)
                if record is None:
                    continue
            records[job_id] = record
        self._unwritten &= set(records)
        return records

    def _converge(self, built: BuiltState) -> None:
        """Bring half-applied moves to a consistent state before deciding: one whose workers
        all left as it meant (the operator, a node's eviction) is complete and forgotten; one
        given up is rolled back (again after its backoff, when a roll-back failed)."""
        now = built.state.time_s
        for job_id, record in list(self._failures.items()):
            if not record.pending:
                continue
            if not leftover_pods(built.jobs[job_id], record.action, self.config.node_affinity):
                log.info("job %s: %s completed", job_id, record.action.describe(),
                         extra={"event": {"job": job_id, "cycle": self._cycle}})
                self._failures.pop(job_id)
                self._store(None, built, job_id=job_id)
            elif record.held and (record.last_s == record.held_since
                                  or next_try_s(record, now, self.config) <= now):
                self._roll_back(record, built, "given up")

    def _roll_back(self, record: MoveFailure, built: BuiltState, why: str) -> None:
        """Roll the half-applied move of `record` back (`Applier.roll_back`) and record that;
        when it cannot (or may not: a dry run, a lost lease), the record stays half applied,
        for the next try after its backoff."""
        job_id, action = record.action.job_id, record.action
        rolled = replace(record, pending=False, cordoned="")
        if not self._may_write():
            return
        try:
            with self._within_lease():
                self._applier.roll_back(action, built, record.cordoned,
                                        record_annotations(rolled))
        except (KubeError, PyTorchJobValidationError) as err:
            self.metrics.errors.labels("act").inc()
            log.warning("job %s: could not roll back %s: %s", job_id, action.describe(), err,
                        extra={"event": {"job": job_id, "cycle": self._cycle}})
            self._failures[job_id] = replace(record, last_s=built.state.time_s)
            self._unwritten.add(job_id)
            return
        self._failures[job_id] = rolled
        self._unwritten.discard(job_id)
        where = format_placement(tuple(p.node for p in built.jobs[job_id].pods)) or "no node"
        message = (f"{action.describe()} rolled back ({why}): pinned to where its workers are, "
                   f"{where}" + (f"; {record.cordoned} uncordoned" if record.cordoned else ""))
        log.warning("job %s: %s", job_id, message,
                    extra={"event": {"job": job_id, "cycle": self._cycle}})
        self._event(built, job_id, "MoveRolledBack", message, warning=True)

    def _store(self, record: MoveFailure | None, built: BuiltState,
               extra: dict[str, str | None] | None = None, job_id: str = "") -> None:
        """Keep `record` (None: forget `job_id`'s) and write it to the job's annotations with
        `extra`. A write that fails leaves the record here alone (`_unwritten`), for the cycles
        to come."""
        job_id = record.action.job_id if record is not None else job_id
        if record is None:
            self._failures.pop(job_id, None)
        else:
            self._failures[job_id] = record
        if not self._may_write():
            return
        try:
            with self._within_lease():
                self._applier.annotate(built.jobs[job_id],
                                       {**(extra or {}), **record_annotations(record)})
        except (KubeError, PyTorchJobValidationError) as err:
            self.metrics.errors.labels("act").inc()
            log.warning("job %s: could not record its failed moves: %s", job_id, err,
                        extra={"event": {"job": job_id, "cycle": self._cycle}})
            if record is not None:
                self._unwritten.add(job_id)
            return
        self._unwritten.discard(job_id)

    def _fingerprint(self, built: BuiltState, record: MoveFailure) -> str:
        """The job's state as a given-up move waits for it to change (`job_fingerprint`)."""
        ref = built.jobs[record.action.job_id]
        names = built.state.nodes.name
        ready = {node: node in names and bool(built.state.nodes.ready[names.index(node)])
                 for node in nodes_involved(ref, record.action)}
        return job_fingerprint(ref, ready)

    def _event(self, built: BuiltState, job_id: str, reason: str, message: str,
               warning: bool) -> None:
        """Record an Event on the job (a failure to is logged and counted, no more)."""
        ref = built.jobs[job_id]
        try:
            self._events.record(ref.namespace,
                                involved_pytorchjob(ref.namespace, ref.name, ref.uid),
                                reason, message, warning=warning, instance=self.identity)
        except KubeError as err:
            self.metrics.errors.labels("event").inc()
            log.warning("could not record the event: %s", err)

    def _report(self, decision: Decision, outcome: str, detail: str, built: BuiltState) -> str:
        """Count the decision, log it as one JSON line and record it as an Event on the job;
        returns the line's message."""
        action = decision.action
        kind = ActionKind(action.kind).name.lower()
        self.metrics.decisions.labels(kind, outcome).inc()
        event = {"cycle": self._cycle, "identity": self.identity, "decision": kind,
                 "job": action.job_id, "workers": action.workers, "nodes": list(action.nodes),
                 "from_workers": len(decision.from_nodes),
                 "from_nodes": list(decision.from_nodes), "from_node": action.from_node,
                 "outcome": outcome, "reason": detail, "disruptive": decision.disruptive,
                 "dry_run": self.config.dry_run}
        level = logging.INFO if outcome in (APPLIED, DRY_RUN) else logging.WARNING
        line = decision_line(decision, outcome, detail)
        log.log(level, "%s", line, extra={"event": event})
        ref = built.jobs.get(action.job_id)
        if self.config.dry_run or ref is None:
            return line
        reason = _EVENT_REASONS[outcome] if outcome != APPLIED else _applied_reason(
            action, built)
        message = action.describe() + (f": {detail}" if detail else "")
        try:
            self._events.record(ref.namespace,
                                involved_pytorchjob(ref.namespace, ref.name, ref.uid),
                                reason, message, warning=outcome != APPLIED,
                                instance=self.identity,
                                repeat_key=action.describe() + (
                                    f": {rule_of(detail)}" if outcome == REFUSED else ""))
        except KubeError as err:
            self.metrics.errors.labels("event").inc()
            log.warning("could not record the event: %s", err)
        return line

    # --------------------------------------------------------------------------- running
    def run(self, stop: threading.Event) -> None:
        """Cycle every `interval_s` until `stop` is set, then give the lease up."""
        try:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    self.run_cycle()
                except Exception:  # a bug in a policy must not take the controller down
                    self.metrics.errors.labels("decide").inc()
                    self._set_health(False, "the last cycle failed unexpectedly; see the log")
                    log.exception("cycle failed")
                stop.wait(max(self.config.interval_s - (time.monotonic() - started), 0.0))
        finally:
            self.shutdown()

    def policy_counts(self) -> tuple[int, int] | None:
        """The policy's (contested, deviations) so far, if it is a `WeighsAlternatives`."""
        if not isinstance(self._policy, WeighsAlternatives):
            return None
        return int(self._policy.contested), int(self._policy.deviations)

    def shutdown(self) -> None:
        """Release the lease (if held) so a standby replica takes over at its next cycle
        (within `interval_s`), not after the lease has lapsed. Calls get one attempt from now
        on (`KubeClient.stop_retrying`): with the API gone, retrying the release would hold
        the exit for seconds and the Lease expires anyway."""
        self._kube.stop_retrying()
        if self._elector is not None:
            self._elector.release()
            self.metrics.leader.set(0)


def _annotations(built: BuiltState, job_id: str) -> dict[str, str]:
    """The job's annotations as read this cycle."""
    return built.jobs[job_id].obj["metadata"].get("annotations") or {}


_EVENT_REASONS = {REFUSED: "ActionRefused", FAILED: "ActionFailed"}
_OUTCOME_WORDS = {APPLIED: "applied", DRY_RUN: "would be applied (dry run: nothing written)",
                  REFUSED: "refused by a guardrail", FAILED: "failed"}
"""How `cycle_summary` names each outcome."""


def decision_line(decision: Decision, outcome: str, detail: str = "") -> str:
    """One decision as a log line: its outcome, the job and its move from -> to (workers and
    nodes, as the placement annotation writes them), and why it was refused or failed, e.g.
    ``dry_run: scale default/a: 0 -> 4 workers, none -> node-0000=4``."""
    action = decision.action
    before = format_placement(decision.from_nodes) or "none"
    after = format_placement(action.nodes) or "none"
    if action.kind == ActionKind.MIGRATE:
        move = f"migrate {action.job_id} off {action.from_node}: {before} -> {after}"
    else:
        move = (f"scale {action.job_id}: {len(decision.from_nodes)} -> {action.workers} "
                f"workers, {before} -> {after}")
    shown = "" if outcome == DRY_RUN else detail  # a dry run's detail is its outcome again
    return f"{outcome}: {move}" + (f" ({shown})" if shown else "")


def cycle_summary(report: CycleReport, dry_run: bool) -> str:
    """One line on what a cycle came to: its decisions by outcome, or why it made none, and,
    for a `WeighsAlternatives` policy, how many calls were contested and deviated."""
    if report.error:
        return f"cycle {report.cycle}: no moves, cannot observe the cluster: {report.error}"
    if not report.observed:
        return f"cycle {report.cycle}: standby, another replica holds the lease"
    counts = _outcome_counts(report)
    if counts:
        total = sum(counts.values())
        decided = f"{total} decision{'s' if total != 1 else ''}: " + ", ".join(
            f"{count} {_OUTCOME_WORDS[outcome]}" for outcome, count in counts.items())
    else:
        decided = "no move, the policy proposed none" + (" (dry run)" if dry_run else "")
    if report.contested is not None:
        decided += (f"; planner: {report.contested} contested, {report.deviations} deviated "
                    "from its base")
    return f"cycle {report.cycle}: {decided}"


def _outcome_counts(report: CycleReport) -> dict[str, int]:
    """The cycle's decisions by outcome, in the order applied, dry run, refused, failed."""
    counts = {outcome: sum(1 for _, o in report.outcomes if o == outcome)
              for outcome in (APPLIED, DRY_RUN, REFUSED, FAILED)}
    return {outcome: count for outcome, count in counts.items() if count}


def _applied_reason(action: Action, built: BuiltState) -> str:
    """Event reason of an applied action: Started, Scaled, Suspended or Migrated."""
    if action.kind == ActionKind.MIGRATE:
        return "Migrated"
    if action.workers == 0:
        return "Suspended"
    row = built.state.job_index(action.job_id)
    return "Started" if built.state.jobs.workers[row] == 0 else "Scaled"
