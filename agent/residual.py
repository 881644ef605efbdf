"""The residual action space: the raw discrete actions plus "follow heuristic k" actions.

PPO warm-started by imitation stayed behind `elastic` on held-out workloads: the few states
where the clone disagrees with its teacher cost more than RL won back
(docs/experiments/2026-11-21-ppo-dqn-plain-heuristics.md, 2026-11-27-held-out-results.md).
Here the heuristics are part of the policy instead. One extra action per heuristic (after the
raw ones, in the order given) applies whatever that heuristic proposes for the current state,
so a policy that always picks the first one *is* that heuristic, including its resizes of
running jobs outside the visible slots, which have no raw index (a good share of elastic's
actions; docs/agent.md, "The residual action space"). No-op stays a veto and the raw
scale/suspend/migrate actions stay available, so RL has only the deviations left to learn:
vetoes, raw actions, and which heuristic to follow in which state.

`ResidualFeaturizer` is a `Featurizer` whose observation ends with a few features of each
proposal (a veto or a choice can only be learnt if the policy sees what it chooses between),
whose mask has one more entry per heuristic (valid exactly when that heuristic proposes a
change, so "follow" and "no-op" never mean the same thing), and whose `decode` returns the
proposal for a follow index. The gym environment, the evaluation and the deployed policy all
go through the featurizer, so they all see the same residual policy.

Told job sizes (`JobSizeHistory`, `rlalloc train --learn-sizes`), every heuristic ranks jobs by
the sizes of past jobs of the same kind instead of extrapolating from progress (that alone
beats elastic-srpt-0.25 on the Pollux held-out set, `rlalloc.agent.job_sizes`;
docs/experiments/2026-11-23-job-sizes.md), and the observation shows each slot's predicted
remaining work, so that a deviation can depend on it. Told speeds as well
(`rlalloc.agent.job_speeds.ProfiledSpeedups`, from the applications' measured profiles), they
rank growth by those instead of the state's fitted curve. The table travels inside the exported
model (`ExportMeta.job_sizes`), the profiles beside it (`ExportMeta.profiles`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from rlalloc.agent.catalogue import HEURISTICS
from rlalloc.agent.job_sizes import JobSizeHistory, told_sizes
from rlalloc.agent.policy import Policy, for_a_fork
from rlalloc.env.errors import UserError
from rlalloc.env.featurizer import (
    TYPE_SPEED_BOUND,
    FeatureSpec,
    Featurizer,
    speedup,
    type_speed_log2,
)
from rlalloc.env.placement import job_gpu_type
from rlalloc.env.state import Action, ActionKind, ClusterState, JobStatus

if TYPE_CHECKING:
    from rlalloc.agent.heuristics import Speedups
    from rlalloc.env.gym_env import ClusterAllocEnv

PROPOSAL_FEATURES = 10
"""Observation entries appended per heuristic (see `ResidualFeaturizer.observe`), and for a
spec with `gpu_types` `proposal_type_features` too (`proposal_size`)."""
SIZE_FEATURES = 2
"""Observation entries appended per job slot when told job sizes (see `size_features`)."""
_LOG_GPUS = math.log2(1 + 16)
_LOG_MINUTES = math.log2(1 + 60 * 24 * 7)
"""Remaining work is shown as log2(1 + minutes on one GPU), a week = 1."""


class ResidualFeaturizer(Featurizer):
    """The featurizer of the residual action space (see module docstring)."""

    def __init__(self, spec: FeatureSpec, teachers: tuple[Policy, ...],
                 sizes: JobSizeHistory | None = None) -> None:
        """`sizes`: the job-size table the teachers are told (None: not told), shown per slot
        in the observation too."""
        super().__init__(spec)
        self.teachers = teachers
        self._untouched = tuple(for_a_fork(teacher) for teacher in teachers)
        """Copies of the teachers that remember, as they were given (`start_episode`)."""
        self.sizes = sizes
        self.follow_index = spec.num_actions
        """The "do what the first heuristic proposes" action, one past the raw actions; the
        other heuristics' follow actions come right after it."""
        self.num_actions = spec.num_actions + len(teachers)
        self.obs_size = residual_obs_size(spec, len(teachers), sizes is not None)
        self._proposals: tuple[ClusterState, tuple[Action, ...]] | None = None

    def start_episode(self) -> None:
        """Give each teacher that remembers between calls (gavel, sia) a copy of itself as it
        was given: one episode's rounds and received time must not carry into the next,
        whose clock starts again at zero."""
        self.teachers = tuple(for_a_fork(teacher) for teacher in self._untouched)
        self._proposals = None

    def proposals(self, state: ClusterState) -> tuple[Action, ...]:
        """Each heuristic's action in `state` (cached for the last state: observe, mask and
        decode all ask for them, and states are immutable snapshots)."""
        if self._proposals is None or self._proposals[0] is not state:
            self._proposals = (state, tuple(t.act(state) for t in self.teachers))
        return self._proposals[1]

    def observe(self, state: ClusterState) -> np.ndarray:
        """The featurizer's observation, `proposal_features` of each proposal (then, for a
        spec with `gpu_types`, its `proposal_type_features`), then (told sizes)
        `size_features` of each slot."""
        parts = [super().observe(state)]  # first: it refuses a cluster of unknown types
        gpu_types = self.spec.gpu_types
        for action in self.proposals(state):
            parts.append(proposal_features(state, action))
            if gpu_types:
                parts.append(proposal_type_features(state, action, gpu_types))
        if self.sizes is not None:
            parts.append(self.size_features(state))
        return np.concatenate(parts)

    def size_features(self, state: ClusterState) -> np.ndarray:
        """Per job slot (in slot order, empty slots 0): whether the size table knows the job's
        kind, and its predicted remaining work as log2(1 + minutes on one GPU) / a week's."""
        assert self.sizes is not None
        extra = np.zeros((self.spec.top_k, SIZE_FEATURES), dtype=np.float32)
        rows = np.asarray(self._view(state).rows, dtype=np.int64)
        if len(rows):
            work_s = self.sizes.remaining_work(state, rows)
            known = ~np.isnan(work_s)
            extra[: len(rows), 0] = known
            extra[: len(rows), 1] = np.where(
                known, np.log2(1.0 + np.nan_to_num(work_s) / 60.0) / _LOG_MINUTES, 0.0)
        return extra.ravel()

    def action_mask(self, state: ClusterState) -> np.ndarray:
        """The raw mask, then one entry per heuristic: valid when it proposes a change."""
        return np.concatenate([super().action_mask(state),
                               [a.kind != ActionKind.NOOP for a in self.proposals(state)]])

    def decode(self, state: ClusterState, index: int) -> Action:
        """A heuristic's proposal for its follow index, else the raw action."""
        if index >= self.follow_index:
            return self.proposals(state)[index - self.follow_index]
        return super().decode(state, index)


def proposal_features(state: ClusterState, action: Action) -> np.ndarray:
    """What a proposal would do: valid, starts a queued job, shrinks, grows, migrates, the new
    and current GPUs (log-scaled), the job's progress, its restore time / 300 s, and the
    speed-up the change buys (new / current - 1, clipped to [-1, 4]). All 0 for a no-op.
    Sizes are in GPUs (the action's workers times the job's GPUs per worker), as in the
    featurizer's rows."""
    extra = np.zeros(PROPOSAL_FEATURES, dtype=np.float32)
    if action.kind == ActionKind.NOOP:
        return extra
    jobs = state.jobs
    row = state.job_index(action.job_id)
    per_worker = int(jobs.gpus_per_worker[row])
    now, new = int(jobs.workers[row]) * per_worker, int(action.workers) * per_worker
    gains = speedup(np.array([new, now]),
                    np.array([len(set(action.nodes)) or 1, len(set(jobs.placement[row])) or 1]),
                    jobs.scaling_alpha[row], jobs.scaling_beta[row])
    extra[0] = 1.0
    extra[1] = jobs.status[row] == int(JobStatus.QUEUED)
    extra[2] = action.kind == ActionKind.SCALE and 0 < new < now
    extra[3] = action.kind == ActionKind.SCALE and 0 < now < new
    extra[4] = action.kind == ActionKind.MIGRATE
    extra[5] = math.log2(1 + new) / _LOG_GPUS
    extra[6] = math.log2(1 + now) / _LOG_GPUS
    extra[7] = jobs.progress[row]
    extra[8] = jobs.restore_s[row] / 300.0
    extra[9] = min(max(gains[0] / gains[1] - 1.0, -1.0), 4.0) if gains[1] > 0 else 4.0
    return extra


def proposal_type_features(state: ClusterState, action: Action,
                           gpu_types: tuple[str, ...]) -> np.ndarray:
    """Where a proposal puts its job, for a policy built for `gpu_types` (which hold every
    type of the cluster): the one-hot of the type of its nodes, then log2 of the job's one-GPU
    speed there over that on the type it runs on now (the reference type while it holds none;
    `type_speed_log2`), clipped to +-`TYPE_SPEED_BOUND`. All 0 for a no-op or a suspend."""
    extra = np.zeros(len(gpu_types) + 1, dtype=np.float32)
    if action.kind == ActionKind.NOOP or not action.nodes:
        return extra
    nodes = state.nodes
    new_type = nodes.gpu_type[nodes.name.index(action.nodes[0])]
    row = state.job_index(action.job_id)
    current = job_gpu_type(state, row)
    extra[gpu_types.index(new_type)] = 1.0
    logs = type_speed_log2(state, np.array([row]), (new_type, current or new_type))[0]
    gain = logs[0] - (logs[1] if current is not None else 0.0)
    extra[-1] = min(max(gain, -TYPE_SPEED_BOUND), TYPE_SPEED_BOUND)
    return extra


def proposal_size(spec: FeatureSpec) -> int:
    """Observation entries per heuristic: `PROPOSAL_FEATURES`, plus `proposal_type_features`'
    one per type and one more for a spec with `gpu_types`."""
    return PROPOSAL_FEATURES + (len(spec.gpu_types) + 1 if spec.gpu_types else 0)


class FirstProposal:
    """The first heuristic's proposal as `featurizer` asks for it (this episode's copy of a
    heuristic that remembers, cached per state): labels for a warm start whose driver follows
    that heuristic, without asking it a second time."""

    def __init__(self, featurizer: ResidualFeaturizer) -> None:
        self.featurizer = featurizer
        self.name = featurizer.teachers[0].name

    def act(self, state: ClusterState) -> Action:
        """The first heuristic's action in `state`."""
        return self.featurizer.proposals(state)[0]


def residual_obs_size(spec: FeatureSpec, num_teachers: int, told_sizes: bool) -> int:
    """Observation length of a residual policy over `num_teachers` heuristics."""
    return (spec.obs_size + proposal_size(spec) * num_teachers
            + (SIZE_FEATURES * spec.top_k if told_sizes else 0))


def residual_teachers(teachers: tuple[str, ...], sizes: JobSizeHistory | None = None,
                      speedups: Speedups | None = None) -> tuple[Policy, ...]:
    """The built-in heuristics `teachers`, told job sizes by `sizes` if given and then, with
    `speedups`, job speed-ups too (None: the state's curve); a one-line UserError if one is not
    a built-in heuristic, or (told sizes) not one that ranks by them."""
    unknown = [name for name in teachers if name not in HEURISTICS]
    if unknown or not teachers:
        raise UserError(f"residual heuristics {','.join(teachers)!r}: give one or more of "
                        f"{', '.join(HEURISTICS)}")
    if sizes is None:
        return tuple(HEURISTICS[name]() for name in teachers)
    try:
        return tuple(told_sizes(name, sizes.remaining_work, name, speedups)
                     for name in teachers)
    except UserError as err:
        raise UserError(f"--learn-sizes: residual heuristic {err}") from None


def residual_featurizer(spec: FeatureSpec, teachers: tuple[str, ...],
                        sizes: JobSizeHistory | None = None,
                        speedups: Speedups | None = None) -> ResidualFeaturizer:
    """The residual featurizer following built-in heuristics `teachers`, told job sizes by
    `sizes` and speed-ups by `speedups` if given (see `residual_teachers`, also for the
    errors); the observation shows the sizes, not the speed-ups."""
    return ResidualFeaturizer(spec, residual_teachers(teachers, sizes, speedups), sizes)


def make_residual(env: ClusterAllocEnv, teachers: tuple[str, ...],
                  sizes: JobSizeHistory | None = None,
                  speedups: Speedups | None = None) -> ClusterAllocEnv:
    """`env` with the residual action space and observation, in place (the environment reads
    observations, masks and actions through its featurizer); `sizes` and `speedups` as in
    `residual_featurizer`."""
    import gymnasium as gym

    featurizer = residual_featurizer(env.featurizer.spec, teachers, sizes, speedups)
    low, high = env.observation_space.low.flat[0], env.observation_space.high.flat[0]
    env.featurizer = featurizer
    env.observation_space = gym.spaces.Box(low, high, (featurizer.obs_size,), np.float32)
    env.action_space = gym.spaces.Discrete(featurizer.num_actions)
    return env


def follow_logits(num_raw_actions: int, veto_p: float, raw_p: float,
                  switch_p: float) -> tuple[float, float, float]:
    """(no-op, first follow, other follows) logits, raw actions at 0, such that the argmax is
    exactly the first heuristic and the sampling policy deviates from it with about these
    probabilities: `raw_p` a raw action, `veto_p` a no-op where the first heuristic proposes
    something, `switch_p` another heuristic's proposal where the first proposes nothing."""
    noop = math.log((num_raw_actions - 1) * (1.0 - raw_p) / raw_p)
    return (noop, noop + math.log((1.0 - veto_p) / veto_p),
            noop - math.log((1.0 - switch_p) / switch_p))


def init_follow_head(action_net: torch.nn.Linear, num_teachers: int, veto_p: float,
                     raw_p: float, switch_p: float) -> None:
    """Make a fresh action head start as the first heuristic (see `follow_logits`): biases
    set, and weights scaled to 1% so that no observation outweighs them yet."""
    num_raw = action_net.out_features - num_teachers
    noop, first, others = follow_logits(num_raw, veto_p, raw_p, switch_p)
    with torch.no_grad():
        action_net.weight.mul_(0.01)
        action_net.bias.zero_()
        action_net.bias[0] = noop
        action_net.bias[num_raw] = first
        action_net.bias[num_raw + 1:] = others


def init_follow_q_head(q_head: torch.nn.Linear, num_teachers: int, margin: float) -> None:
    """Make a Q-network whose outputs were all fitted to the first heuristic's returns start
    as that heuristic (DQN's counterpart of `init_follow_head`): every action gets the same
    row, the mean one, so that Q(s, a) = V(s) for all actions, then the first follow action
    `margin` more and the no-op half of it. The greedy policy over valid actions is then the
    heuristic exactly: its follow action where it proposes something, else the no-op (equal
    rows alone leave that tie to rounding); unmasked, the follow action where it proposes
    nothing decodes to a no-op too (counted as an invalid action by the env). TD learning can
    overturn the margins wherever a deviation is found to pay."""
    num_raw = q_head.out_features - num_teachers
    with torch.no_grad():
        q_head.weight.copy_(q_head.weight.mean(dim=0, keepdim=True).expand_as(q_head.weight))
        q_head.bias.fill_(float(q_head.bias.mean()))
        q_head.bias[num_raw] += margin
        q_head.bias[0] += margin / 2


def follow_first(num_teachers: int) -> Callable[[np.ndarray, np.ndarray], int]:
    """A driver of the residual environment that is its first heuristic: follow it when it
    proposes something, else no-op."""
    def drive(obs: np.ndarray, mask: np.ndarray) -> int:
        del obs
        index = len(mask) - num_teachers
        return index if mask[index] else 0
    return drive
