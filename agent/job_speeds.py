"""Job speeds from the applications' measured profiles: what the state's curve gets wrong.

The state gives each job a two-parameter speed-up curve (`rlalloc.env.featurizer.speedup`)
fitted to its application's profile. On the Pollux applications the fit is far off the profile
at large placements (docs/agent.md, "Job speeds"), so a heuristic ranking growth by the curve
hands GPUs to jobs that will not use them. A cluster that runs known applications can do better
with their measured throughput by placement (Pollux measures it as jobs run). A
`JobSizeHistory` already names the application and batch size behind each curve it has seen
(`kinds`); where it names exactly one and that application's profile is at hand,
`profile_models` gives the curve its measured speed model:

- `ProfiledSpeedups` (`speedups_of`): the speed-ups an elastic heuristic ranks by
  (`rlalloc sizes fit`);
- `profiled_speeds`: the speeds a simulator rebuilt from the state runs jobs at
  (`rlalloc planner fit`).

Jobs of any other curve keep the curve. A saved policy directory carries copies of the
profiles it uses (`copy_profiles`, `read_copied_profiles`), so that it runs anywhere, whatever
profiles are installed there.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from rlalloc.agent.heuristics import curve_speedups
from rlalloc.agent.job_sizes import CurveKey, JobSizeHistory, curve_key
from rlalloc.env.errors import UserError
from rlalloc.env.profiles import AppProfile, cached_profiles
from rlalloc.env.rebuild import SpeedOf, curve_speed
from rlalloc.env.simulator import JobSpeed, ThroughputFn
from rlalloc.env.state import ClusterState

PROFILES_DIR = "profiles"
"""Where a saved policy directory keeps its copies of the applications' profiles."""


def profile_models(sizes: JobSizeHistory,
                   profiles: dict[str, AppProfile]) -> dict[CurveKey, ThroughputFn]:
    """The measured throughput (iterations/s by placement shape) of each curve of `sizes`
    behind which the table saw exactly one application and batch size with a profile."""
    models: dict[CurveKey, ThroughputFn] = {}
    for key, kinds in sizes.kinds.items():
        if len(kinds) == 1 and kinds[0][0] in profiles:
            application, batch_size = kinds[0]
            models[key] = profiles[application].throughput(batch_size).iterations_per_s
    return models


def profiled_speeds(models: dict[CurveKey, ThroughputFn]) -> SpeedOf:
    """The speed model of a curve: its measured throughput in `models` (`profile_models`),
    the curve itself otherwise."""
    cache: dict[tuple[float, float, float], JobSpeed] = {}

    def speed_of(speed_1gpu: float, alpha: float, beta: float) -> JobSpeed:
        curve = (speed_1gpu, alpha, beta)
        if curve not in cache:
            model = models.get(curve_key(*curve))
            cache[curve] = (JobSpeed(model, *curve) if model is not None
                            else curve_speed(*curve))
        return cache[curve]

    return speed_of


def assumed_shape(workers: int, nodes: int, gpus_per_node: int,
                  gpus_per_worker: int = 1) -> tuple[int, ...]:
    """GPUs per node of `workers` workers of `gpus_per_worker` GPUs on `nodes` nodes: packed
    onto full nodes (as many whole workers as a node's GPUs hold) when `nodes` is the fewest
    that hold them (how the elastic heuristics place), workers spread evenly otherwise."""
    per_node = max(gpus_per_node // gpus_per_worker, 1)
    nodes = max(min(nodes, workers), 1)
    full, rest = divmod(workers, per_node)
    if nodes == full + (rest > 0):
        shape = (per_node,) * full + ((rest,) if rest else ())
    else:
        share, extra = divmod(workers, nodes)
        shape = tuple(share + (i < extra) for i in range(nodes))
    return tuple(count * gpus_per_worker for count in shape)


class ProfiledSpeedups:
    """`rlalloc.agent.heuristics.Speedups` from measured throughput where `models` has a job's
    curve: its iterations per second on the placement (in GPUs per node, a worker's all on
    one node) over those on one GPU; the curve otherwise."""

    def __init__(self, models: dict[CurveKey, ThroughputFn]) -> None:
        self.models = models
        self._keys: dict[tuple[float, float, float], CurveKey | None] = {}
        self._memo: dict[tuple[CurveKey, int, int, int, int], float] = {}

    def __call__(self, state: ClusterState, rows: np.ndarray, workers: np.ndarray,
                 nodes: np.ndarray) -> np.ndarray:
        rows, workers, nodes = np.broadcast_arrays(np.asarray(rows), np.asarray(workers),
                                                   np.asarray(nodes))
        curve = np.asarray(curve_speedups(state, rows, workers, nodes), dtype=np.float64)
        jobs = state.jobs
        flat_rows = rows.reshape(-1).tolist()
        keys = {row: self._key_of((float(jobs.speed_1gpu[row]), float(jobs.scaling_alpha[row]),
                                   float(jobs.scaling_beta[row])))
                for row in set(flat_rows)}
        if all(key is None for key in keys.values()):
            return curve
        per_worker = {row: int(jobs.gpus_per_worker[row]) for row in keys}
        per_node = max(int(state.nodes.gpus_total.max(initial=1)), 1)
        # plain Python over memoised values: a decision asks for a few hundred entries, for
        # which numpy's per-call overhead (unique rows and the like) cost many times the
        # curve's time (docs/experiments/2026-11-25-job-speeds.md)
        result = curve.reshape(-1).copy()
        for i, (row, n, k) in enumerate(zip(flat_rows, workers.reshape(-1).tolist(),
                                            nodes.reshape(-1).tolist(), strict=True)):
            key = keys[row]
            if key is not None:
                result[i] = self._speedup(key, n, k, per_node, per_worker[row])
        return result.reshape(curve.shape)

    def _key_of(self, curve: tuple[float, float, float]) -> CurveKey | None:
        """The curve's key in `models`, None where it has no profile (memoised)."""
        if curve not in self._keys:
            key = curve_key(*curve)
            self._keys[curve] = key if key in self.models else None
        return self._keys[curve]

    def _speedup(self, key: CurveKey, workers: int, nodes: int, per_node: int,
                 per_worker: int) -> float:
        memo_key = (key, workers, nodes, per_node, per_worker)
        if memo_key not in self._memo:
            model = self.models[key]
            self._memo[memo_key] = (0.0 if workers <= 0 else
                                    model(assumed_shape(workers, nodes, per_node, per_worker))
                                    / model((1,)))
        return self._memo[memo_key]


def speedups_of(models: dict[CurveKey, ThroughputFn]) -> ProfiledSpeedups | None:
    """`ProfiledSpeedups` over `models`, None (the state's curves, `told_sizes`' default) when
    there are none: a policy without profiles ranks exactly as one saved before them."""
    return ProfiledSpeedups(models) if models else None


def copy_profiles(sizes: JobSizeHistory, profiles_root: Path | None, target: Path) -> list[str]:
    """Copy into `target`/`PROFILES_DIR` the profiles under `profiles_root` of the
    applications `sizes` names, with the licence in or beside that folder if there is one (the
    Pollux profiles are Apache-2.0, which asks for it to travel with copies); the
    applications copied, sorted (none without a root)."""
    applications = sorted({application for kinds in sizes.kinds.values()
                           for application, _ in kinds})
    copied = [application for application in applications
              if profiles_root is not None and (profiles_root / application).is_dir()]
    for application in copied:  # files only: the shared data's read-only modes would stop a
        folder = target / PROFILES_DIR / application  # later --force removing them
        folder.mkdir(parents=True)
        for path in sorted((profiles_root / application).glob("*.csv")):
            shutil.copyfile(path, folder / path.name)
    licences = ([profiles_root / "LICENSE", profiles_root.parent / "LICENSE"]
                if profiles_root is not None else [])
    licence = next((path for path in licences if path.is_file()), None)
    if copied and licence is not None:
        shutil.copyfile(licence, target / PROFILES_DIR / "LICENSE")
    return copied


def read_copied_profiles(directory: Path, applications: list[str], sizes: JobSizeHistory,
                         refit: str) -> dict[CurveKey, ThroughputFn]:
    """`profile_models` of the profiles of `applications` copied into a policy `directory`
    (none: {}); a `UserError` naming `refit` (the command that writes the directory again) when
    one of them is missing or unreadable, since the policy would run on, quietly keeping
    little of its gain. Read once per process (`cached_profiles`): an evaluation worker loads
    the policy for every run, and each application's first speed off its measured placements
    costs seconds, which its memoised models then save."""
    if not applications:
        return {}
    folder = directory / PROFILES_DIR
    if not folder.is_dir():
        raise UserError(f"{folder}: the copied profiles cannot be read (no such folder); fit "
                        f"it again with `{refit}`")
    missing = [a for a in applications if not (folder / a / "placements.csv").is_file()]
    if missing:
        raise UserError(f"{folder}: the profiles of {', '.join(missing)} are missing; copy "
                        "their folders back from the app_profiles they came from, or fit it "
                        f"again with `{refit}`")
    try:
        profiles = cached_profiles(folder)
    except (UserError, ValueError, KeyError, TypeError) as err:  # a cell that is not a number
        reason = str(err).split(";")[0].splitlines()[0][:160]
        raise UserError(f"{folder}: the copied profiles cannot be read ({reason}); fit it "
                        f"again with `{refit}`") from None
    missing = [a for a in applications if a not in profiles]  # read before they were copied
    if missing:
        raise UserError(f"{folder}: the profiles of {', '.join(missing)} were not there when "
                        f"this process first read the folder; fit it again with `{refit}` "
                        "and start the command again")
    models = profile_models(sizes, profiles)
    try:  # the profiles build their models on first use: a damaged cell shows here, not mid-run
        for model in models.values():
            model((1,))
    except (ValueError, KeyError, TypeError, ArithmeticError) as err:  # a 0 step time too
        reason = str(err).splitlines()[0][:160] if str(err) else type(err).__name__
        raise UserError(f"{folder}: the copied profiles cannot be read ({reason}); fit it "
                        f"again with `{refit}`") from None
    return models
