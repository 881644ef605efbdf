"""One featurizer: `ClusterState` -> observation and action mask; discrete action -> `Action`.

The Gymnasium environment, the evaluation and the in-cluster actuator all go through this
module, so a policy trained in the simulator sees exactly the same numbers in the cluster.

Job slots: the policy sees the top-K jobs in a stable order: running jobs on warned nodes first
(so it can move them), then up to half the remaining slots for queued jobs (oldest first), the
rest for running jobs (oldest first); unused slots spill over to the other group.

Discrete action layout: index 0 is no-op; then, for each slot k, a block of
``1 + (len(worker_levels) + 1) * len(strategies) + 1`` actions:
suspend | scale to each worker level (and to the job's requested count) with each placement
strategy | migrate off its most at-risk node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from env.placement import choose_nodes
from env.state import NOOP, Action, ActionKind, ClusterState, JobStatus, Strategy

_SCALE, _MIGRATE, _PACKED = ActionKind.SCALE, ActionKind.MIGRATE, Strategy.PACKED

_QUEUED, _RUNNING, _RESTARTING = (int(JobStatus.QUEUED), int(JobStatus.RUNNING),
                                  int(JobStatus.RESTARTING))
_LOG_GPUS = math.log2(1 + 256)
_FREE_THRESHOLDS = np.array([1, 2, 4, 8])
RISKY_NODE_SCORE = 0.5
"""A node whose failure-risk score reaches this counts as at risk, like a warned node."""


@dataclass(frozen=True, slots=True)
class FeatureSpec:
    """Shape of the observation and action space (saved with every trained policy)."""

    top_k: int = 16
    """Job slots visible to the policy."""
    worker_levels: tuple[int, ...] = (1, 2, 4, 8, 16)
    """Worker counts a scale action can ask for (plus the job's requested count)."""
    strategies: tuple[Strategy, ...] = (Strategy.PACKED, Strategy.SPREAD)
    """Candidate placements for every scale action."""
    checkpoint_interval_s: float = 1800.0
    """Normalises time since the last checkpoint."""

    @property
    def levels_per_slot(self) -> int:
        """Worker targets per slot: the fixed levels plus 'requested'."""
        return len(self.worker_levels) + 1

    @property
    def actions_per_slot(self) -> int:
        """Suspend + scale targets x strategies + migrate."""
        return 2 + self.levels_per_slot * len(self.strategies)

    @property
    def num_actions(self) -> int:
        """Size of the `Discrete` action space."""
        return 1 + self.top_k * self.actions_per_slot

    @property
    def obs_size(self) -> int:
        """Length of the observation vector."""
        return CLUSTER_FEATURES + self.top_k * JOB_FEATURES


CLUSTER_FEATURES = 18
OBS_BOUND = 10.0
"""Every feature is scaled to roughly [-1, 4]; the observation is clipped to +-OBS_BOUND."""
JOB_FEATURES = 19


def select_slots(state: ClusterState, top_k: int,
                 at_risk: np.ndarray | None = None) -> np.ndarray:
    """Rows of `state.jobs` shown to the policy, in slot order (see module docstring).
    `at_risk` is `at_risk_nodes(state)` when the caller has it already."""
    jobs = state.jobs
    if jobs.count == 0:
        return np.zeros(0, dtype=np.int64)
    is_queued = jobs.status == _QUEUED
    queued = np.flatnonzero(is_queued)
    allocated = np.flatnonzero(~is_queued)
    if at_risk is None:
        at_risk = at_risk_nodes(state)
    if at_risk.any() and len(allocated):
        on_risky = np.array([bool(at_risk[list(jobs.placement[r])].any()) for r in allocated])
        allocated = np.concatenate([allocated[on_risky], allocated[~on_risky]])
    # rows are in arrival order already in both groups (stable ordering)
    n_queued = min(len(queued), max(top_k // 2, top_k - len(allocated)))
    n_alloc = min(len(allocated), top_k - n_queued)
    return np.concatenate([queued[:n_queued], allocated[:n_alloc]]).astype(np.int64)


def at_risk_nodes(state: ClusterState) -> np.ndarray:
    """bool per node: telemetry warns, or the risk model scores it at least `RISKY_NODE_SCORE`."""
    return state.nodes.warned | (state.nodes.failure_risk >= RISKY_NODE_SCORE)


def speedup(n: np.ndarray, k: np.ndarray, alpha: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """Throughput of n workers on k nodes relative to one worker: the state's scaling curve
    ``n / (1 + alpha (n - 1) + beta n [k > 1])`` (see `env.profiles.GenericScaling`)."""
    n = np.asarray(n, dtype=np.float64)
    cross = np.where(np.asarray(k) > 1, beta * n, 0.0)
    return np.where(n > 0, n / (1.0 + alpha * np.maximum(n - 1, 0) + cross), 0.0)


def _speedup_scalar(n: int, k: int, alpha: float, beta: float) -> float:
    """`speedup` for one job, in plain Python (the featurizer's hot loop)."""
    if n <= 0:
        return 0.0
    return n / (1.0 + alpha * (n - 1) + (beta * n if k > 1 else 0.0))


@dataclass(frozen=True, slots=True)
class _NodeView:
    """Everything derived from the nodes alone; `Nodes` objects are shared by the simulator's
    snapshots until an allocation or health change, so this is cached by their identity."""

    usable: np.ndarray
    at_risk: np.ndarray
    any_risk: bool
    total_free: int
    per_node: int
    features: np.ndarray
    """The node-only cluster features (indices 0-1 and 11-17 of the observation)."""


@dataclass(frozen=True, slots=True)
class _View:
    """What observe, mask and decode all need from one state, computed once."""

    slots: np.ndarray
    placements: list[tuple[int, ...]]
    nodes: _NodeView


class Featurizer:
    """Turns states into observations and masks, and discrete actions into `Action`s.

    The three calls on one state share their common work through one-entry caches keyed by
    the identity of the state and of its nodes (states are immutable snapshots).
    """

    def __init__(self, spec: FeatureSpec | None = None) -> None:
        self.spec = spec or FeatureSpec()
        self._levels = np.asarray(self.spec.worker_levels, dtype=np.int64)
        self._cached: tuple[ClusterState, _View] | None = None
        self._cached_nodes: tuple[object, _NodeView] | None = None

    def _view(self, state: ClusterState) -> _View:
        if self._cached is not None and self._cached[0] is state:
            return self._cached[1]
        nodes = self._node_view(state)
        slots = select_slots(state, self.spec.top_k, nodes.at_risk)
        view = _View(slots=slots, placements=[state.jobs.placement[r] for r in slots.tolist()],
                     nodes=nodes)
        self._cached = (state, view)
        return view

    def _node_view(self, state: ClusterState) -> _NodeView:
        nodes = state.nodes
        if self._cached_nodes is not None and self._cached_nodes[0] is nodes:
            return self._cached_nodes[1]
        usable = nodes.ready & ~nodes.cordoned
        at_risk = at_risk_nodes(state)
        free = np.where(usable, nodes.gpus_free, 0)
        total = max(int(nodes.gpus_total.sum()), 1)
        n_nodes = max(nodes.count, 1)
        per_node = max(int(nodes.gpus_total.max(initial=1)), 1)
        features = np.empty(9, dtype=np.float32)
        features[0] = free.sum() / total
        features[1] = nodes.gpus_total[usable].sum() / total
        features[2] = np.count_nonzero(nodes.warned) / n_nodes
        features[3] = nodes.failure_risk.max(initial=0.0)
        # nodes with at least 1, 2, 4, 8 free GPUs: a histogram of free counts, summed from the top
        at_least = np.cumsum(np.bincount(free, minlength=_FREE_THRESHOLDS[-1] + 1)[::-1])[::-1]
        features[4:8] = at_least[_FREE_THRESHOLDS] / n_nodes
        features[8] = free.max(initial=0) / per_node
        view = _NodeView(usable=usable, at_risk=at_risk, any_risk=bool(at_risk.any()),
                         total_free=int(free.sum()), per_node=per_node, features=features)
        self._cached_nodes = (nodes, view)
        return view

    def slots(self, state: ClusterState) -> np.ndarray:
        """Rows of `state.jobs` in slot order (what slot k of the observation refers to)."""
        return self._view(state).slots

    # ------------------------------------------------------------------ observation
    def observe(self, state: ClusterState) -> np.ndarray:
        """Observation vector (float32, length `spec.obs_size`)."""
        view = self._view(state)
        obs = np.zeros(self.spec.obs_size, dtype=np.float32)
        obs[:CLUSTER_FEATURES] = self._cluster_features(state, view)
        if len(view.slots):
            per_job = self._job_features(state, view)
            obs[CLUSTER_FEATURES:CLUSTER_FEATURES + per_job.size] = per_job.ravel()
        return np.clip(obs, -OBS_BOUND, OBS_BOUND, out=obs)

    def _cluster_features(self, state: ClusterState, view: _View) -> np.ndarray:
        jobs, demand = state.jobs, state.demand
        node_features = view.nodes.features
        total = max(int(state.nodes.gpus_total.sum()), 1)
        n_queued = int(np.count_nonzero(jobs.status == _QUEUED))
        day = 2 * math.pi * state.time_of_day_s / 86_400.0
        out = np.empty(CLUSTER_FEATURES, dtype=np.float32)
        out[:2] = node_features[:2]
        out[2:11] = (
            min(n_queued / self.spec.top_k, 4.0),
            min(demand.pending_gpus / total, 4.0),
            min((jobs.count - n_queued) / self.spec.top_k, 4.0),
            min(demand.arrivals_1h / 10.0, 4.0),
            math.sin(day), math.cos(day),
            *demand.forecast_gpus,
        )
        out[11:] = node_features[2:]
        return out

    def _job_features(self, state: ClusterState, view: _View) -> np.ndarray:
        """Per-slot features; plain Python over <= top_k slots beats dozens of tiny numpy ops."""
        jobs, nodes = state.jobs, state.nodes
        slots = view.slots
        per_node = view.nodes.per_node
        at_risk = view.nodes.at_risk.tolist() if view.nodes.any_risk else None
        scores = nodes.failure_risk.tolist() if nodes.failure_risk.any() else None
        columns = zip(
            jobs.status[slots].tolist(), jobs.workers[slots].tolist(),
            jobs.requested_gpus[slots].tolist(), jobs.min_workers[slots].tolist(),
            jobs.max_workers[slots].tolist(), jobs.submit_s[slots].tolist(),
            jobs.attained_gpu_s[slots].tolist(), jobs.progress[slots].tolist(),
            jobs.scaling_alpha[slots].tolist(), jobs.scaling_beta[slots].tolist(),
            jobs.since_checkpoint_s[slots].tolist(), jobs.restore_s[slots].tolist(),
            view.placements, strict=True,
        )
        now_s, interval = state.time_s, self.spec.checkpoint_interval_s
        log1p, log2, ceil = math.log1p, math.log2, math.ceil
        rows = []
        for (status, workers, req, lo, hi, submit, attained, progress, alpha, beta, since_ckpt,
             restore, placement) in columns:
            used = set(placement)
            n_nodes = len(used)
            doubled = min(max(workers * 2, 1), hi)
            now = _speedup_scalar(workers, n_nodes, alpha, beta)
            after = _speedup_scalar(doubled, ceil(doubled / per_node), alpha, beta)
            at_req = _speedup_scalar(req, ceil(req / per_node), alpha, beta)
            safe_workers = max(workers, 1)
            rows.append((
                1.0, status == _QUEUED, status == _RUNNING, status == _RESTARTING,
                log2(1 + workers) / _LOG_GPUS, log2(1 + req) / _LOG_GPUS,
                log2(1 + lo) / _LOG_GPUS, log2(1 + hi) / _LOG_GPUS,
                log1p(max(now_s - submit, 0.0) / 3600.0) / 4.0,
                log1p(attained / 3600.0) / 6.0,
                progress,
                now / safe_workers,
                after / now - 1.0 if now > 0 else 1.0,
                at_req / max(req, 1),
                any(at_risk[n] for n in used) if at_risk is not None else False,
                max((scores[n] for n in used), default=0.0) if scores is not None else 0.0,
                since_ckpt / interval,
                restore / 300.0,
                (n_nodes - ceil(safe_workers / per_node)) / safe_workers if workers else 0.0,
            ))
        return np.array(rows, dtype=np.float32)

    # ------------------------------------------------------------------ actions
    def action_mask(self, state: ClusterState) -> np.ndarray:
        """bool mask over the discrete actions; exact: every True action changes the state."""
        spec = self.spec
        view = self._view(state)
        slots, placements = view.slots, view.placements
        usable, total_free = view.nodes.usable, view.nodes.total_free
        mask = np.zeros(spec.num_actions, dtype=bool)
        mask[0] = True
        if not len(slots):
            return mask
        jobs, nodes = state.jobs, state.nodes
        all_usable = bool(usable.all())
        own_usable = np.array([len(p) if all_usable else sum(1 for n in p if usable[n])
                               for p in placements])
        workers = jobs.workers[slots]
        targets = np.empty((len(slots), spec.levels_per_slot), dtype=np.int64)
        targets[:, :-1] = self._levels
        targets[:, -1] = jobs.requested_gpus[slots]
        feasible = ((targets >= jobs.min_workers[slots, None])
                    & (targets <= jobs.max_workers[slots, None])
                    & (targets <= (total_free + own_usable)[:, None])
                    & (targets != workers[:, None]))
        n_strategies = len(spec.strategies)
        block = mask[1:1 + len(slots) * spec.actions_per_slot].reshape(len(slots), -1)
        block[:, 0] = workers > 0
        block[:, 1:1 + spec.levels_per_slot * n_strategies] = np.repeat(feasible, n_strategies,
                                                                       axis=1)
        if view.nodes.any_risk:
            for k, placement in enumerate(placements):
                if not placement or not view.nodes.at_risk[list(placement)].any():
                    continue
                row = int(slots[k])
                src = self._migration_source(state, row)
                kept = sum(1 for node in placement if node != src and usable[node])
                free_elsewhere = total_free - (int(nodes.gpus_free[src]) if usable[src] else 0)
                block[k, -1] = free_elsewhere + kept >= len(placement)
        return mask

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
        slots = self._view(state).slots
        k, offset = divmod(index - 1, spec.actions_per_slot)
        if k >= len(slots):
            return NOOP
        row = int(slots[k])
        job_id = state.jobs.job_id[row]
        names = state.nodes.name
        if offset == 0:
            return Action(_SCALE, job_id, 0, ()) if state.jobs.workers[row] else NOOP
        if offset == spec.actions_per_slot - 1:
            placement = state.jobs.placement[row]
            at_risk = self._view(state).nodes.at_risk
            if not placement or not at_risk[list(placement)].any():
                return NOOP  # migration is for jobs on warned or risky nodes only
            src = self._migration_source(state, row)
            nodes = choose_nodes(state, row, int(state.jobs.workers[row]), _PACKED,
                                 exclude_node=src)
            if nodes is None:
                return NOOP
            return Action(_MIGRATE, job_id, len(nodes),
                          tuple(names[n] for n in nodes), from_node=names[src])
        level, strategy_index = divmod(offset - 1, len(spec.strategies))
        workers = (spec.worker_levels[level] if level < len(spec.worker_levels)
                   else int(state.jobs.requested_gpus[row]))
        if workers == state.jobs.workers[row]:
            return NOOP  # moves at the same size are migrations, not scale actions
        nodes = choose_nodes(state, row, workers, spec.strategies[strategy_index])
        if nodes is None:
            return NOOP
        return Action(_SCALE, job_id, workers, tuple(names[n] for n in nodes))

    def encode_scale(self, slot: int, workers: int | None, strategy: Strategy) -> int:
        """Discrete index of 'scale slot to `workers` (None: its requested count)'."""
        spec = self.spec
        level = spec.levels_per_slot - 1 if workers is None else spec.worker_levels.index(workers)
        return (1 + slot * spec.actions_per_slot + 1 + level * len(spec.strategies)
                + spec.strategies.index(strategy))

    def encode_suspend(self, slot: int) -> int:
        """Discrete index of 'suspend the job in slot'."""
        return 1 + slot * self.spec.actions_per_slot

    def encode_migrate(self, slot: int) -> int:
        """Discrete index of 'migrate the job in slot off its most at-risk node'."""
        return (slot + 1) * self.spec.actions_per_slot
