"""The real `rlalloc forecast` / `rlalloc bench forecast` commands on tiny synthetic series, and
the forecast from a series' end that `forecast predict` prints."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import rlalloc.forecaster.train as forecaster_train
from rlalloc.cli import forecast_evaluate as evaluate_cmd
from rlalloc.cli import forecast_train as train_cmd
from rlalloc.cli.forecast_evaluate import format_table
from rlalloc.cli.main import main
from rlalloc.env.errors import UserError
from rlalloc.forecaster.baselines import HoltWintersParams
from rlalloc.forecaster.capacity import gpus_to_keep
from rlalloc.forecaster.evaluate import Evaluation
from rlalloc.forecaster.model import LSTMForecaster
from rlalloc.forecaster.series import load_demand_series
from rlalloc.forecaster.series_end import forecast_series_end
from rlalloc.forecaster.train import TrainingReport


def write_cycle(path, days, seed, every_min=1):
    """A Helios-layout CSV with a daily cycle in running GPUs and a little queue noise, one row
    every ``every_min`` minutes."""
    minutes = np.arange(0, round(days * 1440), every_min)
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
    assert card["unchanged_share_60min"] == [
        load_demand_series(trained_dir.parent / "train.csv").unchanged_share(60)]


def test_evaluate_writes_forecast_json_and_plot(trained_dir, tmp_path, monkeypatch):
    import rlalloc.forecaster.plot as plot

    shown = []
    monkeypatch.setattr(plot.plt, "close", shown.append)
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
    assert "on test.csv" in shown[0].axes[0].get_title()  # the plot names what it evaluated
    # how calm each series is, to compare with the card's (whether --unions would help)
    assert result["unchanged_share_60min"] == [
        load_demand_series(held_out).unchanged_share(60)]


def test_sample_day_plot_names_the_series_and_draws_the_actual_over_the_forecasts(
        monkeypatch):
    import rlalloc.forecaster.plot as plot

    shown = []
    monkeypatch.setattr(plot.plt, "close", shown.append)
    origins = np.arange(0, 3 * 1440, 15)
    actual = np.tile((0.5 + 0.3 * np.sin(origins / 200.0))[:, None], (1, 3))
    evaluation = Evaluation(horizons_min=(5, 15, 60), actual=actual,
                            forecasts={name: actual + 0.05 for name in ("lstm", "naive")},
                            origin_minutes=origins, segment_of_origin=np.zeros_like(origins))
    assert plot.plot_sample_day(evaluation, series="vc.csv").startswith(b"\x89PNG")
    ax = shown[0].axes[0]
    assert "60-minute-ahead" in ax.get_title() and "on vc.csv" in ax.get_title()
    assert "share of cluster GPUs" in ax.get_ylabel()
    zorder = {line.get_label(): line.get_zorder() for line in ax.get_lines()}
    assert zorder["actual"] > zorder["lstm"] > zorder["naive"]
    shown[0].canvas.draw()
    assert ax.get_legend().get_window_extent().x0 >= ax.get_window_extent().x1


def test_bad_series_is_one_line_user_error(trained_dir, tmp_path, capsys):
    short = write_cycle(tmp_path / "short.csv", days=1, seed=2)
    code = main(["forecast", "evaluate", "--series", str(short), "--model", str(trained_dir),
                 "--out", str(tmp_path / "e")])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "short.csv" in err and "needs at least" in err


def snapshot(directory):
    """Every file in ``directory`` (hidden ones too) with its bytes."""
    return {p.name: p.read_bytes() for p in directory.iterdir()}


def one_line_error(capsys, *fragments):
    """The command's stderr is one line holding every fragment."""
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("rlalloc: error:"), err
    for fragment in fragments:
        assert fragment in err, err


def fast_training(monkeypatch, trained_dir):
    """`forecast train` with the fits replaced by instant stand-ins (the files are real)."""
    monkeypatch.setattr(train_cmd, "fit_holt_winters", lambda demand: HoltWintersParams(
        smoothing_level=0.5, smoothing_trend=0.1, smoothing_seasonal=0.1, damping_trend=0.9))
    monkeypatch.setattr(forecaster_train, "train_forecaster", lambda *a, **k: (
        LSTMForecaster.load(trained_dir), TrainingReport(1, 1, (1.0,), 1, 0.0)))


def test_too_short_for_holt_winters_refused_before_training_model_kept(
        trained_dir, tmp_path, capsys):
    short = write_cycle(tmp_path / "s1700.csv", days=1700 / 1440, seed=3)
    out = tmp_path / "model"
    shutil.copytree(trained_dir, out)
    before = snapshot(out)
    assert main(["forecast", "train", "--series", str(short), "--out", str(out), "--force",
                 "--epochs", "1", "--no-progress"]) == 2
    one_line_error(capsys, "s1700.csv", "1700 minutes", "2880")
    assert snapshot(out) == before


def test_train_refuses_an_existing_model_without_force(trained_dir, capsys):
    before = snapshot(trained_dir)
    assert main(["forecast", "train", "--series", str(trained_dir.parent / "train.csv"),
                 "--out", str(trained_dir), "--epochs", "1", "--no-progress"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # refused before a word on its series
    assert captured.err.strip().startswith("rlalloc: error:") and "already holds" in captured.err
    assert snapshot(trained_dir) == before


def test_run_failing_at_its_last_file_leaves_the_old_model_whole(
        trained_dir, tmp_path, monkeypatch):
    out = tmp_path / "model"
    shutil.copytree(trained_dir, out)
    before = snapshot(out)

    def no_card(directory, card):
        raise RuntimeError("disk full")

    # Fast stand-ins for the fits; the new baselines differ from the old, so a mix would show.
    fast_training(monkeypatch, trained_dir)
    monkeypatch.setattr(train_cmd, "write_card", no_card)
    with pytest.raises(RuntimeError, match="disk full"):
        main(["forecast", "train", "--series", str(trained_dir.parent / "train.csv"),
              "--out", str(out), "--force", "--no-progress"])
    assert snapshot(out) == before


def test_train_removes_what_a_killed_run_staged_not_what_a_running_one_stages(
        trained_dir, tmp_path, monkeypatch):
    out = tmp_path / "model"
    shutil.copytree(trained_dir, out)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    host = socket.gethostname()
    killed = out / f".staging-{host}-{int(gone.stdout)}-abc123"  # as SIGKILL leaves it
    running = out / f".staging-{host}-{os.getpid()}-def456"  # a second run, still writing
    older = out / ".staging-xyz789"  # an earlier version's name: whose it is cannot be told
    for staging in (killed, running, older):
        staging.mkdir()
        (staging / "weights.pt").write_bytes(b"half")
    fast_training(monkeypatch, trained_dir)
    assert main(["forecast", "train", "--series", str(trained_dir.parent / "train.csv"),
                 "--out", str(out), "--force", "--no-progress"]) == 0
    hidden = {p.name for p in out.iterdir() if p.name.startswith(".")}
    assert hidden == {running.name, older.name}


def test_train_out_that_is_a_file_is_refused_before_training(trained_dir, tmp_path, capsys):
    out = tmp_path / "a_file"
    out.write_text("keep me")
    assert main(["forecast", "train", "--series", str(trained_dir.parent / "train.csv"),
                 "--out", str(out), "--no-progress"]) == 2
    one_line_error(capsys, "not a directory")
    assert out.read_text() == "keep me"


@pytest.mark.parametrize("argv", [
    ["forecast", "train", "--series", "x.csv", "--epochs", "0"],
    ["forecast", "train", "--series", "x.csv", "--epochs", "-1"],
    ["forecast", "train", "--series", "x.csv", "--seed", "-1"],
    ["forecast", "train", "--model", "risk", "--epochs", "0"],
    ["forecast", "train", "--model", "risk", "--seed", "-1"],
    ["bench", "forecast", "--epochs", "0"],
])
def test_epochs_and_seed_below_minimum_are_one_line_errors(argv, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([*argv, "--out", str(out)]) == 2
    one_line_error(capsys, argv[-2], "must be at least")
    assert not out.exists()


def test_bench_names_missing_series_as_paths_not_a_list(tmp_path, capsys):
    missing = [str(tmp_path / "nosuch.csv"), str(tmp_path / "gone.csv")]
    assert main(["bench", "forecast", "--series", *missing]) == 2
    one_line_error(capsys, f"training series not found: {missing[0]}, {missing[1]};",
                   "--skip-training")


def test_series_with_wrong_columns_says_which_are_expected(tmp_path, capsys):
    series = tmp_path / "wrong.csv"
    series.write_text("ts,foo,bar\n2020-05-01 00:00:00,1,2\n")
    out = tmp_path / "model"
    assert main(["forecast", "train", "--series", str(series), "--out", str(out),
                 "--no-progress"]) == 2
    one_line_error(capsys, "wrong.csv: header ts,foo,bar", "time,active,total",
                   "docs/forecaster.md")
    assert not out.exists()


@pytest.mark.parametrize("flag", ["--series", "--val-series"])
def test_risk_model_refuses_series(tmp_path, capsys, flag):
    assert main(["forecast", "train", "--model", "risk", flag, "x.csv",
                 "--out", str(tmp_path / "r")]) == 2
    one_line_error(capsys, f"{flag}: the risk model", "simulated telemetry")


def test_evaluate_of_a_risk_model_says_what_it_is_not_to_train_over_it(tmp_path, capsys):
    held_out = write_cycle(tmp_path / "test.csv", days=3, seed=1)
    risk = Path(__file__).resolve().parents[1] / "models" / "risk"
    assert main(["forecast", "evaluate", "--series", str(held_out), "--model", str(risk),
                 "--out", str(tmp_path / "eval")]) == 2
    one_line_error(capsys, f"--model {risk}: holds a node-failure risk model", "--model demand")
    assert not (tmp_path / "eval").exists()


def test_the_shipped_model_refuses_its_training_and_validation_series_from_anywhere(
        tmp_path, monkeypatch, capsys):
    # its card names them relative to the checkout (../shared/...): from elsewhere the paths
    # named nothing, and the model was scored on the series it was trained on
    root = Path(__file__).resolve().parents[1]
    card = json.loads((root / "models" / "forecaster" / "card.json").read_text())
    trained, validated = root / card["trained_on"][0], root / card["validated_on"][0]
    if not trained.is_file():
        pytest.skip("the shared Helios series are absent")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    for series, role in ((trained, "trained"), (validated, "validated")):
        copy = tmp_path / "elsewhere" / f"copy_of_{series.name}"
        shutil.copy(series, copy)
        for given in (series, copy):
            assert main(["forecast", "evaluate", "--series", str(given), "--model",
                         str(root / "models" / "forecaster"), "--out", str(tmp_path / "e")]) == 2
            one_line_error(capsys, f"{role} on it")
    assert not (tmp_path / "e").exists()


def test_the_shipped_card_states_its_split_by_vc():
    card = json.loads((Path(__file__).resolve().parents[1] / "models" / "forecaster"
                       / "card.json").read_text())
    train, validation = card["split"]["train"], card["split"]["validation"]
    assert (len(train), len(validation)) == (8, 2) and not set(train) & set(validation)
    assert [Path(p).name for p in card["trained_on"]] == train
    assert [Path(p).name for p in card["validated_on"]] == validation
    assert len(set(card["trained_on_sha256"] + card["validated_on_sha256"])) == 10
    held_out = {f"earth_{vc}_cluster_sequence_vc.csv" for vc in ("vcTJs", "vcJLV", "vchbv")}
    assert not held_out & set(train + validation)


def test_evaluate_refuses_existing_results_without_force(trained_dir, tmp_path, capsys):
    held_out = write_cycle(tmp_path / "test.csv", days=3, seed=1)
    out = tmp_path / "eval"
    out.mkdir()
    (out / "forecast.json").write_text("{}")
    assert main(["forecast", "evaluate", "--series", str(held_out), "--model", str(trained_dir),
                 "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # refused before a word on its series
    assert "\n" not in captured.err.strip() and "forecast.json" in captured.err
    assert "--force" in captured.err
    assert snapshot(out) == {"forecast.json": b"{}"}


def test_evaluate_stopped_before_writing_leaves_no_new_out_dir(trained_dir, tmp_path,
                                                                 monkeypatch):
    held_out = write_cycle(tmp_path / "test.csv", days=3, seed=1)
    out = tmp_path / "new" / "eval"

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate_cmd, "evaluate_series", interrupted)
    assert main(["forecast", "evaluate", "--series", str(held_out), "--model",
                 str(trained_dir), "--out", str(out)]) == 130
    assert not (tmp_path / "new").exists()


def test_evaluate_refuses_the_series_the_model_was_trained_on(trained_dir, tmp_path, capsys):
    linked = tmp_path / "same.csv"  # another name for the training file is still the same file
    linked.symlink_to(trained_dir.parent / "train.csv")
    out = tmp_path / "eval"
    assert main(["forecast", "evaluate", "--series", str(linked), "--model", str(trained_dir),
                 "--out", str(out)]) == 2
    one_line_error(capsys, "same.csv", "trained on it", "not trained or validated on")
    assert not out.exists()


def test_mape_without_large_enough_targets_is_null_and_explained():
    actual = np.array([[0.01, 0.01, 0.01], [0.01, 0.01, 0.5]])
    evaluation = Evaluation(
        horizons_min=(5, 15, 60), actual=actual, forecasts={"naive": actual + 0.01},
        origin_minutes=np.arange(2), segment_of_origin=np.zeros(2, dtype=int),
    )
    scores = evaluation.scores()
    assert scores["naive"]["mape"][:2] == [None, None]
    assert scores["naive"]["mape"][2] == pytest.approx(2.0)
    result = {"horizons_min": [5, 15, 60], "models": scores, "mape_min_demand": 0.05,
              "mape_targets": evaluation.mape_targets()}
    assert result["mape_targets"] == [0, 0, 1]
    json.dumps(result, allow_nan=False)  # strict JSON: null, not NaN
    table = format_table(result)
    assert "| naive | 15 min | 0.0100 | n/a | - |" in table
    assert "| naive | 60 min | 0.0100 | 2.0 % | - |" in table
    assert "MAPE n/a at 5 min, 15 min: no actual demand reached 0.05" in table


DAMAGES = {  # what is written where; None removes the file
    "no weights": ("weights.pt", None),
    "empty weights": ("weights.pt", b""),
    "bad weights": ("weights.pt", b"not a state dict"),
    "bad standin": ("standin.json", "{"),
    "zero half-life": ("standin.json", '{"half_lives_min": [0, 1, 2], '
                                       '"horizons_min": [5, 15, 60]}'),
    "NaN half-life": ("standin.json", '{"half_lives_min": [NaN, 1, 2], '
                                      '"horizons_min": [5, 15, 60]}'),
    "standin horizons": ("standin.json", '{"half_lives_min": [1, 1], "horizons_min": [5, 15]}'),
    "NaN baselines": ("baselines.json", lambda text: re.sub(
        r'"smoothing_level": [^,]+', '"smoothing_level": NaN', text)),
    "NaN quantiles": ("baselines.json", lambda text: re.sub(
        r'("overall": \[\s*\[\s*)[-0-9.e]+', r'\1NaN', text, count=1)),
    "no config key": ("config.json", '{"format_version": 1}'),
    "bad card": ("card.json", "{"),
}
NAMED = {"zero half-life": "half-lives [0.0, 1.0, 2.0]", "NaN baselines": "holt_winters",
         "NaN quantiles": "not all finite",
         "standin horizons": "[5, 15] minutes ahead but config.json [5, 15, 60]"}
"""What the error names for a damage, where more than the file."""


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_evaluate_model_dir_with_missing_or_broken_files_is_one_line_error(
        trained_dir, tmp_path, capsys, damage):
    model = tmp_path / "model"
    shutil.copytree(trained_dir, model)
    name, content = DAMAGES[damage]
    if callable(content):  # an edit of the file as trained
        edited = content((model / name).read_text())
        assert edited != (model / name).read_text()
        (model / name).write_text(edited)
    elif content is None:
        (model / name).unlink()
    elif isinstance(content, bytes):
        (model / name).write_bytes(content)
    else:
        (model / name).write_text(content)
    held_out = write_cycle(tmp_path / "test.csv", days=3, seed=1)
    out = tmp_path / "eval"
    assert main(["forecast", "evaluate", "--series", str(held_out), "--model", str(model),
                 "--out", str(out)]) == 2
    named = "forecasts" if damage == "NaN baselines" else name  # found only by forecasting
    one_line_error(capsys, f"--model {model}", named, NAMED.get(damage, ""), "forecast train")
    assert not out.exists()


def test_evaluate_model_without_the_plotted_horizon_is_one_line_error(
        trained_dir, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(trained_dir, model)
    for name, key in (("config.json", "config"), ("standin.json", None)):
        data = json.loads((model / name).read_text())
        (data[key] if key else data)["horizons_min"] = [5, 15, 30]
        (model / name).write_text(json.dumps(data))
    held_out = write_cycle(tmp_path / "test.csv", days=3, seed=1)
    out = tmp_path / "eval"
    assert main(["forecast", "evaluate", "--series", str(held_out), "--model", str(model),
                 "--out", str(out)]) == 2
    one_line_error(capsys, "config.json forecasts [5, 15, 30]", "without the 60 minutes")
    assert not out.exists()


@pytest.mark.parametrize("second", ["other path", "copy"])
def test_train_refuses_the_same_series_twice_by_content(
        trained_dir, tmp_path, monkeypatch, capsys, second):
    fast_training(monkeypatch, trained_dir)
    train = trained_dir.parent / "train.csv"
    again = trained_dir / ".." / "train.csv"
    if second == "copy":
        again = tmp_path / "copy.csv"
        shutil.copy(train, again)
    out = tmp_path / "model"
    assert main(["forecast", "train", "--series", str(train), str(again), "--out", str(out),
                 "--no-progress"]) == 2
    one_line_error(capsys, f"--series {again}", f"copy of {train}", "SHA-256", "once")
    assert not out.exists()


def test_train_reports_and_records_the_filled_minutes_of_every_series(
        trained_dir, tmp_path, monkeypatch, capsys):
    fast_training(monkeypatch, trained_dir)
    series = tmp_path / "gappy.csv"
    lines = write_cycle(series, days=4, seed=4).read_text().splitlines(keepends=True)
    series.write_text("".join(lines[:100] + lines[103:]))  # 3 minutes missing
    out = tmp_path / "model"
    assert main(["forecast", "train", "--series", str(series), "--out", str(out),
                 "--no-progress"]) == 0
    assert f"{series}: 3 of 5760 minutes forward-filled (0.1%)\n" in capsys.readouterr().out
    assert json.loads((out / "card.json").read_text())["filled_minutes"] == [3]


@pytest.mark.parametrize("command", ["train", "evaluate"])
def test_series_mostly_forward_filled_is_refused(trained_dir, tmp_path, capsys, command):
    sparse = write_cycle(tmp_path / "five.csv", days=4, seed=5, every_min=5)
    out = tmp_path / "out"
    argv = (["train", "--no-progress"] if command == "train"
            else ["evaluate", "--model", str(trained_dir)])
    assert main(["forecast", *argv, "--series", str(sparse), "--out", str(out)]) == 2
    one_line_error(capsys, "five.csv: 4604 of 5756 minutes (80%) would be forward-filled",
                   "resample the file to 1-minute samples")
    assert not out.exists()


def test_card_names_training_series_absolutely_so_evaluate_refuses_them_anywhere(
        trained_dir, tmp_path, monkeypatch, capsys):
    (tmp_path / "data").mkdir()
    shutil.copy(trained_dir.parent / "train.csv", tmp_path / "data" / "train.csv")
    fast_training(monkeypatch, trained_dir)
    monkeypatch.chdir(tmp_path / "data")
    assert main(["forecast", "train", "--series", "train.csv", "--out", str(tmp_path / "model"),
                 "--no-progress"]) == 0
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    assert main(["forecast", "evaluate", "--series", "data/train.csv", "--model", "model",
                 "--out", "eval"]) == 2
    one_line_error(capsys, "trained on it")


def test_split_is_recorded_and_evaluate_refuses_training_and_validation_series(
        trained_dir, tmp_path, monkeypatch, capsys):
    # a VC the model trained or validated on is no evaluation series, under its own name or
    # as a byte-identical copy under another one
    fast_training(monkeypatch, trained_dir)
    train = trained_dir.parent / "train.csv"
    validation = write_cycle(tmp_path / "val.csv", days=4, seed=7)
    model = tmp_path / "model"
    assert main(["forecast", "train", "--series", str(train), "--val-series", str(validation),
                 "--out", str(model), "--no-progress"]) == 0
    card = json.loads((model / "card.json").read_text())
    assert card["split"] == {"train": ["train.csv"], "validation": ["val.csv"]}
    held_out = write_cycle(tmp_path / "test.csv", days=3, seed=1)
    (tmp_path / "copies").mkdir()
    for series, role in ((train, "trained"), (validation, "validated")):
        copy = tmp_path / "copies" / f"renamed_{series.name}"
        shutil.copy(series, copy)
        for given in (series, copy):
            assert main(["forecast", "evaluate", "--series", str(held_out), str(given),
                         "--model", str(model), "--out", str(tmp_path / "e")]) == 2
            one_line_error(capsys, f"--series {given}", f"was {role} on it")
    assert not (tmp_path / "e").exists()


def test_train_refuses_a_validation_series_that_is_a_training_one(
        trained_dir, tmp_path, monkeypatch, capsys):
    fast_training(monkeypatch, trained_dir)
    train = trained_dir.parent / "train.csv"
    copy = tmp_path / "copy.csv"
    shutil.copy(train, copy)
    assert main(["forecast", "train", "--series", str(train), "--val-series", str(copy),
                 "--out", str(tmp_path / "model"), "--no-progress"]) == 2
    one_line_error(capsys, f"--series {copy}", "SHA-256")
    assert not (tmp_path / "model").exists()


def test_evaluate_writes_quantile_scores_and_the_capacity_curve(trained_dir, tmp_path):
    held_out = write_cycle(tmp_path / "test.csv", days=3, seed=1)
    other = write_cycle(tmp_path / "other.csv", days=3, seed=2)
    out = tmp_path / "eval"
    assert main(["forecast", "evaluate", "--series", str(held_out), str(other), "--model",
                 str(trained_dir), "--out", str(out), "--origin-stride", "15"]) == 0
    result = json.loads((out / "forecast.json").read_text())
    assert result["series"] == [str(held_out), str(other)]
    for name in ("lstm", "naive", "naive_hourly", "seasonal_naive", "holt_winters"):
        scores = result["models"][name]
        assert set(scores["pinball"]) == {"0.1", "0.5", "0.9"}
        assert all(0 <= c <= 1 for c in scores["coverage_q90"] + scores["coverage_q10_q90"])
        curve = result["capacity"]["curves"][name]
        assert [c["level"] for c in curve] == [q for q in result["quantiles"] if q >= 0.5]
        # a higher quantile never holds fewer GPUs: waiting never grows along the curve
        waiting = [c["waiting_gpu_hours"] for c in curve]
        assert waiting == sorted(waiting, reverse=True)
    assert "pinball" not in result["models"]["ewma_standin"]
    assert (out / "capacity.png").stat().st_size > 1000


def test_prints_and_writes_the_quantiles_in_gpus_from_the_last_minute(trained_dir, tmp_path,
                                                                     capsys):
    series = write_cycle(tmp_path / "cluster.csv", days=3, seed=2)
    out = tmp_path / "predict.json"
    assert main(["forecast", "predict", "--series", str(series), "--model", str(trained_dir),
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    last = pd.read_csv(series).iloc[-1]
    assert result["origin"] == pd.Timestamp(last["time"]).isoformat()
    assert result["last_demand"] == pytest.approx(
        (last["running_gpu_num"] + last["pending_gpu_num"]) / 64)
    demand, gpus = np.array(result["demand"]), np.array(result["gpus"])
    assert demand.shape == gpus.shape == (len(result["horizons_min"]), len(result["quantiles"]))
    assert (np.diff(demand, axis=1) >= 0).all()
    np.testing.assert_array_equal(gpus, np.floor(demand * 64 + 0.5))
    assert result["outcomes_seen"] > 0
    printed = capsys.readouterr().out
    assert f"| 60 min | {' | '.join(str(n) for n in gpus[-1])} |" in printed


def test_without_an_online_step_it_is_the_model_forecast_from_the_last_minute(trained_dir,
                                                                              tmp_path):
    path = write_cycle(tmp_path / "cluster.csv", days=3, seed=3)
    series = load_demand_series(path)
    lstm = LSTMForecaster.load(trained_dir)
    last = series.segments[-1]
    expected = lstm.predict(last.demand.astype(np.float64), int(last.minute_of_day()[-1]))
    np.testing.assert_allclose(forecast_series_end(series, lstm, step_size=0.0).demand,
                               expected)
    # the series' own past moves the offsets: the quantiles differ once it calibrates
    assert not np.allclose(forecast_series_end(series, lstm, step_size=0.05).demand, expected)


def test_a_last_run_shorter_than_the_history_after_a_gap_is_refused(trained_dir, tmp_path,
                                                                    capsys):
    path = write_cycle(tmp_path / "cluster.csv", days=3, seed=4)
    frame = pd.read_csv(path)
    frame = frame.drop(frame.index[-120:-100])  # a 20-min gap, 100 minutes before the end
    frame.to_csv(path, index=False)
    lstm = LSTMForecaster.load(trained_dir)
    with pytest.raises(UserError, match="last gap-free run is 100 minutes"):
        forecast_series_end(load_demand_series(path), lstm)
    assert main(["forecast", "predict", "--series", str(path), "--model",
                 str(trained_dir)]) == 2
    assert "needs the last" in capsys.readouterr().err


def test_an_existing_out_file_is_kept_without_force(trained_dir, tmp_path, capsys):
    series = write_cycle(tmp_path / "cluster.csv", days=3, seed=5)
    out = tmp_path / "predict.json"
    out.write_text("earlier\n")
    assert main(["forecast", "predict", "--series", str(series), "--model", str(trained_dir),
                 "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert out.read_text() == "earlier\n"


def test_a_plain_demand_file_needs_the_cluster_size_for_gpus(trained_dir, tmp_path, capsys):
    cycle = pd.read_csv(write_cycle(tmp_path / "cycle.csv", days=3, seed=6))
    plain = tmp_path / "plain.csv"
    pd.DataFrame({"time": cycle["time"], "demand": (cycle["running_gpu_num"]
                                                    + cycle["pending_gpu_num"]) / 64}
                 ).to_csv(plain, index=False)
    argv = ["forecast", "predict", "--series", str(plain), "--model", str(trained_dir)]
    assert main(argv) == 2
    assert "pass --gpus N" in capsys.readouterr().err
    out = tmp_path / "predict.json"
    assert main([*argv, "--gpus", "32", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["size_gpus"] == 32
    np.testing.assert_array_equal(result["gpus"],
                                  np.floor(np.array(result["demand"]) * 32 + 0.5))


def test_gpus_to_keep_rounds_to_the_nearest_whole_gpu():
    # 14.0016 of 16 GPUs is 14 (a network's hair above the count), 14.5 rounds up, never < 0
    np.testing.assert_array_equal(gpus_to_keep(np.array([0.8751, 14.5 / 16, -0.1]), 16.0),
                                  [14, 15, 0])
