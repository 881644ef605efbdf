"""Quantile forecasts on hand cases: the pinball loss, the capacity rule's GPU-hours, the
baselines' intervals on a series whose noise is known, and the scores an evaluation reports."""

from __future__ import annotations

import numpy as np
import pytest

from rlalloc.forecaster import baselines
from rlalloc.forecaster.baselines import HoltWintersParams
from rlalloc.forecaster.capacity import capacity_cost, idle_at_waiting
from rlalloc.forecaster.evaluate import Evaluation
from rlalloc.forecaster.quantile_baselines import (
    fit_residual_quantiles,
    holt_winters_quantiles,
    holt_winters_std,
)
from rlalloc.forecaster.quantiles import QUANTILE_LEVELS, pinball_loss
from rlalloc.forecaster.series import DemandSegment

HORIZONS = (5, 15, 60)
Z90 = 1.2815515655446004
"""The standard normal's 0.9-quantile."""


def test_pinball_loss_by_hand():
    # under the outcome: level * shortfall; over it: (1 - level) * excess
    assert pinball_loss(np.array(1.0), np.array(0.8), 0.9) == pytest.approx(0.9 * 0.2)
    assert pinball_loss(np.array(1.0), np.array(1.3), 0.9) == pytest.approx(0.1 * 0.3)
    assert pinball_loss(np.array(1.0), np.array(1.0), 0.9) == 0.0
    np.testing.assert_allclose(pinball_loss(np.array([0.0, 2.0]), np.array([1.0, 1.0]), 0.5),
                               [0.5, 0.5])  # at the median, half the absolute error


def test_capacity_rule_idle_and_waiting_by_hand():
    # an 8-GPU cluster, origins half an hour apart: holding half of it (4 GPUs) against
    # demand of 2 GPUs leaves 2 idle for 0.5 h; against 6 GPUs, 2 wait for 0.5 h
    cost = capacity_cost(np.array([0.5, 0.5]), np.array([0.25, 0.75]), np.array([8.0, 8.0]),
                         minutes_per_origin=30, level=0.9)
    assert (cost.idle_gpu_hours, cost.waiting_gpu_hours) == (1.0, 1.0)
    # GPUs come whole, the nearest: 0.51 of 8 GPUs is 4.08, so 4 are held (none idle against
    # 4 wanted; rounding up would hold 5), and 0.57 is 4.56, so 5 (one idle)
    cost = capacity_cost(np.array([0.51]), np.array([0.5]), np.array([8.0]), 60, 0.9)
    assert (cost.idle_gpu_hours, cost.waiting_gpu_hours) == (0.0, 0.0)
    cost = capacity_cost(np.array([0.57]), np.array([0.5]), np.array([8.0]), 60, 0.9)
    assert (cost.idle_gpu_hours, cost.waiting_gpu_hours) == (1.0, 0.0)
    # 4 GPUs wanted; held 2, 6, 8: (waiting, idle) = (2, 0), (0, 2), (0, 4)
    curve = [capacity_cost(np.array([held]), np.array([0.5]), np.array([8.0]), 60, level)
             for held, level in ((0.25, 0.5), (0.75, 0.7), (1.0, 0.9))]
    assert idle_at_waiting(curve, 1.0) == pytest.approx(1.0)  # halfway from (2, 0) to (0, 2)
    assert idle_at_waiting(curve, 0.0) == pytest.approx(2.0)  # the cheapest way to no waiting
    assert idle_at_waiting(curve, 3.0) is None  # beyond the curve: not extrapolated


def random_walk(seed: int, days: int, step_sd: float = 0.01) -> DemandSegment:
    """Demand moving by Gaussian steps: its h-minute change is N(0, step_sd^2 h)."""
    steps = np.random.default_rng(seed).normal(0.0, step_sd, days * 1440)
    return DemandSegment(demand=(1.0 + np.cumsum(steps)).astype(np.float64),
                         start_minute_of_day=0)


def test_naive_change_quantiles_cover_a_random_walk_as_its_noise_says():
    fitted = fit_residual_quantiles(baselines.naive, [random_walk(s, 4) for s in range(3)],
                                    QUANTILE_LEVELS, HORIZONS)
    q90 = QUANTILE_LEVELS.index(0.9)
    np.testing.assert_allclose(fitted.overall[:, q90], Z90 * 0.01 * np.sqrt(HORIZONS),
                               rtol=0.1)
    held_out = random_walk(9, 3)
    origins = np.arange(1440, len(held_out.demand) - 60, 5)
    forecast = fitted.apply(baselines.naive(held_out.demand, origins, HORIZONS),
                            held_out.minute_of_day()[origins], hourly=True)
    actual = np.stack([held_out.demand[origins + h] for h in HORIZONS], axis=1)
    coverage = (actual <= forecast[..., q90]).mean(axis=0)
    assert np.all(np.abs(coverage - 0.9) < 0.04), coverage
    assert (np.diff(forecast, axis=-1) >= 0).all()


def test_holt_winters_interval_of_a_random_walk_grows_as_the_square_root_of_the_horizon():
    # alpha 1, no trend: Holt-Winters is the last value, and its h-step error a sum of h steps
    walk = HoltWintersParams(1.0, 0.0, 0.0, 0.98, residual_std=0.01)
    np.testing.assert_allclose(holt_winters_std(walk, HORIZONS),
                               0.01 * np.sqrt(HORIZONS))
    quantiles = holt_winters_quantiles(np.full((1, 3), 0.5), walk, HORIZONS, QUANTILE_LEVELS)
    np.testing.assert_allclose(quantiles[0, :, QUANTILE_LEVELS.index(0.9)] - 0.5,
                               Z90 * 0.01 * np.sqrt(HORIZONS))
    assert (np.diff(quantiles, axis=-1) >= 0).all()


def test_evaluation_scores_pinball_and_coverage_by_hand():
    levels = (0.1, 0.5, 0.9)
    actual = np.array([[1.0], [2.0]])
    bands = np.array([[[0.5, 1.0, 1.5]], [[0.5, 1.0, 1.5]]])  # (N=2, H=1, Q=3)
    evaluation = Evaluation(horizons_min=(60,), actual=actual, forecasts={"m": bands[..., 1]},
                            origin_minutes=np.arange(2), segment_of_origin=np.zeros(2, int),
                            quantiles=levels, quantile_forecasts={"m": bands},
                            size_gpus_of_origin=np.array([4.0, 4.0]), minutes_per_origin=60)
    scores = evaluation.scores()["m"]
    # outcome 1 (q0.1, q0.5, q0.9 losses): 0.1*0.5, 0, 0.1*0.5; outcome 2: 0.1*1.5, 0.5*1.0,
    # 0.9*0.5
    assert scores["pinball"]["0.1"] == pytest.approx([(0.05 + 0.15) / 2])
    assert scores["pinball"]["0.5"] == pytest.approx([0.25])
    assert scores["pinball"]["0.9"] == pytest.approx([(0.05 + 0.45) / 2])
    assert scores["pinball_mean"] == pytest.approx([(0.1 + 0.25 + 0.25) / 3])
    assert scores["coverage_q90"] == [0.5] and scores["coverage_q10_q90"] == [0.5]
    assert scores["mae"] == [0.5]
    # q0.5 holds 4 GPUs against 4 and 8 wanted; q0.9 holds 6: 2 idle, then 2 waiting
    capacity = evaluation.capacity()["m"]
    assert [(c.level, c.idle_gpu_hours, c.waiting_gpu_hours) for c in capacity] == [
        (0.5, 0.0, 4.0), (0.9, 2.0, 2.0)]
