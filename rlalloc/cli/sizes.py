"""`rlalloc sizes fit`: an elastic heuristic, or `sia`, told job sizes learnt from past workloads.

Fits `rlalloc.agent.job_sizes.JobSizeHistory` on the --workload files (the cluster's past jobs) and
saves it with the --base heuristic as a policy directory that `rlalloc evaluate`, `simulate`
and the actuator load by path. `rlalloc headroom --sizes known|learned` is the measurement
behind it: what knowing each job's size is worth over estimating it from progress.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from rlalloc.agent.job_speeds import PROFILES_DIR
from rlalloc.agent.registry import refuse_other_policy
from rlalloc.agent.sized_policy import SIZES_FILE
from rlalloc.cli.argtypes import AppendOnce, add_out_flags
from rlalloc.env.cluster import add_cluster_flag
from rlalloc.env.efficiency import add_efficiency_flag
from rlalloc.env.errors import UserError
from rlalloc.env.output import prepare_out_dir
from rlalloc.forecaster.signals import default_signals

OUTPUT_FILES = (SIZES_FILE, "card.md", PROFILES_DIR)
"""What `rlalloc sizes fit` writes into --out."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `rlalloc sizes fit`."""
    parser.add_argument("--workload", action=AppendOnce, dest="workloads", metavar="W",
                        required=True,
                        help="past workload to learn job sizes from (repeatable): a CSV whose "
                             "jobs name their application and batch size")
    add_cluster_flag(parser)
    parser.add_argument("--base", default="elastic-srpt-0.25",
                        help="the heuristic the sizes inform: an elastic one, or sia (its "
                             "program weights jobs by their rank in remaining work) "
                             "(default elastic-srpt-0.25)")
    parser.add_argument("--speeds", choices=("profiles", "curves"), default="profiles",
                        help="what the heuristic ranks growth by: the measured profiles of the "
                             "jobs' applications, copied into --out where found (default), or "
                             "the state's fitted speed-up curves (sizes alone, to compare); "
                             "sia plans on each GPU type's speeds in the state either way")
    add_efficiency_flag(parser)
    add_out_flags(parser, Path("runs/sizes"))


def run(args: argparse.Namespace) -> int:
    """Fit the size table, refuse a useless one, save the policy directory."""
    from rlalloc.agent.job_sizes import SIA, SIA_SPEEDS, learn_sizes, told_sizes
    from rlalloc.agent.sized_policy import save_sized_policy
    from rlalloc.env.profiles import default_profiles_root
    from rlalloc.env.scenario import build_scenario

    refuse_other_policy(args.out, SIZES_FILE)
    try:
        told_sizes(args.base, None, args.base)
    except UserError as err:
        raise UserError(f"--base {err}") from None
    if args.efficiency != "none" and args.base != SIA and args.speeds == "profiles":
        raise UserError(f"--efficiency {args.efficiency} --speeds profiles: the copied profiles "
                        "give step rates, not the goodput jobs train at under statistical "
                        "efficiency; use --speeds curves (or --base sia)")
    sizes = learn_sizes([build_scenario(w, args.cluster, signals=default_signals(),
                                        efficiency=args.efficiency)
                         for w in args.workloads],
                        f"--workload {' '.join(args.workloads)}")
    prepare_out_dir(args.out, list(OUTPUT_FILES), args.force)
    command = shlex.join(["rlalloc", *sys.argv[1:]])
    try:
        copied = save_sized_policy(args.out, args.base, sizes, args.workloads, command,
                                   args.cluster,
                                   default_profiles_root() if args.speeds == "profiles" else None)
    except OSError as err:
        raise UserError(f"--out {args.out}: cannot write the size table ({err.strerror or err});"
                        " an earlier one there is left as it was") from err
    print(f"wrote {args.out / OUTPUT_FILES[0]} ({sizes.kind_count} job kinds, "
          f"{sizes.past_jobs} past jobs) and card.md, "
          f"{SIA_SPEEDS if args.base == SIA else _speeds_line(copied, args.out)}; "
          "compare it with its base on "
          "workloads W it was not fitted on (of those it was, it has seen every job): "
          "`rlalloc evaluate --workload W [--workload W2 ...] --cluster "
          f"{shlex.quote(args.cluster)} --policies {args.base},{shlex.quote(str(args.out))} "
          f"--reference {args.base}"
          f"{'' if args.efficiency == 'none' else ' --efficiency ' + args.efficiency}`")
    return 0


def _speeds_line(copied: list[str], out: Path) -> str:
    """What the saved heuristic ranks growth by: the `copied` profiles, or the curves alone."""
    return (f"speed-ups from the profiles of {', '.join(copied)} ({out / PROFILES_DIR})"
            if copied else "speed-ups from the state's curves")
