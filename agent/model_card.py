"""A training run's model card: the evaluations card.json records, and card.md from it."""

from __future__ import annotations

import math
from pathlib import Path

from rlalloc.agent.job_speeds import PROFILES_DIR
from rlalloc.env.cluster import cluster_markdown

CARD_FILE = "card.json"
CARD_MD_FILE = "card.md"


def card_markdown(summary: dict) -> str:
    """A readable model card from the training summary (card.json holds the same facts)."""
    config = summary["config"]
    cluster_file = summary.get("cluster_file")  # cards of older rlalloc versions lack it
    shape = f" ({cluster_file['shape']}, the file as used is below)" if cluster_file else ""
    lines = [
        f"# {config['algo'].upper()} allocation policy",
        "",
        f"- command: `{config['extra'].get('command', '(API call)')}`",
        *(f"- earlier command (resumed by the one above): `{command}`"
          for command in reversed(config["extra"].get("earlier_commands", []))),
        f"- workloads: {', '.join(Path(w).name for w in config['workloads'])}",
        f"- cluster: {config['cluster']}{shape}; failures: {config['failures']}; "
        f"efficiency: {config.get('efficiency', 'none')}; seed {config['seed']}",
        f"- RL timesteps: {summary['timesteps']:,}; wall time {summary['wall_s']:.0f} s "
        f"(2-core machine, 1 torch thread)",
        f"- warm start: {_describe_warm_start(summary.get('warm_start'))}",
        *([f"- DQN: {_describe_dqn(config)}"] if config["algo"] == "dqn" else []),
        f"- exported policy: {_describe_export(summary)} on "
        f"{', '.join(Path(w).name for w in (config['eval_workloads'] or config['workloads'][:2]))}",
        f"- same evaluation for the heuristics: {heuristic_scores(summary)}",
        "",
        "| timesteps | avg JCT (s) | wall (s) |",
        "|---|---|---|",
        *(f"| {e['timesteps']:,}{' (discarded)' if e.get('discarded') else ''} | "
          f"{jct_text(e['avg_jct_s'], unit='')} | {e['wall_s']:.0f} |"
          for e in summary["evaluations"]),
        *(["", "(discarded): evaluated before a resume from an earlier checkpoint trained "
           "those steps again."] if any(e.get("discarded") for e in summary["evaluations"])
          else []),
        "",
        "Files: policy.pt (torch state_dict of the policy MLP), policy.json (format, feature "
        "spec, layer sizes), train_config.json (re-runnable configuration)"
        + (f", {PROFILES_DIR}/ (the measured profiles of {', '.join(summary['profiles'])} and "
           "their licence, which the model's heuristics rank by: it does not load without "
           "them)" if summary.get("profiles") else "") + ".",
        *(["", *cluster_markdown(cluster_file)] if cluster_file else []),
    ]
    return "\n".join(lines) + "\n"


def _describe_dqn(config: dict) -> str:
    """A DQN's learning settings (`rlalloc.agent.dqn`; cards of older runs lack them: SB3's)."""
    double, masked = config.get("dqn_double", False), config.get("dqn_masked", False)
    time_discount_s = config.get("time_discount_s", 0.0)
    return ", ".join([
        "double Q-learning" if double else "SB3's max of the target network",
        "over valid actions only" if masked else "over all actions",
        f"semi-MDP discount exp(-t/{time_discount_s:g} s)" if time_discount_s > 0
        else f"gamma {config['gamma']:g} per step",
        f"large-margin loss weight {config.get('dqn_demo_weight', 0.0):g}"])


def _describe_warm_start(info: dict | None) -> str:
    if not info:
        return "none"
    if "residual" in info and "imitation" in info:
        fitted = info["imitation"]
        return (f"residual over {', '.join(f'`{n}`' for n in info['residual'])}: actor fitted "
                f"to the lookahead's advantages at {fitted['contested']:,} contested of "
                f"{fitted['samples']:,} recorded steps (squared error "
                f"{fitted['advantage_mse']:.3f}), margin {fitted['margin']} job-hours; critic "
                f"fitted to the first's returns on {info['samples']:,} steps")
    if "residual" in info:
        told = info.get("job_sizes")
        start = (f"Q-values fitted to the first's returns on {info['samples']:,} steps, its "
                 f"follow action preferred by {info['q_margin']:.3g}" if "q_margin" in info else
                 f"actor initialised to follow the first (sampled veto {info['veto_p']}, raw "
                 f"action {info['raw_p']}, switch {info.get('switch_p', 0)}), critic fitted to "
                 f"its returns on {info['samples']:,} steps")
        return (f"residual over {', '.join(f'`{n}`' for n in info['residual'])}"
                + (f", told job sizes learnt from {told['jobs']:,} training jobs of "
                   f"{told['curves']} kinds{_describe_speeds(told)}" if told else "")
                + ": " + start)
    rounds = info["rounds"]
    return (f"behaviour cloning of `{info['teacher']}` + {len(rounds) - 1} DAgger round(s); "
            f"training accuracy {rounds[0]['accuracy']:.3f} -> {rounds[-1]['accuracy']:.3f} on "
            f"{rounds[-1]['samples']:,} labelled steps ({info['unexpressible']} teacher actions "
            f"had no discrete index)")


def _describe_speeds(told: dict) -> str:
    """What the told heuristics rank growth by, for the card (cards of runs before speeds were
    told lack ``profiles``: they ranked by the curves)."""
    if told.get("profiles"):
        return (f" and job speeds from the measured profiles of {', '.join(told['profiles'])} "
                f"(copied into {PROFILES_DIR}/)")
    if "profiles" in told:
        return " (speed-ups from the state's curves: no profiles were found)"
    return ""


def _describe_export(summary: dict) -> str:
    exported = _exported_evaluation(summary["evaluations"])
    if exported is None:
        return "none, as no periodic evaluation finished every job"
    discarded = ", before a resume trained its stretch again" if exported.get("discarded") else ""
    return (f"the best of the periodic evaluations (step {exported['timesteps']:,}{discarded}),"
            f" avg JCT {jct_text(summary['best_avg_jct_s'])}")


def evaluated_at(summary: dict, step: int) -> bool:
    """Whether the policy at `step` has been evaluated (not counting an evaluation a resume
    ``discarded``: the same step of the steps it trained again)."""
    return any(e["timesteps"] == step and not e.get("discarded")
               for e in summary["evaluations"])


def _exported_evaluation(evaluations: list[dict]) -> dict | None:
    """The evaluation whose policy was exported: the first with the lowest finite average JCT
    (a later one must beat it to replace it); None if no evaluation finished every job."""
    finished = [e for e in evaluations if math.isfinite(jct_read(e))]
    return min(finished, key=jct_read) if finished else None


def exported_step(evaluations: list[dict]) -> int | None:
    """The step whose policy was exported (`_exported_evaluation`), None if none was."""
    exported = _exported_evaluation(evaluations)
    return exported["timesteps"] if exported else None


def heuristic_scores(summary: dict) -> str:
    """The heuristics' average JCT on the training evaluation, as the card and `train`'s last
    line give them: "name: 2,885 s; ..." (a told heuristic's name has commas in it, and a
    heuristic that left jobs unfinished reads "unfinished")."""
    return "; ".join(f"{name}: {jct_text(jct)}"
                     for name, jct in summary["heuristic_avg_jct_s"].items())


def jct_json(jct: float) -> float | None:
    """An average JCT as card.json holds it: None (null) for an evaluation that left jobs
    unfinished, since JSON has no infinity (json.dumps would write the non-standard
    `Infinity`)."""
    return jct if math.isfinite(jct) else None


def jct_read(evaluation: dict) -> float:
    """An evaluation's average JCT from card.json: infinite where it did not finish (null,
    or `Infinity` in cards of older rlalloc versions)."""
    jct = evaluation["avg_jct_s"]
    return math.inf if jct is None else jct


def jct_text(jct: float | None, unit: str = " s") -> str:
    """An average JCT for the Markdown card."""
    return "unfinished" if jct is None else f"{jct:,.0f}{unit}"
