"""The Microsoft Philly trace as reduced by the Pollux artifact (``philly.csv``).

Columns ``timestamp,duration,num_gpus,gpu_time,cluster``: submit time (``YYYY-MM-DD HH:MM:SS``),
run time in seconds, GPUs requested, GPU-seconds and virtual-cluster id; only the first three
are used. Jobs have no profile: each is a generic job whose work is its run time at the generic
model's speed on its request packed onto the cluster's largest nodes, so a job given exactly
what it asked for runs exactly as long as it did in Philly. A job's id is ``philly-<row>``, its
1-based data row in the file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from rlalloc.env.cluster import ClusterSpec
from rlalloc.env.profiles import GENERIC_RESTORE_S
from rlalloc.env.workload.spec import JobSpec, Workload
from rlalloc.env.workload.table import (
    MAX_DURATION_S,
    MAX_SUBMIT_S,
    MIN_WORKERS,
    SECONDS_PER_DAY,
    generic_max_workers,
    generic_work,
    read_table,
    reject_beyond_cluster,
    reject_rows,
    seconds,
    submit_order,
    whole_numbers,
)

PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus")
"""Columns the loader needs (the file also has ``gpu_time`` and ``cluster``)."""


def submit_timestamps(path: Path, df: pd.DataFrame) -> pd.Series:
    """The ``timestamp`` column as date-times (one-line `UserError` naming a bad row); with UTC
    offsets, in UTC whether they are all one offset or several (a time of day read off them,
    as the workload sampler does, must not depend on which)."""
    try:
        stamps = pd.to_datetime(df["timestamp"], format="ISO8601", errors="coerce")
    except ValueError:  # pandas raises on mixed time zones even with errors="coerce"
        stamps = _mixed_zone_timestamps(path, df["timestamp"])
    reject_rows(path, stamps.isna().to_numpy(), "timestamp is not a date-time",
                "write it as YYYY-MM-DD HH:MM:SS")
    return stamps.dt.tz_convert("UTC") if stamps.dt.tz is not None else stamps


def _mixed_zone_timestamps(path: Path, cells: pd.Series) -> pd.Series:
    """Timestamps with different UTC offsets, as UTC: each names its instant. A timestamp
    without an offset among ones with an offset is refused (one-line `UserError`): the zone it
    was written in is unknown, and guessing one would shift its submit time by hours."""
    stamps = pd.to_datetime(cells, format="ISO8601", errors="coerce", utc=True)
    parsed = stamps.notna().to_numpy()
    zoned = np.array([ok and pd.Timestamp(cell).tzinfo is not None
                      for cell, ok in zip(cells, parsed, strict=True)])
    if parsed.any():
        first = int(np.flatnonzero(parsed)[0])
        reject_rows(path, parsed & (zoned != zoned[first]),
                    f"timestamp {'lacks' if zoned[first] else 'has'} a UTC offset, unlike "
                    f"row {first + 1}'s", "write every timestamp with an offset (e.g. "
                    "+00:00) or every one without")
    return stamps


def load_philly(path: Path, cluster: ClusterSpec) -> Workload:
    """Load a Philly CSV; submit times are seconds after the earliest submission."""
    path = Path(path)
    df = read_table(path, PHILLY_COLUMNS, "Philly")
    stamps = submit_timestamps(path, df)
    duration_s = seconds(path, df, "duration", MAX_DURATION_S)
    gpus = whole_numbers(path, df, "num_gpus", 1)
    reject_beyond_cluster(path, gpus, "num_gpus", cluster)

    submit_s = (stamps - stamps.min()).dt.total_seconds().to_numpy()
    reject_rows(path, submit_s > MAX_SUBMIT_S,
                f"timestamp is more than {MAX_SUBMIT_S / SECONDS_PER_DAY:g} days after the "
                "earliest", "fix the timestamp or split the trace")
    order = submit_order(submit_s)
    work = generic_work(duration_s, gpus, cluster.max_gpus_per_node)
    max_workers = generic_max_workers(gpus, cluster.job_gpus())
    # Positional map(): keyword construction of 82k frozen JobSpecs is the loader's hot spot.
    count = len(order)
    jobs = tuple(
        map(
            JobSpec,
            [f"philly-{row + 1}" for row in order.tolist()],  # job_id
            submit_s[order].tolist(),  # submit_s
            gpus[order].tolist(),  # requested_gpus
            work[order].tolist(),  # work
            [MIN_WORKERS] * count,  # min_workers
            max_workers[order].tolist(),  # max_workers
            [GENERIC_RESTORE_S] * count,  # restore_s
        )
    )
    return Workload(path.stem, jobs)
