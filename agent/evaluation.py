"""Running one policy on one scenario, with a time limit, and summarising the run.

`Simulator.run` trusts its policy to finish every job; a half-trained learned policy may leave
a job queued forever (the clock would tick on without end), so evaluation and training use
`run_policy`, which stops at a simulated-time limit and reports the jobs left unfinished.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from env.simulator import Simulator
from env.state import ActionKind, ClusterState

Decide = Callable[[ClusterState], object]

DEFAULT_LIMIT_FACTOR = 20.0
"""Give up after this many times the workload's arrival span (plus a day) of simulated time."""


@dataclass
class RunResult:
    """Metrics of one run (`env.metrics.METRIC_KEYS`) plus whether it finished."""

    metrics: dict[str, float]
    finished: bool
    series: dict[str, list[float]]
    jcts_s: list[float]


def time_limit_s(sim: Simulator) -> float:
    """Simulated seconds after which a run is declared stuck."""
    jobs = sim.workload.jobs
    span = (jobs[-1].submit_s - jobs[0].submit_s) if jobs else 0.0
    return DEFAULT_LIMIT_FACTOR * span + 86_400.0 * 30


def run_policy(sim: Simulator, decide: Decide, limit_s: float | None = None,
               on_progress: Callable[[int], None] | None = None) -> RunResult:
    """Run `decide` (a `Policy.act`) on `sim` until all jobs finish or `limit_s` passes.

    Same protocol as `Simulator.run`: at each decision point the policy is asked until it
    answers no-op, an action fails, or `max_actions_per_decision` actions were applied.
    """
    limit = time_limit_s(sim) if limit_s is None else limit_s
    completed = 0
    per_decision = sim.params.max_actions_per_decision
    while not sim.done and sim.time_s <= limit:
        for _ in range(per_decision):
            action = decide(sim.state())
            if action.kind == ActionKind.NOOP or not sim.apply(action):
                break
        sim.advance()
        if on_progress is not None and sim.accounting.jobs_completed != completed:
            on_progress(sim.accounting.jobs_completed - completed)
            completed = sim.accounting.jobs_completed
    metrics = {k: float(v) for k, v in sim.accounting.summary().items()}
    return RunResult(metrics, sim.done, sim.accounting.series, finished_jcts_s(sim))


def finished_jcts_s(sim: Simulator) -> list[float]:
    """JCT of every finished job (for CDF plots).

    Reads the accounting's per-job finish times directly: `RunAccounting` exposes only the
    summary statistics (a public accessor there would be the better home for this).
    """
    finish = sim.accounting._finish
    done = ~np.isnan(finish)
    return (finish[done] - sim._submit[done]).tolist()
