"""`rlalloc forecast evaluate`: every forecaster on held-out series, as JSON and figures.

    rlalloc forecast evaluate --series held_out.csv [more.csv ...] --model models/forecaster \
        --out results/

writes ``results/forecast.json`` (``{"horizons_min": [...], "quantiles": [...], "models":
{name: {"mae": [...], "mape": [...], "pinball": {level: [...]}, "pinball_mean": [...],
"coverage_q90": [...], "coverage_q10_q90": [...]}}, "capacity": {"curves": {name: [{"level",
"idle_gpu_hours", "waiting_gpu_hours"}, ...]}, "idle_at_reference_waiting": {...}},
"mape_targets": [...], ...}``, pooled over the series; a MAPE is null where no target reached
``mape_min_demand``; point-only models have no pinball or capacity; every quantile model also
appears calibrated online on each series, as ``NAME_online``, the capacity comparison's
reference being ``lstm_online``),
``results/forecast_day.png`` (60-minute forecasts and bands vs actual, one day) and
``results/capacity.png`` (the capacity rule's idle against waiting GPU-hours over q).
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
from rlalloc.forecaster.capacity import CAPACITY_HORIZON_MIN, capacity_report
from rlalloc.forecaster.evaluate import (
    FIRST_ORIGIN_MIN,
    MAPE_MIN_DEMAND,
    ONLINE_STEP_SIZES,
    ONLINE_SUFFIX,
    Evaluation,
    evaluate_series,
)
from rlalloc.forecaster.lstm_dir import RETRAIN
from rlalloc.forecaster.model import SHIPPED_MODEL_DIR
from rlalloc.forecaster.model_dir import load_model_dir
from rlalloc.forecaster.plot import PLOT_HORIZON_MIN, plot_capacity, plot_sample_day
from rlalloc.forecaster.series import check_filled_share, load_demand_series

RESULT_FILE = "forecast.json"
PLOT_FILE = "forecast_day.png"
CAPACITY_PLOT_FILE = "capacity.png"
RESULT_FILES = [RESULT_FILE, PLOT_FILE, CAPACITY_PLOT_FILE]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `rlalloc forecast evaluate`."""
    parser.add_argument("--series", type=Path, nargs="+", required=True,
                        help="per-minute cluster CSVs the model was NOT trained or validated "
                             "on (one its card.json lists is refused); scores pool them")
    parser.add_argument("--model", type=Path, default=SHIPPED_MODEL_DIR,
                        help="trained forecaster directory (default: the shipped one)")
    parser.add_argument("--out", type=out_path, required=True, help="directory for the results")
    parser.add_argument("--force", action="store_true",
                        help=f"replace {', '.join(RESULT_FILES)} already in --out "
                             "(otherwise refused)")
    parser.add_argument("--origin-stride", type=int, default=5,
                        help="minutes between forecast origins (default 5)")


def run(args: argparse.Namespace) -> int:
    """Evaluate, write forecast.json and the figure, print the table."""
    torch.set_num_threads(TORCH_THREADS)
    if args.origin_stride < 1:
        raise UserError(f"--origin-stride {args.origin_stride}: must be at least 1 minute")
    lstm, standin, fitted = load_model_dir(args.model, PLOT_HORIZON_MIN)
    if twice := next((p for i, p in enumerate(args.series) if p in args.series[:i]), None):
        raise UserError(f"--series {twice} is given twice; give each once")
    for one in args.series:
        _refuse_training_series(one, args.model)
    needed = max(FIRST_ORIGIN_MIN + 1, lstm.min_history_min) + max(lstm.horizons_min)
    # --out first: an --out that holds results is refused before the series is read (a
    # refused series then leaves no new directory behind)
    with out_dir_for_run(args.out, RESULT_FILES, args.force):
        series = [load_demand_series(one, min_points=needed) for one in args.series]
        print("\n".join(check_filled_share(one) for one in series))
        evaluation = evaluate_series(series, lstm, standin, fitted, args.origin_stride)
        _refuse_non_finite(evaluation, args.model)
        result = {
            "horizons_min": list(evaluation.horizons_min),
            "quantiles": list(evaluation.quantiles),
            "models": evaluation.scores(),
            "capacity": capacity_report(evaluation.capacity(),
                                        reference="lstm" + ONLINE_SUFFIX),
            "online_step_sizes": ONLINE_STEP_SIZES,
            "capacity_horizon_min": CAPACITY_HORIZON_MIN,
            "mape_min_demand": MAPE_MIN_DEMAND,
            "mape_targets": evaluation.mape_targets(),
            "series": [str(one) for one in args.series],
            "size_gpus": [one.size_gpus for one in series],
            "model_dir": str(args.model),
            "origins": int(len(evaluation.actual)),
            "filled_minutes": [one.filled_minutes for one in series],
            "unchanged_share_60min": [one.unchanged_share(60) for one in series],
        }
        # drawn before any write, so that a failure leaves every old file
        png = plot_sample_day(evaluation, series=args.series[0].name)
        capacity_png = plot_capacity(result["capacity"]["curves"], CAPACITY_HORIZON_MIN)
        write_json(args.out / RESULT_FILE, result)
        write_atomic(args.out / PLOT_FILE, png)
        write_atomic(args.out / CAPACITY_PLOT_FILE, capacity_png)
        print(format_table(result))
        print(format_capacity_table(result))
        print(f"wrote {', '.join(str(args.out / name) for name in RESULT_FILES)}")
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
    for role, key in (("trained", "trained_on"), ("validated", "validated_on")):
        if (any(Path(path).is_file() and Path(path).samefile(series) for path in card.get(key, []))
                or file_sha256(series) in card.get(f"{key}_sha256", [])):
            raise UserError(f"--series {series}: --model {model} was {role} on it (its "
                            f"{CARD_FILE}), so its errors there would flatter it; pass a series "
                            "it was not trained or validated on")


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
    """Markdown table per model and horizon of the median's MAE and MAPE and, for quantile
    models, the pinball loss per level, its mean and the coverages ("-" for point models),
    with a note under it when a MAPE is missing, so an "n/a" is never left unexplained."""
    horizons = result["horizons_min"]
    header = ("| model | horizon | MAE (median) | MAPE | pinball q0.1 | pinball q0.5 | "
              "pinball q0.9 | pinball mean | share <= q0.9 | share in [q0.1, q0.9] |")
    lines = [header, "|" + "---|" * 10]
    for name, score in result["models"].items():
        for k, horizon in enumerate(horizons):
            mape = "n/a" if score["mape"][k] is None else f"{score['mape'][k]:.1f} %"
            if "pinball" in score:
                quantile = " | ".join(
                    [f"{values[k]:.4f}" for values in score["pinball"].values()]
                    + [f"{score['pinball_mean'][k]:.4f}", f"{score['coverage_q90'][k]:.1%}",
                       f"{score['coverage_q10_q90'][k]:.1%}"])
            else:
                quantile = " | ".join(["-"] * 6)
            lines.append(f"| {name} | {horizon} min | {score['mae'][k]:.4f} | {mape} | "
                         f"{quantile} |")
    missing = [h for h, n in zip(horizons, result["mape_targets"], strict=True) if n == 0]
    if missing:
        lines.append(f"MAPE n/a at {', '.join(f'{h} min' for h in missing)}: no actual demand "
                     f"reached {result['mape_min_demand']:g} (MAPE leaves smaller targets out)")
    return "\n".join(lines)


def format_capacity_table(result: dict) -> str:
    """Markdown tables of the capacity rule: idle and waiting GPU-hours per model and level,
    then each model's idle GPU-hours at the reference model's waiting."""
    curves = result["capacity"]["curves"]
    models = list(curves)
    lines = ["| q | " + " | ".join(f"{name} idle / waiting" for name in models) + " |",
             "|" + "---|" * (1 + len(models))]
    for row, cost in enumerate(curves[models[0]]):
        cells = [f"{curves[name][row]['idle_gpu_hours']:.0f} / "
                 f"{curves[name][row]['waiting_gpu_hours']:.0f}" for name in models]
        lines.append(f"| {cost['level']:g} | " + " | ".join(cells) + " |")
    equal = result["capacity"]["idle_at_reference_waiting"]
    lines += ["", f"Idle GPU-hours at the waiting GPU-hours of {equal['reference']}'s rule "
              "(- beyond a curve):",
              "| waiting | " + " | ".join(models) + " |", "|" + "---|" * (1 + len(models))]
    for row, waiting in enumerate(equal["waiting_gpu_hours"]):
        cells = ["-" if equal["idle_gpu_hours"][name][row] is None
                 else f"{equal['idle_gpu_hours'][name][row]:.0f}" for name in models]
        lines.append(f"| {waiting:.0f} (q{equal['levels'][row]:g}) | " + " | ".join(cells)
                     + " |")
    return (f"GPU-hours held idle / left waiting, keeping GPUs for the q-quantile of demand "
            f"{result['capacity_horizon_min']} min ahead:\n" + "\n".join(lines))
