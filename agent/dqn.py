"""rlalloc's DQN (`dqn_class`): SB3's DQN with the fixes a residual start needs to survive RL.

SB3's DQN, started exactly at a heuristic, soon left it, only for the worse
(docs/experiments/2026-11-24-residual-dqn.md). Four known causes, each addressed here with a
known technique, each a `TrainConfig` setting so that it can be measured apart (which of them
mattered: docs/experiments/2026-11-27-dqn-double-masked-margin.md):

- **Overestimation by the max** (Thrun & Schwartz 1993): the target's max over many actions,
  most rarely tried, picks whichever is overestimated. Double Q-learning (van Hasselt et al.,
  AAAI 2016) chooses the next action with the online network and values it with the target
  network (`dqn_double`).
- **Invalid actions in the max**: an action the mask forbids in s' is never taken there, yet
  SB3's target may take its value. Here the target's argmax and the policy's (acting,
  exploring and the deployed argmax) are over valid actions only (`dqn_masked`; the masks of
  s and s' are stored with each transition, `MaskedReplayBuffer`).
- **Per-step discounting**: actions at one decision point take no simulated time, so a
  per-step gamma pays for extra steps. With `time_discount_s` each transition is discounted by
  gamma x exp(-elapsed/T), read from the environment's ``info["discount"]`` as PPO's GAE is
  (`rlalloc.agent.smdp`).
- **Losing the start**: TD errors of tried deviations generalise across states. DQfD's
  large-margin loss (Hester et al., AAAI 2018) keeps the heuristic's action (the first follow
  action where it proposes something, else the no-op) ahead of every other valid action by a
  margin unless the TD targets say otherwise (`dqn_demo_weight`; the margin is the residual
  start's, `rlalloc.agent.warm_start.DQN_FOLLOW_MARGIN` standard deviations of its returns).

The model also acts with its own Q-network from its first step once it has one worth acting on
(`acts_from_start`), instead of SB3's uniform warm-up, which threw a warm start away.
"""

from __future__ import annotations

from functools import cache
from typing import NamedTuple

import numpy as np
import torch
from torch.nn import functional


class MaskedSamples(NamedTuple):
    """A replay batch (SB3's `ReplayBufferSamples` fields first) with the transition's
    discounts and the action masks of its two states."""

    observations: torch.Tensor
    actions: torch.Tensor
    next_observations: torch.Tensor
    dones: torch.Tensor
    rewards: torch.Tensor
    discounts: torch.Tensor
    """Per sample: gamma x the step's semi-MDP discount (1 without a time discount)."""
    masks: torch.Tensor
    """Valid actions in the observation (bool)."""
    next_masks: torch.Tensor
    """Valid actions in the next observation (bool)."""


def q_target(next_q_online: torch.Tensor, next_q_target: torch.Tensor,
             next_masks: torch.Tensor, rewards: torch.Tensor, dones: torch.Tensor,
             discounts: torch.Tensor) -> torch.Tensor:
    """The TD target r + discount x (1 - done) x Q_target(s', a*), where a* is the argmax of
    `next_q_online` over the actions valid in s' (`next_masks`). Double Q-learning passes the
    online network's values as `next_q_online`; plain DQN passes the target's own. Shapes:
    (batch, actions) for the values and masks, (batch, 1) for the rest."""
    chosen = next_q_online.masked_fill(~next_masks, -torch.inf).argmax(dim=1, keepdim=True)
    return rewards + (1.0 - dones) * discounts * next_q_target.gather(1, chosen)


def large_margin_loss(q_values: torch.Tensor, masks: torch.Tensor,
                      expert_actions: torch.Tensor, margin: float) -> torch.Tensor:
    """DQfD's supervised loss, the batch mean of max over valid a of [Q(s, a) + margin x
    (a != a_E)] - Q(s, a_E): zero once the expert's action a_E leads every other valid action
    by `margin`. `expert_actions`: (batch,) indices, valid in their state."""
    penalties = torch.full_like(q_values, margin)
    penalties.scatter_(1, expert_actions[:, None], 0.0)
    best = (q_values + penalties).masked_fill(~masks, -torch.inf).max(dim=1).values
    return (best - q_values.gather(1, expert_actions[:, None]).squeeze(1)).mean()


def heuristic_actions(masks: torch.Tensor, num_teachers: int) -> torch.Tensor:
    """The residual start's action in each state of a batch: the first heuristic's follow
    action where it proposes something (valid), else the no-op (index 0)."""
    follow = masks.shape[1] - num_teachers
    return torch.where(masks[:, follow], follow, 0)


def _uniform_valid(masks: np.ndarray) -> np.ndarray:
    """One action per row of `masks`, uniform over its valid ones (exploration)."""
    return np.array([np.random.choice(np.flatnonzero(row)) for row in masks], dtype=np.int64)


@cache  # one class: models built and loaded are of the same type
def dqn_class() -> type:
    """SB3's `DQN` with a `MaskedReplayBuffer` and the settings of the module docstring, as
    attributes set by `configure_dqn`: `double_q`, `masked`, `demo_weight`, `demo_margin`,
    `num_teachers` and `acts_from_start`. (Built on call: SB3 is imported only where it is
    used.)"""
    from sb3_contrib.common.maskable.utils import get_action_masks
    from stable_baselines3 import DQN

    class MaskedDQN(DQN):
        acts_from_start = False
        double_q = True
        masked = True
        demo_weight = 0.0
        demo_margin = 0.0
        num_teachers = 0

        def _sample_action(self, learning_starts: int, action_noise: object = None,
                           n_envs: int = 1) -> tuple[np.ndarray, np.ndarray]:
            """Epsilon-greedy over the valid actions (all of them if not `masked`): uniform
            during SB3's warm-up unless `acts_from_start`, else greedy but, at the
            exploration rate, a uniform valid one (a coin per environment)."""
            masks = get_action_masks(self.env)
            self._acting_masks = masks
            choice = masks if self.masked else np.ones_like(masks)
            warm_up = self.num_timesteps < learning_starts and not self.acts_from_start
            explore = np.random.rand(n_envs) < (1.0 if warm_up else self.exploration_rate)
            actions = self._greedy(self._last_obs, choice)
            actions[explore] = _uniform_valid(choice[explore])
            return actions, actions

        def _greedy(self, observations: np.ndarray, masks: np.ndarray) -> np.ndarray:
            """The argmax of the Q-network over `masks`, per observation."""
            with torch.no_grad():
                q_values = self.q_net(self.policy.obs_to_tensor(observations)[0])
            valid = torch.as_tensor(masks, dtype=torch.bool)
            return q_values.masked_fill(~valid, -torch.inf).argmax(dim=1).cpu().numpy()

        def predict(self, observation: np.ndarray, state: object = None,
                    episode_start: object = None, deterministic: bool = False,
                    action_masks: np.ndarray | None = None) -> tuple[np.ndarray, None]:
            """SB3's `predict`, but greedy over `action_masks` where given and `masked` (as
            the deployed policy acts) and exploring among them."""
            if action_masks is None or not self.masked:
                return super().predict(observation, state, episode_start, deterministic)
            masks = np.atleast_2d(action_masks)
            actions = self._greedy(observation, masks)
            if not deterministic and np.random.rand() < self.exploration_rate:
                actions = _uniform_valid(masks)
            if not self.policy.is_vectorized_observation(observation):
                return actions[0], None
            return actions, None

        def _store_transition(self, replay_buffer: object, buffer_action: np.ndarray,
                              new_obs: np.ndarray, reward: np.ndarray, dones: np.ndarray,
                              infos: list[dict]) -> None:
            """SB3's, with the masks of both states and the step's discount staged for the
            buffer first (an ended episode's last mask comes from its info: the vector env
            has already reset it)."""
            next_masks = get_action_masks(self.env)
            for env, done in enumerate(dones):
                if done:
                    next_masks[env] = infos[env].get("terminal_action_mask", True)
            discounts = np.array([info.get("discount", 1.0) for info in infos], np.float32)
            replay_buffer.stage(self._acting_masks, next_masks, self.gamma * discounts)
            super()._store_transition(replay_buffer, buffer_action, new_obs, reward, dones,
                                      infos)

        def train(self, gradient_steps: int, batch_size: int = 100) -> None:
            """SB3's DQN update with `q_target` (double or not, masked or not, discounted per
            transition) and, with `demo_weight`, `large_margin_loss` toward the heuristic."""
            self.policy.set_training_mode(True)
            self._update_learning_rate(self.policy.optimizer)
            losses, margin_losses = [], []
            for _ in range(gradient_steps):
                data = self.replay_buffer.sample(batch_size, env=self._vec_normalize_env)
                next_masks = (data.next_masks if self.masked
                              else torch.ones_like(data.next_masks))
                with torch.no_grad():
                    next_target = self.q_net_target(data.next_observations)
                    next_online = (self.q_net(data.next_observations) if self.double_q
                                   else next_target)
                    target = q_target(next_online, next_target, next_masks, data.rewards,
                                      data.dones, data.discounts)
                q_values = self.q_net(data.observations)
                loss = functional.smooth_l1_loss(q_values.gather(1, data.actions.long()), target)
                losses.append(loss.item())
                if self.demo_weight > 0:
                    masks = data.masks if self.masked else torch.ones_like(data.masks)
                    margin_loss = large_margin_loss(
                        q_values, masks, heuristic_actions(data.masks, self.num_teachers),
                        self.demo_margin)
                    margin_losses.append(margin_loss.item())
                    loss = loss + self.demo_weight * margin_loss
                self.policy.optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
                self.policy.optimizer.step()
            self._n_updates += gradient_steps
            self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
            self.logger.record("train/loss", np.mean(losses))
            if margin_losses:
                self.logger.record("train/margin_loss", np.mean(margin_losses))

    return MaskedDQN


@cache
def masked_replay_buffer_class() -> type:
    """SB3's `ReplayBuffer` keeping, per transition, the action masks of both states and the
    discount (`MaskedSamples`). `MaskedDQN` stages them before SB3 adds the transition."""
    from stable_baselines3.common.buffers import ReplayBuffer

    class MaskedReplayBuffer(ReplayBuffer):
        def __init__(self, buffer_size: int, observation_space: object, action_space: object,
                     *args: object, **kwargs: object) -> None:
            super().__init__(buffer_size, observation_space, action_space, *args, **kwargs)
            shape = (self.buffer_size, self.n_envs, int(action_space.n))
            self.masks = np.ones(shape, dtype=bool)
            self.next_masks = np.ones(shape, dtype=bool)
            self.discounts = np.ones((self.buffer_size, self.n_envs), dtype=np.float32)
            self._staged: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

        def stage(self, masks: np.ndarray, next_masks: np.ndarray,
                  discounts: np.ndarray) -> None:
            """What the next `add` stores beside SB3's fields."""
            self._staged = (masks, next_masks, discounts)

        def add(self, *args: object, **kwargs: object) -> None:
            assert self._staged is not None, "MaskedDQN stages masks before each add"
            self.masks[self.pos], self.next_masks[self.pos], self.discounts[self.pos] = (
                self._staged)
            self._staged = None
            super().add(*args, **kwargs)

        def _get_samples(self, batch_inds: np.ndarray, env: object = None) -> MaskedSamples:
            envs = np.random.randint(0, high=self.n_envs, size=(len(batch_inds),))
            done = self.dones[batch_inds, envs] * (1 - self.timeouts[batch_inds, envs])
            tensors = [self.to_torch(x) for x in (
                self._normalize_obs(self.observations[batch_inds, envs, :], env),
                self.actions[batch_inds, envs, :],
                self._normalize_obs(self.next_observations[batch_inds, envs, :], env),
                done.reshape(-1, 1),
                self._normalize_reward(self.rewards[batch_inds, envs].reshape(-1, 1), env),
                self.discounts[batch_inds, envs].reshape(-1, 1))]
            masks = torch.as_tensor(self.masks[batch_inds, envs], device=self.device)
            next_masks = torch.as_tensor(self.next_masks[batch_inds, envs], device=self.device)
            return MaskedSamples(*tensors, masks, next_masks)

    return MaskedReplayBuffer


def configure_dqn(model: object, double_q: bool, masked: bool, demo_weight: float,
                  num_teachers: int) -> None:
    """Set a `dqn_class` model's learning settings (after building or loading it)."""
    model.double_q = double_q
    model.masked = masked
    model.demo_weight = demo_weight
    model.num_teachers = num_teachers
