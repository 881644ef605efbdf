"""`rlalloc simulate`: replay one workload on one cluster under one policy and report metrics.

Command modules sit at the top of the layering: this one resolves the policy through
`rlalloc.agent.registry`, so any built-in or saved policy can drive a replay.

A policy that never finishes some job (a learned one can keep restarting it) would replay for
ever, so the replay stops at the simulated-time limit evaluation and training use
(`rlalloc.env.simulator.time_limit_s`), writes the metrics with ``finished: false`` (each unfinished
job's JCT at its time in the system so far, `RunAccounting.summary`) and their count,
warns in one line and exits with `UNFINISHED_EXIT_CODE`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rlalloc.cli.argtypes import SEED, above, out_path
from rlalloc.env.cluster import add_cluster_flag
from rlalloc.env.efficiency import add_efficiency_flag
from rlalloc.env.execution import add_ray_flag, executor_for
from rlalloc.env.failures import parse_failure_rate
from rlalloc.env.metrics import METRIC_KEYS
from rlalloc.env.output import out_dir_for_run, write_json
from rlalloc.env.params import SimParams
from rlalloc.env.progress import progress_bar
from rlalloc.env.scenario import build_scenario, require_applications
from rlalloc.env.simulator import time_limit_s
from rlalloc.env.workload.loader import EMBEDDED_DEFAULT, GENERATED_SOURCES
from rlalloc.forecaster.signals import default_signals

UNFINISHED_EXIT_CODE = 3
"""Exit status of a replay stopped at the time limit with jobs unfinished: not 0, so scripts
notice, and not 2, which means the input was refused."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `rlalloc simulate`."""
    parser.add_argument("--workload", default=EMBEDDED_DEFAULT,
                        help=f"CSV path (Philly, Pollux or canonical), {GENERATED_SOURCES} "
                             "(default: %(default)s)")
    add_cluster_flag(parser)
    parser.add_argument("--policy", default="static",
                        help="built-in policy name or path to a saved model "
                             "(default: %(default)s)")
    parser.add_argument("--seed", type=SEED, default=0, help="seed of workload and failures")
    parser.add_argument("--failures", default="default",
                        help="failures per GPU-day, or none|default|stress (default: %(default)s)")
    add_efficiency_flag(parser)
    parser.add_argument("--checkpoint-interval", type=above(0.0), default=None, metavar="SECONDS",
                        help="periodic checkpoint interval of every job (default: 1800)")
    add_ray_flag(parser, "a planner's forks")
    parser.add_argument("--out", type=out_path, default=Path("runs/simulate"),
                        help="directory for metrics.json (default: %(default)s)")
    parser.add_argument("--force", action="store_true", help="replace an existing metrics.json")
    parser.epilog = (f"exit status {UNFINISHED_EXIT_CODE}: the policy left jobs unfinished at "
                     "the simulated-time limit (metrics.json: finished, jobs_unfinished)")


def sim_params(failures: str, checkpoint_interval_s: float | None = None) -> SimParams:
    """Simulator parameters from the common command-line flags."""
    params = SimParams()
    fail = dataclasses.replace(params.failures, failures_per_gpu_day=parse_failure_rate(failures))
    params = dataclasses.replace(params, failures=fail)
    if checkpoint_interval_s is not None:
        params = dataclasses.replace(params, checkpoint_interval_s=checkpoint_interval_s)
    return params


def run(args: argparse.Namespace) -> int:
    """Replay the workload, print the summary table, write DIR/metrics.json."""
    from rlalloc.agent.evaluation import lookahead_counts
    from rlalloc.agent.registry import load_policy

    params = sim_params(args.failures, args.checkpoint_interval)
    policy = load_policy(args.policy)
    if args.ray is not None:
        from rlalloc.agent.lookahead import fork_on

        fork_on(policy, executor_for(1, args.ray))
    scenario = build_scenario(args.workload, args.cluster, seed=args.seed,
                              efficiency=args.efficiency, signals=default_signals())
    require_applications([scenario], args.efficiency, [args.workload])
    # refused input makes no directory, a stopped replay leaves none behind
    with out_dir_for_run(args.out, ["metrics.json"], args.force) as out:
        sim = scenario.simulator(params, seed=args.seed)
        limit_s = time_limit_s(sim)
        with progress_bar() as progress:
            task = progress.add_task(f"replay ({policy.name})",
                                     total=len(scenario.workload.jobs))
            finished = sim.run(policy.act, on_progress=lambda n: progress.advance(task, n),
                               limit_s=limit_s)
        metrics = sim.accounting.summary()
        unfinished = len(scenario.workload.jobs) - metrics["jobs_completed"]
        lookahead = lookahead_counts(policy)
        write_json(out / "metrics.json", {
            **metrics,
            "finished": finished,
            "jobs_unfinished": unfinished,
            "time_limit_s": limit_s,
            "policy": policy.name,
            "workload": args.workload,
            "cluster": scenario.cluster.describe(),
            "seed": args.seed,
            "efficiency": args.efficiency,
            "params": dataclasses.asdict(params),
            **({"lookahead": lookahead} if lookahead else {}),
        })
    table = Table(title=f"{args.workload} on {scenario.cluster.describe()} - {policy.name}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in METRIC_KEYS:
        value = metrics[key]
        table.add_row(key, metric_text(value))
    Console().print(table)
    if lookahead:
        print(f"{policy.name} left its base at {lookahead['deviations']} of the "
              f"{lookahead['contested']} decisions where the heuristics' proposals differed")
    print(f"wrote {out / 'metrics.json'}")
    if finished:
        return 0
    print(f"rlalloc: warning: {policy.name} left {unfinished} of {len(scenario.workload.jobs)} "
          f"jobs unfinished at the simulated-time limit ({limit_s:,.0f} s); the "
          "JCTs count those at their time so far (a lower bound)", file=sys.stderr)
    return UNFINISHED_EXIT_CODE


def metric_text(value: float | int) -> str:
    """A metric as the summary table shows it: whole numbers with separators from 100 on
    (11,340 s; `.4g` wrote 1.134e+04 next to 9,375), four significant digits below."""
    if isinstance(value, float) and abs(value) < 100:
        return f"{value:.4g}"
    return f"{value:,.0f}"
