"""`rlalloc bench rollouts`: how fast training collects rollouts with its environments stepped
in the learning process (`DummyVecEnv`, what `rlalloc train` uses), in local processes
(`SubprocVecEnv`) or by the actors of a Ray cluster (`rlalloc.agent.ray_vec_env.RayVecEnv`,
`rlalloc train --ray`).

Each figure is one MaskablePPO rollout collection (SB3's own ``collect_rollouts``: masks,
policy, environment steps and the rollout buffer) of about --steps environment steps with the
`TrainConfig` defaults' model over `make_training_env`'s environments. The round trip is one
call to every environment that does nothing (``get_attr``): what a vector step pays on top of
the simulator's work where the environments run in other processes, twice under
`SubprocVecEnv` (the step, then the masks), once under `RayVecEnv` (the masks come with the
step). Start-up (processes, actors, the environments' first episodes) is timed apart.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import time
from dataclasses import replace

from rich.console import Console
from rich.table import Table

from rlalloc.agent.train_config import TrainConfig
from rlalloc.cli.argtypes import POSITIVE_INT, SEED, add_json_out_flags
from rlalloc.env.cluster import add_cluster_flag, parse_cluster
from rlalloc.env.execution import add_ray_flag
from rlalloc.env.output import prepare_out_file, write_json_out
from rlalloc.env.progress import progress_bar
from rlalloc.env.workload.loader import GENERATED_SOURCES

BACKENDS = ("dummy", "subproc", "ray")
"""Where the environments step: DummyVecEnv, SubprocVecEnv, RayVecEnv."""
ROUND_TRIPS = 200
"""Calls timed for the round trip."""
_DEFAULTS = TrainConfig()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `rlalloc bench rollouts`."""
    parser.add_argument("--workload", default=_DEFAULTS.workloads[0],
                        help=f"training workload: a CSV, {GENERATED_SOURCES} "
                             "(default: %(default)s, `rlalloc train`'s)")
    add_cluster_flag(parser, _DEFAULTS.cluster)
    parser.add_argument("--n-envs", type=POSITIVE_INT, nargs="+", default=[2, 8], metavar="N",
                        help="numbers of environments to time (default: 2 8)")
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS),
                        help="where the environments step (default: all)")
    parser.add_argument("--steps", type=POSITIVE_INT, default=4096,
                        help="environment steps per figure, rounded up to a whole vector step "
                             "(default: %(default)s)")
    parser.add_argument("--seed", type=SEED, default=0, help="seed of the environments and model")
    add_ray_flag(parser, "the ray backend's actors", default="local")
    add_json_out_flags(parser)


def bench_rollouts(config: TrainConfig, backend: str, steps: int) -> dict:
    """One figure: `config.n_envs` environments of `config` stepped by `backend` (`BACKENDS`;
    Ray joined already), timed starting, collecting one rollout of about `steps` steps and
    making `ROUND_TRIPS` round trips."""
    import torch
    from stable_baselines3.common.vec_env import VecMonitor

    from rlalloc.agent.callbacks import RolloutTimer
    from rlalloc.agent.sb3_models import build_model
    from rlalloc.agent.training_env import training_env_fns

    torch.set_num_threads(1)
    n_steps = math.ceil(steps / config.n_envs)
    config = replace(config, n_steps=n_steps, batch_size=n_steps * config.n_envs)
    started = time.perf_counter()
    vec_env = _vec_env(backend, training_env_fns(config))
    try:
        model = build_model(config, VecMonitor(vec_env))
        timer = RolloutTimer(n_steps)
        model.learn(n_steps * config.n_envs, callback=timer)
        start_s = timer.started - started
        rollout_s = timer.ended - timer.started
        started = time.perf_counter()
        for _ in range(ROUND_TRIPS):
            vec_env.get_attr("render_mode")
        round_trip_s = (time.perf_counter() - started) / ROUND_TRIPS
        workers = {"dummy": 1, "subproc": config.n_envs}.get(backend) or vec_env.n_workers
    finally:
        vec_env.close()
    return {"backend": backend, "n_envs": config.n_envs, "workers": workers,
            "start_s": start_s, "env_steps": n_steps * config.n_envs,
            "env_steps_per_s": n_steps * config.n_envs / rollout_s,
            "vector_step_ms": 1000 * rollout_s / n_steps, "round_trip_ms": 1000 * round_trip_s}


def _vec_env(backend: str, env_fns: list) -> object:
    """The vector env of `backend` over `env_fns`."""
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    if backend == "dummy":
        return DummyVecEnv(env_fns)
    if backend == "subproc":
        return SubprocVecEnv(env_fns)
    from rlalloc.agent.ray_vec_env import RayVecEnv

    return RayVecEnv(env_fns)


def run(args: argparse.Namespace) -> int:
    """Time every backend at every --n-envs, print a table, optionally write JSON."""
    from rlalloc.env.scenario import build_scenario

    parse_cluster(args.cluster)
    build_scenario(args.workload, args.cluster)  # a bad workload fails before any start-up
    prepare_out_file(args.out, args.force)
    if "ray" in args.backends:  # joined first: a cluster that does not answer fails now
        from rlalloc.env.ray_cluster import connect

        connect(args.ray)
    config = replace(_DEFAULTS, workloads=(args.workload,), cluster=args.cluster, seed=args.seed)
    runs = []
    with progress_bar() as progress:
        task = progress.add_task("rollouts", total=len(args.n_envs) * len(args.backends))
        for n_envs in args.n_envs:
            for backend in args.backends:
                runs.append(bench_rollouts(replace(config, n_envs=n_envs), backend, args.steps))
                progress.advance(task)
    local = {figure["n_envs"]: figure["env_steps_per_s"] for figure in runs
             if figure["backend"] == "dummy"}
    for figure in runs:
        if figure["n_envs"] in local:
            figure["speedup_over_dummy"] = figure["env_steps_per_s"] / local[figure["n_envs"]]
    figures = {"workload": args.workload, "cluster": args.cluster, "steps": args.steps,
               "ray": args.ray if "ray" in args.backends else None, "cpus": os.cpu_count(),
               "machine": f"{platform.machine()} {platform.python_version()}", "runs": runs}
    Console().print(_table(figures))
    write_json_out(args.out, figures)
    return 0


def _table(figures: dict) -> Table:
    """The figures, a row per backend and number of environments."""
    table = Table(title=f"rlalloc bench rollouts: {figures['workload']} on {figures['cluster']}"
                        f", {figures['cpus']} CPUs")
    columns = {"backend": "backend", "n_envs": "envs", "workers": "workers",
               "start_s": "start s", "env_steps_per_s": "steps/s",
               "vector_step_ms": "ms/vec step", "round_trip_ms": "trip ms",
               "speedup_over_dummy": "x dummy"}
    for name in columns.values():
        table.add_column(name, justify="left" if name == "backend" else "right")
    for row in figures["runs"]:
        table.add_row(*(_cell(row.get(key)) for key in columns))
    return table


def _cell(value: object) -> str:
    """A figure as the table shows it."""
    if isinstance(value, float):
        return f"{value:,.2f}" if value < 100 else f"{value:,.0f}"
    return "" if value is None else str(value)
