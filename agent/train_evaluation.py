"""How a training run scores a policy: its mean average JCT on the evaluation workloads."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from rlalloc.agent.evaluation import RunResult, give_up_after, run_policy
from rlalloc.agent.registry import load_policy
from rlalloc.agent.train_config import TrainConfig
from rlalloc.env.scenario import build_scenario
from rlalloc.env.simulator import GiveUp
from rlalloc.forecaster.signals import default_signals


def evaluate_jct(policy: Callable, config: TrainConfig, workloads: tuple[str, ...],
                 seed: int = 0, on_progress: Callable[[int], None] | None = None,
                 give_up: dict[str, GiveUp] | None = None) -> float:
    """Mean average JCT of `policy` (a `Policy.act`) over `workloads`, one run each (infinite
    if a run leaves jobs unfinished, or is given up as its workload's `give_up` says);
    `on_progress` is told each job finished."""
    runs = _runs(policy, config, workloads, seed, on_progress, give_up)
    return float(np.mean([r.metrics["avg_jct_s"] if r.finished else math.inf
                          for r in runs.values()]))


def _runs(policy: Callable, config: TrainConfig, workloads: tuple[str, ...], seed: int = 0,
          on_progress: Callable[[int], None] | None = None,
          give_up: dict[str, GiveUp] | None = None) -> dict[str, RunResult]:
    """One run of `policy` per workload on `config`'s cluster and failures (`evaluate_jct`)."""
    params = config.sim_params()
    return {workload: run_policy(
                build_scenario(workload, config.cluster, seed=seed, efficiency=config.efficiency,
                               signals=default_signals()).simulator(params, seed=seed),
                policy, on_progress=on_progress, give_up=(give_up or {}).get(workload, GiveUp()))
            for workload in workloads}


def give_up_bounds(config: TrainConfig, workloads: tuple[str, ...],
                   on_progress: Callable[[int], None] | None = None) -> dict[str, GiveUp]:
    """Per workload, when `evaluate_jct` gives a run up: `give_up_after` static's run there,
    with `config.give_up_factor`."""
    factor = config.give_up_factor
    if not factor:  # no static runs for bounds never used
        return dict.fromkeys(workloads, GiveUp())
    return {workload: give_up_after(static, factor)
            for workload, static in _runs(load_policy("static").act, config, workloads,
                                          on_progress=on_progress).items()}
