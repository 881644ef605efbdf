"""Statistical efficiency: what one training step buys, by batch size and training epoch.

This is Pollux's goodput model (OSDI'21), as its simulator applies it to the profiled
applications (petuum/adaptdl OSDI'21 artifact, ``simulator/simulator.py`` ``Job.step`` and
``simulator/applications.py``), re-implemented over our profiles:

* **Progress** is counted in iterations at the application's smallest validated batch size
  ``B0``. One iteration at global batch ``B`` during epoch ``e`` adds
  ``gain = (var + sqr) / (var / s + sqr)`` with ``s = B / B0``, where ``sqr`` and ``var`` are
  the gradient's squared norm and variance measured in that epoch (the validation traces'
  ``grad_sqr``, ``grad_var``, linear in ``B`` between validated sizes). The gain lies between 1
  (a noise-free gradient: a larger batch buys nothing) and ``s`` (pure noise: it buys all of it).
  Early in training ``sqr`` dominates, late ``var`` does: large batches become efficient late.
* **Epochs** end at fixed progress: epoch ``e`` ends at the least progress any validated batch
  size had at its end. A job is done at the end of its completion epoch (`MAX_EPOCHS`), so its
  work no longer depends on its batch size; only how fast it gets there does.
* **Goodput** (progress per second) on a placement = gain x iterations per second at ``B``.
  On a cluster of several GPU types the gain is the same on every type (gradient noise is the
  model's) and the iterations per second are that type's, as in Sia's simulator, which
  models goodput per type the same way.

Two kinds of job use it (`EFFICIENCY_MODES`): ``fixed`` keeps the workload's batch size, as
Pollux's Tiresias and Optimus baselines do; ``adaptive`` re-picks the batch size with the best
goodput at every re-allocation and epoch end, as Pollux's co-adaptive jobs (AdaptDL) do. Here
the job knows its true goodput (Pollux fits it online from what it has run), so ``adaptive`` is
the best case of batch-size adaptation. ``none`` is the simulator's plain model: work is the
iterations of the job's validation trace at its own batch size (`AppProfile.work_iterations`).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rlalloc.env.errors import UserError
from rlalloc.env.gpu_types import reference_type
from rlalloc.env.profiles import (
    AppProfile,
    Shape,
    canonical_shape,
    fit_speedup_curve,
    speedup_samples,
)
from rlalloc.env.simulator import JobSpeed
from rlalloc.env.workload.spec import Workload

EFFICIENCY_MODES = ("none", "fixed", "adaptive")
"""How a profiled job's progress is modelled (module docstring); ``none`` is the default."""
BATCH_CANDIDATES_PER_DOUBLING = 4
"""An adaptive job picks among batch sizes spaced 2^(1/4) apart (plus the validated ones)
between the smallest and the largest validated size. A finer grid raises the best goodput
only a little (docs/simulator.md, "Statistical efficiency")."""


@dataclass(frozen=True)
class GradientNoise:
    """One application's gradient statistics by (validated batch size, epoch) and epoch ends."""

    batch_sizes: np.ndarray
    """Validated global batch sizes, ascending."""
    grad_sqr: np.ndarray
    """Squared gradient norm, one row per validated batch size, one column per epoch."""
    grad_var: np.ndarray
    """Gradient variance, same layout."""
    epoch_ends: np.ndarray
    """Progress at the end of epoch 1, 2, ..., the completion epoch: ascending; the last is the
    job's work."""

    @classmethod
    def from_profile(cls, profile: AppProfile) -> GradientNoise:
        """Read from `profile`'s validation traces, up to its completion epoch; a trace whose
        progress does not grow every epoch, or whose gradient statistics are not finite and
        non-negative, is a `UserError` naming it."""
        sizes = profile.validated_batch_sizes
        traces = [profile.validation[b].iloc[:profile.max_epochs] for b in sizes]
        for batch, trace in zip(sizes, traces, strict=True):
            for name in ("progress", "grad_sqr", "grad_var"):
                values = pd.to_numeric(trace[name], errors="coerce").to_numpy(float)
                rising = name != "progress" or np.all(np.diff(values, prepend=0.0) > 0)
                if not (np.all(np.isfinite(values)) and np.all(values >= 0) and rising):
                    rule = "rising every epoch" if name == "progress" else "non-negative"
                    raise UserError(
                        f"{profile.name}/validation-{batch}.csv: column {name} must hold "
                        f"finite numbers, {rule}; restore the profile folder")
        columns = {name: np.array([t[name].to_numpy(float) for t in traces])
                   for name in ("progress", "grad_sqr", "grad_var")}
        return cls(
            batch_sizes=np.array(sizes, dtype=float),
            grad_sqr=columns["grad_sqr"],
            grad_var=columns["grad_var"],
            epoch_ends=columns["progress"].min(axis=0),
        )

    @property
    def work(self) -> float:
        """Progress at completion, whatever the batch size."""
        return float(self.epoch_ends[-1])

    def epoch_at(self, progress: float) -> int:
        """The epoch (0-based) a job at `progress` is in; the last one once it reaches the end."""
        return min(int(np.searchsorted(self.epoch_ends, progress, side="right")),
                   len(self.epoch_ends) - 1)

    def gain(self, batch_size: float, epoch: int) -> float:
        """Progress per iteration at `batch_size` during `epoch` (1 at the smallest size)."""
        sizes = self.batch_sizes
        sqr = float(np.interp(batch_size, sizes, self.grad_sqr[:, epoch]))
        var = float(np.interp(batch_size, sizes, self.grad_var[:, epoch]))
        scale = batch_size / sizes[0]
        return (var + sqr) / (var / scale + sqr)


class GoodputRates:
    """A job's progress per second by placement and epoch (the simulator's `EpochRates`) and,
    per epoch, the speed-up curve policies see: the simulator refreshes it at every epoch end,
    as Pollux's scheduler re-fits its jobs' goodput while they train."""

    def __init__(self, noise: GradientNoise, profile: AppProfile, max_workers: int) -> None:
        self.noise = noise
        self.profile = profile
        self.max_workers = max_workers
        """The most workers the job's batch sizes can use."""
        self._curves: dict[int, tuple[float, float, float]] = {}

    @property
    def epoch_ends(self) -> np.ndarray:
        """Progress at each epoch's end (`GradientNoise.epoch_ends`)."""
        return self.noise.epoch_ends

    def epoch_at(self, progress: float) -> int:
        """See `GradientNoise.epoch_at`."""
        return self.noise.epoch_at(progress)

    def progress_per_s(self, shape: Shape, epoch: int) -> float:
        """Progress per second on `shape` during `epoch`."""
        raise NotImplementedError

    def curve(self, epoch: int) -> tuple[float, float, float]:
        """(goodput on one GPU, alpha, beta) during `epoch`: the same curve family, fitted the
        same way, as the iteration-rate curves of `rlalloc.env.profiles`, so policies read both
        alike; memoised."""
        found = self._curves.get(epoch)
        if found is None:
            single = self.progress_per_s((1,), epoch)
            fit = fit_speedup_curve(speedup_samples(
                self.profile, lambda shape: self.progress_per_s(shape, epoch) / single,
                self.max_workers))
            found = self._curves[epoch] = (single, fit.alpha, fit.beta)
        return found


class FixedBatchGoodput(GoodputRates):
    """Goodput of a job that keeps its global batch size."""

    def __init__(self, noise: GradientNoise, profile: AppProfile, batch_size: int) -> None:
        super().__init__(noise, profile, profile.max_workers(batch_size))
        self.batch_size = batch_size
        self._memo: dict[tuple[Shape, int], float] = {}

    def progress_per_s(self, shape: Shape, epoch: int) -> float:
        """Progress per second on `shape` during `epoch`; memoised."""
        key = (shape, epoch)
        rate = self._memo.get(key)
        if rate is None:
            speed = self.profile.throughput(self.batch_size).iterations_per_s(shape)
            rate = self._memo[key] = speed * self.noise.gain(self.batch_size, epoch)
        return rate


class AdaptiveBatchGoodput(GoodputRates):
    """Goodput of a job that picks the best batch size for each placement and epoch."""

    def __init__(self, noise: GradientNoise, profile: AppProfile,
                 candidates: tuple[int, ...]) -> None:
        super().__init__(noise, profile, profile.max_workers(candidates[-1]))
        self.candidates = candidates
        """Global batch sizes it may run at, ascending (`batch_candidates`)."""
        self._memo: dict[tuple[Shape, int], tuple[float, int]] = {}

    def progress_per_s(self, shape: Shape, epoch: int) -> float:
        """Progress per second on `shape` during `epoch` at the best batch size; memoised."""
        return self.best(shape, epoch)[0]

    def best(self, shape: Shape, epoch: int) -> tuple[float, int]:
        """(goodput, batch size) of the best batch size on `shape` during `epoch`.

        A batch size qualifies when every worker still gets the smallest measured local batch
        (the same bound as a fixed job's `AppProfile.max_workers`); on more workers than the
        largest size allows, the largest size runs with what it can use.
        """
        key = (canonical_shape(shape), epoch)
        found = self._memo.get(key)
        if found is None:
            workers = sum(key[0])
            usable = [b for b in self.candidates if b >= workers * self.profile.min_local_bsz]
            found = max(
                (self.profile.throughput(b).iterations_per_s(key[0]) * self.noise.gain(b, epoch), b)
                for b in usable or self.candidates[-1:]
            )
            self._memo[key] = found
        return found


class ScaledGoodput(GoodputRates):
    """Another type's goodput times a constant: an application on a GPU type it was not
    measured on (`AppProfile.measured_for`). The gradient noise is the model's, whatever the
    GPU, so only the step rate scales, and with it the goodput at every batch size alike."""

    def __init__(self, rates: GoodputRates, factor: float) -> None:
        super().__init__(rates.noise, rates.profile, rates.max_workers)
        self.rates = rates
        self.factor = factor

    def progress_per_s(self, shape: Shape, epoch: int) -> float:
        """`factor` times the measured type's progress per second."""
        return self.factor * self.rates.progress_per_s(shape, epoch)


def add_efficiency_flag(parser: argparse.ArgumentParser) -> None:
    """``--efficiency``, shared by the commands that replay workloads."""
    parser.add_argument("--efficiency", choices=EFFICIENCY_MODES, default="none",
                        help="profiled jobs' progress: none (iterations at the job's batch "
                             "size), fixed or adaptive batch size under Pollux's statistical "
                             "efficiency model (docs/simulator.md; default: %(default)s)")


def batch_candidates(sizes: list[int]) -> tuple[int, ...]:
    """Validated sizes plus a geometric grid between the smallest and the largest of them."""
    low, high = sizes[0], sizes[-1]
    steps = int(round(np.log2(high / low) * BATCH_CANDIDATES_PER_DOUBLING))
    grid = np.rint(low * np.exp2(np.arange(steps + 1) / BATCH_CANDIDATES_PER_DOUBLING))
    return tuple(sorted({*sizes, *(int(b) for b in grid if low <= b <= high)}))


def goodput_speeds(workload: Workload, profiles: dict[str, AppProfile], mode: str,
                   speeds: tuple[JobSpeed, ...], total_gpus: int,
                   gpu_types: Sequence[str] = ("T4",),
                   ) -> tuple[Workload, tuple[JobSpeed, ...]]:
    """`workload` and `speeds` with every profiled job's progress modelled by `mode` on a
    cluster of `gpu_types` (each node's type, or the distinct ones).

    Work becomes the completion epoch's progress. The curve policies see starts as the first
    epoch's goodput (`GoodputRates.curve`): for an adaptive job its speed-up includes the
    larger batches more GPUs allow, and its elastic upper bound grows to what its largest batch
    size can use. A job that keeps its batch size (`JobSpec.fixed_batch`: Sia's scale-gpus and
    rigid jobs) is a fixed one in either mode. On a cluster of several types each type gets the
    job's rates from the application's profile measured there, or from the nearest measured
    type's, scaled (`ScaledGoodput`); the speed then carries one per type (`JobSpeed.by_type`),
    its own being the reference type's. Jobs without a profile keep `speeds`' model. The rate
    models are memoised on each profile, so a process that builds many scenarios fits each
    curve once.
    """
    if mode not in EFFICIENCY_MODES:
        raise ValueError(f"efficiency mode {mode!r}; choose one of {', '.join(EFFICIENCY_MODES)}")
    if mode == "none":
        return workload, speeds
    types = tuple(dict.fromkeys(gpu_types))
    reference = reference_type(types)
    jobs, new_speeds = [], []
    for job, speed in zip(workload.jobs, speeds, strict=True):
        if job.application is None or job.batch_size is None:
            jobs.append(job)
            new_speeds.append(speed)
            continue
        job_mode = "fixed" if job.fixed_batch else mode
        by_type = {t: _goodput_rates_on(profiles[job.application], t, job_mode, job.batch_size)
                   for t in types}
        usable = max(rates.max_workers for rates in by_type.values())
        upper = max(job.max_workers, min(usable, total_gpus)) \
            if job_mode == "adaptive" else job.max_workers
        jobs.append(dataclasses.replace(job, work=by_type[reference].noise.work,
                                        max_workers=upper))
        typed = {t: _rate_speed(rates) for t, rates in by_type.items()}
        new_speeds.append(typed[reference] if len(types) == 1
                          else dataclasses.replace(typed[reference], by_type=typed))
    return dataclasses.replace(workload, jobs=tuple(jobs)), tuple(new_speeds)


def _rate_speed(rates: GoodputRates) -> JobSpeed:
    """The `JobSpeed` that runs a job at `rates`: the first epoch's curve until it changes."""
    single, alpha, beta = rates.curve(0)
    return JobSpeed(lambda shape, r=rates: r.progress_per_s(shape, 0), single, alpha, beta,
                    epochs=rates)


def _goodput_rates_on(profile: AppProfile, gpu_type: str, mode: str,
                      batch_size: int) -> GoodputRates:
    """The job's rate model on `gpu_type`: its application's there, or the fallback type's
    scaled (`ScaledGoodput`), memoised on the measured profile."""
    measured, factor = profile.measured_for(gpu_type)
    rates = _goodput_rates(measured, mode, batch_size)
    if factor == 1.0:
        return rates
    key = ("goodput-scaled", gpu_type, mode, batch_size if mode == "fixed" else None)
    scaled = measured.derived.get(key)
    if scaled is None:
        scaled = measured.derived[key] = ScaledGoodput(rates, factor)
    return scaled


def _goodput_rates(profile: AppProfile, mode: str, batch_size: int) -> GoodputRates:
    """The job's (shared, memoised) rate model: one per application, type and mode, and per
    batch size for fixed jobs."""
    key = ("goodput", mode, batch_size if mode == "fixed" else None)
    rates = profile.derived.get(key)
    if rates is None:
        noise = profile.derived.get("gradient_noise")
        if noise is None:
            noise = profile.derived["gradient_noise"] = GradientNoise.from_profile(profile)
        rates = profile.derived[key] = (
            FixedBatchGoodput(noise, profile, batch_size) if mode == "fixed"
            else AdaptiveBatchGoodput(noise, profile, batch_candidates(
                profile.validated_batch_sizes)))
    return rates


__all__ = [
    "BATCH_CANDIDATES_PER_DOUBLING",
    "EFFICIENCY_MODES",
    "AdaptiveBatchGoodput",
    "FixedBatchGoodput",
    "GoodputRates",
    "GradientNoise",
    "ScaledGoodput",
    "add_efficiency_flag",
    "batch_candidates",
    "goodput_speeds",
]
