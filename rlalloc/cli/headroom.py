"""`rlalloc headroom`: what switching between heuristics could gain, with and without the future.

Runs the base heuristic alone and `rlalloc.agent.lookahead.LookaheadPolicy` over it and the
alternatives, once per future (``known``: an oracle bound; ``none``: only the jobs submitted so
far, what a live controller knows; ``1h``: the jobs arriving within the next hour, a bound
on what a one-hour demand forecast could give; ``sampled-1h``: the next hour drawn from the
--history workloads, a policy a controller could run), on each workload. With --sizes, the base
also runs told every job's remaining work where it would otherwise extrapolate it from
progress: ``known``, the simulator's own (a perfect size predictor), and/or ``learned``,
predicted from the --history workloads' jobs (`rlalloc.agent.job_sizes`). Writes DIR/headroom.json,
DIR/headroom.md (average JCT per workload and the change against the base) and
DIR/headroom.png. Failures are off, as in training: a fork would otherwise know the failure
process's future in both modes. With --record, every lookahead run also saves its decisions and the
advantages its forks measured (`rlalloc.agent.distill`), for `rlalloc train --imitate`.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlalloc.agent.job_sizes import JobSizeHistory, learn_sizes, told_sizes
from rlalloc.agent.lookahead import parse_future
from rlalloc.cli.argtypes import POSITIVE_INT, SEED, AppendOnce, add_out_flags, unique_names
from rlalloc.env.cluster import add_cluster_flag
from rlalloc.env.efficiency import add_efficiency_flag
from rlalloc.env.errors import UserError
from rlalloc.env.execution import add_ray_flag, executor_for
from rlalloc.env.output import (
    prepare_out_dir,
    staged_outputs,
    write_atomic,
    write_json,
)
from rlalloc.env.workload.loader import EMBEDDED_DEFAULT, GENERATED_SOURCES
from rlalloc.forecaster.signals import default_signals

OUTPUT_FILES = ("headroom.json", "headroom.md", "headroom.png")
"""What `rlalloc headroom` writes into --out."""
RECORDINGS_DIR = "recordings"
"""Where `--record` puts the lookahead's demonstrations, inside --out (replaced as a whole by
--force --record once every run has finished, so that an earlier run's recordings never mix
with this run's nor are lost to a stopped one; left alone without --record)."""
SIZES = ("known", "learned")
"""--sizes: where the base's job sizes come from in its extra runs, one run each."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `rlalloc headroom`."""
    parser.add_argument("--workload", action=AppendOnce, dest="workloads", metavar="W",
                        help=f"workload (repeatable, each once): CSV path, {GENERATED_SOURCES}; "
                             f"default {EMBEDDED_DEFAULT}")
    add_cluster_flag(parser)
    parser.add_argument("--base", default="elastic-srpt-0.25",
                        help="the policy followed wherever the lookahead does not deviate, "
                             "and in every fork (default elastic-srpt-0.25)")
    parser.add_argument("--alternatives", type=unique_names, default="elastic-srpt,elastic",
                        help="comma-separated policies whose proposals may be taken instead "
                             "(default elastic-srpt,elastic)")
    parser.add_argument("--futures", type=unique_names, default="known,none",
                        help="what the forks know, comma-separated: known (every later "
                             "arrival), none (only submitted jobs), a horizon of arrivals "
                             "such as 1h or 30m, or sampled-1h (the hour drawn from --history; "
                             "default known,none; may be empty with --sizes)")
    parser.add_argument("--history", action=AppendOnce, default=[], metavar="W",
                        help="workload (repeatable) whose arrivals a sampled future draws from, "
                             "e.g. the training workloads; a workload never draws from itself")
    parser.add_argument("--samples", type=POSITIVE_INT, default=5,
                        help="futures drawn per contested decision for a sampled future; a "
                             "deviation must win in each (default 5)")
    parser.add_argument("--record", action="store_true",
                        help="also save every lookahead decision as a residual-policy "
                             f"demonstration, {RECORDINGS_DIR}/<workload>--<future>.npz in --out "
                             "(for `rlalloc train --residual BASE,ALTERNATIVES --imitate`)")
    parser.add_argument("--sizes", type=unique_names, default="",
                        help="also run the base told each job's remaining work instead of "
                             "extrapolating it from progress, comma-separated: known (the "
                             "simulator's, a perfect size predictor), learned (the median size "
                             "of --history jobs with the same speed curve); an elastic base "
                             "only (default: no such run)")
    add_efficiency_flag(parser)
    parser.add_argument("--seed", type=SEED, default=0, help="workload seed (synthetic draws)")
    parser.add_argument("--jobs", type=POSITIVE_INT, default=min(2, os.cpu_count() or 1),
                        help="parallel worker processes")
    add_ray_flag(parser, "the runs (with --record, --out must be on a volume every Ray node "
                         "mounts at the same path)")
    add_out_flags(parser, Path("runs/headroom"))


@dataclass(frozen=True)
class HeadroomRun:
    """One run: the base alone (`future` None) or the lookahead with one future (its name as
    given to --futures)."""

    workload: str
    future: str | None
    base: str
    alternatives: tuple[str, ...]
    cluster: str
    seed: int
    history: tuple[str, ...] = ()
    samples: int = 0
    record: Path | None = None
    """Save the lookahead's decisions to this file (`rlalloc.agent.distill`)."""
    efficiency: str = "none"
    sizes: str = ""
    """If set, the base alone (`future` None), told job sizes this way (one of `SIZES`)."""

    def described(self) -> str:
        """The run as an error names it."""
        what = (f"sizes {self.sizes}" if self.sizes else
                f"future {self.future}" if self.future else "the base alone")
        return f"{self.base}, {what}, on {self.workload}, seed {self.seed}"

    @property
    def column(self) -> str | None:
        """This run's column of the report: its future, `sizes_column`, or None for the base."""
        return sizes_column(self.sizes) if self.sizes else self.future


def _run_one(spec: HeadroomRun) -> dict[str, float]:
    """Worker: one run's average JCT, decisions contested and deviations, wall seconds."""
    from rlalloc.agent.distill import LookaheadRecorder
    from rlalloc.agent.evaluation import run_policy
    from rlalloc.agent.lookahead import HistoryArrivals, LookaheadPolicy
    from rlalloc.agent.registry import load_policy
    from rlalloc.agent.residual import residual_featurizer
    from rlalloc.env.failures import FailureParams
    from rlalloc.env.featurizer import FeatureSpec, policy_gpu_types
    from rlalloc.env.params import SimParams
    from rlalloc.env.scenario import build_scenario

    params = SimParams(failures=FailureParams(failures_per_gpu_day=0.0))
    sim = build_scenario(spec.workload, spec.cluster, seed=spec.seed, efficiency=spec.efficiency,
                         signals=default_signals()).simulator(params, spec.seed)
    base = load_policy(spec.base)
    policy, lookahead, recorder = base, None, None
    if spec.sizes == "known":
        policy = told_sizes(spec.base, lambda state, rows: sim.remaining_work_s(
            [state.jobs.job_id[row] for row in rows.tolist()]), f"{spec.base}, sizes known")
    elif spec.sizes == "learned":
        sizes = JobSizeHistory.fit([build_scenario(w, spec.cluster, seed=spec.seed,
                                                   efficiency=spec.efficiency,
                                                   signals=default_signals())
                                    for w in history_for(spec.workload, spec.history)])
        policy = told_sizes(spec.base, sizes.remaining_work, f"{spec.base}, sizes learned")
    elif spec.future is not None:
        future = parse_future(spec.future)
        history = HistoryArrivals.of_scenarios(
            [build_scenario(w, spec.cluster, seed=spec.seed, efficiency=spec.efficiency,
                            signals=default_signals())
             for w in history_for(spec.workload, spec.history)],
            future.horizon_s, spec.samples, spec.seed) if future.sampled else None
        policy = lookahead = LookaheadPolicy(
            lambda _state: sim, base, [load_policy(name) for name in spec.alternatives], future,
            history)
        if spec.record is not None:
            # the layout `rlalloc train --imitate` builds on this cluster (`training_spec`)
            gpu_types = policy_gpu_types(sim.state().nodes.gpu_type)
            policy = recorder = LookaheadRecorder(lookahead, residual_featurizer(
                FeatureSpec(checkpoint_interval_s=params.checkpoint_interval_s,
                            gpu_types=gpu_types), (spec.base, *spec.alternatives)))
    started = time.perf_counter()
    result = run_policy(sim, policy.act)
    if not result.finished:
        raise UserError(f"{spec.workload}: the run hit the time limit with jobs unfinished; "
                        f"is --base {spec.base!r} a policy that finishes every job?")
    if recorder is not None:
        recorder.save(spec.record)
    return {"avg_jct_s": result.metrics["avg_jct_s"],
            "contested": float(lookahead.contested if lookahead else 0),
            "deviations": float(lookahead.deviations if lookahead else 0),
            "wall_s": time.perf_counter() - started}


def run(args: argparse.Namespace) -> int:
    """Validate inputs, run the base and the lookaheads on every workload, write the report."""
    from tqdm import tqdm

    from rlalloc.agent.lookahead import refuse_more_samples_than_days
    from rlalloc.agent.registry import load_policy
    from rlalloc.env.scenario import build_scenario, require_applications

    executor = executor_for(args.jobs, args.ray)  # first: a bad --ray leaves nothing behind
    alternatives = tuple(args.alternatives)
    if not alternatives:
        raise UserError("--alternatives is empty; give e.g. elastic-srpt,elastic")
    futures, sizes = args.futures, args.sizes
    if unknown := [name for name in sizes if name not in SIZES]:
        raise UserError(f"--sizes {','.join(sizes)}: {unknown[0]} is not a source of job sizes;"
                        f" use {' or '.join(SIZES)}, comma-separated")
    for future in futures or ([] if sizes else [""]):  # a column at least
        try:
            sampled = parse_future(future).sampled
        except ValueError:
            raise UserError(f"--futures {','.join(futures)!r}: {future or 'nothing'} is not a "
                            "future; use known, none, a horizon such as 1h or 30m, or "
                            "sampled-1h") from None
        if sampled and not args.history:
            raise UserError(f"--futures {future} draws arrivals from history; give the "
                            "workloads to draw from with --history W (repeatable)")
    if args.record and not any(futures):
        raise UserError("--record records the lookahead's decisions, and no --futures asks for "
                        "one; give e.g. --futures sampled-1h (a --force would have replaced "
                        "earlier recordings with none)")
    for name in (args.base, *alternatives):
        load_policy(name)  # fails fast with the list of valid names
    if sizes:
        try:
            told_sizes(args.base, None, args.base)
        except UserError as err:
            raise UserError(f"--sizes {','.join(sizes)}: --base {err}, or leave out "
                            "--sizes") from None
    if "learned" in sizes and not args.history:
        raise UserError("--sizes learned predicts sizes from past jobs; give the workloads "
                        "to learn from with --history W (repeatable)")
    workloads = args.workloads or [EMBEDDED_DEFAULT]
    built = {workload: build_scenario(workload, args.cluster, seed=args.seed,
                                      efficiency=args.efficiency, signals=default_signals())
             for workload in (*workloads, *args.history)}  # fails fast on bad input
    require_applications([built[w] for w in workloads], args.efficiency, workloads)
    if "learned" in sizes or any(parse_future(f).sampled for f in futures):
        for workload in workloads:
            if not history_for(workload, args.history):
                raise UserError(f"--history has no workload but {workload} itself, which is "
                                "never learnt or drawn from when measured; add another "
                                "--history")
            past = [built[w] for w in history_for(workload, args.history)]
            less = f"--history (less {workload}, which is measured)"
            if "learned" in sizes:  # as `sizes fit` refuses it: the table would be empty
                learn_sizes(past, less)
            if any(parse_future(f).sampled for f in futures):
                refuse_more_samples_than_days(args.samples, past, less)
    # after the checks (a refused run leaves no directory), before the runs
    prepare_out_dir(args.out, [*OUTPUT_FILES, *([RECORDINGS_DIR] if args.record else [])],
                    args.force)
    # recordings go to a hidden directory first and replace the old ones (as a whole) only once
    # every run has finished: a run stopped halfway keeps an earlier run's, as long to make
    with staged_outputs(args.out) if args.record else nullcontext() as staging:
        if staging is not None:
            (staging / RECORDINGS_DIR).mkdir()
        specs = [HeadroomRun(w, f, args.base, alternatives, args.cluster, args.seed,
                             tuple(args.history), args.samples,
                             recording_path(staging, w, f) if staging and f else None,
                             args.efficiency)
                 for w in workloads for f in (None, *futures)]
        specs += [HeadroomRun(w, None, args.base, alternatives, args.cluster, args.seed,
                              tuple(args.history), efficiency=args.efficiency, sizes=source)
                  for w in workloads for source in sizes]
        results: dict[HeadroomRun, dict[str, float]] = {}
        with tqdm(total=len(specs), desc="headroom", unit="run") as bar:
            runs = executor.map(_run_one, specs, describe=HeadroomRun.described)
            for spec, result in zip(specs, runs, strict=True):
                results[spec] = result
                bar.update()
    columns = [*futures, *map(sizes_column, sizes)]
    report = summarise(results, workloads, columns, args)
    write_json(args.out / "headroom.json", report)
    write_atomic(args.out / "headroom.md", markdown(report))
    _plot(report, args.out / "headroom.png")
    print(f"wrote {args.out / 'headroom.json'}, headroom.md and headroom.png")
    return 0


def sizes_column(sizes: str) -> str:
    """The report's column for the base told job sizes by `sizes` (`SIZES`)."""
    return f"sizes-{sizes}"


def recording_path(out: Path, workload: str, future: str) -> Path:
    """Where `--record` saves the lookahead's decisions on `workload` with `future`."""
    label = _label(workload).replace("/", "-").removesuffix(".csv").replace(":", "_")
    return out / RECORDINGS_DIR / f"{label}--{future}.npz"


def history_for(workload: str, history: Sequence[str]) -> tuple[str, ...]:
    """The --history workloads `workload` may draw its futures from: all but itself, so that
    the training workloads can be both measured and drawn from (leave one out)."""
    def key(name: str) -> str:
        path = Path(name)
        return str(path.resolve()) if path.is_file() else name
    return tuple(name for name in history if key(name) != key(workload))


def summarise(results: dict[HeadroomRun, dict[str, float]], workloads: list[str],
              columns: list[str], args: argparse.Namespace) -> dict:
    """The headroom.json document: per workload the base's average JCT and, per column (each
    future's lookahead, then `sizes_column`), its own with the change against the base; the
    same averaged over workloads under "mean"."""
    rows: dict[str, dict] = {}
    for workload in workloads:
        by_column = {spec.column: result for spec, result in results.items()
                     if spec.workload == workload}
        base_jct = by_column[None]["avg_jct_s"]
        rows[workload] = {"base_avg_jct_s": base_jct, "base_wall_s": by_column[None]["wall_s"]}
        for column in columns:
            result = dict(by_column[column])
            result["change"] = result["avg_jct_s"] / base_jct - 1.0
            rows[workload][column] = result
    mean_base = float(np.mean([row["base_avg_jct_s"] for row in rows.values()]))
    mean = {"base_avg_jct_s": mean_base}
    for column in columns:
        jct = float(np.mean([row[column]["avg_jct_s"] for row in rows.values()]))
        mean[column] = {"avg_jct_s": jct, "change": jct / mean_base - 1.0}
    return {"base": args.base, "alternatives": list(args.alternatives),
            "cluster": args.cluster, "seed": args.seed, "efficiency": args.efficiency,
            "futures": [column for column in columns if not _is_sizes(column)],
            "columns": columns,
            "history": args.history, "samples": args.samples, "workloads": rows, "mean": mean}


def _title(column: str) -> str:
    """A report column's heading."""
    if _is_sizes(column):
        return f"base, sizes {column.removeprefix('sizes-')}"
    return f"lookahead, future {column}"


def _is_sizes(column: str) -> bool:
    return column in map(sizes_column, SIZES)


def markdown(report: dict) -> str:
    """headroom.md: one row per workload and the mean, one column per future (and for known
    sizes)."""
    columns = report["columns"]
    lines = [f"# Lookahead headroom over `{report['base']}` on {report['cluster']}", "",
             _legend(report), "",
             "| workload | base alone (s) | " + " | ".join(map(_title, columns)) + " |",
             "|---|---|" + "---|" * len(columns)]
    for workload, row in report["workloads"].items():
        cells = [f"{row[c]['avg_jct_s']:,.0f} ({100 * row[c]['change']:+.1f}%)"
                 + ("" if _is_sizes(c)
                    else f", {row[c]['contested']:.0f}/{row[c]['deviations']:.0f}")
                 for c in columns]
        lines.append(f"| {_shown(workload)} | {row['base_avg_jct_s']:,.0f} | "
                     + " | ".join(cells) + " |")
    mean = report["mean"]
    cells = [f"{mean[c]['avg_jct_s']:,.0f} ({100 * mean[c]['change']:+.1f}%)" for c in columns]
    lines.append(f"| **mean** | {mean['base_avg_jct_s']:,.0f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\nPlot: headroom.png.\n"


def _legend(report: dict) -> str:
    """headroom.md's paragraph above the table: what the cells hold and what each of the
    report's columns means, and nothing about kinds of column this run did not have."""
    lookahead = any(not _is_sizes(column) for column in report["columns"])
    sentences = [f"Alternatives: {', '.join(report['alternatives'])}."] if lookahead else []
    sentences.append("Average JCT (s); in brackets the change against the base"
                     + ("; for a lookahead, then decisions where the proposals differed / where "
                        "it did not follow the base" if lookahead else "") + ".")
    sentences += [f"`{_title(column)}`: {_meaning(column, report)}."
                  for column in report["columns"]]
    return " ".join(sentences)


def _meaning(column: str, report: dict) -> str:
    """What a report column measures, for the legend."""
    history = f"{len(report['history'])} history workloads"
    if column == sizes_column("known"):
        return "the base alone, told each job's remaining work (a perfect size predictor)"
    if column == sizes_column("learned"):
        return (f"the base alone, told the median size of the jobs of the {history} with the "
                "same speed curve")
    if column == "known":
        return "forks see every later arrival (an oracle bound)"
    if column == "none":
        return "forks see only jobs already submitted"
    if parse_future(column).sampled:
        return (f"forks see the next {column.removeprefix('sampled-')}'s arrivals drawn from "
                f"{history}, {report['samples']} draws per decision")
    return f"forks see the arrivals within the next {column}"


def _shown(workload: str) -> str:
    """A workload as headroom.md and headroom.png show it: `_label` without the leading ``/``
    of a file in the working directory (`recording_path` keeps `_label`'s names)."""
    return _label(workload).removeprefix("/")


def _label(workload: str) -> str:
    """A workload's file and its folder (the load level of the Pollux sets), or its spec."""
    path = Path(workload)
    return f"{path.parent.name}/{path.name}" if path.suffix else workload


def _plot(report: dict, path: Path) -> None:
    """headroom.png: each column's avg-JCT change against the base, per workload and (as in
    headroom.md) over their mean, labelled with its value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(report["workloads"])
    columns = report["columns"]
    with_mean = len(workloads) > 1
    rows = [report["workloads"][w] for w in workloads] + ([report["mean"]] if with_mean else [])
    labels = [_shown(w) for w in workloads] + (["mean of workloads"] if with_mean else [])
    x = np.arange(len(rows))
    width = 0.8 / max(len(columns), 1)
    fig, ax = plt.subplots(figsize=(max(8.0, 1.2 * len(rows) + 4.0), 5.0), layout="constrained")
    for i, column in enumerate(columns):
        changes = [100 * row[column]["change"] for row in rows]
        bars = ax.bar(x + (i - (len(columns) - 1) / 2) * width, changes, width,
                      label=_title(column), color=f"C{i % 10}")
        ax.bar_label(bars, fmt="%+.1f%%", fontsize=7, padding=2)
    if with_mean:
        ax.axvline(len(workloads) - 0.5, color="grey", lw=0.8, ls=":")
    ax.axhline(0.0, color="black", lw=0.8)
    ax.margins(y=0.12)  # room for the value labels
    ax.set_xticks(x, labels, rotation=30, ha="right")
    ax.set_ylabel("avg JCT change against the base alone (%, lower is better)")
    kinds = [kind for kind, present in (
        ("lookahead per future", any(not _is_sizes(c) for c in columns)),
        ("base told job sizes", any(map(_is_sizes, columns)))) if present]
    ax.set_title(f"Headroom over base {report['base']}: {', '.join(kinds)}\n"
                 f"{report['cluster']}, seed {report['seed']}, no failures", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.savefig(path, dpi=120)
    plt.close(fig)
