"""A residual PPO told job speeds (`train --learn-sizes`): its heuristics rank growth by the
applications' measured profiles in training and once deployed, the model directory carries
copies of them, a missing copy is a one-line error, and models saved before (format 3, no
profiles) still load with the curves."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from rlalloc.agent.deployed import FORMAT_VERSION
from rlalloc.agent.evaluation import run_policy
from rlalloc.agent.heuristics import curve_speedups
from rlalloc.agent.job_sizes import JobSizeHistory, told_sizes
from rlalloc.agent.job_speeds import PROFILES_DIR, ProfiledSpeedups, profile_models
from rlalloc.agent.model_files import META_FILE
from rlalloc.agent.registry import load_policy
from rlalloc.agent.train_config import TrainConfig
from rlalloc.agent.training import train
from rlalloc.env.errors import UserError
from rlalloc.env.failures import FailureParams
from rlalloc.env.params import SimParams
from rlalloc.env.profiles import DEFAULT_PROFILES_ROOT, cached_profiles
from rlalloc.env.scenario import build_scenario

from shared_data import POLLUX_WORKLOADS

torch.set_num_threads(1)
WORKLOAD_1 = POLLUX_WORKLOADS / "workload-1.csv"
pytestmark = pytest.mark.skipif(not WORKLOAD_1.is_file(), reason="shared Pollux data absent")
CLUSTER = "8x4"
TEACHERS = ("elastic-srpt-0.25", "elastic")
NO_FAILURES = SimParams(failures=FailureParams(failures_per_gpu_day=0.0))


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, dict, str]:
    """A told model trained for 256 steps on the first 16 jobs of Pollux workload-1 (cifar10,
    deepspeech2, imagenet, ncf; 20 s), its summary, and the workload."""
    folder = tmp_path_factory.mktemp("speeds")
    workload = folder / "workload.csv"
    workload.write_text("".join(WORKLOAD_1.read_text().splitlines(keepends=True)[:17]))
    config = TrainConfig(workloads=(str(workload),), cluster=CLUSTER, timesteps=256, n_envs=1,
                         n_steps=128, batch_size=64, eval_every=256, residual=TEACHERS,
                         learn_sizes=True, bc_epochs=1, net_arch=(32,))
    summary = train(config, folder / "model", log=lambda _: None)
    return folder / "model", summary, str(workload)


def _avg_jct(policy, workload: str) -> float:
    sim = build_scenario(workload, CLUSTER).simulator(NO_FAILURES, 0)
    return run_policy(sim, policy.act).metrics["avg_jct_s"]


def _copy(model: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(model, tmp_path / "model"))


def test_told_model_ranks_by_the_profiles_it_carries(trained):
    """Trained and deployed, the heuristics are told the profiles' speeds: the start scores the
    heuristic told sizes and speeds (not sizes alone), the model names and carries the
    profiles of its applications, and loaded it runs that heuristic."""
    model, summary, workload = trained
    history = JobSizeHistory.fit([build_scenario(workload, CLUSTER)])
    models = profile_models(history, cached_profiles(DEFAULT_PROFILES_ROOT))
    told = told_sizes(TEACHERS[0], history.remaining_work, "told", ProfiledSpeedups(models))
    sizes_only = told_sizes(TEACHERS[0], history.remaining_work, "sizes only")
    start = summary["evaluations"][0]["avg_jct_s"]
    assert start == pytest.approx(
        summary["heuristic_avg_jct_s"][f"{TEACHERS[0]}, sizes learned, speeds profiled"],
        abs=1e-6)
    assert start == pytest.approx(_avg_jct(told, workload), abs=1e-6)
    assert abs(start - _avg_jct(sizes_only, workload)) > 1.0
    policy = load_policy(str(model))
    applications = ("cifar10", "deepspeech2", "imagenet", "ncf")
    assert policy.meta.format_version == FORMAT_VERSION and policy.meta.profiles == applications
    assert sorted(p.name for p in (model / PROFILES_DIR).iterdir() if p.is_dir()) == \
        list(applications)
    for teacher in policy.featurizer.teachers:
        assert isinstance(teacher.speedups, ProfiledSpeedups)
        assert teacher.speedups.models.keys() == models.keys()
    card = (model / "card.md").read_text()
    assert "job speeds from the measured profiles of cifar10" in card
    assert "profiles/ (the measured profiles of cifar10, deepspeech2, imagenet, ncf" in card
    assert summary["exported_timesteps"] == 0  # so the export follows its first heuristic
    assert _avg_jct(policy, workload) == pytest.approx(start, abs=1e-6)


def test_a_missing_copied_profile_is_a_one_line_error(trained, tmp_path):
    model = _copy(trained[0], tmp_path)
    shutil.rmtree(model / PROFILES_DIR / "ncf")
    with pytest.raises(UserError, match="profiles of ncf are missing; copy .* or fit it again with "
                                        r"`rlalloc train --residual \.\.\. --learn-sizes`") as err:
        load_policy(str(model))
    assert "\n" not in str(err.value)
    shutil.rmtree(model / PROFILES_DIR)
    with pytest.raises(UserError, match="cannot be read"):
        load_policy(str(model))


def test_a_format_3_model_loads_with_the_curves_as_before(trained, tmp_path):
    """A model saved before profiles were copied (format 3, no `profiles`) keeps ranking by the
    curves, copies beside it or not, and scores as the heuristic told sizes alone."""
    model, _, workload = trained
    assert isinstance(load_policy(str(model)).featurizer.teachers[0].speedups, ProfiledSpeedups)
    older = _copy(model, tmp_path)
    meta = json.loads((older / META_FILE).read_text())
    del meta["profiles"]
    (older / META_FILE).write_text(json.dumps({**meta, "format_version": 3}))
    policy = load_policy(str(older))
    assert all(t.speedups is curve_speedups for t in policy.featurizer.teachers)
    history = JobSizeHistory.fit([build_scenario(workload, CLUSTER)])
    sizes_only = told_sizes(TEACHERS[0], history.remaining_work, "sizes only")
    assert _avg_jct(policy, workload) == pytest.approx(_avg_jct(sizes_only, workload), abs=1e-6)
    # the shipped model is told speeds by the copies it carries
    assert all(isinstance(t.speedups, ProfiledSpeedups)
               for t in load_policy("ppo").featurizer.teachers)


def test_a_resume_keeps_the_speeds_the_run_started_with(trained, tmp_path, monkeypatch):
    """Resumed where no profiles are found, a told run keeps its copies and its teachers'
    speeds: re-deriving them removed the copies its exported model names (a broken model), and
    would have switched the teachers to the curves halfway through."""
    model, _, workload = trained
    run = _copy(model, tmp_path)
    monkeypatch.setattr("rlalloc.agent.training.default_profiles_root", lambda: None)
    config = TrainConfig(workloads=(workload,), cluster=CLUSTER, timesteps=384, n_envs=1,
                         n_steps=128, batch_size=64, eval_every=256, residual=TEACHERS,
                         learn_sizes=True, bc_epochs=1, net_arch=(32,))
    lines: list[str] = []
    train(config, run, resume=True, log=lines.append)
    assert any("told job speeds from the profiles of cifar10" in line for line in lines)
    assert sorted(p.name for p in (run / PROFILES_DIR).iterdir() if p.is_dir()) == \
        ["cifar10", "deepspeech2", "imagenet", "ncf"]
    policy = load_policy(str(run))
    assert all(isinstance(t.speedups, ProfiledSpeedups) for t in policy.featurizer.teachers)
