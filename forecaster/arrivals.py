"""A model of the next hour's arrivals, conditioned on the last hour's and the time of day.

The planner (`rlalloc.agent.planner`) weighs its proposals in forks told of sampled future
arrivals. Drawn from past days at the same hour, a future knows the time of day and nothing of
the present: on a day busier than the history's every draw is too quiet. This model draws them
instead from

- **how many:** a negative-binomial count over the horizon whose mean is the history's
  arrival rate at those hours of the day (`hourly_rate`, arrivals per hour of the day averaged
  over the past days) scaled by ``exp(intercept + recent_weight * x)``, where ``x`` is the log of
  the last hour's arrivals against what the rate expects of that hour (both plus one). Taking
  the ratio, not the count, keeps the time of day from being counted twice: an hour that is
  always busy says nothing new about the next. ``recent_weight`` is 0 for arrivals that carry
  no memory and 1 for a level that persists from hour to hour; `fit_arrivals` finds it, the
  intercept and the dispersion by maximum likelihood over windows of the history;
- **when:** each arrival in an hour of the horizon in proportion to that hour's rate, uniformly
  within it;
- **which job:** one of the history's jobs that arrived in the same hour of the day, drawn
  uniformly (their GPUs, sizes and applications), so the mix of jobs follows the time of day
  too. An arrival is a row of the history the model was fitted on (`job_time_of_day_s`), and
  the caller holds the jobs themselves.

Hours of the day in which the history saw no arrival have rate 0 (as a past day drawn then is
empty), so a cluster's history should span whole days. Time is read as in `HistoryArrivals`
(`rlalloc.agent.lookahead`): a workload starts at midnight, and one longer than a day gives a
past day per day. Saved as plain JSON (`to_json`); only numpy is needed to draw from it, scipy
to fit it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import cached_property

import numpy as np

from rlalloc.env.errors import UserError
from rlalloc.env.workload.spec import JobSpec

HOUR_S = 3600.0
DAY_S = 86_400.0
HOURS = 24
RECENT_S = 3600.0
"""The recent past the count is conditioned on: `Demand.arrivals_1h`, the state's last hour."""
FIT_STEP_S = 600.0
"""Spacing of the windows `fit_arrivals` fits on (the planner decides at any instant)."""
_LOG_DISPERSION_BOUNDS = (-12.0, 3.0)


@dataclass(frozen=True)
class ArrivalsModel:
    """The fitted model (see the module docstring); `draw` samples it."""

    horizon_s: float
    """How far ahead one draw reaches."""
    hourly_rate: tuple[float, ...]
    """Mean arrivals in each hour of the day (24) over the history's past days."""
    intercept: float
    recent_weight: float
    """Log-mean of the count: log(rate over the horizon) + intercept + recent_weight * x."""
    dispersion: float
    """Negative-binomial alpha: variance = mean + alpha * mean**2 (0 is Poisson)."""
    job_time_of_day_s: tuple[float, ...]
    """Time of day of each history job, in the order fitted: a drawn arrival's job is an index
    into this."""
    job_gpus: tuple[int, ...]
    """GPUs each history job requested (for `expected`)."""
    days: int
    """Past days fitted on."""

    def to_json(self) -> dict:
        """The model as a JSON object (`from_json` reads it back)."""
        return asdict(self)

    @staticmethod
    def from_json(raw: dict) -> ArrivalsModel:
        """The model `to_json` wrote; KeyError, TypeError or ValueError when it is damaged."""
        model = ArrivalsModel(
            horizon_s=float(raw["horizon_s"]),
            hourly_rate=tuple(float(r) for r in raw["hourly_rate"]),
            intercept=float(raw["intercept"]), recent_weight=float(raw["recent_weight"]),
            dispersion=float(raw["dispersion"]),
            job_time_of_day_s=tuple(float(t) for t in raw["job_time_of_day_s"]),
            job_gpus=tuple(int(g) for g in raw["job_gpus"]), days=int(raw["days"]))
        if (len(model.hourly_rate) != HOURS or len(model.job_gpus) != len(model.job_time_of_day_s)
                or model.horizon_s <= 0 or model.dispersion < 0
                or any(rate > 0 and model._jobs_by_hour[hour].size == 0
                       for hour, rate in enumerate(model.hourly_rate))):
            raise ValueError("inconsistent arrivals model")
        return model

    @cached_property
    def _jobs_by_hour(self) -> list[np.ndarray]:
        """The history jobs' indices by the hour of the day they arrived in."""
        hours = (np.asarray(self.job_time_of_day_s, dtype=float) // HOUR_S).astype(int) % HOURS
        return [np.flatnonzero(hours == hour) for hour in range(HOURS)]

    def mean_count(self, time_of_day_s: float, recent_arrivals: int) -> float:
        """Expected arrivals in the horizon after `time_of_day_s`, given `recent_arrivals` in
        the hour before it."""
        return _profile_mean(np.asarray(self.hourly_rate), time_of_day_s, self.horizon_s) * \
            self._scale(time_of_day_s, recent_arrivals)

    def expected(self, time_of_day_s: float, recent_arrivals: int) -> tuple[float, float]:
        """Expected jobs and GPUs arriving in the horizon after `time_of_day_s`, given
        `recent_arrivals` in the hour before it."""
        scale = self._scale(time_of_day_s, recent_arrivals)
        gpus = np.asarray(self.job_gpus, dtype=float)
        jobs = total_gpus = 0.0
        for hour, _, hours in _hour_overlaps(time_of_day_s, self.horizon_s):
            count = self.hourly_rate[hour] * hours * scale
            jobs += count
            total_gpus += count * float(gpus[self._jobs_by_hour[hour]].mean()) if count else 0.0
        return jobs, total_gpus

    def draw(self, time_of_day_s: float, recent_arrivals: int,
             rng: np.random.Generator) -> list[tuple[float, int]]:
        """One sampled future: (seconds after `time_of_day_s`, index of the history job) per
        arrival in the horizon, in time order."""
        mean = self.mean_count(time_of_day_s, recent_arrivals)
        if mean <= 0:
            return []
        if self.dispersion > 0:
            mean = rng.gamma(1.0 / self.dispersion, self.dispersion * mean)
        count = int(rng.poisson(mean))
        segments = _hour_overlaps(time_of_day_s, self.horizon_s)
        weights = np.array([self.hourly_rate[hour] * hours for hour, _, hours in segments])
        arrivals = []
        for pick in rng.choice(len(segments), size=count, p=weights / weights.sum()):
            hour, start, hours = segments[pick]
            offset = start + hours * HOUR_S - rng.uniform(0.0, hours * HOUR_S)  # after now
            arrivals.append((float(offset), int(rng.choice(self._jobs_by_hour[hour]))))
        return sorted(arrivals)

    def _scale(self, time_of_day_s: float, recent_arrivals: int) -> float:
        """What the last hour's `recent_arrivals` multiply the rate's expected count by."""
        usual = _profile_mean(np.asarray(self.hourly_rate), time_of_day_s - RECENT_S, RECENT_S)
        return math.exp(self.intercept + self.recent_weight * _recent_x(recent_arrivals, usual))


def fit_arrivals(history: Sequence[Sequence[JobSpec]], horizon_s: float) -> ArrivalsModel:
    """The arrivals model of the past workloads `history` (each a submit-ordered job list whose
    time 0 is midnight) for draws `horizon_s` ahead. The hourly rate is their mean per past day;
    the intercept, recent weight and dispersion maximise the likelihood of the counts in
    windows every `FIT_STEP_S` of each past day, each window's rate taken from the other days
    (the day's own arrivals would explain its count twice). A `UserError` for a history with
    no arrivals or of a single day."""
    from scipy.optimize import minimize

    jobs = [job for workload in history for job in workload]
    days = sorted({(index, int(job.submit_s // DAY_S))
                   for index, workload in enumerate(history) for job in workload})
    if len(days) < 2:
        raise UserError(f"the history holds {len(days)} past day{'' if len(days) == 1 else 's'} "
                        "of arrivals; the arrivals model needs two or more to fit how the next "
                        "hour follows the last")
    day_of = {day: row for row, day in enumerate(days)}
    counts = np.zeros((len(days), HOURS))
    times: list[list[float]] = [[] for _ in days]
    for index, workload in enumerate(history):
        for job in workload:
            row = day_of[(index, int(job.submit_s // DAY_S))]
            counts[row, int(job.submit_s % DAY_S // HOUR_S)] += 1
            times[row].append(job.submit_s % DAY_S)
    windows = _windows(counts, [np.sort(t) for t in times], horizon_s)
    if not len(windows[0]):
        raise UserError("no window of the history has arrivals to fit the arrivals model on")

    def negative_log_likelihood(params: np.ndarray) -> float:
        return -_log_likelihood(*windows, *params)

    fitted = minimize(negative_log_likelihood, np.array([0.0, 0.0, -2.0]), method="L-BFGS-B",
                      bounds=[(-5.0, 5.0), (-5.0, 5.0), _LOG_DISPERSION_BOUNDS])
    intercept, recent_weight, log_dispersion = (float(p) for p in fitted.x)
    dispersion = 0.0 if log_dispersion <= _LOG_DISPERSION_BOUNDS[0] else math.exp(log_dispersion)
    return ArrivalsModel(horizon_s, tuple(float(r) for r in counts.mean(axis=0)), intercept,
                         recent_weight, dispersion,
                         tuple(float(job.submit_s % DAY_S) for job in jobs),
                         tuple(int(job.requested_gpus) for job in jobs), len(days))


def _windows(counts: np.ndarray, times: list[np.ndarray],
             horizon_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per window of each past day with arrivals expected: its count, its rate over the
    horizon from the other days, and the log ratio of the last hour's count to that rate's."""
    observed, means, recent = [], [], []
    total = counts.sum(axis=0)
    for day, day_times in enumerate(times):
        others = (total - counts[day]) / (len(times) - 1)
        for start in np.arange(0.0, DAY_S, FIT_STEP_S):
            mean = _profile_mean(others, start, horizon_s)
            if mean <= 0:
                continue
            observed.append(_count_in(day_times, start, horizon_s))
            means.append(mean)
            recent.append(_recent_x(_count_in(day_times, start - RECENT_S, RECENT_S),
                                    _profile_mean(others, start - RECENT_S, RECENT_S)))
    return np.asarray(observed, float), np.asarray(means), np.asarray(recent)


def _recent_x(recent_arrivals: int, usual: float) -> float:
    """The last hour's arrivals against the `usual` count the rate expects of it, as a log
    ratio (both plus one: an hour without arrivals is a finite surprise)."""
    return math.log((recent_arrivals + 1.0) / (usual + 1.0))


def _log_likelihood(observed: np.ndarray, means: np.ndarray, recent: np.ndarray,
                    intercept: float, recent_weight: float, log_dispersion: float) -> float:
    """Negative-binomial (NB2) log-likelihood of the window counts."""
    from scipy.special import gammaln

    mu = means * np.exp(intercept + recent_weight * recent)
    alpha = math.exp(log_dispersion)
    size = 1.0 / alpha
    return float(np.sum(gammaln(observed + size) - gammaln(size) - gammaln(observed + 1)
                        + size * np.log(size / (size + mu)) + observed * np.log(mu / (size + mu))))


def _hour_overlaps(time_of_day_s: float, length_s: float) -> list[tuple[int, float, float]]:
    """(hour of the day, seconds from `time_of_day_s` to where the span enters it, hours of it
    covered) for each hour the span from `time_of_day_s` covers, continuing past midnight at
    0:00."""
    overlaps = []
    start = time_of_day_s % DAY_S
    offset = 0.0
    while length_s - offset > 1e-9:
        hour = int(start // HOUR_S) % HOURS
        covered = min(length_s - offset, (hour + 1) * HOUR_S - start)
        overlaps.append((hour, offset, covered / HOUR_S))
        offset += covered
        start = (start + covered) % DAY_S
    return overlaps


def _profile_mean(rate: np.ndarray, time_of_day_s: float, length_s: float) -> float:
    """Arrivals `rate` (per hour of the day) expects in the span from `time_of_day_s`."""
    return float(sum(rate[hour] * hours for hour, _, hours in _hour_overlaps(time_of_day_s,
                                                                              length_s)))


def _count_in(sorted_times: np.ndarray, start_s: float, length_s: float) -> int:
    """Arrivals among `sorted_times` (times of one day) in the span from `start_s`, wrapping at
    midnight to the same day's start."""
    count = 0
    start = start_s % DAY_S
    left = length_s
    while left > 1e-9:
        end = min(DAY_S, start + left)
        count += int(np.searchsorted(sorted_times, end, "left")
                     - np.searchsorted(sorted_times, start, "left"))
        left -= end - start
        start = 0.0
    return count
