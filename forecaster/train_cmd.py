"""`rlalloc forecast train`: train the demand forecaster (or the node-failure risk model).

    rlalloc forecast train --series A.csv B.csv --out models/forecaster
    rlalloc forecast train --model risk --out models/risk
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from env.errors import UserError
from forecaster.artifacts import save_baselines, write_card
from forecaster.baselines import fit_holt_winters
from forecaster.config import ForecasterConfig
from forecaster.series import load_demand_series
from forecaster.standin import STANDIN_FILE, fit_ewma

TORCH_THREADS = 2
"""The development machine has two cores; more threads only contend."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `rlalloc forecast train`."""
    parser.add_argument("--model", choices=("demand", "risk"), default="demand",
                        help="demand: the LSTM forecaster; risk: the node-failure risk model")
    parser.add_argument("--series", nargs="+", type=Path, default=[],
                        help="per-minute cluster CSVs to train the demand forecaster on")
    parser.add_argument("--out", type=Path, required=True, help="directory to write the model to")
    parser.add_argument("--epochs", type=int, default=None, help="override the epoch count")
    parser.add_argument("--seed", type=int, default=None, help="override the seed")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    """Train, save, and print where the model went."""
    torch.set_num_threads(TORCH_THREADS)
    if args.model == "risk":
        return _train_risk(args)
    if not args.series:
        raise UserError("--series: give at least one per-minute cluster CSV to train on")
    from forecaster.train import train_forecaster

    config = ForecasterConfig()
    overrides = {k: v for k, v in (("epochs", args.epochs), ("seed", args.seed)) if v is not None}
    config = replace(config, **overrides)
    segments = []
    for path in args.series:
        series = load_demand_series(path, min_points=config.min_history_min + 61)
        segments.extend(series.segments)
    forecaster, report = train_forecaster(segments, config, show_progress=not args.no_progress)
    args.out.mkdir(parents=True, exist_ok=True)
    forecaster.save(args.out)
    # Baselines are fitted on the same training data, never on the evaluated series.
    longest = max(segments, key=lambda s: len(s.demand))
    save_baselines(args.out, fit_holt_winters(longest.demand))
    standin = fit_ewma([s.demand for s in segments], config.horizons_min)
    standin.save(args.out / STANDIN_FILE)
    write_card(args.out, {
        "model": "LSTM demand forecaster",
        "demand": "(running_gpu_num + pending_gpu_num) / total_gpu_num (Philly: active / total)",
        "trained_on": [str(p) for p in args.series],
        "command": _command_line(),
        "config": config.to_json(),
        "training": asdict(report),
        "standin_half_lives_min": list(standin.half_lives_min),
    })
    print(f"trained in {report.wall_time_s:.0f} s (best epoch {report.best_epoch}); "
          f"wrote {args.out}")
    return 0


def _train_risk(args: argparse.Namespace) -> int:
    """Simulate telemetry, fit the risk model, score it on a held-out seed, save it."""
    from forecaster.risk import RiskConfig
    from forecaster.risk_eval import any_xid_rule, best_f1_threshold, score_risk
    from forecaster.risk_train import simulate, train_risk_model

    config = RiskConfig()
    if args.epochs is not None:
        config = replace(config, epochs=args.epochs)
    if args.seed is not None:
        config = replace(config, train_seed=args.seed, test_seed=args.seed + 1)
    started = time.perf_counter()
    train_sample = simulate(config, config.train_seed)
    model = train_risk_model(config, train_sample)
    threshold = best_f1_threshold(model.predict_sample(train_sample), train_sample,
                                  config.horizon_s)
    test_sample = simulate(config, config.test_seed)
    scores = {
        "logistic": score_risk(model.predict_sample(test_sample), test_sample, config.horizon_s,
                               threshold),
        "any_xid_30m_rule": score_risk(any_xid_rule(test_sample), test_sample, config.horizon_s,
                                       0.5),
    }
    model.threshold = threshold
    model.save(args.out)
    write_card(args.out, {
        "model": "node-failure risk (logistic regression)",
        "data": "SIMULATED telemetry from env.failures.sample_node_telemetry; no public "
                "per-node failure telemetry exists",
        "command": _command_line(),
        "config": asdict(config),
        "alarm_threshold": threshold,
        "test_scores": scores,
        "wall_time_s": time.perf_counter() - started,
    })
    print(json.dumps(scores, indent=2))
    print(f"wrote {args.out}")
    return 0


def _command_line() -> str:
    """The command as typed, for the model card."""
    return "rlalloc " + shlex.join(sys.argv[1:]) if sys.argv[0].endswith("rlalloc") else (
        shlex.join(sys.argv)
    )
