"""The forecaster's baselines forecast from the past alone: a forecast from an origin must not
change when everything after the origin is cut off."""

from __future__ import annotations

import numpy as np
import pytest

from rlalloc.forecaster.baselines import (
    HOLT_WINTERS_MIN_HISTORY_MIN,
    HoltWintersParams,
    holt_winters,
    moving_average,
    naive,
    seasonal_naive,
)

HORIZONS = (5, 15, 60)


def _demand(days: int, seed: int = 0) -> np.ndarray:
    """A noisy daily cycle whose later days differ from the first two (a trend and a shift),
    so that initial states taken from more than two days would see the future."""
    minutes = np.arange(days * 1440)
    rng = np.random.default_rng(seed)
    cycle = 0.5 + 0.3 * np.sin(2 * np.pi * minutes / 1440)
    return cycle + 0.2 * (minutes > 3 * 1440) + 1e-5 * minutes + 0.05 * rng.standard_normal(
        len(minutes))


@pytest.mark.parametrize("forecast", [
    naive, seasonal_naive, moving_average,
    lambda demand, origins, horizons: holt_winters(
        demand, origins, horizons, HoltWintersParams(0.5, 0.05, 0.1, 0.95)),
], ids=["naive", "seasonal_naive", "moving_average", "holt_winters"])
def test_a_forecast_uses_nothing_after_its_origin(forecast):
    demand = _demand(days=6)
    origins = np.array([HOLT_WINTERS_MIN_HISTORY_MIN - 1, 2 * 1440 + 500, 4 * 1440 + 10,
                        5 * 1440 + 100])
    whole = forecast(demand, origins, HORIZONS)
    for row, origin in enumerate(origins.tolist()):
        cut = forecast(demand[: origin + 1], np.array([origin]), HORIZONS)[0]
        np.testing.assert_allclose(whole[row], cut, rtol=1e-9, atol=1e-12)
