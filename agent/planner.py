"""The planning policy: the sampled lookahead over size-told heuristics, served from the state.

`rlalloc headroom --futures sampled-1h` measured the one gain over the size-told heuristic that
held on every workload tried (docs/experiments/2026-11-24-ppo-size-told-runs-A-L.md, the
size-told lookahead), but it forked the simulator the run happened in. Here the same
`LookaheadPolicy` forks a simulator rebuilt from the `ClusterState` alone
(`rlalloc.env.rebuild`), so it reads nothing a controller lacks and the simulator,
`rlalloc evaluate` and the actuator can all run it. What it needs besides the state is
saved in one policy directory by `rlalloc planner fit`:

- a size table (`rlalloc.agent.job_sizes`) that tells the base heuristic and its alternatives each
  job's remaining work;
- the history its forks draw future arrivals from: the jobs of past workloads, each at its
  offset from the workload's start, read as a time of day (a workload starts at midnight, as
  the simulator counts time), with the speed curve a policy sees (on a cluster that mixes GPU
  types, one per type);
- the horizon and number of draws, and where the draws come from (`PlannerConfig.futures`): past
  days at the same time of day, or an arrivals model fitted on the same history
  (`rlalloc.forecaster.arrivals`, saved as ``arrivals.json``) that conditions the next hour's
  count on the last hour's;
- the measured profiles (``profiles/``) of the applications behind the table's speed curves:
  the copy runs each job on its application's throughput model, not on the fitted curve a
  policy sees. Forking on the curve alone lost most of the lookahead's gain
  (docs/experiments/2026-11-25-planner.md). A curve no profile is known for keeps the curve.

Each contested decision costs one rebuild and `samples` forks per candidate, each run to the
end of the jobs it knows of: a small share of the actuator's 30 s cycle on the Pollux
workloads (measured in docs/agent.md, "The planner").
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from rlalloc.agent.catalogue import elastic_names
from rlalloc.agent.heuristics import ElasticPolicy
from rlalloc.agent.job_sizes import JobSizeHistory, told_sizes
from rlalloc.agent.job_speeds import (
    PROFILES_DIR,
    copy_profiles,
    profiled_speeds,
    read_copied_profiles,
    speedups_of,
)
from rlalloc.agent.lookahead import (
    Arrivals,
    Future,
    FutureSource,
    HistoryArrivals,
    LookaheadPolicy,
    ModelArrivals,
)
from rlalloc.agent.sized_policy import read_saved_policy
from rlalloc.env.errors import UserError
from rlalloc.env.rebuild import SpeedOf, curve_speed, simulator_from_state, typed_speed
from rlalloc.env.scenario import Scenario
from rlalloc.env.simulator import Simulator
from rlalloc.env.state import ClusterState
from rlalloc.env.workload.spec import JobSpec
from rlalloc.forecaster.arrivals import ArrivalsModel

PLANNER_FILE = "planner.json"
"""A saved planner: what it was fitted with, its size table and history (`save_planner`)."""
ARRIVALS_FILE = "arrivals.json"
"""The arrivals model of a planner whose futures are drawn from one (`ArrivalsModel.to_json`)."""
FORMAT_VERSION = 4
FUTURES = ("past-days", "arrivals")
"""Where a planner's sampled futures come from (`PlannerConfig.futures`)."""
HISTORY_COLUMNS = ("submit_s", "requested_gpus", "min_workers", "max_workers", "work_1gpu_s",
                   "restore_s", "speed_1gpu", "scaling_alpha", "scaling_beta", "gpus_per_worker")
"""One history job per row of a saved planner, in this column order (`min_workers` and
`max_workers` count workers of `gpus_per_worker` GPUs, `requested_gpus` GPUs). Its curve is
the reference type's on a mixed cluster, whose curve per type `history_type_curves` saves."""


def planning_policy(base: ElasticPolicy, alternatives: Sequence[ElasticPolicy],
                    history: FutureSource, name: str,
                    speed_of: SpeedOf = curve_speed) -> LookaheadPolicy:
    """`LookaheadPolicy` over `base` and `alternatives` whose forks are of a simulator rebuilt
    from the state, each job given the remaining work `base` believes it has and the speed
    model `speed_of` gives its curve."""

    def rebuilt(state: ClusterState) -> Simulator:
        remaining = base.remaining_work_s(state, np.arange(state.jobs.count))
        return simulator_from_state(state, remaining, speed_of)

    return LookaheadPolicy(rebuilt, base, alternatives, Future(history.horizon_s, sampled=True),
                           history, name=name)


def history_rows(scenario: Scenario) -> list[list[float]]:
    """The jobs of `scenario` as `HISTORY_COLUMNS` rows."""
    return [[job.submit_s, job.requested_gpus, job.min_workers, job.max_workers,
             job.work / speed.speed_1gpu, job.restore_s, speed.speed_1gpu, speed.scaling_alpha,
             speed.scaling_beta, job.gpus_per_worker]
            for job, speed in zip(scenario.workload.jobs, scenario.speeds, strict=True)]


def history_gpu_types(scenario: Scenario) -> tuple[str, ...]:
    """The GPU types of a mixed cluster `scenario` runs on, in its speeds' order; () on a
    one-type cluster."""
    speeds = scenario.speeds
    return tuple(speeds[0].by_type) if speeds and speeds[0].by_type is not None else ()


def history_type_curves(scenario: Scenario) -> list[list[list[float]]]:
    """Each job's curve ([speed on one GPU, alpha, beta]) on every type of
    `history_gpu_types` (nothing on a one-type cluster): without them a job drawn into a
    future would run at one speed on every type."""
    return [[[one.speed_1gpu, one.scaling_alpha, one.scaling_beta]
             for one in speed.by_type.values()]
            for speed in scenario.speeds if speed.by_type is not None]


def drawn_from(directory: Path, scenarios: dict[str, Scenario]) -> list[str]:
    """The workloads of `scenarios` (name -> scenario) among the past workloads the planner
    saved in `directory` draws its futures from, by their jobs: evaluated on one of them, its
    sampled futures hold the run's own next hour, and it looks better than it is (`headroom`
    leaves the measured workload out; a saved planner cannot)."""
    saved = [entry["jobs"] for entry in json.loads((directory / PLANNER_FILE).read_text())[
        "history"]]
    return [name for name, scenario in scenarios.items()
            if json.loads(json.dumps(history_rows(scenario))) in saved]


def history_arrivals(rows: Sequence[Sequence[float]], speed_of: SpeedOf = curve_speed,
                     gpu_types: Sequence[str] = (),
                     type_curves: Sequence[Sequence[Sequence[float]]] = ()) -> Arrivals:
    """The inverse of `history_rows` (and, on a mixed cluster of `gpu_types`, of
    `history_type_curves`): jobs, and the speed models `speed_of` gives their curves."""
    if gpu_types and len(type_curves) != len(rows):
        raise ValueError(f"{len(rows)} jobs, {len(type_curves)} with curves per GPU type")
    jobs, speeds = [], []
    for index, row in enumerate(rows):
        submit, requested, lo, hi, work_s, restore, speed_1gpu, alpha, beta, per_worker = row
        jobs.append(JobSpec(f"job{index}", float(submit), int(requested),
                            float(work_s) * float(speed_1gpu), int(lo), int(hi), float(restore),
                            gpus_per_worker=int(per_worker)))
        by_type = None
        if gpu_types:
            curves = type_curves[index]
            if len(curves) != len(gpu_types):
                raise ValueError(f"job {index} has {len(curves)} curves for "
                                 f"{len(gpu_types)} GPU types")
            by_type = {gpu_type: (float(s), float(a), float(b))
                       for gpu_type, (s, a, b) in zip(gpu_types, curves, strict=True)}
        speeds.append(typed_speed(speed_of, (float(speed_1gpu), float(alpha), float(beta)),
                                  by_type))
    return tuple(jobs), tuple(speeds)


@dataclass(frozen=True)
class PlannerConfig:
    """What `rlalloc planner fit` was asked for, saved in `PLANNER_FILE` as it was given."""

    base: str
    """The elastic heuristic followed unless a lookahead shows another proposal better."""
    alternatives: tuple[str, ...]
    """The elastic heuristics whose proposals are weighed against the base's."""
    horizon_s: float
    """How far ahead each drawn future reaches."""
    samples: int
    """Futures drawn per contested decision."""
    seed: int
    """Seed of the draws."""
    cluster: str
    """--cluster as given."""
    fitted_on: tuple[str, ...]
    """The past workloads, as given."""
    futures: str
    """One of `FUTURES`: past days at the same time of day (`HistoryArrivals`), or draws of
    the arrivals model saved in `ARRIVALS_FILE` (`ModelArrivals`)."""


def save_planner(directory: Path, config: PlannerConfig, sizes: JobSizeHistory,
                 history: dict[str, Scenario], command: str, profiles_root: Path | None,
                 arrivals: ArrivalsModel | None = None) -> None:
    """Write `PLANNER_FILE`, a card, the profiles under `profiles_root` of the applications
    the size table names and the `arrivals` model its futures are drawn from (when they are:
    `config.futures`), for the planner over the past workloads `history` (name -> scenario).
    All of them replace an earlier planner's together or not at all."""
    assert (arrivals is not None) == (config.futures == "arrivals")
    from rlalloc.env.output import remove_outputs, staged_outputs, write_atomic, write_json

    with staged_outputs(directory) as staging:
        copied = copy_profiles(sizes, profiles_root, staging)
        write_json(staging / PLANNER_FILE, {
            "format_version": FORMAT_VERSION, **asdict(config), "command": command,
            "profiles": copied, "curves": sizes.to_json(),
            "history_columns": list(HISTORY_COLUMNS),
            "gpu_types": list(_gpu_types_of(history)),
            "history": [{"workload": name, "jobs": history_rows(scenario),
                         "type_curves": history_type_curves(scenario)}
                        for name, scenario in history.items()]})
        if arrivals is not None:
            write_json(staging / ARRIVALS_FILE, arrivals.to_json())
        write_atomic(staging / "card.md", _card(config, history, copied, command))
    if not copied:  # an earlier fit's profiles must not pass for this one's
        remove_outputs(directory, [PROFILES_DIR])
    if arrivals is None:  # nor an earlier fit's arrivals model
        remove_outputs(directory, [ARRIVALS_FILE])


def _gpu_types_of(history: dict[str, Scenario]) -> tuple[str, ...]:
    """The one set of GPU types every past workload's cluster has (`history_gpu_types`)."""
    types = {history_gpu_types(scenario) for scenario in history.values()}
    assert len(types) == 1, types  # `planner fit` builds them all on its one --cluster
    return types.pop()


def _card(config: PlannerConfig, history: dict[str, Scenario], profiles: list[str],
          command: str) -> str:
    """card.md of a saved planner: what it does, what it was fitted on, how it was made."""
    jobs = sum(len(s.workload.jobs) for s in history.values())
    speeds = (f"Jobs of {', '.join(profiles)} run in the copy on their measured profiles "
              f"({PROFILES_DIR}/), other jobs on their speed curve." if profiles else
              "Jobs run in the copy on their speed curve (no profiles were found).")
    return "\n".join([
        f"# Planner over `{config.base}`, told job sizes", "",
        f"At every decision where `{config.base}` and its alternatives "
        f"({', '.join(f'`{a}`' for a in config.alternatives)}) propose different actions, "
        "this policy rebuilds a simulator from the cluster state, forks it once per proposal "
        f"and per future, {_futures_text(config)}, runs every fork to its end "
        "under the base, and takes another proposal only if it ends with less job-time in "
        "every future (`agent/planner.py`, `agent/lookahead.py`). Every heuristic is told job "
        f"sizes from the same past workloads (`agent/job_sizes.py`). {speeds}", "",
        f"Fitted on {len(history)} workload(s) ({jobs} past jobs): {', '.join(history)}; "
        f"cluster {config.cluster}.", "",
        f"Command: `{command}`", ""])


def _futures_text(config: PlannerConfig) -> str:
    """How the card words where the planner's futures come from."""
    if config.futures == "arrivals":
        return (f"each of {config.samples} futures the jobs an arrivals model draws for the "
                f"next {config.horizon_s / 3600:g} h ({ARRIVALS_FILE}, `forecaster/arrivals.py`: "
                "how many follows the time of day and the last hour's arrivals, each a past "
                "job of the same hour of the day)")
    return (f"each future the jobs that arrived in the next {config.horizon_s / 3600:g} h at "
            f"the same time of day in one of {config.samples} past days drawn at random")


def load_planner(directory: Path, name: str | None = None) -> LookaheadPolicy:
    """The planner saved by `save_planner` in `directory`; a damaged file is a `UserError`."""
    path = Path(directory) / PLANNER_FILE
    try:
        raw = read_saved_policy(path, FORMAT_VERSION, "rlalloc planner fit")
        if raw["history_columns"] != list(HISTORY_COLUMNS):
            raise ValueError(f"history_columns {raw['history_columns']!r}")
        sizes = JobSizeHistory.from_json(raw["curves"])
        names = [str(raw["base"]), *map(str, raw["alternatives"])]
        if other := [n for n in names if n not in elastic_names()]:
            raise ValueError(f"heuristics {other} are not elastic ones")  # sia: no sizes to fork
        models = read_copied_profiles(Path(directory), [str(a) for a in raw["profiles"]],
                                      sizes, "rlalloc planner fit")
        speed_of = profiled_speeds(models)
        gpu_types = [str(gpu_type) for gpu_type in raw["gpu_types"]]
        history = _future_source(Path(directory), raw, [
            history_arrivals(w["jobs"], speed_of, gpu_types, w["type_curves"])
            for w in raw["history"]])
    except UserError:
        raise
    except (OSError, ValueError, KeyError, TypeError, AssertionError) as err:
        raise UserError(f"{path}: damaged planner ({err.__class__.__name__}: "
                        f"{str(err).splitlines()[0][:120] if str(err) else 'no detail'}); "
                        "fit it again with `rlalloc planner fit`") from err
    speedups = speedups_of(models)  # one memo for every heuristic's speed-ups
    try:
        base, *alternatives = [told_sizes(policy, sizes.remaining_work, policy, speedups)
                               for policy in names]
    except UserError as err:
        raise UserError(f"{path}: {err}; fit it again with `rlalloc planner fit`") from err
    return planning_policy(base, alternatives, history, name or Path(directory).name, speed_of)


def _future_source(directory: Path, raw: dict, history: list[Arrivals]) -> FutureSource:
    """The futures a saved planner (`raw`, its `PLANNER_FILE`) draws from the past workloads
    `history`: past days, or its arrivals model (`ARRIVALS_FILE`) over their jobs."""
    samples, seed = int(raw["samples"]), int(raw["seed"])
    if raw["futures"] not in FUTURES:
        raise ValueError(f"futures {raw['futures']!r}")
    if raw["futures"] == "past-days":
        return HistoryArrivals(history, float(raw["horizon_s"]), samples, seed)
    model = ArrivalsModel.from_json(json.loads((directory / ARRIVALS_FILE).read_text()))
    jobs = tuple(job for workload_jobs, _ in history for job in workload_jobs)
    speeds = tuple(speed for _, workload_speeds in history for speed in workload_speeds)
    if len(jobs) != len(model.job_gpus):
        raise ValueError(f"{ARRIVALS_FILE} has {len(model.job_gpus)} jobs, the history "
                         f"{len(jobs)}")
    return ModelArrivals(model, (jobs, speeds), samples, seed)
