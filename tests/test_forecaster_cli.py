"""The real `rlalloc forecast` / `rlalloc bench forecast` commands on tiny synthetic series."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from env.cli import main


def write_cycle(path, days, seed):
    """A Helios-layout CSV with a daily cycle in running GPUs and a little queue noise."""
    minutes = np.arange(days * 1440)
    rng = np.random.default_rng(seed)
    cycle = 40 + 20 * np.sin(2 * np.pi * minutes / 1440)
    running = np.round(cycle + rng.normal(0, 1, len(minutes)))
    pd.DataFrame({
        "time": (pd.Timestamp("2020-05-01") + pd.to_timedelta(minutes, unit="min")).astype(str),
        "running_gpu_num": running.astype(int),
        "pending_gpu_num": rng.integers(0, 3, len(minutes)),
        "total_gpu_num": 64,
    }).to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("forecast")
    train = write_cycle(root / "train.csv", days=4, seed=0)
    out = root / "model"
    code = main(["forecast", "train", "--series", str(train), "--out", str(out),
                 "--epochs", "1", "--no-progress"])
    assert code == 0
    return out


def test_train_writes_plain_artifacts(trained_dir):
    names = {p.name for p in trained_dir.iterdir()}
    assert {"weights.pt", "config.json", "baselines.json", "standin.json", "card.json"} <= names
    card = json.loads((trained_dir / "card.json").read_text())
    assert card["training"]["train_windows"] > 0


def test_evaluate_writes_forecast_json_and_plot(trained_dir, tmp_path):
    held_out = write_cycle(tmp_path / "test.csv", days=3, seed=1)
    out = tmp_path / "eval"
    assert main(["forecast", "evaluate", "--series", str(held_out), "--model", str(trained_dir),
                 "--out", str(out), "--origin-stride", "15"]) == 0
    result = json.loads((out / "forecast.json").read_text())
    assert result["horizons_min"] == [5, 15, 60]
    assert {"lstm", "naive", "seasonal_naive", "moving_average", "holt_winters"} <= set(
        result["models"])
    for scores in result["models"].values():
        assert len(scores["mae"]) == 3 and len(scores["mape"]) == 3
        assert np.isfinite(scores["mae"]).all()
    assert (out / "forecast_day.png").stat().st_size > 1000


def test_bad_series_is_one_line_user_error(trained_dir, tmp_path, capsys):
    short = write_cycle(tmp_path / "short.csv", days=1, seed=2)
    code = main(["forecast", "evaluate", "--series", str(short), "--model", str(trained_dir),
                 "--out", str(tmp_path / "e")])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "short.csv" in err and "needs at least" in err
