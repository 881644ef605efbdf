"""The Gymnasium environment: API checkers, mask exactness, reward = -total JCT."""

from __future__ import annotations

import math
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

from rlalloc.env.failures import FailureParams
from rlalloc.env.featurizer import FeatureSpec, Featurizer, select_slots
from rlalloc.env.gym_env import ENV_ID, ClusterAllocEnv, RewardWeights
from rlalloc.env.params import SimParams
from rlalloc.env.state import ActionKind

NO_FAILURES = SimParams(failures=FailureParams(failures_per_gpu_day=0.0))


def small_env(**kwargs) -> ClusterAllocEnv:
    return ClusterAllocEnv(workloads=("synthetic:30:1.0",), cluster="4x4", **kwargs)


def test_registered_id_makes_the_environment():
    made = gym.make(ENV_ID)
    assert isinstance(made.unwrapped, ClusterAllocEnv)
    made.close()


def test_a_fresh_interpreter_makes_the_environment_by_its_module_qualified_id():
    """Gymnasium's ``module:id`` form imports the module that registers the id."""
    code = ("import gymnasium; e = gymnasium.make('rlalloc.env.gym_env:rlalloc/ClusterAlloc-v0'); "
            "print(type(e.unwrapped).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ClusterAllocEnv"


def test_gymnasium_and_sb3_checkers_pass():
    gym_check_env(small_env(), skip_render_check=True)
    sb3_check_env(small_env())


@pytest.mark.parametrize("failures_per_gpu_day", [0.0, 2.0])
def test_masked_actions_are_exactly_the_ones_the_simulator_accepts(failures_per_gpu_day):
    """Every allowed index decodes to an action the simulator accepts, every other one to a
    no-op or a refused action; with failures, also on states with warned and down nodes, where
    migrations are allowed."""
    params = SimParams(failures=FailureParams(failures_per_gpu_day=failures_per_gpu_day))
    environment = small_env(params=params)
    environment.reset(seed=0)
    featurizer, rng = environment.featurizer, np.random.default_rng(0)
    checked = {"valid": 0, "migrations": 0, "warned": 0, "down": 0}
    for _ in range(300):
        state, sim = environment._state, environment.sim
        mask = environment.action_masks()
        checked["warned"] += bool(state.nodes.warned.any())
        checked["down"] += not bool(state.nodes.ready.all())
        for index in np.flatnonzero(mask)[1:]:
            action = featurizer.decode(state, int(index))
            assert action.kind != ActionKind.NOOP, index
            assert sim.validate(action) == "", (index, action)
            checked["valid"] += 1
            checked["migrations"] += action.kind == ActionKind.MIGRATE
        for index in np.flatnonzero(~mask):
            action = featurizer.decode(state, int(index))
            assert action.kind == ActionKind.NOOP or sim.validate(action), index
        valid = np.flatnonzero(mask)
        action = 0 if rng.random() < 0.4 else int(rng.choice(valid))
        _, _, terminated, truncated, _ = environment.step(action)
        if terminated or truncated:
            environment.reset()
    assert checked["valid"] > 100
    if failures_per_gpu_day:
        assert min(checked.values()) > 0, checked


def test_episode_return_is_minus_total_jct_in_hours():
    environment = small_env(params=NO_FAILURES)
    environment.reset(seed=1)
    featurizer = environment.featurizer
    total = 0.0
    while True:
        mask = environment.action_masks()
        # start the oldest queued job at its requested size when possible, else wait
        slots = featurizer.slots(environment._state)
        action = 0
        for k, row in enumerate(slots):
            if environment._state.jobs.status[row] == 0:
                from rlalloc.env.state import Strategy
                index = featurizer.encode_scale(k, None, Strategy.PACKED)
                if mask[index]:
                    action = index
                break
        _, reward, terminated, truncated, info = environment.step(action)
        total += reward
        if terminated or truncated:
            break
    assert terminated
    metrics = info["metrics"]
    expected = -metrics["avg_jct_s"] * metrics["jobs_completed"] / 3600.0
    assert total == pytest.approx(expected, rel=1e-9)


def _start_oldest_or_wait(environment: ClusterAllocEnv) -> int:
    """Start the oldest queued job at its requested size when possible, else no-op."""
    from rlalloc.env.state import Strategy

    featurizer, state = environment.featurizer, environment._state
    for k, row in enumerate(featurizer.slots(state)):
        if state.jobs.status[row] == 0:
            index = featurizer.encode_scale(k, None, Strategy.PACKED)
            return index if environment.action_masks()[index] else 0
    return 0


@pytest.mark.parametrize("horizon_s", [1800.0, 7200.0])
def test_time_discounted_return_is_the_discounted_jct_integral(horizon_s):
    """Semi-MDP discount: sum_k (prod_{j<k} discount_j) r_k equals minus the integral of
    jobs-in-system x exp(-(t - t0)/T) in hours, computed here from the jobs counted before each
    step; a step that applies an action takes no time and has discount 1."""
    environment = small_env(params=NO_FAILURES, reward=RewardWeights(time_discount_s=horizon_s))
    environment.reset(seed=1)
    sim = environment.sim
    start_s = sim.time_s
    total, weight, integral_h, zero_time_steps = 0.0, 1.0, 0.0, 0
    while True:
        jobs, before_s = sim.jobs_in_system, sim.time_s
        _, reward, terminated, truncated, info = environment.step(
            _start_oldest_or_wait(environment))
        total += weight * reward
        weight *= info["discount"]
        integral_h += jobs * horizon_s / 3600.0 * (math.exp(-(before_s - start_s) / horizon_s)
                                                  - math.exp(-(sim.time_s - start_s) / horizon_s))
        if sim.time_s == before_s:
            zero_time_steps += 1
            assert info["discount"] == 1.0 and reward == 0.0
        if terminated or truncated:
            break
    assert terminated and zero_time_steps > 10
    assert total == pytest.approx(-integral_h, rel=1e-9)


def test_time_discount_of_one_busy_hour_by_hand():
    """One job in the system for one hour at T = 1 h costs (1 - 1/e) discounted job-hours."""
    environment = small_env(reward=RewardWeights(time_discount_s=3600.0))
    assert environment._in_step_discount(3600.0) == pytest.approx(1.0 - math.exp(-1.0))
    assert environment._in_step_discount(0.0) == 1.0
    assert small_env()._in_step_discount(3600.0) == 1.0


def test_dqn_style_invalid_actions_are_noops_and_counted():
    """Both kinds of masked-out index a DQN may pick change nothing and count once each: one
    that decodes to an action the simulator refuses, and one that decodes to nothing (an empty
    slot); index 0, the no-op, is not counted."""
    environment = small_env(params=NO_FAILURES)
    environment.reset(seed=0)
    while not environment._state.jobs.count:  # wait (index 0) for the first arrival
        assert environment.step(0)[4]["invalid_actions"] == 0
    featurizer, state = environment.featurizer, environment._state
    mask = environment.action_masks()
    refused = next(int(i) for i in np.flatnonzero(~mask)
                   if featurizer.decode(state, int(i)).kind != ActionKind.NOOP)
    assert environment.sim.validate(featurizer.decode(state, refused))
    empty_slot = featurizer.encode_suspend(featurizer.spec.top_k - 1)
    assert len(featurizer.slots(state)) < featurizer.spec.top_k
    assert featurizer.decode(state, empty_slot).kind == ActionKind.NOOP
    for action, counted in ((refused, 1), (empty_slot, 2), (0, 2)):
        _, _, _, _, info = environment.step(action)
        assert info["invalid_actions"] == counted, action
        # no job was ever started: every GPU is free and no job holds a worker
        after = environment._state
        assert environment.sim.actions_taken == 0
        assert (after.nodes.gpus_free == after.nodes.gpus_total).all()
        assert not after.jobs.workers.any() and all(p == () for p in after.jobs.placement)


def test_reward_charges_lost_gpu_hours_and_energy_by_their_weights():
    """With failures, the episode return is minus (jobs weight x total JCT + lost weight x lost
    GPU-hours + energy weight x kWh), each term read from the run's own metrics."""
    weights = RewardWeights(jobs_weight=1.0, lost_gpu_weight=0.5, energy_weight=2.0)
    params = SimParams(failures=FailureParams(failures_per_gpu_day=2.0))
    environment = small_env(params=params, reward=weights)
    environment.reset(seed=2)
    total = 0.0
    while True:
        _, reward, terminated, truncated, info = environment.step(
            _start_oldest_or_wait(environment))
        total += reward
        if terminated or truncated:
            break
    assert terminated
    m = info["metrics"]
    assert m["lost_gpu_hours"] > 0 and m["energy_kwh"] > 0  # every term is exercised
    jct_h = m["avg_jct_s"] * m["jobs_completed"] / 3600.0
    assert total == pytest.approx(-(jct_h + 0.5 * m["lost_gpu_hours"] + 2.0 * m["energy_kwh"]),
                                  rel=1e-9)


def test_an_episode_is_truncated_at_max_episode_steps():
    environment = small_env(params=NO_FAILURES, max_episode_steps=5)
    environment.reset(seed=0)
    for step in range(1, 6):
        _, _, terminated, truncated, info = environment.step(0)
        assert not terminated and truncated == (step == 5), step
    assert info["metrics"]["jobs_completed"] < 30
    environment.reset(seed=0)  # a new episode counts its steps from zero
    assert not environment.step(0)[3]


def test_slot_order_is_stable_and_observation_shape_fixed():
    spec = FeatureSpec(top_k=4)
    environment = small_env(features=spec, params=NO_FAILURES)
    obs, _ = environment.reset(seed=0)
    assert obs.shape == (spec.obs_size,) and obs.dtype == np.float32
    for _ in range(20):
        environment.step(0)
    state = environment._state
    slots = select_slots(state, spec.top_k)
    again = select_slots(state, spec.top_k)
    assert (slots == again).all()
    queued = [r for r in slots if state.jobs.status[r] == 0]
    assert queued == sorted(queued, key=lambda r: state.jobs.submit_s[r])
    assert np.isfinite(Featurizer(spec).observe(state)).all()


def test_cached_features_and_mask_equal_those_of_a_fresh_featurizer():
    """The featurizer reuses feature rows, mask blocks and node summaries from earlier states;
    along a trajectory with failures, warnings and migrations, none of it may change what it
    returns for a state."""
    params = SimParams(failures=FailureParams(failures_per_gpu_day=1.0))
    environment = ClusterAllocEnv(workloads=("synthetic:40:1.5",), cluster="4x4", params=params)
    environment.reset(seed=3)
    spec = environment.featurizer.spec
    migrate = [(k + 1) * spec.actions_per_slot for k in range(spec.top_k)]
    rng = np.random.default_rng(3)
    seen = {"warned": 0, "down": 0, "migrations": 0}
    for _ in range(1500):
        state = environment._state
        mask = environment.action_masks()
        fresh = Featurizer(spec)
        assert np.array_equal(environment.featurizer.observe(state), fresh.observe(state))
        assert np.array_equal(mask, fresh.action_mask(state))
        seen["warned"] += bool(state.nodes.warned.any())
        seen["down"] += not bool(state.nodes.ready.all())
        seen["migrations"] += bool(mask[migrate].any())
        valid = np.flatnonzero(mask)
        action = 0 if rng.random() < 0.5 else int(valid[rng.integers(len(valid))])
        _, _, terminated, truncated, _ = environment.step(action)
        if terminated or truncated:
            environment.reset()
    assert min(seen.values()) > 0, seen  # every cached path was exercised


def test_each_action_index_decodes_to_its_action_on_a_hand_made_cluster():
    """2 nodes of 4 GPUs; node-0 warns and runs job r on 2 GPUs, node-1 is empty; job q
    (2 GPUs) queues. With 2 slots of 14 actions (suspend, 6 targets x 2 strategies, migrate),
    the layout and what each index means are known by hand; warned nodes come last."""
    from test_agent_heuristics import job, make_state

    from rlalloc.env.state import NOOP, Action, JobStatus, Strategy

    state = make_state([2, 4], [job("r", JobStatus.RUNNING, 2, placement=(0, 0), submit_s=0.0),
                                job("q", JobStatus.QUEUED, 2, submit_s=5.0)], warned=(0,))
    featurizer = Featurizer(FeatureSpec(top_k=2))
    assert featurizer.spec.num_actions == 1 + 2 * 14
    assert featurizer.slots(state).tolist() == [1, 0]  # queued q in slot 0, running r in 1
    packed, spread = Strategy.PACKED, Strategy.SPREAD
    expected = {  # index: action (None: masked out, decodes to a no-op)
        featurizer.encode_suspend(0): None,                     # q holds no GPUs
        featurizer.encode_scale(0, None, packed): Action(ActionKind.SCALE, "q", 2,
                                                         ("node-1", "node-1")),
        featurizer.encode_scale(0, 1, spread): Action(ActionKind.SCALE, "q", 1, ("node-1",)),
        featurizer.encode_scale(0, 8, packed): None,            # 6 usable GPUs
        featurizer.encode_migrate(0): None,                     # q is on no node
        featurizer.encode_suspend(1): Action(ActionKind.SCALE, "r", 0, ()),
        featurizer.encode_scale(1, 2, packed): None,            # its size already
        featurizer.encode_scale(1, 4, packed): Action(ActionKind.SCALE, "r", 4,
                                                      ("node-1",) * 4),
        featurizer.encode_migrate(1): Action(ActionKind.MIGRATE, "r", 2, ("node-1",) * 2,
                                             from_node="node-0"),
    }
    assert sorted(expected) == [1, 3, 8, 12, 14, 15, 18, 20, 28]
    mask = featurizer.action_mask(state)
    for index, action in expected.items():
        assert featurizer.decode(state, index) == (action or NOOP), index
        assert mask[index] == (action is not None), index


def test_signals_without_the_shipped_models_are_one_line(monkeypatch, tmp_path):
    """A damaged install (a model file gone): a one-line error, not a FileNotFoundError
    traceback from deep in the forecaster."""
    import rlalloc.forecaster.signals as signals
    import rlalloc.forecaster.standin as standin
    from rlalloc.env.errors import UserError

    monkeypatch.setattr(signals, "load_standin",
                        lambda: standin.load_standin(tmp_path / "absent"))
    signals.load_signals.cache_clear()
    with pytest.raises(UserError, match="the shipped model file .*absent.* is missing"):
        signals.load_signals("standin")
    signals.load_signals.cache_clear()
