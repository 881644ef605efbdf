"""The environments a training run steps: the simulator's reward scaled, residual if asked."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import gymnasium as gym
import numpy as np

from rlalloc.agent.heuristics import Speedups
from rlalloc.agent.job_sizes import JobSizeHistory, learn_sizes
from rlalloc.agent.job_speeds import profile_models, speedups_of
from rlalloc.agent.residual import make_residual
from rlalloc.agent.train_config import TrainConfig
from rlalloc.env.cluster import parse_cluster
from rlalloc.env.featurizer import FeatureSpec, policy_gpu_types
from rlalloc.env.gym_env import ClusterAllocEnv, RewardWeights
from rlalloc.env.profiles import cached_profiles
from rlalloc.env.scenario import Scenario
from rlalloc.forecaster.signals import default_signals


class ScaledReward(gym.Wrapper):
    """Multiplies rewards by a constant, charges each applied action, and passes
    `action_masks` through (MaskablePPO reads it with ``env_method``, which does not look
    through wrappers).

    Why the action charge: the environment's reward accrues only while simulated time passes,
    and actions at one decision point take no time. With a discount per *step*, every extra
    action pushes the (negative) rewards further into the future, so a policy that resizes a
    job back and forth at one decision point is *rewarded* for it. From scratch on a small
    rigid workload PPO learnt exactly that and never finished it
    (docs/experiments/2026-11-21-reward-flaw.md).
    """

    def __init__(self, env: ClusterAllocEnv, scale: float, action_cost: float = 0.0) -> None:
        super().__init__(env)
        self.scale = scale
        self.action_cost = action_cost

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Step the wrapped env, scaling the reward and charging an applied action."""
        sim = self.env.unwrapped.sim
        taken = sim.actions_taken
        obs, reward, terminated, truncated, info = self.env.step(action)
        charge = self.action_cost * (sim.actions_taken - taken)
        return obs, reward * self.scale - charge, terminated, truncated, info

    def action_masks(self) -> np.ndarray:
        """The wrapped env's action mask."""
        return self.env.action_masks()


def training_spec(config: TrainConfig) -> FeatureSpec:
    """The observation and action layout of the run's policy: typed by the GPU types of its
    cluster where it mixes several (`policy_gpu_types`: sorted by name), else untyped."""
    gpu_types = policy_gpu_types(node.gpu_type for node in parse_cluster(config.cluster).nodes)
    return FeatureSpec(checkpoint_interval_s=config.sim_params().checkpoint_interval_s,
                       gpu_types=gpu_types)


def make_env(config: TrainConfig, workloads: tuple[str, ...] | None = None,
             sizes: JobSizeHistory | None = None,
             speedups: Speedups | None = None) -> ClusterAllocEnv:
    """A training environment over `workloads` (default: the config's) with the run's
    `training_spec`, residual if the config says so, its heuristics told job sizes by `sizes`
    (`training_sizes`) and speed-ups by `speedups` (`training_speedups`) if given."""
    env = ClusterAllocEnv(workloads or config.workloads, config.cluster,
                          params=config.sim_params(), features=training_spec(config),
                          reward=RewardWeights(time_discount_s=config.time_discount_s),
                          efficiency=config.efficiency, signals=default_signals())
    return make_residual(env, config.residual, sizes, speedups) if config.residual else env


def make_training_env(config: TrainConfig, workloads: tuple[str, ...] | None = None,
                      sizes: JobSizeHistory | None = None,
                      speedups: Speedups | None = None) -> ScaledReward:
    """`make_env` with the reward RL trains on (`ScaledReward`: scaled, actions charged): the
    environments RL steps and those the warm start's demonstrations are collected in, so that
    the critic (or a residual DQN's Q-values) starts fitted to the returns RL then sees."""
    return ScaledReward(make_env(config, workloads, sizes, speedups), config.reward_scale,
                        config.action_cost)


def training_env_fns(config: TrainConfig, sizes: JobSizeHistory | None = None,
                     speedups: Speedups | None = None) -> list[Callable[[], ScaledReward]]:
    """The factories of the run's `n_envs` training environments (`make_training_env`),
    picklable: `SubprocVecEnv` and `rlalloc.agent.ray_vec_env.RayVecEnv` build them in other
    processes."""
    return [partial(make_training_env, config, sizes=sizes, speedups=speedups)] * config.n_envs


def training_sizes(config: TrainConfig,
                   scenarios: dict[str, Scenario]) -> JobSizeHistory | None:
    """The job-size table of a `learn_sizes` run, fitted on its training workloads (built
    already in `scenarios`, by name; `learn_sizes` refuses workloads without kinds of job);
    None for other runs."""
    if not config.learn_sizes:
        return None
    return learn_sizes([scenarios[w] for w in config.workloads],
                       f"--learn-sizes: --workload {' '.join(config.workloads)}")


def training_speedups(sizes: JobSizeHistory | None,
                      profiles_root: Path | None) -> Speedups | None:
    """The speed-ups a `learn_sizes` run tells its heuristics: the measured throughput of the
    kinds of job in `sizes` whose application has a profile under `profiles_root`
    (`rlalloc.env.profiles.default_profiles_root`; `rlalloc.agent.job_speeds.profile_models`);
    None (the state's curves) for other runs and where no such profile is found."""
    if sizes is None or profiles_root is None:
        return None
    models = profile_models(sizes, cached_profiles(profiles_root))
    return speedups_of(models)
