"""`rlalloc bench forecast`: training wall time of the shipped config and per-call latency.

    rlalloc bench forecast [--out bench.json] [--epochs N]

Training runs the shipped model's config on the training and validation series named in its
card (or on ``--series``, validated on their tails) and reports minutes; latency is the median
of many single `predict` calls, as the simulator and actuator make them, for the LSTM, the
EWMA stand-in and the risk model over 64 nodes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from rlalloc.cli.argtypes import POSITIVE_INT, add_json_out_flags
from rlalloc.cli.forecast_train import TORCH_THREADS
from rlalloc.env.errors import UserError
from rlalloc.env.output import prepare_out_file, write_json_out
from rlalloc.forecaster.artifacts import read_card
from rlalloc.forecaster.model import SHIPPED_MODEL_DIR, load_demand_forecaster
from rlalloc.forecaster.series import DemandSeries, load_demand_series
from rlalloc.forecaster.standin import load_standin
from rlalloc.forecaster.unions import training_segments

LATENCY_CALLS = 300


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `rlalloc bench forecast`."""
    add_json_out_flags(parser)
    parser.add_argument("--series", nargs="+", type=Path, default=None,
                        help="training series (default: those in the shipped model's card)")
    parser.add_argument("--epochs", type=POSITIVE_INT, default=None,
                        help="train fewer epochs than the shipped config (time scales linearly)")
    parser.add_argument("--skip-training", action="store_true", help="measure latency only")


def run(args: argparse.Namespace) -> int:
    """Measure and print; write JSON when asked."""
    prepare_out_file(args.out, args.force)
    torch.set_num_threads(TORCH_THREADS)
    result: dict[str, object] = {"torch_threads": TORCH_THREADS}
    if not args.skip_training:
        result["training"] = _training_time(args)
    result["latency_ms"] = _latencies()
    print(json.dumps(result, indent=2))
    write_json_out(args.out, result)
    return 0


def _training_time(args: argparse.Namespace) -> dict[str, object]:
    """Wall time of training the shipped config from scratch."""
    from rlalloc.forecaster.train import train_forecaster

    card = read_card(SHIPPED_MODEL_DIR)
    lstm = load_demand_forecaster()
    config = lstm.config if args.epochs is None else replace(lstm.config, epochs=args.epochs)
    # the card names its series relative to the checkout it was trained in
    paths = args.series or [Path(p) for p in card["trained_on"]]
    val_paths = [] if args.series else [Path(p) for p in card.get("validated_on", [])]
    if not val_paths:  # validated on the training tails, which unions would train on
        config = replace(config, union_sizes=())
    missing = [str(p) for p in [*paths, *val_paths] if not Path(p).is_file()]
    if missing:
        raise UserError(f"training series not found: {', '.join(missing)}; run from the checkout "
                        "beside ../shared, pass --series, or --skip-training")

    def series(files: list[Path]) -> list[DemandSeries]:
        return [load_demand_series(p, min_points=config.min_history_min + 61) for p in files]

    validation = [segment for one in series(val_paths) for segment in one.segments]
    _, report = train_forecaster(training_segments(series(paths), config), config,
                                 show_progress=True, validation=validation or None)
    return {
        "series": [str(p) for p in paths],
        "validation_series": [str(p) for p in val_paths],
        "epochs": config.epochs,
        "train_windows": report.train_windows,
        "wall_time_s": round(report.wall_time_s, 1),
        "wall_time_min": round(report.wall_time_s / 60.0, 2),
        "wall_time_per_epoch_s": round(report.wall_time_s / config.epochs, 1),
    }


def _latencies() -> dict[str, float]:
    """Median milliseconds of one forecast (one node-set risk update) as callers make it."""
    from rlalloc.forecaster.risk import load_risk_model

    rng = np.random.default_rng(0)
    lstm = load_demand_forecaster()
    standin = load_standin()
    history = np.clip(0.5 + np.cumsum(rng.normal(0, 0.01, lstm.min_history_min + 10)), 0, 2)
    risk = load_risk_model()
    now = rng.poisson(0.2, (64, len(risk.feature_names))).astype(np.float64)
    return {
        "lstm_predict": _median_ms(lambda: lstm.predict(history, last_minute_of_day=600)),
        "ewma_standin_predict": _median_ms(lambda: standin.predict(history)),
        "risk_64_nodes": _median_ms(lambda: risk.predict_proba(now, now * 0.5)),
    }


def _median_ms(call: Callable[[], object]) -> float:
    """Median wall time of `LATENCY_CALLS` calls after a warm-up, in milliseconds."""
    for _ in range(10):
        call()
    times = []
    for _ in range(LATENCY_CALLS):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return round(1000.0 * statistics.median(times), 4)
