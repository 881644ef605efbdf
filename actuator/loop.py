"""The control loop: observe -> build state -> decide (policy + guardrails) -> act, every cycle.

Everything with side effects is injected (Kubernetes client, metrics source, policy), so the
same loop runs in the cluster, against the digital twin and in tests. A cycle that cannot observe
(Prometheus or the API down or slow) makes no move and turns /healthz red, and the loop keeps
going; a standby replica only tries to take the lease. Only actions that were really applied
(or, in dry-run, would have been) enter the guardrails' history, so a failed move is not held
back by its own cooldown.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from actuator.apply import Applier
from actuator.config import ActuatorConfig
from actuator.events import EventRecorder
from actuator.guardrails import Decision, DecisionHistory, Policy, decide, rule_of
from actuator.kube import KubeClient, KubeError, involved_pytorchjob
from actuator.leader import LeaderElector
from actuator.observe import DEFAULT_HISTORY_MIN, MetricsSource, ObserveError
from actuator.server import ActuatorMetrics, Health
from actuator.state_builder import BuiltState, Ledger, Observation, build_state
from env.signals import Signals, load_signals
from env.state import Action, ActionKind
from trainer_jobs.crd_schema import PyTorchJobValidationError

log = logging.getLogger("rlalloc.actuator")

APPLIED, REFUSED, FAILED, DRY_RUN = "applied", "refused", "failed", "dry_run"


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


class Controller:
    """One actuator replica."""

    def __init__(self, config: ActuatorConfig, kube: KubeClient, metrics_source: MetricsSource,
                 policy: Policy, identity: str, signals: Signals | None = None,
                 metrics: ActuatorMetrics | None = None, health: Health | None = None) -> None:
        """`signals`: the look-ahead functions (default: `load_signals(config.signals)`)."""
        self.config = config
        self.identity = identity
        self.metrics = metrics or ActuatorMetrics()
        self.health = health or Health(stale_after_s=5 * config.interval_s + 60.0)
        self._kube = kube
        self._source = metrics_source
        self._policy = policy
        self._signals = load_signals(config.signals) if signals is None else signals
        self._applier = Applier(kube, config)
        self._events = EventRecorder(kube)
        self._elector = (LeaderElector(kube, config, identity)
                         if config.leader_election and not config.dry_run else None)
        self._ledger = Ledger()
        self._history = DecisionHistory()
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
        report = CycleReport()
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
        decided = decide(built.state, self._policy, self.config, self._history,
                         built.nodes_without_telemetry)
        history = self._history
        for decision in decided.decisions:
            outcome, detail = self._carry_out(decision, built)
            report.outcomes.append((decision, outcome))
            self._report(decision, outcome, detail, built)
            if outcome in (APPLIED, DRY_RUN):
                history = history.record(decision.action.job_id, built.state.time_s,
                                         decision.disruptive)
            elif outcome == FAILED:
                break  # later actions were decided assuming this one happened
        self._history = history
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

    def _carry_out(self, decision: Decision, built: BuiltState) -> tuple[str, str]:
        if not decision.accepted:
            self.metrics.refused.labels(rule_of(decision.reason)).inc()
            return REFUSED, decision.reason
        if self.config.dry_run:
            return DRY_RUN, "dry run: nothing written"
        if self._elector and not self._elector.is_leader:
            return FAILED, "lost the lease before acting"
        try:
            self._applier.apply(decision.action, built)
        except (KubeError, PyTorchJobValidationError) as err:
            self.metrics.errors.labels("act").inc()
            return FAILED, str(err)
        return APPLIED, ""

    def _report(self, decision: Decision, outcome: str, detail: str, built: BuiltState) -> None:
        """Count the decision, log it as one JSON line and record it as an Event on the job."""
        action = decision.action
        kind = ActionKind(action.kind).name.lower()
        self.metrics.decisions.labels(kind, outcome).inc()
        event = {"cycle": self._cycle, "identity": self.identity, "decision": kind,
                 "job": action.job_id, "workers": action.workers, "nodes": list(action.nodes),
                 "from_node": action.from_node, "outcome": outcome, "reason": detail,
                 "disruptive": decision.disruptive, "dry_run": self.config.dry_run}
        level = logging.INFO if outcome in (APPLIED, DRY_RUN) else logging.WARNING
        log.log(level, "%s: %s%s", outcome, action.describe(), f" ({detail})" if detail else "",
                extra={"event": event})
        ref = built.jobs.get(action.job_id)
        if self.config.dry_run or ref is None:
            return
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

    def shutdown(self) -> None:
        """Release the lease (if held) so a standby replica takes over at once."""
        if self._elector is not None:
            self._elector.release()
            self.metrics.leader.set(0)


_EVENT_REASONS = {REFUSED: "ActionRefused", FAILED: "ActionFailed"}


def _applied_reason(action: Action, built: BuiltState) -> str:
    """Event reason of an applied action: Started, Scaled, Suspended or Migrated."""
    if action.kind == ActionKind.MIGRATE:
        return "Migrated"
    if action.workers == 0:
        return "Suspended"
    row = built.state.job_index(action.job_id)
    return "Started" if built.state.jobs.workers[row] == 0 else "Scaled"
