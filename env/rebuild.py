"""A simulator rebuilt from a `ClusterState`: the live cluster as a controller can fork it.

`rlalloc headroom` measures lookahead by forking the simulator a run happens in, which knows
every job's true size and exact speed model. A controller in a real cluster has only the
`ClusterState` the actuator builds from Prometheus. This module turns that state into a
`Simulator` that starts where the cluster stands, so the same lookahead can run on it
(`rlalloc.agent.planner`). What the state does not say is filled in the way a policy sees it:

- **Speed**: on a cluster mixing GPU types, a curve per type (`ClusterState.type_speeds`);
  the caller's `speed_of` maps a job's state curve (speed on one GPU, alpha, beta)
  to a speed model: by default the curve itself, ``speed_1gpu * speedup(n, nodes, alpha,
  beta)`` (`rlalloc.env.featurizer.speedup`); the planner passes measured profiles where it has
  them, since on the Pollux workloads the curve fit loses most of what the lookahead gains
  (docs/agent.md).
  Epochs and batch-size changes are not modelled.
- **Size**: the caller gives each job's remaining work in seconds on one GPU (told by a size
  table, or estimated); progress keeps its fraction, so a size-told policy run in the copy
  reads the same remaining work as in the cluster.
- **Restore**: a job still restoring pays its whole restore time again (the state does not say
  how much is left).
- **Failures**: none are drawn; down and cordoned nodes take no new workers, and a job with a
  worker on a down node is queued (its checkpoint's progress is not in the state, so it keeps
  its current progress).
- **Capacity**: a node has the GPUs the state leaves free plus those its jobs hold, so GPUs of
  pods the state does not manage stay taken.
- **Decisions**: every `SimParams` default, the 300 s decision interval included, whatever
  interval the caller decides at (the actuator's is 30 s).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

import numpy as np

from rlalloc.env.cluster import ClusterSpec, NodeSpec
from rlalloc.env.failures import FailureParams
from rlalloc.env.featurizer import speedup
from rlalloc.env.params import SimParams
from rlalloc.env.simulator import FoundJob, JobSpeed, Simulator
from rlalloc.env.state import ClusterState, JobStatus
from rlalloc.env.workload.spec import JobSpec, Workload

_PARAMS = SimParams(failures=FailureParams(failures_per_gpu_day=0.0))
"""A rebuilt simulator's parameters: the defaults, no failures drawn."""

_DAY_S = 86_400.0
_MIN_LEFT = 1e-6
"""Smallest share of a job taken as still to do: a job at progress 1 is finishing now."""
_MIN_REMAINING_S = 1.0
"""Least work left, in seconds on one GPU, that a job of the state is given in the copy: a
trainer that logged its last step while its pod still runs reads progress 1, and no work left
made a zero-work job whose progress is 0/0 (a warning every cycle)."""


def curve_speed(speed_1gpu: float, alpha: float, beta: float) -> JobSpeed:
    """The speed model a job's state curve implies: what a controller knows of its speed."""

    def iterations_per_s(shape: tuple[int, ...]) -> float:
        return speed_1gpu * float(speedup(sum(shape), len(shape), alpha, beta))

    return JobSpeed(iterations_per_s, speed_1gpu, alpha, beta)


SpeedOf = Callable[[float, float, float], JobSpeed]
"""A job's speed model from its state curve: (speed on one GPU, scaling alpha, beta)."""

Curve = tuple[float, float, float]
"""A job's speed curve: (speed on one GPU, scaling alpha, beta)."""


def typed_speed(speed_of: SpeedOf, curve: Curve,
                curves_by_type: Mapping[str, Curve] | None = None) -> JobSpeed:
    """`speed_of` a job's `curve`; on a mixed cluster (`curves_by_type`, its curve on each of
    the cluster's types), of its curve on every type as well (`JobSpeed.by_type`), `curve`
    being the reference type's. Without them a job would run at one speed on every type."""
    speed = speed_of(*curve)
    if curves_by_type is None:
        return speed
    return dataclasses.replace(speed, by_type={
        gpu_type: speed_of(*one) for gpu_type, one in curves_by_type.items()})


def simulator_from_state(state: ClusterState, remaining_1gpu_s: np.ndarray,
                         speed_of: SpeedOf = curve_speed) -> Simulator:
    """A simulator holding the nodes and jobs of `state`, each job with `remaining_1gpu_s`
    (state order) of work left and the speed model `speed_of` gives its curve; see the module
    docstring for the rest.

    Its clock starts at midnight of the day the oldest job was submitted (`start_as_found`
    processes nothing before now, but the simulator would otherwise keep a live clock's
    1.7e9 s of time series and health chunks in every fork), so its `time_s` is the state's
    less whole days: every time of day, wait and age is the state's.
    """
    nodes, jobs = state.nodes, state.jobs
    origin = math.floor(min(float(jobs.submit_s.min(initial=state.time_s)), state.time_s)
                        / _DAY_S) * _DAY_S
    placed_gpus = np.zeros(len(nodes.name), dtype=np.int64)
    for placement, per_worker in zip(jobs.placement, jobs.gpus_per_worker.tolist(), strict=True):
        np.add.at(placed_gpus, list(placement), per_worker)
    # a node's GPUs are what the state leaves free plus what its jobs hold: GPUs of pods the
    # state does not know (other tenants) stay out of the copy
    capacity = np.where(nodes.ready, nodes.gpus_free + placed_gpus, nodes.gpus_total)
    cluster = ClusterSpec(tuple(NodeSpec(name, int(gpus), gpu_type, int(rack))
                                for name, gpus, gpu_type, rack in zip(
                                    nodes.name, capacity, nodes.gpu_type, nodes.rack,
                                    strict=True)))
    order = np.argsort(jobs.submit_s, kind="stable")
    specs, speeds, found = [], [], []
    for row in order.tolist():
        speed_1gpu = float(jobs.speed_1gpu[row])
        left = max(1.0 - float(jobs.progress[row]), _MIN_LEFT)
        work = max(float(remaining_1gpu_s[row]), _MIN_REMAINING_S) * speed_1gpu / left
        specs.append(JobSpec(jobs.job_id[row], min(float(jobs.submit_s[row]), state.time_s)
                             - origin, int(jobs.requested_gpus[row]), work,
                             int(jobs.min_workers[row]), int(jobs.max_workers[row]),
                             float(jobs.restore_s[row]),
                             gpus_per_worker=int(jobs.gpus_per_worker[row])))
        speeds.append(_speed_of_row(state, row, speed_of))
        placement = jobs.placement[row]
        placed = (tuple(nodes.name[n] for n in placement)
                  if all(nodes.ready[n] for n in placement) else ())
        restoring = int(jobs.status[row]) == JobStatus.RESTARTING
        found.append(FoundJob(
            done=work * (1.0 - left), nodes=placed,
            restore_left_s=float(jobs.restore_s[row]) if restoring else 0.0,
            started=bool(placement) or jobs.run_s[row] > 0 or jobs.restarts[row] > 0,
            attained_gpu_s=float(jobs.attained_gpu_s[row]), run_s=float(jobs.run_s[row]),
            restarts=int(jobs.restarts[row])))
    sim = Simulator(cluster, Workload("rebuilt", tuple(specs)), speeds, _PARAMS)
    sim.start_as_found(state.time_s - origin, found,
                       down=[n for n, ready in zip(nodes.name, nodes.ready, strict=True)
                             if not ready],
                       cordoned=[n for n, cordoned in zip(nodes.name, nodes.cordoned,
                                                          strict=True) if cordoned])
    return sim


def _speed_of_row(state: ClusterState, row: int, speed_of: SpeedOf) -> JobSpeed:
    """`typed_speed` of the job's curves in `state`."""
    jobs, table = state.jobs, state.type_speeds
    curve = (float(jobs.speed_1gpu[row]), float(jobs.scaling_alpha[row]),
             float(jobs.scaling_beta[row]))
    if table is None:
        return typed_speed(speed_of, curve)
    return typed_speed(speed_of, curve, {
        gpu_type: (float(table.speed_1gpu[row, col]), float(table.scaling_alpha[row, col]),
                   float(table.scaling_beta[row, col]))
        for col, gpu_type in enumerate(table.gpu_types)})
