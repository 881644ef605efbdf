"""A scenario = cluster + workload + each job's speed model: everything a simulation starts from.

`build_scenario` turns the user's strings (``--workload``, ``--cluster``) into one, resolving
each job's throughput model: its measured profile when it names an application, the generic
scaling model fitted to the profiles otherwise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rlalloc.env.cluster import ClusterSpec, parse_cluster
from rlalloc.env.efficiency import goodput_speeds
from rlalloc.env.errors import UserError
from rlalloc.env.gpu_types import reference_type, speed_over_reference
from rlalloc.env.params import SimParams
from rlalloc.env.profiles import (
    GENERIC_SCALING,
    AppProfile,
    GenericScaling,
    ScaledThroughput,
    cached_profiles,
    default_profiles_root,
)
from rlalloc.env.signals import NO_SIGNALS, Signals
from rlalloc.env.simulator import JobSpeed, Simulator
from rlalloc.env.workload.loader import load_workload
from rlalloc.env.workload.spec import JobSpec, Workload


@dataclass(frozen=True)
class Scenario:
    """What one simulation replays."""

    cluster: ClusterSpec
    workload: Workload
    speeds: tuple[JobSpeed, ...]
    signals: Signals = NO_SIGNALS
    """Demand forecast and failure risk fed into every state (see `rlalloc.env.signals`)."""

    def simulator(self, params: SimParams | None = None, seed: int = 0) -> Simulator:
        """A fresh simulator over this scenario (the failure process is seeded by `seed`)."""
        return Simulator(self.cluster, self.workload, self.speeds, params, seed, self.signals)


def job_speeds(workload: Workload, profiles: dict[str, AppProfile] | None,
               gpu_types: Sequence[str] = ("T4",)) -> tuple[JobSpeed, ...]:
    """Each job's `JobSpeed` on a cluster of `gpu_types` (each node's type, or the distinct
    ones): its application's profile on each type (`AppProfile.speed_on`, with its documented
    fallback), else its own or the generic curve in the reference type's time, faster on a
    faster type by `relative_speed` (`rlalloc.env.gpu_types`). On a mixed cluster the speed
    carries one per type (`JobSpeed.by_type`). Models are shared per (app, batch size) and
    per curve."""
    types = tuple(dict.fromkeys(gpu_types))
    reference = reference_type(types)
    cache: dict[object, JobSpeed] = {}

    def on_type(job: JobSpec, gpu_type: str) -> JobSpeed:
        if job.application is None or job.batch_size is None or not profiles:
            key: object = (job.scaling, gpu_type)
            if key not in cache:
                curve = GenericScaling(*job.scaling) if job.scaling else GENERIC_SCALING
                factor = speed_over_reference(gpu_type, types)
                model = curve if factor == 1.0 else ScaledThroughput(curve, factor)
                cache[key] = JobSpeed(model.iterations_per_s, factor, curve.alpha, curve.beta)
            return cache[key]
        key = (job.application, job.batch_size, gpu_type)
        if key not in cache:
            model, fit = profiles[job.application].speed_on(gpu_type, job.batch_size)
            cache[key] = JobSpeed(model.iterations_per_s, model.iterations_per_s((1,)),
                                  fit.alpha, fit.beta)
        return cache[key]

    if len(types) == 1:
        return tuple(on_type(job, reference) for job in workload.jobs)
    speeds = []
    for job in workload.jobs:
        key = ("mixed", job.application, job.batch_size, job.scaling)
        if key not in cache:
            by_type = {gpu_type: on_type(job, gpu_type) for gpu_type in types}
            cache[key] = dataclasses.replace(by_type[reference], by_type=by_type)
        speeds.append(cache[key])
    return tuple(speeds)


def build_scenario(workload: str, cluster: str | ClusterSpec, seed: int = 0,
                   profiles_root: Path | None = None,
                   signals: Signals = NO_SIGNALS, efficiency: str = "none") -> Scenario:
    """Load the workload named by `workload` (see `load_workload`) for the cluster `cluster`,
    with the look-ahead `signals` (`rlalloc.forecaster.signals.load_signals` builds them) and
    profiled jobs' progress modelled by `efficiency` (`rlalloc.env.efficiency.EFFICIENCY_MODES`)."""
    spec = parse_cluster(cluster) if isinstance(cluster, str) else cluster
    jobs = load_workload(workload, spec, profiles_root, seed)
    needs_profiles = any(j.application for j in jobs.jobs)
    root = profiles_root or default_profiles_root()
    profiles = cached_profiles(root) if needs_profiles and root else None
    gpu_types = tuple(dict.fromkeys(node.gpu_type for node in spec.nodes))
    speeds = job_speeds(jobs, profiles, gpu_types)
    if profiles and efficiency != "none":
        jobs, speeds = goodput_speeds(jobs, profiles, efficiency, speeds, spec.total_gpus,
                                      gpu_types)
    return Scenario(spec, jobs, speeds, signals)


def require_applications(scenarios: Sequence[Scenario], efficiency: str,
                         workloads: Sequence[str]) -> None:
    """A one-line `UserError` when `efficiency` models something (not "none") but no job of
    any of the command's `scenarios` (of its `workloads`, as given) names an application:
    statistical efficiency comes from an application's profile, so nothing would change, and a
    run labelled adaptive would be the plain one. (A workload without applications beside one
    with them is fine: its jobs stay generic.)"""
    if efficiency != "none" and not any(job.application for scenario in scenarios
                                        for job in scenario.workload.jobs):
        raise UserError(f"--efficiency {efficiency}: no job of {', '.join(workloads)} names an "
                        "application, "
                        "and statistical efficiency is modelled from an application's profile, "
                        "so nothing would change; use a workload with application and "
                        "batch_size columns (e.g. the Pollux workloads) or --efficiency none")
