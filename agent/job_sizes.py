"""Job sizes from history: what a size predictor knows that a job's progress cannot tell yet.

The elastic policies rank growth by remaining work, which they extrapolate from progress
(`ElasticPolicy.remaining_times`), assuming an hour for a job that has barely run. A cluster
has a better source: past jobs of the same kind, as history-based runtime predictors
(3Sigma, EuroSys'18) use. `JobSizeHistory` is the simplest one: the median total work, in
seconds on one GPU, of past jobs with the same speed curve (speed on one GPU, alpha, beta).
The curve is what a policy sees of a job's application and batch size; in the Pollux
workloads those fix a job's size, so the history predicts it exactly for every curve it has
seen. `rlalloc headroom --sizes learned` measures what that is worth.

`rlalloc sizes fit` saves the table with the heuristic it informs as a policy directory
(``sizes.json`` + ``card.md``): `load_policy` runs it by path, in the simulator, `evaluate` and
the actuator alike, since it reads nothing but the `ClusterState`. A job whose curve the
history lacks keeps the estimate from progress.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rlalloc.env.errors import UserError
from rlalloc.env.state import ClusterState

if TYPE_CHECKING:
    from rlalloc.agent.heuristics import ElasticPolicy, RemainingWork, Speedups
    from rlalloc.agent.policy import Policy
    from rlalloc.env.scenario import Scenario

SIZES_FILE = "sizes.json"
"""The size table and its base heuristic, in a policy directory written by `rlalloc sizes fit`."""
FORMAT_VERSION = 1

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
        they are left out and keep it."""
        sizes: dict[CurveKey, list[float]] = defaultdict(list)
        kinds: dict[CurveKey, set[JobKind]] = defaultdict(set)
        for scenario in scenarios:
            for job, speed in zip(scenario.workload.jobs, scenario.speeds, strict=True):
                if job.application is None:
                    continue
                key = curve_key(speed.speed_1gpu, speed.scaling_alpha, speed.scaling_beta)
                sizes[key].append(job.work / speed.speed_1gpu)
                kinds[key].add((job.application, int(job.batch_size)))
        return JobSizeHistory({key: float(np.median(work)) for key, work in sizes.items()},
                              {key: len(work) for key, work in sizes.items()},
                              {key: tuple(sorted(kinds[key])) for key in sizes})

    def remaining_work(self, state: ClusterState, rows: np.ndarray) -> np.ndarray:
        """Predicted remaining work (seconds on one GPU) of jobs `rows`: the rest of their
        curve's median size; NaN for a curve no past job had (`rlalloc.agent.heuristics.RemainingWork`)."""
        jobs = state.jobs
        curves = np.stack([jobs.speed_1gpu[rows], jobs.scaling_alpha[rows],
                           jobs.scaling_beta[rows]], axis=1)
        # a few kinds among up to thousands of jobs: one key per kind, not per job
        kinds, kind_of = np.unique(curves, axis=0, return_inverse=True)
        work = np.array([self.work_s.get(curve_key(*kind), np.nan) for kind in kinds.tolist()],
                        dtype=np.float64)
        total = work[kind_of.ravel()]
        return (1.0 - jobs.progress[rows].astype(np.float64)) * total

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


def save_sized_policy(directory: Path, base: str, sizes: JobSizeHistory,
                      fitted_on: Sequence[str], command: str, cluster: str,
                      profiles_root: Path | None) -> list[str]:
    """Write `SIZES_FILE`, a card and the profiles under `profiles_root` of the applications
    `sizes` names (`rlalloc.agent.job_speeds`) for `base` told job sizes and speeds by `sizes`, fitted
    on the workloads `fitted_on` built for `cluster` (--cluster as given; a YAML file's content
    is recorded too, `cluster_record`); the applications whose profiles were copied. All of
    them replace an earlier fit's together or not at all."""
    from rlalloc.agent.job_speeds import PROFILES_DIR, copy_profiles
    from rlalloc.env.cluster import cluster_markdown, cluster_record
    from rlalloc.env.output import remove_outputs, staged_outputs, write_atomic, write_json

    cluster_file = cluster_record(cluster)
    rows = [f"| {_kinds_label(e['kinds'])} | {e['work_s']:,.0f} | {e['jobs']} |"
            for e in sizes.to_json()]
    shape = f" ({cluster_file['shape']}, the file as used is below)" if cluster_file else ""
    with staged_outputs(directory) as staging:
        copied = copy_profiles(sizes, profiles_root, staging)
        write_json(staging / SIZES_FILE, {"format_version": FORMAT_VERSION, "base": base,
                                          "fitted_on": list(fitted_on), "cluster": cluster,
                                          "cluster_file": cluster_file, "profiles": copied,
                                          "curves": sizes.to_json()})
        speeds = (f"Its speed-ups are the measured profiles of {', '.join(copied)} "
                  f"({PROFILES_DIR}/, `agent/job_speeds.py`) for the jobs of those kinds, the "
                  "state's fitted curve for others." if copied else
                  "Its speed-ups are the state's fitted curve (`--speeds curves`, or no "
                  "profiles found).")
        write_atomic(staging / "card.md", "\n".join([
            f"# `{base}`, told job sizes and speeds from history", "",
            f"The heuristic `{base}` with each job's remaining work taken from the median size "
            "of past jobs with the same speed curve (`agent/job_sizes.py`), where it would "
            "otherwise extrapolate it from progress. A job runs on the curve of its "
            "application and batch size; jobs of a kind not below keep the estimate. (The "
            f"curves themselves are in {SIZES_FILE}.) {speeds}", "",
            f"Fitted on {len(fitted_on)} workload(s): {', '.join(fitted_on)}; cluster "
            f"{cluster}{shape}.", "",
            f"Command: `{command}`", "",
            "| application (batch size) | median size (1-GPU s) | past jobs |",
            "|---|---|---|", *rows,
            *(["", *cluster_markdown(cluster_file)] if cluster_file else []), ""]))
    if not copied:  # an earlier fit's profiles must not pass for this one's
        remove_outputs(directory, [PROFILES_DIR])
    return copied


def _kinds_label(kinds: list[dict]) -> str:
    """``bert (batch 12)``, ``cifar10 (batch 128, 256)``: the jobs behind one curve of the
    table, by application and batch size."""
    batches: dict[str, list[str]] = defaultdict(list)
    for kind in kinds:
        batches[kind["application"]].append(str(kind["batch_size"]))
    return "; ".join(f"{application} (batch {', '.join(sizes)})"
                     for application, sizes in batches.items())


def told_sizes(base: str, remaining_work: RemainingWork | None, name: str,
               speedups: Speedups | None = None) -> ElasticPolicy:
    """The elastic heuristic `base` (by name) told jobs' remaining work by `remaining_work`
    (None: only check that `base` is one that uses sizes) and, with `speedups`, their
    speed-ups (`rlalloc.agent.job_speeds`); a one-line `UserError` naming `base` and the heuristics it
    may be when it does not estimate sizes (static, tiresias, a learned policy, a saved
    model's path or an unknown name)."""
    from rlalloc.agent.heuristics import ElasticPolicy, curve_speedups
    from rlalloc.agent.registry import HEURISTICS, elastic_names

    if base not in elastic_names():
        raise UserError(f"{base} does not estimate job sizes; use one of the elastic heuristics "
                        f"{', '.join(elastic_names())}")
    return ElasticPolicy(HEURISTICS[base]().config, name, remaining_work,
                         speedups or curve_speedups)


def read_saved_policy(path: Path, format_version: int, command: str) -> dict:
    """The JSON object a policy directory's `path` holds, written in `format_version`: a
    `UserError` naming `command` (that fits it again) for another version; OSError, ValueError
    or TypeError for a file that is missing, not JSON or not an object, which the caller words
    with what the file is."""
    raw = json.loads(path.read_text())
    if not isinstance(raw, dict):
        raise TypeError(f"it holds a {type(raw).__name__}, not an object")
    if raw.get("format_version") != format_version:
        raise UserError(f"{path}: format_version {raw.get('format_version')!r}, this rlalloc "
                        f"reads {format_version}; fit it again with `{command}`")
    return raw


def load_sized_policy(directory: Path, name: str | None = None) -> Policy:
    """The policy saved by `save_sized_policy` in `directory`; a damaged file is a `UserError`.
    A table saved before profiles were copied (no ``profiles``) keeps the curves."""
    from rlalloc.agent.job_speeds import read_copied_profiles, speedups_of

    path = Path(directory) / SIZES_FILE
    try:
        raw = read_saved_policy(path, FORMAT_VERSION, "rlalloc sizes fit")
        base = str(raw["base"])
        sizes = JobSizeHistory.from_json(raw["curves"])
        applications = [str(a) for a in raw.get("profiles", [])]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UserError(f"{path}: damaged size table ({err.__class__.__name__}: "
                        f"{str(err).splitlines()[0][:120]}); fit it again with "
                        "`rlalloc sizes fit`") from err
    models = read_copied_profiles(Path(directory), applications, sizes, "rlalloc sizes fit")
    try:
        return told_sizes(base, sizes.remaining_work, name or Path(directory).name,
                          speedups_of(models))
    except UserError as err:
        raise UserError(f"{path}: base {err}; fit it again with `rlalloc sizes fit`") from err
