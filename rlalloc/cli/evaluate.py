"""`rlalloc evaluate`: compare allocation policies over workloads and seeds, with 95% CIs.

Writes DIR/results.json (``mean`` and ``ci95``, the 95% confidence half-width, of every metric
per policy, over seeds x workloads, t-distribution; ``ci95`` is 0 for a single run, which has no
spread to measure, and results.md shows n/a there), DIR/results.md (a table with each policy's
change against the reference policy, --reference below), DIR/runs.csv (each run's metrics) and
plots: JCT CDF per policy, GPU utilisation and queue length over time. results.json's
``sources`` maps each label to the --policies entry it stands for (a saved model is labelled by
its directory's name, or by its path where that name is taken: see `policy_labels`). Its
``cluster`` is --cluster as given; ``cluster_file`` records a cluster YAML's content as it was
used (`rlalloc.env.cluster.cluster_record`; null for NODESxGPUS), and results.md shows it. Its
``seeds_repeat`` maps each policy to the workloads on which its every seed gave the same run
(`repeated_runs`): its CIs and paired counts take those runs once (`distinct_runs`), while
the means still weigh every (workload, seed) alike (`confidence`), and results.md says so
under its table. Its ``lookahead`` gives each lookahead policy's (a planner's, `rlalloc planner
fit`) contested decisions and deviations from its base, summed over its runs
(`lookahead_totals`; results.md has a line per such policy). Its ``runs_unfinished`` and
``runs_given_up`` count, per policy, the runs that ended with jobs unfinished and those of them
given up as hopeless next to static (``--give-up-factor``, saved as ``give_up_factor``), which
runs.csv marks run by run. All of these files replace an earlier run's together or not at all
(`write_report`).

Both also hold a *paired* comparison against a reference policy (``--reference``): each run's
change against the reference's run on the same workload and seed. Workloads differ far more
from each other than close policies do, so the unpaired CIs of two good policies overlap even
where one is better on every run; the paired CI and the count of runs won answer "is A better
than B here" directly (plot: paired_avg_jct.png). With several workloads, the average JCT's
change per workload too (``paired.avg_jct_by_workload``, a table in results.md).

Runs go to parallel worker processes (one per core by default): one run is seconds of pure
Python, far more than the cost of a process. With ``--ray``, they are the tasks of a Ray
cluster instead (`rlalloc.env.execution`), with the same results.

The runs, their statistics, the report and its plots are the agent layer's
(`rlalloc.agent.comparison_runs`, `comparison_stats`, `comparison_report`,
`comparison_plots`); this module reads the flags, checks them and runs the runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rlalloc.agent.comparison_report import OUTPUT_FILES, RUNS_CSV, write_report
from rlalloc.agent.comparison_runs import RunSpec, policy_and_mode, run_one
from rlalloc.agent.comparison_stats import paired_changes, summarise
from rlalloc.agent.evaluation import DECISIONS_PER_FACTOR, GIVE_UP_FACTOR
from rlalloc.cli.argtypes import (
    POSITIVE_INT,
    AppendOnce,
    add_out_flags,
    unique_names,
    zero_or_at_least,
)
from rlalloc.env.cluster import add_cluster_flag, cluster_record
from rlalloc.env.efficiency import add_efficiency_flag
from rlalloc.env.errors import UserError
from rlalloc.env.execution import add_ray_flag, executor_for
from rlalloc.env.output import out_dir_for_run
from rlalloc.env.workload.loader import EMBEDDED_DEFAULT, GENERATED_SOURCES
from rlalloc.forecaster.signals import default_signals

if TYPE_CHECKING:
    from rlalloc.env.scenario import Scenario

DEFAULT_POLICIES = ("static,tiresias,elastic,reactive,proactive,elastic-srpt,elastic-srpt-0.25,"
                    "ppo,dqn")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `rlalloc evaluate`."""
    parser.add_argument("--workload", action=AppendOnce, dest="workloads", metavar="W",
                        help=f"workload (repeatable, each once): CSV path, {GENERATED_SOURCES}; "
                             f"default {EMBEDDED_DEFAULT} (the embedded generator)")
    add_cluster_flag(parser)
    parser.add_argument("--policies", type=unique_names, default=DEFAULT_POLICIES,
                        help="comma-separated built-in names or saved-model directories, each "
                             "once "
                             f"(default {DEFAULT_POLICIES}); NAME@MODE runs one under another "
                             "--efficiency, e.g. tiresias@fixed,elastic@adaptive as Pollux "
                             "compared them")
    parser.add_argument("--seeds", type=POSITIVE_INT, default=3,
                        help="seeds per workload (failure process; synthetic draws too; "
                             "default: %(default)s)")
    parser.add_argument("--failures", default="default",
                        help="failures per GPU-day or none|default|stress (default: default)")
    add_efficiency_flag(parser)
    parser.add_argument("--reference", default=None, metavar="POLICY",
                        help="policy of --policies every other is compared with run by run, "
                             "as given there or by its label in results.md (default: static if "
                             "listed, else the first)")
    parser.add_argument("--give-up-factor", type=zero_or_at_least(1.0),
                        default=GIVE_UP_FACTOR, metavar="F",
                        help="give a run up, as unfinished, once it is sure to exceed F x "
                             "static's average JCT on the same workload and seed, a job has "
                             "waited F x static's longest JCT, or it has taken "
                             f"{DECISIONS_PER_FACTOR} x F x static's decision points; 0: run to "
                             "the time limit (default: %(default)s)")
    parser.add_argument("--jobs", type=POSITIVE_INT, default=min(2, os.cpu_count() or 1),
                        help="parallel worker processes")
    add_ray_flag(parser, "the runs")
    add_out_flags(parser, Path("runs/evaluate"))


def policy_labels(policies: list[str], efficiency: str) -> dict[str, str]:
    """Each --policies entry's label in the report: its policy's name (a saved model's
    directory name) and any ``@MODE``, or, where such labels would pass for other policies,
    every entry as given: two entries sharing a label, or a saved model named like a
    built-in (``runs/ppo`` is not the shipped ``ppo``). Loading each policy here fails fast,
    with the list of valid names."""
    from rlalloc.agent.catalogue import builtin_names
    from rlalloc.agent.registry import load_policy

    labels, misleading = {}, False
    for entry in policies:
        policy, _ = policy_and_mode(entry, efficiency)
        name = load_policy(policy).name
        labels[entry] = name + entry[len(policy):]
        misleading |= name != policy and name in builtin_names()
    if misleading or len(set(labels.values())) < len(labels):
        return {entry: entry for entry in policies}
    return labels


def run(args: argparse.Namespace) -> int:
    """Validate inputs, run every (policy, workload, seed) and write the report."""
    from tqdm import tqdm

    from rlalloc.env.failures import parse_failure_rate
    from rlalloc.env.scenario import build_scenario, require_applications

    executor = executor_for(args.jobs, args.ray)  # first: a bad --ray leaves nothing behind
    policies = args.policies
    if not policies:
        raise UserError("--policies is empty; give e.g. static,elastic,ppo")
    names = policy_labels(policies, args.efficiency)
    modes = {policy_and_mode(entry, args.efficiency)[1] for entry in policies}
    reference = args.reference or ("static" if "static" in policies else policies[0])
    by_label = {name: entry for entry, name in names.items()}  # results.md names a saved
    reference = by_label.get(reference, reference)  # policy by its label: that is accepted too
    if reference not in policies:
        raise UserError(f"--reference {reference}: not among --policies ({', '.join(policies)}); "
                        "name one of them")
    workloads = args.workloads or [EMBEDDED_DEFAULT]
    scenarios = {}
    for mode in sorted(modes):  # fails fast on a bad workload, cluster, profile or mode
        scenarios[mode] = {workload: build_scenario(workload, args.cluster, seed=0,
                                                    efficiency=mode, signals=default_signals())
                           for workload in workloads}
        require_applications(list(scenarios[mode].values()), mode, workloads)
    warnings = (_planner_warnings(policies, workloads, args.cluster, scenarios.get("none"))
                + _size_table_warnings(policies, scenarios, args.efficiency))
    for warning in warnings:
        print(f"rlalloc: warning: {warning}", file=sys.stderr)
    cluster_file = cluster_record(args.cluster)  # the path alone dangles once the file moves
    rate = parse_failure_rate(args.failures)
    # after the checks (a refused run leaves no directory), before hours of runs; a stopped
    # run leaves no new directory behind
    with out_dir_for_run(args.out, list(OUTPUT_FILES), args.force):
        seeds = list(range(args.seeds))
        specs = [RunSpec(p, w, s, args.cluster, rate, args.efficiency, args.give_up_factor)
                 for p in policies for w in workloads for s in seeds]
        results: dict[RunSpec, dict] = {}
        with tqdm(total=len(specs), desc="evaluate", unit="run") as bar:
            runs = executor.map(run_one, specs, describe=RunSpec.described)
            for spec, result in zip(specs, runs, strict=True):
                results[spec] = result
                bar.update()
        report = summarise(results, names, workloads, seeds, args.cluster, args.failures,
                           args.efficiency)
        report["cluster_file"] = cluster_file
        report["give_up_factor"] = args.give_up_factor
        report["warnings"] = warnings
        report["paired"] = paired_changes(results, names, reference)
        write_report(report, results, names, args.out, reference)
    print(f"wrote {args.out / 'results.json'}, results.md, {RUNS_CSV} and plots")
    return 0


def _size_table_warnings(policies: list[str], scenarios: dict[str, dict[str, Scenario]],
                         efficiency: str) -> list[str]:
    """A line per size-told policy among `policies` whose table knows none of the jobs of
    some workload (`scenarios`: by efficiency mode, then workload): it then runs as its base
    heuristic there, which its label would hide."""
    from rlalloc.agent.registry import told_size_table

    warnings = []
    for entry in policies:
        policy, mode = policy_and_mode(entry, efficiency)
        table = told_size_table(policy)
        unknown = [] if table is None else [
            workload for workload, scenario in scenarios[mode].items()
            if any(job.application for job in scenario.workload.jobs)
            and not table.known_jobs(scenario)]
        if unknown:
            why = (f" (under --efficiency {mode} a job shows its goodput curve, which a table "
                   "fitted by `rlalloc sizes fit` or `train --learn-sizes` never holds)"
                   if mode != "none" else "")
            warnings.append(f"{entry}: its size table knows none of the jobs of "
                            f"{', '.join(unknown)}{why}, so it runs there as the heuristic "
                            "it is told sizes for, without them")
    return warnings


def _planner_warnings(policies: list[str], workloads: list[str], cluster: str,
                      plain: dict[str, Scenario] | None = None) -> list[str]:
    """A line per planner directory among `policies` that draws its futures from one of the
    evaluated `workloads` (`rlalloc.agent.planner.drawn_from`): its score there is flattered.
    `plain`: the workloads' scenarios without efficiency where already built (by workload)."""
    from rlalloc.agent.planner import PLANNER_FILE, drawn_from
    from rlalloc.env.scenario import build_scenario

    planners = [entry for entry in policies
                if (Path(policy_and_mode(entry, "none")[0]) / PLANNER_FILE).is_file()]
    if not planners:
        return []
    scenarios = plain or {w: build_scenario(w, cluster, seed=0, signals=default_signals())
                          for w in workloads}
    warnings = []
    for entry in planners:
        if own := drawn_from(Path(policy_and_mode(entry, "none")[0]), scenarios):
            warnings.append(f"{entry} was fitted on {', '.join(own)}: it draws its futures "
                            "from that workload's own arrivals, next hour included, so its "
                            "score there is flattered; compare it on workloads it was not "
                            "fitted on")
    return warnings
