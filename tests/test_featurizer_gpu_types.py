"""Policies built for several GPU types (`FeatureSpec.gpu_types`): the observation shows each
job's speed on each type and the type it runs on, every (size, strategy) is offered on each
type, the mask stays exact, a cluster of types the policy lacks is refused in one line, and
`rlalloc train --cluster <mixed>` saves a model that `rlalloc evaluate` runs there. An untyped
spec observes and masks a mixed cluster exactly as before."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest
import torch

from rlalloc.agent.deployed import ExportMeta
from rlalloc.agent.registry import load_policy
from rlalloc.agent.residual import (
    PROPOSAL_FEATURES,
    proposal_features,
    proposal_type_features,
    residual_featurizer,
    residual_obs_size,
)
from rlalloc.agent.train_config import TrainConfig
from rlalloc.agent.training_env import training_spec
from rlalloc.cli.main import main
from rlalloc.env.cluster import parse_cluster
from rlalloc.env.errors import UserError
from rlalloc.env.failures import FailureParams
from rlalloc.env.featurizer import (
    OBS_BOUND,
    TYPE_CLUSTER_FEATURES,
    TYPE_SPEED_BOUND,
    FeatureSpec,
    Featurizer,
    policy_gpu_types,
)
from rlalloc.env.params import SimParams
from rlalloc.env.placement import job_gpu_type
from rlalloc.env.profiles import DEFAULT_PROFILES_ROOT, load_profiles
from rlalloc.env.scenario import job_speeds
from rlalloc.env.simulator import Simulator
from rlalloc.env.state import (
    NOOP,
    ActionKind,
    ClusterState,
    Demand,
    JobInfo,
    Jobs,
    JobStatus,
    NodeInfo,
    Nodes,
    Strategy,
    TypeSpeeds,
)
from rlalloc.env.workload.spec import JobSpec, Workload

torch.set_num_threads(1)
PACKED, SPREAD = Strategy.PACKED, Strategy.SPREAD
MIXED = "1x4:T4+1x4:A100"
THREE_TYPES = "2x4:T4+1x8:RTX2080Ti+2x4:A100"
APPS = (("bert", 96), ("cifar10", 256), ("ncf", 4096), ("imagenet", 800), ("gpt_pmp", 96))
NO_FAILURES = SimParams(failures=FailureParams(failures_per_gpu_day=0.0))


@pytest.fixture(scope="module")
def profiles():
    return load_profiles(DEFAULT_PROFILES_ROOT)


def _simulator(cluster: str, jobs: list[JobSpec], profiles, params: SimParams = NO_FAILURES,
               seed: int = 0) -> Simulator:
    spec = parse_cluster(cluster)
    workload = Workload("w", tuple(jobs))
    return Simulator(spec, workload, job_speeds(workload, profiles,
                                                [n.gpu_type for n in spec.nodes]), params, seed)


def _profiled(job_id: str, app: str, batch: int, gpus: int, profiles, submit_s: float = 0.0,
              scale: float = 1.0, hi: int = 4) -> JobSpec:
    work = profiles[app].work_iterations(batch) * scale
    return JobSpec(job_id, submit_s, gpus, work, 1, hi, 40.0, application=app, batch_size=batch)


def _mixed_jobs(rng: np.random.Generator, profiles, count: int = 24) -> list[JobSpec]:
    """Profiled jobs of every application (gpt_pmp has no T4 profile) and generic ones of 1-,
    2- and 4-GPU workers, arriving every 4 minutes."""
    jobs = []
    for i in range(count):
        if i % 3:
            app, batch = APPS[i % len(APPS)]
            jobs.append(_profiled(f"j{i}", app, batch, int(rng.choice([1, 2, 4])), profiles,
                                  submit_s=240.0 * i, scale=0.03, hi=int(rng.choice([2, 4, 8]))))
        else:
            per_worker = int(rng.choice([1, 2, 4]))
            jobs.append(JobSpec(f"j{i}", 240.0 * i, per_worker * int(rng.integers(1, 3)),
                                float(rng.uniform(2_000, 20_000)), 1, 3, 30.0,
                                gpus_per_worker=per_worker))
    return jobs


def _typed(cluster: str, top_k: int = 6) -> FeatureSpec:
    return FeatureSpec(top_k=top_k, gpu_types=policy_gpu_types(
        n.gpu_type for n in parse_cluster(cluster).nodes))


def test_the_same_cluster_always_gives_the_same_spec_and_one_type_none():
    assert policy_gpu_types(n.gpu_type for n in parse_cluster(THREE_TYPES).nodes) == (
        "A100", "RTX2080Ti", "T4")
    assert _typed("1x4:A100+1x4:T4") == _typed("1x4:t4+1x4:A100")
    assert _typed("16x4") == FeatureSpec(top_k=6)
    assert training_spec(TrainConfig(cluster="16x4")) == FeatureSpec()
    assert training_spec(TrainConfig(cluster=MIXED)).gpu_types == ("A100", "T4")
    with pytest.raises(ValueError, match="twice"):
        FeatureSpec(gpu_types=("T4", "T4"))


def test_sizes_of_the_spaces_on_the_sia_cluster():
    """The Sia paper's default cluster, 64 GPUs of three types: 2 x 6 targets x 3 types per
    slot instead of 2 x 6, and 3 cluster and 2 x 3 per-slot features more."""
    spec = _typed("6x4:T4+3x8:RTX2080Ti+2x8:A100", top_k=16)
    assert spec.actions_per_slot == 2 + 6 * 2 * 3 and spec.num_actions == 1 + 16 * 38 == 609
    assert spec.obs_size == 18 + 16 * 19 + 3 * 3 + 16 * 2 * 3 == 427
    assert (FeatureSpec().num_actions, FeatureSpec().obs_size) == (225, 322)


@pytest.mark.parametrize("seed", [0, 1])
def test_every_allowed_typed_action_is_one_the_simulator_accepts(profiles, seed):
    """A mixed cluster with failures and warned nodes, stepped by random allowed actions of a
    typed spec: observations have `obs_size` finite entries within their bounds and start
    with the untyped observation; every allowed index decodes to an action the simulator
    accepts, every other one to a no-op or one it refuses; the cached featurizer agrees with
    a fresh one; and the run moves jobs between types, starts them on each and migrates."""
    rng = np.random.default_rng(seed)
    params = SimParams(failures=FailureParams(failures_per_gpu_day=0.5, repair_s=1800.0))
    sim = _simulator(THREE_TYPES, _mixed_jobs(rng, profiles), profiles, params, seed)
    sim.schedule_failure(sim.node_names[1], 2_000.0, warning_lead_s=1_500.0)
    sim.schedule_failure(sim.node_names[3], 5_000.0, warning_lead_s=1_500.0)
    spec = _typed(THREE_TYPES)
    featurizer, untyped = Featurizer(spec), Featurizer(FeatureSpec(top_k=spec.top_k))
    untyped_size = untyped.spec.obs_size
    seen = {"A100": 0, "RTX2080Ti": 0, "T4": 0, "type_moves": 0, "migrations": 0}
    speeds_seen = set()
    for _ in range(400):
        if sim.done:
            break
        state = sim.state()
        obs, mask = featurizer.observe(state), featurizer.action_mask(state)
        assert obs.shape == (spec.obs_size,) and mask.shape == (spec.num_actions,)
        assert np.isfinite(obs).all() and np.abs(obs).max() <= OBS_BOUND
        assert obs[:untyped_size].tobytes() == untyped.observe(state).tobytes()
        typed_block = obs[untyped_size:]
        cluster_block = typed_block[:3 * TYPE_CLUSTER_FEATURES]
        assert ((cluster_block >= 0) & (cluster_block <= 1)).all()
        per_slot = typed_block[3 * TYPE_CLUSTER_FEATURES:].reshape(spec.top_k, 2, 3)
        assert (np.abs(per_slot[:, 0]) <= TYPE_SPEED_BOUND).all()
        assert set(np.unique(per_slot[:, 1])) <= {0.0, 1.0}
        speeds_seen.update(np.round(per_slot[:, 0].ravel(), 3).tolist())
        fresh = Featurizer(spec)
        assert np.array_equal(obs, fresh.observe(state))
        assert np.array_equal(mask, fresh.action_mask(state))
        for index in np.flatnonzero(mask)[1:]:
            action = featurizer.decode(state, int(index))
            assert action.kind != ActionKind.NOOP, index
            assert sim.validate(action) == "", (index, action)
            if action.kind == ActionKind.MIGRATE:
                seen["migrations"] += 1
            elif action.workers:
                row = state.job_index(action.job_id)
                new_type = state.nodes.gpu_type[state.nodes.name.index(action.nodes[0])]
                seen[new_type] += 1
                seen["type_moves"] += (action.workers == state.jobs.workers[row]
                                       and new_type != job_gpu_type(state, row))
        for index in np.flatnonzero(~mask):
            action = featurizer.decode(state, int(index))
            assert action.kind == ActionKind.NOOP or sim.validate(action), (index, action)
        index = 0 if rng.random() < 0.4 else int(rng.choice(np.flatnonzero(mask)))
        if index == 0 or not sim.apply(featurizer.decode(state, index)):
            sim.advance()
    assert min(seen.values()) > 0, seen
    assert len(speeds_seen) > 5  # jobs' speeds differ by type and application


def test_n_workers_on_a_type_place_on_that_type_only(profiles):
    """'2 workers on T4' starts a queued job on T4 although A100 is faster (where an untyped
    action puts it); running there, 2 workers on T4 is no change (masked) and 2 on A100 is
    a move, paid as a restart. The observation shows where it runs and its speed on each."""
    sim = _simulator(MIXED, [_profiled("a", "bert", 96, 2, profiles)], profiles)
    sim.advance()
    spec = _typed(MIXED, top_k=2)
    featurizer = Featurizer(spec)
    state = sim.state()
    names = state.nodes.name
    on = {t: {names[n] for n in range(len(names)) if state.nodes.gpu_type[n] == t}
          for t in ("T4", "A100")}
    for gpu_type in ("T4", "A100"):
        for strategy in (PACKED, SPREAD):
            action = featurizer.decode(state, featurizer.encode_scale(0, 2, strategy, gpu_type))
            assert action.kind == ActionKind.SCALE and set(action.nodes) <= on[gpu_type]
    untyped = Featurizer(FeatureSpec(top_k=2))
    assert set(untyped.decode(state, untyped.encode_scale(0, 2, PACKED)).nodes) <= on["A100"]
    assert sim.apply(featurizer.decode(state, featurizer.encode_scale(0, 2, PACKED, "T4")))
    state = sim.state()
    mask = featurizer.action_mask(state)
    assert not mask[featurizer.encode_scale(0, 2, PACKED, "T4")]
    assert mask[featurizer.encode_scale(0, 2, PACKED, "A100")]
    assert mask[featurizer.encode_scale(0, 4, PACKED, "T4")]
    assert not mask[featurizer.encode_scale(0, 8, PACKED, "A100")]  # 4 A100 GPUs
    obs = featurizer.observe(state)
    per_slot = obs[untyped.spec.obs_size + 2 * TYPE_CLUSTER_FEATURES:].reshape(2, 2, 2)
    assert per_slot[0, 1].tolist() == [0.0, 1.0]  # runs on T4 (types: A100, T4)
    on_type = profiles["bert"].on_type
    ratio = (on_type["A100"].throughput(96).iterations_per_s((1,))
             / on_type["T4"].throughput(96).iterations_per_s((1,)))
    assert per_slot[0, 0].tolist() == pytest.approx([math.log2(ratio), 0.0], abs=1e-5)
    cluster_block = obs[untyped.spec.obs_size:][:2 * TYPE_CLUSTER_FEATURES]
    assert cluster_block.tolist() == pytest.approx([1, 1, 0.5, 1, 0.5, 0.5])
    move = featurizer.decode(state, featurizer.encode_scale(0, 2, PACKED, "A100"))
    assert set(move.nodes) <= on["A100"] and move.workers == 2
    assert sim.apply(move)
    assert sim.state().jobs.status[0] == JobStatus.RESTARTING


def test_a_typed_spec_on_a_cluster_of_some_of_its_types_shows_the_others_absent(profiles):
    sim = _simulator("2x4:T4", [_profiled("a", "bert", 96, 2, profiles)], profiles)
    sim.advance()
    spec = _typed(MIXED, top_k=2)
    featurizer = Featurizer(spec)
    state = sim.state()
    obs, mask = featurizer.observe(state), featurizer.action_mask(state)
    base = Featurizer(FeatureSpec(top_k=2)).spec.obs_size
    assert obs[base:base + 2 * TYPE_CLUSTER_FEATURES].tolist() == [0, 0, 0, 1, 1, 1]
    assert not mask[featurizer.encode_scale(0, 1, PACKED, "A100")]
    assert mask[featurizer.encode_scale(0, 1, PACKED, "T4")]
    assert featurizer.decode(state, featurizer.encode_scale(0, 1, PACKED, "A100")) == NOOP


def test_a_cluster_with_a_type_the_policy_lacks_is_refused_in_one_line(profiles):
    sim = _simulator("1x4:T4+1x8:RTX2080Ti", [_profiled("a", "bert", 96, 2, profiles)],
                     profiles)
    sim.advance()
    state = sim.state()
    featurizer = Featurizer(_typed(MIXED))
    for call in (featurizer.observe, featurizer.action_mask,
                 lambda s: featurizer.decode(s, 1)):
        with pytest.raises(UserError, match="RTX2080Ti unknown to it.*train") as err:
            call(state)
        assert "\n" not in str(err.value) and "A100, T4" in str(err.value)
    residual = residual_featurizer(_typed(MIXED), ("elastic",))
    with pytest.raises(UserError, match="RTX2080Ti unknown to it"):
        residual.observe(state)
    # an untyped spec runs on any cluster, as before
    assert Featurizer(FeatureSpec()).observe(state).shape == (FeatureSpec().obs_size,)


def test_residual_proposals_say_which_type_they_put_the_job_on(profiles):
    sim = _simulator(MIXED, [_profiled("a", "bert", 96, 2, profiles)], profiles)
    sim.advance()
    state = sim.state()
    spec = _typed(MIXED, top_k=2)
    residual = residual_featurizer(spec, ("elastic", "static"))
    obs = residual.observe(state)
    assert obs.shape == (residual.obs_size,) == (residual_obs_size(spec, 2, False),)
    assert residual.obs_size == spec.obs_size + 2 * (PROPOSAL_FEATURES + 3)
    proposal = residual.proposals(state)[0]
    assert proposal.kind == ActionKind.SCALE
    typed = proposal_type_features(state, proposal, spec.gpu_types)
    assert typed[:2].tolist() == [1.0, 0.0]  # elastic starts it on A100, the faster type
    row = state.job_index("a")
    speeds = state.type_speeds
    on_a100 = speeds.speed_1gpu[row, speeds.column("A100")] / state.jobs.speed_1gpu[row]
    assert typed[2] == pytest.approx(math.log2(on_a100), abs=1e-5)  # from T4, the reference
    first = obs[spec.obs_size:spec.obs_size + PROPOSAL_FEATURES + 3]
    assert first.tolist() == pytest.approx([*proposal_features(state, proposal), *typed])
    assert proposal_type_features(state, NOOP, spec.gpu_types).tolist() == [0, 0, 0]
    untyped = residual_featurizer(FeatureSpec(top_k=2), ("elastic", "static"))
    assert untyped.obs_size == FeatureSpec(top_k=2).obs_size + 2 * PROPOSAL_FEATURES


def test_the_spec_is_saved_with_a_model_and_read_back():
    spec = _typed(THREE_TYPES, top_k=16)
    fields = json.loads(json.dumps(ExportMeta.spec_fields(spec)))
    meta = ExportMeta("ppo", spec.obs_size, spec.num_actions, (8,), "tanh", fields, True)
    assert meta.spec() == spec and meta.expected_obs_size() == spec.obs_size == 427
    older = {k: v for k, v in ExportMeta.spec_fields(FeatureSpec()).items() if k != "gpu_types"}
    assert ExportMeta("ppo", 322, 225, (8,), "tanh", older, True).spec() == FeatureSpec()


def _hand_made_mixed_state() -> ClusterState:
    """T4, RTX2080Ti and A100 nodes (one warned, one risky), jobs queued and running on each
    type, of 1-, 2- and 4-GPU workers, with their speeds per type."""
    nodes = [NodeInfo("t4-0", 4, 1, "T4"), NodeInfo("t4-1", 4, 4, "T4", xid_errors_5m=2),
             NodeInfo("rtx-0", 8, 2, "RTX2080Ti", failure_risk=0.7),
             NodeInfo("a100-0", 8, 4, "A100"), NodeInfo("a100-1", 8, 8, "A100")]
    q, r = JobStatus.QUEUED, JobStatus.RUNNING
    jobs = [JobInfo("a", r, 0.0, 3, 1, 4, 3, (0, 0, 0), progress=0.2, attained_gpu_s=900.0),
            JobInfo("b", r, 5.0, 6, 1, 4, 3, (2, 2, 2), gpus_per_worker=2,
                    since_checkpoint_s=600.0),
            JobInfo("c", r, 9.0, 4, 1, 2, 1, (3,), gpus_per_worker=4, scaling_alpha=0.2),
            JobInfo("d", q, 20.0, 2, 1, 8), JobInfo("e", q, 30.0, 8, 1, 2, gpus_per_worker=4),
            JobInfo("f", q, 40.0, 16, 4, 16)]
    speeds = np.array([[1.0, 1.8, 3.9], [1.0, 2.0, 3.5], [1.0, 1.5, 4.0], [1.0, 1.84, 3.84],
                       [1.0, 1.84, 3.84], [1.0, 1.84, 3.84]], dtype=np.float32)
    alphas = np.full_like(speeds, 0.05)
    return ClusterState(7_200.0, Nodes.from_records(nodes), Jobs.from_records(jobs),
                        Demand(pending_gpus=26, arrivals_1h=3, forecast_gpus=(0.5, 0.6, 0.7)),
                        time_of_day_s=30_000.0,
                        type_speeds=TypeSpeeds(("T4", "RTX2080Ti", "A100"), speeds, alphas,
                                               alphas * 2))


OBS_SHA256 = "0f50253446ef53512168b61f06330faa2bfc2772647547bf0809a1a9e955b9d7"
MASK_SHA256 = "a95187226bacc0acbda4626d20bea86a875b635e1282ebdf367e9b594e82e305"
"""Of the featurizer at 58c0156 (before `FeatureSpec.gpu_types`) on `_hand_made_mixed_state`
with `FeatureSpec(top_k=6)`."""


def test_an_untyped_spec_observes_and_masks_a_mixed_cluster_as_before():
    state = _hand_made_mixed_state()
    featurizer = Featurizer(FeatureSpec(top_k=6))
    obs, mask = featurizer.observe(state), featurizer.action_mask(state)
    assert hashlib.sha256(obs.tobytes()).hexdigest() == OBS_SHA256, obs.tolist()
    assert hashlib.sha256(mask.tobytes()).hexdigest() == MASK_SHA256, np.flatnonzero(mask)
    typed = Featurizer(_typed(THREE_TYPES)).observe(state)
    assert typed[:featurizer.spec.obs_size].tobytes() == obs.tobytes()


def test_train_on_a_mixed_cluster_then_evaluate_the_model_there(tmp_path, capsys):
    """`rlalloc train --algo ppo --residual elastic --cluster 1x4:T4+1x4:A100` saves a policy
    built for A100 and T4, which `rlalloc evaluate` runs on that cluster and refuses, in one
    line, on a cluster with another type."""
    model = tmp_path / "model"
    assert main(["train", "--algo", "ppo", "--residual", "elastic", "--workload",
                 "synthetic:12:1.5", "--cluster", MIXED, "--n-envs", "1", "--n-steps", "64",
                 "--batch-size", "64", "--timesteps", "64", "--eval-every", "64",
                 "--out", str(model)]) == 0
    saved = json.loads((model / "policy.json").read_text())
    assert saved["feature_spec"]["gpu_types"] == ["A100", "T4"]
    policy = load_policy(str(model))
    spec = policy.meta.spec()
    assert spec.gpu_types == ("A100", "T4") and spec == training_spec(TrainConfig(cluster=MIXED))
    assert policy.featurizer.obs_size == residual_obs_size(spec, 1, False)
    out = tmp_path / "eval"
    evaluate = ["evaluate", "--workload", "synthetic:8:1.0", "--seeds", "1", "--jobs", "1",
                "--failures", "none", "--policies", f"elastic,{model}"]
    assert main([*evaluate, "--cluster", MIXED, "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert "model" in json.dumps(results)
    capsys.readouterr()
    code = main([*evaluate, "--cluster", "1x4:T4+1x4:V100", "--out", str(tmp_path / "bad")])
    errors = [line for line in capsys.readouterr().err.splitlines()
              if line.startswith("rlalloc")]  # the rest is the progress bar
    assert code != 0 and len(errors) == 1 and "V100 unknown to it" in errors[0], errors
