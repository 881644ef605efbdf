"""The runs of a policy comparison (`rlalloc evaluate`): what each is (`RunSpec`: a policy on a
workload with a seed) and one run in a worker process (`run_one`), whose result row holds its
metrics, JCTs, down-sampled series, whether it was given up and a lookahead policy's decision
counts.

A run is given up once it is hopeless next to `static` on the same workload and seed
(`rlalloc.agent.evaluation.give_up_after`): a policy that restarts a job at every decision
moves the clock by little more than its restores and would otherwise run for hours before the
time limit stopped it.

A --policies entry may name an efficiency mode of its own, ``NAME@MODE`` (`policy_and_mode`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path

from rlalloc.agent.evaluation import GIVE_UP_FACTOR, RunResult
from rlalloc.env.efficiency import EFFICIENCY_MODES
from rlalloc.env.errors import UserError
from rlalloc.env.simulator import GiveUp, Simulator
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
    give_up_factor: float = GIVE_UP_FACTOR
    """The run is given up past this many times static's run of the same scenario
    (`rlalloc.agent.evaluation.give_up_after`; 0: never)."""

    def described(self) -> str:
        """The run as an error names it."""
        return f"{self.policy} on {self.workload}, seed {self.seed}"


def run_one(spec: RunSpec) -> dict:
    """Worker: run one simulation and return its metrics, JCTs, down-sampled series, whether it
    was given up (`give_up_factor`) and, for a lookahead policy, its decision counts
    (`lookahead_counts`; None otherwise). The policy is loaded afresh per run, so the counts are
    this run's. Torch, where the policy loads it, runs on one thread: in a worker and in the
    --jobs 1 main process alike, so that both give the same numbers."""
    from rlalloc.agent.evaluation import give_up_after, lookahead_counts, run_policy
    from rlalloc.agent.registry import load_policy
    from rlalloc.env.workers import torch_on_one_thread

    policy, efficiency = policy_and_mode(spec.policy, spec.efficiency)
    static = replace(spec, policy="static", give_up_factor=0.0)
    if policy == "static":  # its own bounds never stop it: the run the bounds came from
        result, counts = _static_run(static, efficiency), None
    else:
        loaded = load_policy(policy)
        torch_on_one_thread()
        give_up = (give_up_after(_static_run(static, efficiency), spec.give_up_factor)
                   if spec.give_up_factor else GiveUp())
        result = run_policy(_simulator(spec, efficiency), loaded.act, give_up=give_up)
        counts = lookahead_counts(loaded)
    step = max(1, len(result.series["t"]) // _SERIES_POINTS)
    series = {k: v[::step] for k, v in result.series.items()}
    return {"metrics": result.metrics, "finished": result.finished, "jcts_s": result.jcts_s,
            "given_up": result.given_up, "series": series, "lookahead": counts}


def _simulator(spec: RunSpec, efficiency: str) -> Simulator:
    """A fresh simulator of the run's scenario under `efficiency`."""
    from rlalloc.env.failures import FailureParams
    from rlalloc.env.params import SimParams
    from rlalloc.env.scenario import build_scenario

    params = SimParams(failures=FailureParams(failures_per_gpu_day=spec.failures_per_gpu_day))
    scenario = build_scenario(spec.workload, spec.cluster, seed=spec.seed, efficiency=efficiency,
                              signals=default_signals())
    return scenario.simulator(params, seed=spec.seed)


@functools.lru_cache(maxsize=64)
def _static_run(static: RunSpec, efficiency: str) -> RunResult:
    """`static`'s run of a scenario (`static`: a run's spec, its policy static, no give-up),
    which gives the other policies' bounds there (`give_up_after`). Memoised, so a worker runs
    static once per workload and seed, for its own row and every other policy's bounds."""
    from rlalloc.agent.evaluation import run_policy
    from rlalloc.agent.registry import load_policy

    return run_policy(_simulator(static, efficiency), load_policy("static").act)


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
