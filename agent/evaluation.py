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
from env.state import ClusterState

Decide = Callable[[ClusterState], object]


@dataclass
class RunResult:
    """Metrics of one run (`env.metrics.METRIC_KEYS`) plus whether it finished."""

    metrics: dict[str, float]
    finished: bool
    series: dict[str, list[float]]
    jcts_s: list[float]


def run_policy(sim: Simulator, decide: Decide, limit_s: float | None = None,
               on_progress: Callable[[int], None] | None = None) -> RunResult:
    """Run `decide` (a `Policy.act`) on `sim` with `Simulator.run` (until all jobs finish or
    `limit_s` passes, default `time_limit_s`) and summarise the run."""
    finished = sim.run(decide, on_progress, limit_s)
    metrics = {k: float(v) for k, v in sim.accounting.summary().items()}
    return RunResult(metrics, finished, sim.accounting.series, finished_jcts_s(sim))


def finished_jcts_s(sim: Simulator) -> list[float]:
    """JCT of every finished job (for CDF plots).

    Reads the accounting's per-job finish times directly: `RunAccounting` exposes only the
    summary statistics (a public accessor there would be the better home for this).
    """
    finish = sim.accounting._finish
    done = ~np.isnan(finish)
    return (finish[done] - sim._submit[done]).tolist()
