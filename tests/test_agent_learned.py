"""Learned policies: the deployed path equals SB3's predict, saved models load and respect the
mask, the CLI rejects bad policies in one line, and PPO learns a trivial scenario."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from rlalloc.agent.catalogue import MODELS_DIR, SHIPPED_MODELS
from rlalloc.agent.deployed import load_deployed
from rlalloc.agent.evaluation import run_policy
from rlalloc.agent.export import export_model
from rlalloc.agent.registry import load_policy
from rlalloc.agent.train_config import TrainConfig
from rlalloc.agent.training import train
from rlalloc.agent.training_env import ScaledReward
from rlalloc.env.errors import UserError
from rlalloc.env.gym_env import ClusterAllocEnv
from rlalloc.env.scenario import build_scenario
from rlalloc.env.state import ActionKind

torch.set_num_threads(1)
TINY = ("synthetic:12:1.5",)


def _rollout_states(env: ClusterAllocEnv, steps: int, seed: int = 0):
    """(obs, mask) pairs along a random masked rollout."""
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    pairs = []
    for _ in range(steps):
        mask = env.action_masks()
        pairs.append((obs, mask))
        obs, _, terminated, truncated, _ = env.step(int(rng.choice(np.flatnonzero(mask))))
        if terminated or truncated:
            obs, _ = env.reset()
    return pairs


@pytest.mark.parametrize("algo", ["ppo", "dqn", "masked-dqn"])
def test_deployed_path_matches_sb3_predict(tmp_path, algo):
    """The deployed policy acts as the trained model's own `predict`: MaskablePPO and
    rlalloc's DQN over valid actions (`rlalloc.agent.dqn`), SB3's DQN over all of them."""
    from sb3_contrib import MaskablePPO
    from stable_baselines3 import DQN

    from rlalloc.agent.dqn import dqn_class, masked_replay_buffer_class

    env = ClusterAllocEnv(TINY, "2x4")
    if algo == "ppo":
        model = MaskablePPO("MlpPolicy", env, n_steps=64, batch_size=32, n_epochs=1, seed=0,
                            device="cpu", policy_kwargs={"net_arch": [32, 32]})
    elif algo == "dqn":
        model = DQN("MlpPolicy", env, learning_starts=0, seed=0, device="cpu",
                    policy_kwargs={"net_arch": [32, 32]})
    else:
        model = dqn_class()("MlpPolicy", env, learning_starts=0, seed=0, device="cpu",
                            replay_buffer_class=masked_replay_buffer_class(),
                            policy_kwargs={"net_arch": [32, 32]})
    model.learn(128)
    export_model(model, "ppo" if algo == "ppo" else "dqn", env.featurizer.spec, tmp_path)
    deployed = load_deployed(tmp_path)
    assert deployed.meta.masked == (algo != "dqn")
    pairs = _rollout_states(ClusterAllocEnv(TINY, "2x4"), 300)
    for obs, mask in pairs:
        if algo == "dqn":
            expected, _ = model.predict(obs, deterministic=True)
        else:
            expected, _ = model.predict(obs, deterministic=True, action_masks=mask)
        assert deployed.choose(obs, mask) == int(expected)


def test_saved_model_loads_and_acts_within_the_mask(tmp_path):
    config = TrainConfig(workloads=TINY, cluster="2x4", timesteps=256, n_envs=1, n_steps=128,
                         batch_size=64, warm_start="elastic", dagger_rounds=0, bc_epochs=2,
                         eval_every=10_000, net_arch=(32,))
    train(config, tmp_path / "model", log=lambda _: None)
    policy = load_policy(str(tmp_path / "model"))
    sim = build_scenario(TINY[0], "2x4", seed=3).simulator(seed=3)
    featurizer = policy.featurizer
    for _ in range(200):
        state = sim.state()
        mask = featurizer.action_mask(state)
        index = policy.choose(featurizer.observe(state), mask)
        assert mask[index]
        action = policy.act(state)
        assert action.kind == ActionKind.NOOP or sim.validate(action) == ""
        if action.kind == ActionKind.NOOP or not sim.apply(action):
            sim.advance()
        if sim.done:
            break
    with pytest.raises(UserError, match="--force"):
        train(config, tmp_path / "model", log=lambda _: None)


def test_resume_adds_to_the_wall_time_and_keeps_the_evaluations(tmp_path):
    """A resumed run's card reports the wall time of both segments, not just the last one."""
    config = TrainConfig(workloads=TINY, cluster="2x4", timesteps=128, n_envs=1, n_steps=128,
                         batch_size=64, warm_start="elastic", dagger_rounds=0, bc_epochs=2,
                         eval_every=10_000, net_arch=(32,))
    first = train(config, tmp_path / "model", log=lambda _: None)
    resumed = train(replace(config, timesteps=256), tmp_path / "model", resume=True,
                    log=lambda _: None)
    assert resumed["timesteps"] == 256
    assert [e["timesteps"] for e in resumed["evaluations"]] == [0, 128, 256]
    assert resumed["wall_s"] > first["wall_s"]
    assert resumed["evaluations"][-1]["wall_s"] > first["wall_s"]


def _tiny_vec_env(config: TrainConfig):
    from stable_baselines3.common.vec_env import DummyVecEnv

    from rlalloc.agent.training_env import make_training_env

    return DummyVecEnv([lambda: make_training_env(config)] * config.n_envs)


def _acted_greedily(model, steps: int) -> bool:
    """Whether the first `steps` (per env) transitions in a DQN's replay buffer took the
    greedy action of its Q-network over the valid ones (which no update has changed before
    `learning_starts`)."""
    buffer = model.replay_buffer
    obs = torch.as_tensor(buffer.observations[:steps]).flatten(0, 1)
    valid = torch.as_tensor(buffer.masks[:steps]).flatten(0, 1)
    with torch.no_grad():
        greedy = model.q_net(obs).masked_fill(~valid, -torch.inf).argmax(-1).numpy()
    return bool((buffer.actions[:steps].flatten() == greedy).all())


def test_dqn_fills_its_replay_buffer_with_its_own_actions_fresh_and_resumed(tmp_path):
    """SB3's DQN acts uniformly at random until `learning_starts` (1,000 steps), and a resume
    sets that 1,000 steps on: the warm start was thrown away twice over. Ours acts
    epsilon-greedily from the first step (epsilon 0 here, so greedily) once started (as
    `train` marks a warm-started one), and a resume too; one from SB3's random initialisation
    keeps SB3's uniform warm-up, its exploration."""
    from rlalloc.agent.checkpoints import load_model, save_checkpoint
    from rlalloc.agent.sb3_models import build_model

    config = TrainConfig(algo="dqn", workloads=TINY, cluster="2x4", n_envs=2, net_arch=(32,),
                         dqn_buffer_size=500, dqn_exploration=(0.0, 0.0))
    unstarted = build_model(replace(config, warm_start=""), _tiny_vec_env(config))
    unstarted.learn(120)
    assert not _acted_greedily(unstarted, 60)
    model = build_model(config, _tiny_vec_env(config))
    model.acts_from_start = True  # what `train` sets once its warm start has run
    model.learn(120)
    assert model.num_timesteps < model.learning_starts and _acted_greedily(model, 60)
    save_checkpoint(model, tmp_path / "dqn.zip")
    resumed = load_model(config, tmp_path / "dqn.zip", _tiny_vec_env(config))
    resumed.learn(120, reset_num_timesteps=False)
    assert resumed.num_timesteps < resumed.learning_starts and _acted_greedily(resumed, 60)


def test_a_resume_draws_new_episodes_and_random_numbers(tmp_path, monkeypatch):
    """SB3's load seeds the envs and torch with the run's seed again, so every resume replayed
    the run's first episodes. A resume seeds them by `resumed_seed` (the same for the same
    checkpoint, so it is reproducible); a fresh run keeps the config's seed as before."""
    from rlalloc.agent.checkpoints import load_model, save_checkpoint
    from rlalloc.agent.sb3_models import build_model

    config = TrainConfig(workloads=TINY, cluster="2x4", n_envs=2, n_steps=32, batch_size=32,
                         n_epochs=1, net_arch=(32,), seed=3)
    drawn: list[int] = []
    scenario = ClusterAllocEnv._scenario
    monkeypatch.setattr(ClusterAllocEnv, "_scenario",
                        lambda env, index, seed: drawn.append(seed) or scenario(env, index, seed))

    def first_episodes(model) -> tuple[list[int], torch.Tensor]:
        """The episode seeds the model's envs draw at its next reset, and torch's next draw."""
        drawn.clear()
        model.env.reset()
        return list(drawn), torch.rand(4)

    fresh = build_model(config, _tiny_vec_env(config))
    fresh_episodes, fresh_torch = first_episodes(fresh)
    drawn.clear()
    ClusterAllocEnv(TINY, "2x4").reset(seed=config.seed)
    assert fresh_episodes[0] == drawn[0]  # the fresh run's streams are the config seed's
    fresh.learn(64)
    save_checkpoint(fresh, tmp_path / "ppo.zip")
    resumed_episodes, resumed_torch = first_episodes(
        load_model(config, tmp_path / "ppo.zip", _tiny_vec_env(config)))
    assert not set(resumed_episodes) & set(fresh_episodes)
    assert not torch.equal(resumed_torch, fresh_torch)
    again_episodes, again_torch = first_episodes(
        load_model(config, tmp_path / "ppo.zip", _tiny_vec_env(config)))
    assert again_episodes == resumed_episodes and torch.equal(again_torch, resumed_torch)


def test_warm_start_value_targets_are_the_rewards_rl_trains_on(monkeypatch):
    """The critic's warm start was fitted to returns without --action-cost, while PPO trains
    on the charged reward. At gamma 0 a demonstration's return is its step's reward, which
    must be the training environment's (`ScaledReward`), charge included."""
    from rlalloc.agent import warm_start
    from rlalloc.agent.training_env import make_env

    config = TrainConfig(workloads=TINY, cluster="2x4", gamma=0.0, action_cost=0.05,
                         dagger_rounds=0, bc_epochs=1)
    fitted = []
    monkeypatch.setattr(warm_start, "fit_policy", lambda policy, demos, *args, **kwargs:
                        fitted.append(demos) or {"accuracy": 1.0, "loss": 0.0})
    warm_start._warm_start(config, SimpleNamespace(policy=None), lambda _: None, lambda _: None)
    (demos,) = fitted

    def replayed(action_cost: float) -> np.ndarray:
        env = ScaledReward(make_env(config), config.reward_scale, action_cost)
        env.reset(seed=config.seed)
        return np.array([env.step(int(action))[1] for action in demos.actions])

    np.testing.assert_allclose(demos.returns, replayed(config.action_cost), rtol=1e-5, atol=1e-7)
    assert (replayed(config.action_cost) < replayed(0.0)).any()  # actions were charged


@pytest.mark.parametrize("name", SHIPPED_MODELS)
def test_shipped_models_load_and_run(name):
    if not (MODELS_DIR / name).is_dir():
        pytest.skip(f"models/{name} not trained yet")
    policy = load_policy(name)
    sim = build_scenario("synthetic:30:1.0", "16x4", seed=0).simulator(seed=0)
    result = run_policy(sim, policy.act)
    assert result.finished and result.metrics["jobs_completed"] == 30


@pytest.mark.parametrize("bad", ["nope", "/definitely/not/a/model"])
def test_evaluate_rejects_unknown_policies_in_one_line(tmp_path, bad):
    proc = subprocess.run(
        [sys.executable, "-m", "rlalloc.cli.main", "evaluate", "--policies", f"static,{bad}",
         "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2  # a user error, not a crash (1)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and bad in lines[0] and "static" in lines[0]
    assert "Traceback" not in proc.stderr


def test_a_file_of_a_saved_model_is_refused_naming_its_directory(tmp_path):
    """`--policy DIR/policy.pt` said "unknown policy" and listed the built-in names."""
    model = tmp_path / "my-ppo"
    model.mkdir()
    for name in ("policy.json", "policy.pt"):
        (model / name).write_text("{}")
    with pytest.raises(UserError, match="is a file, not a saved model; give its directory, "
                                        + re.escape(str(model)) + "$"):
        load_policy(str(model / "policy.pt"))
    (tmp_path / "jobs.csv").write_text("job_id\n")
    with pytest.raises(UserError, match="is a file, not a saved model; give the directory"):
        load_policy(str(tmp_path / "jobs.csv"))
    (tmp_path / "empty").mkdir()  # named only `rlalloc train`, not the other two writers
    with pytest.raises(UserError, match="empty: not a saved policy .*; give the directory that "
                                        "`rlalloc train`, `sizes fit` or `planner fit` wrote$"):
        load_policy(str(tmp_path / "empty"))


@pytest.mark.parametrize("damage", ["weights-not-torch", "meta-a-list", "meta-foreign-spec",
                                    "meta-algo-a2c", "meta-ppo-unmasked", "meta-masked-a-string",
                                    "meta-residual-a-name",
                                    "meta-residual-unknown"])
def test_a_damaged_saved_model_is_one_line(tmp_path, damage):
    """Each of these tracebacked (UnpicklingError, AttributeError, TypeError), was reported as
    an observation size mismatch (residual), or loaded and ran as another algorithm than it
    was trained with (algo, masked), instead of naming the directory and the fix."""
    model = tmp_path / "model"
    model.mkdir()
    for name in ("policy.json", "policy.pt"):
        (model / name).write_bytes((MODELS_DIR / "dqn" / name).read_bytes())
    load_policy(str(model))  # intact, it loads
    meta = json.loads((model / "policy.json").read_text())
    if damage == "weights-not-torch":
        (model / "policy.pt").write_text("not a torch file\n")
    elif damage == "meta-a-list":
        (model / "policy.json").write_text("[1, 2]\n")
    else:
        meta |= {"meta-foreign-spec": {"feature_spec": {**meta["feature_spec"], "slots": 16}},
                 "meta-algo-a2c": {"algo": "a2c"},
                 "meta-ppo-unmasked": {"algo": "ppo", "masked": False},
                 "meta-masked-a-string": {"masked": "yes"},
                 "meta-residual-a-name": {"residual": "elastic"},
                 "meta-residual-unknown": {"residual": ["nope"]}}[damage]
        (model / "policy.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match=f"^{re.escape(str(model))}: damaged saved policy .*; "
                                        r"restore it from a copy or train it again \(`rlalloc "
                                        "train`\\)$"):
        load_policy(str(model))


def test_evaluate_writes_results_with_cis(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "rlalloc.cli.main", "evaluate", "--workload", "synthetic:15:1.0",
         "--cluster", "2x4", "--policies", "static,elastic", "--seeds", "2", "--jobs", "1",
         "--failures", "none", "--out", str(tmp_path)], capture_output=True, text=True,
        timeout=300)
    assert proc.returncode == 0, proc.stderr
    import json

    report = json.loads((tmp_path / "results.json").read_text())
    assert set(report["policies"]) == {"static", "elastic"}
    assert {"mean", "ci95"} <= set(report["policies"]["elastic"]["avg_jct_s"])
    paired = report["paired"]
    assert paired["reference"] == "static" and set(paired["policies"]) == {"elastic"}
    assert paired["policies"]["elastic"]["avg_jct_s"]["runs"] == 2
    for png in ("jct_cdf.png", "gpu_util.png", "queue_length.png", "paired_avg_jct.png"):
        assert (tmp_path / png).stat().st_size > 0
    assert "Paired against `static`" in (tmp_path / "results.md").read_text()
    runs = pd.read_csv(tmp_path / "runs.csv")  # each run, so a mean can be cut by workload
    assert sorted(zip(runs.policy, runs.seed, strict=True)) == [("elastic", 0), ("elastic", 1),
                                                   ("static", 0), ("static", 1)]
    assert runs.finished.all() and set(runs.workload) == {"synthetic:15:1.0"}
    for name in ("static", "elastic"):
        assert runs[runs.policy == name].avg_jct_s.mean() == pytest.approx(
            report["policies"][name]["avg_jct_s"]["mean"])


def test_paired_changes_see_a_consistent_gain_that_unpaired_cis_hide():
    from rlalloc.agent.comparison_report import paired_table
    from rlalloc.agent.comparison_runs import RunSpec
    from rlalloc.agent.comparison_stats import confidence, paired_changes

    base_jct = {("w1", 0): 1_000.0, ("w2", 0): 5_000.0, ("w3", 0): 20_000.0}
    results = {}
    for (workload, seed), jct in base_jct.items():
        for policy, factor in (("a", 1.0), ("b", 0.9)):
            queue = 0.0 if workload == "w1" or policy == "a" else 60.0
            if policy == "a" and workload == "w3":  # too little queueing for a % change
                queue = 0.02
            metrics = {"avg_jct_s": jct * factor, "gpu_util": 0.5 * factor,
                       "avg_queue_s": queue}
            results[RunSpec(policy, workload, seed, "2x4", 0.0)] = {"metrics": metrics,
                                                                    "finished": True}
    paired = paired_changes(results, {"a": "a", "b": "b"}, "a",
                            metrics=("avg_jct_s", "gpu_util", "avg_queue_s"))
    assert paired["reference"] == "a" and list(paired["policies"]) == ["b"]
    jct = paired["policies"]["b"]["avg_jct_s"]
    assert jct["mean"] == pytest.approx(-10.0) and jct["ci95"] == pytest.approx(0.0, abs=1e-9)
    assert jct["better_runs"] == 3 == jct["runs"]
    assert paired["policies"]["b"]["gpu_util"]["better_runs"] == 0  # higher is better there
    # The reference (next to) never queued: no % change exists, but b queued more on 2 of 3.
    queue = paired["policies"]["b"]["avg_queue_s"]
    assert queue["mean"] is None and queue["runs_with_change"] == 0
    assert queue["better_runs"] == 0 and queue["runs"] == 3
    table = paired_table(paired)
    assert "n/a (0/3 better)" in table
    assert table.startswith("| policy | avg JCT, % change | GPU util, % change | "
                            "avg queue, % change |")
    footnote = table.splitlines()[-1]  # the n/a explained, by the reason that applies
    assert footnote.startswith("n/a: `a`'s avg queue was at most 1 s on every run")
    assert "restarts" not in footnote
    unpaired = confidence([r["metrics"]["avg_jct_s"] for s, r in results.items()
                           if s.policy == "b"])
    assert unpaired["ci95"] > 0.1 * unpaired["mean"]


def test_every_plot_draws_a_policy_in_the_same_colour(tmp_path, monkeypatch):
    import matplotlib.figure

    from rlalloc.agent.comparison_plots import write_plots
    from rlalloc.agent.comparison_runs import RunSpec

    drawn = {}
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda fig, path, **kw: drawn.__setitem__(Path(path).name, fig))
    results = {}
    for i, policy in enumerate(("static", "elastic", "ppo")):
        for seed in (0, 1):
            results[RunSpec(policy, "w", seed, "2x4", 0.0)] = {
                "metrics": {"avg_jct_s": 100.0 + 10 * i + seed}, "finished": True,
                "jcts_s": np.array([50.0, 100.0 + i]),
                "series": {"t": [0.0, 60.0], "alloc_gpus": [4, 8], "queued_jobs": [1, 0]}}
    names = {"static": "static", "elastic": "elastic", "ppo": "ppo"}
    write_plots(results, names, tmp_path, reference="static")
    def colours(png: str) -> dict[str, str]:  # by policy: equal series say "(same as X)"
        return {line.get_label().split(" (same as ")[0]: matplotlib.colors.to_hex(
            line.get_color()) for line in drawn[png].axes[0].get_lines()}

    colour = colours("jct_cdf.png")
    for png in ("gpu_util.png", "queue_length.png"):
        assert colours(png) == colour
    dots = drawn["paired_avg_jct.png"].axes[0].collections  # one per policy but the reference
    assert [matplotlib.colors.to_hex(d.get_facecolor()[0]) for d in dots] == [
        colour["elastic"], colour["ppo"]]


def _capture_figures(monkeypatch):
    """Figures by file name instead of PNGs, to check what they show."""
    import matplotlib.figure

    drawn = {}
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda fig, path, **kw: drawn.__setitem__(Path(path).name, fig))
    return drawn


def _runs_against_static(factors):
    """Two seeds of static and of each policy at `factors` times static's avg JCT."""
    from rlalloc.agent.comparison_runs import RunSpec

    results = {}
    for policy, factor in {"static": 1.0, **factors}.items():
        for seed in (0, 1):
            jct = 1_000.0 * (1 + seed) * factor * (1 + 0.02 * seed)
            results[RunSpec(policy, "data/w.csv", seed, "2x4", 0.05)] = {
                "metrics": {"avg_jct_s": jct}, "finished": True, "jcts_s": np.array([50.0, jct]),
                "series": {"t": [0.0, 60.0], "alloc_gpus": [4, 8], "queued_jobs": [1, 0]}}
    return results, {policy: policy for policy in ("static", *factors)}


@pytest.mark.parametrize("factors, scale", [({"a": 0.9, "b": 0.8}, "linear"),
                                            ({"a": 0.8, "slow": 5.5}, "log")])
def test_paired_plot_shows_each_ci_in_table_order_and_goes_log_for_a_far_off_policy(
        tmp_path, monkeypatch, factors, scale):
    """One policy 5x slower squeezed the close ones into a few pixels of a linear axis."""
    from rlalloc.agent.comparison_plots import write_plots

    drawn = _capture_figures(monkeypatch)
    write_plots(*_runs_against_static(factors), tmp_path, reference="static")
    figure = drawn["paired_avg_jct.png"]
    ax = figure.axes[0]
    figure.canvas.draw()
    assert ax.get_xscale() == scale
    assert [label.get_text() for label in ax.get_yticklabels()] == list(factors)
    assert ax.get_ylim()[0] > ax.get_ylim()[1]  # the first policy on top, as in results.md
    ci_lines = [line for line in ax.get_lines()
                if len(line.get_ydata()) == 2 and line.get_ydata()[0] == line.get_ydata()[1]]
    assert len(ci_lines) == len(factors)
    ticks = [label.get_text() for label in ax.get_xticklabels()]
    assert "0%" in ticks and all(tick.endswith("%") for tick in ticks), ticks
    assert "w.csv on 2x4, 2 seeds, failures 0.05/GPU-day" in ax.get_title()


def test_paired_axis_is_log_only_where_the_ratios_span_a_lot():
    from rlalloc.agent.comparison_plots import paired_axis_is_log

    assert not paired_axis_is_log([])
    assert not paired_axis_is_log([0.7, 1.0, 1.3])
    assert paired_axis_is_log([0.8, 5.5])


def test_policy_plots_say_what_they_show_and_keep_the_legend_off_the_data(tmp_path,
                                                                          monkeypatch):
    from rlalloc.agent.comparison_plots import write_plots

    drawn = _capture_figures(monkeypatch)
    write_plots(*_runs_against_static({"a": 0.9}), tmp_path, reference="static")
    for png, title, xlabel in (("jct_cdf.png", "JCT CDF per policy", "(h, log scale)"),
                               ("gpu_util.png", "Allocated GPUs over time", "(h)"),
                               ("queue_length.png", "Jobs waiting over time", "(h)")):
        figure = drawn[png]
        ax = figure.axes[0]
        figure.canvas.draw()
        assert title in ax.get_title() and "w.csv" in ax.get_title(), png
        assert xlabel in ax.get_xlabel(), png
        assert ax.get_legend().get_window_extent().x0 >= ax.get_window_extent().x1, png
    cdf_ticks = [label.get_text() for label in drawn["jct_cdf.png"].axes[0].get_xticklabels()]
    assert "0.1" in cdf_ticks and not any("10^" in tick for tick in cdf_ticks), cdf_ticks


def _report_of(means, paired_reference=None):
    """A results.json document of two runs per policy with these means (and a tenth of each
    as its CI)."""
    report = {"workloads": ["w"], "seeds": [0, 1], "runs_unfinished": dict.fromkeys(means, 0),
              "policies": {policy: {key: {"mean": mean, "ci95": mean / 10}
                                    for key, mean in values.items()}
                           for policy, values in means.items()}}
    if paired_reference is not None:
        report["paired"] = {"reference": paired_reference, "policies": {}}
    return report


def test_results_table_has_units_one_format_per_column_and_changes_against_the_reference():
    from rlalloc.agent.comparison_report import markdown_table, table_reference

    means = {"static": {"avg_jct_s": 29_331.0, "avg_queue_s": 27_066.0, "gpu_util": 0.7,
                        "restarts_per_job": 0.02, "progress_preserved": 1.0},
             "elastic": {"avg_jct_s": 5_367.0, "avg_queue_s": 0.2, "gpu_util": 0.92,
                         "restarts_per_job": 1.556, "progress_preserved": 0.994},
             "ppo": {"avg_jct_s": 4_167.0, "avg_queue_s": 7.18, "gpu_util": 0.9225,
                     "restarts_per_job": 1.766, "progress_preserved": 0.999}}
    metrics = ("avg_jct_s", "avg_queue_s", "gpu_util", "restarts_per_job", "progress_preserved")
    report = _report_of(means, paired_reference="elastic")
    assert table_reference(report) == "elastic"
    lines = markdown_table(report, metrics).splitlines()
    assert lines[0] == ("| policy | avg JCT (s) | avg queue (s) | GPU util (0-1) | restarts/job "
                        "| progress preserved (0-1) |")
    # against elastic, the paired reference, not static; no % against 0.2 s of queueing
    assert lines[2] == ("| static | 29,331 ± 2,933 (+447%) | 27,066 ± 2,707 | 0.700 ± 0.070 "
                        "(-24%) | 0.02 ± 0.00 (-99% ✓) | 1.000 ± 0.100 (+1% ✓) |")
    assert lines[3] == ("| elastic | 5,367 ± 537 | 0 ± 0 | 0.920 ± 0.092 | 1.56 ± 0.16 | "
                        "0.994 ± 0.099 |")
    assert lines[4] == ("| ppo | 4,167 ± 417 (-22% ✓) | 7 ± 1 | 0.922 ± 0.092 (0%) | "
                        "1.77 ± 0.18 (+13%) | 0.999 ± 0.100 (+1% ✓) |")
    assert table_reference(_report_of(means)) == "static"
    assert table_reference(_report_of({"ppo": means["ppo"]}, "ppo")) is None


def test_evaluate_rejects_a_reference_not_evaluated(tmp_path, capsys):
    from rlalloc.cli.main import main

    assert main(["evaluate", "--policies", "static,elastic", "--reference", "tiresias",
                 "--out", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert "--reference tiresias" in error and error.count("\n") == 1
    assert not (tmp_path / "results.json").exists()


@pytest.mark.expensive
def test_ppo_learns_to_start_jobs_in_n_steps(tmp_path):
    """From scratch (no warm start), MaskablePPO learns within 15,000 steps to start queued
    jobs and leave them running, on one 4-GPU node with rigid 1-GPU jobs (start and suspend
    are the only actions), reaching static FIFO's JCT, which is optimal here. Without the
    per-action charge of `ScaledReward` it learns to thrash instead (see its docstring)."""
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    rows = ["job_id,submit_s,num_gpus,duration_s,min_gpus,max_gpus"]
    rows += [f"j{i},{300 * i},1,{600 + 400 * (i % 4)},1,1" for i in range(8)]
    workload = tmp_path / "rigid.csv"
    workload.write_text("\n".join(rows) + "\n")
    env = DummyVecEnv([lambda: ScaledReward(ClusterAllocEnv((str(workload),), "1x4"), 0.1, 0.05)])
    model = MaskablePPO("MlpPolicy", env, n_steps=512, batch_size=128, learning_rate=1e-3,
                        seed=0, device="cpu", policy_kwargs={"net_arch": [64]})

    def avg_jct(decide) -> float:
        sim = build_scenario(str(workload), "1x4").simulator(seed=0)
        result = run_policy(sim, decide, limit_s=6 * 3600)  # static needs < 1 h
        return result.metrics["avg_jct_s"] if result.finished else float("inf")

    model.learn(15_000)
    learned = avg_jct(load_policy_from(model, env, tmp_path / "learned").act)
    static = avg_jct(load_policy("static").act)
    assert learned <= 1.1 * static, (learned, static)


def load_policy_from(model, env, directory):
    export_model(model, "ppo", env.envs[0].unwrapped.featurizer.spec, directory)
    return load_deployed(directory)


def test_paired_tick_labels_keep_every_digit_of_the_tick():
    from rlalloc.agent.comparison_plots import _percent

    # `.0f` rounded half to even: a tick at +12.5 % read "+12%", at -37.5 % "-38%"
    assert [_percent(v) for v in (12.5, -37.5, 1.25, 0.0, 1900.0, 0.1 + 0.2)] == [
        "+12.5%", "-37.5%", "+1.25%", "0%", "+1,900%", "+0.3%"]
