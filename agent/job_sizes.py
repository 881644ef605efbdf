"""Job sizes from history: what a size predictor knows that a job's progress cannot tell yet.

The elastic policies rank growth by remaining work, which they extrapolate from progress
(`ElasticPolicy.remaining_times`), assuming an hour for a job that has barely run. A cluster
has a better source: past jobs of the same kind, as history-based runtime predictors
(3Sigma, EuroSys'18) use. `JobSizeHistory` is the simplest one: the median total work, in
seconds on one GPU, of past jobs with the same speed curve (speed on one GPU, alpha, beta).
The curve is what a policy sees of a job's application and batch size; in the Pollux
workloads those fix a job's size, so the history predicts it exactly for every curve it has
seen. `rlalloc headroom --sizes learned` measures what that is worth.

`told_sizes` gives an elastic heuristic, or `sia`, the table; `rlalloc sizes fit` saves the two
as a policy directory (`rlalloc.agent.sized_policy`). A job whose curve the history lacks keeps
the elastic heuristics' estimate from progress; `sia` ranks it as the median known job
(`rlalloc.agent.sia.size_weights`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from rlalloc.agent.catalogue import HEURISTICS, elastic_names
from rlalloc.agent.heuristics import ElasticPolicy, curve_speedups
from rlalloc.agent.policy import Policy
from rlalloc.agent.sia import SiaPolicy
from rlalloc.env.errors import UserError
from rlalloc.env.state import ClusterState

if TYPE_CHECKING:
    from rlalloc.agent.heuristics import RemainingWork, Speedups
    from rlalloc.env.scenario import Scenario

SIA = "sia"
"""The one heuristic besides the elastic ones that can be told job sizes."""
SIA_SPEEDS = "sia plans on each GPU type's speeds in the state"
"""Why a size-told `sia` needs no speed-ups (the elastic heuristics' `speedups`)."""
CurveKey = tuple[float, float, float]
"""A job's speed curve, rounded so that jobs sharing a profile share a key."""
JobKind = tuple[str, int]
"""A job's application and global batch size: what fixes its curve, in words a person reads."""


def curve_key(speed_1gpu: float, alpha: float, beta: float) -> CurveKey:
    """Rounded after the cast to float32 that `ClusterState` columns (and so policies) see."""
    return tuple(round(float(np.float32(v)), 5) for v in (speed_1gpu, alpha, beta))


@dataclass(frozen=True)
class JobSizeHistory:
    """Median total work (seconds on one GPU) of past jobs, by speed curve."""

    work_s: dict[CurveKey, float]
    jobs: dict[CurveKey, int]
    """How many past jobs each median is over."""
    kinds: dict[CurveKey, tuple[JobKind, ...]] = field(default_factory=dict)
    """The application and batch size of the past jobs of each curve, for the people reading
    the table (a policy sees only the curve); absent from tables saved before it was kept."""

    @staticmethod
    def fit(scenarios: Sequence[Scenario]) -> JobSizeHistory:
        """The history of every job in `scenarios` (finished jobs of past workloads) that names
        its application. Jobs without one all share the generic curve whatever they run, so
        one median would stand for all of their sizes, worse than each job's own estimate:
        they are left out and keep it. Under statistical efficiency a job shows the goodput
        curve of its current epoch (`rlalloc.env.efficiency`), so each of its epochs' curves
        is a key to its size."""
        sizes: dict[CurveKey, list[float]] = defaultdict(list)
        kinds: dict[CurveKey, set[JobKind]] = defaultdict(set)
        for scenario in scenarios:
            for job, speed in zip(scenario.workload.jobs, scenario.speeds, strict=True):
                if job.application is None:
                    continue
                curves = ([(speed.speed_1gpu, speed.scaling_alpha, speed.scaling_beta)]
                          if speed.epochs is None else
                          [speed.epochs.curve(e) for e in range(len(speed.epochs.epoch_ends))])
                for key in dict.fromkeys(curve_key(*curve) for curve in curves):
                    sizes[key].append(job.work / speed.speed_1gpu)
                    kinds[key].add((job.application, int(job.batch_size)))
        return JobSizeHistory({key: float(np.median(work)) for key, work in sizes.items()},
                              {key: len(work) for key, work in sizes.items()},
                              {key: tuple(sorted(kinds[key])) for key in sizes})

    def remaining_work(self, state: ClusterState, rows: np.ndarray) -> np.ndarray:
        """Predicted remaining work (seconds on one GPU) of jobs `rows`: the rest of their
        curve's median size; NaN for a curve no past job had
        (`rlalloc.agent.heuristics.RemainingWork`)."""
        jobs = state.jobs
        curves = np.stack([jobs.speed_1gpu[rows], jobs.scaling_alpha[rows],
                           jobs.scaling_beta[rows]], axis=1)
        # a few kinds among up to thousands of jobs: one key per kind, not per job
        kinds, kind_of = np.unique(curves, axis=0, return_inverse=True)
        work = np.array([self.work_s.get(curve_key(*kind), np.nan) for kind in kinds.tolist()],
                        dtype=np.float64)
        total = work[kind_of.ravel()]
        return (1.0 - jobs.progress[rows].astype(np.float64)) * total

    @property
    def kind_count(self) -> int:
        """How many kinds of job the table tells apart: its curves, or, where it knows them,
        its groups of (application, batch size), since under statistical efficiency one kind
        has a curve per epoch."""
        return len(self._jobs_by_kind())

    @property
    def past_jobs(self) -> int:
        """How many past jobs the table was fitted on (each counted once, not per curve)."""
        return sum(self._jobs_by_kind().values())

    def _jobs_by_kind(self) -> dict[object, int]:
        return ({kinds: self.jobs[key] for key, kinds in self.kinds.items()} if self.kinds
                else dict(self.jobs))

    def known_jobs(self, scenario: Scenario) -> int:
        """How many of `scenario`'s jobs this table knows, by the curve each shows at
        submission: under statistical efficiency (``--efficiency``) that is the first epoch's
        goodput curve, which only a table fitted under the same mode holds."""
        return sum(curve_key(speed.speed_1gpu, speed.scaling_alpha, speed.scaling_beta)
                   in self.work_s for speed in scenario.speeds)

    def to_json(self) -> list[dict]:
        """One entry per curve, largest jobs first; ``kinds`` lists the application and batch
        size of its past jobs where the table knows them."""
        return [{"speed_1gpu": key[0], "scaling_alpha": key[1], "scaling_beta": key[2],
                 "work_s": work, "jobs": self.jobs[key],
                 **({"kinds": [{"application": application, "batch_size": batch_size}
                               for application, batch_size in self.kinds[key]]}
                    if key in self.kinds else {})}
                for key, work in sorted(self.work_s.items(), key=lambda item: -item[1])]

    @staticmethod
    def from_json(entries: list[dict]) -> JobSizeHistory:
        """The inverse of `to_json`, entries without ``kinds`` (older files) included."""
        keys = [curve_key(e["speed_1gpu"], e["scaling_alpha"], e["scaling_beta"])
                for e in entries]
        pairs = list(zip(keys, entries, strict=True))
        return JobSizeHistory({k: float(e["work_s"]) for k, e in pairs},
                              {k: int(e["jobs"]) for k, e in pairs},
                              {k: tuple((str(kind["application"]), int(kind["batch_size"]))
                                        for kind in e["kinds"])
                               for k, e in pairs if "kinds" in e})


def learn_sizes(scenarios: Sequence[Scenario], source: str) -> JobSizeHistory:
    """`JobSizeHistory.fit` on `scenarios`; a one-line `UserError` naming `source` (the flag
    and workloads they came from) when no job names its application (Philly, ``synthetic``):
    the table would be empty."""
    sizes = JobSizeHistory.fit(scenarios)
    if not sizes.work_s:
        raise UserError(f"{source}: no job names its application (every job has the same "
                        "speed curve, the generic one), so past sizes say nothing about a "
                        "job; give workloads whose jobs name their application and batch size")
    return sizes


def told_sizes(base: str, remaining_work: RemainingWork | None, name: str,
               speedups: Speedups | None = None) -> Policy:
    """The heuristic `base` (by name: an elastic one, or `sia`) told jobs' remaining work by
    `remaining_work` (None: only check that `base` is one that uses sizes) and, for an elastic
    one, with `speedups`, their speed-ups (`rlalloc.agent.job_speeds`; `sia` plans on each GPU
    type's speeds in the state); a one-line `UserError` naming `base` and the heuristics it may
    be when it does not estimate sizes (static, tiresias, gavel, a learned policy, a saved
    model's path or an unknown name)."""
    if base == SIA:
        return SiaPolicy(remaining_work=remaining_work, name=name)
    if base not in elastic_names():
        raise UserError(f"{base} does not estimate job sizes; use one of the elastic heuristics "
                        f"{', '.join(elastic_names())} or {SIA}")
    return ElasticPolicy(HEURISTICS[base]().config, name, remaining_work,
                         speedups or curve_speedups)
