"""Distilling the lookahead: its recorded decisions are exactly residual actions that decode to
what it did, with each candidate's advantage as its forks measured it; recordings are checked
before training uses them; a residual policy fitted to them ranks the candidates as the forks
did, and its margin makes it the base."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from rlalloc.agent.distill import (
    ADVANTAGE_SCALE_S,
    LookaheadRecorder,
    load_recordings,
    prefer_base,
    residual_index,
)
from rlalloc.agent.evaluation import run_policy
from rlalloc.agent.lookahead import Future, LookaheadPolicy
from rlalloc.agent.registry import load_policy
from rlalloc.agent.residual import residual_featurizer
from rlalloc.agent.train_config import TrainConfig
from rlalloc.agent.training import train
from rlalloc.env.errors import UserError
from rlalloc.env.failures import FailureParams
from rlalloc.env.featurizer import FeatureSpec
from rlalloc.env.params import SimParams
from rlalloc.env.scenario import build_scenario
from rlalloc.env.state import NOOP, ActionKind
from rlalloc.forecaster.signals import default_signals

SMALL = ("synthetic:30:3:3", "2x4")
"""A workload on which the known-future lookahead deviates from elastic-srpt-0.25."""
HEURISTICS = ("elastic-srpt-0.25", "elastic-srpt", "elastic")


def _record(states: list | None = None) -> tuple[LookaheadRecorder, list]:
    """Run the known-future lookahead on SMALL under a recorder; also return the actions."""
    params = SimParams(failures=FailureParams(failures_per_gpu_day=0.0))
    sim = build_scenario(*SMALL, seed=0, signals=default_signals()).simulator(params, seed=0)
    lookahead = LookaheadPolicy(lambda _state: sim, load_policy(HEURISTICS[0]),
                                [load_policy(name) for name in HEURISTICS[1:]], Future(math.inf))
    recorder = LookaheadRecorder(lookahead, residual_featurizer(
        FeatureSpec(checkpoint_interval_s=params.checkpoint_interval_s), HEURISTICS))
    actions = []

    def act(state):
        if states is not None:
            states.append(state)
        actions.append(recorder.act(state))
        return actions[-1]

    assert run_policy(sim, act).finished
    return recorder, actions


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    """SMALL's recording saved to a file, with the recorder, states and actions behind it."""
    states: list = []
    recorder, actions = _record(states)
    path = tmp_path_factory.mktemp("recording") / "small.npz"
    recorder.save(path)
    return path, recorder, states, actions


def test_recorded_indices_decode_to_what_the_lookahead_did(recording):
    path, recorder, states, actions = recording
    featurizer = recorder.featurizer
    assert len(recorder.actions) == len(states) == len(actions)
    for state, index, action, mask in zip(states, recorder.actions, actions, recorder.masks,
                                          strict=True):
        assert mask[index]
        assert featurizer.decode(state, index) == action
    recording = load_recordings([path], HEURISTICS)
    assert (recording.actions == recorder.actions).all()
    assert int(recording.contested.sum()) == recorder.lookahead.contested
    assert int(recording.deviations().sum()) == recorder.lookahead.deviations > 0
    # the base's own advantage is 0; a known future is one draw, so the lookahead took the
    # candidate with the largest advantage wherever one was positive
    base = recording.base_actions()
    follow = featurizer.follow_index
    column = np.where(recording.actions == 0, 0, recording.actions - follow + 1)
    chosen = recording.advantages[np.arange(len(column)), column]
    assert (recording.advantages[np.arange(len(base)), np.where(base == 0, 0, base - follow + 1)]
            == 0).all()
    contested = recording.contested
    assert np.isfinite(chosen).all()
    assert (chosen[contested] == np.nanmax(np.maximum(recording.advantages[contested], 0),
                                           axis=1)).all()
    assert np.isnan(recording.advantages[~contested]).sum() == (~contested).sum() * 3


def test_residual_index_of_noop_proposals_and_strangers(recording):
    _, recorder, states, actions = recording
    featurizer = recorder.featurizer
    state = next(s for s, a in zip(states, actions, strict=True) if a.kind != ActionKind.NOOP)
    proposal = featurizer.proposals(state)[0]
    assert residual_index(featurizer, state, proposal) == featurizer.follow_index
    assert residual_index(featurizer, state, NOOP) == 0
    stranger = replace(proposal, job_id="no-such-job")
    with pytest.raises(ValueError, match="no heuristic"):
        residual_index(featurizer, state, stranger)


def test_recordings_over_other_heuristics_or_not_recordings_are_refused(recording, tmp_path):
    path = recording[0]
    with pytest.raises(UserError, match="must be the same"):
        load_recordings([path], tuple(reversed(HEURISTICS)))
    garbage = tmp_path / "garbage.npz"
    garbage.write_text("not numpy")
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(path.read_bytes()[:2000])  # a copy cut short: a zip with no end
    lone = tmp_path / "lone.npz"  # a bare .npy array under the name: a TypeError escaped
    with lone.open("wb") as handle:
        np.save(handle, np.zeros(3))
    for damaged in (garbage, truncated, lone):
        with pytest.raises(UserError, match="not a lookahead recording"):
            load_recordings([damaged], HEURISTICS)
    # two recordings of other widths: np.concatenate's ValueError came before the width check
    with np.load(path) as data:
        fields = dict(data)
    fields["obs"] = np.concatenate([fields["obs"], fields["obs"][:, :1]], axis=1)
    wider = tmp_path / "wider.npz"
    np.savez(wider, **fields)
    with pytest.raises(UserError, match="observations of .* features, where .* have"):
        load_recordings([path, wider], HEURISTICS)
    with pytest.raises(UserError, match="--imitate fits a residual policy"):
        train(TrainConfig(workloads=(SMALL[0],), cluster=SMALL[1], imitate=(str(path),)),
              tmp_path / "model", log=lambda _: None)


def _choices(policy, recording) -> np.ndarray:
    with torch.no_grad():
        scores = policy.net(torch.as_tensor(recording.obs)).masked_fill(
            ~torch.as_tensor(recording.masks), -torch.inf)
    return scores.argmax(-1).numpy()


def test_policy_fitted_to_the_advantages_ranks_candidates_as_the_forks_did(recording, tmp_path):
    path, recorder, _, _ = recording
    config = TrainConfig(workloads=(SMALL[0],), cluster=SMALL[1], timesteps=0, n_envs=1,
                         residual=HEURISTICS, imitate=(str(path),), imitate_margin=0.0,
                         bc_epochs=300, net_arch=(64,))
    summary = train(config, tmp_path / "model", log=lambda _: None)
    fitted = summary["warm_start"]["imitation"]
    assert fitted["contested"] == recorder.lookahead.contested
    policy = load_policy(str(tmp_path / "model"))
    recording_ = load_recordings([path], HEURISTICS)
    chosen = _choices(policy, recording_)
    contested = recording_.contested
    # with a known future the lookahead's choice is the best candidate: fitted, the policy
    # follows the base where nothing was contested and picks the best candidate wherever it
    # was clearly the best (by a tenth of a job-hour; near-ties may go either way)
    assert (chosen[~contested] == recording_.actions[~contested]).mean() >= 0.98
    saved = np.sort(np.nan_to_num(recording_.advantages, nan=-np.inf), axis=1) / ADVANTAGE_SCALE_S
    clear = contested & (saved[:, -1] - saved[:, -2] > 0.1)
    assert clear.sum() >= 10
    assert (chosen[clear] == recording_.actions[clear]).all()
    assert fitted["advantage_mse"] < np.nanvar(recording_.advantages / ADVANTAGE_SCALE_S)
    prefer_base(policy.net.layers[-1], len(HEURISTICS), 100.0)
    assert (_choices(policy, recording_) == recording_.base_actions()).all()
