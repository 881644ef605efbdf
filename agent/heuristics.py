"""The baselines a learned policy must beat, each a pure function of `ClusterState`.

- `StaticPolicy` ("static"): what most clusters do today. Every job gets exactly the workers
  it asked for, packed, in strict FIFO order (head-of-line blocking, no backfill); no resizing, no
  moves. A job stopped by a node failure goes back to the queue at its original place (it is the
  oldest job, so it restarts from its checkpoint as soon as its GPUs are free again).
- `TiresiasPolicy` ("tiresias"): discretised two-dimensional least-attained-service (Gu et al.,
  NSDI'19). Jobs sit in priority queues by attained GPU-seconds; FIFO within a queue; a job
  that has waited `promote_knob` times as long as it has run is promoted to the top queue
  (starvation guard); lower-priority running jobs are preempted (suspended, i.e. scaled to 0)
  when higher-priority ones need their GPUs. Jobs still get exactly their requested workers.
- `ElasticPolicy` ("elastic"): goodput-greedy elastic allocation in the spirit of Optimus and
  Pollux. Each worker goes to the job whose speed-up (the state's scaling curve) gains most
  from it, per GPU it holds; a running job is grown only when it then finishes at least
  `min_saving` (10%) of its estimated remaining time sooner, checkpoint-restore time included
  (no thrashing).
  With ``failover=True`` ("reactive") jobs stopped by a failure restart at once on whatever GPUs
  are free (any size within min..max); with ``proactive=True`` ("proactive") jobs are also
  moved off nodes whose telemetry warns, before the node fails; with ``remaining_power=0.5``
  ("elastic-srpt") spare GPUs go first to jobs with little work left.

Sizes: the elastic policies allocate only the worker counts the discrete action space can
express (`FeatureSpec.worker_levels` plus the job's request, within min..max), and place every
worker with `choose_nodes(..., PACKED)`, exactly as `Featurizer.decode` does. Every heuristic
action is therefore also a discrete action, which lets a learned policy be warm-started by
imitating a heuristic (`rlalloc.agent.imitation`).

Workers: every policy counts a job's allocation in workers of its `gpus_per_worker` (k) GPUs,
all on one node, as actions do: a job asks for `requested_gpus // k` workers, a worker is
valued as the k GPUs it holds (the scaling curve's n counts GPUs), and a worker fits a node
only where k of its GPUs are free (`choose_nodes` never splits one). With k = 1 a worker is a
GPU.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rlalloc.env.featurizer import FeatureSpec, Featurizer, at_risk_nodes, speedup
from rlalloc.env.placement import choose_nodes, free_gpus_for, requested_workers
from rlalloc.env.state import NOOP, Action, ActionKind, ClusterState, JobStatus, Strategy

_QUEUED, _RUNNING = int(JobStatus.QUEUED), int(JobStatus.RUNNING)


def scale_action(state: ClusterState, row: int, workers: int,
                 strategy: Strategy = Strategy.PACKED,
                 avoid: np.ndarray | None = None) -> Action | None:
    """'Run job `row` on `workers` workers placed by `strategy`', on no node `avoid` marks (None
    if they do not fit)."""
    nodes = choose_nodes(state, row, workers, strategy, avoid=avoid)
    if nodes is None:
        return None
    names = state.nodes.name
    return Action(ActionKind.SCALE, state.jobs.job_id[row], workers, tuple(names[n] for n in nodes))


def suspend_action(state: ClusterState, row: int) -> Action:
    """'Checkpoint job `row` and release its GPUs' (scale to 0)."""
    return Action(ActionKind.SCALE, state.jobs.job_id[row], 0, ())


def free_worker_slots(state: ClusterState) -> dict[int, int]:
    """Per worker size (GPUs per worker) among the state's jobs, and 1: the workers of that
    size the free GPUs of usable nodes could hold, each on one node (`free_gpus_for` // size).
    What a queued job can start with; at size 1, the free GPUs."""
    free = free_gpus_for(state, None)
    return {k: int((free // k).sum()) for k in {1, *state.jobs.gpus_per_worker.tolist()}}


def usable_gpus(state: ClusterState) -> tuple[int, int]:
    """(GPUs on nodes that are up and schedulable, of which free)."""
    nodes = state.nodes
    usable = nodes.ready & ~nodes.cordoned
    return int(nodes.gpus_total[usable].sum()), int(nodes.gpus_free[usable].sum())


def gpu_budget(state: ClusterState) -> int:
    """The GPUs that the allocations a policy plans may add up to: the free GPUs of usable
    nodes plus those the state's jobs hold on nodes that are up, cordoned or not.

    Not every GPU of the usable nodes: in a real cluster other tenants' pods hold some (the
    actuator counts them as not free), and a plan that counted them never found the room it
    planned for (Tiresias never preempted a job for a higher-priority one). And an operator's
    cordon (maintenance) leaves its jobs running: not counting their GPUs charged them to the
    other nodes, so other jobs got less than was free there and the cordoned ones were shrunk
    or preempted. The simulator has neither, and requeues a failed node's jobs at once: there
    this is every GPU of the usable nodes."""
    nodes, jobs = state.nodes, state.jobs
    held = int((jobs.workers * jobs.gpus_per_worker).sum())
    if not nodes.ready.all():
        # a job's pods on a node that failed stay listed until evicted, holding nothing
        down = (~nodes.ready).tolist()
        held -= sum(k * sum(down[node] for node in placement)
                    for placement, k in zip(jobs.placement, jobs.gpus_per_worker.tolist(),
                                            strict=True))
    return usable_gpus(state)[1] + held


def _packed_nodes(state: ClusterState, rows: np.ndarray | int,
                  workers: np.ndarray | int) -> np.ndarray | int:
    """Nodes that `workers` workers of jobs `rows` span when packed onto the largest nodes
    (each holds as many whole workers as fit in its GPUs): what the speed-up curve's
    cross-node term depends on, as the featurizer counts it."""
    per_node = max(int(state.nodes.gpus_total.max(initial=1)), 1)
    slots = np.maximum(per_node // state.jobs.gpus_per_worker[rows], 1)
    return -(-workers // slots)


def _arrival_order(state: ClusterState, rows: np.ndarray) -> np.ndarray:
    return rows[np.argsort(state.jobs.submit_s[rows], kind="stable")]


# ---------------------------------------------------------------------------------- static
class StaticPolicy:
    """Requested GPUs, strict FIFO, no elasticity (see module docstring)."""

    name = "static"

    def act(self, state: ClusterState) -> Action:
        """Start the oldest queued job if its full request fits now; otherwise wait."""
        queued = np.flatnonzero(state.jobs.status == _QUEUED)
        if not len(queued):
            return NOOP
        head = int(_arrival_order(state, queued)[0])
        return scale_action(state, head, int(requested_workers(state, head))) or NOOP


# ---------------------------------------------------------------------------------- tiresias
@dataclass(frozen=True, slots=True)
class TiresiasConfig:
    """Knobs of discretised 2D-LAS; defaults follow the Tiresias paper where they apply."""

    queue_thresholds_gpu_s: tuple[float, ...] = (57_600.0,)
    """Attained GPU-seconds at which a job drops to the next queue (one threshold: 2 queues,
    the paper's recommended K=2). Scaled to the Pollux workloads, whose jobs attain 10-100x
    more service than Tiresias' example threshold of 3,200 GPU-s: with 3,200 every 12-GPU job
    is demoted after 4.5 minutes and the preemption churn makes JCT several times worse.
    57,600 GPU-s = 16 GPU-hours was the best of the thresholds swept on training workloads 1
    and 3 (docs/agent.md, "The baselines")."""
    promote_knob: float = 8.0
    """A job that has waited `promote_knob` x its run time so far is promoted to the top queue
    (Tiresias' PROMOTE_KNOB; waiting is measured since submission, as the state carries no
    per-preemption clock)."""
    min_lease_s: float = 300.0
    """Run time counted as at least this for promotion, so a job preempted seconds after
    starting is not promoted seconds later (Tiresias schedules in leases; this is one
    decision interval). Restoring jobs are never preempted, for the same reason."""


class TiresiasPolicy:
    """Discretised 2D least-attained-service with preemption (see module docstring)."""

    name = "tiresias"

    def __init__(self, config: TiresiasConfig | None = None) -> None:
        self.config = config or TiresiasConfig()

    def priority_order(self, state: ClusterState) -> np.ndarray:
        """Job rows, highest priority first: queue index (after promotion), then submit time."""
        jobs, cfg = state.jobs, self.config
        queue = np.searchsorted(np.asarray(cfg.queue_thresholds_gpu_s), jobs.attained_gpu_s,
                                side="right")
        # a promoted job keeps its promotion while it runs, until it has run waiting/knob:
        # being stateless, this stands in for Tiresias resetting the executed-time counter
        waiting_s = state.time_s - jobs.submit_s - jobs.run_s
        starving = (jobs.run_s > 0) & (waiting_s >= cfg.promote_knob
                                       * np.maximum(jobs.run_s, cfg.min_lease_s))
        queue = np.where(starving, 0, queue)
        return np.lexsort((jobs.submit_s, queue))

    def act(self, state: ClusterState) -> Action:
        """Preempt the lowest-priority job that must yield, else start the highest that fits."""
        jobs = state.jobs
        if jobs.count == 0:
            return NOOP
        order = self.priority_order(state)
        capacity = gpu_budget(state)
        chosen = np.zeros(jobs.count, dtype=bool)
        used = 0
        for row in order.tolist():  # skip jobs that do not fit, as Tiresias' scheduler does
            need = int(jobs.requested_gpus[row])
            if used + need <= capacity:
                chosen[row] = True
                used += need
        for row in order[::-1].tolist():  # a restoring job has not had its lease yet
            if jobs.status[row] == _RUNNING and not chosen[row]:
                return suspend_action(state, row)
        for row in order.tolist():
            if chosen[row] and jobs.status[row] == _QUEUED:
                action = scale_action(state, row, int(requested_workers(state, row)))
                if action is not None:
                    return action
        return NOOP


# ---------------------------------------------------------------------------------- elastic
@dataclass(frozen=True, slots=True)
class ElasticConfig:
    """Knobs of the goodput-greedy elastic allocator."""

    worker_levels: tuple[int, ...] = FeatureSpec().worker_levels
    """Allocation sizes (plus each job's request), the same as the discrete action space's."""
    min_saving: float = 0.1
    """Resize a running job only if it finishes at least this share of its remaining time
    sooner after paying the restore (hysteresis against thrashing on estimate noise)."""
    default_remaining_s: float = 3600.0
    """Remaining run time assumed for a job with too little progress to extrapolate from."""
    failover: bool = False
    """Restart failure-stopped jobs first, on whatever GPUs are free ("reactive")."""
    proactive: bool = False
    """Move jobs off at-risk nodes before they fail ("proactive"; implies failover)."""
    remaining_power: float = 0.0
    """Divide each step-up's speed-up gain by the job's remaining work (1-GPU seconds) to this
    power: GPUs beyond the smallest sizes then go to jobs near completion first, as shortest
    remaining time first does for average JCT. 0 for "elastic"; 0.5 ("elastic-srpt") beat it
    on the training workloads (the sweep: docs/agent.md, "The baselines")."""

    @property
    def restarts_failed_first(self) -> bool:
        """Whether failure-stopped jobs restart first: `failover`, or `proactive`, which
        implies it (testing `failover` alone, proactive's targets ranked them last)."""
        return self.failover or self.proactive


@dataclass(frozen=True, slots=True)
class SizeTable:
    """Per job (row): the worker counts it may run with, ascending and padded with 0 to the
    number of levels + 1, how many there are, and each one's packed speed-up."""

    sizes: np.ndarray
    count: np.ndarray
    speedups: np.ndarray

    def of(self, row: int) -> np.ndarray:
        """Job `row`'s allowed worker counts, ascending."""
        return self.sizes[row, : self.count[row]]


RemainingWork = Callable[[ClusterState, np.ndarray], np.ndarray]
"""Remaining work of the jobs at rows `rows` of a state, in seconds on one GPU; NaN where it
is not known (the estimate from progress is used there)."""

Speedups = Callable[[ClusterState, np.ndarray, np.ndarray, np.ndarray], np.ndarray]
"""Speed-up over one GPU of the jobs at rows `rows` of a state with `workers` workers (of
each job's `gpus_per_worker` GPUs) on `nodes` nodes (arrays broadcast together; 0 for 0
workers)."""


def curve_speedups(state: ClusterState, rows: np.ndarray, workers: np.ndarray,
                   nodes: np.ndarray) -> np.ndarray:
    """`Speedups` from the state's scaling curve, whose n counts GPUs: all a controller knows
    of a job's speed without its application's profile (`rlalloc.agent.job_speeds` for one
    with)."""
    jobs = state.jobs
    return speedup(workers * jobs.gpus_per_worker[rows], nodes, jobs.scaling_alpha[rows],
                   jobs.scaling_beta[rows])


class ElasticPolicy:
    """Goodput-greedy elastic allocation (see module docstring)."""

    def __init__(self, config: ElasticConfig | None = None, name: str = "elastic",
                 remaining_work: RemainingWork | None = None,
                 speedups: Speedups = curve_speedups) -> None:
        """`remaining_work` replaces the estimate from progress (`remaining_times`) by known
        or predicted job sizes (`Simulator.remaining_work_s`, `rlalloc.agent.job_sizes`), for
        measuring what knowing them is worth; `speedups` replaces the state's curve by a
        better speed model where one is known (`rlalloc.agent.job_speeds`)."""
        self.config = config or ElasticConfig()
        self.name = name
        self.remaining_work = remaining_work
        self.speedups = speedups
        self._levels = np.asarray(sorted(self.config.worker_levels), dtype=np.int64)

    # ----------------------------------------------------------------- sizes and targets
    def size_table(self, state: ClusterState) -> SizeTable:
        """Every job's allowed worker counts (the levels and its request, within min..max) and
        their packed speed-ups, computed for all jobs at once: the greedy loop in `targets`
        then does no numpy work per step (a 1,000-job cycle in the actuator stays fast)."""
        jobs = state.jobs
        n_jobs, n_levels = jobs.count, len(self._levels)
        candidates = np.empty((n_jobs, n_levels + 1), dtype=np.int64)
        candidates[:, :n_levels] = self._levels
        rows = np.arange(n_jobs)
        candidates[:, n_levels] = requested_workers(state, rows)
        candidates.sort(axis=1)
        repeated = np.zeros_like(candidates, dtype=bool)
        repeated[:, 1:] = candidates[:, 1:] == candidates[:, :-1]
        allowed = (~repeated & (candidates >= jobs.min_workers[:, None])
                   & (candidates <= jobs.max_workers[:, None]))
        # allowed sizes first (ascending), the rest pushed to the end and zeroed
        sizes = np.sort(np.where(allowed, candidates, np.iinfo(np.int64).max), axis=1)
        count = allowed.sum(axis=1)
        sizes[np.arange(n_levels + 1)[None, :] >= count[:, None]] = 0
        speedups = self.speedups(state, rows[:, None], sizes,
                                 _packed_nodes(state, rows[:, None], sizes))
        return SizeTable(sizes, count, speedups)

    def _speedup(self, state: ClusterState, row: int, workers: int, nodes_used: int = 0) -> float:
        """Speed-up over one GPU of `workers` workers on `nodes_used` nodes (0: packed)."""
        k = nodes_used or _packed_nodes(state, row, workers)
        return float(self.speedups(state, np.array([row]), np.array([workers]),
                                   np.array([k]))[0])

    def remaining_s(self, state: ClusterState, row: int) -> float:
        """Estimated remaining run time of one job (see `remaining_times`)."""
        return float(self.remaining_times(state, np.array([row]))[0])

    def remaining_times(self, state: ClusterState, rows: np.ndarray) -> np.ndarray:
        """Estimated remaining run time of jobs `rows` at their current speed, extrapolated
        from progress (`default_remaining_s` for a job too new to tell); with
        `remaining_work`, the work it knows at the current speed-up instead, where it knows."""
        jobs = state.jobs
        progress = jobs.progress[rows].astype(np.float64)
        run_s = jobs.run_s[rows]
        known = (progress >= 0.01) & (run_s > 0)
        estimate = np.where(known, run_s * (1.0 - progress) / np.where(known, progress, 1.0),
                            self.config.default_remaining_s)
        if self.remaining_work is None:
            return estimate
        told = self.remaining_work(state, rows) / self._current_speedups(state, rows)
        return np.where(np.isnan(told), estimate, told)

    def remaining_work_s(self, state: ClusterState, rows: np.ndarray) -> np.ndarray:
        """Remaining work of jobs `rows` in seconds on one GPU, as this policy believes it
        (`remaining_times` at one GPU's speed): the sizes a simulator rebuilt from the state
        gives them, so that this policy run there sees the jobs as it does here
        (`rlalloc.agent.planner`)."""
        return self.remaining_times(state, rows) * self._current_speedups(state, rows)

    def _current_speedups(self, state: ClusterState, rows: np.ndarray) -> np.ndarray:
        """Speed-up over one GPU of jobs `rows` as placed now (1 for a job without GPUs)."""
        workers = state.jobs.workers[rows]
        return np.where(workers > 0, self.speedups(state, rows, workers,
                                                   _packed_nodes(state, rows, workers)), 1.0)

    def _failed(self, state: ClusterState) -> np.ndarray:
        """bool per job: queued after having run (elastic never suspends: a failure did it)."""
        jobs = state.jobs
        return (jobs.status == _QUEUED) & (jobs.run_s > 0)

    def targets(self, state: ClusterState, table: SizeTable | None = None) -> np.ndarray:
        """Target workers per job: running jobs keep their smallest size, queued jobs are
        admitted least-attained-service first, then each further step up goes to the job
        with the largest speed-up gain per added GPU. Restoring jobs keep what they have.
        The budget (`gpu_budget`) counts GPUs, a job's worker its `gpus_per_worker` of them."""
        jobs = state.jobs
        table = table or self.size_table(state)
        capacity = gpu_budget(state)
        per_worker = jobs.gpus_per_worker.astype(np.int64)
        target = np.zeros(jobs.count, dtype=np.int64)
        restoring = jobs.status == int(JobStatus.RESTARTING)
        target[restoring] = jobs.workers[restoring]
        capacity -= int((target * per_worker).sum())
        level = np.full(jobs.count, -1, dtype=np.int64)
        # no suspensions: a running job keeps at least its smallest size
        running = np.flatnonzero(~restoring & (jobs.status == _RUNNING))
        level[running] = 0
        target[running] = table.sizes[running, 0]
        capacity -= int((target[running] * per_worker[running]).sum())
        queued = np.flatnonzero(~restoring & (jobs.status == _QUEUED) & (table.count > 0))
        restart_first = (self._failed(state)[queued]
                         if self.config.restarts_failed_first
                         else np.zeros(len(queued), dtype=bool))
        queued = queued[np.lexsort((jobs.submit_s[queued], jobs.attained_gpu_s[queued],
                                    ~restart_first))]
        smallest, gpus_of = table.sizes[:, 0].tolist(), per_worker.tolist()
        for row in queued.tolist():
            if smallest[row] * gpus_of[row] <= capacity:
                level[row] = 0
                target[row] = smallest[row]
                capacity -= smallest[row] * gpus_of[row]
        sizes, speedups, count = table.sizes.tolist(), table.speedups.tolist(), table.count.tolist()
        levels = level.tolist()
        rank = {row: i for i, row in enumerate(running.tolist() + queued.tolist())}
        weight = self._remaining_weights(state, list(rank))

        def step_gain(row: int) -> tuple[float, int, int] | None:
            now = levels[row]
            if now < 0 or now + 1 >= count[row]:
                return None
            gain = ((speedups[row][now + 1] - speedups[row][now])
                    / ((sizes[row][now + 1] - sizes[row][now]) * gpus_of[row]))
            return (-gain * weight.get(row, 1.0), rank[row], row) if gain > 0 else None

        heap = [entry for entry in map(step_gain, rank) if entry is not None]
        heapq.heapify(heap)
        while heap and capacity > 0:
            _, _, row = heapq.heappop(heap)
            extra = sizes[row][levels[row] + 1] - sizes[row][levels[row]]
            if extra * gpus_of[row] > capacity:
                continue  # this step does not fit; smaller steps of other jobs may
            levels[row] += 1
            target[row] += extra
            capacity -= extra * gpus_of[row]
            entry = step_gain(row)
            if entry is not None:
                heapq.heappush(heap, entry)
        return target

    def _remaining_weights(self, state: ClusterState, rows: list[int]) -> dict[int, float]:
        """Per job in `rows`: 1 / (remaining work in 1-GPU seconds, at least a minute) to the
        power `remaining_power` (empty when it is 0: plain goodput-greedy). All jobs at once:
        `targets` runs at every decision step, for up to thousands of jobs."""
        power = self.config.remaining_power
        if power == 0.0 or not rows:
            return {}
        index = np.asarray(rows)
        work = self.remaining_times(state, index) * self._current_speedups(state, index)
        return {row: max(w, 60.0) ** -power for row, w in zip(rows, work.tolist(), strict=True)}

    # ----------------------------------------------------------------- decisions
    def act(self, state: ClusterState) -> Action:
        """Failover moves first (if enabled), then admissions, shrinks that make room for
        them, and finally grows that pay for their restore."""
        jobs = state.jobs
        if jobs.count == 0:
            return NOOP
        table = self.size_table(state)
        if self.config.proactive:
            action = self._evacuate(state, table)
            if action is not None:
                return action
        target = self.targets(state, table)
        slots = free_worker_slots(state)
        if self.config.restarts_failed_first:
            action = self._restart_failed(state, table, target, slots)
            if action is not None:
                return action
        action = self._admit(state, table, target, slots)
        if action is not None:
            return action
        return self._grow(state, target, slots[1]) or NOOP

    def _admit(self, state: ClusterState, table: SizeTable, target: np.ndarray,
               slots: dict[int, int]) -> Action | None:
        """Start the waiting job first in least-attained-service order that fits, at the
        largest of its sizes up to its target that the free worker `slots` (by worker size)
        hold; if none fits, shrink a running job to its target to make room."""
        jobs = state.jobs
        waiting = np.flatnonzero((jobs.status == _QUEUED) & (target > 0)).tolist()
        waiting.sort(key=lambda r: (jobs.attained_gpu_s[r], jobs.submit_s[r]))
        per_worker = jobs.gpus_per_worker.tolist()
        for row in waiting:
            sizes = table.of(row)
            fitting = sizes[(sizes <= min(slots[per_worker[row]], target[row]))]
            if len(fitting):
                action = scale_action(state, row, int(fitting[-1]))
                if action is not None:
                    return action
        if not waiting:
            return None
        # make room: shrink the running job that loses least speed-up per GPU it gives back
        best: tuple[float, int] | None = None
        for row in np.flatnonzero((jobs.status == _RUNNING) & (jobs.workers > target)).tolist():
            now, new = int(jobs.workers[row]), int(target[row])
            loss = (self._speedup(state, row, now, len(set(jobs.placement[row])))
                    - self._speedup(state, row, new)) / ((now - new) * per_worker[row])
            if best is None or loss < best[0]:
                best = (loss, row)
        if best is None:
            return None
        return scale_action(state, best[1], int(target[best[1]]))

    def _grow(self, state: ClusterState, target: np.ndarray, free: int) -> Action | None:
        """The grow to its target, within the `free` GPUs and placed in whole workers, that
        saves a running job the largest share of its remaining time (at least `min_saving`)."""
        jobs = state.jobs
        best: tuple[float, Action] | None = None
        for row in np.flatnonzero((jobs.status == _RUNNING) & (target > jobs.workers)).tolist():
            now, new = int(jobs.workers[row]), int(target[row])
            if (new - now) * int(jobs.gpus_per_worker[row]) > free:
                continue
            remaining = self.remaining_s(state, row)
            if remaining <= 0.0:  # done by the estimate (progress 1 while it saves its last
                continue          # checkpoint, or a size told 0): growing saves nothing
            action = scale_action(state, row, new)
            if action is None or self._onto_risky(state, action):
                continue
            s_now = self._speedup(state, row, now, len(set(jobs.placement[row])))
            s_new = self._speedup(state, row, new, len(set(action.nodes)))
            after = float(jobs.restore_s[row]) + remaining * s_now / max(s_new, 1e-9)
            saving = 1.0 - after / remaining
            if saving >= self.config.min_saving and (best is None or saving > best[0]):
                best = (saving, action)
        return best[1] if best else None

    def _onto_risky(self, state: ClusterState, action: Action) -> bool:
        """Proactive only: would `action` place workers on an at-risk node? (Growing onto one
        would be undone by the next evacuation: a resize loop paying a restore each time.)"""
        if not self.config.proactive:
            return False
        at_risk = at_risk_nodes(state)
        return bool(at_risk.any()) and any(at_risk[state.nodes.name.index(n)]
                                           for n in set(action.nodes))

    def _restart_failed(self, state: ClusterState, table: SizeTable, target: np.ndarray,
                        slots: dict[int, int]) -> Action | None:
        """Reactive failover: a failure-stopped job restarts now on whatever is free, in the
        free worker `slots` of its worker size."""
        per_worker = state.jobs.gpus_per_worker
        for row in np.flatnonzero(self._failed(state)).tolist():
            sizes = table.of(row)
            cap = min(slots[int(per_worker[row])],
                      max(int(target[row]), int(sizes[0]) if len(sizes) else 0))
            fitting = sizes[sizes <= cap]
            if len(fitting):
                action = scale_action(state, row, int(fitting[-1]))
                if action is not None:
                    return action
        return None

    def _evacuate(self, state: ClusterState, table: SizeTable) -> Action | None:
        """Proactive failover: move a job off its most at-risk node (as the featurizer's
        migrate action does, but onto no at-risk node: placed as it places, a node at risk by
        its score alone, not warned, could be the best fit, and the move was given up); if the
        rest of the cluster cannot hold it, shrink it onto healthy GPUs."""
        at_risk = at_risk_nodes(state)
        if not at_risk.any():
            return None
        jobs, names = state.jobs, state.nodes.name
        for row in np.flatnonzero(jobs.status != _QUEUED).tolist():
            placement = jobs.placement[row]
            if not placement or not at_risk[list(placement)].any():
                continue
            src = Featurizer._migration_source(state, row)
            nodes = choose_nodes(state, row, int(jobs.workers[row]), Strategy.PACKED,
                                 exclude_node=src, avoid=at_risk)
            if nodes is not None:
                return Action(ActionKind.MIGRATE, jobs.job_id[row], len(nodes),
                              tuple(names[n] for n in nodes), from_node=names[src])
            for size in table.of(row)[::-1].tolist():
                if size >= jobs.workers[row]:
                    continue
                action = scale_action(state, row, size, avoid=at_risk)
                if action is not None:
                    return action
        return None
