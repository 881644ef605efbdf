"""The decide step: state + policy + guardrail settings + history -> decisions. Pure, no I/O.

The policy is asked as in the simulator: again after every accepted action (on the state as it
will be once that action is carried out), until it answers no-op or `max_actions_per_cycle` is
reached. After a refused action it is asked again without that job in the state it is shown
(`policy_view`): shown the same state, it would propose the same action, and one job in its
cooldown or over the disruption cap held up every other job's start for up to an hour. Every
proposal passes the guardrails below, which are the actuator's promises to the cluster's owner
whatever the policy does:

- only managed (opted-in) jobs, only within their elasticPolicy min..max;
- never more GPUs than are free: per node, counting the job's own GPUs and the actions already
  accepted this cycle, each worker as its job's GPUs per worker (a placement names a node per
  worker, whole workers only); never on a node that is down, cordoned, of an unknown GPU type
  (`BuiltState.untyped_nodes`) or (optionally) without fresh telemetry;
- a job runs on one GPU type at a time: no placement spans nodes of two types (the state's
  `nodes.gpu_type`);
- a per-job cooldown after every change (failover moves are exempt: a warned node will not wait);
- a cap on disruptive moves (those that restart running workers) per cycle and per sliding hour;
- a job whose move failed waits out its backoff, and one whose move was given up is left alone
  (`failed_moves`): neither is shown to the policy. A half-applied move whose backoff is over
  is tried again before the policy is asked, exempt from the cooldown (its first try started
  it) and counted against the hourly cap only if no earlier try was; while it waits, the GPUs
  it will take are held for it.

A refused action comes back with its reason, for the log line and the Kubernetes Event.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from rlalloc.actuator.config import ActuatorConfig
from rlalloc.actuator.failed_moves import MoveFailure, counts_against_budget, waiting_reason
from rlalloc.actuator.k8s_names import DISRUPTIONS_ANNOTATION, LAST_CHANGE_ANNOTATION
from rlalloc.env.state import Action, ActionKind, ClusterState, Jobs, JobStatus

_HOUR_S = 3600.0


class Policy(Protocol):
    """What the actuator needs of a policy (agent.policy.Policy satisfies it)."""

    def act(self, state: ClusterState) -> Action:
        """The next action for `state` (NOOP: nothing to do)."""
        ...


@dataclass(frozen=True)
class DecisionHistory:
    """What the guardrails remember across cycles."""

    last_change_s: dict[str, float] = field(default_factory=dict)
    """Job id -> when an accepted action last changed it."""
    disruptions_s: tuple[float, ...] = ()
    """Times of the disruptive moves accepted in the last hour."""

    def record(self, job_id: str, time_s: float, disruptive: bool) -> DecisionHistory:
        """This history after a change of `job_id` at `time_s` (older disruptions dropped)."""
        recent = tuple(t for t in self.disruptions_s if time_s - t < _HOUR_S)
        return DecisionHistory({**self.last_change_s, job_id: time_s},
                               recent + ((time_s,) if disruptive else ()))

    def merge(self, other: DecisionHistory) -> DecisionHistory:
        """Both histories: each job's later change, and each disruption time as often as the
        history that holds it more often has it (the one recorded in memory and the same one
        read back from the job's annotations are equal times, while two moves of one cycle
        share their time and must count twice: a set of times let the hourly cap through at
        twice its number)."""
        last = dict(self.last_change_s)
        for job_id, time_s in other.last_change_s.items():
            last[job_id] = max(time_s, last.get(job_id, time_s))
        counts = Counter(self.disruptions_s) | Counter(other.disruptions_s)
        return DecisionHistory(last, tuple(sorted(counts.elements())))

    def as_of(self, now_s: float) -> DecisionHistory:
        """This history at `now_s`: disruptions of the last hour only, and times ahead of now
        taken as now, or dropped beyond `CLOCK_SKEW_S` (`_as_of`)."""
        last = {job_id: seen for job_id, time_s in self.last_change_s.items()
                if (seen := _as_of(time_s, now_s)) is not None}
        recent = [seen for time_s in self.disruptions_s
                  if (seen := _as_of(time_s, now_s)) is not None and now_s - seen < _HOUR_S]
        return DecisionHistory(last, tuple(sorted(recent)))


CLOCK_SKEW_S = 300.0
"""How far ahead of the cluster's now a recorded time may lie and still be taken (as now):
replicas' clocks differ by seconds, but a time further ahead is no record of a change (a hand
edit, a clock set back) and, taken as it is, held a job in cooldown, or filled the hour's
disruption cap, for ever."""


def _as_of(time_s: float, now_s: float) -> float | None:
    """`time_s` as a time of a change seen at `now_s` (see `CLOCK_SKEW_S`), None if none."""
    return None if time_s > now_s + CLOCK_SKEW_S else min(time_s, now_s)


def history_annotations(current: dict, time_s: float, disruptive: bool) -> dict[str, str]:
    """The annotations that record a change of a job at `time_s` in the cluster (its cooldown,
    and its disruptions of the last hour), given the job's `current` annotations; written with
    the change (`Applier`), read back by `recorded_history`."""
    recent = [seen for t in _times(current.get(DISRUPTIONS_ANNOTATION, ""))
              if (seen := _as_of(t, time_s)) is not None and time_s - seen < _HOUR_S]
    if disruptive:
        recent.append(time_s)
    return {LAST_CHANGE_ANNOTATION: repr(float(time_s)),
            DISRUPTIONS_ANNOTATION: ",".join(repr(t) for t in recent)}


def recorded_history(annotations_by_job: dict[str, dict], now_s: float) -> DecisionHistory:
    """The guardrails' history at `now_s` as the jobs' annotations record it
    (`history_annotations`): what a restarted actuator, or a new leader, starts from instead of
    nothing. Every job's disruptions count, two jobs' at one time twice. Anyone who may edit a
    managed job's annotations can spend the hour's disruption budget with them (for an hour at
    most: times ahead of now are not taken, `DecisionHistory.as_of`)."""
    last: dict[str, float] = {}
    disruptions: list[float] = []
    for job_id, recorded in annotations_by_job.items():
        changed = _times(recorded.get(LAST_CHANGE_ANNOTATION, ""))
        if changed:
            last[job_id] = changed[0]
        disruptions += _times(recorded.get(DISRUPTIONS_ANNOTATION, ""))
    return DecisionHistory(last, tuple(disruptions)).as_of(now_s)


def _times(text: str) -> list[float]:
    """The finite numbers of a comma-separated annotation (anything else is skipped: a user's
    edit must not stop the actuator)."""
    times = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            continue
        if math.isfinite(value):
            times.append(value)
    return times


@dataclass(frozen=True)
class Decision:
    """One proposal of the policy and what the guardrails made of it."""

    action: Action
    accepted: bool
    reason: str = ""
    """Why it was refused ("" when accepted)."""
    disruptive: bool = False
    """It restarts running workers (resize, suspend or move of a running job)."""
    from_nodes: tuple[str, ...] = ()
    """The job's nodes, one per worker, when the policy proposed the action (on the state as
    the actions accepted before it in the cycle leave it), so a log line can show the move
    from -> to: the action alone says only where the job goes."""
    counted: bool = False
    """It counts against the hourly disruption budget: disruptive, and no earlier try of the
    same move counted (`failed_moves.counts_against_budget`)."""
    retry: bool = False
    """The actuator's own next try of a half-applied move, not the policy's proposal."""


@dataclass(frozen=True)
class CycleDecisions:
    """Result of one decide step."""

    decisions: tuple[Decision, ...]
    history: DecisionHistory
    projected: ClusterState
    """The state as it will be once the accepted actions are carried out."""


def decide(state: ClusterState, policy: Policy, config: ActuatorConfig,
           history: DecisionHistory,
           nodes_without_telemetry: frozenset[str] = frozenset(),
           failures: Mapping[str, MoveFailure] | None = None,
           untyped_nodes: frozenset[str] = frozenset()) -> CycleDecisions:
    """Ask `policy` for actions on `state` and pass each through the guardrails; `failures`:
    the jobs' failing moves, `untyped_nodes`: the nodes of an unknown GPU type (see the module
    docstring)."""
    now = state.time_s
    history = history.as_of(now)
    failures = {job_id: record for job_id, record in (failures or {}).items()
                if job_id in state.jobs.job_id}
    waiting = {job_id: reason for job_id, record in failures.items()
               if (reason := waiting_reason(record, now, config))}
    retries = [record.action for job_id, record in failures.items()
               if record.pending and job_id not in waiting]
    for job_id, record in failures.items():
        if record.pending and job_id in waiting:
            state = reserve(state, record.action)
    decisions: list[Decision] = []
    cycle_disruptions = 0
    refused_jobs = frozenset(waiting)
    for _ in range(config.max_actions_per_cycle):
        retry = bool(retries)
        if retries:
            action = retries.pop(0)
        else:
            action = policy.act(policy_view(state, config, nodes_without_telemetry,
                                             refused_jobs, untyped_nodes))
            if action.kind == ActionKind.NOOP or action.job_id in refused_jobs:
                if action.job_id in waiting:  # proposed for a job it was not shown
                    decisions.append(Decision(action, False, waiting[action.job_id],
                                              is_disruptive(state, action),
                                              current_nodes(state, action.job_id)))
                break  # (a policy that proposes for a job it was not shown is not asked again)
        disruptive = is_disruptive(state, action)
        counted = counts_against_budget(failures.get(action.job_id), action, disruptive)
        reason = check(state, action, config, history, nodes_without_telemetry, retry,
                       untyped_nodes)
        if not reason and disruptive and cycle_disruptions >= config.max_disruptions_per_cycle:
            reason = (f"disruption cap: {config.max_disruptions_per_cycle} disruptive moves "
                      "per cycle already taken")
        if not reason and counted and (len(history.disruptions_s)
                                       >= config.max_disruptions_per_hour):
            reason = (f"disruption cap: {config.max_disruptions_per_hour} disruptive moves "
                      "in the last hour")
        decisions.append(Decision(action, not reason, reason, disruptive,
                                  current_nodes(state, action.job_id), counted, retry))
        if reason:
            if action.job_id not in state.jobs.job_id:
                break  # an unmanaged job: hiding it would change nothing
            refused_jobs |= {action.job_id}
            continue
        cycle_disruptions += int(disruptive)
        history = history.record(action.job_id, now, counted)
        state = project(state, action)
    return CycleDecisions(tuple(decisions), history, state)


def policy_view(state: ClusterState, config: ActuatorConfig,
                nodes_without_telemetry: frozenset[str],
                refused_jobs: frozenset[str] = frozenset(),
                untyped_nodes: frozenset[str] = frozenset()) -> ClusterState:
    """`state` as the policy is shown it: without the jobs whose proposal was refused this
    cycle (their GPUs stay taken, as another tenant's are), and with the nodes the telemetry
    and GPU-type guardrails refuse new workers on (`untyped_nodes`) cordoned, as the guardrails
    treat them. Shown as usable, a deterministic policy proposed the same refused placement
    every cycle, and the refusal (which then ended the cycle) held up every other move,
    failovers included, for as long as one exporter was down. A job with workers on such a node
    is then not shown its own GPUs there either, so a policy cannot shrink it in place on it
    (the guardrail would allow that); it can still move it off."""
    if refused_jobs:
        jobs = state.jobs
        hidden = np.isin(np.asarray(jobs.job_id), list(refused_jobs))
        queued = hidden & (jobs.workers == 0)  # no queue left behind them in the demand either
        shown = np.flatnonzero(~hidden)
        state = replace(
            state,
            jobs=Jobs.from_records([jobs.record(i) for i in shown.tolist()]),
            type_speeds=None if state.type_speeds is None else state.type_speeds.of_rows(shown),
            demand=replace(state.demand, pending_gpus=max(
                int(state.demand.pending_gpus) - int(jobs.requested_gpus[queued].sum()), 0)))
    closed = untyped_nodes | (nodes_without_telemetry if config.require_node_telemetry
                              else frozenset())
    if not closed:
        return state
    shut = np.isin(np.asarray(state.nodes.name), list(closed))
    return replace(state, nodes=replace(state.nodes, cordoned=state.nodes.cordoned | shut))


def is_disruptive(state: ClusterState, action: Action) -> bool:
    """True when `action` restarts workers that are running now."""
    try:
        row = state.job_index(action.job_id)
    except KeyError:
        return False
    return bool(state.jobs.workers[row] > 0)


def current_nodes(state: ClusterState, job_id: str) -> tuple[str, ...]:
    """The nodes of `job_id`'s workers in `state`, one per worker (none for a job that is not
    in it: an unmanaged one)."""
    try:
        row = state.job_index(job_id)
    except KeyError:
        return ()
    return tuple(state.nodes.name[i] for i in state.jobs.placement[row])


def check(state: ClusterState, action: Action, config: ActuatorConfig,
          history: DecisionHistory, nodes_without_telemetry: frozenset[str],
          retry: bool = False, untyped_nodes: frozenset[str] = frozenset()) -> str:
    """Why the guardrails refuse `action` on `state` ("" when they accept it). A `retry` of a
    half-applied move is exempt from the cooldown (its first try's change started it) and from
    keeping the worker count (a deleted worker whose replacement is not bound yet is not
    counted). New workers never go to `untyped_nodes` (a job keeps those it has there)."""
    jobs, nodes = state.jobs, state.nodes
    try:
        row = state.job_index(action.job_id)
    except KeyError:
        return (f"job {action.job_id} is not managed: only PyTorchJobs labelled "
                f"{config.managed_label}=true may be changed")
    workers = int(jobs.workers[row])
    low, high = int(jobs.min_workers[row]), int(jobs.max_workers[row])
    names = nodes.name
    current = tuple(names[i] for i in jobs.placement[row])
    if action.kind == ActionKind.SCALE:
        if action.workers and not low <= action.workers <= high:
            return f"{action.workers} workers is outside the job's elasticPolicy [{low}, {high}]"
        if action.workers == 0 and workers == 0:
            return "the job is already suspended"
    elif action.kind == ActionKind.MIGRATE:
        if workers == 0:
            return "the job is not running, there is nothing to move"
        if action.from_node not in current:
            return f"the job has no worker on {action.from_node}"
        if action.from_node in action.nodes:
            return f"the new placement still uses {action.from_node}"
        if len(action.nodes) != workers and not retry:
            return f"a move keeps the worker count ({workers}), got {len(action.nodes)}"
    index = {name: i for i, name in enumerate(names)}
    unknown = [n for n in action.nodes if n not in index]
    if unknown:
        return f"unknown node {unknown[0]}"
    if tuple(sorted(action.nodes)) == tuple(sorted(current)):
        return "placement unchanged"
    types = tuple(dict.fromkeys(nodes.gpu_type[index[n]] for n in action.nodes))
    if len(types) > 1:
        return (f"a job runs on one GPU type at a time: the new placement spans "
                f"{' and '.join(types)}")
    per_worker = int(jobs.gpus_per_worker[row])
    need = np.bincount([index[n] for n in action.nodes], minlength=nodes.count) * per_worker
    own = np.bincount(list(jobs.placement[row]), minlength=nodes.count) * per_worker
    for i in np.flatnonzero(need > 0).tolist():
        if not nodes.ready[i]:
            return f"node {names[i]} is not Ready"
        if nodes.cordoned[i]:
            return f"node {names[i]} is cordoned"
        if need[i] > nodes.gpus_free[i] + own[i]:
            workers = (f" ({need[i] // per_worker} workers of {per_worker})"
                       if per_worker > 1 else "")
            return (f"not enough free GPUs on {names[i]}: needs {need[i]}{workers}, "
                    f"{nodes.gpus_free[i] + own[i]} free")
        if (config.require_node_telemetry and need[i] > own[i]
                and names[i] in nodes_without_telemetry):
            return f"no fresh DCGM telemetry for node {names[i]}"
        if need[i] > own[i] and names[i] in untyped_nodes:
            return (f"unknown GPU type of node {names[i]}: its {config.gpu_type_label} label "
                    "matches no gpu_products pattern")
    last = history.last_change_s.get(action.job_id)
    if action.kind != ActionKind.MIGRATE and not retry and last is not None:
        if state.time_s - last < config.cooldown_s:
            return (f"cooldown: changed {state.time_s - last:.0f}s ago, "
                    f"{config.cooldown_s:.0f}s required")
    return ""


_RULES = (("is not managed", "unmanaged"), ("elasticPolicy", "elastic_range"),
          ("free GPUs", "free_gpus"), ("is cordoned", "node_unusable"),
          ("is not Ready", "node_unusable"), ("telemetry", "node_telemetry"),
          ("unknown GPU type", "node_gpu_type"), ("one GPU type", "one_gpu_type"),
          ("cooldown", "cooldown"), ("disruption cap", "disruption_cap"),
          ("backoff:", "backoff"), ("move given up", "given_up"))


def rule_of(reason: str) -> str:
    """Short, stable name of the guardrail behind a refusal `reason` (a metric label)."""
    for fragment, rule in _RULES:
        if fragment in reason:
            return rule
    return "invalid_action"


def reserve(state: ClusterState, action: Action) -> ClusterState:
    """`state` with the GPUs a half-applied `action` will take held for it (those beyond its
    job's own on each of its nodes): waiting for its next try, it must find them free, and a
    policy shown them free placed another job there, which refused that try."""
    index = {name: i for i, name in enumerate(state.nodes.name)}
    try:
        row = state.job_index(action.job_id)
    except KeyError:
        return state
    wanted = [index[n] for n in action.nodes if n in index]
    per_worker = int(state.jobs.gpus_per_worker[row])
    need = np.bincount(wanted, minlength=state.nodes.count) * per_worker
    own = np.bincount(list(state.jobs.placement[row]), minlength=state.nodes.count) * per_worker
    free = np.maximum(state.nodes.gpus_free - np.maximum(need - own, 0), 0)
    return replace(state, nodes=replace(state.nodes, gpus_free=free.astype(
        state.nodes.gpus_free.dtype)))


def project(state: ClusterState, action: Action) -> ClusterState:
    """`state` as it will be once `action` is carried out: the job holds its new GPUs (and is
    restarting), its old ones are free again, and a move's failing node is cordoned (`Applier`
    cordons it), so that no later action of the cycle is accepted onto it. Only these columns
    change."""
    row = state.job_index(action.job_id)
    nodes, jobs = state.nodes, state.jobs
    index = {name: i for i, name in enumerate(nodes.name)}
    placement = tuple(sorted(index[n] for n in action.nodes))
    free = nodes.gpus_free.copy()
    per_worker = int(jobs.gpus_per_worker[row])
    np.add.at(free, list(jobs.placement[row]), per_worker)
    np.subtract.at(free, list(placement), per_worker)
    status, workers = jobs.status.copy(), jobs.workers.copy()
    restarts = jobs.restarts.copy()
    if jobs.workers[row] > 0 and placement:
        restarts[row] += 1
    status[row] = int(JobStatus.RESTARTING if placement else JobStatus.QUEUED)
    workers[row] = len(placement)
    placements = jobs.placement[:row] + (placement,) + jobs.placement[row + 1:]
    throughput = jobs.throughput.copy()
    throughput[row] = 0.0
    requested = jobs.requested_gpus[row]
    was_queued, now_queued = jobs.workers[row] == 0, not placement
    pending = state.demand.pending_gpus + int(requested) * (int(now_queued) - int(was_queued))
    cordoned = nodes.cordoned.copy()
    if action.kind == ActionKind.MIGRATE and action.from_node in index:
        cordoned[index[action.from_node]] = True
    return replace(state, nodes=replace(nodes, gpus_free=free, cordoned=cordoned),
                   jobs=replace(jobs, status=status, workers=workers, placement=placements,
                                throughput=throughput, restarts=restarts),
                   demand=replace(state.demand, pending_gpus=pending))
