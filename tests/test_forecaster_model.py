"""The LSTM forecaster on tiny worlds: shapes, quantiles that never cross, a clean daily cycle,
coverage of known noise, save/load, the stand-in."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from rlalloc.forecaster.config import ForecasterConfig
from rlalloc.forecaster.model import LSTMForecaster, load_demand_forecaster
from rlalloc.forecaster.network import DemandLSTM
from rlalloc.forecaster.series import DemandSegment
from rlalloc.forecaster.standin import EWMAForecaster, fit_ewma
from rlalloc.forecaster.train import train_forecaster

torch.set_num_threads(2)

TINY = ForecasterConfig(
    lookback_min=120, block_min=10, hidden_size=16, head_size=32, epochs=4,
    train_stride_min=3, batch_size=64, learning_rate=1e-2,
)


def daily_cycle(days: int, seed: int) -> DemandSegment:
    """Demand 0.5 + 0.3 sin(daily phase) with a little noise: the answer is known."""
    minutes = np.arange(days * 1440)
    noise = np.random.default_rng(seed).normal(0.0, 0.005, len(minutes))
    demand = 0.5 + 0.3 * np.sin(2 * np.pi * minutes / 1440) + noise
    return DemandSegment(demand=demand.astype(np.float32), start_minute_of_day=0)


@pytest.fixture(scope="module")
def trained() -> LSTMForecaster:
    model, report = train_forecaster([daily_cycle(5, seed=0)], TINY, show_progress=False)
    assert report.train_windows > 500
    return model


def test_predict_shape_and_horizons(trained):
    history = daily_cycle(2, seed=1).demand
    forecast = trained.predict(history, last_minute_of_day=(len(history) - 1) % 1440)
    assert forecast.shape == (3, len(trained.quantiles))
    assert trained.horizons_min == (5, 15, 60)
    assert trained.quantiles[trained.median_index] == 0.5
    assert np.isfinite(forecast).all()


def test_predict_needs_time_of_day_and_enough_history(trained):
    history = daily_cycle(2, seed=1).demand
    with pytest.raises(ValueError, match="last_minute_of_day"):
        trained.predict(history)
    with pytest.raises(ValueError, match="needs at least"):
        trained.predict(history[:100], last_minute_of_day=0)


def test_clean_daily_cycle_is_learned_better_than_naive(trained):
    held_out = daily_cycle(3, seed=7)
    demand = held_out.demand.astype(np.float64)
    origins = np.arange(TINY.min_history_min, len(demand) - 60, 7)
    forecast = trained.predict_many(demand, held_out.minute_of_day(), origins)[
        ..., trained.median_index]
    actual = np.stack([demand[origins + h] for h in TINY.horizons_min], axis=1)
    lstm_mae = np.abs(forecast - actual).mean(axis=0)
    naive_mae = np.abs(demand[origins, None] - actual).mean(axis=0)
    assert lstm_mae[2] < 0.5 * naive_mae[2], (lstm_mae, naive_mae)
    assert lstm_mae[1] < naive_mae[1], (lstm_mae, naive_mae)


def test_single_and_batched_predictions_agree(trained):
    held_out = daily_cycle(2, seed=3)
    demand = held_out.demand.astype(np.float64)
    last = len(demand) - 1
    batched = trained.predict_many(demand, held_out.minute_of_day(), np.array([last]))[0]
    single = trained.predict(demand, last_minute_of_day=last % 1440)
    np.testing.assert_allclose(single, batched, rtol=1e-6)


def test_save_load_round_trip_gives_identical_predictions(trained, tmp_path):
    trained.save(tmp_path)
    loaded = load_demand_forecaster(tmp_path)
    history = daily_cycle(2, seed=4).demand
    before = trained.predict(history, last_minute_of_day=123)
    after = loaded.predict(history, last_minute_of_day=123)
    np.testing.assert_array_equal(before, after)
    assert loaded.config == trained.config
    assert loaded.stats == trained.stats


def test_ewma_standin_round_trip_and_constant_series(tmp_path):
    standin = fit_ewma([daily_cycle(2, seed=5).demand])
    standin.save(tmp_path / "standin.json")
    loaded = EWMAForecaster.load(tmp_path / "standin.json")
    np.testing.assert_allclose(loaded.predict(np.full(200, 0.4)), [0.4, 0.4, 0.4])
    assert loaded.half_lives_min == standin.half_lives_min
    assert loaded.horizons_min == standin.horizons_min == (5, 15, 60)


def test_ewma_standin_weighs_each_minute_by_its_half_life():
    """With a half-life of one minute, a demand of 1 in the last minute only (0 before) is
    forecast as its weight 1 / sum_a 2^-a = 1/2 (the sum over 128 minutes is 2 to 1e-38);
    with two minutes, 1 / sum_a 2^(-a/2) = 1 - 2^(-1/2). A 1 a minute earlier weighs half
    as much (or 2^(-1/2) as much); batched forecasts are the same numbers."""
    standin = EWMAForecaster((1.0, 2.0, 2.0), (5, 15, 60))
    last = np.zeros(300)
    last[-1] = 1.0
    np.testing.assert_allclose(standin.predict(last), [0.5, 1 - 2 ** -0.5, 1 - 2 ** -0.5])
    earlier = np.roll(last, -1)
    np.testing.assert_allclose(standin.predict(earlier),
                               [0.25, (1 - 2 ** -0.5) * 2 ** -0.5, (1 - 2 ** -0.5) * 2 ** -0.5])
    series = daily_cycle(1, seed=6).demand.astype(np.float64)
    origins = np.array([200, 777, len(series) - 1])
    np.testing.assert_allclose(standin.predict_many(series, origins),
                               [standin.predict(series[:o + 1]) for o in origins], rtol=1e-12)


def test_training_on_a_series_whose_validation_tail_never_moves():
    # the cluster stays full for the last hours: every validation change is zero, and the
    # epochs must still be compared and the quantiles calibrated to finite numbers
    segment = daily_cycle(3, seed=2)
    demand = segment.demand.copy()
    demand[-520:] = 1.0
    flat_tail = replace(segment, demand=demand)
    model, report = train_forecaster([flat_tail], replace(TINY, epochs=2), show_progress=False)
    assert report.validation_windows > 0 and report.best_epoch in (1, 2)
    assert all(np.isfinite(report.validation_pinball_per_epoch))
    assert np.isfinite(model.calibration).all()
    forecast = model.predict(demand, last_minute_of_day=(len(demand) - 1) % 1440)
    assert np.isfinite(forecast).all()


def test_quantiles_never_cross_on_random_inputs(trained):
    """Whatever the weights and inputs, a higher level's quantile is never below a lower's:
    the network's median-plus-softplus-steps output, and the calibrated forecast."""
    rng = np.random.default_rng(0)
    network = DemandLSTM(TINY, trained.n_seq_features, trained.n_scalar_features)
    for parameter in network.parameters():
        torch.nn.init.normal_(parameter, std=3.0)
    with torch.inference_mode():
        raw = network(torch.randn(256, 12, trained.n_seq_features) * 5,
                      torch.randn(256, trained.n_scalar_features) * 5).numpy()
    assert raw.shape == (256, 3, len(TINY.quantiles))
    assert (np.diff(raw, axis=-1) >= 0).all()
    shifted = LSTMForecaster(trained.config, trained.stats, network, trained.n_seq_features,
                             trained.n_scalar_features,
                             calibration=rng.normal(0, 2, (3, len(TINY.quantiles))))
    for _ in range(5):
        history = rng.uniform(0, 1.5, TINY.min_history_min + 50)
        forecast = shifted.predict(history, last_minute_of_day=int(rng.integers(1440)))
        assert (np.diff(forecast, axis=-1) >= 0).all(), forecast


def test_quantiles_cover_a_random_walk_with_known_noise():
    """Demand a random walk with Gaussian steps (sd 0.01 a minute, centred on 1 so that every
    walk's level lies in the range trained on): after training and calibrating on other walks,
    the 0.9-quantile covers about 90 % of held-out outcomes at every horizon, and its distance
    from the median grows with the horizon as the walk's 1.28 * 0.01 * sqrt(h)."""
    def walk(seed: int, days: int) -> DemandSegment:
        steps = np.random.default_rng(seed).normal(0.0, 0.01, days * 1440)
        path = np.cumsum(steps)
        return DemandSegment(demand=(1.0 + path - path.mean()).astype(np.float32),
                             start_minute_of_day=0)

    config = replace(TINY, epochs=2, min_scale=0.001)
    model, _ = train_forecaster([walk(seed, 3) for seed in range(3)], config,
                                show_progress=False, validation=[walk(4, 3)])
    held_out = walk(5, 3).demand.astype(np.float64)
    origins = np.arange(config.min_history_min, len(held_out) - 60, 5)
    forecast = model.predict_many(held_out, np.zeros(len(held_out), dtype=int), origins)
    actual = np.stack([held_out[origins + h] for h in config.horizons_min], axis=1)
    q90 = forecast[..., config.quantiles.index(0.9)]
    coverage = (actual <= q90).mean(axis=0)
    assert np.all(np.abs(coverage - 0.9) < 0.05), coverage
    spread = (q90 - forecast[..., model.median_index]).mean(axis=0)
    expected = 1.2816 * 0.01 * np.sqrt(config.horizons_min)
    np.testing.assert_allclose(spread, expected, rtol=0.35)


def test_lstm_signals_forecast_the_shipped_models_median():
    from rlalloc.forecaster.signals import load_signals

    signals = load_signals("lstm")
    lstm = load_demand_forecaster()
    history = daily_cycle(2, seed=8).demand.astype(np.float64)
    quantiles = lstm.predict(history, 600)
    np.testing.assert_allclose(signals.demand_forecast(history, 600),
                               np.clip(quantiles[:, lstm.median_index], 0.0, None))
