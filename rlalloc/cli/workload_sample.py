"""`rlalloc workload sample`: write new workloads drawn from the Philly trace the way the Pollux
authors drew theirs (`rlalloc.env.workload.pollux_sampler`, the default) or the Sia authors
(``--method sia``, `rlalloc.env.workload.sia_sampler`), e.g. to train a policy on more than the
few published ones."""

from __future__ import annotations

import argparse
import functools
import os
from collections import Counter
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

from rlalloc.cli.argtypes import POSITIVE_INT, add_out_flags, within
from rlalloc.env.errors import UserError
from rlalloc.env.execution import add_ray_flag, executor_for
from rlalloc.env.output import prepare_out_dir, write_atomic
from rlalloc.env.profiles import PROFILES_ENV_VAR, profiles_or_default
from rlalloc.env.workload.pollux_sampler import (
    SampleConfig,
    model_configurations,
    read_philly_pool,
    sample_workload,
)
from rlalloc.env.workload.sia_sampler import (
    SiaSampleConfig,
    sample_sia_workload,
    sia_model_configurations,
)
from rlalloc.env.workload.table import MAX_SUBMIT_S, reject_directory

METHODS = ("pollux", "sia")
"""Sampling methods: Pollux's (OSDI'21) and Sia's (SOSP'23), by their authors' name."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `rlalloc workload sample`."""
    parser.add_argument("--method", choices=METHODS, default="pollux",
                        help="whose method: pollux (models by GPU-time incl. ncf, 4-GPU nodes, "
                             "a time-of-day window on any day) or sia (no ncf, configurations "
                             "priced on RTX 2080 Ti 8-GPU nodes, one window --window-start hours "
                             "into the trace; see docs/workloads.md) (default: %(default)s)")
    parser.add_argument("--philly", type=Path, required=True,
                        help="the Pollux artifact's philly.csv (timestamp,duration,num_gpus,"
                             "gpu_time,...)")
    parser.add_argument("--profiles", type=Path, default=None,
                        help=f"Pollux app_profiles folder (default: ${PROFILES_ENV_VAR} or the "
                             "Pollux profiles rlalloc ships)")
    parser.add_argument("--seeds", default="0",
                        help="seeds to draw, one workload each: S, S1,S2,... or FIRST-LAST "
                             "(default: %(default)s)")
    parser.add_argument("--num-jobs", type=POSITIVE_INT, default=SampleConfig.num_jobs,
                        help="jobs per workload: 160 as Pollux's workloads/, 240 as its "
                             "workloads-1.5/ (default: %(default)s)")
    parser.add_argument("--start-hour", type=within(0, 23, int), default=None,
                        help="pollux: hour of day the submission window opens (default: "
                             f"{SampleConfig.start_hour})")
    parser.add_argument("--window-start", type=within(0, MAX_SUBMIT_S // 3600, int),
                        default=None, metavar="HOURS",
                        help="sia (required): the submission window opens this many hours after "
                             "the trace's first job (the trace's first weeks hold few jobs)")
    parser.add_argument("--hours", type=within(1, 24, int), default=SampleConfig.hours,
                        help="length of the submission window in hours (default: %(default)s)")
    parser.add_argument("--jobs", type=POSITIVE_INT, default=min(2, os.cpu_count() or 1),
                        help="parallel worker processes")
    add_ray_flag(parser, "the draws (--philly must be at the same path on every node)")
    add_out_flags(parser, Path("runs/workloads"))


MAX_SEEDS = 10_000
"""Most workloads one `workload sample` writes (a file each): a range of 10^8 seeds built its
list in 12 GB before writing anything."""


def parse_seeds(text: str) -> list[int]:
    """`--seeds` value: ``S``, ``S1,S2,...`` or ``FIRST-LAST`` (inclusive), at most
    `MAX_SEEDS` of them."""
    try:
        if "-" in text.strip("-"):
            first, last = (int(part) for part in text.split("-", 1))
            if last - first >= MAX_SEEDS:
                raise UserError(f"--seeds {text!r}: {last - first + 1:,} seeds, at most "
                                f"{MAX_SEEDS:,} in one run; split the range")
            seeds = list(range(first, last + 1))
        else:
            seeds = [int(part) for part in text.split(",")]
    except ValueError:
        seeds = []
    if len(seeds) > MAX_SEEDS:
        raise UserError(f"--seeds {text[:40]!r}...: {len(seeds):,} seeds, at most {MAX_SEEDS:,} "
                        "in one run; split the list")
    if not seeds or min(seeds) < 0:
        raise UserError(f"--seeds {text!r}: give S, S1,S2,... or FIRST-LAST with seeds >= 0 "
                        "and FIRST <= LAST")
    repeated = sorted(seed for seed, count in Counter(seeds).items() if count > 1)
    if repeated:
        raise UserError(f"--seeds {text!r}: {', '.join(map(str, repeated))} given more than "
                        "once; name each seed once (a seed always draws the same workload)")
    return seeds


def run(args: argparse.Namespace) -> int:
    """Write DIR/sampled-<seed>.csv (Pollux's method) or DIR/sia-<seed>.csv (Sia's) for every
    seed, in the Pollux workload format."""
    from tqdm import tqdm

    executor = executor_for(args.jobs, args.ray)  # first: a bad --ray leaves nothing behind
    seeds = parse_seeds(args.seeds)
    check_window_flags(args)
    reject_directory(args.philly, "--philly needs a file: the Pollux artifact's philly.csv")
    if args.profiles is not None and not args.profiles.is_dir():
        raise UserError(f"--profiles {args.profiles}: no such folder; give a Pollux app_profiles "
                        "directory, or leave --profiles out for the shipped Pollux profiles")
    profiles = profiles_or_default(args.profiles)
    if args.method == "sia":
        options_of = sia_model_configurations(profiles)
    else:
        options_of = model_configurations(profiles)
    prefix = "sia" if args.method == "sia" else "sampled"
    names = [f"{prefix}-{seed}.csv" for seed in seeds]
    start = args.window_start if args.method == "sia" else (
        SampleConfig.start_hour if args.start_hour is None else args.start_hour)
    draws = [Draw(args.method, args.philly.resolve(), options_of, seed, args.num_jobs, start,
                  args.hours) for seed in seeds]
    # the first here: a bad trace, or a window with too few jobs for any seed, fails before a
    # directory is made
    first = draw_workload(draws[0])
    out = prepare_out_dir(args.out, names, args.force)
    with tqdm(total=len(draws), desc="sample", unit="workload") as bar:
        drawn = chain([first], executor.map(draw_workload, draws[1:], Draw.described))
        for name, csv in zip(names, drawn, strict=True):
            write_atomic(out / name, csv)
            bar.update()
    print(f"wrote {len(names)} workload(s) of {args.num_jobs} jobs to {out}/{prefix}-*.csv")
    return 0


@dataclass(frozen=True)
class Draw:
    """One workload to draw: `method`'s sampler on the Philly trace at `philly`, its models'
    configurations `options_of`, with `seed`; `start` is the window's opening (an hour of day
    for Pollux's method, hours into the trace for Sia's)."""

    method: str
    philly: Path
    options_of: dict[str, list[tuple[int, int]]]
    seed: int
    num_jobs: int
    start: int
    hours: int

    def described(self) -> str:
        """The draw as an error names it."""
        return f"{self.method} workload, seed {self.seed}"


def draw_workload(draw: Draw) -> str:
    """Worker: the CSV text of the workload `draw` names (the trace read once per process)."""
    pool = _philly_pool(draw.philly)
    if draw.method == "sia":
        workload = sample_sia_workload(pool, draw.options_of, SiaSampleConfig(
            start_hour=draw.start, num_jobs=draw.num_jobs, hours=draw.hours, seed=draw.seed))
    else:
        workload = sample_workload(pool, draw.options_of, SampleConfig(
            num_jobs=draw.num_jobs, start_hour=draw.start, hours=draw.hours, seed=draw.seed))
    return workload.to_csv(index=False)


_philly_pool = functools.cache(read_philly_pool)


def check_window_flags(args: argparse.Namespace) -> None:
    """One-line `UserError` where the window flags do not fit `--method`: Pollux's window opens
    at an hour of day (``--start-hour``), Sia's at hours into the trace (``--window-start``)."""
    if args.method == "sia" and args.window_start is None:
        raise UserError("--method sia needs --window-start HOURS: the window opens that many "
                        "hours after the trace's first job (its first weeks hold few jobs; "
                        "see docs/workloads.md)")
    if args.method == "sia" and args.start_hour is not None:
        raise UserError("--start-hour is Pollux's hour of day; with --method sia give "
                        "--window-start HOURS after the trace's first job")
    if args.method == "pollux" and args.window_start is not None:
        raise UserError("--window-start is Sia's window (--method sia); Pollux's opens at "
                        "--start-hour each day")
