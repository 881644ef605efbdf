"""`rlalloc planner fit`: the planning policy (`rlalloc.agent.planner`) fitted on past workloads.

Learns job sizes from the --workload files and keeps their jobs as the history the planner's
forks draw future arrivals from, as past days at the same time of day or, with
``--futures arrivals``, through an arrivals model fitted on them (`rlalloc.forecaster.arrivals`);
saves them with the heuristics and the horizon as a policy directory that `rlalloc evaluate`,
`simulate` and the actuator load by path.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rlalloc.agent.job_speeds import PROFILES_DIR
from rlalloc.agent.planner import ARRIVALS_FILE, FUTURES, PLANNER_FILE
from rlalloc.agent.registry import refuse_other_policy
from rlalloc.cli.argtypes import POSITIVE_INT, SEED, AppendOnce, add_out_flags, unique_names
from rlalloc.env.cluster import add_cluster_flag
from rlalloc.env.errors import UserError
from rlalloc.env.output import prepare_out_dir
from rlalloc.forecaster.signals import default_signals

if TYPE_CHECKING:
    from rlalloc.env.scenario import Scenario
    from rlalloc.forecaster.arrivals import ArrivalsModel

OUTPUT_FILES = (PLANNER_FILE, "card.md", PROFILES_DIR, ARRIVALS_FILE)
"""What `rlalloc planner fit` writes into --out."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `rlalloc planner fit`."""
    parser.add_argument("--workload", action=AppendOnce, dest="workloads", metavar="W",
                        required=True,
                        help="past workload (repeatable): its jobs' sizes are learnt and its "
                             "arrivals are the futures the planner draws; at least two, and "
                             "jobs that name their application and batch size")
    add_cluster_flag(parser)
    parser.add_argument("--base", default="elastic-srpt-0.25",
                        help="the elastic heuristic the planner follows unless a lookahead "
                             "shows another proposal is better (default elastic-srpt-0.25)")
    parser.add_argument("--alternatives", type=unique_names, default="elastic-srpt,elastic",
                        help="comma-separated elastic heuristics whose proposals are weighed "
                             "against the base's (default elastic-srpt,elastic)")
    parser.add_argument("--horizon", type=_horizon, default="1h",
                        help="how far ahead each drawn future reaches: <N>h or <N>m "
                             "(default 1h)")
    parser.add_argument("--samples", type=POSITIVE_INT, default=5,
                        help="futures drawn per contested decision; an alternative must win in "
                             "every one (default 5)")
    parser.add_argument("--futures", choices=FUTURES, default=FUTURES[0],
                        help="where the sampled futures come from: past-days, the jobs that "
                             "arrived in the next horizon at the same time of day on past days "
                             "drawn at random; arrivals, draws of an arrivals model fitted on "
                             "the --workload files whose count follows the time of day and the "
                             f"last hour's arrivals, saved as {ARRIVALS_FILE} (default "
                             f"{FUTURES[0]})")
    parser.add_argument("--seed", type=SEED, default=0, help="seed of the draws (default 0)")
    add_out_flags(parser, Path("runs/planner"))


def _horizon(text: str) -> float:
    """``1h`` or ``30m`` in seconds (`rlalloc.agent.lookahead.parse_future`'s horizons)."""
    from rlalloc.agent.lookahead import parse_future

    try:
        future = parse_future(text)
    except ValueError:
        future = None
    if future is None or future.sampled or not 0 < future.horizon_s < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a horizon such as 1h or 30m")
    return future.horizon_s


def run(args: argparse.Namespace) -> int:
    """Check the heuristics, fit the sizes, save the planner directory."""
    from rlalloc.agent.catalogue import elastic_names
    from rlalloc.agent.job_sizes import learn_sizes
    from rlalloc.agent.lookahead import refuse_more_samples_than_days
    from rlalloc.agent.planner import PlannerConfig, save_planner
    from rlalloc.env.profiles import default_profiles_root
    from rlalloc.env.scenario import build_scenario
    from rlalloc.forecaster.arrivals import fit_arrivals

    refuse_other_policy(args.out, PLANNER_FILE)
    for flag, names in (("--base", [args.base]), ("--alternatives", args.alternatives)):
        for name in names:
            if name not in elastic_names():
                raise UserError(f"{flag} {name}: the planner rebuilds its forks from the job "
                                "sizes an elastic heuristic estimates; use one of "
                                f"{', '.join(elastic_names())}")
    if not args.alternatives or args.base in args.alternatives:
        raise UserError("--alternatives: give one or more elastic heuristics other than --base "
                        f"{args.base}; the planner only ever chooses between their proposals")
    if len(args.workloads) < 2:
        raise UserError("--workload: give at least two past workloads; the planner draws "
                        "each future from a different one")
    history = {w: build_scenario(w, args.cluster, signals=default_signals())
               for w in args.workloads}
    sizes = learn_sizes(list(history.values()), f"--workload {' '.join(history)}")
    arrivals = None
    if args.futures == "arrivals":
        try:
            arrivals = fit_arrivals([s.workload.jobs for s in history.values()], args.horizon)
        except UserError as err:
            raise UserError(f"--futures arrivals: --workload {' '.join(history)}: {err}") \
                from None
    else:  # each decision draws distinct past days
        refuse_more_samples_than_days(args.samples, list(history.values()), "--workload")
    prepare_out_dir(args.out, list(OUTPUT_FILES), args.force)
    command = shlex.join(["rlalloc", *sys.argv[1:]])
    config = PlannerConfig(args.base, tuple(args.alternatives), args.horizon, args.samples,
                           args.seed, args.cluster, tuple(history), args.futures)
    try:
        save_planner(args.out, config, sizes, history, command, default_profiles_root(),
                     arrivals)
    except OSError as err:
        raise UserError(f"--out {args.out}: cannot write the planner ({err.strerror or err}); "
                        "an earlier planner there is left as it was") from err
    print(f"wrote {args.out / OUTPUT_FILES[0]} ({sizes.kind_count} job kinds, "
          f"{sum(len(s.workload.jobs) for s in history.values())} past jobs) and card.md"
          f"{_arrivals_summary(arrivals)}; {_coverage(history)}. Compare it with its base "
          "told the same sizes, on workloads W "
          "it was not fitted on (minutes per Pollux-sized workload): `rlalloc sizes fit "
          f"{' '.join(f'--workload {shlex.quote(w)}' for w in history)} --base {args.base} "
          "--out SIZED`, then `rlalloc evaluate --workload W --cluster "
          f"{shlex.quote(args.cluster)} --policies SIZED,{shlex.quote(str(args.out))} "
          "--reference SIZED --seeds 1 --failures none`")
    return 0


def _coverage(history: dict[str, Scenario]) -> str:
    """Which hours of the day the history's arrivals fall in: outside them every drawn future
    is empty and the planner sees only the jobs already submitted (a workload's time 0 is
    midnight UTC on a live cluster's clock)."""
    times = [job.submit_s % 86_400.0 for s in history.values() for job in s.workload.jobs]
    first, last = (f"{int(t // 3600)}:{int(t % 3600 // 60):02d}" for t in (min(times), max(times)))
    return (f"its futures come from arrivals between {first} and {last} of the day (UTC; a "
            "workload starts at midnight), none at other times")


def _arrivals_summary(arrivals: ArrivalsModel | None) -> str:
    """What `planner fit` says of the arrivals model it saved (nothing without one)."""
    if arrivals is None:
        return ""
    return (f", {ARRIVALS_FILE} (over {arrivals.days} past days: the next hour's count scales "
            f"as the last hour's ratio to its usual count to the power "
            f"{arrivals.recent_weight:.2f}, dispersion {arrivals.dispersion:.3f})")
