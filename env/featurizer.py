"""One featurizer: `ClusterState` -> observation and action mask; discrete action -> `Action`.

The Gymnasium environment, the evaluation and the in-cluster actuator all go through this
module, so a policy trained in the simulator sees exactly the same numbers in the cluster.

Job slots: the policy sees the top-K jobs in a stable order: up to half the slots for queued
jobs (oldest first), then the rest for running jobs, those on warned or risky nodes before the
others (so it can move them; oldest first within each); unused slots spill over to the other
group.

Discrete action layout: index 0 is no-op; then, for each slot k, a block of
``1 + (len(worker_levels) + 1) * len(strategies) * max(len(gpu_types), 1) + 1`` actions:
suspend | scale to each worker level (and to the job's requested workers) with each placement
strategy (and, for a policy built for several GPU types, `FeatureSpec.gpu_types`, onto each
type: the innermost index) | migrate off its most at-risk node (on the type it runs on).

GPU types: with `FeatureSpec.gpu_types` empty (every policy built for one type) a scale action
places the job on the type it runs on, or the fastest that holds it, as `choose_nodes` does,
and the observation says nothing of types. With types, the observation ends with a block of
per-type features (`TYPE_CLUSTER_FEATURES` per type, then `TYPE_JOB_FEATURES` per type for
each slot, `_type_features`), so that the first `CLUSTER_FEATURES + top_k * JOB_FEATURES`
entries are the untyped observation; a state with a type the spec lacks is refused.

Actions count workers (a worker holds the job's `gpus_per_worker` GPUs, all on one node), and
a target is allowed only where the job's whole workers fit. Features that say how big a job is
or what share of the cluster it holds count GPUs, so a job of 1-GPU workers reads as it always
did, and a job of k-GPU workers reads like one of 1-GPU workers on the same GPUs.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from rlalloc.env.errors import UserError
from rlalloc.env.placement import choose_nodes, job_gpu_type, requested_workers
from rlalloc.env.state import (
    NOOP,
    Action,
    ActionKind,
    ClusterState,
    Jobs,
    JobStatus,
    Nodes,
    Strategy,
)

_SCALE, _MIGRATE, _PACKED = ActionKind.SCALE, ActionKind.MIGRATE, Strategy.PACKED

_QUEUED, _RUNNING, _RESTARTING = (int(JobStatus.QUEUED), int(JobStatus.RUNNING),
                                  int(JobStatus.RESTARTING))
_LOG_GPUS = math.log2(1 + 256)
_FREE_THRESHOLDS = (1, 2, 4, 8)
RISKY_NODE_SCORE = 0.5
"""A node whose failure-risk score reaches this counts as at risk, like a warned node."""


@dataclass(frozen=True, slots=True)
class FeatureSpec:
    """Shape of the observation and action space (saved with every trained policy)."""

    top_k: int = 16
    """Job slots visible to the policy."""
    worker_levels: tuple[int, ...] = (1, 2, 4, 8, 16)
    """Worker counts a scale action can ask for (plus the job's requested workers: its
    requested GPUs / GPUs per worker)."""
    strategies: tuple[Strategy, ...] = (Strategy.PACKED, Strategy.SPREAD)
    """Candidate placements for every scale action."""
    checkpoint_interval_s: float = 1800.0
    """Normalises time since the last checkpoint."""
    gpu_types: tuple[str, ...] = ()
    """GPU types the policy is built for (`policy_gpu_types` of its training cluster): each is
    a scale target of its own and has features of its own. Empty: the spaces of a one-type
    policy, which places a job on the type it runs on or the fastest that holds it."""

    def __post_init__(self) -> None:
        if len(set(self.gpu_types)) != len(self.gpu_types):
            raise ValueError(f"gpu_types {self.gpu_types!r} names a type twice")

    @property
    def levels_per_slot(self) -> int:
        """Worker targets per slot: the fixed levels plus 'requested'."""
        return len(self.worker_levels) + 1

    @property
    def types_per_target(self) -> int:
        """GPU types each (worker target, strategy) is offered on: 1 without `gpu_types`."""
        return max(len(self.gpu_types), 1)

    @property
    def actions_per_slot(self) -> int:
        """Suspend + scale targets x strategies x types + migrate."""
        return 2 + self.levels_per_slot * len(self.strategies) * self.types_per_target

    @property
    def num_actions(self) -> int:
        """Size of the `Discrete` action space."""
        return 1 + self.top_k * self.actions_per_slot

    @property
    def obs_size(self) -> int:
        """Length of the observation vector."""
        return (CLUSTER_FEATURES + self.top_k * JOB_FEATURES
                + len(self.gpu_types) * (TYPE_CLUSTER_FEATURES + self.top_k * TYPE_JOB_FEATURES))


CLUSTER_FEATURES = 18
OBS_BOUND = 10.0
"""Every feature is scaled to roughly [-1, 4]; the observation is clipped to +-OBS_BOUND."""
JOB_FEATURES = 19
TYPE_CLUSTER_FEATURES = 3
"""Per GPU type of a typed spec: the cluster has it, share of its GPUs free on usable nodes,
its share of the cluster's GPUs."""
TYPE_JOB_FEATURES = 2
"""Per GPU type, for each slot of a typed spec: the job's speed there (`type_speed_log2`, a
type not in the cluster 0) and whether it runs there (one-hot)."""
TYPE_SPEED_BOUND = 4.0
"""Speed ratios between types are shown as log2, clipped to +-this (16 times)."""


def policy_gpu_types(type_names: Iterable[str]) -> tuple[str, ...]:
    """`FeatureSpec.gpu_types` of a policy for a cluster of nodes of these GPU types: none for
    one type (the untyped spaces), else each type once, sorted by name, so that the same
    cluster gives the same spec whatever the order of its node groups."""
    types = sorted(set(type_names))
    return tuple(types) if len(types) > 1 else ()


def type_speed_log2(state: ClusterState, rows: np.ndarray,
                    gpu_types: tuple[str, ...]) -> np.ndarray:
    """float64 (rows, types): log2 of jobs `rows`' one-GPU speed on each of `gpu_types` over
    their speed on the cluster's reference (slowest) type, `state.jobs.speed_1gpu`, clipped to
    +-`TYPE_SPEED_BOUND`; 0 for a type not in the cluster (and on a one-type cluster, whose
    only type is the reference)."""
    out = np.zeros((len(rows), len(gpu_types)))
    speeds = state.type_speeds
    if speeds is None or not len(rows):
        return out
    present = [(i, speeds.column(t)) for i, t in enumerate(gpu_types) if t in speeds.gpu_types]
    if not present:
        return out
    spec_cols, state_cols = (list(c) for c in zip(*present, strict=True))
    ratio = (speeds.speed_1gpu[np.ix_(rows, state_cols)].astype(np.float64)
             / state.jobs.speed_1gpu[rows].astype(np.float64)[:, None])
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.nan_to_num(np.log2(ratio), nan=0.0, posinf=TYPE_SPEED_BOUND,
                             neginf=-TYPE_SPEED_BOUND)
    out[:, spec_cols] = np.clip(logs, -TYPE_SPEED_BOUND, TYPE_SPEED_BOUND)
    return out


def select_slots(state: ClusterState, top_k: int,
                 at_risk: np.ndarray | None = None) -> np.ndarray:
    """Rows of `state.jobs` shown to the policy, in slot order (see module docstring).
    `at_risk` is `at_risk_nodes(state)` when the caller has it already."""
    if at_risk is None:
        at_risk = at_risk_nodes(state)
    rows = _slot_rows(state.jobs.status.tolist(), state.jobs.placement, at_risk, top_k)
    return np.array(rows, dtype=np.int64)


def _slot_rows(status: list[int], placement: tuple[tuple[int, ...], ...], at_risk: np.ndarray,
               top_k: int) -> list[int]:
    """`select_slots` on plain lists: a state holds tens of jobs, where list work beats a dozen
    numpy calls."""
    queued = [row for row, s in enumerate(status) if s == _QUEUED]
    allocated = [row for row, s in enumerate(status) if s != _QUEUED]
    if allocated and at_risk.any():
        risky = at_risk.tolist()
        on_risky = [_touches(risky, placement[row]) for row in allocated]
        allocated = ([row for row, on in zip(allocated, on_risky, strict=True) if on]
                     + [row for row, on in zip(allocated, on_risky, strict=True) if not on])
    # rows are in arrival order already in both groups (stable ordering)
    n_queued = min(len(queued), max(top_k // 2, top_k - len(allocated)))
    n_alloc = min(len(allocated), top_k - n_queued)
    return queued[:n_queued] + allocated[:n_alloc]


def _touches(flags: list[bool], placement: tuple[int, ...]) -> bool:
    """Whether a placement uses a node whose flag is set (e.g. an at-risk node)."""
    return any(map(flags.__getitem__, placement))


def at_risk_nodes(state: ClusterState) -> np.ndarray:
    """bool per node: telemetry warns, or the risk model scores it at least `RISKY_NODE_SCORE`."""
    return state.nodes.warned | (state.nodes.failure_risk >= RISKY_NODE_SCORE)


def speedup(n: np.ndarray, nodes: np.ndarray, alpha: np.ndarray,
            beta: np.ndarray) -> np.ndarray:
    """Throughput of n GPUs on `nodes` nodes relative to one GPU: the state's scaling curve
    ``n / (1 + alpha (n - 1) + beta n [nodes > 1])`` (see `rlalloc.env.profiles.GenericScaling`;
    n counts GPUs whatever the job's GPUs per worker)."""
    n = np.asarray(n, dtype=np.float64)
    cross = np.where(np.asarray(nodes) > 1, beta * n, 0.0)
    return np.where(n > 0, n / (1.0 + alpha * np.maximum(n - 1, 0) + cross), 0.0)


def _speedup_scalar(n: int, nodes: int, alpha: float, beta: float) -> float:
    """`speedup` for one job, in plain Python (the featurizer's hot loop)."""
    if n <= 0:
        return 0.0
    return n / (1.0 + alpha * (n - 1) + (beta * n if nodes > 1 else 0.0))


_VALUE_CACHE_SIZE = 8192
"""Entries kept in each of the featurizer's value caches (attribute classes, feature rows,
mask blocks) before it is emptied; a 16x4 episode uses a few hundred."""


def _allocation_features(status: int, workers: int, req: int, lo: int, hi: int, alpha: float,
                         beta: float, restore: float, per_worker: int, placement: tuple[int, ...],
                         per_node: int) -> tuple[float, ...]:
    """The parts of a job's feature row that depend only on its allocation and its fixed
    attributes; columns 8-10 and 14-16 (time and node risk) are left 0 for the caller.
    `workers`, `lo` and `hi` count workers of `per_worker` GPUs, `req` GPUs; sizes and
    speed-ups are shown in GPUs, and the fewest nodes a size needs in whole workers per node."""
    n_nodes = len(set(placement))
    ceil, log2 = math.ceil, math.log2
    workers_per_node = max(per_node // per_worker, 1)
    gpus = workers * per_worker
    doubled = min(max(workers * 2, 1), hi)
    now = _speedup_scalar(gpus, n_nodes, alpha, beta)
    after = _speedup_scalar(doubled * per_worker, ceil(doubled / workers_per_node), alpha, beta)
    at_req = _speedup_scalar(req, ceil(req // per_worker / workers_per_node), alpha, beta)
    safe_gpus = max(gpus, 1)
    return (
        1.0, status == _QUEUED, status == _RUNNING, status == _RESTARTING,
        log2(1 + gpus) / _LOG_GPUS, log2(1 + req) / _LOG_GPUS,
        log2(1 + lo * per_worker) / _LOG_GPUS, log2(1 + hi * per_worker) / _LOG_GPUS,
        0.0, 0.0, 0.0,
        now / safe_gpus,
        after / now - 1.0 if now > 0 else 1.0,
        at_req / max(req, 1),
        0.0, 0.0, 0.0,
        restore / 300.0,
        (n_nodes - ceil(workers / workers_per_node)) / safe_gpus if workers else 0.0,
    )


@dataclass(frozen=True, slots=True)
class _HealthView:
    """What the featurizer derives from the nodes' sizes and health columns. The simulator's
    snapshots share these arrays until a failure, repair or warning, and allocations change far
    more often, so this part is cached by the arrays' identity, apart from the free GPUs."""

    arrays: tuple[np.ndarray, ...]
    """The arrays it was derived from (held so that an identity check cannot see a reused id)."""
    usable_list: list[bool]
    all_usable: bool
    at_risk: np.ndarray
    at_risk_list: list[bool]
    any_risk: bool
    max_risk: float
    uniform_risk: bool
    """Every node has the same risk score (a healthy cluster)."""
    total_gpus: int
    n_nodes: int
    per_node: int
    features: list[float]
    """Observation indices 1, 11 and 12 (usable share, warned share, max risk)."""


@dataclass(frozen=True, slots=True)
class _FreeView:
    """What the featurizer derives from the nodes' free GPUs (cached by `Nodes` identity)."""

    free: list[int]
    """Free GPUs per node, 0 on a node that is not usable."""
    features: list[float]
    """The node-only cluster features (indices 0-1 and 11-17 of the observation)."""
    worker_slots: dict[int, int]
    """GPUs per worker -> workers of that size the usable nodes' free GPUs hold (filled on
    demand; 1 -> the free GPUs in all)."""
    gpu_types: tuple[str, ...] = ()
    """Each node's GPU type on a mixed cluster or for a typed spec (a job's workers all go to
    one type); () on a one-type cluster for an untyped spec."""
    type_features: list[float] = field(default_factory=list)
    """A typed spec's `TYPE_CLUSTER_FEATURES` per type, in `FeatureSpec.gpu_types` order."""
    type_slots: dict[tuple[int, str], int] = field(default_factory=dict)
    """(GPUs per worker, type) -> worker slots on that type's nodes (filled on demand)."""

    def slots_for(self, per_worker: int) -> int:
        """Workers of `per_worker` GPUs that fit in the free GPUs (none split across nodes)."""
        slots = self.worker_slots.get(per_worker)
        if slots is None:
            slots = self.worker_slots[per_worker] = sum(f // per_worker for f in self.free)
        return slots

    def slots_on(self, per_worker: int, gpu_type: str | None) -> int:
        """Worker slots a job may use: on a mixed cluster those of `gpu_type` (the type it
        runs on), or of the type with most for a job holding no GPUs (None), as `choose_nodes`
        places it; else `slots_for`."""
        if not self.gpu_types:
            return self.slots_for(per_worker)
        if gpu_type is None:
            return max(self.slots_on(per_worker, t) for t in dict.fromkeys(self.gpu_types))
        slots = self.type_slots.get((per_worker, gpu_type))
        if slots is None:
            slots = self.type_slots[(per_worker, gpu_type)] = sum(
                f // per_worker for f, t in zip(self.free, self.gpu_types, strict=True)
                if t == gpu_type)
        return slots

    def free_on(self, node: int, per_worker: int, gpu_type: str | None) -> int:
        """Worker slots of `node` counted in `slots_on(per_worker, gpu_type)`."""
        if self.gpu_types and gpu_type is not None and self.gpu_types[node] != gpu_type:
            return 0
        return self.free[node] // per_worker


@dataclass(frozen=True, slots=True)
class _View:
    """What observe, mask and decode all need from one state, computed once."""

    slots: np.ndarray
    rows: list[int]
    """`slots` as a list."""
    placements: list[tuple[int, ...]]
    status: list[int]
    """Per job row."""
    n_queued: int
    fixed: list[tuple]
    """Per job row: (requested GPUs, min, max workers, scaling alpha, beta, restore s, GPUs per
    worker)."""
    classes: list[int]
    """Per job row: an id shared by the jobs with equal `fixed` attributes."""
    workers: list[int]
    """Per job row."""
    health: _HealthView
    free: _FreeView


def _health_arrays(nodes: Nodes) -> tuple[np.ndarray, ...]:
    return (nodes.gpus_total, nodes.ready, nodes.cordoned, nodes.xid_errors_5m,
            nodes.ecc_errors_30m, nodes.ready_flaps_60m, nodes.failure_risk)


def _health_view(state: ClusterState) -> _HealthView:
    nodes = state.nodes
    usable = nodes.ready & ~nodes.cordoned
    at_risk = at_risk_nodes(state)
    n_nodes = max(nodes.count, 1)
    total = max(int(nodes.gpus_total.sum()), 1)
    max_risk = float(nodes.failure_risk.max(initial=0.0))
    features = [int(nodes.gpus_total[usable].sum()) / total,
                int(np.count_nonzero(nodes.warned)) / n_nodes, max_risk]
    return _HealthView(
        arrays=_health_arrays(nodes), usable_list=usable.tolist(),
        all_usable=bool(usable.all()), at_risk=at_risk, at_risk_list=at_risk.tolist(),
        any_risk=bool(at_risk.any()), max_risk=max_risk,
        uniform_risk=bool(nodes.failure_risk.min(initial=max_risk) == max_risk), total_gpus=total,
        n_nodes=n_nodes, per_node=max(int(nodes.gpus_total.max(initial=1)), 1),
        features=features)


class Featurizer:
    """Turns states into observations and masks, and discrete actions into `Action`s.

    The three calls on one state share their common work through one-entry caches keyed by
    the identity of the state, of its nodes and of their health columns (states are immutable
    snapshots); per-job feature rows and mask blocks are cached by the values they depend on
    (`_fixed_attributes`, `_allocation_rows`, `action_mask`).
    """

    def __init__(self, spec: FeatureSpec | None = None) -> None:
        self.spec = spec or FeatureSpec()
        self._cached: tuple[ClusterState, _View] | None = None
        self._cached_nodes: tuple[Nodes, _FreeView] | None = None
        self._cached_health: _HealthView | None = None
        self._cached_fixed: tuple[tuple, tuple[list[tuple], list[int]]] | None = None
        self._classes: dict[tuple, int] = {}
        self._row_cache: dict[tuple, bytes] = {}
        self._mask_cache: dict[tuple, bytes] = {}

    def start_episode(self) -> None:
        """Forget what an earlier episode left behind, before the first state of a new one
        (`rlalloc.env.gym_env.ClusterAllocEnv.reset`): nothing here, whose caches are keyed by
        what they depend on; a featurizer that asks stateful policies overrides it."""

    def _view(self, state: ClusterState) -> _View:
        if self._cached is not None and self._cached[0] is state:
            return self._cached[1]
        health = self._health(state)
        free = self._free_view(state, health)
        jobs = state.jobs
        status = jobs.status.tolist()
        rows = _slot_rows(status, jobs.placement, health.at_risk, self.spec.top_k)
        fixed, classes = self._fixed_attributes(jobs)
        view = _View(slots=np.array(rows, dtype=np.int64), rows=rows,
                     placements=[jobs.placement[r] for r in rows], status=status,
                     n_queued=status.count(_QUEUED), fixed=fixed, classes=classes,
                     workers=jobs.workers.tolist(), health=health, free=free)
        self._cached = (state, view)
        return view

    def _health(self, state: ClusterState) -> _HealthView:
        cached = self._cached_health
        if cached is None or not all(
                a is b for a, b in zip(cached.arrays, _health_arrays(state.nodes), strict=True)):
            cached = self._cached_health = _health_view(state)
        return cached

    def _free_view(self, state: ClusterState, health: _HealthView) -> _FreeView:
        """Free GPUs per usable node, in worker slots and the node-only observation features,
        cached by `Nodes` identity (the simulator shares one `Nodes` between snapshots until
        something changes)."""
        nodes = state.nodes
        if self._cached_nodes is not None and self._cached_nodes[0] is nodes:
            return self._cached_nodes[1]
        free = nodes.gpus_free.tolist()
        if not health.all_usable:
            free = [f if ok else 0 for f, ok in zip(free, health.usable_list, strict=True)]
        total_free, n_nodes = sum(free), health.n_nodes
        ascending = sorted(free)
        features = [
            total_free / health.total_gpus, *health.features,
            # nodes with at least 1, 2, 4, 8 free GPUs
            *((n_nodes - bisect.bisect_left(ascending, at_least)) / n_nodes
              for at_least in _FREE_THRESHOLDS),
            (ascending[-1] if ascending else 0) / health.per_node,
        ]
        typed = bool(self.spec.gpu_types)
        view = _FreeView(free=free, features=features, worker_slots={1: total_free},
                         gpu_types=nodes.gpu_type if typed or len(nodes.type_names) > 1 else (),
                         type_features=self._cluster_type_features(nodes, free, health)
                         if typed else [])
        self._cached_nodes = (nodes, view)
        return view

    def _cluster_type_features(self, nodes: Nodes, free: list[int],
                               health: _HealthView) -> list[float]:
        """A typed spec's cluster features per type (`TYPE_CLUSTER_FEATURES`; `free`: per
        node, 0 where not usable); a one-line `UserError` if the cluster has a type the spec
        lacks, which the policy has neither features nor actions for."""
        spec_types = self.spec.gpu_types
        if not set(nodes.type_names) <= set(spec_types):
            unknown = [t for t in nodes.type_names if t not in spec_types]
            raise UserError(
                f"the cluster has GPU types {', '.join(nodes.type_names)}, this policy was built "
                f"for {', '.join(spec_types)} ({', '.join(unknown)} unknown to it); train a "
                "policy on this cluster's types (rlalloc train --cluster THIS_CLUSTER)")
        total = dict.fromkeys(spec_types, 0)
        free_on = dict.fromkeys(spec_types, 0)
        for gpus, free_gpus, gpu_type in zip(nodes.gpus_total.tolist(), free, nodes.gpu_type,
                                             strict=True):
            total[gpu_type] += gpus
            free_on[gpu_type] += free_gpus
        features: list[float] = []
        for gpu_type in spec_types:
            gpus = total[gpu_type]
            features += [gpus > 0, free_on[gpu_type] / gpus if gpus else 0.0,
                         gpus / health.total_gpus]
        return features

    def slots(self, state: ClusterState) -> np.ndarray:
        """Rows of `state.jobs` in slot order (what slot k of the observation refers to)."""
        return self._view(state).slots

    # ------------------------------------------------------------------ observation
    def observe(self, state: ClusterState) -> np.ndarray:
        """Observation vector (float32, length `spec.obs_size`)."""
        view = self._view(state)
        n = len(view.placements)
        blob = bytearray(np.array(self._cluster_features(state, view), dtype=np.float32).tobytes())
        blob += b"".join(self._allocation_rows(state, view))
        blob += bytes((self.spec.top_k - n) * JOB_FEATURES * 4)
        obs = np.frombuffer(blob, dtype=np.float32)
        if n:
            per_job = obs[CLUSTER_FEATURES:CLUSTER_FEATURES + n * JOB_FEATURES]
            self._fill_dynamic_features(state, view, per_job.reshape(n, JOB_FEATURES))
        obs = np.clip(obs, -OBS_BOUND, OBS_BOUND, out=obs)
        if not self.spec.gpu_types:
            return obs
        return np.concatenate([obs, self._type_features(state, view)])

    def _type_features(self, state: ClusterState, view: _View) -> np.ndarray:
        """A typed spec's block at the end of the observation: `TYPE_CLUSTER_FEATURES` per
        type, then for each slot (empty slots 0) the job's `type_speed_log2` on each type and
        the one-hot of the type it runs on (all 0 while it holds no GPUs)."""
        spec = self.spec
        n_types = len(spec.gpu_types)
        per_job = np.zeros((spec.top_k, TYPE_JOB_FEATURES, n_types), dtype=np.float32)
        n = len(view.rows)
        per_job[:n, 0] = type_speed_log2(state, view.slots, spec.gpu_types)
        node_types = state.nodes.gpu_type
        for slot, placement in enumerate(view.placements):
            if placement:
                per_job[slot, 1, spec.gpu_types.index(node_types[placement[0]])] = 1.0
        block = np.concatenate([np.asarray(view.free.type_features, dtype=np.float32),
                                per_job.ravel()])
        return np.clip(block, -OBS_BOUND, OBS_BOUND, out=block)

    def _cluster_features(self, state: ClusterState, view: _View) -> list[float]:
        jobs, demand, top_k = state.jobs, state.demand, self.spec.top_k
        node_features = view.free.features
        n_queued = view.n_queued
        day = 2 * math.pi * state.time_of_day_s / 86_400.0
        return [
            *node_features[:2],
            min(n_queued / top_k, 4.0),
            min(demand.pending_gpus / view.health.total_gpus, 4.0),
            min((jobs.count - n_queued) / top_k, 4.0),
            min(demand.arrivals_1h / 10.0, 4.0),
            math.sin(day), math.cos(day),
            *demand.forecast_gpus,
            *node_features[2:],
        ]

    def _allocation_rows(self, state: ClusterState, view: _View) -> list[bytes]:
        """Each slot's feature row as float32 bytes, with the time- and risk-dependent columns
        still 0. The rest depends only on the job's fixed attributes and its allocation, which
        rarely change between steps, and many jobs share attributes: rows are cached by
        (attribute class, allocation)."""
        fixed, classes = view.fixed, view.classes
        workers, status = view.workers, view.status
        per_node = view.health.per_node
        cache = self._row_cache
        if len(cache) > _VALUE_CACHE_SIZE:
            cache.clear()
        rows = []
        for row, placement in zip(view.rows, view.placements, strict=True):
            key = (classes[row], status[row], workers[row], placement, per_node)
            features = cache.get(key)
            if features is None:
                features = cache[key] = np.array(
                    _allocation_features(status[row], workers[row], *fixed[row], placement,
                                         per_node), dtype=np.float32).tobytes()
            rows.append(features)
        return rows

    def _fixed_attributes(self, jobs: Jobs) -> tuple[list[tuple], list[int]]:
        """Per job row, its fixed attributes (requested GPUs, min, max workers, scaling alpha,
        beta, restore s, GPUs per worker) and their class: a small int shared by all jobs with
        equal attributes, the cheap-to-hash key of the per-row caches. The simulator's
        snapshots share the attribute arrays until a job arrives or leaves, so this is cached
        by their identity."""
        arrays = (jobs.requested_gpus, jobs.min_workers, jobs.max_workers, jobs.scaling_alpha,
                  jobs.scaling_beta, jobs.restore_s, jobs.gpus_per_worker)
        cached = self._cached_fixed
        if cached is not None and all(a is b for a, b in zip(cached[0], arrays, strict=True)):
            return cached[1]
        if len(self._classes) > _VALUE_CACHE_SIZE:  # class ids are about to be reused
            self._classes.clear()
            self._row_cache.clear()
            self._mask_cache.clear()
        fixed = list(zip(*(a.tolist() for a in arrays), strict=True))
        classes = [self._classes.setdefault(attributes, len(self._classes))
                   for attributes in fixed]
        self._cached_fixed = (arrays, (fixed, classes))
        return fixed, classes

    def _fill_dynamic_features(self, state: ClusterState, view: _View, out: np.ndarray) -> None:
        """Write the columns that change with time (age, attained service, progress, time since
        checkpoint) and with node risk into the slots' rows `out`."""
        jobs, slots = state.jobs, view.slots
        out[:, 8] = np.log1p(np.maximum(state.time_s - jobs.submit_s[slots], 0.0) / 3600.0) / 4.0
        out[:, 9] = np.log1p(jobs.attained_gpu_s[slots] / 3600.0) / 6.0
        out[:, 10] = jobs.progress[slots]
        out[:, 16] = (jobs.since_checkpoint_s[slots].astype(np.float64)
                      / self.spec.checkpoint_interval_s)
        health, placements = view.health, view.placements
        if health.any_risk:
            at_risk = health.at_risk_list
            out[:, 14] = [_touches(at_risk, p) for p in placements]
        if health.uniform_risk:
            out[:, 15] = [health.max_risk if p else 0.0 for p in placements]
        else:
            scores = state.nodes.failure_risk.tolist()
            out[:, 15] = [max(map(scores.__getitem__, p)) if p else 0.0 for p in placements]

    # ------------------------------------------------------------------ actions
    def action_mask(self, state: ClusterState) -> np.ndarray:
        """bool mask over the discrete actions; exact: every True action changes the state.

        A slot's block depends only on the job's size bounds, its workers and the workers it
        could place (the free worker slots plus its own workers), so blocks are cached by those
        values as bytes and joined. A node's free GPUs plus a job's own workers there hold
        exactly its own workers more than the free GPUs alone, so the job's capacity is the
        cluster's free slots for its worker size plus its own workers on usable nodes.
        """
        spec = self.spec
        view = self._view(state)
        health, placements, free = view.health, view.placements, view.free
        usable = health.usable_list
        fixed, classes, workers = view.fixed, view.classes, view.workers
        cache = self._mask_cache
        if len(cache) > _VALUE_CACHE_SIZE:
            cache.clear()
        spec_types = spec.gpu_types
        blocks = [b"\x01"]
        for row, placement in zip(view.rows, placements, strict=True):
            own = (len(placement) if health.all_usable
                   else sum(1 for n in placement if usable[n]))
            attributes = fixed[row]
            lo, hi, per_worker = attributes[1], attributes[2], attributes[-1]
            # targets never exceed hi: capacities beyond it give the same block
            gpu_type = state.nodes.gpu_type[placement[0]] if placement else None
            if spec_types:  # each type holds its free slots, and the job's own there
                capacities = tuple(min(free.slots_on(per_worker, t)
                                       + (own if t == gpu_type else 0), hi) for t in spec_types)
                current = spec_types.index(gpu_type) if placement else -1
            else:
                capacities, current = (min(free.slots_on(per_worker, gpu_type) + own, hi),), 0
            key = (classes[row], workers[row], capacities, current)
            block = cache.get(key)
            if block is None:
                block = cache[key] = self._slot_mask(attributes[0] // per_worker, lo, hi,
                                                     workers[row], capacities, current)
            blocks.append(block)
        blocks.append(bytes((spec.top_k - len(placements)) * spec.actions_per_slot))
        mask = np.frombuffer(bytearray(b"".join(blocks)), dtype=bool)
        if health.any_risk:
            self._mask_migrations(state, view, mask)
        return mask

    def _slot_mask(self, req: int, lo: int, hi: int, workers: int,
                   capacities: tuple[int, ...], current: int) -> bytes:
        """One slot's block without its migrate action: suspend if running, then each
        (target, strategy, type) within [lo, hi] that fits in that type's `capacities` (in
        workers) and is a change: another size, or another type than `current`, the index
        of the type the job runs on (untyped: one capacity, type 0, so a change of size;
        `req`: the requested workers)."""
        spec = self.spec
        n_strategies = len(spec.strategies)
        block = bytearray(spec.actions_per_slot)
        block[0] = workers > 0
        for level, target in enumerate((*spec.worker_levels, req)):
            if not lo <= target <= hi:
                continue
            allowed = bytes(target <= capacity and (target != workers or t != current)
                            for t, capacity in enumerate(capacities))
            start = 1 + level * n_strategies * len(capacities)
            block[start:start + n_strategies * len(capacities)] = allowed * n_strategies
        return bytes(block)

    def _mask_migrations(self, state: ClusterState, view: _View, mask: np.ndarray) -> None:
        """Allow 'migrate off the most at-risk node' where the rest of the cluster holds the
        job's workers whole (its own workers off that node count as free slots)."""
        spec, free = self.spec, view.free
        usable, at_risk = view.health.usable_list, view.health.at_risk_list
        for slot, (row, placement) in enumerate(zip(view.rows, view.placements, strict=True)):
            if not _touches(at_risk, placement):
                continue
            per_worker = view.fixed[row][-1]
            src = self._migration_source(state, row)
            kept = sum(1 for node in placement if node != src and usable[node])
            gpu_type = state.nodes.gpu_type[src]
            free_elsewhere = (free.slots_on(per_worker, gpu_type)
                              - free.free_on(src, per_worker, gpu_type))
            mask[(slot + 1) * spec.actions_per_slot] = free_elsewhere + kept >= len(placement)

    @staticmethod
    def _migration_source(state: ClusterState, row: int) -> int:
        """The job's node most at risk: warned first, then highest risk score."""
        nodes = state.nodes
        return max(sorted(set(state.jobs.placement[row])),
                   key=lambda n: (bool(nodes.warned[n]), float(nodes.failure_risk[n])))

    def decode(self, state: ClusterState, index: int) -> Action:
        """The `Action` for discrete action `index` (NOOP if it cannot be carried out)."""
        spec = self.spec
        if index <= 0:
            return NOOP
        view = self._view(state)
        slot, offset = divmod(index - 1, spec.actions_per_slot)
        if slot >= len(view.rows):
            return NOOP
        row = view.rows[slot]
        job_id = state.jobs.job_id[row]
        names = state.nodes.name
        if offset == 0:
            return Action(_SCALE, job_id, 0, ()) if state.jobs.workers[row] else NOOP
        if offset == spec.actions_per_slot - 1:
            if not _touches(view.health.at_risk_list, view.placements[slot]):
                return NOOP  # migration is for jobs on warned or risky nodes only
            src = self._migration_source(state, row)
            nodes = choose_nodes(state, row, int(state.jobs.workers[row]), _PACKED,
                                 exclude_node=src)
            if nodes is None:
                return NOOP
            return Action(_MIGRATE, job_id, len(nodes),
                          tuple(names[n] for n in nodes), from_node=names[src])
        level, target = divmod(offset - 1, len(spec.strategies) * spec.types_per_target)
        strategy_index, type_index = divmod(target, spec.types_per_target)
        gpu_type = spec.gpu_types[type_index] if spec.gpu_types else None
        workers = (spec.worker_levels[level] if level < len(spec.worker_levels)
                   else int(requested_workers(state, row)))
        if workers == state.jobs.workers[row] and gpu_type in (None, job_gpu_type(state, row)):
            return NOOP  # moves at the same size on one type are migrations, not scale actions
        nodes = choose_nodes(state, row, workers, spec.strategies[strategy_index],
                             gpu_type=gpu_type)
        if nodes is None:
            return NOOP
        return Action(_SCALE, job_id, workers, tuple(names[n] for n in nodes))

    def encode_scale(self, slot: int, workers: int | None, strategy: Strategy,
                     gpu_type: str | None = None) -> int:
        """Discrete index of 'scale slot to `workers` workers (None: its requested workers)',
        on `gpu_type`: one of `spec.gpu_types` for a typed spec, None for an untyped one."""
        spec = self.spec
        if spec.gpu_types:
            type_index = spec.gpu_types.index(gpu_type)  # a ValueError for a type it lacks
        else:
            assert gpu_type is None, f"an untyped spec has no action on {gpu_type}"
            type_index = 0
        level = spec.levels_per_slot - 1 if workers is None else spec.worker_levels.index(workers)
        return (1 + slot * spec.actions_per_slot + 1
                + (level * len(spec.strategies) + spec.strategies.index(strategy))
                * spec.types_per_target + type_index)

    def encode_suspend(self, slot: int) -> int:
        """Discrete index of 'suspend the job in slot'."""
        return 1 + slot * self.spec.actions_per_slot

    def encode_migrate(self, slot: int) -> int:
        """Discrete index of 'migrate the job in slot off its most at-risk node'."""
        return (slot + 1) * self.spec.actions_per_slot
