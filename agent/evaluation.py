"""Running one policy on one scenario, with a time limit, and summarising the run.

`Simulator.run` trusts its policy to finish every job; a half-trained learned policy may leave
a job queued forever (the clock would tick on without end), so evaluation and training use
`run_policy`, which stops at a simulated-time limit and reports the jobs left unfinished.
`lookahead_counts` reads what a planner did in a run, for `rlalloc simulate` and `evaluate`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rlalloc.env.simulator import GiveUp, Simulator, time_limit_s
from rlalloc.env.state import ClusterState

Decide = Callable[[ClusterState], object]


@dataclass
class RunResult:
    """Metrics of one run (`rlalloc.env.metrics.METRIC_KEYS`) plus whether it finished."""

    metrics: dict[str, float]
    finished: bool
    series: dict[str, list[float]]
    jcts_s: list[float]
    decisions: int
    """Decision points the run took (`Simulator.decisions`)."""
    given_up: bool = False
    """Whether it stopped unfinished on its `GiveUp`, before the time limit."""


GIVE_UP_FACTOR = 3.0
"""By default a run is given up past this many times `static`'s run of the same scenario
(`give_up_after`): training's periodic evaluations and `rlalloc evaluate` alike."""
DECISIONS_PER_FACTOR = 10
"""A run is given up after this many times the give-up factor x static's decision points: the
heuristics take about as many as static, while a policy that restarts jobs at every decision
(a badly cloned DQN greedy over valid actions) moves the clock too little to reach the bounds
in time soon (docs/experiments/2026-11-27-dqn-double-masked-margin.md, "Noticed")."""


def give_up_after(static: RunResult, factor: float) -> GiveUp:
    """When a run of the scenario `static` ran is hopeless: once its average JCT is sure to
    exceed `factor` x static's, a job has been in the system `factor` x static's longest JCT,
    or it has taken `DECISIONS_PER_FACTOR` x `factor` x static's decision points. Never for a
    factor of 0, or where static itself left jobs unfinished."""
    if not factor or not static.finished or not static.jcts_s:
        return GiveUp()
    return GiveUp(factor * static.metrics["avg_jct_s"], factor * max(static.jcts_s),
                  DECISIONS_PER_FACTOR * factor * static.decisions)


def run_policy(sim: Simulator, decide: Decide, limit_s: float | None = None,
               on_progress: Callable[[int], None] | None = None,
               give_up: GiveUp = GiveUp()) -> RunResult:
    """Run `decide` (a `Policy.act`) on `sim` with `Simulator.run` (until all jobs finish,
    `limit_s` passes, default `time_limit_s`, or `give_up` says to stop) and summarise the
    run."""
    limit = time_limit_s(sim) if limit_s is None else limit_s
    finished = sim.run(decide, on_progress, limit, give_up)
    metrics = {k: float(v) for k, v in sim.accounting.summary().items()}
    return RunResult(metrics, finished, sim.accounting.series,
                     sim.accounting.finished_jcts_s().tolist(), sim.decisions,
                     given_up=not finished and sim.time_s <= limit)


def lookahead_counts(policy: object) -> dict[str, int] | None:
    """A lookahead policy's (the planner's) contested decisions and deviations from its base
    so far, else None: without them a user cannot tell whether the planner ever left its base
    (it costs about a second per contested decision, and may have matched its base for it)."""
    from rlalloc.agent.lookahead import LookaheadPolicy  # here: it loads pandas and scipy

    if not isinstance(policy, LookaheadPolicy):
        return None
    return {"contested": policy.contested, "deviations": policy.deviations}
