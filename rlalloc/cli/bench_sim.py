"""`rlalloc bench sim`: how fast the simulator replays a trace and steps as an environment.

Two figures matter: the wall time to replay the full 82k-job Philly trace on a 128x8 cluster
under static FIFO (target: under 30 s), and environment steps per second with random valid
actions on a 16x4 cluster (target: well above 5,000, so PPO's update loop, not the simulator,
bounds training). The third checks that claim directly: a short MaskablePPO run over the
raw actions with the `TrainConfig` defaults, timing how much of its wall time is spent inside
the environment. Peak memory is the process's maximum resident set size.
"""

from __future__ import annotations

import argparse
import platform
import resource
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import numpy as np
from rich.console import Console
from rich.table import Table

from rlalloc.cli.argtypes import POSITIVE_INT, add_json_out_flags, at_least, require_module
from rlalloc.env.cluster import ClusterSpec, parse_cluster
from rlalloc.env.errors import UserError
from rlalloc.env.output import prepare_out_file, write_json_out
from rlalloc.env.progress import progress_bar
from rlalloc.env.state import Action, ClusterState
from rlalloc.env.workload.loader import (
    GENERATED_SOURCES,
    generator_of,
    load_workload,
    workload_format,
)
from rlalloc.forecaster.signals import default_signals

DEFAULT_TRACE = Path("../shared/data/traces/pollux/philly.csv")
"""The Philly trace beside the checkout, from which benchmarks run (`make bench`)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `rlalloc bench sim`."""
    parser.add_argument("--trace", default=str(DEFAULT_TRACE),
                        help=f"workload to replay: a CSV, {GENERATED_SOURCES} "
                             "(default: %(default)s, beside the checkout it runs from)")
    parser.add_argument("--cluster", default="128x8", help="replay cluster (default: %(default)s)")
    parser.add_argument("--policy", default="static", help="replay policy (default: %(default)s)")
    parser.add_argument("--env-cluster", default="16x4",
                        help="cluster of the environment-step benchmark (default: %(default)s)")
    parser.add_argument("--env-steps", type=POSITIVE_INT, default=20_000,
                        help="environment steps to time (default: %(default)s)")
    parser.add_argument("--ppo-steps", type=at_least(0), default=8192,
                        help="MaskablePPO steps whose time inside the environment is measured "
                             "(0: skip; default: %(default)s)")
    add_json_out_flags(parser)


def bench_replay(trace: str, cluster: ClusterSpec,
                 decide: Callable[[ClusterState], Action]) -> dict[str, float]:
    """Load and replay the workload `trace` (a CSV path or a synthetic source) once under
    `decide` (a policy's `act`), up to the simulated-time limit
    (`rlalloc.env.simulator.time_limit_s`); wall times, events and decisions per second."""
    from rlalloc.env.scenario import build_scenario

    start = time.perf_counter()
    scenario = build_scenario(trace, cluster, signals=default_signals())
    load_s = time.perf_counter() - start
    sim = scenario.simulator()
    with progress_bar() as progress:
        task = progress.add_task("replay", total=len(scenario.workload.jobs))
        start = time.perf_counter()
        sim.run(decide, on_progress=lambda n: progress.advance(task, n))
        replay_s = time.perf_counter() - start
    metrics = sim.accounting.summary()
    return {
        "jobs": len(scenario.workload.jobs),
        "replay_jobs_unfinished": len(scenario.workload.jobs) - metrics["jobs_completed"],
        "trace_load_s": load_s,
        "philly_replay_s": replay_s,
        "events": sim.events_processed,
        "events_per_s": sim.events_processed / replay_s,
        "decisions_per_s": sim.decisions / replay_s,
        "replay_avg_jct_s": metrics["avg_jct_s"],
        "replay_gpu_util": metrics["gpu_util"],
    }


def bench_env_steps(cluster: str, steps: int, seed: int = 0) -> dict[str, float]:
    """Steps per second of `ClusterAllocEnv` under uniformly random valid actions."""
    from rlalloc.env.gym_env import ClusterAllocEnv

    env = ClusterAllocEnv(cluster=cluster, signals=default_signals())
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    episodes = 0
    with progress_bar() as progress:
        task = progress.add_task("env steps", total=steps)
        start = time.perf_counter()
        for i in range(steps):
            valid = np.flatnonzero(env.action_masks())
            action = valid[rng.integers(len(valid))]  # rng.choice costs as much as a step part
            _, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                episodes += 1
                env.reset()
            if i % 1000 == 999:
                progress.advance(task, 1000)
        elapsed = time.perf_counter() - start
        progress.update(task, completed=steps)  # the last partial thousand
    return {"env_steps": steps, "env_steps_per_s": steps / elapsed, "env_episodes": episodes}


class _TimedEnv(gym.Wrapper):
    """Adds up the wall time spent inside the environment (steps, resets and masks)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.seconds = 0.0

    def _timed(self, call: object, *args: object, **kwargs: object) -> object:
        start = time.perf_counter()
        result = call(*args, **kwargs)
        self.seconds += time.perf_counter() - start
        return result

    def step(self, action: int) -> tuple:
        return self._timed(self.env.step, action)

    def reset(self, **kwargs: object) -> tuple:
        return self._timed(self.env.reset, **kwargs)

    def action_masks(self) -> np.ndarray:
        return self._timed(self.env.unwrapped.action_masks)


def bench_ppo_share(cluster: str, steps: int, seed: int = 0) -> dict[str, float]:
    """MaskablePPO steps per second over the raw actions as `rlalloc train` builds it with the
    `TrainConfig` defaults on `cluster` (its environments, workload and reward, its model and
    hyperparameters: 2 lock-step environments, 1,024 steps each per update, 128x128 MLP; 1
    torch thread), and the share of that wall time spent inside the environment."""
    import torch
    from stable_baselines3.common.vec_env import DummyVecEnv

    from rlalloc.agent.sb3_models import build_model
    from rlalloc.agent.train_config import TrainConfig
    from rlalloc.agent.training_env import make_training_env

    torch.set_num_threads(1)
    config = replace(TrainConfig(), cluster=cluster, seed=seed)
    envs = [_TimedEnv(make_training_env(config)) for _ in range(config.n_envs)]
    model = build_model(config, DummyVecEnv([lambda env=env: env for env in envs]))
    start = time.perf_counter()
    model.learn(steps)
    elapsed = time.perf_counter() - start
    return {"ppo_steps": model.num_timesteps, "ppo_steps_per_s": model.num_timesteps / elapsed,
            "ppo_env_share": sum(env.seconds for env in envs) / elapsed}


def run(args: argparse.Namespace) -> int:
    """Run both benchmarks, print a table, optionally write JSON."""
    from rlalloc.agent.registry import load_policy

    # every flag is checked before minutes of measuring, not after the first benchmark
    replay_cluster = parse_cluster(args.cluster)
    synthetic = generator_of(args.trace) is not None
    try:  # a CSV's header (its rows are read with the replay); a synthetic source is generated
        if synthetic:  # once here, cheaply, to check its numbers
            load_workload(args.trace, replay_cluster)
        else:
            workload_format(Path(args.trace))
    except UserError as err:
        raise UserError(f"--trace {err}") from None
    parse_cluster(args.env_cluster)
    if args.ppo_steps:  # the PPO share needs the [train] extra: say so now, not after the replay
        require_module("stable_baselines3")
    policy = load_policy(args.policy)
    prepare_out_file(args.out, args.force)
    # env steps first: a training process holds only the environment, not the replay's
    # hundreds of thousands of leftover objects that slow the garbage collector down
    figures = bench_env_steps(args.env_cluster, args.env_steps)
    figures.update(bench_replay(args.trace, replay_cluster, policy.act))
    # before the PPO run: torch and its model would add memory that the replay does not use
    # (a heuristic replay policy loads without torch; docs/architecture.md)
    figures["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    if args.ppo_steps:
        figures.update(bench_ppo_share(args.env_cluster, args.ppo_steps))
    figures["machine"] = f"{platform.machine()} {platform.python_version()}"
    trace_name = args.trace if synthetic else Path(args.trace).name
    table = Table(title=f"rlalloc bench sim: {trace_name} on {args.cluster}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in figures.items():
        table.add_row(key, f"{value:,.3f}" if isinstance(value, float) else str(value))
    Console().print(table)
    write_json_out(args.out, figures)
    return 0
