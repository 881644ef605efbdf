"""Pollux's evaluation workloads (``workload-N.csv``): 160 profiled jobs from busy Philly hours.

Columns ``name,time,application,num_replicas,batch_size``: job name (the job id), submit offset
in seconds, Pollux application (bert, cifar10, deepspeech2, imagenet, ncf, yolov3), GPUs
requested and global batch size. Each job's work is the iterations its application needs at that
batch size (`AppProfile.work_iterations`) and its restore time the Sia figure for the model.

Sia's workloads may add a ``category`` column (its artifact's ``utils/categorize_jobs.py``;
read by its ``cluster.py``): ``rigid`` jobs run on exactly ``num_replicas`` GPUs on whichever
type holds them, ``adaptive`` and ``scale-gpus`` ones (and a blank cell) scale their GPU count
as every Pollux job does here. Under ``--efficiency adaptive`` the adaptive ones (and blank
cells) tune their batch size, while ``scale-gpus`` and ``rigid`` ones keep theirs
(`JobSpec.fixed_batch`), as Sia's simulator disables batch-size tuning for those two. Any other
value is refused, never read as elastic.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from rlalloc.env.cluster import ClusterSpec
from rlalloc.env.profiles import AppProfile, restore_s
from rlalloc.env.workload.spec import JobSpec, Workload
from rlalloc.env.workload.table import (
    MAX_SUBMIT_S,
    MIN_WORKERS,
    read_table,
    reject_beyond_cluster,
    reject_rows,
    seconds,
    submit_order,
    whole_numbers,
)

POLLUX_COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")
SIA_CATEGORY_COLUMN = "category"
RIGID = "rigid"
SCALE_GPUS = "scale-gpus"
SIA_CATEGORIES = ("adaptive", SCALE_GPUS, RIGID)
"""Sia's job categories (module docstring): a rigid job's GPU count is fixed, and a rigid or
scale-gpus job's batch size."""


def check_applications(
    path: Path,
    applications: np.ndarray,
    batch_size: np.ndarray,
    profiles: Mapping[str, AppProfile],
    where: np.ndarray | None = None,
) -> None:
    """Reject rows (of those in `where`, default all) naming an unknown application or a batch
    size the application was not validated over."""
    if where is None:
        where = np.ones(len(applications), dtype=bool)
    known = sorted(profiles)
    unknown = where & ~np.isin(applications, known)
    named = f" {applications[unknown][0]!r}" if unknown.any() else ""
    reject_rows(
        path,
        unknown,
        f"unknown application{named}",
        f"use one of {', '.join(known)} (the folders of the profiles root)",
    )
    for name in np.unique(applications[where]).tolist():
        sizes = profiles[name].validated_batch_sizes
        reject_rows(
            path,
            (applications == name) & ((batch_size < sizes[0]) | (batch_size > sizes[-1])),
            f"batch_size outside {name}'s validated range {sizes[0]}..{sizes[-1]}",
            "choose a batch size within that range",
        )


def profiled_max_workers(
    profile: AppProfile, batch_size: int, requested: int, total_gpus: int
) -> int:
    """Upper elastic bound of a profiled job: as many workers as still get the smallest measured
    local batch, never below its request, capped by the cluster."""
    return min(max(profile.max_workers(batch_size), requested), total_gpus)


def load_pollux(
    path: Path, cluster: ClusterSpec, profiles: Mapping[str, AppProfile]
) -> Workload:
    """Load a Pollux workload CSV against the application `profiles`."""
    path = Path(path)
    df = read_table(path, POLLUX_COLUMNS, "Pollux",
                    text=("name", "application", SIA_CATEGORY_COLUMN))
    names = df["name"].astype(str).str.strip().to_numpy()
    reject_rows(
        path, df["name"].isna().to_numpy() | (names == ""), "name is empty", "name every job"
    )
    reject_rows(
        path, pd.Series(names).duplicated().to_numpy(), "name repeats an earlier job's",
        "make job names unique",
    )
    submit_s = seconds(path, df, "time", MAX_SUBMIT_S)
    gpus = whole_numbers(path, df, "num_replicas", 1)
    reject_beyond_cluster(path, gpus, "num_replicas", cluster)
    batch_size = whole_numbers(path, df, "batch_size", 1)
    applications = df["application"].astype(str).str.strip().to_numpy()
    check_applications(path, applications, batch_size, profiles)
    category = sia_categories(path, df)
    rigid = category == RIGID

    total = cluster.job_gpus()
    order = submit_order(submit_s)
    jobs = tuple(
        JobSpec(
            job_id=names[i],
            submit_s=float(submit_s[i]),
            requested_gpus=int(gpus[i]),
            work=profiles[applications[i]].work_iterations(int(batch_size[i])),
            min_workers=int(gpus[i]) if rigid[i] else MIN_WORKERS,
            max_workers=int(gpus[i]) if rigid[i] else profiled_max_workers(
                profiles[applications[i]], int(batch_size[i]), int(gpus[i]), total
            ),
            restore_s=restore_s(applications[i]),
            application=applications[i],
            batch_size=int(batch_size[i]),
            fixed_batch=bool(category[i] in (RIGID, SCALE_GPUS)),
        )
        for i in order.tolist()
    )
    return Workload(path.stem, jobs)


def sia_categories(path: Path, df: pd.DataFrame) -> np.ndarray:
    """Per row, Sia's ``category`` (``""`` where the cell is blank or the file has no such
    column); a one-line `UserError` naming the first row whose category is none of
    `SIA_CATEGORIES`."""
    if SIA_CATEGORY_COLUMN not in df.columns:
        return np.full(len(df), "", dtype=object)
    category = df[SIA_CATEGORY_COLUMN].fillna("").astype(str).str.strip().to_numpy()
    unknown = (category != "") & ~np.isin(category, SIA_CATEGORIES)
    named = f" {category[unknown][0]!r}" if unknown.any() else ""
    reject_rows(path, unknown, f"category{named} is not one of Sia's",
                f"use {', '.join(SIA_CATEGORIES)} or leave it blank (adaptive)")
    return category
