"""Training rollouts on Ray (`rlalloc.agent.ray_vec_env.RayVecEnv`, `rlalloc train --ray`): the
same steps as one DummyVecEnv over the same environments, so the same model learnt; a bad
--ray refused in one line before anything is written."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from functools import partial

import numpy as np
import pytest
import torch
from sb3_contrib.common.maskable.utils import get_action_masks
from stable_baselines3.common.vec_env import DummyVecEnv, VecMonitor

from rlalloc.agent.callbacks import discount_callbacks
from rlalloc.agent.model_files import WEIGHTS_FILE
from rlalloc.agent.sb3_models import build_model
from rlalloc.agent.train_config import TrainConfig
from rlalloc.agent.training import train
from rlalloc.agent.training_env import ScaledReward, training_env_fns
from rlalloc.cli.main import main
from rlalloc.env.errors import UserError
from rlalloc.env.gym_env import ClusterAllocEnv

ray = pytest.importorskip("ray")
from rlalloc.agent.ray_vec_env import RayVecEnv  # noqa: E402  (needs ray)

pytestmark = pytest.mark.timeout(180)  # actors that never get a CPU would wait for ever
torch.set_num_threads(1)
SHORT = "synthetic:4:1.0"
"""Episodes of tens to a thousand steps under mostly no-ops."""
TINY = TrainConfig(workloads=(SHORT,), cluster="2x4", n_envs=3, n_steps=64, batch_size=64,
                   n_epochs=2, net_arch=(32,), time_discount_s=3600.0, gamma=1.0)


@pytest.fixture(scope="module")
def local_ray():
    """One Ray of this machine for the module (``address="local"``: not one that another
    process of this machine runs), two CPUs: two actors at a time."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


def _assert_same(ours: object, theirs: object, where: str = "") -> None:
    """Equal values of equal types, arrays writable as SB3's own vector envs hand them out."""
    assert type(ours) is type(theirs), (where, type(ours), type(theirs))
    if isinstance(ours, dict):
        assert ours.keys() == theirs.keys(), where
        for key in ours:
            _assert_same(ours[key], theirs[key], f"{where}.{key}")
    elif isinstance(ours, list | tuple):
        assert len(ours) == len(theirs), where
        for i, (mine, other) in enumerate(zip(ours, theirs, strict=True)):
            _assert_same(mine, other, f"{where}[{i}]")
    elif isinstance(ours, np.ndarray):
        assert ours.dtype == theirs.dtype and ours.flags.writeable, where
        np.testing.assert_array_equal(ours, theirs, err_msg=where)
    else:
        assert ours == theirs, where


def _mostly_noops(masks: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A valid action per environment, the no-op 70 % of the time (episodes end)."""
    actions = np.argmax(rng.random(masks.shape) * masks, axis=1)
    return np.where(rng.random(len(masks)) < 0.7, 0, actions)


def test_steps_as_one_dummy_vec_env(local_ray):
    """Step by step, through auto-resets (terminated and truncated), reseeded resets and
    attribute calls on indices spread over both actors."""
    env_fns = [partial(ClusterAllocEnv, (SHORT,), "2x4", max_episode_steps=60)] * 5
    ours, theirs = RayVecEnv(env_fns, n_workers=2), DummyVecEnv(env_fns)
    try:
        assert ours.n_workers == 2 and ours.num_envs == 5
        rng = np.random.default_rng(0)
        ends = {"terminated": 0, "truncated": 0}
        for segment, seed in enumerate((7, None, 11)):
            if seed is not None:
                assert ours.seed(seed) == theirs.seed(seed)
            _assert_same(ours.reset(), theirs.reset(), f"reset {segment}")
            _assert_same(ours.reset_infos, theirs.reset_infos)
            for step in range(150):
                masks = get_action_masks(ours)
                _assert_same(masks, get_action_masks(theirs), f"masks {segment}/{step}")
                actions = _mostly_noops(masks, rng)
                _assert_same(list(ours.step(actions)), list(theirs.step(actions)),
                             f"step {segment}/{step}")
                _assert_same(ours.reset_infos, theirs.reset_infos)
                for info in theirs.buf_infos:
                    if "terminal_observation" in info:
                        ends["truncated" if info["TimeLimit.truncated"] else "terminated"] += 1
        assert min(ends.values()) > 0, ends
        indices = [4, 0, 2]
        assert ours.get_attr("max_episode_steps", indices) == [60] * 3
        for venv in (ours, theirs):
            venv.set_attr("max_episode_steps", 9, indices=[1, 3])
        assert ours.get_attr("max_episode_steps") == [60, 9, 60, 9, 60]
        _assert_same(ours.env_method("action_masks", indices=indices),
                     theirs.env_method("action_masks", indices=indices))
        assert ours.env_is_wrapped(ScaledReward, indices=[3]) == [False]
        before = get_action_masks(theirs)[1]
        for _ in range(50):  # the masks a step brought are not handed out after a call that
            actions = np.zeros(5, dtype=int)  # may change them
            _assert_same(list(ours.step(actions)), list(theirs.step(actions)))
            for venv in (ours, theirs):
                venv.env_method("step", 0, indices=[1])
            _assert_same(get_action_masks(ours), get_action_masks(theirs), "after env_method")
        assert (get_action_masks(theirs)[1] != before).any()
        assert ours.has_attr("action_masks") and not ours.has_attr("no_such_attribute")
    finally:
        ours.close()


def test_an_error_building_a_workload_stays_one_line(local_ray):
    """A workload the actors cannot read (a path only the driver has) is the `UserError` it
    is, not a traceback of Ray's."""
    venv = RayVecEnv([partial(ClusterAllocEnv, ("no/such/workload.csv",), "2x4")] * 2)
    try:
        with pytest.raises(UserError, match="no/such/workload.csv"):
            venv.reset()
    finally:
        venv.close()


def _learnt(config: TrainConfig, venv: object, steps: int) -> dict[str, torch.Tensor]:
    model = build_model(config, VecMonitor(venv))
    try:
        model.learn(steps, callback=discount_callbacks(config))
    finally:
        venv.close()
    return model.policy.state_dict()


def test_maskable_ppo_learns_the_same_parameters(local_ray):
    """Two updates of MaskablePPO, its semi-MDP discounts included: bit for bit the same
    policy from the same seed whether the environments step here or on two actors."""
    env_fns = training_env_fns(TINY)
    local = _learnt(TINY, DummyVecEnv(env_fns), 384)
    on_ray = _learnt(TINY, RayVecEnv(env_fns, n_workers=2), 384)
    assert local.keys() == on_ray.keys()
    for name, tensor in local.items():
        assert torch.equal(tensor, on_ray[name]), name


@pytest.mark.expensive
def test_train_with_ray_rollouts_is_the_local_run(local_ray, tmp_path):
    """`train` with `ray_address` (the fixture's Ray: already joined) ends where the local
    run does: the same evaluations and the same exported policy."""
    config = replace(TINY, timesteps=768, eval_every=384, warm_start="elastic",
                     dagger_rounds=0, bc_epochs=1)
    local = train(config, tmp_path / "local", log=lambda _: None)
    on_ray = train(config, tmp_path / "ray", log=lambda _: None, ray_address="local")
    assert ([(e["timesteps"], e["avg_jct_s"]) for e in local["evaluations"]]
            == [(e["timesteps"], e["avg_jct_s"]) for e in on_ray["evaluations"]])
    assert len(local["evaluations"]) == 3
    assert local["best_avg_jct_s"] == on_ray["best_avg_jct_s"]
    assert local["exported_timesteps"] == on_ray["exported_timesteps"]
    weights = [torch.load(tmp_path / run / WEIGHTS_FILE, weights_only=True)
               for run in ("local", "ray")]
    for name, tensor in weights[0].items():
        assert torch.equal(tensor, weights[1][name]), name


def test_train_refuses_a_dead_ray_address_before_writing(tmp_path):
    """Nothing listens on port 1: one line, exit 2, no run directory (Ray not started)."""
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "rlalloc.cli.main", "train", "--ray", "127.0.0.1:1",
         "--timesteps", "0", "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "--ray 127.0.0.1:1" in result.stderr and not out.exists()


def test_bench_rollouts_smoke(local_ray, tmp_path):
    """The smallest `rlalloc bench rollouts` (here and on the fixture's Ray) writes a row per
    backend."""
    out = tmp_path / "rollouts.json"
    assert main(["bench", "rollouts", "--workload", SHORT, "--cluster", "2x4", "--n-envs", "2",
                 "--steps", "32", "--backends", "dummy", "ray", "--out", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [(r["backend"], r["n_envs"], r["env_steps"]) for r in runs] == [
        ("dummy", 2, 32), ("ray", 2, 32)]
    assert runs[1]["workers"] == 2 and runs[1]["speedup_over_dummy"] > 0
