"""`rlalloc forecast evaluate`: every forecaster on one held-out series, as JSON and a figure.

    rlalloc forecast evaluate --series held_out.csv --model models/forecaster --out results/

writes ``results/forecast.json`` (``{"horizons_min": [...], "models": {name: {"mae": [...],
"mape": [...]}}, "mape_targets": [...], ...}``; a MAPE is null where no target reached
``mape_min_demand``) and ``results/forecast_day.png`` (60-minute forecasts vs actual, one day).
Results already in the directory are replaced only with ``--force``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from rlalloc.cli.argtypes import out_path
from rlalloc.cli.forecast_train import TORCH_THREADS
from rlalloc.env.errors import UserError
from rlalloc.env.output import out_dir_for_run, write_atomic, write_json
from rlalloc.forecaster.artifacts import CARD_FILE, file_sha256, read_card
from rlalloc.forecaster.evaluate import (
    FIRST_ORIGIN_MIN,
    MAPE_MIN_DEMAND,
    Evaluation,
    evaluate_series,
)
from rlalloc.forecaster.model import SHIPPED_MODEL_DIR
from rlalloc.forecaster.model_dir import RETRAIN, load_model_dir
from rlalloc.forecaster.plot import PLOT_HORIZON_MIN, plot_sample_day
from rlalloc.forecaster.series import check_filled_share, load_demand_series

RESULT_FILE = "forecast.json"
PLOT_FILE = "forecast_day.png"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `rlalloc forecast evaluate`."""
    parser.add_argument("--series", type=Path, required=True,
                        help="per-minute cluster CSV the model was NOT trained on (one its "
                             "card.json lists is refused)")
    parser.add_argument("--model", type=Path, default=SHIPPED_MODEL_DIR,
                        help="trained forecaster directory (default: the shipped one)")
    parser.add_argument("--out", type=out_path, required=True, help="directory for the results")
    parser.add_argument("--force", action="store_true",
                        help=f"replace {RESULT_FILE} and {PLOT_FILE} already in --out "
                             "(otherwise refused)")
    parser.add_argument("--origin-stride", type=int, default=5,
                        help="minutes between forecast origins (default 5)")


def run(args: argparse.Namespace) -> int:
    """Evaluate, write forecast.json and the figure, print the table."""
    torch.set_num_threads(TORCH_THREADS)
    if args.origin_stride < 1:
        raise UserError(f"--origin-stride {args.origin_stride}: must be at least 1 minute")
    lstm, standin, holt_winters = load_model_dir(args.model, PLOT_HORIZON_MIN)
    _refuse_training_series(args.series, args.model)
    needed = max(FIRST_ORIGIN_MIN + 1, lstm.min_history_min) + max(lstm.horizons_min)
    # --out first: an --out that holds results is refused before the series is read (a
    # refused series then leaves no new directory behind)
    with out_dir_for_run(args.out, [RESULT_FILE, PLOT_FILE], args.force):
        series = load_demand_series(args.series, min_points=needed)
        print(check_filled_share(series))
        evaluation = evaluate_series(series, lstm, standin, holt_winters, args.origin_stride)
        _refuse_non_finite(evaluation, args.model)
        result = {
            "horizons_min": list(evaluation.horizons_min),
            "models": evaluation.scores(),
            "mape_min_demand": MAPE_MIN_DEMAND,
            "mape_targets": evaluation.mape_targets(),
            "series": str(args.series),
            "model_dir": str(args.model),
            "origins": int(len(evaluation.actual)),
            "filled_minutes": series.filled_minutes,
        }
        # drawn before any write, so that a failure leaves both old files
        png = plot_sample_day(evaluation, series=args.series.name)
        write_json(args.out / RESULT_FILE, result)
        write_atomic(args.out / PLOT_FILE, png)
        print(format_table(result))
        print(f"wrote {args.out / RESULT_FILE} and {args.out / PLOT_FILE}")
    return 0


def _refuse_training_series(series: Path, model: Path) -> None:
    """A model scored on a series it was trained on looks better than it will forecast, and
    beats the baselines for the wrong reason; refuse it rather than print such a table."""
    if not (model / CARD_FILE).is_file() or not series.is_file():
        return
    try:
        card = read_card(model)
    except (OSError, ValueError):  # not JSON: one line below, not the parser's traceback
        card = None
    if not isinstance(card, dict):
        raise UserError(f"--model {model}: {CARD_FILE} is not a readable model card; {RETRAIN}")
    trained_on = card.get("trained_on", [])
    if (any(Path(path).is_file() and Path(path).samefile(series) for path in trained_on)
            or file_sha256(series) in card.get("trained_on_sha256", [])):
        raise UserError(f"--series {series}: --model {model} was trained on it (its "
                        f"{CARD_FILE}), so its errors there would flatter it; pass a series "
                        "it was not trained on")


def _refuse_non_finite(evaluation: Evaluation, model: Path) -> None:
    """A NaN or infinite forecast (weights or parameters damaged in a way loading cannot see)
    would make a NaN score: bare NaN in forecast.json, which strict JSON readers reject, and a
    table that ranks nothing. Say which model it was instead."""
    broken = [name for name, forecast in evaluation.forecasts.items()
              if not np.isfinite(forecast).all()]
    if broken:
        raise UserError(f"--model {model}: the {', '.join(broken)} forecasts are not all finite "
                        f"numbers (a damaged file in it); {RETRAIN}")


def format_table(result: dict) -> str:
    """Markdown table of MAE (and MAPE) per model and horizon, with a note under it when a
    MAPE is missing, so an "n/a" is never left unexplained."""
    horizons = result["horizons_min"]
    header = "| model | " + " | ".join(f"MAE {h} min" for h in horizons) + " | " + " | ".join(
        f"MAPE {h} min" for h in horizons) + " |"
    lines = [header, "|" + "---|" * (1 + 2 * len(horizons))]
    for name, score in result["models"].items():
        mae = " | ".join(f"{v:.4f}" for v in score["mae"])
        mape = " | ".join("n/a" if v is None else f"{v:.1f} %" for v in score["mape"])
        lines.append(f"| {name} | {mae} | {mape} |")
    missing = [h for h, n in zip(horizons, result["mape_targets"], strict=True) if n == 0]
    if missing:
        lines.append(f"MAPE n/a at {', '.join(f'{h} min' for h in missing)}: no actual demand "
                     f"reached {result['mape_min_demand']:g} (MAPE leaves smaller targets out)")
    return "\n".join(lines)
