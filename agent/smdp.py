"""Semi-MDP discounting for MaskablePPO: one discount per step, read from the environment.

SB3 discounts every step by the same gamma. In this environment actions at a decision point
take no simulated time, so a per-step gamma pays a policy for extra actions (each one pushes
the negative rewards further away; docs/agent.md, "A reward flaw"). With
`RewardWeights.time_discount_s` set, each step reports ``info["discount"]`` = exp(-elapsed/T);
`RecordDiscounts` copies it into `SemiMdpRolloutBuffer`, whose GAE uses gamma x that discount
in place of gamma, so a zero-time step is not discounted at all, and discounts the value that
SB3 adds to the last reward of an episode cut off by its time limit the same way.
"""

from __future__ import annotations

import numpy as np
import torch
from sb3_contrib.common.maskable.buffers import MaskableRolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback


class SemiMdpRolloutBuffer(MaskableRolloutBuffer):
    """A MaskableRolloutBuffer whose GAE discounts step k by gamma x ``discounts[k]``."""

    def reset(self) -> None:
        """Empty the buffer; discounts default to 1 (no time passed)."""
        super().reset()
        self.discounts = np.ones((self.buffer_size, self.n_envs), dtype=np.float32)

    def record_discounts(self, infos: list[dict]) -> None:
        """Store the discounts of the step about to be added (called before `add`)."""
        self.discounts[self.pos] = [info.get("discount", 1.0) for info in infos]

    def compute_returns_and_advantage(self, last_values: torch.Tensor, dones: np.ndarray) -> None:
        """GAE(lambda) and TD(lambda) returns as in SB3, with a per-step discount."""
        next_values = last_values.clone().cpu().numpy().flatten()
        next_non_terminal = 1.0 - dones.astype(np.float32)
        last_gae = np.zeros(self.n_envs, dtype=np.float32)
        for step in reversed(range(self.buffer_size)):
            discount = self.gamma * self.discounts[step] * next_non_terminal
            delta = self.rewards[step] + discount * next_values - self.values[step]
            last_gae = delta + discount * self.gae_lambda * last_gae
            self.advantages[step] = last_gae
            next_values = self.values[step]
            next_non_terminal = 1.0 - self.episode_starts[step]
        self.returns = self.advantages + self.values


class RecordDiscounts(BaseCallback):
    """Feeds each step's ``info["discount"]`` to the model's `SemiMdpRolloutBuffer` and into
    the bootstrap of a time-limited episode (SB3 calls callbacks after ``env.step`` and before
    it bootstraps and calls ``rollout_buffer.add``)."""

    def _on_step(self) -> bool:
        infos = self.locals["infos"]
        self.model.rollout_buffer.record_discounts(infos)
        self._discount_timeout_bootstraps(infos)
        return True

    def _discount_timeout_bootstraps(self, infos: list[dict]) -> None:
        """Where a time limit cut an episode off, MaskablePPO's ``collect_rollouts`` adds
        gamma x V(terminal observation) to the step's reward, in place, after this callback;
        the semi-MDP bootstrap is gamma x discount x V. Take gamma x (1 - discount) x V off
        that reward now, so that the sum is the latter (the buffer's GAE cannot: the episode
        ends there, so the bootstrap lives in the reward alone)."""
        rewards = self.locals["rewards"]
        policy = self.model.policy
        for index, (done, info) in enumerate(zip(self.locals["dones"], infos, strict=True)):
            discount = info.get("discount", 1.0)
            if (done and discount != 1.0 and info.get("TimeLimit.truncated", False)
                    and info.get("terminal_observation") is not None):
                with torch.no_grad():
                    value = policy.predict_values(
                        policy.obs_to_tensor(info["terminal_observation"])[0])[0].item()
                rewards[index] -= self.model.gamma * (1.0 - discount) * value
