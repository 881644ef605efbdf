"""Unions of training clusters: the pooled demand over the minutes they share, and where they
are (not) made."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from test_forecaster_cli import fast_training, one_line_error, write_cycle

import rlalloc.forecaster.train as forecaster_train
from rlalloc.cli.main import main
from rlalloc.forecaster.config import SHIPPED_MODEL_DIR, ForecasterConfig
from rlalloc.forecaster.series import DemandSegment, DemandSeries
from rlalloc.forecaster.unions import training_segments, union_segments


def stamped(demand: np.ndarray, start: str, size_gpus: float) -> DemandSeries:
    """A one-segment series of ``demand`` from ``start``."""
    first = pd.Timestamp(start)
    return DemandSeries(source=start, size_gpus=size_gpus, filled_minutes=0, segments=(
        DemandSegment(demand=demand.astype(np.float32), start=first,
                      start_minute_of_day=first.hour * 60 + first.minute),))


def test_a_union_pools_the_gpus_of_the_minutes_both_clusters_cover():
    rng = np.random.default_rng(0)
    a, b = rng.uniform(0, 1, 100), rng.uniform(0, 1, 100)
    # b starts 30 minutes after a: they share a's minutes 30..99, b's 0..69
    [union] = union_segments([stamped(a, "2020-05-01 23:00", 64.0),
                              stamped(b, "2020-05-01 23:30", 16.0)], min_minutes=10)
    assert union.start == pd.Timestamp("2020-05-01 23:30") and union.start_minute_of_day == 1410
    np.testing.assert_allclose(union.demand, (64 * a[30:] + 16 * b[:70]) / 80, rtol=1e-6)
    assert union.minute_of_day()[30] == 0  # midnight passes inside the union as in a and b


def test_clusters_sharing_fewer_minutes_than_asked_make_no_union():
    a, b = np.full(100, 0.5), np.full(100, 0.25)
    group = [stamped(a, "2020-05-01 00:00", 8.0), stamped(b, "2020-05-01 01:20", 8.0)]
    assert union_segments(group, min_minutes=21) == []
    assert len(union_segments(group, min_minutes=20)[0].demand) == 20


def test_every_run_of_shared_minutes_is_its_own_union():
    # a has a gap (two segments); b covers both: two unions, none across the gap
    first = pd.Timestamp("2020-05-01")
    a = DemandSeries(source="a", filled_minutes=0, size_gpus=10.0, segments=tuple(
        DemandSegment(demand=np.full(50, value, np.float32), start_minute_of_day=0,
                      start=first + pd.Timedelta(minutes=offset))
        for offset, value in ((0, 0.2), (80, 0.4))))
    unions = union_segments([a, stamped(np.full(200, 0.6), "2020-05-01", 30.0)], min_minutes=10)
    assert [len(u.demand) for u in unions] == [50, 50]
    np.testing.assert_allclose([u.demand[0] for u in unions], [0.5, 0.55], rtol=1e-6)


def test_zone_aware_and_naive_times_are_not_lined_up():
    demand = np.full(100, 0.5)
    group = [stamped(demand, "2020-05-01 00:00", 8.0),
             stamped(demand, "2020-05-01 00:00+00:00", 8.0)]
    assert union_segments(group, min_minutes=10) == []


def test_training_segments_are_the_real_ones_then_at_most_max_unions_drawn_by_seed():
    series = [stamped(np.full(3000, 0.01 * 2**i), "2020-05-01", 8.0) for i in range(5)]
    config = replace(ForecasterConfig(), union_sizes=(2,), max_unions=4, seed=0)
    segments = training_segments(series, config)
    assert segments[:5] == [one.segments[0] for one in series]
    pooled = [round(float(s.demand[0]), 6) for s in segments[5:]]
    assert len(pooled) == 4 and len(set(pooled)) == 4
    assert pooled == [round(float(s.demand[0]), 6) for s in training_segments(series, config)[5:]]
    other = training_segments(series, replace(config, seed=3))[5:]
    assert pooled != [round(float(s.demand[0]), 6) for s in other]
    assert len(training_segments(series, replace(config, max_unions=32))) == 5 + 10
    assert len(training_segments(series, replace(config, union_sizes=()))) == 5


def test_a_config_with_unions_survives_its_json_and_one_saved_before_them_reads_without():
    config = replace(ForecasterConfig(), union_sizes=(2,), max_unions=8)
    assert ForecasterConfig.from_json(json.loads(json.dumps(config.to_json()))) == config
    saved = ForecasterConfig().to_json()
    del saved["union_sizes"], saved["max_unions"]
    assert ForecasterConfig.from_json(saved).union_sizes == ()


@pytest.mark.parametrize(("flags", "trained", "unions"), [
    (["--val-series", "VAL", "--unions"], 3, 1),
    (["--val-series", "VAL"], 2, 0),
    ([], 2, 0),
])
def test_forecast_train_trains_on_the_unions_and_records_them(
        tmp_path, monkeypatch, flags, trained, unions):
    fast_training(monkeypatch, SHIPPED_MODEL_DIR)  # the fits are stand-ins, the files real
    seen = []
    stand_in = forecaster_train.train_forecaster
    monkeypatch.setattr(forecaster_train, "train_forecaster",
                        lambda segments, *a, **k: seen.append(segments) or stand_in(segments))
    first, second = (write_cycle(tmp_path / f"{name}.csv", days=3, seed=i)
                     for i, name in enumerate(("a", "b")))
    validation = str(write_cycle(tmp_path / "val.csv", days=3, seed=5))
    out = tmp_path / "model"
    assert main(["forecast", "train", "--series", str(first), str(second), "--out", str(out),
                 "--no-progress", *[validation if f == "VAL" else f for f in flags]]) == 0
    card = json.loads((out / "card.json").read_text())
    assert len(seen[0]) == trained and card["union_segments"] == unions
    assert tuple(card["config"]["union_sizes"]) == ((2,) if unions else ())


def test_unions_without_validation_clusters_are_refused_before_anything_is_written(
        tmp_path, capsys):
    series = write_cycle(tmp_path / "a.csv", days=3, seed=0)
    out = tmp_path / "model"
    assert main(["forecast", "train", "--series", str(series), "--out", str(out),
                 "--unions"]) == 2
    one_line_error(capsys, "--unions needs --val-series", "drop --unions")
    assert not out.exists()


def test_unchanged_share_counts_the_changes_of_exactly_zero_within_segments():
    first = pd.Timestamp("2020-05-01")
    steps = DemandSeries(source="s", filled_minutes=0, segments=(
        DemandSegment(demand=np.repeat([0.1, 0.2], 50).astype(np.float32), start=first,
                      start_minute_of_day=0),                 # 10-min changes: 40 + 40 same
        DemandSegment(demand=np.full(5, 0.3, np.float32), start_minute_of_day=0),  # too short
    ))
    assert steps.unchanged_share(10) == pytest.approx(80 / 90)
    assert steps.unchanged_share(1) == pytest.approx(102 / 103)  # 98 of 99, then 4 of 4
    assert steps.unchanged_share(200) is None
