"""One featurizer: `ClusterState` -> observation vector, action mask, and discrete action -> `Action`.

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
JOB_FEATURES = 19


def select_slots(state: ClusterState, top_k: int) -> np.ndarray:
    """Rows of `state.jobs` shown to the policy, in slot order (see module docstring)."""
    jobs = state.jobs
    if jobs.count == 0:
        return np.zeros(0, dtype=np.int64)
    queued = np.flatnonzero(jobs.status == _QUEUED)
    allocated = np.flatnonzero(jobs.status != _QUEUED)
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


def _log_gpus(x: np.ndarray | float) -> np.ndarray:
    return np.log2(1.0 + np.asarray(x, dtype=np.float64)) / _LOG_GPUS


class Featurizer:
    """Turns states into observations and masks, and discrete actions into `Action`s."""

    def __init__(self, spec: FeatureSpec | None = None) -> None:
        self.spec = spec or FeatureSpec()
        self._levels = np.asarray(self.spec.worker_levels, dtype=np.int64)

    # ------------------------------------------------------------------ observation
    def observe(self, state: ClusterState, slots: np.ndarray | None = None) -> np.ndarray:
        """Observation vector (float32, length `spec.obs_size`)."""
        spec = self.spec
        slots = select_slots(state, spec.top_k) if slots is None else slots
        obs = np.zeros(spec.obs_size, dtype=np.float32)
        obs[:CLUSTER_FEATURES] = self._cluster_features(state)
        if len(slots):
            per_job = self._job_features(state, slots)
            obs[CLUSTER_FEATURES:CLUSTER_FEATURES + per_job.size] = per_job.ravel()
        return obs

    def _cluster_features(self, state: ClusterState) -> np.ndarray:
        nodes, jobs, demand = state.nodes, state.jobs, state.demand
        total = max(int(nodes.gpus_total.sum()), 1)
        usable = nodes.ready & ~nodes.cordoned
        free = np.where(usable, nodes.gpus_free, 0)
        n_nodes = max(nodes.count, 1)
        n_queued = int(np.count_nonzero(jobs.status == _QUEUED))
        day = 2 * math.pi * state.time_of_day_s / 86_400.0
        out = np.empty(CLUSTER_FEATURES, dtype=np.float32)
        out[:13] = (
            free.sum() / total,
            nodes.gpus_total[usable].sum() / total,
            min(n_queued / self.spec.top_k, 4.0),
            min(demand.pending_gpus / total, 4.0),
            min((jobs.count - n_queued) / self.spec.top_k, 4.0),
            min(demand.arrivals_1h / 10.0, 4.0),
            math.sin(day), math.cos(day),
            *demand.forecast_gpus,
            np.count_nonzero(nodes.warned) / n_nodes,
            nodes.failure_risk.max(initial=0.0),
        )
        out[13:17] = np.count_nonzero(free[:, None] >= _FREE_THRESHOLDS, axis=0) / n_nodes
        out[17] = free.max(initial=0) / max(int(nodes.gpus_total.max(initial=1)), 1)
        return out

    def _job_features(self, state: ClusterState, slots: np.ndarray) -> np.ndarray:
        jobs, nodes = state.jobs, state.nodes
        per_node = max(int(nodes.gpus_total.max()), 1)
        status = jobs.status[slots]
        workers = jobs.workers[slots].astype(np.float64)
        alpha, beta = jobs.scaling_alpha[slots], jobs.scaling_beta[slots]
        placements = [jobs.placement[r] for r in slots.tolist()]
        node_counts = np.array([len(set(p)) for p in placements], dtype=np.float64)
        at_risk = at_risk_nodes(state)
        risky = at_risk.any()
        on_risky = ([bool(at_risk[list(p)].any()) if p else False for p in placements]
                    if risky else 0.0)
        scores = nodes.failure_risk
        risk = ([float(scores[list(p)].max()) if p else 0.0 for p in placements]
                if scores.any() else 0.0)
        req = jobs.requested_gpus[slots].astype(np.float64)
        doubled = np.minimum(np.maximum(workers * 2, 1), jobs.max_workers[slots])
        # one speed-up evaluation for now / doubled / requested, stacked for speed
        n = np.concatenate([workers, doubled, req])
        k = np.concatenate([node_counts, np.ceil(doubled / per_node), np.ceil(req / per_node)])
        now, after, at_req = np.split(speedup(n, k, np.tile(alpha, 3), np.tile(beta, 3)), 3)
        packed_nodes = np.ceil(np.maximum(workers, 1) / per_node)
        log_gpus = _log_gpus(np.concatenate([workers, req, jobs.min_workers[slots],
                                             jobs.max_workers[slots]]))
        age_h = np.maximum(state.time_s - jobs.submit_s[slots], 0.0) / 3600.0
        safe_workers = np.maximum(workers, 1)
        features = np.empty((len(slots), JOB_FEATURES), dtype=np.float32)
        features[:, 0] = 1.0
        features[:, 1] = status == _QUEUED
        features[:, 2] = status == _RUNNING
        features[:, 3] = status == _RESTARTING
        features[:, 4:8] = log_gpus.reshape(4, -1).T
        features[:, 8] = np.log1p(age_h) / 4.0
        features[:, 9] = np.log1p(jobs.attained_gpu_s[slots] / 3600.0) / 6.0
        features[:, 10] = jobs.progress[slots]
        features[:, 11] = now / safe_workers
        features[:, 12] = np.where(now > 0, after / np.maximum(now, 1e-9) - 1.0, 1.0)
        features[:, 13] = at_req / np.maximum(req, 1)
        features[:, 14] = on_risky
        features[:, 15] = risk
        features[:, 16] = jobs.since_checkpoint_s[slots] / self.spec.checkpoint_interval_s
        features[:, 17] = jobs.restore_s[slots] / 300.0
        features[:, 18] = np.where(workers > 0, (node_counts - packed_nodes) / safe_workers, 0.0)
        return features

    # ------------------------------------------------------------------ actions
    def action_mask(self, state: ClusterState, slots: np.ndarray | None = None) -> np.ndarray:
        """bool mask over the discrete actions; exact: every True action changes the state."""
        spec = self.spec
        slots = select_slots(state, spec.top_k) if slots is None else slots
        mask = np.zeros(spec.num_actions, dtype=bool)
        mask[0] = True
        if not len(slots):
            return mask
        jobs, nodes = state.jobs, state.nodes
        usable = nodes.ready & ~nodes.cordoned
        total_free = int(np.where(usable, nodes.gpus_free, 0).sum())
        placements = [jobs.placement[r] for r in slots.tolist()]
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
        at_risk = at_risk_nodes(state)
        if at_risk.any():
            for k, placement in enumerate(placements):
                if not placement or not at_risk[list(placement)].any():
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

    def decode(self, state: ClusterState, index: int, slots: np.ndarray | None = None) -> Action:
        """The `Action` for discrete action `index` (NOOP if it cannot be carried out)."""
        spec = self.spec
        if index <= 0:
            return NOOP
        slots = select_slots(state, spec.top_k) if slots is None else slots
        k, offset = divmod(index - 1, spec.actions_per_slot)
        if k >= len(slots):
            return NOOP
        row = int(slots[k])
        job_id = state.jobs.job_id[row]
        names = state.nodes.name
        if offset == 0:
            return Action(ActionKind.SCALE, job_id, 0, ()) if state.jobs.workers[row] else NOOP
        if offset == spec.actions_per_slot - 1:
            if not state.jobs.placement[row]:
                return NOOP
            src = self._migration_source(state, row)
            nodes = choose_nodes(state, row, int(state.jobs.workers[row]), Strategy.PACKED,
                                 exclude_node=src)
            if nodes is None:
                return NOOP
            return Action(ActionKind.MIGRATE, job_id, len(nodes),
                          tuple(names[n] for n in nodes), from_node=names[src])
        level, strategy_index = divmod(offset - 1, len(spec.strategies))
        workers = (spec.worker_levels[level] if level < len(spec.worker_levels)
                   else int(state.jobs.requested_gpus[row]))
        nodes = choose_nodes(state, row, workers, spec.strategies[strategy_index])
        if nodes is None:
            return NOOP
        return Action(ActionKind.SCALE, job_id, workers, tuple(names[n] for n in nodes))

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
