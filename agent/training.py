"""Training MaskablePPO and DQN allocation policies: configuration, environments, warm start,
periodic evaluation, checkpoints and export.

Recipe (docs/agent.md): behaviour-clone the best heuristic into the policy (and fit the critic
to its returns), then fine-tune with RL at a small learning rate, keeping the deployed export
of whichever policy scored best on the training workloads during the periodic evaluations.
With `residual` set the heuristics are instead extra actions of the policy (`rlalloc.agent.residual`):
the actor is initialised to follow the first, only the critic is fitted to its returns, and
RL learns where to deviate (a DQN's Q-values are fitted to those returns, the first follow
action ahead by a margin). With `learn_sizes` those heuristics (and the observation) are told
job sizes learnt from the training workloads (`rlalloc.agent.job_sizes`), and the heuristics job speeds
from their applications' measured profiles where found (`rlalloc.agent.job_speeds`), so the policy
starts at the heuristic told sizes and speeds rather than at the heuristic alone.
Rewards are scaled by a constant (`reward_scale`) rather than by VecNormalize so that the
critic's warm start and the RL returns are on the same scale.
"""

from __future__ import annotations

import io
import json
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from functools import cache, partial
from pathlib import Path
from typing import TypeVar

import gymnasium as gym
import numpy as np
import torch
from rich.progress import Progress

from rlalloc.agent.deployed import META_FILE, RETRAIN_TOLD, WEIGHTS_FILE, load_deployed
from rlalloc.agent.distill import Recording, fit_advantages, load_recordings, prefer_base
from rlalloc.agent.evaluation import RunResult, run_policy
from rlalloc.agent.export import deployed_net, export_model, in_memory_policy
from rlalloc.agent.heuristics import Speedups
from rlalloc.agent.imitation import collect_demonstrations, concatenate, fit_policy
from rlalloc.agent.job_sizes import JobSizeHistory, learn_sizes
from rlalloc.agent.job_speeds import (
    PROFILES_DIR,
    copy_profiles,
    profile_models,
    read_copied_profiles,
    speedups_of,
)
from rlalloc.agent.registry import MODEL_META_FILE, load_policy, refuse_other_policy
from rlalloc.agent.residual import (
    follow_first,
    init_follow_head,
    init_follow_q_head,
    make_residual,
    residual_teachers,
)
from rlalloc.env.cluster import cluster_markdown, cluster_record
from rlalloc.env.errors import UserError
from rlalloc.env.failures import FailureParams, parse_failure_rate
from rlalloc.env.gym_env import ClusterAllocEnv, RewardWeights
from rlalloc.env.output import (
    prepare_out_dir,
    remove_outputs,
    staged_outputs,
    write_atomic,
    write_json,
)
from rlalloc.env.params import SimParams
from rlalloc.env.profiles import PROFILES_ENV_VAR, cached_profiles, default_profiles_root
from rlalloc.env.progress import progress_bar
from rlalloc.env.scenario import Scenario, build_scenario, require_applications
from rlalloc.env.simulator import GiveUp
from rlalloc.forecaster.signals import default_signals

T = TypeVar("T")
CONFIG_FILE = "train_config.json"
CARD_FILE = "card.json"
CARD_MD_FILE = "card.md"
CHECKPOINT_DIR = "checkpoints"
LAST_CHECKPOINT = "last.zip"
TB_DIR = "tb"
RUN_FILES = (WEIGHTS_FILE, META_FILE, PROFILES_DIR, CONFIG_FILE, CARD_FILE, CARD_MD_FILE,
             CHECKPOINT_DIR, TB_DIR)
"""Everything a run writes into its directory. A new run refuses to write over any of them
without --force, and --force removes them all first: left behind, the replaced run's
checkpoints would be what --resume continues, its curves would show in TensorBoard as this
run's, and its policy would stand for this run's if this one exported none."""
DQN_FOLLOW_MARGIN = 1.0
"""A residual DQN starts with the first follow action's Q-value this many standard deviations
of the fitted returns above every other action's, so that the TD updates of actions tried
elsewhere, which generalise across states, do not at once flip the greedy choice where nothing
else was tried; a tried deviation's TD target carries the margin too, so one that pays can
still overturn it. (Measured at 0.05 and 1.0: either way RL moved the greedy policy off the
heuristic, for the worse, within 16-32k steps; docs/agent.md, "Residual DQN".)"""


@dataclass(frozen=True)
class TrainConfig:
    """One training run; saved as train_config.json next to the model so it can be re-run."""

    algo: str = "ppo"
    """'ppo' (sb3-contrib MaskablePPO, reads the action mask) or 'dqn' (no mask)."""
    workloads: tuple[str, ...] = ("synthetic:160:1.0",)
    """Training workloads; each episode replays one, chosen at random."""
    cluster: str = "16x4"
    timesteps: int = 100_000
    """RL environment steps after the warm start."""
    seed: int = 0
    failures: str = "none"
    """Failure rate during training: a preset name or failures per GPU-day."""
    efficiency: str = "none"
    """Profiled jobs' progress model in training and its evaluations (`--efficiency`)."""
    n_envs: int = 2
    """Environments stepped in lock-step in one process (DummyVecEnv: a step costs ~0.2 ms,
    less than a sub-process round trip)."""
    net_arch: tuple[int, ...] = (128, 128)
    learning_rate: float = 1e-4
    """PPO and DQN alike (`rlalloc train`'s default for both): small, since large steps undo
    the warm start, but not 3e-5, which fell behind 1e-4 on workload-1..6 (3,862 vs 3,667 s;
    docs/agent.md, "What was tried"). 1e-4 is the raw-action recipe's and the shipped DQN's;
    the residual recipes pass 3e-4 to 1e-3 (models/ppo/card.md)."""
    n_steps: int = 1024
    """PPO steps per environment per update (`--n-steps`); larger = less noisy updates."""
    batch_size: int = 256
    n_epochs: int = 4
    gamma: float = 0.99
    time_discount_s: float = 0.0
    """Semi-MDP discount: time constant (simulated seconds) of exp(-t/T), applied on top of
    `gamma` per step (`RewardWeights.time_discount_s`, `rlalloc.agent.smdp`; PPO only); 0: off. With
    it, set gamma 1 so that zero-time actions are not discounted at all."""
    gae_lambda: float = 0.95
    """GAE lambda (`--gae-lambda`): lower trusts the critic sooner, less variance, more bias."""
    clip_range: float = 0.1
    ent_coef: float = 0.0
    target_kl: float = 0.02
    reward_scale: float = 0.01
    """Rewards (minus job-hours per step) are multiplied by this."""
    action_cost: float = 0.0
    """Charged (after scaling) per applied action; see `ScaledReward` for why. 0 for the
    shipped PPO; 0.05 (= 5 job-hours at reward_scale 0.01) after the warm start made PPO
    worse (best 3,924 s vs 3,667 s on workload-1..6): too large, a smaller one is untested."""
    warm_start: str = "elastic"
    """Heuristic to behaviour-clone before RL ('' for none); unused with `residual`."""
    residual: tuple[str, ...] = ()
    """Heuristics behind extra "follow its proposal" actions (`rlalloc.agent.residual`);
    none for the raw action space. Replaces the warm start by `_residual_start`."""
    learn_sizes: bool = False
    """Residual only: fit a job-size table on the training workloads (`JobSizeHistory`), tell
    it to the residual heuristics and show it in the observation; tell them job speeds from
    the profiles of its applications too (`training_speedups`). The table is saved in the
    model, copies of the profiles beside it."""
    imitate: tuple[str, ...] = ()
    """Lookahead recordings (`rlalloc headroom --record`) the residual actor is fitted to
    before RL (`rlalloc.agent.distill`); none: the actor starts as the first heuristic."""
    imitate_margin: float = 0.5
    """After `imitate`: job-hours a deviation must be predicted to save (`prefer_base`)."""
    residual_veto_p: float = 0.1
    """Residual PPO start: probability that the sampling policy vetoes the first heuristic."""
    residual_raw_p: float = 0.02
    """Residual PPO start: probability that the sampling policy takes a raw action instead."""
    residual_switch_p: float = 0.1
    """Residual PPO start: probability of following another heuristic where the first is idle."""
    bc_episodes_per_workload: int = 1
    bc_epochs: int = 30
    bc_learning_rate: float = 1e-3
    dagger_rounds: int = 2
    """Rounds of DAgger after cloning: the student drives, the teacher labels."""
    eval_every: int = 20_000
    """Environment steps between evaluations on the training workloads."""
    keep_checkpoints: int = 0
    """Periodic checkpoints kept, the newest ones (0: all). Each is ~2 MB, one per
    evaluation; `--resume` needs only the newest, and the best policy is exported apart."""
    eval_workloads: tuple[str, ...] = ()
    """Workloads of the periodic evaluation (default: the first two training workloads)."""
    give_up_factor: float = 3.0
    """A periodic evaluation's run is given up (counted as unfinished) once its average JCT is
    sure to exceed this many times `static`'s on the workload, or a job has waited this many
    times static's longest JCT (`give_up_bounds`; 0: never). A random start ran every
    evaluation to the time limit, over 15 minutes on one Pollux workload (a few jobs it never
    finished), to learn only that it was far worse than first come first served; no export
    should take such a policy."""
    dqn_buffer_size: int = 100_000
    dqn_exploration: tuple[float, float] = (0.05, 0.01)
    """DQN epsilon start and end (small: the warm start already acts like the heuristic)."""
    extra: dict = field(default_factory=dict)
    """Free-form notes saved with the config (the command line that produced it)."""

    def sim_params(self) -> SimParams:
        """Simulator parameters implied by `failures`."""
        rate = parse_failure_rate(self.failures)
        return SimParams(failures=FailureParams(failures_per_gpu_day=rate))


class ScaledReward(gym.Wrapper):
    """Multiplies rewards by a constant, charges each applied action, and passes
    `action_masks` through (MaskablePPO reads it with ``env_method``, which does not look
    through wrappers).

    Why the action charge: the environment's reward accrues only while simulated time passes,
    and actions at one decision point take no time. With a discount per *step*, every extra
    action pushes the (negative) rewards further into the future, so a policy that resizes a
    job back and forth at one decision point is *rewarded* for it. Measured: from scratch, on
    4 GPUs with 8 rigid jobs, PPO learnt to start and suspend jobs up to 735 times each and
    never finished the workload.
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


def make_env(config: TrainConfig, workloads: tuple[str, ...] | None = None,
             sizes: JobSizeHistory | None = None,
             speedups: Speedups | None = None) -> ClusterAllocEnv:
    """A training environment over `workloads` (default: the config's), residual if the
    config says so, its heuristics told job sizes by `sizes` (`training_sizes`) and speed-ups
    by `speedups` (`training_speedups`) if given."""
    env = ClusterAllocEnv(workloads or config.workloads, config.cluster,
                          params=config.sim_params(),
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
    (`rlalloc.env.profiles.default_profiles_root`; `rlalloc.agent.job_speeds.profile_models`); None (the
    state's curves) for other runs and where no such profile is found."""
    if sizes is None or profiles_root is None:
        return None
    models = profile_models(sizes, cached_profiles(profiles_root))
    return speedups_of(models)


def _copy_run_profiles(out: Path, sizes: JobSizeHistory | None, speedups: Speedups | None,
                       profiles_root: Path | None) -> tuple[str, ...]:
    """Copy into `out` the profiles behind `speedups` (`training_speedups`), replacing an
    earlier copy (a resumed run's) whole or not at all, and return their applications, which
    every export of the run names (`ExportMeta.profiles`); none, and no copies left, when the
    heuristics rank by the curves."""
    copied: list[str] = []
    if sizes is not None and speedups is not None:
        with staged_outputs(out) as staging:
            copied = copy_profiles(sizes, profiles_root, staging)
    if not copied:  # an earlier run's profiles must not pass for this one's
        remove_outputs(out, [PROFILES_DIR])
    return tuple(copied)


def _resumed_profiles(out: Path) -> tuple[str, ...] | None:
    """The applications whose profiles a resumed `learn_sizes` run's heuristics were told:
    those its export names (none for a model exported on the curves, or before profiles were
    copied), else those copied into `out` before its first export; None when the run kept
    neither, and only then are they looked for anew. A resume must not change what its
    teachers rank by, nor remove the copies its exported model needs."""
    meta = out / META_FILE
    if meta.is_file():
        return tuple(str(a) for a in json.loads(meta.read_text()).get("profiles", ()))
    copies = out / PROFILES_DIR
    return tuple(sorted(p.name for p in copies.iterdir() if p.is_dir())) \
        if copies.is_dir() else None


def evaluate_jct(policy: Callable, config: TrainConfig, workloads: tuple[str, ...],
                 seed: int = 0, on_progress: Callable[[int], None] | None = None,
                 give_up: dict[str, GiveUp] | None = None) -> float:
    """Mean average JCT of `policy` (a `Policy.act`) over `workloads`, one run each (infinite
    if a run leaves jobs unfinished, or is given up as its workload's `give_up` says);
    `on_progress` is told each job finished."""
    runs = _runs(policy, config, workloads, seed, on_progress, give_up)
    return float(np.mean([r.metrics["avg_jct_s"] if r.finished else math.inf
                          for r in runs.values()]))


def _runs(policy: Callable, config: TrainConfig, workloads: tuple[str, ...], seed: int = 0,
          on_progress: Callable[[int], None] | None = None,
          give_up: dict[str, GiveUp] | None = None) -> dict[str, RunResult]:
    """One run of `policy` per workload on `config`'s cluster and failures (`evaluate_jct`)."""
    params = config.sim_params()
    return {workload: run_policy(
                build_scenario(workload, config.cluster, seed=seed,
                               efficiency=config.efficiency, signals=default_signals()).simulator(params, seed=seed),
                policy, on_progress=on_progress, give_up=(give_up or {}).get(workload, GiveUp()))
            for workload in workloads}


def give_up_bounds(config: TrainConfig, workloads: tuple[str, ...],
                   on_progress: Callable[[int], None] | None = None) -> dict[str, GiveUp]:
    """Per workload, when `evaluate_jct` gives a run up: `config.give_up_factor` x `static`'s
    average and longest JCT (no bound where static leaves jobs unfinished, or for a factor of
    0)."""
    factor = config.give_up_factor
    if not factor:  # no static runs for bounds never used
        return dict.fromkeys(workloads, GiveUp())
    return {workload: GiveUp(factor * static.metrics["avg_jct_s"], factor * max(static.jcts_s))
            if static.finished else GiveUp()
            for workload, static in _runs(load_policy("static").act, config, workloads,
                                          on_progress=on_progress).items()}


DQN_LEARNING_STARTS = 1000
"""Steps a DQN collects into its replay buffer before its first update (again on a resume),
acting epsilon-greedily as after them (`_dqn_class`)."""


@cache  # one class: models built and loaded are of the same type
def _dqn_class() -> type:
    """SB3's `DQN`, acting epsilon-greedily with its own Q-network from its first step once it
    has one worth acting on (`acts_from_start`: warm-started, residual or resumed).

    SB3's DQN acts uniformly at random until `learning_starts` (the warm-up of
    `OffPolicyAlgorithm._sample_action`), which throws a warm start away: 1,000 random steps
    at the start and after every resume, and a replay buffer full of them. With
    `acts_from_start` this one takes the action `DQN.predict` samples after the warm-up (the
    greedy one, or at the exploration rate a uniform one, unmasked as ever) from the first
    step; `learning_starts` still says when the gradient updates begin. A DQN started from
    SB3's random initialisation keeps SB3's uniform warm-up, its exploration. (Built on call:
    SB3 is imported only where it is used.)"""
    from stable_baselines3 import DQN

    class WarmStartedDQN(DQN):
        acts_from_start = False

        def _sample_action(self, learning_starts: int, action_noise: object = None,
                           n_envs: int = 1) -> tuple[np.ndarray, np.ndarray]:
            return super()._sample_action(0 if self.acts_from_start else learning_starts,
                                          action_noise, n_envs)

    return WarmStartedDQN


def resumed_seed(seed: int, step: int) -> int:
    """The seed a run of `seed` resumed from its checkpoint at `step` seeds its environments,
    numpy and torch with. SB3's load seeds them with the run's own seed again, so every resume
    replayed the run's first episodes and random numbers; a fresh run keeps `seed` itself, and
    a resume from the same checkpoint is as reproducible as the run."""
    return int(np.random.SeedSequence((seed, step)).generate_state(1)[0])


def build_model(config: TrainConfig, vec_env: object) -> object:
    """The SB3 model `rlalloc train` starts from, untrained: MaskablePPO or DQN (`_dqn_class`)
    with `config`'s hyperparameters, in `vec_env` (also what `rlalloc bench sim` times)."""
    from sb3_contrib import MaskablePPO

    if config.algo == "ppo":
        return MaskablePPO(
            "MlpPolicy", vec_env, learning_rate=config.learning_rate, n_steps=config.n_steps,
            batch_size=config.batch_size, n_epochs=config.n_epochs, gamma=config.gamma,
            gae_lambda=config.gae_lambda, clip_range=config.clip_range,
            ent_coef=config.ent_coef, target_kl=config.target_kl, seed=config.seed,
            rollout_buffer_class=_rollout_buffer_class(config),
            policy_kwargs={"net_arch": {"pi": list(config.net_arch),
                                        "vf": list(config.net_arch)}},
            device="cpu", verbose=0)
    start_eps, end_eps = config.dqn_exploration
    return _dqn_class()(
        "MlpPolicy", vec_env, learning_rate=config.learning_rate,
        buffer_size=config.dqn_buffer_size, learning_starts=DQN_LEARNING_STARTS, batch_size=64,
        gamma=config.gamma, train_freq=4, target_update_interval=2000,
        exploration_initial_eps=start_eps, exploration_final_eps=end_eps,
        exploration_fraction=0.3, seed=config.seed,
        policy_kwargs={"net_arch": list(config.net_arch)}, device="cpu", verbose=0)


def _load_model(config: TrainConfig, path: Path, vec_env: object) -> object:
    """The model saved at `path`, to go on training in `vec_env`, its random streams and
    environments seeded by `resumed_seed`. A DQN's replay buffer is not in its checkpoint
    (100k transitions would make each one hundreds of MB): it starts empty and, as at the
    start, is filled with `DQN_LEARNING_STARTS` steps before the first update, instead of
    updating on batches drawn from the first few transitions."""
    from sb3_contrib import MaskablePPO

    if config.algo == "ppo":
        model = MaskablePPO.load(path, env=vec_env, device="cpu")
    else:
        model = _dqn_class().load(path, env=vec_env, device="cpu")
        model.acts_from_start = bool(config.warm_start or config.residual
                                     or model.num_timesteps >= model.learning_starts)
        model.learning_starts = model.num_timesteps + DQN_LEARNING_STARTS
    model.set_random_seed(resumed_seed(config.seed, model.num_timesteps))
    return model


def train(config: TrainConfig, out: Path, resume: bool = False, force: bool = False,
          log: Callable[[str], None] = print) -> dict:
    """Run `config` into directory `out` and return its summary (also saved as card.json).

    Everything is checked before anything is written or trained: the settings, the
    workloads and cluster (by building them), the teacher, the recordings and `out`. A new
    run refuses a directory holding any of `RUN_FILES` unless `force`, which removes them
    first; with `resume`, it continues from the checkpoint with the most timesteps in
    ``out/checkpoints`` up to `config.timesteps`. If no periodic evaluation finished every
    job, nothing is exported and the run ends in a `UserError` once its checkpoints and
    card are saved.
    """
    from stable_baselines3.common.callbacks import BaseCallback, CallbackList
    from stable_baselines3.common.vec_env import DummyVecEnv, VecMonitor

    assert not (resume and force), "resume continues the run in out, force replaces it"
    torch.set_num_threads(1)
    out = Path(out)
    check_config(config)
    checkpoint = _check_out(config, out, resume, force)
    eval_workloads = config.eval_workloads or config.workloads[:2]
    scenarios = _check_workloads(config, eval_workloads)
    cluster_file = cluster_record(config.cluster)  # the path alone dangles once the file moves
    eval_jobs = sum(len(scenarios[w].workload.jobs) for w in eval_workloads)
    recordings = (load_recordings([Path(p) for p in config.imitate], config.residual)
                  if config.imitate and not resume else None)
    sizes = training_sizes(config, scenarios)
    resumed = _resumed_profiles(out) if resume and sizes is not None else None
    profiles_root = default_profiles_root() if sizes is not None else None
    if resumed is None:
        speedups = training_speedups(sizes, profiles_root)
    else:  # the speeds the run started with, whatever this machine has now
        models = read_copied_profiles(out, list(resumed), sizes, RETRAIN_TOLD)
        speedups = speedups_of(models)
    vec_env = VecMonitor(DummyVecEnv([
        (lambda: make_training_env(config, sizes=sizes, speedups=speedups))
        for _ in range(config.n_envs)]))
    vec_env.seed(config.seed)  # a resume seeds it anew (`_load_model`)
    spec = vec_env.envs[0].unwrapped.featurizer.spec
    if recordings is not None and recordings.obs.shape[1] != vec_env.observation_space.shape[0]:
        raise UserError(f"--imitate: the recordings' observations have {recordings.obs.shape[1]}"
                        f" features, this policy's {vec_env.observation_space.shape[0]}; record "
                        "them again with this rlalloc and these --residual heuristics")
    if resume:
        config = _with_earlier_commands(config, out)
    _start_run_dir(config, out, force, log)
    profiles = (_copy_run_profiles(out, sizes, speedups, profiles_root) if resumed is None
                else resumed)
    if sizes is not None:
        log(_speeds_line(profiles, out, resumed is not None))
    started = time.perf_counter()
    summary: dict = {"config": asdict(config), "cluster_file": cluster_file, "evaluations": [],
                     "profiles": list(profiles)}
    with progress_bar() as progress:
        if resume:
            model = _load_model(config, checkpoint, vec_env)
            started -= _resume_summary(summary, out, model.num_timesteps)
            model.set_logger(tensorboard_logger(out, config.algo, model.num_timesteps + 1))
        else:
            model = build_model(config, vec_env)
            model.set_logger(tensorboard_logger(out, config.algo))
            summary["warm_start"] = _start(config, model, log, progress, recordings, sizes,
                                           speedups, profiles)
            model.acts_from_start = summary["warm_start"] is not None  # read by a DQN only
        best = min(map(_jct_read, summary["evaluations"]), default=math.inf)
        with _task(progress, "evaluate static (the bound to give up at)", eval_jobs) as advance:
            give_up = give_up_bounds(config, eval_workloads, on_progress=advance)

        def evaluate_now(step: int) -> float:
            nonlocal best
            net, _ = deployed_net(model, config.algo)
            policy = in_memory_policy(net, config.algo, spec, residual=config.residual,
                                      sizes=sizes, speedups=speedups)
            with _task(progress, f"evaluate step {step:,}", eval_jobs) as advance:
                jct = evaluate_jct(policy.act, config, eval_workloads, on_progress=advance,
                                   give_up=give_up)
            summary["evaluations"].append({"timesteps": step, "avg_jct_s": _jct_json(jct),
                                           "wall_s": time.perf_counter() - started})
            write_json(out / CARD_FILE, summary)  # kept if killed
            if jct < best:
                best = jct
                export_model(model, config.algo, spec, out, residual=config.residual,
                             sizes=sizes, profiles=profiles)
            log(f"step {step}: avg JCT {_seconds(_jct_json(jct))} on {len(eval_workloads)} "
                f"training workload(s) (best {_seconds(_jct_json(best))})")
            # at its own step, now: SB3 dumps at rollout or episode ends, by which time a later
            # evaluation may have replaced it (DQN), and never after the last step
            model.logger.record("eval/avg_jct_s", jct)
            model.logger.dump(step)
            return jct

        # a new run, or one killed before evaluating the checkpoint it resumes from
        if not _evaluated_at(summary, model.num_timesteps):
            evaluate_now(model.num_timesteps)
        remaining = config.timesteps - model.num_timesteps
        if remaining > 0:
            with _task(progress, "RL steps", remaining) as advance:

                class StepsAndEvaluations(BaseCallback):
                    """Counts the steps; every `eval_every`, checkpoints and then evaluates
                    (in that order, so that every evaluation on the card has a checkpoint to
                    resume from)."""

                    def _on_step(self) -> bool:
                        advance(vec_env.num_envs)
                        if self.num_timesteps % config.eval_every < vec_env.num_envs:
                            save_checkpoint(model, out / CHECKPOINT_DIR /
                                            f"step_{self.num_timesteps}_steps.zip")
                            prune_checkpoints(out, config.keep_checkpoints)
                            evaluate_now(self.num_timesteps)
                        return True

                callbacks = CallbackList([*_discount_callbacks(config), StepsAndEvaluations()])
                model.learn(remaining, callback=callbacks, reset_num_timesteps=not resume)
            if not _evaluated_at(summary, model.num_timesteps):
                evaluate_now(model.num_timesteps)
        save_checkpoint(model, out / CHECKPOINT_DIR / LAST_CHECKPOINT)
        summary["timesteps"] = int(model.num_timesteps)
        summary["wall_s"] = time.perf_counter() - started
        summary["best_avg_jct_s"] = _jct_json(best)
        summary["exported_timesteps"] = exported_step(summary["evaluations"])
        summary["heuristic_avg_jct_s"] = {}
        told_what = "sizes learned" + (", speeds profiled" if speedups else "")
        told = () if sizes is None else tuple(
            (f"{t.name}, {told_what}", t)
            for t in residual_teachers(config.residual, sizes, speedups))
        plain = dict.fromkeys((*config.residual, config.warm_start or "elastic", "static"))
        for name, policy in (*told, *((n, load_policy(n)) for n in plain)):
            with _task(progress, f"evaluate {name}", eval_jobs) as advance:
                summary["heuristic_avg_jct_s"][name] = _jct_json(evaluate_jct(
                    policy.act, config, eval_workloads, on_progress=advance))
    write_json(out / CARD_FILE, summary)
    write_atomic(out / CARD_MD_FILE, card_markdown(summary))
    if summary["exported_timesteps"] is None:
        raise UserError(_nothing_exported(out, summary["evaluations"]))
    load_deployed(out)  # the export must load
    return summary


def check_config(config: TrainConfig) -> None:
    """Refuse settings that SB3, the residual start or the simulator would reject only after
    minutes of work (each flag's own range is checked where it is parsed, `rlalloc.cli.train`;
    these are the combinations, and the names)."""
    if not (config.give_up_factor == 0 or 1 <= config.give_up_factor < math.inf):
        raise UserError(f"give_up_factor {config.give_up_factor}: 0 (never give up) or a finite "
                        "factor of at least 1 (a run is given up past that many times static)")
    if config.time_discount_s > 0 and config.algo != "ppo":
        raise UserError("--time-discount-s needs --algo ppo (agent.smdp discounts PPO's GAE)")
    if config.imitate and config.algo != "ppo":
        raise UserError("--imitate fits a PPO actor to the lookahead's advantages; use --algo "
                        "ppo, or --residual without --imitate for DQN")
    if config.learn_sizes:
        if not config.residual:
            raise UserError("--learn-sizes tells the residual heuristics job sizes; give "
                            "--residual too, e.g. elastic-srpt-0.25,elastic-srpt,elastic")
        if config.efficiency != "none":
            raise UserError(f"--learn-sizes needs --efficiency none: under {config.efficiency} "
                            "a job's speed curve changes every epoch, so a size table keyed "
                            "by it recognises no job")
        residual_teachers(config.residual, JobSizeHistory({}, {}))  # elastic ones only
    if config.imitate and not config.residual:
        raise UserError("--imitate fits a residual policy; give --residual with the "
                        "recording's base and alternatives, e.g. "
                        "elastic-srpt-0.25,elastic-srpt,elastic")
    if config.algo == "ppo" and config.n_steps * config.n_envs < 2:
        raise UserError(f"--n-steps {config.n_steps} x --n-envs {config.n_envs}: a PPO rollout "
                        "needs at least 2 steps (its advantages are normalised over them)")
    if config.algo == "ppo" and config.batch_size > config.n_steps * config.n_envs:
        # SB3 would take the whole rollout as one minibatch, silently ignoring the flag
        raise UserError(f"--batch-size {config.batch_size} is more than a rollout's --n-steps "
                        f"{config.n_steps} x --n-envs {config.n_envs} steps; give at most "
                        f"{config.n_steps * config.n_envs} or a larger --n-steps")
    if repeated := sorted({n for n in config.residual if config.residual.count(n) > 1}):
        raise UserError(f"--residual {','.join(config.residual)}: {', '.join(repeated)} is given "
                        "twice (its follow actions would be the same action); name each once")
    if config.residual:
        residual_teachers(config.residual)  # unknown names, before --out is looked at
    for flag, probability in (("--residual-veto-p", config.residual_veto_p),
                              ("--residual-raw-p", config.residual_raw_p),
                              ("--residual-switch-p", config.residual_switch_p)):
        if config.residual and not 0.0 < probability < 1.0:
            raise UserError(f"{flag} {probability:g}: must be strictly between 0 and 1 (the "
                            "start's logits are its log-odds); use e.g. 0.001 for almost never")
    parse_failure_rate(config.failures)
    if config.warm_start and not config.residual:
        load_policy(config.warm_start)  # fails fast with the list of valid names


def _check_out(config: TrainConfig, out: Path, resume: bool, force: bool) -> Path | None:
    """The checkpoint a resumed run continues from (None for a new run); a `UserError` if
    `out` holds an earlier run and neither `resume` nor `force` says what to do with it, or
    if a resume finds no run there, changes the network's algorithm or action space or would
    add no steps."""
    refuse_other_policy(out, MODEL_META_FILE)  # not ours to replace, ambiguous beside a model
    earlier = [name for name in RUN_FILES if (out / name).exists()]
    if not resume:
        if earlier and not force:
            raise UserError(f"{out}: holds an earlier run ({', '.join(earlier)}); pass --force "
                            "to replace all of it (checkpoints and TensorBoard logs included),"
                            " --resume to continue it, or choose another --out")
        return None
    if not earlier:
        raise UserError(f"--resume: there is no run in {out} to resume; leave out --resume to "
                        "start one there")
    checkpoint = latest_checkpoint(out)
    if checkpoint is None:
        raise UserError(f"{out}: nothing to resume (no checkpoint in {out / CHECKPOINT_DIR}, "
                        "as a run stopped before its first leaves none); start it again with "
                        "--force in place of --resume (--force replaces what it left)")
    if (out / META_FILE).is_file():  # else it fails to load only after the resumed steps
        try:
            load_deployed(out)
        except UserError as err:
            raise UserError(f"--resume: the policy exported into {out} ({META_FILE}, "
                            f"{WEIGHTS_FILE}) does not load; restore both from a copy, or start "
                            "the run again with --force") from err
    previous = _run_json(out / CONFIG_FILE)
    _run_json(out / CARD_FILE)  # read once the run goes on: refused while nothing is written
    algo, residual = previous.get("algo", config.algo), tuple(previous.get("residual", ()))
    learn_sizes = previous.get("learn_sizes", False)
    if (algo, residual, learn_sizes) != (config.algo, config.residual, config.learn_sizes):
        flag = " --learn-sizes" if learn_sizes else ""
        raise UserError(f"--resume: {out} was trained with --algo {algo} --residual "
                        f"'{','.join(residual)}'{flag}; resume it with the same (they fix the "
                        "network), or start a new run in another --out")
    given = asdict(config)
    changed = [f"{_flag_of(key)} {_flag_text(previous[key])}" for key in given
               if key in previous and key not in RESUME_MAY_CHANGE
               and _flag_text(previous[key]) != _flag_text(given[key])]
    if changed:  # left out, they took their defaults: evaluations no longer comparable, and
        # SB3 restores its own settings from the checkpoint whatever train_config.json says
        raise UserError(f"--resume: {out} was trained with {'; '.join(changed)}; give the same "
                        "(a resume continues one run on one setting; train_config.json has "
                        "them all), or start a new run in another --out")
    done = checkpoint_timesteps(checkpoint)
    if done >= config.timesteps and _finished(out):
        # it would train nothing, yet rewrite the card and config with this command's numbers
        # (a run stopped after its last steps still resumes: its final evaluation is missing)
        raise UserError(f"--resume: {out} is already at {done:,} steps, --timesteps "
                        f"{config.timesteps:,} adds none; give a larger --timesteps (the "
                        "total to reach, not the steps to add)")
    return checkpoint


RESUME_MAY_CHANGE = frozenset({"timesteps", "eval_every", "keep_checkpoints", "extra"})
"""The `TrainConfig` fields a resume may change: how far it goes and how often it evaluates
and checkpoints. Every other one is the run's (the network, the training setting, the start,
the algorithm's settings, which SB3 restores from the checkpoint whatever a resume says)."""


def saved_config(out: Path) -> TrainConfig | None:
    """The `TrainConfig` of the run in `out` (its train_config.json), None if it has none: a
    resume starts from it, so that the settings `rlalloc train` has no flag for (``n_epochs``,
    ``clip_range``, ...) are the run's own rather than today's defaults."""
    saved = _run_json(Path(out) / CONFIG_FILE)
    if not saved:
        return None
    defaults = asdict(TrainConfig())
    try:
        return replace(TrainConfig(), **{
            key: tuple(value) if isinstance(defaults[key], tuple) else value
            for key, value in saved.items() if key in defaults})
    except (TypeError, ValueError) as err:  # a list field null or a number, say
        raise UserError(f"{Path(out) / CONFIG_FILE}: damaged ({err}); restore it from a copy, "
                        "or start the run again with --force (which replaces the whole run)"
                        ) from err


def _run_json(path: Path) -> dict:
    """The object a run's JSON file (train_config.json, card.json) holds, {} if there is none;
    a one-line `UserError` naming it if it is damaged."""
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        problem = f"{err.__class__.__name__}: {str(err).splitlines()[0][:80]}"
    else:
        if isinstance(value, dict):
            return value
        problem = f"it holds a {type(value).__name__}, not an object"
    raise UserError(f"{path}: damaged ({problem}); restore it from a copy, or start the run "
                    "again with --force (which replaces the whole run)")


def _flag_of(key: str) -> str:
    """The `rlalloc train` flag of `TrainConfig` field `key`."""
    return {"workloads": "--workload", "eval_workloads": "--eval-workload"}.get(
        key, "--" + key.replace("_", "-"))


def _flag_text(value: object) -> str:
    """A saved setting as the flags give it (a list of workloads as one text)."""
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value)) or "(none)"
    return str(value)


def _check_workloads(config: TrainConfig,
                     eval_workloads: tuple[str, ...]) -> dict[str, Scenario]:
    """Build every training and evaluation workload on the cluster, so that a bad path,
    workload spec or cluster fails now rather than after the warm start; return them by
    name (the job counts size the evaluations' progress bars, the training ones the size
    table of `training_sizes`); `require_applications` of the training workloads."""
    scenarios = {workload: build_scenario(workload, config.cluster, efficiency=config.efficiency, signals=default_signals())
                 for workload in dict.fromkeys((*config.workloads, *eval_workloads))}
    require_applications([scenarios[w] for w in config.workloads], config.efficiency,
                         list(config.workloads))
    return scenarios


def _start_run_dir(config: TrainConfig, out: Path, force: bool,
                   log: Callable[[str], None]) -> None:
    """Create `out` now that the run is known to start (a failed check leaves no directory
    behind), clear the earlier run's files under `force`, and save the configuration."""
    prepare_out_dir(out, [], force)
    if force and (removed := remove_outputs(out, RUN_FILES)):
        log(f"--force: removed the earlier run's {', '.join(removed)} from {out}")
    write_json(out / CONFIG_FILE, asdict(config))


def _with_earlier_commands(config: TrainConfig, out: Path) -> TrainConfig:
    """`config` with the command lines of the run it resumes (``extra["earlier_commands"]``,
    oldest first): the resume rewrites train_config.json, and a resume may change
    --timesteps, --eval-every and --keep-checkpoints, so the command that started the run is
    kept."""
    previous = _run_json(out / CONFIG_FILE).get("extra", {})
    earlier = [*previous.get("earlier_commands", []),
               *([previous["command"]] if "command" in previous else [])]
    return replace(config, extra={**config.extra, "earlier_commands": earlier}) if earlier \
        else config


def _finished(out: Path) -> bool:
    """Whether the run in `out` ended (its card has the totals written at the end)."""
    return "timesteps" in _run_json(out / CARD_FILE)


def _resume_summary(summary: dict, out: Path, step: int) -> float:
    """Take the evaluations and warm start of the run being resumed from its checkpoint at
    `step` into `summary` and return its wall seconds so far: the finished run's, else
    (killed) its last evaluation's. Evaluations past `step` (a run killed after its last
    evaluation but before its last checkpoint, or resumed from an earlier checkpoint) are of
    steps the resume trains again: they stay, marked ``discarded``, since the exported policy
    may be one of them (a later one must beat it), but they neither stand for the new steps
    nor keep them from being evaluated."""
    card = out / CARD_FILE
    previous = _run_json(card)
    summary["evaluations"] = [{**e, "discarded": True} if e["timesteps"] > step else e
                              for e in previous.get("evaluations", [])]
    summary["warm_start"] = previous.get("warm_start")
    last = summary["evaluations"][-1]["wall_s"] if summary["evaluations"] else 0.0
    return previous.get("wall_s", last)


def _start(config: TrainConfig, model: object, log: Callable[[str], None], progress: Progress,
           recordings: Recording | None, sizes: JobSizeHistory | None,
           speedups: Speedups | None, profiles: tuple[str, ...]) -> dict | None:
    """Where the policy starts before RL (described for the card): residual, cloned from
    the warm-start heuristic, or (None) SB3's initialisation."""
    workloads = len(config.workloads)
    if config.residual:
        with _task(progress, "residual start", workloads + 1 + (recordings is not None)) as step:
            return _residual_start(config, model, log, step, recordings, sizes, speedups,
                                   profiles)
    if config.warm_start:
        with _task(progress, "warm start", (config.dagger_rounds + 1) * (workloads + 1)) as step:
            return _warm_start(config, model, log, step)
    return None


@contextmanager
def _task(progress: Progress, description: str, total: float) -> Iterator[Callable[[float], None]]:
    """A bar in `progress` for one phase of the run, removed when the phase ends; yields
    the function that advances it."""
    task = progress.add_task(description, total=total)
    try:
        yield partial(progress.advance, task)
    finally:
        progress.remove_task(task)


def _evaluated_at(summary: dict, step: int) -> bool:
    """Whether the policy at `step` has been evaluated (not counting an evaluation a resume
    ``discarded``: the same step of the steps it trained again)."""
    return any(e["timesteps"] == step and not e.get("discarded")
               for e in summary["evaluations"])


def _exported_evaluation(evaluations: list[dict]) -> dict | None:
    """The evaluation whose policy was exported: the first with the lowest finite average JCT
    (a later one must beat it to replace it); None if no evaluation finished every job."""
    finished = [e for e in evaluations if math.isfinite(_jct_read(e))]
    return min(finished, key=_jct_read) if finished else None


def exported_step(evaluations: list[dict]) -> int | None:
    """The step whose policy was exported (`_exported_evaluation`), None if none was."""
    exported = _exported_evaluation(evaluations)
    return exported["timesteps"] if exported else None


def heuristic_scores(summary: dict) -> str:
    """The heuristics' average JCT on the training evaluation, as the card and `train`'s last
    line give them: "name: 2,885 s; ..." (a told heuristic's name has commas in it, and a
    heuristic that left jobs unfinished reads "unfinished")."""
    return "; ".join(f"{name}: {_seconds(jct)}"
                     for name, jct in summary["heuristic_avg_jct_s"].items())


def _jct_json(jct: float) -> float | None:
    """An average JCT as card.json holds it: None (null) for an evaluation that left jobs
    unfinished, since JSON has no infinity (json.dumps would write the non-standard
    `Infinity`)."""
    return jct if math.isfinite(jct) else None


def _jct_read(evaluation: dict) -> float:
    """An evaluation's average JCT from card.json: infinite where it did not finish (null,
    or `Infinity` in cards of older rlalloc versions)."""
    jct = evaluation["avg_jct_s"]
    return math.inf if jct is None else jct


def _seconds(jct: float | None, unit: str = " s") -> str:
    """An average JCT for the Markdown card."""
    return "unfinished" if jct is None else f"{jct:,.0f}{unit}"


def _nothing_exported(out: Path, evaluations: list[dict]) -> str:
    """Why a run ended without a policy, and what to do (one line)."""
    steps = ", ".join(f"{e['timesteps']:,}" for e in evaluations)
    return (f"{out}: no evaluation finished every job (steps {steps}: the policy left jobs "
            "waiting until the time limit, or was given up as far worse than static), so no "
            "policy was exported, as it would strand jobs in a cluster too; checkpoints and "
            "card.json are kept: continue "
            "with --resume and a larger --timesteps, or change --warm-start, --dagger-rounds or "
            "--learning-rate")


def _rollout_buffer_class(config: TrainConfig) -> type | None:
    """PPO's rollout buffer: per-step discounts under a time discount, else SB3's default."""
    if config.time_discount_s <= 0:
        return None
    from rlalloc.agent.smdp import SemiMdpRolloutBuffer
    return SemiMdpRolloutBuffer


def _discount_callbacks(config: TrainConfig) -> list:
    """The callback that feeds step discounts to PPO's buffer under a time discount."""
    if config.time_discount_s <= 0:
        return []
    from rlalloc.agent.smdp import RecordDiscounts
    return [RecordDiscounts()]


def latest_checkpoint(out: Path) -> Path | None:
    """The checkpoint with the most timesteps in ``out/checkpoints`` (periodic ones are
    ``step_<N>_steps.zip``; ``last.zip`` is written when a run ends)."""
    found = sorted((out / CHECKPOINT_DIR).glob("*.zip"))
    if not found:
        return None
    return max(found, key=checkpoint_timesteps)


def prune_checkpoints(out: Path, keep: int) -> None:
    """Remove all but the `keep` newest periodic checkpoints of ``out/checkpoints`` (by the
    step in their names; ``last.zip`` is not periodic); `keep` 0 keeps every one."""
    if keep <= 0:
        return
    periodic = sorted((out / CHECKPOINT_DIR).glob("step_*_steps.zip"),
                      key=lambda path: int(path.name.split("_")[1]))
    for old in periodic[:-keep]:
        old.unlink(missing_ok=True)


def checkpoint_timesteps(checkpoint: Path) -> int:
    """The RL steps an SB3 checkpoint zip had taken when it was saved; a `UserError` naming
    it if it cannot be read (one written by an older rlalloc that was killed while saving:
    `save_checkpoint` now writes whole files only)."""
    from stable_baselines3.common.save_util import load_from_zip_file

    try:
        return int(load_from_zip_file(checkpoint, load_data=True)[0]["num_timesteps"])
    except (ValueError, KeyError, TypeError, OSError) as err:
        raise UserError(f"{checkpoint}: damaged checkpoint ({str(err).splitlines()[0][:80]}); "
                        "delete it to resume from the one before, or start again with "
                        "--force") from None


def save_checkpoint(model: object, path: Path) -> None:
    """Save `model` (SB3 zip) to `path` whole or not at all: SB3 writes the zip in place, so
    a run killed while saving left a truncated checkpoint that `--resume` then picked."""
    buffer = io.BytesIO()
    model.save(buffer)
    path.parent.mkdir(exist_ok=True)
    write_atomic(path, buffer.getvalue())


def tensorboard_logger(out: Path, algo: str, purge_from: int | None = None) -> object:
    """The SB3 logger of a run: TensorBoard events in ``out/tb/<algo>_1`` (where SB3 would put
    them; set on the model, so a resume writes there even if `out` has moved since the
    checkpoint was saved). A resumed run purges the events from step `purge_from` on (its
    checkpoint's step + 1): the stopped run's steps after its checkpoint are taken again, and
    TensorBoard would otherwise draw both. (The checkpoint's own evaluation, if the stopped
    run got to it, is on the card before it is logged, so it is not logged twice.)"""
    from stable_baselines3.common.logger import Logger, TensorBoardOutputFormat
    from torch.utils.tensorboard import SummaryWriter

    class PurgingTensorBoard(TensorBoardOutputFormat):
        def __init__(self, folder: str) -> None:  # SB3's, with the purge step
            self.writer = SummaryWriter(log_dir=folder, purge_step=purge_from)
            self._is_closed = False

    folder = str(out / TB_DIR / f"{algo}_1")
    return Logger(folder, [PurgingTensorBoard(folder)])


def _describe_warm_start(info: dict | None) -> str:
    if not info:
        return "none"
    if "residual" in info and "imitation" in info:
        fitted = info["imitation"]
        return (f"residual over {', '.join(f'`{n}`' for n in info['residual'])}: actor fitted "
                f"to the lookahead's advantages at {fitted['contested']:,} contested of "
                f"{fitted['samples']:,} recorded steps (squared error "
                f"{fitted['advantage_mse']:.3f}), margin {fitted['margin']} job-hours; critic "
                f"fitted to the first's returns on {info['samples']:,} steps")
    if "residual" in info:
        told = info.get("job_sizes")
        start = (f"Q-values fitted to the first's returns on {info['samples']:,} steps, its "
                 f"follow action preferred by {info['q_margin']:.3g}" if "q_margin" in info else
                 f"actor initialised to follow the first (sampled veto {info['veto_p']}, raw "
                 f"action {info['raw_p']}, switch {info.get('switch_p', 0)}), critic fitted to "
                 f"its returns on {info['samples']:,} steps")
        return (f"residual over {', '.join(f'`{n}`' for n in info['residual'])}"
                + (f", told job sizes learnt from {told['jobs']:,} training jobs of "
                   f"{told['curves']} kinds{_describe_speeds(told)}" if told else "")
                + ": " + start)
    rounds = info["rounds"]
    return (f"behaviour cloning of `{info['teacher']}` + {len(rounds) - 1} DAgger round(s); "
            f"training accuracy {rounds[0]['accuracy']:.3f} -> {rounds[-1]['accuracy']:.3f} on "
            f"{rounds[-1]['samples']:,} labelled steps ({info['unexpressible']} teacher actions "
            f"had no discrete index)")


def _describe_speeds(told: dict) -> str:
    """What the told heuristics rank growth by, for the card (cards of runs before speeds were
    told lack ``profiles``: they ranked by the curves)."""
    if told.get("profiles"):
        return (f" and job speeds from the measured profiles of {', '.join(told['profiles'])} "
                f"(copied into {PROFILES_DIR}/)")
    if "profiles" in told:
        return " (speed-ups from the state's curves: no profiles were found)"
    return ""


def _speeds_line(profiles: tuple[str, ...], out: Path, resumed: bool) -> str:
    """The log line saying what a `learn_sizes` run's heuristics rank growth by (a resumed
    run: what they ranked by when it started, `_resumed_profiles`)."""
    if profiles:
        return (f"--learn-sizes: the heuristics are told job speeds from the profiles of "
                f"{', '.join(profiles)} (copied into {out / PROFILES_DIR})")
    if resumed:
        return ("--learn-sizes: resumed on the state's speed-up curves, which the run's "
                "heuristics started with")
    return (f"--learn-sizes: no application profiles found (the shared data or "
            f"{PROFILES_ENV_VAR}), so the heuristics rank by the state's speed-up curves")


def _describe_export(summary: dict) -> str:
    exported = _exported_evaluation(summary["evaluations"])
    if exported is None:
        return "none, as no periodic evaluation finished every job"
    discarded = ", before a resume trained its stretch again" if exported.get("discarded") else ""
    return (f"the best of the periodic evaluations (step {exported['timesteps']:,}{discarded}),"
            f" avg JCT {_seconds(summary['best_avg_jct_s'])}")


def card_markdown(summary: dict) -> str:
    """A readable model card from the training summary (card.json holds the same facts)."""
    config = summary["config"]
    cluster_file = summary.get("cluster_file")  # cards of older rlalloc versions lack it
    shape = f" ({cluster_file['shape']}, the file as used is below)" if cluster_file else ""
    lines = [
        f"# {config['algo'].upper()} allocation policy",
        "",
        f"- command: `{config['extra'].get('command', '(API call)')}`",
        *(f"- earlier command (resumed by the one above): `{command}`"
          for command in reversed(config["extra"].get("earlier_commands", []))),
        f"- workloads: {', '.join(Path(w).name for w in config['workloads'])}",
        f"- cluster: {config['cluster']}{shape}; failures: {config['failures']}; "
        f"efficiency: {config.get('efficiency', 'none')}; seed {config['seed']}",
        f"- RL timesteps: {summary['timesteps']:,}; wall time {summary['wall_s']:.0f} s "
        f"(2-core machine, 1 torch thread)",
        f"- warm start: {_describe_warm_start(summary.get('warm_start'))}",
        f"- exported policy: {_describe_export(summary)} on "
        f"{', '.join(Path(w).name for w in (config['eval_workloads'] or config['workloads'][:2]))}",
        f"- same evaluation for the heuristics: {heuristic_scores(summary)}",
        "",
        "| timesteps | avg JCT (s) | wall (s) |",
        "|---|---|---|",
        *(f"| {e['timesteps']:,}{' (discarded)' if e.get('discarded') else ''} | "
          f"{_seconds(e['avg_jct_s'], unit='')} | {e['wall_s']:.0f} |"
          for e in summary["evaluations"]),
        *(["", "(discarded): evaluated before a resume from an earlier checkpoint trained "
           "those steps again."] if any(e.get("discarded") for e in summary["evaluations"])
          else []),
        "",
        "Files: policy.pt (torch state_dict of the policy MLP), policy.json (format, feature "
        "spec, layer sizes), train_config.json (re-runnable configuration)"
        + (f", {PROFILES_DIR}/ (the measured profiles of {', '.join(summary['profiles'])} and "
           "their licence, which the model's heuristics rank by: it does not load without "
           "them)" if summary.get("profiles") else "") + ".",
        *(["", *cluster_markdown(cluster_file)] if cluster_file else []),
    ]
    return "\n".join(lines) + "\n"


def _warm_start(config: TrainConfig, model: object, log: Callable[[str], None],
                step: Callable[[float], None]) -> dict:
    """Behaviour-clone `config.warm_start` into `model`'s policy, then `dagger_rounds` rounds
    of DAgger (see `rlalloc.agent.imitation`); `step` is called after each rollout and each fit."""
    teacher = load_policy(config.warm_start)
    envs = [make_training_env(config, (workload,)) for workload in config.workloads]
    demos = concatenate([
        _stepped(step, collect_demonstrations(env, teacher, config.bc_episodes_per_workload,
                                              config.seed + 1000 * i, config.gamma))
        for i, env in enumerate(envs)])
    teacher_steps = len(demos.actions)
    history = []
    for round_ in range(config.dagger_rounds + 1):
        stats = _stepped(step, fit_policy(model.policy, demos, config.bc_epochs, 256,
                                          config.bc_learning_rate, config.seed + round_,
                                          value=config.algo == "ppo"))
        history.append({"samples": len(demos.actions), **stats})
        log(f"warm start round {round_}: {len(demos.actions)} labelled steps, "
            f"accuracy {stats['accuracy']:.3f}")
        if round_ == config.dagger_rounds:
            break
        net, _ = deployed_net(model, config.algo)
        student = in_memory_policy(net, config.algo, envs[0].unwrapped.featurizer.spec)
        cap = 3 * teacher_steps // max(len(envs), 1)
        demos = concatenate([demos] + [
            _stepped(step, collect_demonstrations(env, teacher, 1,
                                                  config.seed + 1000 * i + round_, config.gamma,
                                                  student.choose, cap))
            for i, env in enumerate(envs)])
    if config.algo == "dqn":
        model.q_net_target.load_state_dict(model.q_net.state_dict())
    return {"teacher": config.warm_start, "unexpressible": demos.unexpressible,
            "rounds": history}


def _residual_start(config: TrainConfig, model: object, log: Callable[[str], None],
                    step: Callable[[float], None], recordings: Recording | None = None,
                    sizes: JobSizeHistory | None = None, speedups: Speedups | None = None,
                    profiles: tuple[str, ...] = ()) -> dict:
    """Start a residual policy as its first heuristic: fit the critic to the returns of
    rollouts that always follow it, then set the action head so that its argmax is that
    heuristic, exactly, and its samples deviate with small probabilities (cloning by
    cross-entropy would make it near-deterministic, leaving RL nothing to explore). A DQN's
    Q-values are all fitted to those returns and its head then prefers the first follow
    action by `DQN_FOLLOW_MARGIN` (`init_follow_q_head`); it explores by epsilon instead.
    With `recordings` of the lookahead, the actor (from its fresh initialisation) is fitted to
    the advantages its forks measured instead (`rlalloc.agent.distill`). `sizes` and `speedups`: what
    the heuristics are told (`training_sizes`, `training_speedups`; `profiles` the applications
    behind the latter). `step` is called after each rollout and each fit."""
    envs = [make_training_env(config, (workload,), sizes, speedups)
            for workload in config.workloads]
    teacher = envs[0].unwrapped.featurizer.teachers[0]  # labels only: the driver follows it
    demos = concatenate([
        _stepped(step, collect_demonstrations(env, teacher, config.bc_episodes_per_workload,
                                              config.seed + 1000 * i, config.gamma,
                                              follow_first(len(config.residual))))
        for i, env in enumerate(envs)])
    stats = _stepped(step, fit_policy(model.policy, demos, config.bc_epochs, 256,
                                      config.bc_learning_rate, config.seed, value=True,
                                      actor=False))
    fitted = "Q-values" if config.algo == "dqn" else "critic"
    log(f"residual start: {fitted} fitted on {len(demos.actions)} steps "
        f"(loss {stats['loss']:.4f})")
    info = {"residual": list(config.residual), "samples": len(demos.actions),
            "critic_loss": stats["loss"]}
    if sizes is not None:
        info["job_sizes"] = {"curves": len(sizes.work_s), "jobs": sum(sizes.jobs.values()),
                             "profiles": list(profiles)}
    if config.algo == "dqn":
        margin = DQN_FOLLOW_MARGIN * float(np.std(demos.returns))
        init_follow_q_head(model.q_net.q_net[-1], len(config.residual), margin)
        model.q_net_target.load_state_dict(model.q_net.state_dict())
        info["q_margin"] = margin
    elif recordings is None:
        init_follow_head(model.policy.action_net, len(config.residual), config.residual_veto_p,
                         config.residual_raw_p, config.residual_switch_p)
        info.update(veto_p=config.residual_veto_p, raw_p=config.residual_raw_p,
                    switch_p=config.residual_switch_p)
    else:
        fitted = _stepped(step, fit_advantages(model.policy, recordings, config.bc_epochs, 256,
                                               config.bc_learning_rate, config.seed))
        prefer_base(model.policy.action_net, len(config.residual), config.imitate_margin)
        info["imitation"] = {"recordings": list(config.imitate),
                             "samples": len(recordings.actions),
                             "contested": int(recordings.contested.sum()),
                             "margin": config.imitate_margin, **fitted}
        log(f"imitation: actor fitted to the advantages of {info['imitation']['contested']} "
            f"contested of {len(recordings.actions)} lookahead steps (squared error "
            f"{fitted['advantage_mse']:.3f})")
    return info


def _stepped(step: Callable[[float], None], result: T) -> T:
    """`result`, once `step` has counted the part of the warm start that produced it."""
    step(1)
    return result
