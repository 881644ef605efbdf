"""`rlalloc headroom`: what switching between heuristics could gain, with and without the future.

Runs the base heuristic alone and `agent.lookahead.LookaheadPolicy` over it and the
alternatives, once per future (``known``: an oracle bound; ``none``: only the jobs submitted so
far, what a live controller knows; ``1h``: the jobs arriving within the next hour, a bound
on what a one-hour demand forecast could give; ``sampled-1h``: the next hour drawn from the
--history workloads, a policy a controller could run), on each workload. Writes DIR/headroom.json,
DIR/headroom.md (average JCT per workload and the change against the base) and
DIR/headroom.png. Failures are off, as in training: a fork would otherwise know the failure
process's future in both modes. With --record, every lookahead run also saves its decisions and the
advantages its forks measured (`agent.distill`), for `rlalloc train --imitate`.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agent.lookahead import parse_future
from env.efficiency import add_efficiency_flag
from env.errors import UserError
from env.output import add_out_flags, prepare_out_dir, write_atomic, write_json
from env.workload.loader import EMBEDDED_DEFAULT

OUTPUT_FILES = ("headroom.json", "headroom.md", "headroom.png")
"""What `rlalloc headroom` writes into --out."""
RECORDINGS_DIR = "recordings"
"""Where `--record` puts the lookahead's demonstrations, inside --out."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `rlalloc headroom`."""
    parser.add_argument("--workload", action="append", dest="workloads", metavar="W",
                        help="workload (repeatable): CSV path or synthetic[:N[:LOAD[:MAX_HOURS]]]; "
                             f"default {EMBEDDED_DEFAULT}")
    parser.add_argument("--cluster", default="16x4", help="cluster spec, e.g. 16x4")
    parser.add_argument("--base", default="elastic-srpt-0.25",
                        help="the policy followed wherever the lookahead does not deviate, "
                             "and in every fork (default elastic-srpt-0.25)")
    parser.add_argument("--alternatives", default="elastic-srpt,elastic",
                        help="comma-separated policies whose proposals may be taken instead")
    parser.add_argument("--futures", default="known,none",
                        help="what the forks know, comma-separated: known (every later "
                             "arrival), none (only submitted jobs), a horizon of arrivals "
                             "such as 1h or 30m, or sampled-1h (the hour drawn from --history; "
                             "default known,none)")
    parser.add_argument("--history", action="append", default=[], metavar="W",
                        help="workload (repeatable) whose arrivals a sampled future draws from, "
                             "e.g. the training workloads; a workload never draws from itself")
    parser.add_argument("--samples", type=int, default=5,
                        help="futures drawn per contested decision for a sampled future; a "
                             "deviation must win in each (default 5)")
    parser.add_argument("--record", action="store_true",
                        help="also save every lookahead decision as a residual-policy "
                             f"demonstration, {RECORDINGS_DIR}/<workload>--<future>.npz in --out "
                             "(for `rlalloc train --residual BASE,ALTERNATIVES --imitate`)")
    add_efficiency_flag(parser)
    parser.add_argument("--seed", type=int, default=0, help="workload seed (synthetic draws)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="parallel worker processes")
    add_out_flags(parser, Path("results/headroom"))


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
    """Save the lookahead's decisions to this file (`agent.distill`)."""
    efficiency: str = "none"


def _run_one(spec: HeadroomRun) -> dict[str, float]:
    """Worker: one run's average JCT, decisions contested and deviations, wall seconds."""
    from agent.distill import LookaheadRecorder
    from agent.evaluation import run_policy
    from agent.lookahead import HistoryArrivals, LookaheadPolicy
    from agent.registry import load_policy
    from agent.residual import residual_featurizer
    from env.failures import FailureParams
    from env.featurizer import FeatureSpec
    from env.params import SimParams
    from env.scenario import build_scenario

    params = SimParams(failures=FailureParams(failures_per_gpu_day=0.0))
    sim = build_scenario(spec.workload, spec.cluster, seed=spec.seed,
                         efficiency=spec.efficiency).simulator(params, spec.seed)
    base = load_policy(spec.base)
    policy, lookahead, recorder = base, None, None
    if spec.future is not None:
        future = parse_future(spec.future)
        history = HistoryArrivals(
            [build_scenario(w, spec.cluster, seed=spec.seed, efficiency=spec.efficiency)
             for w in history_for(spec.workload, spec.history)],
            future.horizon_s, spec.samples, spec.seed) if future.sampled else None
        policy = lookahead = LookaheadPolicy(
            sim, base, [load_policy(name) for name in spec.alternatives], future, history)
        if spec.record is not None:
            policy = recorder = LookaheadRecorder(lookahead, residual_featurizer(
                FeatureSpec(checkpoint_interval_s=params.checkpoint_interval_s),
                (spec.base, *spec.alternatives)))
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

    from agent.registry import load_policy
    from env.scenario import build_scenario

    prepare_out_dir(args.out, [*OUTPUT_FILES, *([RECORDINGS_DIR] if args.record else [])],
                    args.force)
    alternatives = tuple(name.strip() for name in args.alternatives.split(",") if name.strip())
    if not alternatives:
        raise UserError("--alternatives is empty; give e.g. elastic-srpt,elastic")
    futures = [name.strip() for name in args.futures.split(",") if name.strip()]
    for future in futures or [""]:
        try:
            sampled = parse_future(future).sampled
        except ValueError:
            raise UserError(f"--futures {args.futures!r}: {future or 'nothing'} is not a "
                            "future; use known, none, a horizon such as 1h or 30m, or "
                            "sampled-1h") from None
        if sampled and not args.history:
            raise UserError(f"--futures {future} draws arrivals from history; give the "
                            "workloads to draw from with --history W (repeatable)")
    if args.samples < 1:
        raise UserError(f"--samples {args.samples}: draw at least 1 future per decision")
    for name in (args.base, *alternatives):
        load_policy(name)  # fails fast with the list of valid names
    workloads = args.workloads or [EMBEDDED_DEFAULT]
    for workload in (*workloads, *args.history):
        build_scenario(workload, args.cluster, seed=args.seed,
                       efficiency=args.efficiency)  # fails fast on bad input
    if any(parse_future(f).sampled for f in futures):
        for workload in workloads:
            if not history_for(workload, args.history):
                raise UserError(f"--history has no workload but {workload} itself, whose own "
                                "future a sampled future must not draw; add another --history")
    specs = [HeadroomRun(w, f, args.base, alternatives, args.cluster, args.seed,
                         tuple(args.history), args.samples,
                         recording_path(args.out, w, f) if args.record and f else None,
                         args.efficiency)
             for w in workloads for f in (None, *futures)]
    results: dict[HeadroomRun, dict[str, float]] = {}
    with tqdm(total=len(specs), desc="headroom", unit="run") as bar, \
            ProcessPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        for spec, result in zip(specs, pool.map(_run_one, specs), strict=True):
            results[spec] = result
            bar.update()
    report = summarise(results, workloads, futures, args)
    write_json(args.out / "headroom.json", report)
    write_atomic(args.out / "headroom.md", markdown(report))
    _plot(report, args.out / "headroom.png")
    print(f"wrote {args.out / 'headroom.json'}, headroom.md and headroom.png")
    return 0


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
              futures: list[str], args: argparse.Namespace) -> dict:
    """The headroom.json document: per workload the base's average JCT and each lookahead's,
    with its change against the base; the same averaged over workloads under "mean"."""
    rows: dict[str, dict] = {}
    for workload in workloads:
        by_future = {spec.future: result for spec, result in results.items()
                     if spec.workload == workload}
        base_jct = by_future[None]["avg_jct_s"]
        rows[workload] = {"base_avg_jct_s": base_jct, "base_wall_s": by_future[None]["wall_s"]}
        for future in futures:
            result = dict(by_future[future])
            result["change"] = result["avg_jct_s"] / base_jct - 1.0
            rows[workload][future] = result
    mean_base = float(np.mean([row["base_avg_jct_s"] for row in rows.values()]))
    mean = {"base_avg_jct_s": mean_base}
    for future in futures:
        jct = float(np.mean([row[future]["avg_jct_s"] for row in rows.values()]))
        mean[future] = {"avg_jct_s": jct, "change": jct / mean_base - 1.0}
    return {"base": args.base, "alternatives": args.alternatives.split(","),
            "cluster": args.cluster, "seed": args.seed, "efficiency": args.efficiency,
            "futures": futures,
            "history": args.history, "samples": args.samples, "workloads": rows, "mean": mean}


def markdown(report: dict) -> str:
    """headroom.md: one row per workload and the mean, one column per future."""
    futures = report["futures"]
    lines = [f"# Lookahead headroom over `{report['base']}` on {report['cluster']}", "",
             f"Alternatives: {', '.join(report['alternatives'])}. Average JCT (s); in brackets "
             "the change against the base; then decisions where the proposals differed / "
             "where the lookahead did not follow the base. `known`: forks see every later "
             "arrival (an oracle bound); `none`: only jobs already submitted; a horizon "
             "(`1h`): the arrivals within it; `sampled-1h`: the hour's arrivals drawn from "
             f"{len(report['history'])} history workloads, {report['samples']} draws per "
             "decision.", "",
             "| workload | base | " + " | ".join(f"lookahead, future {f}" for f in futures)
             + " |", "|---|---|" + "---|" * len(futures)]
    for workload, row in report["workloads"].items():
        cells = [f"{row[f]['avg_jct_s']:,.0f} ({100 * row[f]['change']:+.1f}%), "
                 f"{row[f]['contested']:.0f}/{row[f]['deviations']:.0f}" for f in futures]
        lines.append(f"| {_label(workload)} | {row['base_avg_jct_s']:,.0f} | "
                     + " | ".join(cells) + " |")
    mean = report["mean"]
    cells = [f"{mean[f]['avg_jct_s']:,.0f} ({100 * mean[f]['change']:+.1f}%)" for f in futures]
    lines.append(f"| **mean** | {mean['base_avg_jct_s']:,.0f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\nPlot: headroom.png.\n"


def _label(workload: str) -> str:
    """A workload's file and its folder (the load level of the Pollux sets), or its spec."""
    path = Path(workload)
    return f"{path.parent.name}/{path.name}" if path.suffix else workload


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(report["workloads"])
    futures = report["futures"]
    x = np.arange(len(workloads))
    width = 0.8 / max(len(futures), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(workloads) + 2), 4.5))
    for i, future in enumerate(futures):
        changes = [100 * report["workloads"][w][future]["change"] for w in workloads]
        ax.bar(x + (i - (len(futures) - 1) / 2) * width, changes, width,
               label=f"future {future}")
    ax.axhline(0.0, color="black", lw=0.8)
    ax.set_xticks(x, [_label(w) for w in workloads], rotation=30, ha="right")
    ax.set_ylabel(f"average JCT change vs {report['base']} (%)")
    ax.set_title("One-step lookahead over heuristics")
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
