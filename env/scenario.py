"""A scenario = cluster + workload + each job's speed model: everything a simulation starts from.

`build_scenario` turns the user's strings (``--workload``, ``--cluster``) into one, resolving
each job's throughput model: its measured profile when it names an application, the generic
scaling model fitted to the profiles otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rlalloc.env.cluster import ClusterSpec, parse_cluster
from rlalloc.env.efficiency import goodput_speeds
from rlalloc.env.errors import UserError
from rlalloc.env.params import SimParams
from rlalloc.env.profiles import (
    GENERIC_SCALING,
    AppProfile,
    GenericScaling,
    cached_profiles,
    default_profiles_root,
)
from rlalloc.env.signals import NO_SIGNALS, Signals
from rlalloc.env.simulator import JobSpeed, Simulator
from rlalloc.env.workload.loader import load_workload
from rlalloc.env.workload.spec import Workload

_GENERIC_SPEED = JobSpeed(GENERIC_SCALING.iterations_per_s, 1.0, GENERIC_SCALING.alpha,
                          GENERIC_SCALING.beta)


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


def job_speeds(workload: Workload, profiles: dict[str, AppProfile] | None) -> tuple[JobSpeed, ...]:
    """Each job's `JobSpeed`; profiled speed models and fits are shared per (app, batch size)."""
    cache: dict[tuple[str, int], JobSpeed] = {}
    curves: dict[tuple[float, float], JobSpeed] = {}
    speeds = []
    for job in workload.jobs:
        if job.application is None or job.batch_size is None or not profiles:
            if job.scaling is None:
                speeds.append(_GENERIC_SPEED)
            else:
                if job.scaling not in curves:
                    curve = GenericScaling(*job.scaling)
                    curves[job.scaling] = JobSpeed(curve.iterations_per_s, 1.0, curve.alpha,
                                                   curve.beta)
                speeds.append(curves[job.scaling])
            continue
        key = (job.application, job.batch_size)
        if key not in cache:
            profile = profiles[job.application]
            model = profile.throughput(job.batch_size)
            fit = profile.scaling_fit(job.batch_size)
            cache[key] = JobSpeed(model.iterations_per_s, model.iterations_per_s((1,)),
                                  fit.alpha, fit.beta)
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
    speeds = job_speeds(jobs, profiles)
    if profiles:
        jobs, speeds = goodput_speeds(jobs, profiles, efficiency, speeds, spec.total_gpus)
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
