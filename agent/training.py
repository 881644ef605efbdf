"""Training a MaskablePPO or DQN allocation policy (`train`): checks, start, RL, export.

Recipe (docs/agent.md): behaviour-clone the best heuristic into the policy (and fit the critic
to its returns), then fine-tune with RL at a small learning rate, keeping the deployed export
of whichever policy scored best in the periodic evaluations (`eval_workloads`).
With `residual` set the heuristics are instead extra actions of the policy
(`rlalloc.agent.residual`): the actor is initialised to follow the first, only the critic is
fitted to its returns, and RL learns where to deviate (a DQN's Q-values are fitted to those
returns, the first follow action ahead by a margin). With `learn_sizes` those heuristics (and
the observation) are told job sizes learnt from the training workloads
(`rlalloc.agent.job_sizes`), and the heuristics job speeds from their applications' measured
profiles where found (`rlalloc.agent.job_speeds`), so the policy starts at the heuristic told
sizes and speeds rather than at the heuristic alone.
Rewards are scaled by a constant (`reward_scale`) rather than by VecNormalize so that the
critic's warm start and the RL returns are on the same scale.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import asdict
from pathlib import Path

import torch

from rlalloc.agent.callbacks import PeriodicEvaluation, StepsAndEvaluations, discount_callbacks
from rlalloc.agent.checkpoints import (
    CHECKPOINT_DIR,
    LAST_CHECKPOINT,
    load_model,
    save_checkpoint,
)
from rlalloc.agent.deployed import RETRAIN_TOLD, load_deployed
from rlalloc.agent.distill import load_recordings
from rlalloc.agent.heuristics import ElasticPolicy
from rlalloc.agent.job_speeds import PROFILES_DIR, read_copied_profiles, speedups_of
from rlalloc.agent.model_card import (
    CARD_FILE,
    CARD_MD_FILE,
    card_markdown,
    evaluated_at,
    exported_step,
    jct_json,
)
from rlalloc.agent.registry import load_policy
from rlalloc.agent.residual import residual_teachers
from rlalloc.agent.run_dir import (
    check_out,
    copy_run_profiles,
    resume_summary,
    resumed_profiles,
    start_run_dir,
    with_earlier_commands,
)
from rlalloc.agent.sb3_models import build_model, tensorboard_logger
from rlalloc.agent.train_config import TrainConfig, check_config
from rlalloc.agent.train_evaluation import evaluate_jct, give_up_bounds
from rlalloc.agent.training_env import (
    training_env_fns,
    training_sizes,
    training_spec,
    training_speedups,
)
from rlalloc.agent.warm_start import start_policy
from rlalloc.env.cluster import cluster_record
from rlalloc.env.errors import UserError
from rlalloc.env.output import write_atomic, write_json
from rlalloc.env.profiles import PROFILES_ENV_VAR, default_profiles_root
from rlalloc.env.progress import progress_bar, progress_task
from rlalloc.env.scenario import Scenario, build_scenario, require_applications
from rlalloc.forecaster.signals import default_signals


def train(config: TrainConfig, out: Path, resume: bool = False, force: bool = False,
          log: Callable[[str], None] = print, ray_address: str | None = None) -> dict:
    """Run `config` into directory `out` and return its summary (also saved as card.json);
    the environments step in this process, or, given `ray_address`, on the actors of that
    Ray cluster (`rlalloc.agent.ray_vec_env`: the same rollouts; joined before anything is
    written, unless this process already has).

    Everything is checked before anything is written or trained: the settings, the
    workloads and cluster (by building them), the teacher, the recordings and `out`. A new
    run refuses a directory holding any of `rlalloc.agent.run_dir.RUN_FILES` unless `force`,
    which removes them first; with `resume`, it continues from the checkpoint with the most
    timesteps in ``out/checkpoints`` up to `config.timesteps`. If no periodic evaluation
    finished every job, nothing is exported and the run ends in a `UserError` once its
    checkpoints and card are saved.
    """
    from stable_baselines3.common.callbacks import CallbackList
    from stable_baselines3.common.vec_env import VecMonitor

    assert not (resume and force), "resume continues the run in out, force replaces it"
    torch.set_num_threads(1)
    out = Path(out)
    check_config(config)
    checkpoint = check_out(config, out, resume, force)
    eval_workloads = config.eval_workloads or config.workloads[:2]
    scenarios = _check_workloads(config, eval_workloads)
    cluster_file = cluster_record(config.cluster)  # the path alone dangles once the file moves
    eval_jobs = sum(len(scenarios[w].workload.jobs) for w in eval_workloads)
    recordings = (load_recordings([Path(p) for p in config.imitate], config.residual)
                  if config.imitate and not resume else None)
    sizes = training_sizes(config, scenarios)
    resumed = resumed_profiles(out) if resume and sizes is not None else None
    profiles_root = default_profiles_root() if sizes is not None else None
    if resumed is None:
        speedups = training_speedups(sizes, profiles_root)
    else:  # the speeds the run started with, whatever this machine has now
        models = read_copied_profiles(out, list(resumed), sizes, RETRAIN_TOLD)
        speedups = speedups_of(models)
    vec_env = VecMonitor(_stepped_envs(training_env_fns(config, sizes, speedups), ray_address))
    vec_env.seed(config.seed)  # a resume seeds it anew (`load_model`)
    spec = training_spec(config)
    if recordings is not None and recordings.obs.shape[1] != vec_env.observation_space.shape[0]:
        raise UserError(f"--imitate: the recordings' observations have {recordings.obs.shape[1]}"
                        f" features, this policy's {vec_env.observation_space.shape[0]}; record "
                        "them again with this rlalloc and these --residual heuristics")
    if resume:
        config = with_earlier_commands(config, out)
    start_run_dir(config, out, force, log)
    profiles = (copy_run_profiles(out, sizes, speedups, profiles_root) if resumed is None
                else resumed)
    if sizes is not None:
        log(_speeds_line(profiles, out, resumed is not None))
    started = time.perf_counter()
    summary: dict = {"config": asdict(config), "cluster_file": cluster_file, "evaluations": [],
                     "profiles": list(profiles)}
    with progress_bar() as progress, closing(vec_env):
        if resume:
            model = load_model(config, checkpoint, vec_env)
            started -= resume_summary(summary, out, model.num_timesteps)
            model.set_logger(tensorboard_logger(out, config.algo, model.num_timesteps + 1))
        else:
            model = build_model(config, vec_env)
            model.set_logger(tensorboard_logger(out, config.algo))
            summary["warm_start"] = start_policy(config, model, log, progress, recordings,
                                                 sizes, speedups, profiles)
            model.acts_from_start = summary["warm_start"] is not None  # read by a DQN only
        with progress_task(progress, "evaluate static (the bound to give up at)",
                           eval_jobs) as advance:
            give_up = give_up_bounds(config, eval_workloads, on_progress=advance)
        evaluate = PeriodicEvaluation(config, out, spec, summary, started, progress,
                                      eval_workloads, eval_jobs, give_up, sizes, speedups,
                                      profiles, log)
        # a new run, or one killed before evaluating the checkpoint it resumes from
        if not evaluated_at(summary, model.num_timesteps):
            evaluate(model, model.num_timesteps)
        remaining = config.timesteps - model.num_timesteps
        if remaining > 0:
            with progress_task(progress, "RL steps", remaining) as advance:
                periodic = StepsAndEvaluations(advance, evaluate, out, config.eval_every,
                                               config.keep_checkpoints)
                callbacks = CallbackList([*discount_callbacks(config), periodic])
                model.learn(remaining, callback=callbacks, reset_num_timesteps=not resume)
            if not evaluated_at(summary, model.num_timesteps):
                evaluate(model, model.num_timesteps)
        save_checkpoint(model, out / CHECKPOINT_DIR / LAST_CHECKPOINT)
        summary["timesteps"] = int(model.num_timesteps)
        summary["wall_s"] = time.perf_counter() - started
        summary["best_avg_jct_s"] = jct_json(evaluate.best)
        summary["exported_timesteps"] = exported_step(summary["evaluations"])
        summary["heuristic_avg_jct_s"] = {}
        # sia plans on the state's speeds per type: it is told sizes only
        told = () if sizes is None else tuple(
            (f"{t.name}, sizes learned"
             + (", speeds profiled" if speedups and isinstance(t, ElasticPolicy) else ""), t)
            for t in residual_teachers(config.residual, sizes, speedups))
        plain = dict.fromkeys((*config.residual, config.warm_start or "elastic", "static"))
        for name, policy in (*told, *((n, load_policy(n)) for n in plain)):
            with progress_task(progress, f"evaluate {name}", eval_jobs) as advance:
                summary["heuristic_avg_jct_s"][name] = jct_json(evaluate_jct(
                    policy.act, config, eval_workloads, on_progress=advance))
    write_json(out / CARD_FILE, summary)
    write_atomic(out / CARD_MD_FILE, card_markdown(summary))
    if summary["exported_timesteps"] is None:
        raise UserError(_nothing_exported(out, summary["evaluations"]))
    load_deployed(out)  # the export must load
    return summary


def _stepped_envs(env_fns: list[Callable[[], object]], ray_address: str | None) -> object:
    """The training environments as one SB3 vector env: stepped in this process
    (`DummyVecEnv`), or by the actors of the Ray cluster at `ray_address` (`RayVecEnv`)."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    if ray_address is None:
        return DummyVecEnv(env_fns)
    from rlalloc.agent.ray_vec_env import RayVecEnv
    from rlalloc.env.ray_cluster import connect

    connect(ray_address)
    return RayVecEnv(env_fns)


def _check_workloads(config: TrainConfig,
                     eval_workloads: tuple[str, ...]) -> dict[str, Scenario]:
    """Build every training and evaluation workload on the cluster, so that a bad path,
    workload spec or cluster fails now rather than after the warm start; return them by
    name (the job counts size the evaluations' progress bars, the training ones the size
    table of `training_sizes`); `require_applications` of the training workloads."""
    scenarios = {workload: build_scenario(workload, config.cluster, efficiency=config.efficiency,
                                          signals=default_signals())
                 for workload in dict.fromkeys((*config.workloads, *eval_workloads))}
    require_applications([scenarios[w] for w in config.workloads], config.efficiency,
                         list(config.workloads))
    return scenarios


def _speeds_line(profiles: tuple[str, ...], out: Path, resumed: bool) -> str:
    """The log line saying what a `learn_sizes` run's heuristics rank growth by (a resumed
    run: what they ranked by when it started, `resumed_profiles`)."""
    if profiles:
        return (f"--learn-sizes: the heuristics are told job speeds from the profiles of "
                f"{', '.join(profiles)} (copied into {out / PROFILES_DIR})")
    if resumed:
        return ("--learn-sizes: resumed on the state's speed-up curves, which the run's "
                "heuristics started with")
    return (f"--learn-sizes: no application of the size table has a profile (shipped or in "
            f"{PROFILES_ENV_VAR}), so the heuristics rank by the state's speed-up curves")


def _nothing_exported(out: Path, evaluations: list[dict]) -> str:
    """Why a run ended without a policy, and what to do (one line)."""
    steps = ", ".join(f"{e['timesteps']:,}" for e in evaluations)
    return (f"{out}: no evaluation finished every job (steps {steps}: the policy left jobs "
            "waiting until the time limit, or was given up as far worse than static), so no "
            "policy was exported, as it would strand jobs in a cluster too; checkpoints and "
            "card.json are kept: continue "
            "with --resume and a larger --timesteps, or change --warm-start, --dagger-rounds or "
            "--learning-rate")
