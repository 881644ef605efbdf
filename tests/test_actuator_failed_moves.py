"""Failed moves are bounded, not free: backoff, the disruption budget, give-up and roll-back.

The pure parts (`actuator.failed_moves`, the guardrails' use of it) on hand-made records and
states; then the run that found it, reproduced against the twin through a real Prometheus: a
failover whose pod deletions the API forbids (the Role without `delete` on pods), then allows.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest
from kubernetes.client.exceptions import ApiException

from rlalloc.actuator.apply import pin_patch
from rlalloc.actuator.config import ActuatorConfig, load_config
from rlalloc.actuator.failed_moves import (
    MoveFailure,
    after_failure,
    backoff_s,
    counts_against_budget,
    give_up,
    held_text,
    job_fingerprint,
    record_annotations,
    recorded_failure,
    release_reason,
    waiting_reason,
)
from rlalloc.actuator.guardrails import DecisionHistory, decide, rule_of
from rlalloc.actuator.k8s_names import (
    HELD_ANNOTATION,
    HOSTNAME_LABEL,
    MOVE_FAILURES_ANNOTATION,
    format_placement,
)
from rlalloc.actuator.kube import _status_message
from rlalloc.actuator.state_builder import JobRef, PodRef
from rlalloc.actuator.twin.kube_api import EVENTS, NODES, PODS, PYTORCHJOBS
from rlalloc.actuator.twin.runtime import ScriptedFailure
from rlalloc.env.errors import UserError
from rlalloc.env.state import (
    Action,
    ActionKind,
    ClusterState,
    Demand,
    JobInfo,
    Jobs,
    JobStatus,
    NodeInfo,
    Nodes,
)

from actuator_fixtures import (
    CYCLE_S,
    Scripted,
    TinyElastic,
    controller,
    job,
    needs_prometheus,
    start_scraped_twin,
    twin_config,
)

CONFIG = ActuatorConfig(move_backoff_s=60.0, move_backoff_max_s=900.0, max_move_failures=3,
                        cooldown_s=300.0)
MOVE = Action(ActionKind.MIGRATE, "run", 2, ("node-b", "node-b"), from_node="node-a")


def _world(time_s: float = 1000.0) -> ClusterState:
    """node-a: 4 GPUs, 2 used by "run" (min 1, max 4); node-b: 4 free; "wait" queued (4)."""
    nodes = Nodes.from_records([NodeInfo("node-a", 4, 2), NodeInfo("node-b", 4, 4)])
    jobs = Jobs.from_records([
        JobInfo("run", JobStatus.RUNNING, 0.0, 2, 1, 4, workers=2, placement=(0, 0),
                throughput=2.0),
        JobInfo("wait", JobStatus.QUEUED, 10.0, 4, 2, 4)])
    return ClusterState(time_s=time_s, nodes=nodes, jobs=jobs, demand=Demand(pending_gpus=4))


# ----------------------------------------------------------------------- backoff, budget
def test_the_backoff_doubles_from_the_first_failure_up_to_its_cap():
    config = ActuatorConfig(move_backoff_s=60.0, move_backoff_max_s=900.0)
    assert [backoff_s(n, config) for n in range(7)] == [0, 60, 120, 240, 480, 900, 900]
    assert backoff_s(10_000, config) == 900.0  # no overflow however long it failed
    record = MoveFailure(MOVE, failures=2, last_s=1000.0)
    assert waiting_reason(record, 1050.0, config) == "backoff: 2 failed tries, next try in 70s"
    assert waiting_reason(record, 1120.0, config) == ""
    # a try recorded ahead of the clock (a hand edit) holds the job no longer than the backoff
    assert waiting_reason(replace(record, last_s=1e12), 1000.0, config).endswith("in 120s")
    assert rule_of(waiting_reason(record, 1050.0, config)) == "backoff"
    held = give_up(record, 1000.0, "f")
    assert rule_of(waiting_reason(held, 1e9, config)) == "given_up"


def test_tries_of_one_move_count_once_and_those_that_disrupted_nobody_not_at_all():
    # the first try cordoned and patched, then every pod deletion was refused: nobody restarted
    first = after_failure(None, MOVE, 1000.0, "delete pod: HTTP 403", changed=True,
                          counted=False, cordoned="node-a")
    assert (first.failures, first.pending, first.counted, first.cordoned) == (
        1, True, False, "node-a")
    assert counts_against_budget(first, MOVE, disruptive=True)  # not counted yet
    # the second deleted one pod before the next refusal: that one counts
    second = after_failure(first, MOVE, 1060.0, "delete pod: HTTP 403", changed=True,
                           counted=True, cordoned="")
    assert (second.failures, second.counted, second.cordoned) == (2, True, "node-a")
    # a later try of the same move (elsewhere, even) does not count again
    elsewhere = replace(MOVE, nodes=("node-c", "node-c"))
    assert not counts_against_budget(second, elsewhere, disruptive=True)
    # another move of the job, or a move of a job without workers, is another matter
    resize = Action(ActionKind.SCALE, "run", 3, ("node-a",) * 3)
    assert counts_against_budget(second, resize, disruptive=True)
    assert not counts_against_budget(None, MOVE, disruptive=False)
    assert not after_failure(second, resize, 1200.0, "x", changed=False, counted=False,
                             cordoned="").counted


def test_a_retry_that_counted_already_passes_a_full_hourly_cap_and_skips_the_cooldown():
    record = MoveFailure(MOVE, failures=1, last_s=900.0, pending=True, counted=True)
    full = DecisionHistory({"run": 900.0}, (900.0,))
    config = replace(CONFIG, max_disruptions_per_hour=1)
    cycle = decide(_world(), Scripted(), config, full, failures={"run": record})
    [decision] = cycle.decisions
    assert decision.retry and decision.accepted and decision.action == MOVE
    assert decision.disruptive and not decision.counted
    assert cycle.history.disruptions_s == (900.0,)  # no second entry
    # the same move proposed fresh by the policy would be refused by the cap
    fresh = decide(_world(), Scripted(MOVE), config, full)
    assert fresh.decisions[0].reason.startswith("disruption cap: 1 disruptive moves")


def test_a_job_in_its_backoff_or_given_up_is_not_shown_to_the_policy():
    seen: list[tuple[str, ...]] = []

    class Watching:
        def act(self, state: ClusterState) -> Action:
            seen.append(tuple(state.jobs.job_id))
            return Action(ActionKind.NOOP)

    backing_off = MoveFailure(MOVE, failures=1, last_s=990.0)
    cycle = decide(_world(), Watching(), CONFIG, DecisionHistory(),
                   failures={"run": backing_off})
    assert seen == [("wait",)] and cycle.decisions == ()
    # a policy that proposes for it anyway is refused with the reason
    cycle = decide(_world(), Scripted(MOVE), CONFIG, DecisionHistory(),
                   failures={"run": give_up(backing_off, 990.0, "f")})
    [decision] = cycle.decisions
    assert not decision.accepted and decision.reason.startswith(
        "move given up after 1 failed tries")
    # its backoff over, a move that changed nothing is the policy's to propose again
    seen.clear()
    decide(_world(2000.0), Watching(), CONFIG, DecisionHistory(),
           failures={"run": backing_off})
    assert seen == [("run", "wait")]


def test_a_waiting_half_applied_move_keeps_the_gpus_it_will_take():
    pending = MoveFailure(MOVE, failures=1, last_s=990.0, pending=True)
    start = Action(ActionKind.SCALE, "wait", 4, ("node-b",) * 4)
    cycle = decide(_world(), Scripted(start), CONFIG, DecisionHistory(),
                   failures={"run": pending})
    [decision] = cycle.decisions
    assert decision.reason == "not enough free GPUs on node-b: needs 4, 2 free"


# ------------------------------------------------------------------ records and marks
def _ref(pods: tuple[PodRef, ...], replicas: int = 2) -> JobRef:
    obj = {"metadata": {"name": "run", "annotations": {}}, "spec": {"pytorchReplicaSpecs": {
        "Worker": {"replicas": replicas, "template": {"spec": {"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In",
                                       "values": ["node-a"]}]}]}}}}}}}}}
    return JobRef("ns", "run", "uid", obj, pods)


def test_the_record_round_trips_through_the_annotations_and_a_bad_edit_is_ignored():
    record = give_up(MoveFailure(MOVE, failures=3, last_s=1000.0, error="HTTP 403",
                                 pending=True, counted=False, cordoned="node-a"), 1000.0, "f")
    annotations = record_annotations(record)
    assert recorded_failure(annotations, "run") == record
    assert annotations[HELD_ANNOTATION] == held_text(record) == (
        "MoveGivenUp: migrate run off node-a to [node-b] failed 3 times (HTTP 403) since "
        "1970-01-01T00:16:40Z")
    assert record_annotations(None) == {MOVE_FAILURES_ANNOTATION: None, HELD_ANNOTATION: None}
    for text in ("{", '{"move": 1}', json.dumps({"move": {"kind": "noop"}}), ""):
        assert recorded_failure({MOVE_FAILURES_ANNOTATION: text}, "run") is None


def test_a_given_up_move_is_released_when_its_job_changes_or_its_mark_is_removed():
    pods = (PodRef("ns", "run-worker-0", "node-a", 0, "u0"),
            PodRef("ns", "run-worker-1", "node-a", 1, "u1"))
    ready = {"node-a": True, "node-b": True}
    fingerprint = job_fingerprint(_ref(pods), ready)
    record = give_up(MoveFailure(MOVE, failures=3, last_s=1000.0), 1000.0, fingerprint)
    marked = record_annotations(record)
    assert release_reason(record, marked, fingerprint, recorded=True) == ""
    # rlalloc's own writes of the affinity (a roll-back) are no change
    repinned = _ref(pods)
    repinned.obj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["affinity"] = {}
    assert job_fingerprint(repinned, ready) == fingerprint
    # a pod recreated (new uid), the user's resize, the failing node going NotReady: a change
    recreated = (pods[0], replace(pods[1], uid="u2"))
    for changed in (job_fingerprint(_ref(recreated), ready),
                    job_fingerprint(_ref(pods, replicas=3), ready),
                    job_fingerprint(_ref(pods), {**ready, "node-a": False})):
        assert release_reason(record, marked, changed, recorded=True).startswith("the job")
    # someone removed the mark; a mark whose write failed (not recorded) was never there
    unmarked = {MOVE_FAILURES_ANNOTATION: marked[MOVE_FAILURES_ANNOTATION]}
    assert release_reason(record, unmarked, fingerprint, recorded=True) == (
        f"{HELD_ANNOTATION} was removed")
    assert release_reason(record, unmarked, fingerprint, recorded=False) == ""


def test_a_roll_back_pins_the_job_to_where_its_workers_are():
    pods = (PodRef("ns", "run-worker-0", "node-b", 0), PodRef("ns", "run-worker-1", "node-a", 1))
    patch = pin_patch(_ref(pods), tuple(p.node for p in pods))
    terms = patch["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["affinity"][
        "nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In",
                                            "values": ["node-a", "node-b"]}]}]
    assert patch["metadata"]["annotations"] == {
        "rlalloc.io/placement": "node-a=1,node-b=1"}
    # no worker left: rlalloc's constraint and placement go, nothing pinned to no node
    empty = pin_patch(_ref(()), ())
    assert empty["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["affinity"][
        "nodeAffinity"] == {"requiredDuringSchedulingIgnoredDuringExecution": None}
    assert empty["metadata"]["annotations"] == {"rlalloc.io/placement": None}


# --------------------------------------------------------------------- settings, errors
@pytest.mark.parametrize("settings, problem", [
    ({"move_backoff_s": -1.0}, "move_backoff_s must be a finite number >= 0 (got -1.0)"),
    ({"max_move_failures": 0}, "max_move_failures must be >= 1 (got 0)"),
    ({"move_backoff_s": 600.0, "move_backoff_max_s": 60.0},
     "move_backoff_max_s must be at least move_backoff_s (got 60 with move_backoff_s 600)"),
])
def test_the_failed_move_settings_are_validated(settings, problem):
    with pytest.raises(UserError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        ActuatorConfig(**settings)


def test_a_lease_left_short_by_a_flag_names_the_flag_beside_the_file(tmp_path):
    path = tmp_path / "actuator.yaml"
    path.write_text("lease_duration_s: 90\n")
    with pytest.raises(UserError) as err:
        load_config(path, {}, {"interval_s": "60"})
    assert str(err.value).startswith(
        f"flag --interval-s and {path}: invalid actuator setting: lease_duration_s must be at "
        "least twice interval_s")


def test_a_refusal_carries_the_api_servers_own_message():
    forbidden = ApiException(status=403, reason="Forbidden")
    forbidden.body = json.dumps({
        "kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403,
        "message": 'pods "j-worker-0" is forbidden: User "system:serviceaccount:rlalloc-system:'
                   'rlalloc-actuator" cannot delete resource "pods" in API group "" in the '
                   'namespace "default"'}).encode()
    assert _status_message(forbidden) == (
        ': pods "j-worker-0" is forbidden: User "system:serviceaccount:rlalloc-system:'
        'rlalloc-actuator" cannot delete resource "pods" in API group "" in the namespace '
        '"default"')
    gateway = ApiException(status=502, reason="Bad Gateway")
    gateway.body = b"<html>bad gateway</html>"
    assert _status_message(gateway) == ""


# ------------------------------------------------------------- the run, against the twin
CYCLE_SIM_S = 30.0
"""Simulated seconds a cycle: the twin runs at `SPEED` x real time, a cycle every `CYCLE_S`."""
SPEED = CYCLE_SIM_S / CYCLE_S


def _pods(twin: object, name: str) -> list[dict]:
    return [p for p in twin.call(twin.api.list, PODS)
            if p["metadata"]["name"].startswith(f"{name}-worker-")]


def _nodes_of(twin: object, name: str) -> list[str]:
    """The nodes of job `name`'s worker pods, sorted ("" for a pod not bound yet)."""
    return sorted(p["spec"].get("nodeName") or "" for p in _pods(twin, name))


def _cycles_until(ctl: object, reports: list, done: object, limit: int) -> bool:
    """Cycles of `ctl`, one every `CYCLE_S` of wall time (their reports appended to `reports`),
    until `done()` holds; whether it did within `limit` cycles."""
    for _ in range(limit):
        started = time.monotonic()
        reports.append(ctl.run_cycle())
        if done():
            return True
        time.sleep(max(CYCLE_S - (time.monotonic() - started), 0.0))
    return False


def _job(twin: object, name: str) -> dict:
    return twin.call(twin.api.get, PYTORCHJOBS, "default", name)


def _pinned(obj: dict) -> set[str]:
    """The hosts a PyTorchJob's workers are pinned to by rlalloc's node affinity."""
    terms = (obj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"].get("affinity")
             or {}).get("nodeAffinity", {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", [])
    return {v for t in terms for e in t.get("matchExpressions", [])
            if e["key"] == HOSTNAME_LABEL for v in e["values"]}


class RemembersAFailingNode(TinyElastic):
    """The tiny policy, told that `node` is failing once `failing` is set: it moves jobs off it
    for as long as that holds, where the XID errors it is warned by come and go (a few an hour:
    the 5-minute count is often 0), and the tiny policy moves a job only while it sees some."""

    def __init__(self, node: str) -> None:
        self.node, self.failing = node, False

    def act(self, state: ClusterState) -> Action:
        """TinyElastic's action with `node` shown warned when it is failing."""
        if self.failing:
            xid = state.nodes.xid_errors_5m.copy()
            xid[state.nodes.name.index(self.node)] += 1
            state = replace(state, nodes=replace(state.nodes, xid_errors_5m=xid))
        return super().act(state)


def _disruptions(obj: dict) -> list[str]:
    return [t for t in obj["metadata"].get("annotations", {}).get(
        "rlalloc.io/disruptions", "").split(",") if t]


@needs_prometheus
@pytest.mark.expensive
def test_a_failover_whose_pod_deletions_are_forbidden_is_bounded_and_completes_once_allowed(
        tmp_path):
    # "j" (4 workers) runs on node-0000, which starts reporting XID errors; the policy moves
    # it off, but the API forbids deleting pods (the Role lacks the verb) for the first
    # `max_move_failures` tries. One-GPU jobs keep arriving meanwhile.
    failures = 3
    arrivals = [job(f"c{i}", 150.0 * (i + 1), 1, 1, 1) for i in range(6)]
    twin, prometheus = start_scraped_twin(tmp_path, [job("j", 0, 4, 4, 4), *arrivals], SPEED)
    try:
        config = twin_config(SPEED, prometheus.url, move_backoff_s=120.0,
                             move_backoff_max_s=480.0, max_move_failures=failures,
                             max_disruptions_per_hour=2)
        policy = RemembersAFailingNode("node-0000")
        ctl = controller(tmp_path, twin, config, policy)
        reports = []

        def cycle_until(done: object, limit: int) -> bool:
            return _cycles_until(ctl, reports, done, limit)

        def j_nodes() -> list[str]:
            return _nodes_of(twin, "j")

        assert cycle_until(lambda: j_nodes() == ["node-0000"] * 4, 60)
        twin.api.inject_fault("DELETE", "/pods/", *[403] * failures)
        now = twin.call(lambda: twin.twin.sim.time_s)
        twin.call(twin.twin.script_failure, ScriptedFailure("node-0000", now + 30.0, now + 1e6))
        policy.failing = True
        assert cycle_until(lambda: HELD_ANNOTATION in _job(twin, "j")["metadata"].get(
            "annotations", {}), 120), "the failing failover was never given up"

        # bounded: exactly `failures` tries, each one DELETE refused, none counted against
        # the budget (nobody was restarted); other jobs started between the tries
        deletes = [r for r in list(twin.api) if str(r.method.value).upper() == "DELETE"]
        assert len(deletes) == failures
        tried = [i for i, r in enumerate(reports) for d, o in r.outcomes
                 if d.action.job_id == "default/j" and o == "failed"]
        assert len(tried) == failures
        assert [d.retry for i in tried for d, _ in reports[i].outcomes] == [False, True, True]
        started_between = [d.action.job_id for r in reports[tried[0] + 1:tried[-1]]
                           for d, o in r.outcomes if o == "applied"]
        assert started_between and "default/j" not in started_between
        held = _job(twin, "j")
        assert _disruptions(held) == []
        mark = held["metadata"]["annotations"][HELD_ANNOTATION]
        assert mark.startswith("MoveGivenUp: migrate default/j off node-0000 to [")
        assert f"failed {failures} times (delete pod default/j-worker-" in mark
        assert "HTTP 403 Forbidden" in mark and " since " in mark
        events = twin.call(twin.api.list, EVENTS)
        assert [e["reason"] for e in events if e["involvedObject"]["name"] == "j"
                and e["reason"] == "MoveGivenUp"] == ["MoveGivenUp"]

        # rolled back at the next cycle: pinned to where its workers are, the cordon lifted
        assert cycle_until(lambda: _pinned(_job(twin, "j")) == {"node-0000"}, 10)
        rolled = _job(twin, "j")
        assert rolled["metadata"]["annotations"]["rlalloc.io/placement"] == "node-0000=4"
        assert not twin.call(twin.api.get, NODES, None, "node-0000")["spec"].get("unschedulable")
        assert any(e["reason"] == "MoveRolledBack" for e in twin.call(twin.api.list, EVENTS))
        # and left alone while nothing changes
        left_alone = len(reports)
        for _ in range(3):
            cycle_until(lambda: False, 1)
        assert not any(d.action.job_id == "default/j" for r in reports[left_alone:]
                       for d, _ in r.outcomes)
        assert HELD_ANNOTATION in _job(twin, "j")["metadata"]["annotations"]

        # deletions allowed again (the faults are spent), the mark removed as the Event says:
        # the failover completes within a few cycles, once counted against the budget
        twin.call(twin.api.patch, PYTORCHJOBS, "default", "j",
                  {"metadata": {"annotations": {HELD_ANNOTATION: None}}})
        released = len(reports)

        def moved() -> bool:
            nodes = j_nodes()
            return (len(nodes) == 4 and "node-0000" not in nodes and "" not in nodes
                    and _pinned(_job(twin, "j")) == set(nodes))

        assert cycle_until(moved, 30), f"j is still on {j_nodes()}"
        assert len(reports) - released <= 5
        done = _job(twin, "j")
        assert done["metadata"]["annotations"]["rlalloc.io/placement"] == format_placement(
            tuple(j_nodes()))
        assert len(_disruptions(done)) == 1
        assert MOVE_FAILURES_ANNOTATION not in done["metadata"]["annotations"]
        assert twin.call(twin.api.get, NODES, None, "node-0000")["spec"]["unschedulable"]
    finally:
        prometheus.stop()
        twin.stop()


@pytest.mark.expensive
def test_a_failover_refused_until_the_permission_returns_completes_at_its_next_try(tmp_path):
    """The run the issue reports, with the Role fixed before the move is given up: no one has
    to step in. Two tries are refused (the Role lacks `delete` on pods); the permission is then
    back, and the next try, one backoff later, completes the failover, counted once against
    the budget; the job is never marked."""
    refused = 2
    twin, prometheus = start_scraped_twin(tmp_path, [job("j", 0, 4, 4, 4)], SPEED)
    try:
        config = twin_config(SPEED, prometheus.url, move_backoff_s=60.0,
                             move_backoff_max_s=120.0, max_move_failures=5,
                             max_disruptions_per_hour=2)
        policy = RemembersAFailingNode("node-0000")
        ctl = controller(tmp_path, twin, config, policy)
        reports: list = []

        def j_nodes() -> list[str]:
            return _nodes_of(twin, "j")

        def moved() -> bool:
            nodes = j_nodes()
            return len(nodes) == 4 and "node-0000" not in nodes and "" not in nodes

        def cycles_until(done: object, limit: int) -> bool:
            return _cycles_until(ctl, reports, done, limit)

        assert cycles_until(lambda: j_nodes() == ["node-0000"] * 4, 60)
        twin.api.inject_fault("DELETE", "/pods/", *[403] * refused)
        now = twin.call(lambda: twin.twin.sim.time_s)
        twin.call(twin.twin.script_failure, ScriptedFailure("node-0000", now + 30.0, now + 1e6))
        policy.failing = True
        assert cycles_until(moved, 60), f"j is still on {j_nodes()}"
        tries = [i for i, r in enumerate(reports) for d, o in r.outcomes
                 if d.action.job_id == "default/j"]
        failed = [i for i in tries if any(o == "failed" for d, o in reports[i].outcomes
                                          if d.action.job_id == "default/j")]
        assert len(failed) == refused
        # the permission came back with the last refusal: the next try is due one backoff
        # (at most 120 simulated s, 4 cycles of 30 s) later, and it completes the move
        assert len(reports) - 1 - failed[-1] <= 120.0 / CYCLE_SIM_S + 2
        done = _job(twin, "j")
        annotations = done["metadata"]["annotations"]
        assert HELD_ANNOTATION not in annotations
        assert MOVE_FAILURES_ANNOTATION not in annotations
        assert len(_disruptions(done)) == 1
        assert _pinned(done) == set(j_nodes())
    finally:
        prometheus.stop()
        twin.stop()
