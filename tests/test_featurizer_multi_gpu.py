"""The featurizer and the residual's proposal features on jobs of multi-GPU workers.

The mask allows exactly the worker targets whose whole workers fit (a 4-GPU worker never lands
on a node with 3 free GPUs), every allowed index decodes to an action the simulator accepts,
and sizes read in GPUs, so that a job of k-GPU workers looks to a policy like a job of 1-GPU
workers on the same GPUs; with 1-GPU workers everywhere, nothing changed.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from rlalloc.agent.residual import proposal_features
from rlalloc.env.failures import FailureParams
from rlalloc.env.featurizer import FeatureSpec, Featurizer, at_risk_nodes
from rlalloc.env.params import SimParams
from rlalloc.env.placement import free_gpus_for, gpus_per_worker_of, requested_workers
from rlalloc.env.state import (
    NOOP,
    Action,
    ActionKind,
    ClusterState,
    Demand,
    JobInfo,
    Jobs,
    JobStatus,
    NodeInfo,
    Nodes,
    Strategy,
)
from rlalloc.env.workload.spec import JobSpec

from sim_helpers import simulator

Q, R = JobStatus.QUEUED, JobStatus.RUNNING
PACKED, SPREAD = Strategy.PACKED, Strategy.SPREAD


def job(job_id: str, status: JobStatus, requested: int, placement: tuple[int, ...] = (),
        per_worker: int = 1, lo: int = 1, hi: int = 8, submit_s: float = 0.0) -> JobInfo:
    """A job of `per_worker`-GPU workers (`requested` in GPUs, `lo`..`hi` in workers)."""
    return JobInfo(job_id, status, submit_s, requested, lo, hi, workers=len(placement),
                   placement=placement, gpus_per_worker=per_worker)


def cluster(jobs: list[JobInfo], warned: tuple[int, ...] = (), gpus: int = 8,
            nodes: int = 2) -> ClusterState:
    """`nodes` nodes of `gpus` GPUs, the free ones what `jobs` leave; `warned` nodes warn."""
    used = [0] * nodes
    for record in jobs:
        for node in record.placement:
            used[node] += record.gpus_per_worker
    records = [NodeInfo(f"node-{i}", gpus, gpus - used[i], xid_errors_5m=3 if i in warned else 0)
               for i in range(nodes)]
    return ClusterState(10_000.0, Nodes.from_records(records), Jobs.from_records(jobs), Demand())


def slot_of(featurizer: Featurizer, state: ClusterState, job_id: str) -> int:
    return featurizer.slots(state).tolist().index(state.job_index(job_id))


def expected_mask(featurizer: Featurizer, state: ClusterState) -> np.ndarray:
    """The mask from its definition: a worker target is allowed where it is a change within the
    job's range and the nodes' whole-worker slots hold it (free GPUs // k); a migration where
    the other nodes' slots hold all of the job's workers."""
    spec, jobs = featurizer.spec, state.jobs
    at_risk = at_risk_nodes(state)
    mask = np.zeros(spec.num_actions, dtype=bool)
    mask[0] = True
    for slot, row in enumerate(featurizer.slots(state).tolist()):
        workers = int(jobs.workers[row])
        lo, hi = int(jobs.min_workers[row]), int(jobs.max_workers[row])
        k = gpus_per_worker_of(state, row)
        capacity = int((free_gpus_for(state, row) // k).sum())
        requested = int(requested_workers(state, row))
        base = 1 + slot * spec.actions_per_slot
        mask[base] = workers > 0
        for level, target in enumerate((*spec.worker_levels, requested)):
            start = base + 1 + level * len(spec.strategies)
            mask[start:start + len(spec.strategies)] = (lo <= target <= hi and target != workers
                                                        and target <= capacity)
        if any(at_risk[node] for node in jobs.placement[row]):
            src = Featurizer._migration_source(state, row)
            elsewhere = int((free_gpus_for(state, row, exclude_node=src) // k).sum())
            mask[base + spec.actions_per_slot - 1] = elsewhere >= workers
    return mask


def test_a_4_gpu_worker_fits_only_where_a_node_has_4_free_gpus():
    """2x8: node-0 has 6 free GPUs, node-1 3 (9 in all, room for 2 workers of 4 GPUs if they
    could be split): a queued job of 4-GPU workers asking for 2 may start 1 worker only, on
    node-0. A running one with its worker on node-1 counts that worker's GPUs as its own: it
    may grow to 2, one worker per node."""
    state = cluster([job("a", R, 2, placement=(0, 0)), job("b", R, 1, placement=(1,)),
                     job("r", R, 8, placement=(1,), per_worker=4, lo=1, hi=4),
                     job("q", Q, 8, per_worker=4, lo=1, hi=4, submit_s=5.0)])
    assert state.nodes.gpus_free.tolist() == [6, 3]
    featurizer = Featurizer(FeatureSpec(top_k=4))
    mask = featurizer.action_mask(state)
    assert np.array_equal(mask, expected_mask(featurizer, state))
    q, r = slot_of(featurizer, state, "q"), slot_of(featurizer, state, "r")
    for strategy in (PACKED, SPREAD):
        start_one = featurizer.encode_scale(q, 1, strategy)
        assert mask[start_one]
        assert featurizer.decode(state, start_one) == Action(ActionKind.SCALE, "q", 1,
                                                              ("node-0",))
        for workers in (2, None, 4):  # None: its request, 2 workers
            assert not mask[featurizer.encode_scale(q, workers, strategy)], workers
        assert mask[featurizer.encode_scale(r, 2, strategy)]
        assert mask[featurizer.encode_scale(r, None, strategy)]
        assert not mask[featurizer.encode_scale(r, 1, strategy)]  # its size already
        assert not mask[featurizer.encode_scale(r, 4, strategy)]
    assert featurizer.decode(state, featurizer.encode_scale(r, None, PACKED)) == Action(
        ActionKind.SCALE, "r", 2, ("node-0", "node-1"))
    assert not mask[featurizer.encode_migrate(r)]  # no node warns


@pytest.mark.parametrize(("used_on_0", "fits"), [(2, True), (5, False)])
def test_a_migration_needs_whole_worker_slots_off_the_warned_node(used_on_0, fits):
    """r's 4-GPU worker is on warned node-1; node-0 has 6 free GPUs (room for it) or 3 (none,
    though 3 GPUs are free)."""
    state = cluster([job("a", R, used_on_0, placement=(0,) * used_on_0),
                     job("r", R, 4, placement=(1,), per_worker=4, lo=1, hi=2)], warned=(1,))
    featurizer = Featurizer(FeatureSpec(top_k=2))
    mask = featurizer.action_mask(state)
    assert np.array_equal(mask, expected_mask(featurizer, state))
    migrate = featurizer.encode_migrate(slot_of(featurizer, state, "r"))
    assert mask[migrate] == fits
    expected = (Action(ActionKind.MIGRATE, "r", 1, ("node-0",), from_node="node-1") if fits
                else NOOP)
    assert featurizer.decode(state, migrate) == expected


def test_a_job_of_4_gpu_workers_reads_like_one_of_1_gpu_workers_on_the_same_gpus():
    """Sizes, shares and speed-ups are in GPUs: 3 workers of 4 GPUs (8 on node-0, 4 on node-1)
    give the observation of 12 workers of 1 GPU placed the same, and so does the residual's
    view of a proposal to grow to 4 workers / 16 GPUs."""
    by_worker = cluster([job("x", R, 8, placement=(0, 0, 1), per_worker=4, lo=1, hi=4),
                         job("y", Q, 4, per_worker=2, lo=1, hi=3, submit_s=5.0)])
    by_gpu = cluster([job("x", R, 8, placement=(0,) * 8 + (1,) * 4, lo=4, hi=16),
                      job("y", Q, 4, lo=2, hi=6, submit_s=5.0)])
    spec = FeatureSpec(top_k=4)
    assert np.array_equal(Featurizer(spec).observe(by_worker), Featurizer(spec).observe(by_gpu))
    grow_by_worker = Action(ActionKind.SCALE, "x", 4, ("node-0", "node-0", "node-1", "node-1"))
    grow_by_gpu = Action(ActionKind.SCALE, "x", 16, ("node-0",) * 8 + ("node-1",) * 8)
    assert np.array_equal(proposal_features(by_worker, grow_by_worker),
                          proposal_features(by_gpu, grow_by_gpu))


def test_with_1_gpu_workers_observation_and_mask_are_what_they_were():
    """A state of 1-GPU workers everywhere (warned node, queued and running jobs, a spread
    one): the observation and mask bytes that the featurizer gave before jobs could have
    multi-GPU workers (hashes taken from it), which the shipped models were trained on."""
    records = [job("a", R, 2, placement=(0, 0), submit_s=1.0),
               job("b", R, 4, placement=(0, 1, 1, 2), hi=16, submit_s=2.0),
               job("c", R, 8, placement=(2,) * 5, lo=2, submit_s=3.0),
               job("q", Q, 4, submit_s=4.0), job("p", Q, 16, lo=4, hi=16, submit_s=5.0)]
    state = cluster(records, warned=(1,), nodes=3)
    assert all(r.gpus_per_worker == 1 for r in records)
    featurizer = Featurizer(FeatureSpec(top_k=6))
    obs, mask = featurizer.observe(state), featurizer.action_mask(state)
    assert hashlib.sha256(obs.tobytes()).hexdigest() == OBS_SHA256, obs.tolist()
    assert hashlib.sha256(mask.tobytes()).hexdigest() == MASK_SHA256, np.flatnonzero(mask)
    assert np.array_equal(mask, expected_mask(featurizer, state))


OBS_SHA256 = "56f992c9175a7726fb741f12ce6ba47c7d77019b4c62f6d5e5f6eee6e7d45865"
MASK_SHA256 = "b18ed7286785ef5c1ece07550627beacea09e35eaaa98df3501ca810d22455d1"
"""Of the featurizer at a03b039 (before multi-GPU workers) on the state above."""


def mixed_workload(rng: np.random.Generator, count: int = 14) -> list[JobSpec]:
    """Jobs of 1-, 2-, 3- and 4-GPU workers (3 does not divide a node's 8 GPUs)."""
    jobs = []
    for i in range(count):
        per_worker = int(rng.choice([1, 2, 3, 4]))
        hi = int(rng.choice([2, 3, 4]))
        requested = per_worker * int(rng.integers(1, hi + 1))
        jobs.append(JobSpec(f"j{i}", 300.0 * i, requested, float(rng.uniform(2_000, 20_000)),
                            1, hi, 30.0, gpus_per_worker=per_worker))
    return jobs


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_allowed_action_on_mixed_worker_sizes_is_one_the_simulator_accepts(seed):
    """A 2x8 simulator over jobs of mixed GPUs per worker, with failures and warned nodes,
    stepped by random allowed actions: the mask is its definition's (`expected_mask`), every
    allowed index decodes to an action the simulator accepts, every other one to a no-op or
    one it refuses, and the cached featurizer agrees with a fresh one."""
    rng = np.random.default_rng(seed)
    params = SimParams(failures=FailureParams(failures_per_gpu_day=0.25, repair_s=1800.0))
    sim = simulator(mixed_workload(rng), nodes=2, gpus=8, seed=seed, params=params)
    sim.schedule_failure(sim.node_names[1], 3_000.0, warning_lead_s=2_000.0)
    sim.schedule_failure(sim.node_names[0], 12_000.0, warning_lead_s=2_000.0)
    featurizer = Featurizer(FeatureSpec(top_k=6))
    seen = {"multi_gpu_scales": 0, "migrations": 0}
    for _ in range(400):
        if sim.done:
            break
        state = sim.state()
        mask = featurizer.action_mask(state)
        assert np.array_equal(mask, expected_mask(featurizer, state))
        fresh = Featurizer(featurizer.spec)
        assert np.array_equal(featurizer.observe(state), fresh.observe(state))
        assert np.array_equal(mask, fresh.action_mask(state))
        for index in np.flatnonzero(mask)[1:]:
            action = featurizer.decode(state, int(index))
            assert action.kind != ActionKind.NOOP, index
            assert sim.validate(action) == "", (index, action)
            row = state.job_index(action.job_id)
            seen["multi_gpu_scales"] += (action.kind == ActionKind.SCALE
                                         and gpus_per_worker_of(state, row) > 1)
            seen["migrations"] += action.kind == ActionKind.MIGRATE
        for index in np.flatnonzero(~mask):
            action = featurizer.decode(state, int(index))
            assert action.kind == ActionKind.NOOP or sim.validate(action), (index, action)
        valid = np.flatnonzero(mask)
        index = 0 if rng.random() < 0.4 else int(rng.choice(valid))
        if index == 0 or not sim.apply(featurizer.decode(state, index)):
            sim.advance()
    assert min(seen.values()) > 0, seen
