"""What every CSV loader shares: reading a table, rejecting bad rows in one line, elastic bounds.

Row numbers in messages are 1-based data rows (row 1 is the first line after the header), with
the file line next to them so an editor can jump there.
"""

from __future__ import annotations

import csv
import difflib
import math
from pathlib import Path

import numpy as np
import pandas as pd

from rlalloc.env.cluster import ClusterSpec
from rlalloc.env.errors import UserError
from rlalloc.env.profiles import GENERIC_SCALING, GenericScaling, packed_shape

MIN_WORKERS = 1
"""Every job may shrink to one worker: all profiled models fit on one GPU (with gradient
accumulation) and a generic job is assumed to checkpoint and resume at any world size."""
GENERIC_MAX_WORKERS_FACTOR = 4
"""A job without a profile may grow to this multiple of the GPUs it asked for (capped by the
cluster): its real batch-size limit is unknown, and 4x keeps growth within the range the
Pollux profiles were measured over (1 to 16 GPUs for jobs asking 1 to 4)."""


SECONDS_PER_DAY = 86_400.0
MAX_SUBMIT_S = 365 * SECONDS_PER_DAY
"""Latest submit offset a workload may have: a year (Philly spans 109 days). A later one is a
unit or typing mistake, and a simulation's time limit grows with the arrival span."""
MAX_DURATION_S = 365 * SECONDS_PER_DAY
"""Longest run time a job may have: a year (Philly's longest job ran 53 days). Beyond it is a
unit mistake or a placeholder such as 1e308, which the simulator would replay for ever."""
MAX_RESTORE_S = SECONDS_PER_DAY
"""Longest checkpoint-restore time: a day (the measured ones are 15-250 s, see `RESTORE_S`)."""
MAX_COUNT = 1_000_000_000
"""Largest GPU count or batch size read: more than any cluster or batch holds, and small enough
to stay exact in the simulator's integer columns."""


def reject_directory(path: Path, usage: str) -> None:
    """One-line `UserError` if `path` is a directory: reading it would fail with an
    IsADirectoryError that names no fix. `usage` says which file to give instead."""
    if Path(path).is_dir():
        raise UserError(f"{path} is a directory; {usage}")


def read_table(
    path: Path, required: tuple[str, ...], fmt: str, text: tuple[str, ...] = (),
    optional: tuple[str, ...] | None = None,
) -> pd.DataFrame:
    """Read `path` as CSV and check `required` columns are present; `fmt` names the format.
    Columns in `text` stay strings (job ids such as ``01``, which as numbers would equal ``1``).
    Only a blank cell is missing: ``nan`` or ``NA`` is a value that is not a number, rejected
    as such, not an empty optional cell. A column named twice is refused; with `optional`
    (a format of our own), so is any column neither required nor optional."""
    header = reject_ragged_rows(path)
    reject_bad_columns(path, header, fmt, None if optional is None else (*required, *optional))
    try:
        df = pd.read_csv(path, skipinitialspace=True, dtype=dict.fromkeys(text, str),
                         keep_default_na=False, na_values=[""])
    except FileNotFoundError as err:
        raise UserError(f"{path}: no such file; check the path") from err
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise UserError(
            f"{path}: cannot read as CSV ({err.__class__.__name__}); fix or re-export the file"
        ) from err
    df.columns = [str(c).strip() for c in df.columns]
    require_columns(path, set(df.columns), required, fmt, optional or ())
    if df.empty:
        raise UserError(f"{path}: {fmt} workload has a header but no jobs; add rows")
    return df


def require_columns(path: Path, header: set[str], required: tuple[str, ...], fmt: str,
                    optional: tuple[str, ...] = ()) -> None:
    """One-line `UserError` naming the `required` columns of format `fmt` that `header` lacks,
    and for each the header's closest other column to rename (``num_gpu``): a misspelt
    required column is as common as a misspelt optional one, which `reject_bad_columns`
    already names this way. The format's `optional` columns are never offered: ``min_gpus``
    is no misspelt ``num_gpus``."""
    missing = [c for c in required if c not in header]
    if missing:
        must = f"the header must include {','.join(required)}"
        renames = _closest_renames(missing, sorted(header - set(required) - set(optional)))
        fix = "; ".join(f"rename {found} to {wanted}" for wanted, found in renames.items())
        raise UserError(f"{path}: {fmt} workload is missing column(s) {', '.join(missing)}; "
                        + (f"{fix} ({must}; " if fix else f"{must} (") + "see docs/workloads.md)")


def _closest_renames(missing: list[str], spare: list[str]) -> dict[str, str]:
    """Each `missing` column's closest `spare` column (difflib), each spare used once: the
    header's column that is most likely a misspelling of it. Missing columns with none close
    are left out."""
    renames: dict[str, str] = {}
    for column in missing:
        unused = [name for name in spare if name and name not in renames.values()]
        close = difflib.get_close_matches(column, unused, n=1)
        if close:
            renames[column] = close[0]
    return renames


def reject_bad_columns(
    path: Path, header: list[str], fmt: str, allowed: tuple[str, ...] | None
) -> None:
    """Reject a column named twice (pandas would read the first and rename the second ``x.1``)
    and, if `allowed` is given, any other column: a misspelt optional column (``max_gpu``)
    would be ignored, and its jobs would silently run with the defaults."""
    repeated = [c for i, c in enumerate(header) if c and c in header[:i]]
    if repeated:
        raise UserError(f"{path}: the header names column {repeated[0]} twice; keep one of them")
    unknown = [] if allowed is None else [c for c in header if c not in allowed]
    if unknown:
        if not unknown[0]:
            named, fix = "an unnamed column", "remove it (a trailing comma in the header adds one)"
        else:
            close = difflib.get_close_matches(unknown[0], allowed, n=1)
            named = f"column {unknown[0]!r}"
            fix = f"rename it to {close[0]}" if close else "rename or remove it"
        raise UserError(f"{path}: {named} is not a {fmt} column; {fix} (columns: "
                        f"{','.join(allowed)}; see docs/workloads.md)")


def reject_ragged_rows(path: Path) -> list[str]:
    """Reject a row with more or fewer fields than the header, and return the header (names
    stripped). pandas would take one extra field in every row as the index and shift each value
    one column left, and fill a short row with empty cells, so either would load as a different
    job than the file says."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            rows = csv.reader(handle, skipinitialspace=True)
            header = next(rows, [])
            row = 0
            for fields in rows:
                if not any(field.strip() for field in fields):
                    continue  # a blank line, which pandas skips too
                row += 1
                if len(fields) != len(header):
                    _reject_field_count(path, row, rows.line_num, len(fields), len(header))
            return [column.strip() for column in header]
    except FileNotFoundError as err:
        raise UserError(f"{path}: no such file; check the path") from err
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise UserError(
            f"{path}: cannot read as CSV ({err.__class__.__name__}); fix or re-export the file"
        ) from err


def _reject_field_count(path: Path, row: int, line: int, fields: int, expected: int) -> None:
    """The one-line error for a row of `fields` fields under a header of `expected`."""
    fix = ("remove the extra field (a trailing comma adds one) or quote a value that contains "
           "a comma" if fields > expected else
           "add the missing cells (an empty cell still needs its comma)")
    raise UserError(f"{path}: row {row} (line {line}): {fields} fields where the header has "
                    f"{expected}; {fix}")


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
    """`column` as float64, NaN where a cell is empty or not a number. pandas reads a column
    of only ``true``/``false`` cells as booleans, which would count as 1 and 0 (``num_gpus``
    ``true`` ran as one GPU): they are not numbers either."""
    values = df[column]
    if values.dtype == bool or values.dtype == object:  # numeric columns hold no booleans
        values = values.mask(values.map(lambda cell: isinstance(cell, (bool, np.bool_))))
    return pd.to_numeric(values, errors="coerce").to_numpy(dtype=float)


def seconds(
    path: Path, df: pd.DataFrame, column: str, maximum_s: float,
    where: np.ndarray | None = None,
) -> np.ndarray:
    """`column` as seconds: a finite number from 0 to `maximum_s` in every row (with `where`,
    in those rows only: an optional column's given cells), else a one-line `UserError`."""
    values = numeric(df, column)
    checked = np.ones(len(values), dtype=bool) if where is None else where
    reject_rows(path, checked & ~(values >= 0),
                f"{column} must be a number of seconds >= 0", f"fix the {column} cell")
    days = maximum_s / SECONDS_PER_DAY
    limit = (f"at most {maximum_s:,.0f} s ({days:g} day{'s' if days != 1 else ''})"
             if math.isfinite(maximum_s) else "finite")
    too_large = ~(np.isfinite(values) & (values <= maximum_s))
    reject_rows(path, checked & too_large, f"{column} must be {limit}",
                f"fix the {column} cell (is it in seconds?)")
    return values


def whole_numbers(
    path: Path, df: pd.DataFrame, column: str, minimum: int, where: np.ndarray | None = None
) -> np.ndarray:
    """`column` as int64, rejecting cells that are not whole numbers from `minimum` to
    `MAX_COUNT`; with `where`, only those rows are checked and the others read as 0 (optional
    columns)."""
    values = numeric(df, column)
    checked = np.ones(len(values), dtype=bool) if where is None else where
    bad = ~np.isfinite(values) | (values != np.floor(values)) | (values < minimum)
    reject_rows(path, checked & bad, f"{column} must be a whole number >= {minimum}",
                f"fix the {column} cell")
    reject_rows(path, checked & (values > MAX_COUNT), f"{column} must be at most {MAX_COUNT:,}",
                f"fix the {column} cell")
    return np.where(checked, values, 0.0).astype(np.int64)


def reject_beyond_cluster(path: Path, gpus: np.ndarray, column: str,
                          cluster: ClusterSpec) -> None:
    """Reject jobs asking more GPUs than one job can hold on the cluster (`job_gpus`: on one
    GPU type); they could never run."""
    limit = cluster.job_gpus()
    too_big = gpus > limit
    if not too_big.any():
        return
    where = (f"the cluster's {limit} GPUs" if limit == cluster.total_gpus
             else f"the {limit} GPUs of the cluster's largest GPU type (a job runs on one type)")
    reject_rows(
        path,
        too_big,
        f"{column} exceeds {where}",
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
    gpus_per_worker: np.ndarray | None = None,
) -> np.ndarray:
    """Iterations a generic job ran: its run time at the speed of its request packed on nodes
    of `gpus_per_node` GPUs (in whole workers of `gpus_per_worker`, default 1), so replaying it
    as requested reproduces the trace's run time."""
    per_worker = np.ones_like(requested) if gpus_per_worker is None else gpus_per_worker
    pairs = list(zip(requested.tolist(), per_worker.tolist(), strict=True))
    speed = {pair: scaling.iterations_per_s(packed_shape(pair[0], gpus_per_node, pair[1]))
             for pair in set(pairs)}
    return duration_s * np.array([speed[pair] for pair in pairs])


def submit_order(submit_s: np.ndarray) -> np.ndarray:
    """Indices sorting by submit time; stable so equal times keep file order."""
    return np.argsort(submit_s, kind="stable")
