"""rlalloc's DQN (`rlalloc.agent.dqn`): the target's max over valid actions only, double
Q-learning, the masks and discounts its replay buffer keeps, DQfD's large-margin loss, and an
export never worse than its start on the evaluation workloads."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rlalloc.agent.dqn import (
    dqn_class,
    heuristic_actions,
    large_margin_loss,
    masked_replay_buffer_class,
    q_target,
)
from rlalloc.agent.registry import load_policy
from rlalloc.agent.train_config import TrainConfig
from rlalloc.agent.train_evaluation import evaluate_jct
from rlalloc.agent.training import train
from rlalloc.env.errors import UserError

torch.set_num_threads(1)
TINY = ("synthetic:12:1.5",)
WORKLOAD, CLUSTER = "synthetic:40:2.0", "4x4"
TEACHERS = ("elastic", "elastic-srpt")
ONE = torch.ones((1, 1))
ZERO = torch.zeros((1, 1))


def test_the_target_never_takes_the_value_of_an_invalid_action():
    """Action 1 is invalid in s' and by far the best by both networks: the target is valued
    at the best valid action instead, chosen by the online network (double) or the target
    network's own values (plain)."""
    online = torch.tensor([[0.0, 100.0, 2.0, 1.0]])
    target_net = torch.tensor([[5.0, 100.0, 3.0, 7.0]])
    valid = torch.tensor([[True, False, True, True]])
    double = q_target(online, target_net, valid, ONE, ZERO, ONE)
    plain = q_target(target_net, target_net, valid, ONE, ZERO, ONE)
    assert double.item() == 1.0 + 3.0  # the online argmax over valid actions is 2
    assert plain.item() == 1.0 + 7.0  # the target's own max over valid actions is 3
    unmasked = q_target(online, target_net, torch.ones_like(valid), ONE, ZERO, ONE)
    assert unmasked.item() == 101.0  # what the mask prevents


def test_the_target_is_discounted_per_transition_and_not_past_the_end():
    values = torch.tensor([[2.0, 4.0], [2.0, 4.0]])
    valid = torch.ones((2, 2), dtype=torch.bool)
    target = q_target(values, values, valid, torch.tensor([[1.0], [1.0]]),
                      torch.tensor([[0.0], [1.0]]), torch.tensor([[0.5], [0.5]]))
    assert target.flatten().tolist() == [1.0 + 0.5 * 4.0, 1.0]


def test_the_large_margin_loss_is_zero_only_once_the_expert_leads_every_valid_action():
    q_values = torch.tensor([[1.0, 2.0, 0.0], [3.0, 1.0, 0.0]])
    expert = torch.tensor([0, 0])
    every = torch.ones((2, 3), dtype=torch.bool)
    # row 0: max(1, 2 + .5, 0 + .5) - 1 = 1.5; row 1: max(3, 1.5, .5) - 3 = 0
    assert large_margin_loss(q_values, every, expert, 0.5).item() == pytest.approx(0.75)
    without_1 = torch.tensor([[True, False, True], [True, True, True]])
    assert large_margin_loss(q_values, without_1, expert, 0.5).item() == 0.0


def test_the_heuristic_action_is_its_follow_action_where_valid_else_the_noop():
    masks = torch.tensor([[True, True, False, True, False],
                          [True, False, True, False, True]])
    assert heuristic_actions(masks, 2).tolist() == [3, 0]


def _vec_env(config: TrainConfig):
    from stable_baselines3.common.vec_env import DummyVecEnv

    from rlalloc.agent.training_env import make_training_env

    return DummyVecEnv([lambda: make_training_env(config)] * config.n_envs)


def _tiny_dqn(config: TrainConfig, learning_starts: int = 0):
    return dqn_class()("MlpPolicy", _vec_env(config), learning_starts=learning_starts, seed=0,
                       buffer_size=2_000, device="cpu", gamma=config.gamma,
                       exploration_initial_eps=0.3, exploration_final_eps=0.3,
                       replay_buffer_class=masked_replay_buffer_class(),
                       policy_kwargs={"net_arch": [32]})


def test_the_buffer_keeps_both_states_masks_and_the_step_discounts():
    """Each transition's next mask is the mask the agent then acted under (or, where the
    episode ended, the ended state's, from the env's info); its discount is gamma x the
    environment's semi-MDP discount of that step; it only acted on valid actions."""
    config = TrainConfig(algo="dqn", workloads=TINY, cluster="2x4", n_envs=1, gamma=0.9,
                         time_discount_s=600.0)
    model = _tiny_dqn(config, learning_starts=10_000)
    model.acts_from_start = True  # greedy: the no-op, so that episodes end; 30 % explored
    with torch.no_grad():
        model.q_net.q_net[-1].bias[0] = 100.0
    model.learn(1_500)
    buffer = model.replay_buffer
    steps = buffer.pos
    masks, next_masks = buffer.masks[:steps, 0], buffer.next_masks[:steps, 0]
    dones = buffer.dones[:steps, 0].astype(bool)
    actions = buffer.actions[:steps, 0, 0]
    assert dones.any() and (~dones).sum() > 100
    assert masks[np.arange(steps), actions].all()
    assert (next_masks[:-1][~dones[:-1]] == masks[1:][~dones[:-1]]).all()
    discounts = buffer.discounts[:steps, 0]
    assert ((discounts > 0) & (discounts <= 0.9 + 1e-6)).all()
    assert (discounts < 0.9 - 1e-3).any() and np.isclose(discounts, 0.9).any()


def test_a_trained_masked_dqn_never_targets_an_invalid_action(monkeypatch):
    """The update's targets, recorded as it computes them: with the actions that no stored
    next state allows given a huge value, no target reaches it (unmasked, every one would)."""
    config = TrainConfig(algo="dqn", workloads=TINY, cluster="2x4", n_envs=1)
    model = _tiny_dqn(config, learning_starts=10_000)
    model.learn(300)
    buffer = model.replay_buffer
    invalid = np.flatnonzero(~buffer.next_masks[:buffer.pos, 0].any(axis=0))
    assert len(invalid), "some action is valid in no state"
    with torch.no_grad():
        model.q_net.q_net[-1].bias[invalid] = 1e6
        model.q_net_target.load_state_dict(model.q_net.state_dict())
    seen = []

    def recording(*args):
        seen.append(q_target(*args))
        return seen[-1]

    monkeypatch.setattr("rlalloc.agent.dqn.q_target", recording)
    model.learning_starts = 0
    model.train(gradient_steps=5, batch_size=64)
    targets = torch.cat(seen)
    assert len(targets) == 5 * 64 and targets.abs().max().item() < 1e5


def test_a_checkpoint_of_sb3s_dqn_resumes_keeping_masks(tmp_path):
    """A checkpoint saved before this DQN (SB3's replay buffer, which keeps no masks) resumes
    with the masked buffer instead of failing at its first step."""
    from stable_baselines3 import DQN

    from rlalloc.agent.checkpoints import load_model, save_checkpoint

    config = TrainConfig(algo="dqn", workloads=TINY, cluster="2x4", n_envs=1)
    older = DQN("MlpPolicy", _vec_env(config), learning_starts=0, buffer_size=500, seed=0,
                device="cpu", policy_kwargs={"net_arch": [32]})
    older.learn(40)
    save_checkpoint(older, tmp_path / "older.zip")
    resumed = load_model(config, tmp_path / "older.zip", _vec_env(config))
    resumed.learn(40, reset_num_timesteps=False)
    buffer = resumed.replay_buffer
    assert buffer.pos == 40 and buffer.masks[:40, 0, 0].all()  # the no-op: always valid
    assert not buffer.masks[:40].all(), "masks of real states, not the all-valid default"


def test_the_export_is_never_worse_than_the_start_on_the_evaluation_workloads(tmp_path):
    """A residual DQN pushed hard (learning rate 3e-4, no margin loss) moves off its start;
    whatever it finds, the exported policy, loaded from disk and run on the evaluation
    workloads (apart from the training one), scores the best evaluation on the card, which is
    at most the start's; an evaluation that did not finish every job (None) is never chosen."""
    config = TrainConfig(algo="dqn", workloads=(WORKLOAD,), eval_workloads=TINY,
                         cluster=CLUSTER, residual=TEACHERS, timesteps=2_000, eval_every=1_000,
                         n_envs=1, learning_rate=3e-4, give_up_factor=1.2, bc_epochs=2,
                         net_arch=(32,),
                         dqn_exploration=(0.3, 0.3))
    summary = train(config, tmp_path / "model", log=lambda _: None)
    scores = [e["avg_jct_s"] for e in summary["evaluations"]]
    assert len(scores) == 3 and len(set(scores)) > 1, "RL moved the policy"
    exported = load_policy(str(tmp_path / "model"))
    jct = evaluate_jct(exported.act, config, config.eval_workloads)
    finished = [score for score in scores if score is not None]
    assert jct == pytest.approx(min(finished), abs=1e-6) and jct <= scores[0]
    card = json.loads((tmp_path / "model" / "card.json").read_text())
    assert card["evaluations"][0]["timesteps"] == 0


def test_the_margin_loss_needs_a_residual_dqn(tmp_path):
    for config in (TrainConfig(algo="dqn", dqn_demo_weight=1.0),
                   TrainConfig(algo="ppo", residual=TEACHERS, dqn_demo_weight=1.0)):
        with pytest.raises(UserError, match="--dqn-demo-weight keeps a residual DQN"):
            train(config, tmp_path / "model", log=lambda _: None)
    assert not (tmp_path / "model").exists()
