"""`rlalloc forecast train`: train the demand forecaster (or the node-failure risk model).

    rlalloc forecast train --series A.csv B.csv --val-series C.csv --out models/forecaster
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

import numpy as np
import torch

from rlalloc.cli.argtypes import POSITIVE_INT, SEED, out_path
from rlalloc.env.errors import UserError
from rlalloc.forecaster.artifacts import (
    BASELINES_FILE,
    CARD_FILE,
    file_sha256,
    save_baselines,
    staged_model_dir,
    write_card,
)
from rlalloc.forecaster.baselines import HOLT_WINTERS_MIN_HISTORY_MIN, fit_holt_winters
from rlalloc.forecaster.config import ForecasterConfig
from rlalloc.forecaster.model import CONFIG_FILE, WEIGHTS_FILE
from rlalloc.forecaster.quantile_baselines import fit_baselines
from rlalloc.forecaster.risk import RISK_MODEL_FILE, RiskConfig
from rlalloc.forecaster.series import DemandSeries, check_filled_share, load_demand_series
from rlalloc.forecaster.standin import STANDIN_FILE, fit_ewma
from rlalloc.forecaster.unions import training_segments

TORCH_THREADS = 2
"""The development machine has two cores; more threads only contend."""
DEMAND_MODEL_FILES = [WEIGHTS_FILE, CONFIG_FILE, BASELINES_FILE, STANDIN_FILE, CARD_FILE]
RISK_MODEL_FILES = [RISK_MODEL_FILE, CARD_FILE]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `rlalloc forecast train`."""
    parser.add_argument("--model", choices=("demand", "risk"), default="demand",
                        help="demand: the LSTM forecaster; risk: the node-failure risk model")
    parser.add_argument("--series", nargs="+", type=Path, default=[],
                        help="per-minute cluster CSVs to train the demand forecaster (and "
                             "fit the baselines) on (--model demand only)")
    parser.add_argument("--val-series", nargs="+", type=Path, default=[],
                        help="per-minute CSVs of other clusters that choose the epoch and "
                             "calibrate the quantiles (default: the last 10 %% of every "
                             "--series); `forecast evaluate` refuses them too")
    parser.add_argument("--out", type=out_path, required=True,
                        help="directory to write the model to")
    parser.add_argument("--force", action="store_true",
                        help="replace a model already in --out (otherwise refused)")
    parser.add_argument("--epochs", type=POSITIVE_INT, default=None,
                        help=f"epochs to train (default: {ForecasterConfig.epochs} for the "
                             f"demand model, {RiskConfig.epochs} for the risk model)")
    parser.add_argument("--seed", type=SEED, default=None,
                        help=f"training seed (default: {ForecasterConfig.seed}; the risk model "
                             "is scored on the simulated telemetry of the seed after it)")
    parser.add_argument("--unions", action="store_true",
                        help="also train on the union of every pair of --series (their GPUs "
                             "pooled): for clusters busier than the training ones; needs "
                             "--val-series (see docs/forecaster.md)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    """Check every flag, train, save, and print where the model went."""
    torch.set_num_threads(TORCH_THREADS)
    if args.model == "risk":
        if args.series or args.val_series:
            flag = "--series" if args.series else "--val-series"
            raise UserError(f"{flag}: the risk model trains on simulated telemetry, not on a "
                            f"demand series; drop {flag} or pass --model demand")
        return _train_risk(args)
    return _train_demand(args)


def _train_demand(args: argparse.Namespace) -> int:
    """Train the LSTM forecaster and fit the baselines and stand-in on the same series."""
    from rlalloc.forecaster.train import train_forecaster

    if not args.series:
        raise UserError("--series: give at least one per-minute cluster CSV to train on")
    given = [*args.series, *args.val_series]
    if twice := next((p for i, p in enumerate(given) if p in given[:i]), None):
        raise UserError(f"--series {twice} is given twice; give each once (a series given twice "
                        "would be trained on twice, or validated on what it trained on)")
    config = ForecasterConfig()
    overrides = {k: v for k, v in (("epochs", args.epochs), ("seed", args.seed)) if v is not None}
    if args.unions:
        if not args.val_series:
            raise UserError("--unions needs --val-series (validated on the tails of the "
                            "training series, the unions would train on minutes that validate); "
                            "add --val-series of other clusters or drop --unions")
        overrides["union_sizes"] = (2,)
    config = replace(config, **overrides)
    series = [load_demand_series(p, min_points=config.min_history_min + 61) for p in given]
    digests = _refuse_repeated_series(given)
    filled = [check_filled_share(one) for one in series]
    train_series, val_series = series[:len(args.series)], series[len(args.series):]
    segments = [segment for one in train_series for segment in one.segments]
    validation = [segment for one in val_series for segment in one.segments]
    holt_winters_run = _holt_winters_run(train_series)
    with staged_model_dir(args.out, DEMAND_MODEL_FILES, args.force) as staging:
        print("\n".join(filled))  # once --out is known to take the model
        # Baselines are fitted on the training series, never on validated or evaluated ones.
        save_baselines(staging, fit_baselines(segments, fit_holt_winters(holt_winters_run),
                                              config.quantiles, config.horizons_min))
        standin = fit_ewma([s.demand for s in segments], config.horizons_min)
        standin.save(staging / STANDIN_FILE)
        trained_segments = training_segments(train_series, config)
        forecaster, report = train_forecaster(trained_segments, config,
                                              show_progress=not args.no_progress,
                                              validation=validation or None)
        forecaster.save(staging)
        write_card(staging, {
            "model": "LSTM demand forecaster (quantiles)",
            "demand": "(running_gpu_num + pending_gpu_num) / total_gpu_num "
                      "(Philly: active / total)",
            "split": {"train": [p.name for p in args.series],
                      "validation": [p.name for p in args.val_series]
                      or "last 10 % of every training series"},
            # `forecast evaluate` refuses these files from any working directory, and copies
            # of them anywhere (by content: a shipped card cannot name this machine's paths)
            "trained_on": [str(p.resolve()) for p in args.series],
            "trained_on_sha256": digests[:len(args.series)],
            "validated_on": [str(p.resolve()) for p in args.val_series],
            "validated_on_sha256": digests[len(args.series):],
            "filled_minutes": [one.filled_minutes for one in series],
            "unchanged_share_60min": [one.unchanged_share(60) for one in series],
            "union_segments": len(trained_segments) - len(segments),
            "command": _command_line(),
            "config": config.to_json(),
            "training": asdict(report),
            "standin_half_lives_min": list(standin.half_lives_min),
        })
    print(f"trained in {report.wall_time_s:.0f} s (best epoch {report.best_epoch}); "
          f"wrote {args.out}")
    return 0


def _refuse_repeated_series(paths: list[Path]) -> list[str]:
    """The SHA-256 of every path, or a `UserError` when two name the same bytes: the same
    file typed twice or reached by two paths (``a.csv``, ``dir/../a.csv``, a link), or a copy
    of it. Each would double that series' training windows."""
    digests = [file_sha256(p) for p in paths]
    for index, digest in enumerate(digests):
        if digest in digests[:index]:
            first = paths[digests.index(digest)]
            raise UserError(f"--series {paths[index]}: the same file or a copy of {first} "
                            "(same SHA-256), which would be trained on twice; give each "
                            "series once")
    return digests


def _holt_winters_run(series: list[DemandSeries]) -> np.ndarray:
    """The longest gap-free run of all training series, which the Holt-Winters baseline is
    fitted on; shorter than two days it cannot be, and that is said before training, not after."""
    source, demand = max(
        ((one.source, segment.demand) for one in series for segment in one.segments),
        key=lambda item: len(item[1]),
    )
    if len(demand) < HOLT_WINTERS_MIN_HISTORY_MIN:
        of_all = " (the longest of all --series)" if len(series) > 1 else ""
        raise UserError(
            f"{source}: longest gap-free run is {len(demand)} minutes{of_all} but training needs "
            f"at least {HOLT_WINTERS_MIN_HISTORY_MIN} (two days, to fit the Holt-Winters "
            "baseline); supply a longer per-minute series"
        )
    return demand


def _train_risk(args: argparse.Namespace) -> int:
    """Simulate telemetry, fit the risk model, score it on a held-out seed, save it."""
    from rlalloc.env.featurizer import RISKY_NODE_SCORE
    from rlalloc.forecaster.risk_eval import any_xid_rule, best_f1_threshold, score_risk
    from rlalloc.forecaster.risk_train import simulate, train_risk_model

    config = RiskConfig()
    if args.epochs is not None:
        config = replace(config, epochs=args.epochs)
    if args.seed is not None:
        config = replace(config, train_seed=args.seed, test_seed=args.seed + 1)
    started = time.perf_counter()
    with staged_model_dir(args.out, RISK_MODEL_FILES, args.force) as staging:
        train_sample = simulate(config, config.train_seed)
        model = train_risk_model(config, train_sample)
        best_f1 = best_f1_threshold(model.predict_sample(train_sample), train_sample,
                                    config.horizon_s)
        test_sample = simulate(config, config.test_seed)
        risk = model.predict_sample(test_sample)
        # scored where the policies act on it (a node at risk from RISKY_NODE_SCORE on), and,
        # for comparison, at the training seed's best-F1 cut, which no policy uses
        scores = {
            "logistic": score_risk(risk, test_sample, config.horizon_s, RISKY_NODE_SCORE),
            "logistic_at_best_f1": score_risk(risk, test_sample, config.horizon_s, best_f1),
            "any_xid_30m_rule": score_risk(any_xid_rule(test_sample), test_sample,
                                           config.horizon_s, 0.5),
        }
        model.save(staging)
        write_card(staging, {
            "model": "node-failure risk (logistic regression)",
            "data": "SIMULATED telemetry from env.failures.sample_node_telemetry; no public "
                    "per-node failure telemetry exists",
            "command": _command_line(),
            "config": asdict(config),
            "alarm_threshold": RISKY_NODE_SCORE,
            "best_f1_threshold": best_f1,
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
