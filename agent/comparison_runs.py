"""The runs of a policy comparison (`rlalloc evaluate`): what each is (`RunSpec`: a policy on a
workload with a seed) and one run in a worker process (`run_one`), whose result row holds its
metrics, JCTs, down-sampled series and a lookahead policy's decision counts.

A --policies entry may name an efficiency mode of its own, ``NAME@MODE`` (`policy_and_mode`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlalloc.env.efficiency import EFFICIENCY_MODES
from rlalloc.env.errors import UserError
from rlalloc.forecaster.signals import default_signals

_SERIES_POINTS = 400


@dataclass(frozen=True)
class RunSpec:
    """One simulation: a policy on a workload with a seed."""

    policy: str
    workload: str
    seed: int
    cluster: str
    failures_per_gpu_day: float
    efficiency: str = "none"

    def described(self) -> str:
        """The run as an error names it."""
        return f"{self.policy} on {self.workload}, seed {self.seed}"


def run_one(spec: RunSpec) -> dict:
    """Worker: run one simulation and return its metrics, JCTs, down-sampled series and, for a
    lookahead policy, its decision counts (`lookahead_counts`; None otherwise). The policy is
    loaded afresh per run, so the counts are this run's. Torch, where the policy loads it, runs
    on one thread: in a worker and in the --jobs 1 main process alike, so that both give the
    same numbers."""
    from rlalloc.agent.evaluation import lookahead_counts, run_policy
    from rlalloc.agent.registry import load_policy
    from rlalloc.env.failures import FailureParams
    from rlalloc.env.params import SimParams
    from rlalloc.env.scenario import build_scenario
    from rlalloc.env.workers import torch_on_one_thread

    params = SimParams(failures=FailureParams(failures_per_gpu_day=spec.failures_per_gpu_day))
    policy, efficiency = policy_and_mode(spec.policy, spec.efficiency)
    scenario = build_scenario(spec.workload, spec.cluster, seed=spec.seed, efficiency=efficiency,
                              signals=default_signals())
    loaded = load_policy(policy)
    torch_on_one_thread()
    result = run_policy(scenario.simulator(params, seed=spec.seed), loaded.act)
    step = max(1, len(result.series["t"]) // _SERIES_POINTS)
    series = {k: v[::step] for k, v in result.series.items()}
    return {"metrics": result.metrics, "finished": result.finished, "jcts_s": result.jcts_s,
            "series": series, "lookahead": lookahead_counts(loaded)}


def policy_and_mode(entry: str, default: str) -> tuple[str, str]:
    """A --policies entry as (policy, efficiency mode): ``NAME@MODE``, or `default` for a plain
    name (or a saved-model path, which may itself contain an ``@``)."""
    name, at, mode = entry.rpartition("@")
    if not at or Path(entry).exists():
        return entry, default
    if mode not in EFFICIENCY_MODES:
        raise UserError(f"--policies {entry}: {mode!r} is not an efficiency mode; write "
                        f"NAME@{'|'.join(EFFICIENCY_MODES)}")
    return name, mode
