"""`sia`: Sia's heterogeneity-aware allocation (Jayaram Subramanya et al., "Sia:
Heterogeneity-aware, goodput-optimized ML-cluster scheduling", SOSP'23), as its simulator
artifact implements it (``sia-simulator/sia.py``, `SiaPolicy.optimize_mip` and
`__solve_mip_rescaled`; defaults from ``sia-simulator/simulator_config.py``).

Every round (`SiaConfig.round_s`, Sia's 60 s) each job's configurations are enumerated: a GPU
type and a GPU count from Sia's set for the type's node size (powers of two up to a node, then
whole nodes: 1, 2, 4, 8, 12, ... on 4-GPU nodes) that is a whole number of the job's workers
within its elastic range and fits the type's usable nodes. A job whose range is one size
(min = max workers) is Sia's "rigid" job: that size on every type that holds it. Each
configuration's goodput G is the job's throughput there over its lowest throughput among its
configurations, times its worker size (Sia's scale unit) for an elastic job, or times its GPUs
for a rigid one (Sia: the slowest type's goodput = its GPUs), so every job's smallest option is
worth the same and jobs are comparable.

A job holding GPUs pays for any configuration but its current one: G is multiplied by the
re-allocation factor (Pollux's, which Sia uses by default, ``sia_use_pollux_realloc_factor``)
``max(age - restarts * restart_s, 0) / (age + restart_s)``, 1 while the job is younger than
``restart_s`` (age since submission; restart_s = the job's checkpoint-restore time). A job
restoring from its checkpoint keeps its configuration (Sia's ``scaling_underway`` constraint).

The integer program (`scipy.optimize.milp`, HiGHS; Sia solves it with CBC or GLPK), over binary
x[j, c]::

    minimise  sum_{j,c} x[j,c] * round(min(G'[j,c] ** p, clip), 2) + lambda_n * (jobs - sum x)
    s.t.      sum_c x[j,c] <= 1 per job,   sum_{j, c on t} GPUs(c) x[j,c] <= GPUs of type t

with G' the penalised goodput, p = -0.5 (Sia's default; p < 0 leans to fairness, and with it
the objective is minimised; p > 0 is maximised with lambda_n < 0), lambda_n = 1.1 (a job left
waiting costs more than any allocation, whose G ** p <= 1) and clip = 3,000. A job given no
configuration waits. Among tied optima the program keeps jobs where they run (`keep_bonus`).
The plan is kept until the round ends, a job arrives or a type's room changes (a job that
leaves only frees its share for the next round: `plan_holds`);
`rlalloc.agent.type_plans.next_action` moves the cluster to it one action per call.

Told job sizes (`rlalloc sizes fit --base sia`, `rlalloc train --residual sia --learn-sizes`),
each job's term is weighted by its rank in predicted remaining work (`size_weights`): the
shortest job's term counts fully, the longest's 1 / jobs. Sia's objective shares GPUs for
fairness and never looks at sizes; for the mean JCT, the optimal allocation of parallelisable
work with sublinear speed-ups gives shorter jobs larger shares by their order alone (heSRPT,
Berg et al., "heSRPT: Parallel scheduling to minimize mean slowdown", Performance 2020), which
the weights bring into the same program. No job is weighted to zero, so none is left waiting
where it fits; a job the size table does not know ranks as the median known one.

Simplifications (docs/agent.md, "Clusters of several GPU types"): goodput is throughput on
the state's scaling curve (the state carries no statistical efficiency, so no batch-size
tuning); a job's current configuration is kept as an option even where it is not in Sia's set
(a state another policy left); the restart penalty is the job's own restore time, not Sia's
per-model table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array
from scipy.stats import rankdata

from rlalloc.agent.type_plans import (
    Plan,
    TypeTable,
    c_stdout_silenced,
    cluster_key,
    current_targets,
    next_action,
    plan_holds,
)
from rlalloc.env.placement import job_gpu_type
from rlalloc.env.state import Action, ClusterState, JobStatus

if TYPE_CHECKING:
    from rlalloc.agent.heuristics import RemainingWork

ROUNDING_DECIMALS = 2
"""Sia rounds each configuration's powered goodput to two decimals."""


@dataclass(frozen=True, slots=True)
class SiaConfig:
    """Sia's knobs, with the artifact's defaults (``simulator_config.py``)."""

    round_s: float = 60.0
    """Scheduling round (Sia's ``sched_interval``): the plan is solved at most this often
    (and again whenever jobs arrive, finish or lose their nodes)."""
    p: float = -0.5
    """Fairness exponent on normalised goodput (``sia_default_p_val``); not 0."""
    lambda_n: float = 1.1
    """Cost of leaving a job without GPUs (``sia_default_lambda_n``): above 1 = the most any
    allocation costs when p < 0, so no job waits while its smallest configuration fits."""
    goodput_clip: float = 3000.0
    """Cap on a configuration's powered goodput (``sia_goodput_clip_val``)."""
    mip_rel_gap: float = 1e-4
    """Relative optimality gap the solver stops at (``sia_solver_thresh``)."""
    size_exponent: float = 1.0
    """Told job sizes only: the power of each job's rank weight (`size_weights`), chosen on
    the validation workloads of Sia's cluster (docs/experiments/2026-11-27-sia-cluster.md)."""

    def __post_init__(self) -> None:
        assert self.p != 0.0, "Sia's p must not be 0"


@dataclass(frozen=True)
class Configurations:
    """Every job's configurations, one element per (job, configuration), grouped by job."""

    row: np.ndarray
    """int64: the job's row."""
    type_index: np.ndarray
    """int64: the GPU type (column of `TypeTable.types`)."""
    workers: np.ndarray
    """int64: workers (of the job's `gpus_per_worker` GPUs)."""
    goodput: np.ndarray
    """float64: normalised goodput G (module docstring), before the restart penalty."""
    current: np.ndarray
    """bool: the configuration the job runs in now."""


class SiaPolicy:
    """Sia's goodput-optimised integer program per round (module docstring)."""

    remembers = True

    def __init__(self, config: SiaConfig | None = None,
                 remaining_work: RemainingWork | None = None, name: str = "sia") -> None:
        """`remaining_work`: predicted job sizes (`rlalloc.agent.job_sizes`) that weight each
        job's term by its rank (module docstring); None: Sia's program as published."""
        self.config = config or SiaConfig()
        self.remaining_work = remaining_work
        self.name = name
        self._key: object = None
        self._next_solve_s = -math.inf
        self._plan: Plan = {}

    def act(self, state: ClusterState) -> Action:
        """Solve a new plan if the round is over or the jobs or nodes changed, then take
        one step towards it."""
        key = cluster_key(state)
        if not plan_holds(self._key, key) or state.time_s >= self._next_solve_s:
            self._plan = self.plan(state)
            self._key = key
            self._next_solve_s = state.time_s + self.config.round_s
        return next_action(state, self._plan)

    def plan(self, state: ClusterState) -> Plan:
        """The round's allocation for `state`: each job's configuration, or none (it waits);
        where the program has no solution (too little room for the restoring jobs), every
        job stays where it is."""
        if state.jobs.count == 0:
            return {}
        table = TypeTable.of(state)
        configs = sia_configurations(state, table)
        if not len(configs.row):
            return current_targets(state)
        cost = self._costs(state, configs)
        restoring = (state.jobs.status[configs.row] == int(JobStatus.RESTARTING)) & configs.current
        chosen = _solve(configs, cost, table, restoring, self.config.mip_rel_gap)
        if chosen is None and restoring.any():
            chosen = _solve(configs, cost, table, np.zeros_like(restoring),
                            self.config.mip_rel_gap)
        if chosen is None:
            return current_targets(state)
        jobs = state.jobs
        return {jobs.job_id[row]: (table.types[t], w) for row, t, w in zip(
            configs.row[chosen].tolist(), configs.type_index[chosen].tolist(),
            configs.workers[chosen].tolist(), strict=True)}

    def _costs(self, state: ClusterState, configs: Configurations) -> np.ndarray:
        """Each configuration's term of the minimised objective: its penalised goodput to
        the power p, clipped and rounded as Sia does, less lambda_n (the constant
        lambda_n * jobs dropped); negated when p > 0 (maximised); a job's current configuration
        less `keep_bonus`."""
        cfg = self.config
        factor = realloc_factors(state)[configs.row]
        penalised = np.where(configs.current, configs.goodput, configs.goodput * factor)
        with np.errstate(divide="ignore"):
            powered = np.power(penalised, cfg.p)
        powered = np.round(np.minimum(powered, cfg.goodput_clip), ROUNDING_DECIMALS)
        cost = (powered - cfg.lambda_n) * (1.0 if cfg.p < 0 else -1.0)
        if self.remaining_work is not None:
            rows = np.arange(state.jobs.count)
            cost = cost * size_weights(self.remaining_work(state, rows),
                                       cfg.size_exponent)[configs.row]
        return cost - keep_bonus(state.jobs.count) * configs.current


def size_weights(remaining: np.ndarray, exponent: float) -> np.ndarray:
    """Per job, (1 - (rank - 1) / jobs) ** `exponent`, rank 1 the least `remaining` work (tied
    jobs share their mean rank); a NaN (size unknown) ranks as the median known size, and with
    none known every weight is 1 (Sia's program as published)."""
    known = ~np.isnan(remaining)
    if not known.any():
        return np.ones(len(remaining))
    filled = np.where(known, remaining, np.median(remaining[known]))
    ranks = rankdata(filled, method="average")
    return (1.0 - (ranks - 1.0) / len(filled)) ** exponent


def keep_bonus(jobs: int) -> float:
    """What keeping a job's current configuration takes off its cost: a tie-break. Rounded to
    two decimals (as Sia rounds them), many configurations cost the same, and among tied optima
    HiGHS's choice changes from round to round, which swapped running and waiting jobs of one
    application every round. Below half a rounding step over all jobs together, so it never
    outweighs a difference the rounded costs make."""
    return 10.0 ** -ROUNDING_DECIMALS / (2.0 * max(jobs, 1))


def realloc_factors(state: ClusterState) -> np.ndarray:
    """Per job: Pollux's re-allocation factor (module docstring), 1 for a job holding no
    GPUs (nothing to restart) or younger than its restore time."""
    jobs = state.jobs
    age = state.time_s - jobs.submit_s
    restart = jobs.restore_s.astype(np.float64)
    factor = np.maximum(age - jobs.restarts * restart, 0.0) / np.maximum(age + restart, 1e-9)
    holds = np.array([bool(p) for p in jobs.placement], dtype=bool)
    return np.where(holds & (age >= restart), factor, 1.0)


def sia_gpu_counts(gpus_per_node: int, nodes: int) -> list[int]:
    """Sia's GPU counts on a type of `nodes` nodes of `gpus_per_node` GPUs: powers of two
    below a node, then 1, 2, ... whole nodes (its ``CONFIGS_4GPU`` / ``CONFIGS_8GPU``)."""
    if gpus_per_node <= 0 or nodes <= 0:
        return []
    small = [1 << i for i in range(gpus_per_node.bit_length()) if (1 << i) < gpus_per_node]
    return small + [gpus_per_node * m for m in range(1, nodes + 1)]


def sia_configurations(state: ClusterState, table: TypeTable) -> Configurations:
    """Every job's configurations (module docstring) with the one it runs in now, grouped by
    job in row order (then type, then workers)."""
    jobs = state.jobs
    low, high = jobs.min_workers.astype(np.int64), jobs.max_workers.astype(np.int64)
    k = table.gpus_per_worker
    rigid = low == high
    index = {t: i for i, t in enumerate(table.types)}
    now_type = np.full(jobs.count, -1, dtype=np.int64)
    now_workers = np.zeros(jobs.count, dtype=np.int64)
    for row in range(jobs.count):
        if jobs.placement[row]:
            now_type[row], now_workers[row] = index[job_gpu_type(state, row)], jobs.workers[row]
    holding = np.flatnonzero(now_type >= 0)
    parts = [np.stack([holding, now_type[holding], now_workers[holding]], axis=1)]
    all_slots = table.worker_slots()
    for t in range(len(table.types)):
        slots = all_slots[:, t]
        counts = np.asarray(sia_gpu_counts(int(table.gpus_per_node[t]),
                                           len(table.node_room[t])), dtype=np.int64)
        workers = counts[None, :] // k[:, None]
        valid = ((counts[None, :] % k[:, None] == 0) & (workers >= low[:, None])
                 & (workers <= high[:, None]) & (workers <= slots[:, None]) & ~rigid[:, None])
        rows, cols = np.nonzero(valid)
        fixed = np.flatnonzero(rigid & (low <= slots))  # Sia's rigid jobs: their one size
        for chosen, size in ((rows, workers[rows, cols]), (fixed, low[fixed])):
            parts.append(np.stack([chosen, np.full(len(chosen), t), size], axis=1))
    row, type_index, workers = np.unique(np.concatenate(parts).astype(np.int64), axis=0).T
    throughput = np.zeros(len(row))
    for t in range(len(table.types)):
        on_t = type_index == t
        throughput[on_t] = table.throughput(row[on_t], t, workers[on_t])
    keep = throughput > 0
    row, type_index, workers, throughput = (row[keep], type_index[keep], workers[keep],
                                            throughput[keep])
    lowest = np.full(jobs.count, np.inf)
    np.minimum.at(lowest, row, throughput)
    unit = np.where(rigid, low * k, k)[row]
    current = (now_type[row] == type_index) & (now_workers[row] == workers)
    return Configurations(row, type_index, workers, throughput / lowest[row] * unit, current)


def _solve(configs: Configurations, cost: np.ndarray, table: TypeTable,
           forced: np.ndarray, mip_rel_gap: float) -> np.ndarray | None:
    """Indices of the configurations Sia's program chooses (`forced` ones must be), or None
    if it has no solution."""
    n = len(configs.row)
    jobs_seen, job_of = np.unique(configs.row, return_inverse=True)
    gpus = configs.workers * table.gpus_per_worker[configs.row]
    n_types = len(table.types)
    matrix = coo_array((np.concatenate([np.ones(n), gpus.astype(np.float64)]),
                        (np.concatenate([job_of, len(jobs_seen) + configs.type_index]),
                         np.concatenate([np.arange(n), np.arange(n)]))),
                       shape=(len(jobs_seen) + n_types, n)).tocsr()
    upper = np.concatenate([np.ones(len(jobs_seen)), table.capacity.astype(np.float64)])
    with c_stdout_silenced():
        result = milp(cost, integrality=np.ones(n),
                      bounds=Bounds(forced.astype(np.float64), np.ones(n)),
                      constraints=LinearConstraint(matrix, -np.inf, upper),
                      options={"mip_rel_gap": mip_rel_gap})
    if result.x is None:
        return None
    return np.flatnonzero(result.x > 0.5)
