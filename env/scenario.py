"""A scenario = cluster + workload + each job's speed model: everything a simulation starts from.

`build_scenario` turns the user's strings (``--workload``, ``--cluster``) into one, resolving
each job's throughput model: its measured profile when it names an application, the generic
scaling model fitted to the profiles otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from env.cluster import ClusterSpec, parse_cluster
from env.params import SimParams
from env.profiles import GENERIC_SCALING, AppProfile, default_profiles_root, load_profiles
from env.simulator import JobSpeed, Simulator
from env.workload.loader import load_workload
from env.workload.spec import Workload

_GENERIC_SPEED = JobSpeed(GENERIC_SCALING.iterations_per_s, 1.0, GENERIC_SCALING.alpha,
                          GENERIC_SCALING.beta)


@dataclass(frozen=True)
class Scenario:
    """What one simulation replays."""

    cluster: ClusterSpec
    workload: Workload
    speeds: tuple[JobSpeed, ...]

    def simulator(self, params: SimParams | None = None, seed: int = 0) -> Simulator:
        """A fresh simulator over this scenario (the failure process is seeded by `seed`)."""
        return Simulator(self.cluster, self.workload, self.speeds, params, seed)


def job_speeds(workload: Workload, profiles: dict[str, AppProfile] | None) -> tuple[JobSpeed, ...]:
    """Each job's `JobSpeed`; profiled speed models and fits are shared per (app, batch size)."""
    cache: dict[tuple[str, int], JobSpeed] = {}
    speeds = []
    for job in workload.jobs:
        if job.application is None or job.batch_size is None or not profiles:
            speeds.append(_GENERIC_SPEED)
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
                   profiles_root: Path | None = None) -> Scenario:
    """Load the workload named by `workload` (see `load_workload`) for the cluster `cluster`."""
    spec = parse_cluster(cluster) if isinstance(cluster, str) else cluster
    jobs = load_workload(workload, spec, profiles_root, seed)
    needs_profiles = any(j.application for j in jobs.jobs)
    root = profiles_root or default_profiles_root()
    profiles = load_profiles(root) if needs_profiles and root else None
    return Scenario(spec, jobs, job_speeds(jobs, profiles))
