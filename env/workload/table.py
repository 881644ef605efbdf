"""What every CSV loader shares: reading a table, rejecting bad rows in one line, elastic bounds.

Row numbers in messages are 1-based data rows (row 1 is the first line after the header), with
the file line next to them so an editor can jump there.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from env.errors import UserError
from env.profiles import GENERIC_SCALING, GenericScaling, packed_shape

MIN_WORKERS = 1
"""Every job may shrink to one worker: all profiled models fit on one GPU (with gradient
accumulation) and a generic job is assumed to checkpoint and resume at any world size."""
GENERIC_MAX_WORKERS_FACTOR = 4
"""A job without a profile may grow to this multiple of the GPUs it asked for (capped by the
cluster): its real batch-size limit is unknown, and 4x keeps growth within the range the
Pollux profiles were measured over (1 to 16 GPUs for jobs asking 1 to 4)."""


def read_table(path: Path, required: tuple[str, ...], fmt: str) -> pd.DataFrame:
    """Read `path` as CSV and check `required` columns are present; `fmt` names the format."""
    try:
        df = pd.read_csv(path, skipinitialspace=True)
    except FileNotFoundError as err:
        raise UserError(f"{path}: no such file; check the path") from err
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise UserError(
            f"{path}: cannot read as CSV ({err.__class__.__name__}); fix or re-export the file"
        ) from err
    df.columns = [str(c).strip() for c in df.columns]
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise UserError(
            f"{path}: {fmt} workload is missing column(s) {', '.join(missing)}; "
            f"the header must include {','.join(required)} (see docs/workloads.md)"
        )
    if df.empty:
        raise UserError(f"{path}: {fmt} workload has a header but no jobs; add rows")
    return df


def reject_rows(path: Path, bad: np.ndarray | pd.Series, problem: str, fix: str) -> None:
    """Raise one `UserError` naming the first row where `bad` holds, if any does."""
    bad = np.asarray(bad, dtype=bool)
    if not bad.any():
        return
    first = int(np.flatnonzero(bad)[0])
    more = int(bad.sum()) - 1
    also = f" (and {more} more row{'s' if more > 1 else ''})" if more else ""
    raise UserError(f"{path}: row {first + 1} (line {first + 2}): {problem}{also}; {fix}")


def numeric(df: pd.DataFrame, column: str) -> np.ndarray:
    """`column` as float64, NaN where a cell is empty or not a number."""
    return pd.to_numeric(df[column], errors="coerce").to_numpy(dtype=float)


def seconds(path: Path, df: pd.DataFrame, column: str) -> np.ndarray:
    """`column` as seconds; every row must hold a number >= 0 (else one-line `UserError`)."""
    values = numeric(df, column)
    reject_rows(path, np.isnan(values) | (values < 0),
                f"{column} must be a number of seconds >= 0", f"fix the {column} cell")
    return values


def whole_numbers(
    path: Path, df: pd.DataFrame, column: str, minimum: int, where: np.ndarray | None = None
) -> np.ndarray:
    """`column` as int64, rejecting cells that are not whole numbers >= `minimum`; with `where`,
    only those rows are checked and the others read as 0 (optional columns)."""
    values = numeric(df, column)
    bad = np.isnan(values) | (values != np.floor(values)) | (values < minimum)
    if where is not None:
        bad &= where
        values = np.where(where, values, 0.0)
    reject_rows(
        path, bad, f"{column} must be a whole number >= {minimum}", f"fix the {column} cell"
    )
    return values.astype(np.int64)


def reject_beyond_cluster(path: Path, gpus: np.ndarray, column: str, total_gpus: int) -> None:
    """Reject jobs asking more GPUs than the cluster has; they could never run."""
    too_big = gpus > total_gpus
    if not too_big.any():
        return
    reject_rows(
        path,
        too_big,
        f"{column} exceeds the cluster's {total_gpus} GPUs",
        f"simulate a larger cluster (--cluster, it needs at least {int(gpus.max())} GPUs) "
        "or remove such rows",
    )


def generic_max_workers(requested: np.ndarray, total_gpus: int) -> np.ndarray:
    """Upper elastic bound of jobs without a profile (see `GENERIC_MAX_WORKERS_FACTOR`)."""
    return np.minimum(GENERIC_MAX_WORKERS_FACTOR * requested, total_gpus)


def generic_work(
    duration_s: np.ndarray,
    requested: np.ndarray,
    gpus_per_node: int,
    scaling: GenericScaling = GENERIC_SCALING,
) -> np.ndarray:
    """Iterations a generic job ran: its run time at the speed of its request packed on nodes
    of `gpus_per_node` GPUs, so replaying it as requested reproduces the trace's run time."""
    speed = {g: scaling.iterations_per_s(packed_shape(g, gpus_per_node)) for g in
             np.unique(requested).tolist()}
    return duration_s * np.array([speed[g] for g in requested.tolist()])


def submit_order(submit_s: np.ndarray) -> np.ndarray:
    """Indices sorting by submit time; stable so equal times keep file order."""
    return np.argsort(submit_s, kind="stable")
