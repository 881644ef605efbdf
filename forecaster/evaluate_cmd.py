"""`rlalloc forecast evaluate`: every forecaster on one held-out series, as JSON and a figure.

    rlalloc forecast evaluate --series held_out.csv --model models/forecaster --out results/

writes ``results/forecast.json`` (``{"horizons_min": [...], "models": {name: {"mae": [...],
"mape": [...]}}}``) and ``results/forecast_day.png`` (60-minute forecasts vs actual, one day).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from env.errors import UserError
from forecaster.artifacts import load_baselines
from forecaster.evaluate import FIRST_ORIGIN_MIN, evaluate_series
from forecaster.model import SHIPPED_MODEL_DIR, load_demand_forecaster
from forecaster.plot import plot_sample_day
from forecaster.series import load_demand_series
from forecaster.standin import load_standin
from forecaster.train_cmd import TORCH_THREADS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `rlalloc forecast evaluate`."""
    parser.add_argument("--series", type=Path, required=True,
                        help="per-minute cluster CSV the model was NOT trained on")
    parser.add_argument("--model", type=Path, default=SHIPPED_MODEL_DIR,
                        help="trained forecaster directory (default: the shipped one)")
    parser.add_argument("--out", type=Path, required=True, help="directory for the results")
    parser.add_argument("--origin-stride", type=int, default=5,
                        help="minutes between forecast origins (default 5)")


def run(args: argparse.Namespace) -> int:
    """Evaluate, write forecast.json and the figure, print the table."""
    torch.set_num_threads(TORCH_THREADS)
    if not (args.model / "config.json").is_file():
        raise UserError(f"--model {args.model}: no config.json; pass a `forecast train --out` dir")
    if args.origin_stride < 1:
        raise UserError(f"--origin-stride {args.origin_stride}: must be at least 1 minute")
    lstm = load_demand_forecaster(args.model)
    needed = max(FIRST_ORIGIN_MIN + 1, lstm.min_history_min) + max(lstm.horizons_min)
    series = load_demand_series(args.series, min_points=needed)
    evaluation = evaluate_series(
        series, lstm, load_standin(args.model), load_baselines(args.model), args.origin_stride
    )
    scores = evaluation.scores()
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "horizons_min": list(evaluation.horizons_min),
        "models": scores,
        "series": str(args.series),
        "model_dir": str(args.model),
        "origins": int(len(evaluation.actual)),
        "filled_minutes": series.filled_minutes,
    }
    (args.out / "forecast.json").write_text(json.dumps(result, indent=2) + "\n")
    plot_sample_day(evaluation, args.out / "forecast_day.png")
    print(format_table(result))
    print(f"wrote {args.out / 'forecast.json'} and {args.out / 'forecast_day.png'}")
    return 0


def format_table(result: dict) -> str:
    """Markdown table of MAE (and MAPE) per model and horizon."""
    horizons = result["horizons_min"]
    header = "| model | " + " | ".join(f"MAE {h} min" for h in horizons) + " | " + " | ".join(
        f"MAPE {h} min" for h in horizons) + " |"
    lines = [header, "|" + "---|" * (1 + 2 * len(horizons))]
    for name, score in result["models"].items():
        mae = " | ".join(f"{v:.4f}" for v in score["mae"])
        mape = " | ".join(f"{v:.1f} %" for v in score["mape"])
        lines.append(f"| {name} | {mae} | {mape} |")
    return "\n".join(lines)
