"""Sia-style workload sampling: one absolute window, models by GPU-time without ncf or gpt_pmp,
configurations priced on RTX 2080 Ti 8-GPU nodes, deterministic by seed, files that load on
Sia's default cluster."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from rlalloc.cli.main import main
from rlalloc.env.cluster import parse_cluster
from rlalloc.env.errors import UserError
from rlalloc.env.profiles import packed_shape, profiles_or_default
from rlalloc.env.workload.loader import load_workload
from rlalloc.env.workload.pollux_sampler import configurations, read_philly_pool
from rlalloc.env.workload.sia_sampler import (
    SIA_GPU_HOUR_TIERS,
    SIA_RULES,
    SiaSampleConfig,
    sample_sia_workload,
    sia_model_configurations,
)

from shared_data import PHILLY_CSV, needs_philly

SIA_CLUSTER = "6x4:T4+3x8:RTX2080Ti+2x8:A100"
APPLICATIONS = ("bert", "cifar10", "deepspeech2", "gpt_pmp", "imagenet", "ncf", "yolov3")
WINDOW_START = 1500
"""Hours into the trace of a window whose jobs fall in every GPU-hour tier."""


@pytest.fixture(scope="module")
def profiles():
    return profiles_or_default(None)


@pytest.fixture(scope="module")
def options(profiles):
    return sia_model_configurations(profiles)


@pytest.fixture(scope="module")
def pool():
    if not PHILLY_CSV.is_file():
        pytest.skip("shared Philly trace absent")
    return read_philly_pool(PHILLY_CSV)


def hand_pool(since_first_s, gpu_hours):
    return pd.DataFrame({"time_of_day_s": np.zeros(len(gpu_hours), dtype=np.int64),
                         "since_first_s": np.asarray(since_first_s, dtype=np.int64),
                         "gpu_hours": np.asarray(gpu_hours, dtype=float)})


def test_configurations_follow_pollux_rule_on_rtx_8_gpu_nodes(profiles, options):
    assert sorted(options) == ["bert", "cifar10", "deepspeech2", "imagenet", "yolov3"]
    for model, offered in options.items():
        rtx = profiles[model].on_type["RTX2080Ti"]
        sizes = rtx.validated_batch_sizes

        def run_s(workers, batch, rtx=rtx):
            shape = packed_shape(workers, 8)
            return rtx.work_iterations(batch) / rtx.throughput(batch).iterations_per_s(shape)

        base_s = min(run_s(1, b) for b in sizes if b >= rtx.min_local_bsz)
        assert offered, model
        for workers, batch in offered:
            assert workers in (1, 2, 4, 6, 8, 10, 12, 14) and sizes[0] <= batch <= sizes[-1]
            fits = [b for b in sizes if -(-b // workers) >= rtx.min_local_bsz]
            assert run_s(workers, batch) == min(run_s(workers, b) for b in fits), model
            if workers > 1:
                assert run_s(workers, batch) < 12 * 3600, model
                assert 0.5 < base_s / run_s(workers, batch) / workers < 0.8, model
    # Priced on RTX 2080 Ti, not on the T4 files Pollux's rules read.
    t4_rules = dataclasses.replace(SIA_RULES, gpu_type=None)
    assert any(configurations(profiles[m], t4_rules) != options[m] for m in options)


def test_model_follows_gpu_time_and_offsets_follow_the_absolute_window(options):
    hours = [0.5, 5.0, 50.0, 500.0] * 10
    # The window opens 10 h into the trace and lasts 8 h: the 40 jobs 11 h in fall inside it,
    # those at its very opening, its very end or a day later do not.
    times = [11 * 3600] * 40 + [10 * 3600] * 4 + [18 * 3600] * 4 + [35 * 3600] * 4
    pool = hand_pool(times, hours + hours[:12])
    frame = sample_sia_workload(pool, options, SiaSampleConfig(start_hour=10, num_jobs=40))
    assert (frame["time"] == 3600).all()
    tier_of = {m: i for i, (_, models) in enumerate(SIA_GPU_HOUR_TIERS) for m in models}
    assert sorted(frame["application"].map(tier_of).tolist()) == sorted([0, 1, 2, 3] * 10)
    assert (frame["application"] == "cifar10").sum() == 10
    with pytest.raises(UserError, match="only 40 Philly jobs fall in the 8 h window opening "
                                        "10 h after the trace's first job"):
        sample_sia_workload(pool, options, SiaSampleConfig(start_hour=10, num_jobs=41))


@needs_philly
def test_samples_are_deterministic_by_seed(pool, options):
    config = SiaSampleConfig(start_hour=WINDOW_START, seed=7)
    first = sample_sia_workload(pool, options, config)
    assert first.equals(sample_sia_workload(pool, options, config))
    assert not first.equals(sample_sia_workload(pool, options,
                                                dataclasses.replace(config, seed=8)))
    assert len(first) == 160 and first["time"].is_monotonic_increasing
    assert first["time"].between(1, 8 * 3600 - 1).all()


@needs_philly
def test_applications_appear_in_the_proportions_the_method_implies(pool, options):
    offset = pool["since_first_s"].to_numpy() - WINDOW_START * 3600
    hours = pool["gpu_hours"].to_numpy()[(offset > 0) & (offset < 8 * 3600)]
    tier = {"small": hours < 1, "medium": (hours >= 1) & (hours < 10),
            "large": (hours >= 10) & (hours < 100), "xl": hours >= 100}
    expected = {"cifar10": tier["small"].mean(), "deepspeech2": tier["medium"].mean() / 2,
                "bert": tier["medium"].mean() / 2, "yolov3": tier["large"].mean(),
                "imagenet": tier["xl"].mean(), "ncf": 0.0, "gpt_pmp": 0.0}
    seeds = range(100)
    drawn = pd.concat(sample_sia_workload(pool, options, SiaSampleConfig(WINDOW_START, seed=s))
                      for s in seeds)["application"]
    assert set(drawn) <= set(APPLICATIONS)
    for app in APPLICATIONS:
        share = expected[app]
        # Five binomial standard errors of the pooled draws (a bound on the hypergeometric
        # spread of draws without replacement), and tight enough to catch a share that is
        # halved or doubled, such as ncf taking half the short jobs as in Pollux's method.
        tolerance = 5 * np.sqrt(share * (1 - share) / len(drawn))
        assert tolerance <= share / 2, app
        assert abs((drawn == app).mean() - share) <= tolerance, (app, share)


@needs_philly
def test_command_writes_deterministic_files_that_load_on_sias_cluster(tmp_path, profiles):
    args = ["workload", "sample", "--method", "sia", "--philly", str(PHILLY_CSV),
            "--window-start", str(WINDOW_START), "--seeds", "3-4"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    for name in ("sia-3.csv", "sia-4.csv"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    cluster = parse_cluster(SIA_CLUSTER)
    workload = load_workload(str(tmp_path / "a" / "sia-4.csv"), cluster)
    assert len(workload.jobs) == 160
    for job in workload.jobs:
        sizes = profiles[job.application].validated_batch_sizes
        assert sizes[0] <= job.batch_size <= sizes[-1]
        assert 1 <= job.requested_gpus <= 14 <= cluster.total_gpus


@needs_philly
@pytest.mark.parametrize("flags, problem", [
    (["--method", "sia"], "--method sia needs --window-start HOURS"),
    (["--method", "sia", "--window-start", "2"],
     "only 3 Philly jobs fall in the 8 h window opening 2 h after the trace's first job"),
    (["--method", "sia", "--window-start", "5", "--start-hour", "3"],
     "--start-hour is Pollux's hour of day; with --method sia give --window-start"),
    (["--window-start", "5"], "--window-start is Sia's window (--method sia)"),
    (["--method", "sia", "--window-start", "99999"],
     "argument --window-start: 99999: must be within [0, 8760]"),
    (["--method", "gavel"], "argument --method: invalid choice: 'gavel'"),
])
def test_command_rejects_bad_flags(tmp_path, capsys, flags, problem):
    assert main(["workload", "sample", "--philly", str(PHILLY_CSV), "--out",
                 str(tmp_path / "o"), *flags]) == 2
    error = capsys.readouterr().err
    assert problem in error and error.count("\n") == 1


def test_profiles_without_rtx_measurements_are_refused(profiles):
    t4_only = dataclasses.replace(profiles["yolov3"], on_type={})
    t4_only.on_type["T4"] = t4_only
    with pytest.raises(UserError, match="the profiles lack RTX2080Ti measurements of yolov3"):
        sia_model_configurations({**profiles, "yolov3": t4_only})
