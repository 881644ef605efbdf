"""Choosing nodes for a job's workers: the candidate placements a scale action can ask for.

Pure functions of a `ClusterState`, shared by the featurizer (which turns a discrete action into
nodes), the heuristic policies and the actuator's guardrails, so "packed" means the same thing
everywhere. A job's own GPUs count as free when it is re-placed, because a resize restarts all
of its workers. Nodes that warn (XID/ECC/flaps) are used only when nothing else fits.
"""

from __future__ import annotations

import numpy as np

from rlalloc.env.gpu_types import fastest_first
from rlalloc.env.state import ClusterState, Strategy

_PACKED = Strategy.PACKED


def free_gpus_for(state: ClusterState, job_row: int | None, exclude_node: int = -1) -> np.ndarray:
    """Free GPUs per node as seen by job `job_row` (its own GPUs count as free)."""
    return np.asarray(_free_list(state, job_row, exclude_node), dtype=np.int64)


def requested_workers(state: ClusterState, rows: np.ndarray | int) -> np.ndarray | int:
    """Workers jobs `rows` asked for: their requested GPUs in workers of their own size."""
    jobs = state.jobs
    return jobs.requested_gpus[rows] // jobs.gpus_per_worker[rows]


def gpus_per_worker_of(state: ClusterState, job_row: int | None) -> int:
    """GPUs per worker of job `job_row` (1 for a job not in the state)."""
    return 1 if job_row is None else int(state.jobs.gpus_per_worker[job_row])


def _free_list(state: ClusterState, job_row: int | None, exclude_node: int) -> list[int]:
    nodes = state.nodes
    free = nodes.gpus_free.tolist()
    if job_row is not None:
        per_worker = int(state.jobs.gpus_per_worker[job_row])
        for node in state.jobs.placement[job_row]:
            free[node] += per_worker
    if not nodes.ready.all() or nodes.cordoned.any():
        free = [f if ready and not cordoned else 0 for f, ready, cordoned
                in zip(free, nodes.ready.tolist(), nodes.cordoned.tolist(), strict=True)]
    if exclude_node >= 0:
        free[exclude_node] = 0
    return free


def job_gpu_type(state: ClusterState, job_row: int | None) -> str | None:
    """The GPU type job `job_row` runs on now (None while it holds no GPUs)."""
    if job_row is None or not state.jobs.placement[job_row]:
        return None
    return state.nodes.gpu_type[state.jobs.placement[job_row][0]]


def candidate_types(state: ClusterState, job_row: int | None,
                    gpu_type: str | None = None) -> list[str]:
    """The GPU types a placement of job `job_row` may use, in the order to try them: `gpu_type`
    if given; else the type the job runs on (a job stays on its type unless a policy moves
    it); else, for a job holding no GPUs, every type from the fastest (`fastest_first`)."""
    if gpu_type is not None:
        return [gpu_type]
    current = job_gpu_type(state, job_row)
    return [current] if current is not None else fastest_first(state.nodes.type_names)


def choose_nodes(state: ClusterState, job_row: int | None, workers: int, strategy: Strategy,
                 exclude_node: int = -1, avoid: np.ndarray | None = None,
                 gpus_per_worker: int | None = None,
                 gpu_type: str | None = None) -> tuple[int, ...] | None:
    """Node index of each of `workers` workers (sorted), or None if they do not fit; none on
    `exclude_node` nor on a node `avoid` (bool per node) marks. A worker takes
    `gpus_per_worker` GPUs of one node (default: job `job_row`'s, 1 for a job not in the state).
    All workers are on one GPU type: on a mixed cluster (or with `gpu_type` given) the first of
    `candidate_types` that holds them.

    PACKED puts the job on as few nodes as possible, choosing the best-fitting node for the
    remainder; SPREAD fills the most fragmented nodes first. Warned nodes come last in both.
    Both count free worker slots (a node's free GPUs // gpus_per_worker), so no worker is ever
    split across nodes. Ties go to the lowest node index. (Plain Python: called once per action
    on clusters of tens to hundreds of nodes, where a dozen numpy calls cost more than the
    loops.)
    """
    if workers <= 0:
        return ()
    per_worker = gpus_per_worker or gpus_per_worker_of(state, job_row)
    free = _free_list(state, job_row, exclude_node)
    if avoid is not None:
        free = [0 if avoided else f for f, avoided in zip(free, avoid.tolist(), strict=True)]
    if per_worker > 1:
        free = [f // per_worker for f in free]
    nodes = state.nodes
    if gpu_type is None and len(nodes.type_names) == 1:
        return _fit(free, workers, strategy, nodes.warned)
    for candidate in candidate_types(state, job_row, gpu_type):
        on_type = [f if t == candidate else 0 for f, t in zip(free, nodes.gpu_type, strict=True)]
        chosen = _fit(on_type, workers, strategy, nodes.warned)
        if chosen is not None:
            return chosen
    return None


def _fit(free: list[int], workers: int, strategy: Strategy,
         warned: np.ndarray) -> tuple[int, ...] | None:
    """`_pick` on healthy nodes if they hold `workers`, else on all; None if nothing does."""
    healthy_free = ([0 if w else f for f, w in zip(free, warned.tolist(), strict=True)]
                    if warned.any() else free)
    for candidate_free in (healthy_free, free):
        if sum(candidate_free) >= workers:
            return _pick(candidate_free, workers, strategy)
    return None


def _pick(free: list[int], workers: int, strategy: Strategy) -> tuple[int, ...]:
    """`workers` workers on nodes with `free` worker slots each, by `strategy`."""
    chosen: list[int] = []
    need = workers
    if strategy == _PACKED:
        free = list(free)
        while need > 0:
            fits = [(f, node) for node, f in enumerate(free) if f >= need]
            if fits:  # one node holds the rest: the tightest such node
                chosen.extend([min(fits)[1]] * need)
                break
            biggest = max(range(len(free)), key=free.__getitem__)  # else the emptiest, whole
            chosen.extend([biggest] * free[biggest])
            need -= free[biggest]
            free[biggest] = 0
    else:
        for node in sorted((n for n, f in enumerate(free) if f > 0), key=free.__getitem__):
            take = min(free[node], need)
            chosen.extend([node] * take)
            need -= take
            if need == 0:
                break
    return tuple(sorted(chosen))


def placement_shape(placement: tuple[int, ...], gpus_per_worker: int = 1) -> tuple[int, ...]:
    """GPUs per node used by a placement (a node per worker of `gpus_per_worker` GPUs),
    largest first: the key of the throughput models (two 4-GPU workers on two nodes: (4, 4))."""
    counts: dict[int, int] = {}
    for node in placement:
        counts[node] = counts.get(node, 0) + gpus_per_worker
    return tuple(sorted(counts.values(), reverse=True))
