"""Job speed: measured throughput profiles (Pollux's on T4, Sia's on other GPU types) and a
generic scaling model fitted to the Pollux ones.

Two kinds of job run in the simulator:

* **Profiled jobs** (a Pollux application: bert, cifar10, deepspeech2, imagenet, ncf, yolov3)
  keep their global batch size ``B`` fixed across resizes, as in the Pollux simulator
  (petuum/adaptdl ``simulator/applications.py``, OSDI'21 artifact). With ``n`` workers each
  computes ``local_bsz = ceil(B / n)``; when that exceeds the largest measured local batch the
  job accumulates gradients (``accum = ceil(local / max_local) - 1`` extra micro-steps of
  ``atomic = ceil(local / (accum + 1))`` samples), each adding ``step_time - sync_time``.
  The step time of a placement measured in ``placements.csv`` is interpolated over the local
  batch size; any other placement is interpolated linearly over (nodes, replicas, local batch)
  from ``placements.csv`` + ``scalability.csv``, with the nearest measurement outside their
  convex hull. Work is the number of iterations the job's validation trace needs to reach its
  completion epoch (Pollux's ``max_epochs``), interpolated between validated batch sizes.
* **Generic jobs** (trace rows with no profile) use ``n / (1 + alpha (n - 1) + beta n [k > 1])``
  iterations per second on ``n`` GPUs over ``k`` nodes: 1.0 on one GPU. With the single-GPU
  step time as unit, one step on ``n`` GPUs takes ``1/n`` of compute plus the all-reduce:
  ``alpha (n - 1) / n`` inside a node (ring all-reduce) and a further ``beta`` once the job
  crosses nodes. The measurements show that cross-node step: "4" is much faster than "22", but
  "1111" is no slower than "22", so the penalty is charged once, not per node. The two constants
  are fitted to the measured profiles (`fit_generic_scaling`) and embedded, so the project runs
  without any data file.

A placement *shape* is the tuple of GPUs used on each node, sorted descending: ``(4, 2)`` is
four GPUs on one node and two on another. Node identity and order do not change speed.

An application's profile per GPU type (`AppProfile.on_type`, ``placements-<suffix>.csv``) is
a profile like the T4 one, on that type; `AppProfile.speed_on` picks it, or the documented
fallback of `rlalloc.env.gpu_types` for a type it was not measured on.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from importlib.resources import files
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd
from scipy.interpolate import LinearNDInterpolator, NearestNDInterpolator
from scipy.optimize import least_squares
from scipy.spatial import QhullError

from rlalloc.env.errors import UserError
from rlalloc.env.gpu_types import PROFILE_SUFFIX, relative_speed

Shape = tuple[int, ...]
"""GPUs used on each node of a placement, sorted descending, zeros dropped: ``(4, 2)``."""

GENERIC_ALPHA = 0.2230
"""Intra-node all-reduce time of the generic model, in single-GPU step times; fitted from the
Pollux profiles by `fit_generic_scaling` (docs/workloads.md); tests/test_profiles.py checks it
matches a refit."""
GENERIC_BETA = 0.1722
"""Extra cross-node sync time of the generic model, in single-GPU step times; fitted from the
Pollux profiles by `fit_generic_scaling`; tests/test_profiles.py checks it matches a refit."""

RESTORE_S: dict[str, float] = {
    "ncf": 15.0,
    "deepspeech2": 25.0,
    "cifar10": 50.0,
    "yolov3": 80.0,
    "bert": 120.0,
    "imagenet": 250.0,
}
"""Checkpoint-restore seconds per application, charged on every (re)start or resize: the
figures Sia (SOSP'23) measured for the Pollux models (listed in shared/data/README.md)."""
GENERIC_RESTORE_S = 65.0
"""Restore seconds for a job without a profile: the median of `RESTORE_S` ((50 + 80) / 2)."""

MAX_EPOCHS: dict[str, int] = {
    "bert": 2,
    "cifar10": 100,
    "ncf": 10,
    "imagenet": 90,
    "deepspeech2": 80,
    "yolov3": 50,
}
"""Completion epoch per application, as the Pollux simulator sets it; an application not listed
finishes at the end of its shortest validation trace (Pollux's default)."""
MAX_LOCAL_BSZ: dict[str, int] = {"yolov3": 8}
"""Largest per-GPU batch without gradient accumulation where it is smaller than the largest
measured one (Pollux caps yolov3 at 8 for GPU memory); others use the largest measured."""

STEP_EXCLUDES_SYNC = frozenset({"gpt_pmp"})
"""Applications whose profiled `step_time` is one micro-batch's compute and `sync_time` the
rest of the iteration (pipeline flush and all-reduce): Sia's gpt_pmp, a pipeline- and
data-parallel GPT whose step time does not change with its placement while its sync time
grows with it, and exceeds the step time on every multi-node placement."""

VALIDATION_COLUMNS = ["progress", "iteration", "grad_sqr", "grad_var"]
"""Columns read from ``validation-<batch>.csv``: iterations give work at a fixed batch size,
progress and gradient statistics give the statistical efficiency (`rlalloc.env.efficiency`)."""

PROFILES_ENV_VAR = "RLALLOC_PROFILES"
"""Environment variable naming a Pollux ``app_profiles`` folder."""
DEFAULT_PROFILES_ROOT = Path(str(files("rlalloc.env") / "app_profiles"))
"""The Pollux profiles shipped in the package (Apache-2.0; see app_profiles/README.md there)."""


class ThroughputModel(Protocol):
    """Speed of one job as a function of its placement; what the simulator integrates."""

    def iterations_per_s(self, shape: Shape) -> float:
        """Training iterations per second on `shape` (GPUs per node, sorted descending).

        Implementations memoise by the shape tuple: the simulator asks on every re-allocation,
        and a repeated shape must cost about a dictionary lookup.
        """
        ...


def canonical_shape(gpus_per_node: tuple[int, ...] | list[int]) -> Shape:
    """Sorted-descending per-node GPU counts with empty nodes dropped: the memo key."""
    return tuple(sorted((g for g in gpus_per_node if g > 0), reverse=True))


def packed_shape(num_gpus: int, gpus_per_node: int, gpus_per_worker: int = 1) -> Shape:
    """The fewest-nodes placement of `num_gpus` in whole workers of `gpus_per_worker` GPUs:
    full nodes then the remainder (8 on 4s: (4, 4); 9 in 3-GPU workers on 8s: (6, 3))."""
    node_gpus = gpus_per_node // gpus_per_worker * gpus_per_worker
    assert node_gpus > 0 and num_gpus % gpus_per_worker == 0, (num_gpus, gpus_per_node,
                                                                gpus_per_worker)
    full, rest = divmod(num_gpus, node_gpus)
    return (node_gpus,) * full + ((rest,) if rest else ())


@dataclass(frozen=True)
class GenericScaling:
    """``n / (1 + alpha (n - 1) + beta n [k > 1])`` iterations per second: 1.0 on one GPU.

    ``alpha`` is the intra-node all-reduce time and ``beta`` the extra cross-node sync time, both
    in units of the single-GPU step time (module docstring). With ``beta > 0`` a job on one node
    is faster than the same GPUs spread over several.
    """

    alpha: float
    beta: float
    _memo: dict[Shape, float] = field(default_factory=dict, init=False, repr=False, compare=False)

    def iterations_per_s(self, shape: Shape) -> float:
        """Iterations per second on `shape`; memoised by the tuple."""
        try:
            return self._memo[shape]
        except KeyError:
            n = sum(shape)
            cross_node = self.beta * n if sum(1 for g in shape if g > 0) > 1 else 0.0
            speed = n / (1.0 + self.alpha * (n - 1) + cross_node) if n else 0.0
            self._memo[shape] = speed
            return speed


GENERIC_SCALING = GenericScaling(GENERIC_ALPHA, GENERIC_BETA)
"""The model every job without a profile uses, in loaders and simulator alike."""


class ProfiledThroughput:
    """Measured speed of one application at one fixed global batch size (see module docstring)."""

    def __init__(self, profile: AppProfile, batch_size: int) -> None:
        self.profile = profile
        self.batch_size = batch_size
        self._memo: dict[Shape, float] = {}

    def iterations_per_s(self, shape: Shape) -> float:
        """Iterations per second on `shape`; memoised by the tuple (unsorted input accepted)."""
        try:
            return self._memo[shape]
        except KeyError:
            speed = self._compute(canonical_shape(shape))
            self._memo[shape] = speed
            return speed

    def _compute(self, shape: Shape) -> float:
        if not shape:
            return 0.0
        profile = self.profile
        local_bsz = -(-self.batch_size // sum(shape))
        accum_steps = -(-local_bsz // profile.max_local_bsz) - 1
        atomic_bsz = -(-local_bsz // (accum_steps + 1))
        step_s, sync_s = profile.step_time(shape, atomic_bsz)
        if profile.step_excludes_sync:
            step_s = (accum_steps + 1) * step_s + sync_s
        else:
            step_s += accum_steps * (step_s - sync_s)
        return 1.0 / step_s


class ScaledThroughput:
    """Another model's speed times a constant: a type without a profile, run at the speed of
    the nearest measured type times their `RELATIVE_SPEED` ratio (`AppProfile.speed_on`)."""

    def __init__(self, model: ThroughputModel, factor: float) -> None:
        self.model = model
        self.factor = factor
        self._memo: dict[Shape, float] = {}

    def iterations_per_s(self, shape: Shape) -> float:
        """`factor` times the underlying model's speed on `shape`; memoised by the tuple."""
        try:
            return self._memo[shape]
        except KeyError:
            speed = self._memo[shape] = self.factor * self.model.iterations_per_s(shape)
            return speed


@dataclass
class AppProfile:
    """One application's measurements: step times by placement and validation traces."""

    name: str
    placements: pd.DataFrame
    """Measured ``placement,local_bsz,step_time,sync_time`` plus ``num_nodes,num_replicas``."""
    scalability: pd.DataFrame
    """Measured ``num_nodes,num_replicas,local_bsz,step_time,sync_time`` on larger clusters."""
    validation: dict[int, pd.DataFrame]
    """Validated batch size -> one row per epoch: ``progress`` (Pollux's statistical progress
    at the epoch's end), ``iteration`` (iterations completed), ``grad_sqr``, ``grad_var``."""
    max_epochs: int
    min_local_bsz: int
    max_local_bsz: int
    gpu_type: str = "T4"
    """The GPU type these step times were measured on (`rlalloc.env.gpu_types`)."""
    on_type: dict[str, AppProfile] = field(default_factory=dict, repr=False, compare=False)
    """Every type this application was measured on -> its profile there (this one included);
    they share the validation traces, since work does not depend on the GPU."""
    _throughputs: dict[int, ProfiledThroughput] = field(default_factory=dict, repr=False)
    derived: dict[object, object] = field(default_factory=dict, repr=False, compare=False)
    """Models other modules derive from this profile (`rlalloc.env.efficiency`), memoised here so
    that a process re-using the profile builds each once."""

    @property
    def validated_batch_sizes(self) -> list[int]:
        """Batch sizes with a validation trace, ascending; work is defined between the ends."""
        return sorted(self.validation)

    def throughput(self, batch_size: int) -> ProfiledThroughput:
        """The (shared, memoised) speed model of this application at global `batch_size`."""
        model = self._throughputs.get(batch_size)
        if model is None:
            model = self._throughputs[batch_size] = ProfiledThroughput(self, batch_size)
        return model

    def measured_for(self, gpu_type: str) -> tuple[AppProfile, float]:
        """The profile that stands for `gpu_type` and the factor its speeds are scaled by:
        the one measured on that type (factor 1), else the documented fallback
        (`rlalloc.env.gpu_types`): the measured type nearest in relative speed, scaled by the
        ratio of the two types' `RELATIVE_SPEED`."""
        measured = self.on_type.get(gpu_type)
        if measured is not None:
            return measured, 1.0
        target = relative_speed(gpu_type)
        nearest = min(self.on_type.values(),
                      key=lambda p: abs(math.log(relative_speed(p.gpu_type) / target)))
        return nearest, target / relative_speed(nearest.gpu_type)

    def speed_on(self, gpu_type: str, batch_size: int) -> tuple[ThroughputModel, GenericScaling]:
        """Speed at global `batch_size` on `gpu_type`, and its curve (`scaling_fit`): those of
        the profile `measured_for` names, its throughput scaled by its factor."""
        nearest, factor = self.measured_for(gpu_type)
        if factor == 1.0:
            return nearest.throughput(batch_size), nearest.scaling_fit(batch_size)
        key = ("scaled", gpu_type, batch_size)
        model = nearest.derived.get(key)
        if model is None:
            model = nearest.derived[key] = ScaledThroughput(nearest.throughput(batch_size),
                                                            factor)
        return model, nearest.scaling_fit(batch_size)

    def work_iterations(self, batch_size: int) -> float:
        """Iterations to completion at `batch_size`: the validation trace's iteration count at
        the completion epoch, linearly interpolated between the neighbouring validated sizes."""
        sizes = self.validated_batch_sizes
        if not sizes[0] <= batch_size <= sizes[-1]:
            raise ValueError(
                f"{self.name}: batch size {batch_size} outside the validated range "
                f"{sizes[0]}..{sizes[-1]}"
            )
        epoch = self.max_epochs - 1
        iterations = [float(self.validation[b]["iteration"].iloc[epoch]) for b in sizes]
        return float(np.interp(batch_size, sizes, iterations))

    def max_workers(self, batch_size: int) -> int:
        """Most workers that still get `min_local_bsz` samples each (at least 1)."""
        return max(1, batch_size // self.min_local_bsz)

    def scaling_fit(self, batch_size: int) -> GenericScaling:
        """This application's speed-up at `batch_size` summarised as a `GenericScaling` curve
        (speed relative to one GPU), for policies that reason with an approximate model."""
        return fit_speedup_curve(_throughput_speedups(self, batch_size))

    def step_time(self, shape: Shape, local_bsz: int) -> tuple[float, float]:
        """(step, sync) seconds of one iteration of `local_bsz` samples per GPU on `shape`."""
        measured = self._measured_by_shape.get(shape)
        if measured is not None:
            bsz, step, sync = measured
            return float(np.interp(local_bsz, bsz, step)), float(np.interp(local_bsz, bsz, sync))
        point = (min(len(shape), self._max_nodes), sum(shape), local_bsz)
        step_sync = self._linear(np.array([point], dtype=float))[0]
        if np.isnan(step_sync[0]):
            step_sync = self._nearest(np.array([point], dtype=float))[0]
        return float(step_sync[0]), float(step_sync[1])

    @cached_property
    def _measured_by_shape(self) -> dict[Shape, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        # Orderings of the same per-node counts ("1212", "1122") are averaged: node order is
        # not something a scheduler controls, and the differences are measurement noise.
        df = self.placements.assign(
            shape=[canonical_shape([int(c) for c in str(p)]) for p in self.placements.placement]
        )
        means = df.groupby(["shape", "local_bsz"])[["step_time", "sync_time"]].mean()
        return {
            shape: (
                group.index.get_level_values("local_bsz").to_numpy(float),
                group["step_time"].to_numpy(),
                group["sync_time"].to_numpy(),
            )
            for shape, group in means.groupby(level="shape")
        }

    @cached_property
    def _grid(self) -> tuple[np.ndarray, np.ndarray]:
        xs, ys = ["num_nodes", "num_replicas", "local_bsz"], ["step_time", "sync_time"]
        df = pd.concat(
            [self.placements.groupby(xs, as_index=False)[ys].mean(), self.scalability[xs + ys]],
            ignore_index=True,
        )
        return df[xs].to_numpy(float), df[ys].to_numpy(float)

    @property
    def step_excludes_sync(self) -> bool:
        """Whether `step_time` is one micro-step's compute without the synchronisation
        (`STEP_EXCLUDES_SYNC`): an iteration then takes every micro-step plus one sync."""
        return self.name in STEP_EXCLUDES_SYNC

    @cached_property
    def _linear(self) -> Callable[[np.ndarray], np.ndarray]:
        # The first evaluation prepares every simplex: the slow part, once per application
        # (its cost: docs/agent.md, "Job speeds"). Measurements on a plane (gpt_pmp uses whole
        # 8-GPU nodes: replicas = 8 x nodes) span no simplex: the nearest one is used there.
        try:
            return LinearNDInterpolator(*self._grid)
        except QhullError:
            return lambda points: np.full((len(points), 2), np.nan)

    @cached_property
    def _nearest(self) -> NearestNDInterpolator:
        # Axes span 1..16 nodes and up to 32k samples: rescale so all three count.
        return NearestNDInterpolator(*self._grid, rescale=True)

    @cached_property
    def _max_nodes(self) -> int:
        # Beyond the largest measured node count every replica already syncs over the network;
        # Pollux caps the node count there too.
        return int(self._grid[0][:, 0].max())


def default_profiles_root() -> Path:
    """`RLALLOC_PROFILES` if set (a user's own measured profiles), else the shipped ones."""
    env = os.environ.get(PROFILES_ENV_VAR)
    return Path(env) if env else DEFAULT_PROFILES_ROOT


def profiles_or_default(root: Path | None) -> dict[str, AppProfile]:
    """The profiles under `root`, else those of `default_profiles_root()`, read once."""
    return cached_profiles(root if root is not None else default_profiles_root())


@functools.cache
def _profiles_at(resolved: Path) -> dict[str, AppProfile]:
    return load_profiles(resolved)


def cached_profiles(root: Path) -> dict[str, AppProfile]:
    """`load_profiles(root)`, read once per process: evaluation workers build a workload and a
    scenario per run, and the models derived from a profile are memoised on it
    (`AppProfile.derived`), so every later run re-uses them."""
    return _profiles_at(Path(root).resolve())


def load_profiles(root: Path) -> dict[str, AppProfile]:
    """Every application folder under `root` (a Pollux ``app_profiles`` directory), by name."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(
            f"{root}: no such profiles folder; point {PROFILES_ENV_VAR} at a Pollux "
            "app_profiles directory, or unset it to use the shipped Pollux profiles"
        )
    profiles = {
        app_dir.name: _load_app(app_dir)
        for app_dir in sorted(root.iterdir())
        if app_dir.is_dir() and any(app_dir.glob("placements*.csv"))
    }
    if not profiles:
        raise UserError(f"{root}: no <application>/placements.csv inside; is it app_profiles?")
    return profiles


def _read_csv(path: Path, columns: list[str]) -> pd.DataFrame:
    try:
        df = pd.read_csv(path)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise UserError(
            f"{path}: cannot read ({err.__class__.__name__}); restore the file"
        ) from err
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise UserError(f"{path}: missing column(s) {', '.join(missing)}; restore the file")
    return df


def _load_app(app_dir: Path) -> AppProfile:
    """The application's profile on T4 if measured there, else on its first measured type
    (`PROFILE_SUFFIX` order), with every measured type in `AppProfile.on_type`."""
    name = app_dir.name
    measured = [(gpu_type, suffix) for gpu_type, suffix in PROFILE_SUFFIX.items()
                if (app_dir / f"placements{suffix}.csv").is_file()]
    if not measured:
        raise UserError(f"{app_dir}: no placements.csv (or placements-<type>.csv for a type in "
                        "rlalloc.env.gpu_types.PROFILE_SUFFIX); restore the profile folder")
    validation = {
        int(path.stem.split("-")[-1]): _read_csv(path, VALIDATION_COLUMNS)
        for path in app_dir.glob("validation-*.csv")
    }
    if not validation:
        raise UserError(f"{app_dir}: no validation-<batch>.csv; restore the profile folder")
    max_epochs = MAX_EPOCHS.get(name, min(len(v) for v in validation.values()))
    if any(len(v) < max_epochs for v in validation.values()):
        raise UserError(f"{app_dir}: a validation trace is shorter than {max_epochs} epochs")
    on_type: dict[str, AppProfile] = {}
    for gpu_type, suffix in measured:
        placements = _read_csv(app_dir / f"placements{suffix}.csv",
                               ["placement", "local_bsz", "step_time", "sync_time"])
        digits = placements["placement"].astype(str)
        placements = placements.assign(
            num_nodes=digits.str.len(), num_replicas=[sum(map(int, p)) for p in digits]
        )
        scalability = _read_csv(
            app_dir / f"scalability{suffix}.csv",
            ["num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time"],
        )
        on_type[gpu_type] = AppProfile(
            name=name,
            placements=placements,
            scalability=scalability,
            validation=validation,
            max_epochs=max_epochs,
            min_local_bsz=int(placements["local_bsz"].min()),
            max_local_bsz=MAX_LOCAL_BSZ.get(name, int(placements["local_bsz"].max())),
            gpu_type=gpu_type,
            on_type=on_type,
        )
    return on_type[measured[0][0]]


def fit_batch_size(profile: AppProfile) -> int:
    """The batch size the generic fit uses for `profile`: its median validated size (the lower
    of the two middle ones when their number is even, so that it is a measured size)."""
    sizes = profile.validated_batch_sizes
    return sizes[(len(sizes) - 1) // 2]


def speedup_samples(profile: AppProfile, speedup: Callable[[Shape], float],
                    limit: int) -> list[tuple[int, int, float]]:
    """(n, k, `speedup`(shape)) for each measured placement of `profile` of 2..`limit` GPUs."""
    return [
        (sum(shape), len(shape), speedup(shape))
        for shape in profile._measured_by_shape
        if 1 < sum(shape) <= limit
    ]


def _throughput_speedups(profile: AppProfile, batch_size: int) -> list[tuple[int, int, float]]:
    """`speedup_samples` of the iteration rate at `batch_size` over one GPU."""
    model = profile.throughput(batch_size)
    single = model.iterations_per_s((1,))
    return speedup_samples(profile, lambda shape: model.iterations_per_s(shape) / single,
                           profile.max_workers(batch_size))


def fit_speedup_curve(samples: list[tuple[int, int, float]]) -> GenericScaling:
    """The `GenericScaling` curve (alpha, beta >= 0) minimising the squared error of log
    speed-up over `samples` of (GPUs, nodes, speed-up).

    In log space every measured placement weighs the same relative error; the linearised fit
    (``n / speedup - 1`` as the target) lets the worst-scaling application (ncf, whose
    speed-up stays below 1) dominate and returns a negative node cost (docs/workloads.md).
    """
    if not samples:
        return GenericScaling(0.0, 0.0)
    arr = np.asarray(samples, dtype=float)
    n, k, speedup = arr[:, 0], arr[:, 1], arr[:, 2]
    design = np.column_stack([n - 1, n * (k > 1)])
    result = least_squares(
        lambda coef: np.log(speedup) - np.log(n / (1.0 + design @ coef)),
        x0=[0.1, 0.1],
        bounds=([0.0, 0.0], [np.inf, np.inf]),
    )
    return GenericScaling(float(result.x[0]), float(result.x[1]))


def fit_generic_scaling(profiles: dict[str, AppProfile]) -> GenericScaling:
    """Fit the generic model to the T4 (Pollux) applications' measured placements, each at its
    `fit_batch_size`: the source of `GENERIC_ALPHA` and `GENERIC_BETA`."""
    samples = [s for p in profiles.values() if "T4" in p.on_type
               for s in _throughput_speedups(p.on_type["T4"], fit_batch_size(p))]
    return fit_speedup_curve(samples)


def fit_relative_speeds(profiles: dict[str, AppProfile]) -> dict[str, float]:
    """Per measured type, the median over applications measured on it and on T4 of the ratio
    of their best single-GPU throughputs (samples per second at the best measured local
    batch): the source of `rlalloc.env.gpu_types.RELATIVE_SPEED` for the profiled types."""
    def single_gpu(profile: AppProfile) -> float | None:
        rows = profile.placements[profile.placements["placement"].astype(str) == "1"]
        return float((rows["local_bsz"] / rows["step_time"]).max()) if len(rows) else None

    ratios: dict[str, list[float]] = {}
    for profile in profiles.values():
        base = single_gpu(profile.on_type["T4"]) if "T4" in profile.on_type else None
        for gpu_type, measured in profile.on_type.items():
            speed = single_gpu(measured)
            if base and speed:
                ratios.setdefault(gpu_type, []).append(speed / base)
    return {gpu_type: float(np.median(r)) for gpu_type, r in ratios.items()}


def restore_s(application: str | None) -> float:
    """Checkpoint-restore seconds for `application` (`GENERIC_RESTORE_S` when unknown/None)."""
    return RESTORE_S.get(application, GENERIC_RESTORE_S) if application else GENERIC_RESTORE_S


__all__ = [
    "DEFAULT_PROFILES_ROOT",
    "GENERIC_ALPHA",
    "GENERIC_BETA",
    "GENERIC_RESTORE_S",
    "GENERIC_SCALING",
    "MAX_EPOCHS",
    "MAX_LOCAL_BSZ",
    "PROFILES_ENV_VAR",
    "RESTORE_S",
    "AppProfile",
    "GenericScaling",
    "ProfiledThroughput",
    "STEP_EXCLUDES_SYNC",
    "ScaledThroughput",
    "Shape",
    "ThroughputModel",
    "cached_profiles",
    "canonical_shape",
    "default_profiles_root",
    "fit_batch_size",
    "fit_generic_scaling",
    "fit_relative_speeds",
    "fit_speedup_curve",
    "load_profiles",
    "packed_shape",
    "profiles_or_default",
    "restore_s",
    "speedup_samples",
]
