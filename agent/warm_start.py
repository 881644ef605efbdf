"""Where a policy starts before RL: cloned from a heuristic, or residual over heuristics."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import numpy as np
from rich.progress import Progress

from rlalloc.agent.distill import Recording, fit_advantages, prefer_base
from rlalloc.agent.export import deployed_net, in_memory_policy, uses_mask
from rlalloc.agent.heuristics import Speedups
from rlalloc.agent.imitation import collect_demonstrations, concatenate, fit_policy
from rlalloc.agent.job_sizes import JobSizeHistory
from rlalloc.agent.registry import load_policy
from rlalloc.agent.residual import (
    FirstProposal,
    follow_first,
    init_follow_head,
    init_follow_q_head,
)
from rlalloc.agent.train_config import TrainConfig
from rlalloc.agent.training_env import make_training_env
from rlalloc.env.progress import progress_task

T = TypeVar("T")
DQN_FOLLOW_MARGIN = 1.0
"""A residual DQN starts with the first follow action's Q-value this many standard deviations
of the fitted returns above every other action's, so that the TD updates of actions tried
elsewhere, which generalise across states, do not at once flip the greedy choice where nothing
else was tried; a tried deviation's TD target carries the margin too, so one that pays can
still overturn it. (Tried at 0.05 and 1.0: either way RL soon moved the greedy policy off the
heuristic, for the worse; docs/experiments/2026-11-24-residual-dqn.md.)"""


def start_policy(config: TrainConfig, model: object, log: Callable[[str], None],
                 progress: Progress, recordings: Recording | None, sizes: JobSizeHistory | None,
                 speedups: Speedups | None, profiles: tuple[str, ...]) -> dict | None:
    """Where the policy starts before RL (described for the card): residual, cloned from
    the warm-start heuristic, or (None) SB3's initialisation."""
    workloads = len(config.workloads)
    if config.residual:
        steps = workloads + 1 + (recordings is not None)
        with progress_task(progress, "residual start", steps) as step:
            return _residual_start(config, model, log, step, recordings, sizes, speedups,
                                   profiles)
    if config.warm_start:
        steps = (config.dagger_rounds + 1) * (workloads + 1)
        with progress_task(progress, "warm start", steps) as step:
            return _warm_start(config, model, log, step)
    return None


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
        student = in_memory_policy(net, config.algo, envs[0].unwrapped.featurizer.spec,
                                   masked=uses_mask(model, config.algo))
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
    the advantages its forks measured instead (`rlalloc.agent.distill`). `sizes` and
    `speedups`: what the heuristics are told (`training_sizes`, `training_speedups`; `profiles`
    the applications behind the latter). `step` is called after each rollout and each fit."""
    envs = [make_training_env(config, (workload,), sizes, speedups)
            for workload in config.workloads]
    demos = concatenate([  # the labels are the driver's: it follows the first heuristic
        _stepped(step, collect_demonstrations(env, FirstProposal(env.unwrapped.featurizer),
                                              config.bc_episodes_per_workload,
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
        info["job_sizes"] = {"curves": len(sizes.work_s), "jobs": sizes.past_jobs,
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
