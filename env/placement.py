"""Choosing nodes for a job's workers: the candidate placements a scale action can ask for.

Pure functions of a `ClusterState`, shared by the featurizer (which turns a discrete action into
nodes), the heuristic policies and the actuator's guardrails, so "packed" means the same thing
everywhere. A job's own GPUs count as free when it is re-placed, because a resize restarts all
of its workers. Nodes that warn (XID/ECC/flaps) are used only when nothing else fits.
"""

from __future__ import annotations

import numpy as np

from env.state import ClusterState, Strategy

_NO_ROOM = np.int64(1 << 30)
_PACKED = Strategy.PACKED


def free_gpus_for(state: ClusterState, job_row: int | None, exclude_node: int = -1) -> np.ndarray:
    """Free GPUs per node as seen by job `job_row` (its own GPUs count as free)."""
    nodes = state.nodes
    free = nodes.gpus_free.astype(np.int64)
    if job_row is not None:
        for node in state.jobs.placement[job_row]:
            free[node] += 1
    usable = nodes.ready & ~nodes.cordoned
    free = np.where(usable, free, 0)
    if exclude_node >= 0:
        free[exclude_node] = 0
    return free


def choose_nodes(state: ClusterState, job_row: int | None, workers: int, strategy: Strategy,
                 exclude_node: int = -1) -> tuple[int, ...] | None:
    """Node index of each of `workers` workers (sorted), or None if they do not fit.

    PACKED puts the job on as few nodes as possible, choosing the best-fitting node for the
    remainder; SPREAD fills the most fragmented nodes first. Warned nodes come last in both.
    """
    if workers <= 0:
        return ()
    free = free_gpus_for(state, job_row, exclude_node)
    warned = state.nodes.warned
    healthy_free = np.where(warned, 0, free)
    for candidate_free in (healthy_free, free):
        if candidate_free.sum() >= workers:
            return _pick(candidate_free, workers, strategy)
    return None


def _pick(free: np.ndarray, workers: int, strategy: Strategy) -> tuple[int, ...]:
    chosen: list[int] = []
    need = workers
    free = free.copy()
    if strategy == _PACKED:
        while need > 0:
            fits = np.where(free >= need, free, _NO_ROOM)
            best = int(fits.argmin())
            if fits[best] < _NO_ROOM:  # one node holds the rest: the tightest such node
                chosen.extend([best] * need)
                break
            biggest = int(free.argmax())  # otherwise take the emptiest node whole
            take = int(free[biggest])
            chosen.extend([biggest] * take)
            free[biggest] = 0
            need -= take
    else:
        order = np.argsort(np.where(free > 0, free, _NO_ROOM), kind="stable")
        for node in order:
            take = int(min(free[node], need))
            if take <= 0:
                break
            chosen.extend([int(node)] * take)
            need -= take
            if need == 0:
                break
    return tuple(sorted(chosen))


def placement_shape(placement: tuple[int, ...]) -> tuple[int, ...]:
    """GPUs per node used by a placement, largest first (the key of the throughput models)."""
    counts: dict[int, int] = {}
    for node in placement:
        counts[node] = counts.get(node, 0) + 1
    return tuple(sorted(counts.values(), reverse=True))
