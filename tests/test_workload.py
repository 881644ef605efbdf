"""Workload loaders on the real traces, the canonical CSV, bad input, and the generator."""

from __future__ import annotations

import shutil
import time
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from rlalloc.env.cluster import parse_cluster
from rlalloc.env.errors import UserError
from rlalloc.env.profiles import (
    DEFAULT_PROFILES_ROOT,
    GENERIC_RESTORE_S,
    GENERIC_SCALING,
    RESTORE_S,
    load_profiles,
    packed_shape,
)
from rlalloc.env.workload.loader import load_workload
from rlalloc.env.workload.synthetic import PHILLY_GPU_MIX, SyntheticConfig, generate

from shared_data import PHILLY_CSV, POLLUX_WORKLOADS, needs_philly, needs_pollux

CLUSTER = parse_cluster("16x4")
BIG_CLUSTER = parse_cluster("128x8")


@pytest.fixture(autouse=True)
def _no_profiles_env(monkeypatch):
    monkeypatch.delenv("RLALLOC_PROFILES", raising=False)


def write_csv(tmp_path, text, name="jobs.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def rejected(source, cluster=CLUSTER, **kwargs):
    with pytest.raises(UserError) as info:
        load_workload(str(source), cluster, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


# --- real traces -------------------------------------------------------------------------------


@needs_philly
def test_philly_loads_fast_and_round_trips():
    start = time.perf_counter()
    workload = load_workload(str(PHILLY_CSV), BIG_CLUSTER)
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0, f"philly.csv took {elapsed:.2f} s"
    jobs = workload.jobs
    assert len(jobs) == 82247
    assert jobs[0].submit_s == 0.0
    raw = pd.read_csv(PHILLY_CSV)
    for job in jobs[:: 5000]:
        row = raw.iloc[int(job.job_id.removeprefix("philly-")) - 1]
        assert job.requested_gpus == row.num_gpus
        speed = GENERIC_SCALING.iterations_per_s(packed_shape(job.requested_gpus, 8))
        assert job.work / speed == pytest.approx(row.duration)
        assert job.min_workers == 1
        assert job.max_workers == min(4 * job.requested_gpus, BIG_CLUSTER.total_gpus)
        assert job.restore_s == GENERIC_RESTORE_S and job.application is None


@needs_philly
def test_philly_rejects_jobs_larger_than_the_cluster():
    message = rejected(PHILLY_CSV, CLUSTER)
    assert "philly.csv: row " in message and "exceeds the cluster's 64 GPUs" in message


@needs_pollux
def test_pollux_workload():
    workload = load_workload(str(POLLUX_WORKLOADS / "workload-6.csv"), CLUSTER)
    profiles = load_profiles(DEFAULT_PROFILES_ROOT)
    assert len(workload.jobs) == 160
    for job in workload.jobs:
        profile = profiles[job.application]
        assert job.work == profile.work_iterations(job.batch_size)
        assert job.restore_s == RESTORE_S[job.application]
        assert job.min_workers <= job.requested_gpus <= job.max_workers <= CLUSTER.total_gpus


def test_pollux_without_profiles_is_a_user_error(tmp_path):
    path = write_csv(tmp_path, "name,time,application,num_replicas,batch_size\nj,0,ncf,1,256\n")
    message = rejected(path, profiles_root=tmp_path / "absent")
    assert "RLALLOC_PROFILES" in message


def test_pollux_unknown_application(tmp_path):
    path = write_csv(
        tmp_path,
        "name,time,application,num_replicas,batch_size\na,0,ncf,1,256\nb,5,gpt5,2,64\n",
    )
    message = rejected(path)
    assert f"{path}: row 2 (line 3): unknown application 'gpt5'" in message


def test_pollux_names_equal_but_for_spaces_are_one_repeated_name(tmp_path):
    # the ids are the stripped names: "jobA " was let through, and the simulator asserted
    path = write_csv(
        tmp_path,
        "name,time,application,num_replicas,batch_size\njobA,0,ncf,1,256\njobA ,5,ncf,1,256\n",
    )
    assert f"{path}: row 2 (line 3): name repeats an earlier job's" in rejected(path)


SIA_ROWS = ("name,time,application,num_replicas,batch_size{}\n"
            "r,0,cifar10,4,1024{}\na,10,cifar10,4,1024{}\ns,20,bert,2,384{}\nb,30,ncf,2,1024{}\n")
SIA_CLUSTER = parse_cluster("6x4:T4+3x8:RTX2080Ti+2x8:A100")


def test_sias_category_column_fixes_a_rigid_jobs_gpus_and_nothing_else(tmp_path):
    """Sia's `category` column: a rigid job runs on exactly its GPUs; adaptive, scale-gpus and
    blank rows are the elastic jobs the same file without the column gives, and rigid and
    scale-gpus jobs keep their batch size where others may tune it."""
    with_column = write_csv(tmp_path, SIA_ROWS.format(",category", ",rigid", ",adaptive",
                                                      ",scale-gpus", ","), name="sia.csv")
    without = write_csv(tmp_path, SIA_ROWS.format(*[""] * 5), name="plain.csv")
    categorised = {job.job_id: job for job in load_workload(str(with_column), SIA_CLUSTER).jobs}
    plain = {job.job_id: job for job in load_workload(str(without), SIA_CLUSTER).jobs}
    rigid = categorised["r"]
    assert (rigid.min_workers, rigid.max_workers, rigid.requested_gpus) == (4, 4, 4)
    assert plain["r"].min_workers == 1 and plain["r"].max_workers > 4
    assert rigid == replace(plain["r"], min_workers=4, max_workers=4, fixed_batch=True)
    assert categorised["s"] == replace(plain["s"], fixed_batch=True)
    assert all(categorised[name] == plain[name] for name in ("a", "b"))
    assert not any(job.fixed_batch for job in plain.values())


def test_an_unknown_sia_category_is_refused_not_read_as_elastic(tmp_path):
    path = write_csv(tmp_path, SIA_ROWS.format(",category", ",rigid", ",adaptive", ",elastic",
                                               ","))
    message = rejected(path, SIA_CLUSTER)
    assert f"{path}: row 3 (line 4): category 'elastic' is not one of Sia's" in message
    assert "adaptive, scale-gpus, rigid" in message


# --- canonical CSV -----------------------------------------------------------------------------


def test_canonical_generic_rows_need_no_profiles(tmp_path):
    path = write_csv(
        tmp_path,
        "job_id,submit_s,num_gpus,duration_s,min_gpus,max_gpus,restore_s\n"
        "late,100,8,3600,4,16,300\n"
        "early,0,1,60,,,\n",
    )
    workload = load_workload(str(path), CLUSTER, profiles_root=tmp_path / "absent")
    early, late = workload.jobs
    assert early.job_id == "early" and early.work == pytest.approx(60.0)
    assert (early.min_workers, early.max_workers, early.restore_s) == (1, 4, GENERIC_RESTORE_S)
    assert (late.min_workers, late.max_workers, late.restore_s) == (4, 16, 300.0)
    assert late.work / GENERIC_SCALING.iterations_per_s((4, 4)) == pytest.approx(3600.0)


def test_canonical_profiled_rows(tmp_path):
    path = write_csv(
        tmp_path,
        "job_id,submit_s,num_gpus,duration_s,application,batch_size\n"
        "converge,0,4,,imagenet,3200\n"
        "timed,10,4,600,cifar10,512\n",
    )
    profiles = load_profiles(DEFAULT_PROFILES_ROOT)
    converge, timed = load_workload(str(path), CLUSTER).jobs
    assert converge.work == profiles["imagenet"].work_iterations(3200)
    assert converge.restore_s == RESTORE_S["imagenet"]
    assert converge.max_workers == min(3200 // 20, CLUSTER.total_gpus)
    speed = profiles["cifar10"].throughput(512).iterations_per_s((4,))
    assert timed.work == pytest.approx(600 * speed)
    assert (timed.application, timed.batch_size) == ("cifar10", 512)


def test_canonical_gpus_per_worker_counts_the_elastic_range_in_workers(tmp_path):
    path = write_csv(
        tmp_path,
        "job_id,submit_s,num_gpus,duration_s,min_gpus,max_gpus,gpus_per_worker\n"
        "pretrain,0,16,3600,8,32,8\n"
        "odd,1,9,600,,,3\n"
        "plain,2,2,60,,,\n",
    )
    pretrain, odd, plain = load_workload(str(path), BIG_CLUSTER).jobs
    assert (pretrain.gpus_per_worker, pretrain.requested_gpus) == (8, 16)
    assert (pretrain.min_workers, pretrain.max_workers) == (1, 4)
    assert pretrain.work / GENERIC_SCALING.iterations_per_s((8, 8)) == pytest.approx(3600.0)
    # three 3-GPU workers packed on 8-GPU nodes: two on one node, one on another
    assert odd.work / GENERIC_SCALING.iterations_per_s((6, 3)) == pytest.approx(600.0)
    assert (odd.min_workers, odd.max_workers) == (1, 12)  # default: 4 x its request, in workers
    assert (plain.gpus_per_worker, plain.min_workers, plain.max_workers) == (1, 1, 8)


# --- bad input ---------------------------------------------------------------------------------

PHILLY_HEADER = "timestamp,duration,num_gpus,gpu_time,cluster\n"
CANONICAL_HEADER = "job_id,submit_s,num_gpus,duration_s\n"


def test_missing_file(tmp_path):
    assert "no such workload file" in rejected(tmp_path / "nope.csv")


def test_a_directory_is_not_a_workload(tmp_path):
    assert f"{tmp_path} is a directory; a workload is a CSV file" in rejected(tmp_path)


def test_unknown_header(tmp_path):
    path = write_csv(tmp_path, "id,start,gpus\n1,0,1\n")
    message = rejected(path)
    assert str(path) in message and "job_id,submit_s,num_gpus,duration_s" in message


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (PHILLY_HEADER + "2017-10-01 00:00:00,10,1,10,a\n2017-10-01 00:00:05,-3,1,-3,a\n",
         "row 2 (line 3): duration must be"),
        (PHILLY_HEADER + "2017-10-01 00:00:00,10,1,10,a\nyesterday,10,1,10,a\n",
         "row 2 (line 3): timestamp is not a date-time"),
        # pandas refuses a column mixing zoned and naive date-times: which zone is unknown
        (PHILLY_HEADER + "2017-10-01 00:00:00+00:00,10,1,10,a\n2017-10-01 00:00:05,10,1,10,a\n",
         "row 2 (line 3): timestamp lacks a UTC offset, unlike row 1's; write every timestamp "
         "with an offset"),
        (PHILLY_HEADER + "2017-10-01 00:00:00,10,1,10,a\n2017-10-01 00:00:05Z,10,1,10,a\n",
         "row 2 (line 3): timestamp has a UTC offset, unlike row 1's"),
        (PHILLY_HEADER + "2017-10-01 00:00:00,10,65,650,a\n",
         "row 1 (line 2): num_gpus exceeds the cluster's 64 GPUs"),
        (PHILLY_HEADER + "2017-10-01 00:00:00,10,1.5,15,a\n",
         "row 1 (line 2): num_gpus must be a whole number"),
        (CANONICAL_HEADER + "a,0,1,10\nb,1,1,-10\n", "row 2 (line 3): duration_s must be"),
        (CANONICAL_HEADER + "a,0,1,10\nb,1,100,10\n", "row 2 (line 3): num_gpus exceeds"),
        (CANONICAL_HEADER + "a,0,1,10\na,1,1,10\n", "row 2 (line 3): job_id repeats"),
        (CANONICAL_HEADER + "a,0,1,10\nb,1,1,\n", "row 2 (line 3): duration_s is empty"),
        # a literal nan is a value that is not a number, not an empty cell
        (CANONICAL_HEADER + "a,0,1,nan\n", "row 1 (line 2): duration_s must be a number"),
        ("job_id,submit_s,num_gpus,duration_s,application,batch_size\na,0,2,10,NA,8\n",
         "row 1 (line 2): unknown application 'NA'"),  # a name, not a missing value
        ("job_id,submit_s,num_gpus,duration_s,min_gpus\na,0,2,10,3\n",
         "row 1 (line 2): needs min_gpus <= num_gpus <= max_gpus"),
        ("job_id,submit_s,num_gpus,duration_s,application\na,0,2,,ncf\n",
         "row 1 (line 2): application without batch_size"),
        # a batch size alone would be ignored: the job would run as a generic one
        ("job_id,submit_s,num_gpus,duration_s,application,batch_size\na,0,1,100,,\n"
         "b,0,1,100,,128\n", "row 2 (line 3): batch_size without application"),
        (CANONICAL_HEADER, "header but no jobs"),
        # infinite and absurd numbers: each would hang or crash the simulator
        (CANONICAL_HEADER + "a,0,1,inf\n", "row 1 (line 2): duration_s must be at most"),
        (CANONICAL_HEADER + "a,0,1,10\nb,0,1,1e308\n", "row 2 (line 3): duration_s must be at"),
        (CANONICAL_HEADER + "a,inf,1,10\n", "row 1 (line 2): submit_s must be at most"),
        (CANONICAL_HEADER + "a,nan,1,10\n", "row 1 (line 2): submit_s must be a number"),
        (CANONICAL_HEADER + "a,0,inf,10\n", "row 1 (line 2): num_gpus must be a whole number"),
        (CANONICAL_HEADER + "a,0,1e30,10\n", "row 1 (line 2): num_gpus must be at most"),
        ("job_id,submit_s,num_gpus,duration_s,restore_s\na,0,1,10,inf\n",
         "row 1 (line 2): restore_s must be at most 86,400 s"),
        ("job_id,submit_s,num_gpus,duration_s,min_gpus,max_gpus\na,0,1,10,1,inf\n",
         "row 1 (line 2): max_gpus must be a whole number"),
        # an elastic ceiling above the cluster is lowered, not a reason for a larger cluster
        ("job_id,submit_s,num_gpus,duration_s,min_gpus,max_gpus\na,0,1,10,1,100\n",
         "max_gpus exceeds the cluster's 64 GPUs; lower it to at most 64 or leave the cell"),
        (PHILLY_HEADER + "2017-10-01 00:00:00,inf,1,10,a\n", "row 1 (line 2): duration must be"),
        (PHILLY_HEADER + "2017-10-01 00:00:00,10,1,10,a\n2019-10-01 00:00:00,10,1,10,a\n",
         "row 2 (line 3): timestamp is more than 365 days after the earliest"),
        # rows with more or fewer fields than the header
        (CANONICAL_HEADER + "job-a,0,1,2,600\njob-b,5,1,2,900\n",
         "row 1 (line 2): 5 fields where the header has 4; remove the extra field"),
        (CANONICAL_HEADER + "a,0,1,100,\n", "row 1 (line 2): 5 fields where the header has 4"),
        (CANONICAL_HEADER + "a,0,1,10\n\nb,0,1\n", "row 2 (line 4): 3 fields where the header"),
        # missing columns are named for the closest format, an empty file is called empty
        ("job_id,submit_s,num_gpus\na,0,1\n", "canonical workload is missing column(s) "
                                               "duration_s"),
        ("name,time,application,num_replicas\nj,0,ncf,1\n",
         "Pollux workload is missing column(s) batch_size"),
        # a misspelt required column is named for its rename, as an optional one is below
        ("job_id,submit_s,num_gpu,duration_s\na,0,1,10\n",
         "missing column(s) num_gpus; rename num_gpu to num_gpus"),
        # ... but a valid optional column is never offered as one (min_gpus is no num_gpus)
        ("job_id,submit_s,min_gpus,max_gpus,duration_s\na,0,1,2,10\n",
         "missing column(s) num_gpus; the header must include"),
        ("name,time,application,num_replica,batchsize\nj,0,ncf,1,64\n",
         "missing column(s) num_replicas, batch_size; rename num_replica to num_replicas; "
         "rename batchsize to batch_size"),
        ("", "the file is empty"),
        # a misspelt, unknown or repeated column: the optional one would be silently ignored
        ("job_id,submit_s,num_gpus,duration_s,max_gpu\na,0,1,10,4\n",
         "column 'max_gpu' is not a canonical column; rename it to max_gpus"),
        ("job_id,submit_s,num_gpus,duration_s,owner\na,0,1,10,me\n",
         "column 'owner' is not a canonical column; rename or remove it"),
        ("job_id,submit_s,num_gpus,duration_s,\na,0,1,10,\n",
         "an unnamed column is not a canonical column; remove it"),
        ("job_id,submit_s,num_gpus,duration_s,num_gpus\na,0,1,10,2\n",
         "the header names column num_gpus twice"),
        # pandas reads a column of only true/false as booleans, which are not GPU counts
        (CANONICAL_HEADER + "a,0,true,10\n", "row 1 (line 2): num_gpus must be a whole number"),
        (CANONICAL_HEADER + "a,0,1,True\n", "row 1 (line 2): duration_s must be a number"),
        # workers of k GPUs: k a whole number that fits a node, GPU counts whole workers
        ("job_id,submit_s,num_gpus,duration_s,gpus_per_worker\na,0,4,10,0\n",
         "row 1 (line 2): gpus_per_worker must be a whole number >= 1; fix the gpus_per_worker"),
        ("job_id,submit_s,num_gpus,duration_s,gpus_per_worker\na,0,4,10,2\nb,0,8,10,1.5\n",
         "row 2 (line 3): gpus_per_worker must be a whole number >= 1"),
        ("job_id,submit_s,num_gpus,duration_s,gpus_per_worker\na,0,8,10,8\n",
         "row 1 (line 2): gpus_per_worker exceeds the largest node's 4 GPUs (a worker's GPUs "
         "are on one node); lower it to at most 4, or simulate bigger nodes (--cluster)"),
        ("job_id,submit_s,num_gpus,duration_s,gpus_per_worker\na,0,6,10,4\n",
         "row 1 (line 2): num_gpus is not whole workers of gpus_per_worker GPUs; make num_gpus"),
        ("job_id,submit_s,num_gpus,duration_s,min_gpus,gpus_per_worker\na,0,4,10,2,4\n",
         "row 1 (line 2): min_gpus or max_gpus is not whole workers of gpus_per_worker GPUs"),
    ],
)
def test_bad_rows_name_file_and_row(tmp_path, text, problem):
    path = write_csv(tmp_path, text)
    message = rejected(path)
    assert message.startswith(f"{path}: ") and problem in message


def test_philly_timestamps_with_different_utc_offsets_are_one_clock(tmp_path):
    path = write_csv(tmp_path, PHILLY_HEADER + "2017-10-01 02:00:00+02:00,10,1,10,a\n"
                     "2017-10-01 00:10:00Z,10,1,10,a\n2017-10-01 01:00:00+01:00,10,1,10,a\n")
    jobs = load_workload(str(path), CLUSTER).jobs
    assert [(j.job_id, j.submit_s) for j in jobs] == [
        ("philly-1", 0.0), ("philly-3", 0.0), ("philly-2", 600.0)]


def test_philly_timestamps_of_one_offset_are_in_utc_too(tmp_path):
    """Mixed offsets came out in UTC, one offset in local time: the same instants read other
    hours of the day (as the workload sampler takes them) by how many offsets a file held."""
    from rlalloc.env.workload.philly import PHILLY_COLUMNS, submit_timestamps
    from rlalloc.env.workload.table import read_table

    one = write_csv(tmp_path, PHILLY_HEADER + "2017-10-01 10:00:00+02:00,10,1,10,a\n"
                    "2017-10-01 11:00:00+02:00,10,1,10,a\n")
    mixed = tmp_path / "mixed.csv"
    mixed.write_text(PHILLY_HEADER + "2017-10-01 10:00:00+02:00,10,1,10,a\n"
                     "2017-10-01 09:00:00+00:00,10,1,10,a\n")
    hours = [submit_timestamps(p, read_table(p, PHILLY_COLUMNS, "Philly")).dt.hour.tolist()
             for p in (one, mixed)]
    assert hours == [[8, 9], [8, 9]]


def test_job_ids_are_text_so_leading_zeros_make_other_ids(tmp_path):
    path = write_csv(tmp_path, CANONICAL_HEADER + "1,0,1,100\n01,0,1,100\n007,5,1,10\n")
    assert [j.job_id for j in load_workload(str(path), CLUSTER).jobs] == ["1", "01", "007"]


def test_a_non_utf8_workload_is_one_line(tmp_path):
    path = tmp_path / "jobs.csv"
    path.write_bytes(b"\xff\xfe garbage\n")
    assert "not UTF-8 text" in rejected(path)


def test_an_application_missing_from_the_users_profiles_is_named(tmp_path, monkeypatch):
    """`RLALLOC_PROFILES` replaces the shipped profiles: an application it lacks is named."""
    own = tmp_path / "own_profiles"
    shutil.copytree(DEFAULT_PROFILES_ROOT / "cifar10", own / "cifar10")
    monkeypatch.setenv("RLALLOC_PROFILES", str(own))
    path = write_csv(
        tmp_path, "job_id,submit_s,num_gpus,duration_s,application,batch_size\na,0,2,,ncf,256\n"
    )
    assert "row 1 (line 2): unknown application 'ncf'" in rejected(path)


def test_canonical_unknown_application(tmp_path):
    path = write_csv(
        tmp_path,
        "job_id,submit_s,num_gpus,duration_s,application,batch_size\n"
        "a,0,1,10,,\nb,0,2,,llama,256\n",
    )
    assert f"{path}: row 2 (line 3): unknown application 'llama'" in rejected(path)


def test_bad_synthetic_source():
    assert "synthetic[:NUM_JOBS[:LOAD[:MAX_HOURS]]]" in rejected("synthetic:many")
    assert "too many fields" in rejected("synthetic:1:1:1:1")


@pytest.mark.parametrize(("source", "problem"), [
    ("synthetic:0", "NUM_JOBS must be 1..100,000, not 0"),
    ("synthetic:10:inf", "LOAD (offered load) must be in [0.01, 100], not inf"),
    ("synthetic:10:nan", "LOAD (offered load) must be in [0.01, 100], not nan"),
    ("synthetic:10:1e-9", "LOAD (offered load) must be in [0.01, 100]"),  # an endless span
    ("synthetic:10:1:0", "MAX_HOURS (the run-time cap) must be in [0.1, 8760] hours, not 0"),
    ("synthetic:10:1:-1", "MAX_HOURS (the run-time cap) must be in [0.1, 8760] hours, not -1"),
    ("synthetic:10:1:1e-9", "MAX_HOURS"),  # every draw would be redrawn for ever
    ("synthetic:10:1:inf", "MAX_HOURS"),
])
def test_synthetic_fields_are_checked_against_their_ranges(source, problem):
    assert problem in rejected(source)


def test_synthetic_max_hours_caps_run_times():
    capped = load_workload("synthetic:300:0.9:2", CLUSTER, seed=1)
    uncapped = load_workload("synthetic:300:0.9", CLUSTER, seed=1)
    packed_1gpu = 1.0  # generic speed of one GPU: work == run time for 1-GPU jobs
    one_gpu = [j.work / packed_1gpu for j in capped.jobs if j.requested_gpus == 1]
    assert max(one_gpu) <= 2 * 3600.0
    assert max(j.work for j in uncapped.jobs if j.requested_gpus == 1) > 2 * 3600.0


# --- generator ---------------------------------------------------------------------------------


def test_synthetic_is_deterministic_by_seed():
    first = load_workload("synthetic:200:0.9", CLUSTER, seed=3)
    again = load_workload("synthetic:200:0.9", CLUSTER, seed=3)
    other = load_workload("synthetic:200:0.9", CLUSTER, seed=4)
    assert first == again and first != other
    assert len(first.jobs) == 200


def test_synthetic_matches_published_statistics():
    config = SyntheticConfig(num_jobs=20_000, load=0.7, seed=1)
    jobs = generate(config, BIG_CLUSTER).jobs
    gpus = np.array([j.requested_gpus for j in jobs])
    speed = {g: GENERIC_SCALING.iterations_per_s(packed_shape(g, 8)) for g in np.unique(gpus)}
    duration_s = np.array([j.work / speed[j.requested_gpus] for j in jobs])
    total = sum(count for _, count in PHILLY_GPU_MIX)
    for size, count in PHILLY_GPU_MIX:
        assert np.mean(gpus == size) == pytest.approx(count / total, abs=0.005)
    assert np.median(duration_s) == pytest.approx(1144, rel=0.08)
    span_s = jobs[-1].submit_s
    offered = (gpus * duration_s).sum() / (BIG_CLUSTER.total_gpus * span_s)
    assert offered == pytest.approx(0.7, rel=0.02)


def test_synthetic_fits_small_clusters_and_truncates():
    config = SyntheticConfig(num_jobs=2000, seed=2, max_duration_s=3600.0)
    jobs = generate(config, parse_cluster("1x4")).jobs
    assert max(j.requested_gpus for j in jobs) <= 4
    speed = {g: GENERIC_SCALING.iterations_per_s((g,)) for g in (1, 2, 4)}
    assert max(j.work / speed[j.requested_gpus] for j in jobs) <= 3600.0 + 1e-6


@pytest.mark.parametrize(("fields", "problem"), [
    ({"load": 0}, "LOAD (offered load) must be in [0.01, 100], not 0"),
    ({"mean_duration_s": 1000.0, "median_duration_s": 1000.0},
     "need mean_duration_s > median_duration_s > 0"),  # sigma would be 0: no spread
    ({"median_duration_s": 0.0}, "need mean_duration_s > median_duration_s > 0"),
    ({"hourly_factors": (1.0,) * 23}, "hourly_factors needs 24 values >= 0"),
    ({"hourly_factors": (1.0,) * 23 + (-1.0,)}, "hourly_factors needs 24 values >= 0"),
])
def test_synthetic_rejects_bad_config(fields, problem):
    with pytest.raises(UserError) as info:
        SyntheticConfig(**fields)
    assert str(info.value) == f"synthetic workload: {problem}"


def test_synthetic_drops_job_sizes_larger_than_the_cluster():
    config = SyntheticConfig(num_jobs=10, gpu_mix=((8, 1), (16, 1)))
    with pytest.raises(UserError, match="no job size in gpu_mix fits the 4 GPUs one job"):
        generate(config, parse_cluster("1x4"))
    # on a mixed cluster a job holds GPUs of one type only: 8 T4 + 4 A100 hold no 16-GPU job
    mixed = generate(SyntheticConfig(num_jobs=50, gpu_mix=((8, 1), (16, 1))),
                     parse_cluster("2x4:T4+1x4:A100")).jobs
    assert {j.requested_gpus for j in mixed} == {8} and max(j.max_workers for j in mixed) == 8
    # sizes that do not fit are left out of the mix, the rest kept
    jobs = generate(SyntheticConfig(num_jobs=50, gpu_mix=((2, 1), (16, 1))),
                    parse_cluster("1x4")).jobs
    assert {j.requested_gpus for j in jobs} == {2}
