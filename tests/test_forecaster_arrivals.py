"""The arrivals model: its count follows the history's time of day and, where the history has
it, the recent past; its draws fall in the next horizon and are jobs of the history; it
round-trips through JSON and refuses a history it cannot be fitted on in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlalloc.env.errors import UserError
from rlalloc.env.workload.spec import JobSpec
from rlalloc.forecaster.arrivals import DAY_S, HOUR_S, ArrivalsModel, fit_arrivals

QUIET, BUSY = 4.0, 20.0
RATE = np.where((np.arange(24) >= 8) & (np.arange(24) < 18), BUSY, QUIET)
"""Arrivals per hour of the day of the synthetic history: busy office hours."""


def _days(levels: list[float], seed: int = 0) -> list[list[JobSpec]]:
    """One workload per day: Poisson arrivals at `RATE` times the day's level, the busy hours'
    jobs asking for 8 GPUs and the quiet hours' for 1."""
    rng = np.random.default_rng(seed)
    days = []
    for day, level in enumerate(levels):
        jobs = []
        for hour, rate in enumerate(RATE):
            for t in np.sort(rng.uniform(hour * HOUR_S, (hour + 1) * HOUR_S,
                                         rng.poisson(rate * level))):
                gpus = 8 if rate == BUSY else 1
                jobs.append(JobSpec(f"d{day}-{len(jobs)}", float(t), gpus, 1000.0, 1, gpus, 60.0))
        days.append(jobs)
    return days


@pytest.fixture(scope="module")
def steady() -> ArrivalsModel:
    return fit_arrivals(_days([1.0] * 30), HOUR_S)


def test_the_expected_count_follows_the_hour_of_day(steady):
    for hour, rate in enumerate(RATE):
        usual = RATE[hour - 1]  # the last hour as the history usually has it
        assert steady.mean_count(hour * HOUR_S, int(usual)) == pytest.approx(rate, rel=0.2)
    assert steady.mean_count(7.5 * HOUR_S, int(QUIET)) == pytest.approx((QUIET + BUSY) / 2,
                                                                          rel=0.2)
    assert abs(steady.recent_weight) < 0.2  # Poisson days carry no memory
    jobs, gpus = steady.expected(10 * HOUR_S, int(BUSY))
    assert gpus == pytest.approx(8 * jobs)


def test_a_level_that_persists_through_the_day_is_read_off_the_last_hour():
    levels = [0.5, 1.0, 2.0] * 10  # quiet, usual and busy days: the last hour tells which
    model = fit_arrivals(_days(levels), HOUR_S)
    assert model.recent_weight > 0.5
    assert model.mean_count(12 * HOUR_S, int(2 * BUSY)) > 1.5 * model.mean_count(
        12 * HOUR_S, int(0.5 * BUSY))


def test_draws_fall_in_the_next_horizon_and_are_jobs_of_the_hour_they_fall_in(steady):
    rng = np.random.default_rng(1)
    for now in (7.5 * HOUR_S, 23.5 * HOUR_S, 12 * HOUR_S):  # across a change, across midnight
        counts = []
        for _ in range(200):
            drawn = steady.draw(now, int(QUIET), rng)
            counts.append(len(drawn))
            offsets = [offset for offset, _ in drawn]
            assert offsets == sorted(offsets) and all(0 < o <= HOUR_S for o in offsets)
            for offset, row in drawn:
                assert (steady.job_time_of_day_s[row] // HOUR_S
                        == (now + offset) % DAY_S // HOUR_S)
        assert np.mean(counts) == pytest.approx(steady.mean_count(now, int(QUIET)), rel=0.15)


def test_the_model_round_trips_through_json(steady):
    again = ArrivalsModel.from_json(json.loads(json.dumps(steady.to_json())))
    assert again == steady
    assert again.draw(9 * HOUR_S, 15, np.random.default_rng(4)) == steady.draw(
        9 * HOUR_S, 15, np.random.default_rng(4))
    damaged = {**steady.to_json(), "hourly_rate": [1.0] * 23}
    with pytest.raises(ValueError):
        ArrivalsModel.from_json(damaged)


def test_hours_without_history_expect_nothing():
    night_off = [[job for job in day if job.submit_s < 20 * HOUR_S] for day in _days([1.0] * 5)]
    model = fit_arrivals(night_off, HOUR_S)
    assert model.mean_count(21 * HOUR_S, 10) == 0.0
    assert model.draw(21 * HOUR_S, 10, np.random.default_rng(0)) == []


@pytest.mark.parametrize("history, named", [
    ([[], []], "0 past days"),
    ([[JobSpec("a", 10.0, 1, 1.0, 1, 1, 0.0)]], "1 past day of"),
])
def test_a_history_it_cannot_be_fitted_on_is_refused_in_one_line(history, named):
    with pytest.raises(UserError, match=named) as err:
        fit_arrivals(history, HOUR_S)
    assert "\n" not in str(err.value)
