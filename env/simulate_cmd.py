"""`rlalloc simulate`: replay one workload on one cluster under one policy and report metrics.

Command modules sit at the top of the layering: this one resolves the policy through
`agent.registry`, so any built-in or saved policy can drive a replay.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from rich.console import Console
from rich.table import Table

from env.efficiency import add_efficiency_flag
from env.errors import UserError
from env.failures import FAILURE_PRESETS
from env.metrics import METRIC_KEYS
from env.output import prepare_out_dir, write_json
from env.params import SimParams
from env.progress import progress_bar
from env.scenario import build_scenario
from env.workload.loader import EMBEDDED_DEFAULT


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `rlalloc simulate`."""
    parser.add_argument("--workload", default=EMBEDDED_DEFAULT,
                        help="CSV path (Philly, Pollux or canonical) or "
                             "synthetic[:NUM_JOBS[:LOAD[:MAX_HOURS]]] (default: %(default)s)")
    parser.add_argument("--cluster", default="16x4",
                        help="NODESxGPUS (e.g. 16x4, 128x8) or a cluster YAML "
                             "(default: %(default)s)")
    parser.add_argument("--policy", default="static",
                        help="built-in policy name or path to a saved model "
                             "(default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of workload and failures")
    parser.add_argument("--failures", default="default",
                        help="failures per GPU-day, or none|default|stress (default: %(default)s)")
    add_efficiency_flag(parser)
    parser.add_argument("--checkpoint-interval", type=float, default=None, metavar="SECONDS",
                        help="periodic checkpoint interval of every job (default: 1800)")
    parser.add_argument("--out", type=Path, default=Path("runs/simulate"),
                        help="directory for metrics.json (default: %(default)s)")
    parser.add_argument("--force", action="store_true", help="replace an existing metrics.json")


def parse_failure_rate(value: str) -> float:
    """`--failures` value: a preset name or a non-negative number of failures per GPU-day."""
    if value in FAILURE_PRESETS:
        return FAILURE_PRESETS[value]
    try:
        rate = float(value)
    except ValueError:
        rate = -1.0
    if rate < 0:
        raise UserError(f"--failures {value!r}: give failures per GPU-day (a number >= 0) or "
                        f"one of {', '.join(FAILURE_PRESETS)}")
    return rate


def sim_params(failures: str, checkpoint_interval_s: float | None = None) -> SimParams:
    """Simulator parameters from the common command-line flags."""
    params = SimParams()
    fail = dataclasses.replace(params.failures, failures_per_gpu_day=parse_failure_rate(failures))
    params = dataclasses.replace(params, failures=fail)
    if checkpoint_interval_s is not None:
        if checkpoint_interval_s <= 0:
            raise UserError("--checkpoint-interval must be a positive number of seconds")
        params = dataclasses.replace(params, checkpoint_interval_s=checkpoint_interval_s)
    return params


def run(args: argparse.Namespace) -> int:
    """Replay the workload, print the summary table, write DIR/metrics.json."""
    from agent.registry import load_policy

    out = prepare_out_dir(args.out, ["metrics.json"], args.force)
    params = sim_params(args.failures, args.checkpoint_interval)
    policy = load_policy(args.policy)
    scenario = build_scenario(args.workload, args.cluster, seed=args.seed,
                              efficiency=args.efficiency)
    sim = scenario.simulator(params, seed=args.seed)
    with progress_bar() as progress:
        task = progress.add_task(f"replay ({policy.name})", total=len(scenario.workload.jobs))
        sim.run(policy.act, on_progress=lambda n: progress.advance(task, n))
    metrics = sim.accounting.summary()
    write_json(out / "metrics.json", {
        **metrics,
        "policy": policy.name,
        "workload": args.workload,
        "cluster": scenario.cluster.describe(),
        "seed": args.seed,
        "efficiency": args.efficiency,
        "params": dataclasses.asdict(params),
    })
    table = Table(title=f"{args.workload} on {scenario.cluster.describe()} - {policy.name}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in METRIC_KEYS:
        value = metrics[key]
        table.add_row(key, f"{value:,.4g}" if isinstance(value, float) else f"{value:,}")
    Console().print(table)
    print(f"wrote {out / 'metrics.json'}")
    return 0
