"""Semi-MDP discounting in PPO's buffer, and the `rlalloc train` flags that configure it."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

import gymnasium as gym
import numpy as np
import pytest
import torch
from sb3_contrib.common.maskable.buffers import MaskableRolloutBuffer

from rlalloc.agent.smdp import SemiMdpRolloutBuffer
from rlalloc.agent.train_config import TrainConfig
from rlalloc.cli.train import add_arguments, config_from_args

REWARDS = [-1.0, -2.0, -0.5]
VALUES = [-3.0, -2.5, -0.4]
LAST_VALUE = -0.2


def _filled(cls: type, gamma: float, gae_lambda: float,
            discounts: list[float] | None = None) -> MaskableRolloutBuffer:
    """A one-env buffer holding the 3 steps above, the episode still running after them."""
    buffer = cls(3, gym.spaces.Box(-1, 1, (1,)), gym.spaces.Discrete(2), device="cpu",
                 gamma=gamma, gae_lambda=gae_lambda, n_envs=1)
    for step, (reward, value) in enumerate(zip(REWARDS, VALUES, strict=True)):
        if discounts is not None:
            buffer.record_discounts([{"discount": discounts[step]}])
        buffer.add(np.zeros((1, 1)), np.zeros((1, 1)), np.array([reward]),
                   np.array([step == 0]), torch.tensor([value]), torch.tensor([0.0]),
                   action_masks=np.ones((1, 2)))
    buffer.compute_returns_and_advantage(torch.tensor([LAST_VALUE]), np.array([False]))
    return buffer


def test_without_time_discounts_gae_is_sb3s():
    """Discounts of 1 (no time discount, or missing from the info) leave SB3's GAE unchanged."""
    ours = _filled(SemiMdpRolloutBuffer, 0.9, 0.8)
    theirs = _filled(MaskableRolloutBuffer, 0.9, 0.8)
    np.testing.assert_allclose(ours.advantages, theirs.advantages, rtol=1e-6)
    np.testing.assert_allclose(ours.returns, theirs.returns, rtol=1e-6)


def test_time_discounted_gae_by_hand():
    """gamma 1, lambda 1: the return is rewards discounted by the product of the step
    discounts before them. Step 0 took no time (discount 1), step 1 an hour (T = 1 h: e^-1)."""
    discounts = [1.0, float(np.exp(-1.0)), 0.5]
    buffer = _filled(SemiMdpRolloutBuffer, 1.0, 1.0, discounts)
    g2 = REWARDS[2] + 0.5 * LAST_VALUE
    g1 = REWARDS[1] + np.exp(-1.0) * g2
    g0 = REWARDS[0] + 1.0 * g1
    np.testing.assert_allclose(buffer.returns[:, 0], [g0, g1, g2], rtol=1e-6)
    np.testing.assert_allclose(buffer.advantages[:, 0], np.array([g0, g1, g2]) - VALUES,
                               rtol=1e-6)


def test_train_flags_reach_the_config_and_survive_json():
    """The PPO flags added for the residual runs land in TrainConfig, and the saved
    train_config.json gives the same config back."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--out", "x", "--n-steps", "8192", "--batch-size", "512",
                              "--gae-lambda", "0.85", "--time-discount-s", "3600",
                              "--gamma", "1", "--residual", "elastic-srpt,elastic",
                              "--imitate", "a.npz", "--imitate", "b.npz",
                              "--imitate-margin", "0.25", "--learn-sizes"])
    config = config_from_args(args)
    assert (config.n_steps, config.batch_size, config.gae_lambda) == (8192, 512, 0.85)
    assert (config.time_discount_s, config.gamma) == (3600.0, 1.0)
    assert config.residual == ("elastic-srpt", "elastic")
    assert (config.imitate, config.imitate_margin) == (("a.npz", "b.npz"), 0.25)
    assert config.learn_sizes
    assert not config_from_args(parser.parse_args(["--out", "x"])).learn_sizes
    saved = json.loads(json.dumps(asdict(config)))
    restored = TrainConfig(**{k: tuple(v) if isinstance(v, list) else v
                              for k, v in saved.items()})
    assert restored == config


@pytest.mark.parametrize("flag", ["--n-steps", "--gae-lambda", "--time-discount-s",
                                  "--imitate-margin"])
def test_train_flag_defaults_are_the_configs(flag):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = config_from_args(parser.parse_args(["--out", "x"]))
    field = flag.removeprefix("--").replace("-", "_")
    assert getattr(config, field) == getattr(TrainConfig(), field)


@pytest.mark.parametrize("discounting", [{"time_discount_s": 600.0, "gamma": 1.0}, {}],
                         ids=["given", "default"])
def test_ppo_reads_the_step_discounts_of_a_time_discounted_env(discounting):
    """With time_discount_s set, and by default, PPO's buffer holds exp(-elapsed/T) per step:
    1 for actions at a decision point (times a gamma of 1, so an action that takes no time
    defers no cost), below 1 for steps that advanced the clock."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    from rlalloc.agent.callbacks import discount_callbacks
    from rlalloc.agent.sb3_models import build_model
    from rlalloc.agent.training_env import ScaledReward, make_env

    config = TrainConfig(workloads=("synthetic:20:1.0",), cluster="2x4", n_envs=1, n_steps=256,
                         batch_size=64, warm_start="", **discounting)
    vec_env = DummyVecEnv([lambda: ScaledReward(make_env(config), config.reward_scale)])
    model = build_model(config, vec_env)
    model.learn(256, callback=discount_callbacks(config))
    discounts = model.rollout_buffer.discounts
    assert isinstance(model.rollout_buffer, SemiMdpRolloutBuffer) and model.gamma == 1.0
    assert (discounts == 1.0).any() and (discounts < 1.0).any() and (discounts > 0.0).all()


def test_a_time_limited_episode_bootstraps_with_the_steps_discount():
    """MaskablePPO adds gamma x V(terminal observation) to the last reward of an episode cut
    off by its time limit; under a semi-MDP discount the bootstrap is gamma x discount x V.
    Every episode here is cut off after one step, and V is held at 100."""
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import DummyVecEnv

    from rlalloc.agent.callbacks import discount_callbacks
    from rlalloc.agent.sb3_models import build_model
    from rlalloc.agent.training_env import make_training_env

    config = TrainConfig(workloads=("synthetic:20:1.0",), cluster="4x4", n_envs=1, n_steps=8,
                         batch_size=8, n_epochs=1, time_discount_s=600.0, gamma=0.9,
                         reward_scale=1.0, net_arch=(16,))

    def one_step_episodes() -> gym.Env:
        env = make_training_env(config)
        env.unwrapped.max_episode_steps = 1
        return env

    class Seen(BaseCallback):
        """The step's reward, discount and truncation, before any bootstrap is added."""

        def __init__(self) -> None:
            super().__init__()
            self.steps: list[tuple[float, float, bool]] = []

        def _on_step(self) -> bool:
            info = self.locals["infos"][0]
            self.steps.append((float(self.locals["rewards"][0]), info["discount"],
                               info["TimeLimit.truncated"]))
            return True

    model = build_model(config, DummyVecEnv([one_step_episodes]))
    value = 100.0
    model.policy.predict_values = lambda obs: torch.full((obs.shape[0], 1), value)
    seen = Seen()
    model.learn(8, callback=[seen, *discount_callbacks(config)])
    rewards, discounts, truncated = map(np.array, zip(*seen.steps, strict=True))
    assert truncated.all() and (discounts < 1.0).any()
    np.testing.assert_allclose(model.rollout_buffer.rewards[:, 0],
                               rewards + config.gamma * discounts * value, rtol=1e-5)
