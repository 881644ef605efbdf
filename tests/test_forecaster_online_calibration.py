"""Online calibration: coverage held to the level on a series whose noise changes, from
outcomes only once they are known."""

from __future__ import annotations

import numpy as np
import pytest

from rlalloc.forecaster.config import ForecasterConfig
from rlalloc.forecaster.features import local_scale
from rlalloc.forecaster.online_calibration import OnlineCalibrator, calibrate_segment

LEVELS = (0.1, 0.5, 0.9)
HORIZONS = (5,)
Z90 = 1.2815515655446004
"""The standard normal's 0.9-quantile."""
CALM_SD, JUMPY_SD = 0.01, 0.04


def noise_that_quadruples_midway(minutes: int = 16_000) -> np.ndarray:
    """Demand around 0.5 with Gaussian noise whose spread goes from 1 % to 4 % halfway."""
    sd = np.where(np.arange(minutes) < minutes // 2, CALM_SD, JUMPY_SD)
    return 0.5 + np.random.default_rng(7).normal(0.0, 1.0, minutes) * sd


def static_forecasts(demand: np.ndarray, origins: np.ndarray) -> np.ndarray:
    """Quantiles (N, 1, 3) right for the calm first half: 0.5 -+ z * 1 %."""
    band = np.array([0.5 - Z90 * CALM_SD, 0.5, 0.5 + Z90 * CALM_SD])
    return np.broadcast_to(band, (len(origins), 1, 3)).copy()


def calibrated(demand: np.ndarray, origins: np.ndarray, raw: np.ndarray,
               step: float) -> np.ndarray:
    """``raw`` calibrated online through ``demand``, offsets in its local volatility."""
    scales = local_scale(demand, origins, ForecasterConfig())
    return calibrate_segment(OnlineCalibrator(LEVELS, HORIZONS, step), raw, origins, demand,
                             scales)


def test_coverage_converges_to_the_level_when_the_noise_changes_midway():
    demand = noise_that_quadruples_midway()
    origins = np.arange(ForecasterConfig().lookback_min, len(demand) - max(HORIZONS))
    actual = demand[origins + HORIZONS[0]]
    raw = static_forecasts(demand, origins)
    online = calibrated(demand, origins, raw, step=0.05)
    second_half = origins >= len(demand) // 2
    static_cover = np.mean(actual[second_half] <= raw[second_half, 0, 2])
    assert static_cover < 0.7  # the static quantile, right for the calm half, misses
    for level, column in ((0.9, 2), (0.1, 0)):
        cover = actual <= online[:, 0, column]
        assert np.mean(cover) == pytest.approx(level, abs=0.02)
        assert np.mean(cover[second_half]) == pytest.approx(level, abs=0.02)
    # the median, the point forecast, is left as it was
    np.testing.assert_array_equal(online[:, 0, 1], raw[:, 0, 1])
    assert (np.diff(online, axis=-1) >= 0).all()  # no crossing


def test_a_forecast_never_depends_on_an_outcome_not_yet_known():
    demand = noise_that_quadruples_midway(4_000)
    origins = np.arange(ForecasterConfig().lookback_min, len(demand) - max(HORIZONS), 3)
    raw = static_forecasts(demand, origins)
    cut = int(origins[len(origins) // 2])
    other_future = demand.copy()
    other_future[cut + 1:] += 0.3  # every outcome after the cut changes: all would be misses
    same, changed = (calibrated(d, origins, raw, step=0.05) for d in (demand, other_future))
    known = origins <= cut
    # up to the cut, the forecasts issued are the same whatever came after it ...
    np.testing.assert_array_equal(same[known], changed[known])
    # ... and the first forecast whose horizon reaches past the cut sees the change
    assert not np.array_equal(same[~known], changed[~known])


def test_an_outcome_updates_the_offsets_only_once_its_horizon_has_passed():
    calibrator = OnlineCalibrator(LEVELS, HORIZONS, step_size=0.1)
    calibrator.observe(0, 0.5)
    calibrator.calibrate(0, np.array([[0.4, 0.5, 0.6]]), scale=0.02)
    for minute in range(1, 5):  # outcomes before the target minute 0 + 5
        calibrator.observe(minute, 5.0)
    assert (calibrator.offsets == 0.0).all()
    calibrator.observe(5, 5.0)  # the target: above every level, a miss of each but the median
    np.testing.assert_allclose(calibrator.offsets, [[0.1 * 0.1, 0.0, 0.1 * 0.9]])


def test_feeding_out_of_time_order_is_refused():
    calibrator = OnlineCalibrator(LEVELS, HORIZONS)
    calibrator.observe(10, 0.5)
    with pytest.raises(ValueError, match="time order"):
        calibrator.calibrate(9, np.zeros((1, 3)), scale=0.02)
    with pytest.raises(ValueError, match="observed after"):
        calibrator.observe(10, 0.5)
