"""rlalloc's own workload CSV, for describing the jobs of your own cluster.

One row per job, in any order (jobs are sorted by submit time). Header and columns::

    job_id,submit_s,num_gpus,duration_s[,application,batch_size,min_gpus,max_gpus,restore_s,
                                        gpus_per_worker]

Required:

* ``job_id`` — unique, non-empty name, read as text (``01`` and ``1`` are two jobs).
* ``submit_s`` — submission time, seconds (0 to a year) from the start of the workload.
* ``num_gpus`` — GPUs the job asks for (>= 1, at most the cluster's GPUs).
* ``duration_s`` — run time in seconds (0 to a year) when given ``num_gpus`` GPUs packed on as
  few nodes as possible. May be left empty for a profiled job (below).

Optional (a column may be absent, or a cell empty):

* ``application`` + ``batch_size`` — a measured Pollux profile (bert, cifar10, deepspeech2,
  imagenet, ncf, yolov3) and its global batch size. The job then runs at the profile's speed.
  With ``duration_s`` empty its work is what the profile needs to converge at that batch size;
  with ``duration_s`` given, its work is that run time at the profile's speed on ``num_gpus``
  packed GPUs. Without ``application`` the job uses the generic scaling model (and a
  ``batch_size`` alone is refused: it would be ignored).
* ``min_gpus``, ``max_gpus`` — its elastic range, ``1 <= min_gpus <= num_gpus <= max_gpus <=
  cluster GPUs``. Defaults: 1, and for profiled jobs as many workers as keep the smallest measured
  local batch (capped by the cluster), for others 4 x ``num_gpus`` (capped by the cluster).
* ``restore_s`` — checkpoint-restore seconds (0 to a day) paid on every (re)start or resize.
  Default: the Sia figure for the application, else 65 s.
* ``gpus_per_worker`` — GPUs each worker pod holds, all on one node (a PyTorchJob worker
  requesting ``nvidia.com/gpu: k``, ``nprocPerNode: k``). Default 1. At most the largest node's
  GPUs; ``num_gpus``, ``min_gpus`` and ``max_gpus`` must then be whole workers (multiples of it),
  and the job grows and shrinks by whole workers. Default ``min_gpus`` is one worker.

Every row has as many fields as the header (an empty cell keeps its comma); any other column is
refused, since a misspelt optional one would be ignored; limits are the ``MAX_*`` constants of
`rlalloc.env.workload.table`.

Example::

    job_id,submit_s,num_gpus,duration_s,application,batch_size,min_gpus,max_gpus,restore_s,gpus_per_worker
    llm-finetune,0,16,7200,,,8,32,300,8
    resnet-sweep-3,120,4,,imagenet,3200,,,,
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from rlalloc.env.cluster import ClusterSpec
from rlalloc.env.profiles import AppProfile, packed_shape, restore_s
from rlalloc.env.workload.pollux import check_applications, profiled_max_workers
from rlalloc.env.workload.spec import JobSpec, Workload
from rlalloc.env.workload.table import (
    MAX_DURATION_S,
    MAX_RESTORE_S,
    MAX_SUBMIT_S,
    MIN_WORKERS,
    generic_max_workers,
    generic_work,
    read_table,
    reject_beyond_cluster,
    reject_rows,
    seconds,
    submit_order,
    whole_numbers,
)

CANONICAL_COLUMNS = ("job_id", "submit_s", "num_gpus", "duration_s")
"""Required columns."""
CANONICAL_OPTIONAL_COLUMNS = ("application", "batch_size", "min_gpus", "max_gpus", "restore_s",
                              "gpus_per_worker")
"""Optional columns; an absent column is the same as all its cells empty."""


def load_canonical(
    path: Path, cluster: ClusterSpec, profiles: Mapping[str, AppProfile] | None
) -> Workload:
    """Load a canonical workload CSV; `profiles` is needed only if a row names an application."""
    path = Path(path)
    df = read_table(path, CANONICAL_COLUMNS, "canonical", text=("job_id", "application"),
                    optional=CANONICAL_OPTIONAL_COLUMNS)
    for column in CANONICAL_OPTIONAL_COLUMNS:
        if column not in df.columns:
            df[column] = np.nan
    total = cluster.job_gpus()

    ids = df["job_id"].astype(str).str.strip()
    reject_rows(path, df["job_id"].isna() | (ids == ""), "job_id is empty", "name every job")
    reject_rows(path, ids.duplicated(), "job_id repeats an earlier row's", "make job ids unique")
    submit_s = seconds(path, df, "submit_s", MAX_SUBMIT_S)
    gpus = whole_numbers(path, df, "num_gpus", 1)
    reject_beyond_cluster(path, gpus, "num_gpus", cluster)
    per_worker = _workers_of(path, df, gpus, cluster)

    duration_given = df["duration_s"].notna().to_numpy()
    duration_s = seconds(path, df, "duration_s", MAX_DURATION_S, where=duration_given)
    app_given = df["application"].notna().to_numpy()
    reject_rows(
        path,
        ~duration_given & ~app_given,
        "duration_s is empty and no application is named",
        "give the run time, or an application and batch_size",
    )
    reject_rows(
        path,
        app_given & df["batch_size"].isna().to_numpy(),
        "application without batch_size",
        "give the job's global batch size",
    )
    reject_rows(
        path,
        ~app_given & df["batch_size"].notna().to_numpy(),
        "batch_size without application (the job would run as a generic one)",
        "name its application, or leave batch_size empty",
    )
    applications = df["application"].astype(str).str.strip().to_numpy()
    batch_size = np.zeros(len(df), dtype=np.int64)
    if app_given.any():
        assert profiles is not None, "the loader reads profiles for a file with applications"
        batch_size = whole_numbers(path, df, "batch_size", 1, where=app_given)
        check_applications(path, applications, batch_size, profiles, where=app_given)

    default_max = generic_max_workers(gpus, total)
    for i in np.flatnonzero(app_given).tolist():
        default_max[i] = profiled_max_workers(
            profiles[applications[i]], int(batch_size[i]), int(gpus[i]), total
        )
    worker_capacity = _worker_capacity(cluster, per_worker)
    default_max = np.maximum(np.minimum(default_max, worker_capacity) // per_worker * per_worker,
                             gpus)
    min_gpus = _optional_whole(path, df, "min_gpus", MIN_WORKERS * per_worker)
    max_gpus = _optional_whole(path, df, "max_gpus", default_max)
    reject_rows(
        path,
        (min_gpus % per_worker != 0) | (max_gpus % per_worker != 0),
        "min_gpus or max_gpus is not whole workers of gpus_per_worker GPUs",
        "make them multiples of gpus_per_worker",
    )
    reject_rows(
        path,
        (min_gpus > gpus) | (gpus > max_gpus),
        "needs min_gpus <= num_gpus <= max_gpus",
        "fix the elastic range",
    )
    reject_rows(
        path,
        max_gpus > total,
        f"max_gpus exceeds the cluster's {total} GPUs",
        f"lower it to at most {total} or leave the cell empty for the default",
    )
    reject_rows(
        path,
        max_gpus > worker_capacity,
        "max_gpus exceeds the whole workers of gpus_per_worker GPUs the cluster's nodes hold",
        "lower it or leave the cell empty for the default",
    )
    restore = seconds(path, df, "restore_s", MAX_RESTORE_S,
                      where=df["restore_s"].notna().to_numpy())

    work = np.where(duration_given, generic_work(np.nan_to_num(duration_s), gpus,
                                                 cluster.max_gpus_per_node,
                                                 gpus_per_worker=per_worker), 0.0)
    for i in np.flatnonzero(app_given).tolist():
        profile = profiles[applications[i]]
        if duration_given[i]:
            shape = packed_shape(int(gpus[i]), cluster.max_gpus_per_node, int(per_worker[i]))
            speed = profile.throughput(int(batch_size[i])).iterations_per_s(shape)
            work[i] = duration_s[i] * speed
        else:
            work[i] = profile.work_iterations(int(batch_size[i]))

    jobs = tuple(
        JobSpec(
            job_id=ids.iat[i],
            submit_s=float(submit_s[i]),
            requested_gpus=int(gpus[i]),
            work=float(work[i]),
            min_workers=int(min_gpus[i] // per_worker[i]),
            max_workers=int(max_gpus[i] // per_worker[i]),
            restore_s=(
                float(restore[i])
                if not np.isnan(restore[i])
                else restore_s(applications[i] if app_given[i] else None)
            ),
            application=applications[i] if app_given[i] else None,
            batch_size=int(batch_size[i]) if app_given[i] else None,
            gpus_per_worker=int(per_worker[i]),
        )
        for i in submit_order(submit_s).tolist()
    )
    return Workload(path.stem, jobs)


def _workers_of(path: Path, df: pd.DataFrame, gpus: np.ndarray,
                cluster: ClusterSpec) -> np.ndarray:
    """The `gpus_per_worker` column (default 1), checked against the cluster's nodes (a worker's
    GPUs are on one node) and the rows' `num_gpus` (whole workers)."""
    per_worker = _optional_whole(path, df, "gpus_per_worker", 1)
    largest = cluster.max_gpus_per_node
    reject_rows(
        path,
        per_worker > largest,
        f"gpus_per_worker exceeds the largest node's {largest} GPUs (a worker's GPUs are on one "
        "node)",
        f"lower it to at most {largest}, or simulate bigger nodes (--cluster)",
    )
    reject_rows(
        path,
        gpus % per_worker != 0,
        "num_gpus is not whole workers of gpus_per_worker GPUs",
        "make num_gpus a multiple of gpus_per_worker",
    )
    capacity = _worker_capacity(cluster, per_worker)
    reject_rows(
        path,
        gpus > capacity,
        "num_gpus exceeds the whole workers of gpus_per_worker GPUs the cluster's nodes hold",
        "simulate a larger cluster (--cluster) or remove such rows",
    )
    return per_worker


def _worker_capacity(cluster: ClusterSpec, per_worker: np.ndarray) -> np.ndarray:
    """GPUs of whole workers one job can hold on the cluster (`ClusterSpec.job_gpus`), per
    row's worker size."""
    sizes = {k: cluster.job_gpus(k) for k in np.unique(per_worker).tolist()}
    return np.array([sizes[k] for k in per_worker.tolist()], dtype=np.int64)


def _optional_whole(
    path: Path, df: pd.DataFrame, column: str, default: int | np.ndarray
) -> np.ndarray:
    """An optional whole-number column (>= 1), `default` where a cell is empty."""
    given = df[column].notna().to_numpy()
    defaults = np.broadcast_to(np.asarray(default, dtype=np.int64), (len(df),))
    return np.where(given, whole_numbers(path, df, column, 1, where=given), defaults)
