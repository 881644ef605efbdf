"""Pollux-style workload sampling: the published workloads' configurations are reproduced, the
model follows GPU-time, draws are deterministic by seed and the files load."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rlalloc.cli.main import main
from rlalloc.env.cluster import parse_cluster
from rlalloc.env.errors import UserError
from rlalloc.env.profiles import DEFAULT_PROFILES_ROOT, load_profiles
from rlalloc.env.workload.loader import load_workload
from rlalloc.env.workload.pollux_sampler import (
    GPU_HOUR_TIERS,
    SampleConfig,
    configurations,
    model_configurations,
    read_philly_pool,
    sample_workload,
)

from shared_data import POLLUX_DATA

POLLUX_DATA = POLLUX_DATA
PHILLY_CSV = POLLUX_DATA / "philly.csv"
pytestmark = pytest.mark.skipif(
    not (PHILLY_CSV.is_file() and DEFAULT_PROFILES_ROOT.is_dir()), reason="shared data absent"
)


@pytest.fixture(scope="module")
def profiles():
    return load_profiles(DEFAULT_PROFILES_ROOT)


@pytest.fixture(scope="module")
def options(profiles):
    return model_configurations(profiles)


def hand_pool(times_s, gpu_hours):
    return pd.DataFrame({"time_of_day_s": np.asarray(times_s, dtype=np.int64),
                         "gpu_hours": np.asarray(gpu_hours, dtype=float)})


def test_configurations_are_exactly_those_of_the_published_workloads(profiles):
    published: dict[str, set[tuple[int, int]]] = {}
    for path in POLLUX_DATA.glob("workloads*/workload-*.csv"):
        for row in pd.read_csv(path).itertuples():
            published.setdefault(row.application, set()).add((row.num_replicas, row.batch_size))
    assert len(published) == 6
    for model, seen in published.items():
        assert set(configurations(profiles[model])) == seen, model


def test_model_follows_gpu_time_and_submit_offsets_follow_the_window(profiles, options):
    hours = [0.5, 5.0, 50.0, 500.0] * 10
    # Submitted at 03:00 (in a window opening at 02:00) or at 20:00 (outside it).
    times = [3 * 3600] * 40 + [20 * 3600] * 40
    pool = hand_pool(times, hours + hours)
    frame = sample_workload(pool, options, SampleConfig(num_jobs=40, start_hour=2, hours=8))
    assert (frame["time"] == 3600).all()
    tier_of = {m: i for i, (_, models) in enumerate(GPU_HOUR_TIERS) for m in models}
    assert sorted(frame["application"].map(tier_of).tolist()) == sorted([0, 1, 2, 3] * 10)
    for row in frame.itertuples():
        assert (row.num_replicas, row.batch_size) in configurations(profiles[row.application])
    with pytest.raises(UserError, match="only 40 Philly jobs fall in the 8 h window"):
        sample_workload(pool, options, SampleConfig(num_jobs=41))


def test_samples_are_deterministic_by_seed_and_load(options):
    pool = read_philly_pool(PHILLY_CSV)
    first = sample_workload(pool, options, SampleConfig(seed=7))
    assert first.equals(sample_workload(pool, options, SampleConfig(seed=7)))
    assert not first.equals(sample_workload(pool, options, SampleConfig(seed=8)))
    assert len(first) == 160 and first["time"].is_monotonic_increasing
    assert first["time"].between(0, 8 * 3600 - 1).all()
    # The mix of the published workloads (about 78 % cifar10/ncf) within sampling noise.
    short = sum(sample_workload(pool, options, SampleConfig(seed=s))["application"]
                .isin(["cifar10", "ncf"]).mean() for s in range(5)) / 5
    published = pd.concat(pd.read_csv(p) for p in (POLLUX_DATA / "workloads").glob("*.csv"))
    assert abs(short - published["application"].isin(["cifar10", "ncf"]).mean()) < 0.05


def test_command_writes_loadable_files_and_never_overwrites(tmp_path):
    out = tmp_path / "sampled"
    args = ["workload", "sample", "--philly", str(PHILLY_CSV), "--seeds", "3-4",
            "--num-jobs", "240", "--out", str(out)]
    assert main(args) == 0
    workload = load_workload(str(out / "sampled-4.csv"), parse_cluster("16x4"))
    assert len(workload.jobs) == 240
    before = (out / "sampled-3.csv").read_bytes()
    assert main(args[:5] + ["3"] + args[6:]) == 2
    assert (out / "sampled-3.csv").read_bytes() == before
    assert main(args[:5] + ["3"] + args[6:] + ["--force"]) == 0


@pytest.mark.parametrize("flags, problem", [
    (["--seeds", "9-2"], "--seeds '9-2'"),
    (["--seeds", "x"], "--seeds 'x'"),
    (["--hours", "0"], "argument --hours: 0: must be within [1, 24]"),
    (["--start-hour", "24"], "argument --start-hour: 24: must be within [0, 23]"),
    (["--num-jobs", "0"], "argument --num-jobs: 0: must be at least 1"),
    (["--seeds", "1,2,1"], "1 given more than once"),
    (["--seeds", "0-99999999"], "100,000,000 seeds, at most 10,000"),
    (["--profiles", "/no/such"], "--profiles /no/such: no such folder; give a Pollux"),
])
def test_command_rejects_bad_flags(tmp_path, capsys, flags, problem):
    assert main(["workload", "sample", "--philly", str(PHILLY_CSV), "--out",
                 str(tmp_path), *flags]) == 2
    error = capsys.readouterr().err
    assert problem in error and error.count("\n") == 1


def test_malformed_trace_names_the_row(tmp_path, capsys):
    bad = tmp_path / "philly.csv"
    bad.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n"
                   "2017-10-03 02:00:00,100,1,100,a\n2017-10-03 02:01:00,abc,1,100,a\n")
    assert main(["workload", "sample", "--philly", str(bad), "--out", str(tmp_path / "o")]) == 2
    error = capsys.readouterr().err
    assert "row 2 (line 3): duration must be a number of seconds" in error
    assert error.count("\n") == 1


def test_a_directory_as_trace_says_a_file_is_needed(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["workload", "sample", "--philly", str(tmp_path), "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert f"{tmp_path} is a directory; --philly needs a file" in error
    assert "IsADirectoryError" not in error and error.count("\n") == 1 and not out.exists()
