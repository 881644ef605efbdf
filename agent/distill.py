"""The lookahead's decisions as demonstrations, to distil it into a residual policy network.

With futures sampled from history the lookahead (`rlalloc.agent.lookahead`) beats
`elastic-srpt-0.25` on every held-out Pollux workload, but it needs a simulator of the cluster
and a few seconds per decision, so the actuator cannot run it. A network that predicts its
choice from the observation alone can be deployed. The lookahead only ever picks one of its
heuristics' proposals, so its choice is exactly one action of the residual action space over
the same heuristics (base first, `rlalloc.agent.residual`): "follow heuristic k", or no-op where
it takes a no-op proposal. `LookaheadRecorder` wraps the lookahead during a run and records,
at every action it is asked for, the residual observation, mask and that index and, where the
heuristics disagreed, what each candidate saved in the forks; `rlalloc train --imitate` fits a
residual policy's actor to those advantages before RL (`fit_advantages`). On the Pollux
workloads the fitted policy stays within noise of its base
(docs/experiments/2026-11-23-distillation.md).
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from rlalloc.agent.imitation import actor_logits
from rlalloc.agent.lookahead import LookaheadPolicy
from rlalloc.agent.residual import ResidualFeaturizer
from rlalloc.env.errors import UserError
from rlalloc.env.output import write_atomic
from rlalloc.env.state import Action, ActionKind, ClusterState

ADVANTAGE_SCALE_S = 3600.0
"""Job-seconds saved per unit of logit (one job-hour): recorded advantages are mostly within
a few job-hours either way (their spread: docs/experiments/2026-11-23-distillation.md)."""


def residual_index(featurizer: ResidualFeaturizer, state: ClusterState, action: Action) -> int:
    """The residual action that does `action` in `state`: no-op for a no-op, else following the
    first heuristic that proposes it (ValueError if none does)."""
    if action.kind == ActionKind.NOOP:
        return 0
    for k, proposal in enumerate(featurizer.proposals(state)):
        if proposal == action:
            return featurizer.follow_index + k
    raise ValueError(f"{action} is no heuristic's proposal")


class LookaheadRecorder:
    """A `Policy` that is `lookahead` and records its decisions (see the module docstring).

    `featurizer`'s heuristics must be the lookahead's base and alternatives, base first, so
    that the recorded "follow" indices mean what the lookahead chose.
    """

    def __init__(self, lookahead: LookaheadPolicy, featurizer: ResidualFeaturizer) -> None:
        self.lookahead = lookahead
        self.featurizer = featurizer
        self.name = lookahead.name
        self.obs: list[np.ndarray] = []
        self.masks: list[np.ndarray] = []
        self.actions: list[int] = []
        self.contested: list[bool] = []
        """Whether the heuristics' proposals differed at the step (the lookahead chose)."""
        self.advantages: list[np.ndarray] = []
        """Per step, for no-op and each follow action: the job-seconds it saved against the
        base's proposal, mean over the futures drawn (NaN where it was no candidate; all NaN
        but the chosen action's 0 where nothing was contested)."""

    def act(self, state: ClusterState) -> Action:
        """The lookahead's action, recorded with the state's residual observation and mask."""
        contested = self.lookahead.contested
        action = self.lookahead.act(state)
        index = residual_index(self.featurizer, state, action)
        self.obs.append(self.featurizer.observe(state))
        self.masks.append(self.featurizer.action_mask(state))
        self.actions.append(index)
        self.contested.append(self.lookahead.contested > contested)
        self.advantages.append(self._advantages(state, index))
        return action

    def _advantages(self, state: ClusterState, chosen: int) -> np.ndarray:
        """The `advantages` row of the step just decided (see there): column 0 for no-op,
        column k + 1 for following heuristic k."""
        def column(index: int) -> int:
            return 0 if index == 0 else index - self.featurizer.follow_index + 1

        row = np.full(1 + len(self.featurizer.teachers), np.nan, dtype=np.float32)
        if not self.contested[-1]:
            row[column(chosen)] = 0.0
            return row
        costs = self.lookahead.last_costs
        base = costs[self.featurizer.proposals(state)[0]]  # the base's proposal, cached
        for candidate, candidate_costs in costs.items():
            row[column(residual_index(self.featurizer, state, candidate))] = float(
                np.mean(base - candidate_costs))
        return row

    def save(self, path: Path) -> None:
        """Write the recording as a compressed ``.npz`` (with the heuristics' names), through
        `write_atomic` (an interrupted save leaves no half file)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        np.savez_compressed(buffer, obs=np.asarray(self.obs, dtype=np.float32),
                            masks=np.asarray(self.masks), actions=np.asarray(self.actions),
                            contested=np.asarray(self.contested),
                            advantages=np.asarray(self.advantages),
                            heuristics=np.asarray([t.name for t in self.featurizer.teachers]))
        write_atomic(path, buffer.getvalue())


@dataclass
class Recording:
    """Lookahead recordings as arrays, one row per step (`LookaheadRecorder`'s lists)."""

    obs: np.ndarray
    masks: np.ndarray
    actions: np.ndarray
    contested: np.ndarray
    advantages: np.ndarray

    @property
    def follow_first(self) -> int:
        """The index of "follow the base heuristic" (the advantages have a column for no-op
        and one per heuristic, whose follow actions end the action space)."""
        return self.masks.shape[1] - (self.advantages.shape[1] - 1)

    def base_actions(self) -> np.ndarray:
        """Per step, the residual action that does what the base heuristic does: follow it
        where it proposes something, else no-op."""
        return np.where(self.masks[:, self.follow_first], self.follow_first, 0)

    def deviations(self) -> np.ndarray:
        """Per step, whether the lookahead did something else than the base."""
        return self.actions != self.base_actions()


FIELDS = ("obs", "masks", "actions", "contested", "advantages")


def load_recordings(paths: list[Path], heuristics: tuple[str, ...]) -> Recording:
    """The recordings at `paths` as one data set. UserError if a file is missing, unreadable or
    was recorded over other heuristics than `heuristics` (its follow indices would mean other
    actions)."""
    parts = []
    for path in paths:
        try:
            with np.load(path) as data:
                recorded = tuple(str(name) for name in data["heuristics"])
                part = Recording(*(data[field] for field in FIELDS))
        except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, EOFError) as err:
            # (TypeError: a lone .npy array, which np.load returns without a `with`)
            raise UserError(f"--imitate {path}: not a lookahead recording ({err}); record one "
                            "with `rlalloc headroom --record`") from None
        if recorded != tuple(heuristics):
            raise UserError(f"--imitate {path}: recorded over {','.join(recorded)}, but "
                            f"--residual is {','.join(heuristics)}; they must be the same, "
                            "in the same order")
        if parts and part.obs.shape[1:] != parts[0].obs.shape[1:]:
            raise UserError(f"--imitate {path}: observations of {part.obs.shape[1]} features, "
                            f"where {paths[0]}'s have {parts[0].obs.shape[1]}: recorded on "
                            "other clusters or with other settings; record them alike")
        parts.append(part)
    return Recording(*(np.concatenate([getattr(p, field) for p in parts]) for field in FIELDS))


def fit_advantages(policy: nn.Module, recording: Recording, epochs: int, batch_size: int,
                   learning_rate: float, seed: int) -> dict[str, float]:
    """Fit a residual MaskablePPO actor, in place, so that its logits rank actions as the
    lookahead's forks did.

    Where the heuristics disagreed, each candidate's logit minus the base's is regressed on
    its recorded advantage in units of `ADVANTAGE_SCALE_S` (so the argmax is the candidate
    predicted to save the most, the base where none is predicted to save anything); every
    step also gets a cross-entropy towards the base's action against the non-candidates (raw
    actions stay below it). Why not imitate the lookahead's choices: it deviates at few
    contested decisions (too few labels; docs/experiments/2026-11-23-distillation.md), and
    only when a candidate wins in every draw; the advantages carry what every fork measured,
    and regressing them averages the draws' noise across similar states. Returns the final
    mean squared error of the regression and the cross-entropy.
    """
    generator = torch.Generator().manual_seed(seed)
    obs = torch.as_tensor(recording.obs)
    base = torch.as_tensor(recording.base_actions())
    candidates = torch.as_tensor([0, *range(recording.follow_first, recording.masks.shape[1])])
    scored = torch.as_tensor(np.isfinite(recording.advantages) & recording.contested[:, None])
    scored &= candidates[None, :] != base[:, None]  # the base's own advantage is 0 by definition
    target = torch.as_tensor(np.nan_to_num(recording.advantages) / ADVANTAGE_SCALE_S)
    versus_base = torch.as_tensor(recording.masks).clone()
    rows, columns = torch.nonzero(scored, as_tuple=True)
    versus_base[rows, candidates[columns]] = False
    optimizer = torch.optim.Adam(policy.parameters(), lr=learning_rate)
    stats = {"advantage_mse": 0.0, "base_cross_entropy": 0.0}
    for _ in range(epochs):
        order = torch.randperm(len(obs), generator=generator)
        squared, cross, pairs = 0.0, 0.0, 0
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            logits = actor_logits(policy, obs[batch])
            ce = nn.functional.cross_entropy(logits.masked_fill(~versus_base[batch], -1e8),
                                             base[batch])
            gaps = logits[:, candidates] - logits.gather(1, base[batch, None])
            errors = (gaps - target[batch])[scored[batch]] ** 2
            loss = ce + (errors.mean() if len(errors) else 0.0)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            squared += float(errors.detach().sum())
            cross += float(ce.detach()) * len(batch)
            pairs += len(errors)
        stats = {"advantage_mse": squared / max(pairs, 1), "base_cross_entropy": cross / len(obs)}
    return stats


def prefer_base(action_net: nn.Linear, num_heuristics: int, margin: float) -> None:
    """Add `margin` to the no-op and follow-the-base logits: the policy then takes another
    heuristic's proposal only where it predicts a saving above `margin` x `ADVANTAGE_SCALE_S`
    job-seconds (each deviation risks a restore, and the predictions are noisy). A veto of the
    base's proposal keeps its fitted gap: a bias cannot tell "no-op = the base" states from
    "no-op = a veto" ones, and vetoes are a small share of the recorded deviations
    (docs/experiments/2026-11-23-distillation.md)."""
    with torch.no_grad():
        action_net.bias[0] += margin
        action_net.bias[action_net.out_features - num_heuristics] += margin
