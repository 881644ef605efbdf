"""Jobs of multi-GPU workers (`gpus_per_worker` k): a worker pod requests k GPUs, all on its node.

The actuator reads k from the worker pod template, places and moves whole workers (its placement
names a node per worker), and its guardrails count k GPUs a worker; a job whose workers ask for
more GPUs than any node has, or whose GPU request Kubernetes would refuse, is left alone with one
log line. The twin serves such jobs as the training operator and the scheduler would.
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest

from rlalloc.actuator.apply import placement_patch
from rlalloc.actuator.config import ActuatorConfig
from rlalloc.actuator.guardrails import DecisionHistory, check, decide, reserve
from rlalloc.actuator.k8s_names import (
    HOSTNAME_LABEL,
    PLACEMENT_ANNOTATION,
    REQUESTED_WORKERS_ANNOTATION,
)
from rlalloc.actuator.state_builder import JobRef, Ledger, Observation, build_state, worker_gpus
from rlalloc.actuator.twin.kube_api import (
    PODS,
    PYTORCHJOBS,
    ApiServerThread,
    TwinKubeAPI,
)
from rlalloc.actuator.twin.render import cluster_objects, query_results
from rlalloc.actuator.twin.runtime import ScriptedFailure, Twin
from rlalloc.env.rebuild import simulator_from_state
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
    Scripted,
    TinyElastic,
    controller,
    job,
    needs_prometheus,
    quiet_params,
    scenario,
    served_state,
    start_scraped_twin,
    state_controller,
    twin_config,
    wait_until,
)

GPU = "nvidia.com/gpu"


def _pytorchjob(resources: dict) -> dict:
    """A PyTorchJob whose worker container has `resources`."""
    return {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 1, "template": {"spec": {
        "containers": [{"name": "pytorch", "resources": resources}]}}}}}}


@pytest.mark.parametrize(("resources", "gpus"), [
    ({"requests": {GPU: 8}, "limits": {GPU: 8}}, 8),
    ({"requests": {GPU: "2", "cpu": "4"}, "limits": {GPU: "2"}}, 2),
    ({"limits": {GPU: "4"}}, 4),  # Kubernetes takes a limit alone as the request
    ({"requests": {"cpu": "4"}, "limits": {GPU: 8}}, 8),
])
def test_gpus_per_worker_are_the_worker_templates_request(resources, gpus):
    assert worker_gpus(_pytorchjob(resources), GPU) == (gpus, "")


@pytest.mark.parametrize(("resources", "why"), [
    ({"requests": {GPU: 2}, "limits": {GPU: 4}},
     "container 'pytorch' of its worker pods requests 2 nvidia.com/gpu with a limit of 4; a GPU "
     "request must equal its limit (Kubernetes refuses such a pod), so rlalloc leaves the job "
     "alone"),
    ({"requests": {GPU: "1.5"}, "limits": {GPU: "1.5"}},
     "container 'pytorch' of its worker pods asks for 1.5 nvidia.com/gpu, not a whole number of "
     "GPUs; rlalloc leaves the job alone"),
    ({"limits": {GPU: "500m"}}, "asks for 500m nvidia.com/gpu, not a whole number of GPUs"),
    ({"requests": {GPU: "NaN"}, "limits": {GPU: "eight"}}, "asks for NaN nvidia.com/gpu"),
    ({"requests": {"cpu": "4"}}, "its worker pods request no nvidia.com/gpu"),
])
def test_a_gpu_request_kubernetes_would_refuse_is_named(resources, why):
    gpus, problem = worker_gpus(_pytorchjob(resources), GPU)
    assert gpus == 0 and why in problem


def _state(*jobs: JobInfo, nodes: int = 3, gpus: int = 8) -> ClusterState:
    """`jobs` on `nodes` x `gpus`, each node's free GPUs what the jobs leave."""
    free = [gpus] * nodes
    for info in jobs:
        for node in info.placement:
            free[node] -= info.gpus_per_worker
    pending = sum(info.requested_gpus for info in jobs if not info.placement)
    return ClusterState(
        time_s=1000.0, jobs=Jobs.from_records(list(jobs)), demand=Demand(pending_gpus=pending),
        nodes=Nodes.from_records([NodeInfo(f"node-{i:04d}", gpus, free[i])
                                  for i in range(nodes)]))


def _observe(state: ClusterState, time_s: float | None = None) -> Observation:
    """What a cluster in `state` shows, read at `time_s` (default: the state's time)."""
    names = {job_id: job_id for job_id in state.jobs.job_id}
    nodes, pods, jobs = cluster_objects(state, "default", names)
    now = state.time_s if time_s is None else time_s
    return Observation(now, nodes, pods, jobs, query_results(state, "default", names, now))


def test_a_job_of_multi_gpu_workers_is_read_in_workers_and_its_gpus():
    """Before, an opted-in job of 2-GPU workers was left alone as another tenant's; now its
    workers count k GPUs each: requested GPUs, free GPUs and attained GPU-seconds."""
    state = _state(JobInfo("j", JobStatus.RUNNING, 0.0, 8, 1, 3, workers=2, placement=(0, 1),
                           throughput=1.0, gpus_per_worker=4),
                   JobInfo("q", JobStatus.QUEUED, 10.0, 16, 2, 2, gpus_per_worker=8))
    built = build_state(_observe(state), ActuatorConfig(), Ledger())
    jobs = built.state.jobs
    assert not built.unmanageable
    assert jobs.job_id == ("default/j", "default/q")
    assert jobs.gpus_per_worker.tolist() == [4, 8]
    assert jobs.requested_gpus.tolist() == [8, 16]
    assert (jobs.min_workers.tolist(), jobs.max_workers.tolist()) == ([1, 2], [3, 2])
    assert jobs.workers.tolist() == [2, 0] and jobs.placement == ((0, 1), ())
    assert built.state.nodes.gpus_free.tolist() == [4, 4, 8]
    assert built.state.demand.pending_gpus == 16
    later = build_state(_observe(state, state.time_s + 10.0), ActuatorConfig(), built.ledger)
    assert later.state.jobs.attained_gpu_s.tolist() == [2 * 4 * 10.0, 0.0]


def test_a_job_left_alone_keeps_its_gpus_counted():
    """A running job whose template asks for a request other than its limit is not managed,
    but its pods' GPUs are still taken: no policy may plan with them."""
    state = _state(JobInfo("j", JobStatus.RUNNING, 0.0, 4, 1, 1, workers=1, placement=(0,),
                           throughput=1.0, gpus_per_worker=4))
    obs = _observe(state)
    [container] = obs.jobs[0]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"][
        "containers"]
    container["resources"] = {"requests": {GPU: 2}, "limits": {GPU: 4}}
    built = build_state(obs, ActuatorConfig(), Ledger())
    assert built.state.jobs.count == 0 and set(built.unmanageable) == {"default/j"}
    assert built.state.nodes.gpus_free.tolist() == [4, 8, 8]


def test_the_state_rebuilds_into_a_simulator_of_whole_workers():
    """The planner forks a simulator rebuilt from the actuator's state: it must hold each job's
    workers of k GPUs where the state has them (a worker of one GPU would leave GPUs free that
    are taken, and a request that is not whole workers is no workload)."""
    state = _state(JobInfo("j", JobStatus.RUNNING, 0.0, 8, 1, 3, workers=2, placement=(0, 1),
                           throughput=1.0, progress=0.25, gpus_per_worker=4),
                   JobInfo("q", JobStatus.QUEUED, 10.0, 16, 2, 2, gpus_per_worker=8))
    again = simulator_from_state(state, np.array([3600.0, 7200.0])).state()
    assert again.jobs.gpus_per_worker.tolist() == [4, 8]
    assert again.jobs.requested_gpus.tolist() == [8, 16]
    assert again.jobs.placement == state.jobs.placement
    assert again.nodes.gpus_free.tolist() == state.nodes.gpus_free.tolist() == [4, 4, 8]


def _worker_spec(server: ApiServerThread, name: str) -> tuple[int, list[str], str]:
    """(replicas, node affinity's host names, placement annotation) of PyTorchJob `name`."""
    obj = server.call(server.api.get, PYTORCHJOBS, "default", name)
    worker = obj["spec"]["pytorchReplicaSpecs"]["Worker"]
    terms = worker["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    [hosts] = [e["values"] for term in terms for e in term["matchExpressions"]
               if e["key"] == HOSTNAME_LABEL]
    return worker["replicas"], hosts, obj["metadata"]["annotations"][PLACEMENT_ANNOTATION]


def test_scaling_a_job_of_8_gpu_workers_places_whole_workers(tmp_path):
    """3 nodes x 8 GPUs, a job of 8-GPU workers running one on node-0000: grown to two, one
    worker a node. Two on node-0000 (16 GPUs of its 8) is refused by the free-GPU guardrail,
    which used to count a worker as one GPU."""
    state = _state(JobInfo("j", JobStatus.RUNNING, 0.0, 8, 1, 2, workers=1, placement=(0,),
                           throughput=1.0, gpus_per_worker=8))
    stacked = Action(ActionKind.SCALE, "default/j", 2, ("node-0000", "node-0000"))
    server = served_state(state)
    # a job rlalloc has not changed yet: its first patch records its request, in workers
    server.call(server.api.patch, PYTORCHJOBS, "default", "j",
                {"metadata": {"annotations": {REQUESTED_WORKERS_ANNOTATION: None}}})
    try:
        ctl = state_controller(tmp_path, server, state, Scripted(stacked))
        [(refused, outcome)] = ctl.run_cycle().outcomes
        assert outcome == "refused" and refused.reason == (
            "not enough free GPUs on node-0000: needs 16 (2 workers of 8), 8 free")
        ctl = state_controller(tmp_path, server, state, TinyElastic())
        [(decision, outcome)] = ctl.run_cycle().outcomes
        assert outcome == "applied", decision.reason
        assert decision.action.nodes == ("node-0000", "node-0001")
        assert _worker_spec(server, "j") == (2, ["node-0000", "node-0001"],
                                             "node-0000=1,node-0001=1")
        annotations = server.call(server.api.get, PYTORCHJOBS, "default", "j")["metadata"][
            "annotations"]
        assert annotations[REQUESTED_WORKERS_ANNOTATION] == "1"  # 8 GPUs: one worker
        # worker 0 stays where it runs: the new placement keeps it there
        assert server.call(server.api.get, PODS, "default", "j-worker-0") is not None
    finally:
        server.stop()


@pytest.mark.parametrize(("resources", "why"), [
    ({"requests": {GPU: 16}, "limits": {GPU: 16}},
     "its worker pods request 16 nvidia.com/gpu each, more than any node has (the largest, "
     "node-0000, has 8); a worker's GPUs must all be on one node, so rlalloc leaves the job "
     "alone"),
    ({"requests": {GPU: 4}, "limits": {GPU: 8}},
     "container 'pytorch' of its worker pods requests 4 nvidia.com/gpu with a limit of 8; a GPU "
     "request must equal its limit (Kubernetes refuses such a pod), so rlalloc leaves the job "
     "alone"),
], ids=["larger-than-any-node", "request-not-limit"])
def test_a_job_the_actuator_cannot_place_is_refused_with_one_line_and_never_patched(
        tmp_path, caplog, resources, why):
    state = _state(JobInfo("big", JobStatus.QUEUED, 0.0, 8, 1, 1, gpus_per_worker=8),
                   JobInfo("small", JobStatus.QUEUED, 10.0, 8, 1, 1, gpus_per_worker=8))
    server = served_state(state, {"big": resources})
    try:
        policy = Scripted(Action(ActionKind.SCALE, "default/big", 1, ("node-0000",)),
                          Action(ActionKind.SCALE, "default/small", 1, ("node-0001",)))
        ctl = state_controller(tmp_path, server, state, policy)
        with caplog.at_level(logging.WARNING, logger="rlalloc.actuator"):
            reports = [ctl.run_cycle() for _ in range(3)]
        assert "default/big" not in reports[0].built.state.jobs.job_id
        lines = [r.getMessage() for r in caplog.records if "default/big" in r.getMessage()
                 and "opted in" in r.getMessage()]
        assert lines == [f"job default/big is opted in but not managed: {why}"]
        outcomes = [(d.action.job_id, o, d.reason) for r in reports for d, o in r.outcomes]
        assert outcomes[0][:2] == ("default/big", "refused")
        assert "is not managed" in outcomes[0][2]
        assert ("default/small", "applied") in [o[:2] for o in outcomes]  # the others go on
        patched = [r.url.path for r in list(server.api)
                   if str(r.method.value).upper() != "GET" and "/pytorchjobs/" in r.url.path]
        assert patched and not [path for path in patched if path.endswith("/big")]
    finally:
        server.stop()


def test_a_failover_moves_whole_workers_and_counts_their_gpus():
    """Job j (two 4-GPU workers) leaves warned node-0000: node-0001 has room for one worker
    (4 GPUs free), node-0002 for two."""
    state = _state(JobInfo("j", JobStatus.RUNNING, 0.0, 8, 2, 2, workers=2, placement=(0, 0),
                           throughput=1.0, gpus_per_worker=4),
                   JobInfo("o", JobStatus.RUNNING, 0.0, 4, 1, 1, workers=1, placement=(1,),
                           throughput=1.0, gpus_per_worker=4))
    config, history = ActuatorConfig(), DecisionHistory()
    squeezed = Action(ActionKind.MIGRATE, "j", 2, ("node-0001", "node-0001"), "node-0000")
    assert check(state, squeezed, config, history, frozenset()) == (
        "not enough free GPUs on node-0001: needs 8 (2 workers of 4), 4 free")
    moved = Action(ActionKind.MIGRATE, "j", 2, ("node-0001", "node-0002"), "node-0000")
    cycle = decide(state, Scripted(moved), config, history)
    assert [d.accepted for d in cycle.decisions] == [True]
    nodes = cycle.projected.nodes
    assert nodes.gpus_free.tolist() == [8, 0, 4] and nodes.cordoned.tolist() == [True, False,
                                                                                 False]
    # a half-applied move waiting for its next try holds its 4 GPUs a worker
    assert reserve(state, moved).nodes.gpus_free.tolist() == [0, 0, 4]


def test_the_twin_serves_jobs_of_multi_gpu_workers():
    """Its PyTorchJobs run k processes a worker pod of k GPUs; its scheduler binds a pod only
    where all k are free, so a third 8-GPU worker stays Pending beside another job's 4 GPUs."""
    jobs = [job("a", 0, 16, 1, 3, gpus_per_worker=8), job("o", 0, 4, 1, 1, gpus_per_worker=4)]
    sim = scenario(jobs, nodes=3, gpus=8).simulator(quiet_params(60.0, 1.0))
    api = TwinKubeAPI()
    twin = Twin(sim, api, speed=60.0)
    twin.tick(1.0)
    obj = api.get(PYTORCHJOBS, "default", "a")
    [container] = obj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    assert obj["spec"]["nprocPerNode"] == "8"
    assert container["resources"] == {"requests": {GPU: 8}, "limits": {GPU: 8}}
    assert obj["metadata"]["annotations"][REQUESTED_WORKERS_ANNOTATION] == "2"
    api.patch(PYTORCHJOBS, "default", "o", placement_patch(
        JobRef("default", "o", "", api.get(PYTORCHJOBS, "default", "o"), ()),
        Action(ActionKind.SCALE, "o", 1, ("node-0002",)), 1))
    api.patch(PYTORCHJOBS, "default", "a", placement_patch(
        JobRef("default", "a", "", obj, ()), Action(ActionKind.SCALE, "a", 2,
                                                    ("node-0000", "node-0001")), 2))
    twin.tick(1.0)
    state = sim.state()
    assert state.jobs.placement == ((0, 1), (2,))
    assert state.nodes.gpus_free.tolist() == [0, 0, 4]
    pods = {p["metadata"]["name"]: p for p in api.list(PODS)}
    assert {name: (p["spec"].get("nodeName"), p["spec"]["containers"][0]["resources"][
        "requests"][GPU]) for name, p in pods.items() if name.startswith("a-")} == {
        "a-worker-0": ("node-0000", "8"), "a-worker-1": ("node-0001", "8")}
    assert {p.name: p.gpus for p in twin.frame.pods} == {
        "a-worker-0": 8, "a-worker-1": 8, "o-worker-0": 4}
    # a third worker: no node has 8 GPUs free (node-0002 has 4), so it waits
    api.patch(PYTORCHJOBS, "default", "a", {"spec": {"pytorchReplicaSpecs": {"Worker": {
        "replicas": 3, "template": {"spec": {"affinity": None}}}}}})
    twin.tick(1.0)
    assert sim.state().jobs.placement[0] == (0, 1)
    assert "nodeName" not in api.get(PODS, "default", "a-worker-2")["spec"]


SPEED = 160.0
"""As test_actuator_e2e's failover: a twin clock the actuator's cycles keep up with on 2 cores."""


@needs_prometheus
@pytest.mark.expensive
def test_a_job_of_8_gpu_workers_is_grown_and_failed_over_against_the_twin(tmp_path):
    """Through a real Prometheus: a job of 8-GPU workers on 3 x 8 GPUs is started on one
    worker, grown to two (one a node), and, when one of its nodes warns, moved whole to the
    free node before that one fails."""
    twin, prometheus = start_scraped_twin(tmp_path, [job("a", 0, 8, 1, 2, gpus_per_worker=8)],
                                          SPEED, nodes=3, gpus=8)
    stop = threading.Event()

    def placement() -> tuple[int, ...]:
        return twin.call(lambda: twin.twin.sim.state().jobs.placement[0])

    try:
        ctl = controller(tmp_path, twin, twin_config(SPEED, prometheus.url), TinyElastic())
        thread = threading.Thread(target=ctl.run, args=(stop,), daemon=True)
        thread.start()
        assert wait_until(lambda: placement() == (0, 1), 60), placement()
        now = twin.call(lambda: twin.twin.sim.time_s)
        failure = ScriptedFailure("node-0001", now + 100.0, now + 1500.0)
        twin.call(twin.twin.script_failure, failure)
        assert wait_until(lambda: twin.call(lambda: twin.twin.sim.time_s) > now + 1600.0, 120)
        stop.set()
        thread.join(10)
        assert placement() == (0, 2)  # the worker on node-0001 moved, whole, to node-0002
        assert twin.call(lambda: twin.twin.failure_hits) == {failure: ()}
        assert ctl.metrics.decisions.labels("migrate", "applied")._value.get() == 1
        pods = twin.call(twin.api.list, PODS)
        assert sorted((p["spec"].get("nodeName"), p["spec"]["containers"][0]["resources"][
            "requests"][GPU]) for p in pods) == [("node-0000", "8"), ("node-0002", "8")]
    finally:
        stop.set()
        prometheus.stop()
        twin.stop()
