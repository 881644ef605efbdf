"""Behaviour cloning: turn a heuristic's decisions into discrete actions and fit a policy to them.

Plain PPO from scratch stalls on this problem (the useful actions are rare among 225, and the
reward arrives long after an allocation), so the learned policies start from the best heuristic
(DL2 did the same with a supervised warm-up): roll the heuristic out in the training
environment, record (observation, mask, discrete action, return), and fit the policy head with
a masked cross-entropy and the value head to the discounted returns before RL fine-tuning.

The heuristics allocate only sizes the action space can express and place workers exactly as
`Featurizer.decode` does (see `rlalloc.agent.heuristics`), so nearly every heuristic action has an
exact discrete index; the rest (a job outside the visible slots) are recorded as no-ops and
counted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlalloc.agent.policy import Policy, for_a_fork
from rlalloc.env.featurizer import Featurizer
from rlalloc.env.gym_env import ClusterAllocEnv
from rlalloc.env.state import Action, ActionKind, ClusterState


def encode_action(featurizer: Featurizer, state: ClusterState, action: Action) -> int | None:
    """The discrete index that decodes to exactly `action` in `state` (None: not expressible)."""
    if action.kind == ActionKind.NOOP:
        return 0
    try:
        row = state.job_index(action.job_id)
    except KeyError:
        return None
    where = np.flatnonzero(featurizer.slots(state) == row)
    if not len(where):
        return None
    slot = int(where[0])
    spec = featurizer.spec
    if action.kind == ActionKind.MIGRATE:
        candidates = [featurizer.encode_migrate(slot)]
    elif action.workers == 0:
        candidates = [featurizer.encode_suspend(slot)]
    else:
        candidates = [featurizer.encode_scale(slot, workers, strategy, gpu_type)
                      for workers in ((action.workers,) if action.workers in spec.worker_levels
                                      else ()) + (None,)
                      for strategy in spec.strategies
                      for gpu_type in spec.gpu_types or (None,)]
    for index in candidates:
        if featurizer.decode(state, index) == action:
            return index
    return None


@dataclass
class Demonstrations:
    """Heuristic rollouts as arrays (one row per environment step)."""

    obs: np.ndarray
    masks: np.ndarray
    actions: np.ndarray
    returns: np.ndarray
    """Discounted return from each step (of the rewards the environment gave: in training,
    those RL trains on; discounted by gamma per step, times the step's ``info["discount"]``
    under a semi-MDP time discount)."""
    unexpressible: int
    """Heuristic actions with no discrete index (replaced by no-ops)."""


def collect_demonstrations(env: gym.Env, policy: Policy, episodes: int, seed: int,
                           gamma: float,
                           driver: Callable[[np.ndarray, np.ndarray], int] | None = None,
                           max_steps: int = 50_000) -> Demonstrations:
    """Roll out `episodes` episodes of `env`, labelling every state with `policy`'s action.

    `env` is a `ClusterAllocEnv`, possibly wrapped: the returns are of the rewards it gives,
    so pass the environment RL trains in (`rlalloc.agent.training_env.make_training_env`) and
    the value targets are those of the reward RL trains on. Without `driver` the teacher's own
    actions are taken (behaviour cloning); with one, the driver (the student: observation,
    mask -> index) chooses and the teacher only labels the states the student visits (DAgger),
    which corrects the student where its own mistakes take it. Episodes stop after `max_steps`
    steps. A `policy` that remembers between calls labels each episode with a fresh copy of
    itself, as each episode's clock starts at zero.
    """
    cluster_env: ClusterAllocEnv = env.unwrapped
    featurizer = cluster_env.featurizer
    obs_rows, mask_rows, actions, returns = [], [], [], []
    unexpressible = 0
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        labeller = for_a_fork(policy)  # one that remembers starts each episode afresh, as its clock
        rewards, discounts = [], []
        done = False
        while not done and len(rewards) < max_steps:
            state = cluster_env.sim.state()
            mask = featurizer.action_mask(state)
            index = encode_action(featurizer, state, labeller.act(state))
            if index is None or not mask[index]:
                unexpressible += 1
                index = 0
            obs_rows.append(obs)
            mask_rows.append(mask)
            actions.append(index)
            taken = index if driver is None else driver(obs, mask)
            obs, reward, terminated, truncated, info = env.step(taken)
            rewards.append(reward)
            discounts.append(gamma * info.get("discount", 1.0))
            done = terminated or truncated
        running = 0.0
        episode_returns = np.empty(len(rewards))
        for i in range(len(rewards) - 1, -1, -1):
            running = rewards[i] + discounts[i] * running
            episode_returns[i] = running
        returns.append(episode_returns)
    return Demonstrations(np.asarray(obs_rows, dtype=np.float32), np.asarray(mask_rows),
                          np.asarray(actions, dtype=np.int64),
                          np.concatenate(returns).astype(np.float32), unexpressible)


def fit_policy(policy: nn.Module, demos: Demonstrations, epochs: int, batch_size: int,
               learning_rate: float, seed: int, value: bool = True,
               actor: bool = True) -> dict[str, float]:
    """Fit an SB3 actor-critic (or Q-network) policy to the demonstrations, in place.

    Actor-critic policies (MaskablePPO) get a masked cross-entropy on their logits plus a
    value regression on the returns (`actor=False`: the value regression alone, for a residual
    policy whose actor is initialised as its teacher instead, see `rlalloc.agent.residual`).
    Q-networks (DQN) are fitted so that the demonstrated action has the highest Q-value (a
    cross-entropy on the Q-values as logits), which makes the greedy DQN policy start as the
    heuristic; with `actor=False` every Q-value regresses on the return instead, a state value
    that a residual start then turns into its teacher (`rlalloc.agent.residual.init_follow_q_head`).
    Returns the final training accuracy and loss.
    """
    generator = torch.Generator().manual_seed(seed)
    obs = torch.as_tensor(demos.obs)
    masks = torch.as_tensor(demos.masks)
    actions = torch.as_tensor(demos.actions)
    returns = torch.as_tensor(demos.returns)
    optimizer = torch.optim.Adam(policy.parameters(), lr=learning_rate)
    is_actor_critic = hasattr(policy, "mlp_extractor")
    stats = {"accuracy": 0.0, "loss": 0.0}
    for _ in range(epochs):
        order = torch.randperm(len(actions), generator=generator)
        correct, total_loss = 0, 0.0
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            if is_actor_critic:
                features = policy.extract_features(obs[batch], policy.pi_features_extractor)
                latent_pi, latent_vf = policy.mlp_extractor(features)
                scores = policy.action_net(latent_pi)  # = actor_logits, sharing the features
                masked = scores.masked_fill(~masks[batch], -1e8)
                loss = nn.functional.cross_entropy(masked, actions[batch]) if actor else 0.0
                if value:
                    values = policy.value_net(latent_vf).squeeze(-1)
                    loss = loss + 0.5 * nn.functional.mse_loss(values, returns[batch])
            else:
                q_values = policy.q_net(obs[batch])
                masked = q_values.masked_fill(~masks[batch], -1e8)
                loss = (nn.functional.cross_entropy(masked, actions[batch]) if actor else
                        nn.functional.mse_loss(q_values,
                                               returns[batch, None].expand_as(q_values)))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            correct += int((masked.argmax(-1) == actions[batch]).sum())
            total_loss += loss.item() * len(batch)
        stats = {"accuracy": correct / len(actions), "loss": total_loss / len(actions)}
    return stats


def actor_logits(policy: nn.Module, obs: torch.Tensor) -> torch.Tensor:
    """An SB3 actor-critic policy's action logits for a batch of observations (unmasked)."""
    features = policy.extract_features(obs, policy.pi_features_extractor)
    return policy.action_net(policy.mlp_extractor.forward_actor(features))


def concatenate(parts: list[Demonstrations]) -> Demonstrations:
    """One data set from several."""
    return Demonstrations(*(np.concatenate([getattr(p, f) for p in parts])
                            for f in ("obs", "masks", "actions", "returns")),
                          unexpressible=sum(p.unexpressible for p in parts))
