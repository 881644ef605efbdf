"""The residual action space: the follow action is the heuristic, exactly; its mask; the
start that makes the policy the heuristic; and the deployed path against SB3's predict."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlalloc.agent.deployed import FORMAT_VERSION, PolicyNet, load_deployed
from rlalloc.agent.evaluation import run_policy
from rlalloc.agent.export import export_model, in_memory_policy
from rlalloc.agent.imitation import encode_action
from rlalloc.agent.job_sizes import JobSizeHistory, told_sizes
from rlalloc.agent.job_speeds import ProfiledSpeedups, profile_models
from rlalloc.agent.registry import load_policy
from rlalloc.agent.residual import (
    PROPOSAL_FEATURES,
    SIZE_FEATURES,
    follow_first,
    follow_logits,
    init_follow_head,
    make_residual,
    residual_featurizer,
)
from rlalloc.agent.train_config import TrainConfig
from rlalloc.agent.training import train
from rlalloc.env.errors import UserError
from rlalloc.env.featurizer import FeatureSpec, Featurizer, select_slots
from rlalloc.env.gym_env import ClusterAllocEnv
from rlalloc.env.profiles import DEFAULT_PROFILES_ROOT, cached_profiles
from rlalloc.env.scenario import build_scenario
from rlalloc.env.state import ActionKind

from shared_data import POLLUX_WORKLOADS, needs_pollux

torch.set_num_threads(1)
# busy enough that elastic admits, shrinks and grows, and resizes jobs outside the 4 slots
WORKLOAD, CLUSTER = "synthetic:40:2.0", "4x4"
SMALL_SLOTS = 4


TEACHERS = ("elastic", "elastic-srpt")
follow_elastic = follow_first(len(TEACHERS))


def _residual_env(top_k: int = 16) -> ClusterAllocEnv:
    return make_residual(ClusterAllocEnv((WORKLOAD,), CLUSTER,
                                         features=FeatureSpec(top_k=top_k)), TEACHERS)


def test_following_the_first_heuristic_is_elastic_exactly():
    """Driving the residual env with "follow, else no-op" gives elastic's run to the second,
    although with 4 slots many of elastic's resizes have no raw index."""
    env = _residual_env(top_k=SMALL_SLOTS)
    plain_featurizer = Featurizer(env.featurizer.spec)
    obs, _ = env.reset(seed=0)
    done, followed, without_raw_index = False, 0, 0
    while not done:
        mask = env.action_masks()
        if mask[env.featurizer.follow_index]:
            state = env.sim.state()
            followed += 1
            without_raw_index += encode_action(plain_featurizer, state,
                                               env.featurizer.proposals(state)[0]) is None
        obs, _, terminated, truncated, info = env.step(follow_elastic(obs, mask))
        done = terminated or truncated
    assert followed > 0 and without_raw_index > 0
    plain = ClusterAllocEnv((WORKLOAD,), CLUSTER)
    plain.reset(seed=0)  # the same seeded scenario and episode seed
    elastic = run_policy(plain.sim, load_policy("elastic").act).metrics["avg_jct_s"]
    assert info["metrics"]["avg_jct_s"] == pytest.approx(elastic, rel=0, abs=1e-6)


def test_mask_and_decode_of_the_follow_action():
    env = _residual_env()
    featurizer, plain = env.featurizer, Featurizer(env.featurizer.spec)
    teachers = [load_policy(name) for name in TEACHERS]
    raw, extra = plain.spec.num_actions, plain.spec.obs_size
    env.reset(seed=1)
    seen = {True: 0, False: 0}
    differ = 0
    for _ in range(400):
        state = env.sim.state()
        proposals = [teacher.act(state) for teacher in teachers]
        mask = featurizer.action_mask(state)
        obs = featurizer.observe(state)
        assert len(mask) == raw + len(TEACHERS) == env.action_space.n
        assert (mask[:raw] == plain.action_mask(state)).all()
        assert obs.shape == env.observation_space.shape
        assert (obs[:extra] == plain.observe(state)).all()
        for k, proposal in enumerate(proposals):
            assert mask[raw + k] == (proposal.kind != ActionKind.NOOP)
            assert obs[extra + k * PROPOSAL_FEATURES] == mask[raw + k]
            if mask[raw + k]:
                assert featurizer.decode(state, raw + k) == proposal
        differ += proposals[0] != proposals[1]
        seen[bool(mask[raw])] += 1
        _, _, terminated, truncated, _ = env.step(follow_elastic(obs, mask))
        if terminated or truncated:
            env.reset()
    assert seen[True] > 10 and seen[False] > 10 and differ > 0


def test_follow_logits_give_the_asked_probabilities():
    noop, first, other = follow_logits(225, veto_p=0.1, raw_p=0.02, switch_p=0.2)
    raw = np.zeros(225)
    raw[0] = noop
    only_raw = np.exp(raw) / np.exp(raw).sum()
    assert 1 - only_raw[0] == pytest.approx(0.02, rel=1e-6)
    assert 1 / (1 + np.exp(noop - first)) == pytest.approx(0.9, rel=1e-6)  # follow vs veto
    assert 1 / (1 + np.exp(noop - other)) == pytest.approx(0.2, rel=1e-6)  # switch vs idle


def test_initialised_head_acts_as_elastic():
    """A network started by `init_follow_head` picks, in every state, the action elastic
    proposes (the deployed path, with no SB3)."""
    env = _residual_env()
    torch.manual_seed(0)
    net = PolicyNet(env.observation_space.shape[0], (32, 32), int(env.action_space.n), "tanh")
    init_follow_head(net.layers[-1], len(TEACHERS), veto_p=0.1, raw_p=0.02, switch_p=0.2)
    policy = in_memory_policy(net, "ppo", env.featurizer.spec, residual=TEACHERS)
    elastic = load_policy("elastic")
    sim = build_scenario(WORKLOAD, CLUSTER, seed=2).simulator(seed=2)
    changes = 0
    for _ in range(600):
        state = sim.state()
        action = policy.act(state)
        assert action == elastic.act(state)
        changes += action.kind != ActionKind.NOOP
        if action.kind == ActionKind.NOOP or not sim.apply(action):
            sim.advance()
        if sim.done:
            break
    assert changes > 10


def test_residual_export_matches_sb3_predict(tmp_path):
    from sb3_contrib import MaskablePPO

    env = _residual_env()
    model = MaskablePPO("MlpPolicy", env, n_steps=64, batch_size=32, n_epochs=1, seed=0,
                        device="cpu", policy_kwargs={"net_arch": [32, 32]})
    init_follow_head(model.policy.action_net, len(TEACHERS), veto_p=0.1, raw_p=0.02,
                     switch_p=0.2)
    model.learn(128)
    export_model(model, "ppo", env.featurizer.spec, tmp_path, residual=TEACHERS)
    deployed = load_deployed(tmp_path)
    assert deployed.meta.residual == TEACHERS
    rollout = _residual_env()
    rng = np.random.default_rng(0)
    obs, _ = rollout.reset(seed=3)
    followed = 0
    for _ in range(300):
        state, mask = rollout.sim.state(), rollout.action_masks()
        expected, _ = model.predict(obs, deterministic=True, action_masks=mask)
        assert deployed.choose(obs, mask) == int(expected)
        assert (deployed.featurizer.observe(state) == obs).all()
        assert deployed.act(state) == rollout.featurizer.decode(state, int(expected))
        followed += int(expected) >= rollout.featurizer.follow_index
        obs, _, terminated, truncated, _ = rollout.step(int(rng.choice(np.flatnonzero(mask))))
        if terminated or truncated:
            obs, _ = rollout.reset()
    assert followed > 0


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_residual_starts_as_elastic_in_training(tmp_path, algo):
    """`rlalloc train --residual elastic` exports, before any RL step, a policy that scores
    elastic's JCT exactly: PPO by its initialised action head, DQN by Q-values fitted to
    elastic's returns with the follow action ahead (its greedy choice over valid actions)."""
    config = TrainConfig(algo=algo, workloads=(WORKLOAD,), cluster=CLUSTER, timesteps=0,
                         n_envs=1, residual=TEACHERS, bc_epochs=2, net_arch=(32,))
    summary = train(config, tmp_path / "model", log=lambda _: None)
    assert summary["evaluations"][0]["avg_jct_s"] == pytest.approx(
        summary["heuristic_avg_jct_s"]["elastic"], abs=1e-6)
    policy = load_policy(str(tmp_path / "model"))
    assert policy.meta.residual == TEACHERS and policy.meta.masked
    if algo == "dqn":
        assert summary["warm_start"]["q_margin"] > 0
        assert "Q-values fitted to the first's returns" in (tmp_path / "model" /
                                                            "card.md").read_text()


def test_residual_dqn_refuses_lookahead_recordings(tmp_path):
    with pytest.raises(UserError, match="--imitate fits a PPO actor"):
        train(TrainConfig(algo="dqn", workloads=(WORKLOAD,), cluster=CLUSTER,
                          residual=TEACHERS, imitate=("x.npz",)), tmp_path / "dqn",
              log=lambda _: None)
    assert not (tmp_path / "dqn").exists()


POLLUX = POLLUX_WORKLOADS
SIZED_TEACHERS = ("elastic-srpt-0.25", "elastic")


def _pollux(n: int) -> str:
    return str(POLLUX / f"workload-{n}.csv")


@needs_pollux
def test_size_features_show_the_tables_remaining_work_per_slot():
    """Told sizes, the observation ends with (known, log remaining minutes) per slot, in slot
    order, from the table: a kind the table lacks is shown as unknown."""
    history = JobSizeHistory.fit([build_scenario(_pollux(1), "16x4")])
    sim = build_scenario(_pollux(2), "16x4").simulator(seed=0)
    run_policy(sim, told_sizes("elastic-srpt-0.25", history.remaining_work, "told").act,
               limit_s=5 * 3600.0)
    state = sim.state()
    rows = select_slots(state, FeatureSpec().top_k)
    assert len(rows) == FeatureSpec().top_k
    for dropped in history.work_s:  # a table without the kind of some job in the slots
        partial = JobSizeHistory({k: v for k, v in history.work_s.items() if k != dropped},
                                 {k: v for k, v in history.jobs.items() if k != dropped})
        work = partial.remaining_work(state, rows)
        known = ~np.isnan(work)
        if not known.all():
            break
    assert known.any() and not known.all()
    featurizer = residual_featurizer(FeatureSpec(), SIZED_TEACHERS, partial)
    plain = residual_featurizer(FeatureSpec(), SIZED_TEACHERS)
    assert featurizer.obs_size == plain.obs_size + SIZE_FEATURES * FeatureSpec().top_k
    obs = featurizer.observe(state)
    assert len(obs) == featurizer.obs_size
    assert (obs[:plain.obs_size] == plain.observe(state)).all()
    shown = obs[plain.obs_size:].reshape(FeatureSpec().top_k, SIZE_FEATURES)
    np.testing.assert_array_equal(shown[:, 0], known)
    np.testing.assert_allclose(2 ** (shown[:, 1][known] * math.log2(1 + 60 * 24 * 7)) - 1,
                               work[known] / 60.0, rtol=1e-4)
    assert (shown[:, 1][~known] == 0).all()


@needs_pollux
def test_learn_sizes_starts_as_the_told_heuristic_and_ships_its_table_and_profiles(tmp_path):
    """`train --residual ... --learn-sizes` exports, before any RL step, the first heuristic
    told sizes and speeds exactly (not the plain one), and the table and profiles travel with
    the model: loaded by path, it runs that heuristic on a workload it was not trained on."""
    config = TrainConfig(workloads=(_pollux(1),), cluster="16x4", timesteps=0, n_envs=1,
                         residual=SIZED_TEACHERS, learn_sizes=True, bc_epochs=1,
                         net_arch=(32,), failures="none")
    summary = train(config, tmp_path / "model", log=lambda _: None)
    told = summary["heuristic_avg_jct_s"]["elastic-srpt-0.25, sizes learned, speeds profiled"]
    assert summary["evaluations"][0]["avg_jct_s"] == pytest.approx(told, abs=1e-6)
    assert abs(told - summary["heuristic_avg_jct_s"]["elastic-srpt-0.25"]) > 1.0
    assert "told job sizes learnt from 160 training jobs" in (tmp_path / "model" /
                                                                 "card.md").read_text()
    policy = load_policy(str(tmp_path / "model"))
    assert policy.meta.job_sizes is not None and policy.meta.format_version == FORMAT_VERSION
    history = JobSizeHistory.fit([build_scenario(_pollux(1), "16x4")])
    speedups = ProfiledSpeedups(profile_models(history, cached_profiles(DEFAULT_PROFILES_ROOT)))
    teacher = told_sizes("elastic-srpt-0.25", history.remaining_work, "told", speedups)
    scores = [run_policy(build_scenario(_pollux(3), "16x4").simulator(seed=0), p.act,
                         limit_s=6 * 3600.0).metrics["avg_jct_s"] for p in (policy, teacher)]
    assert scores[0] == pytest.approx(scores[1], abs=1e-6)


@pytest.mark.parametrize("settings, message", [
    ({}, "--learn-sizes tells the residual heuristics"),
    ({"residual": ("static",)}, "residual heuristic static does not estimate job sizes"),
    ({"residual": SIZED_TEACHERS, "efficiency": "adaptive"}, "--learn-sizes needs --efficiency"),
    ({"residual": SIZED_TEACHERS}, "every job has the same speed curve"),  # synthetic: no kinds
])
def test_learn_sizes_refusals_are_one_line_and_write_nothing(tmp_path, settings, message):
    config = TrainConfig(workloads=(WORKLOAD,), cluster=CLUSTER, learn_sizes=True, **settings)
    with pytest.raises(UserError, match=message) as err:
        train(config, tmp_path / "model", log=lambda _: None)
    assert "\n" not in str(err.value) and not (tmp_path / "model").exists()
