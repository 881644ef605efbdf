"""Read a per-minute cluster series from CSV and turn it into a clean demand series.

Demand is defined once, here, so every forecaster, baseline and caller agrees on it:

    demand = (running GPUs + pending GPUs) / total GPUs

a dimensionless fraction of the cluster (it can exceed 1 when the queue is long). Dividing by the
cluster size lets a model trained on one cluster forecast another of a different size. Three CSV
layouts are understood (header names decide which):

* Helios `*_cluster_sequence_vc.csv`: ``time, running_gpu_num, pending_gpu_num, total_gpu_num``;
* Philly `philly_node_sequence.csv`: ``time, active, total`` (no queue is recorded, so demand is
  ``active / total``: busy capacity only);
* a plain ``time, demand`` file (already a fraction), for tests and other sources.

Bad input ends in a `UserError` naming the file, the line and the fix, never in a NaN forecast:
no data rows, unparsable times, times in more than one zone, non-numeric, empty or negative
cells, duplicated or decreasing timestamps, non-positive totals. Line numbers are the file's
own, blank lines and quoted cells spanning lines included, so an editor finds the row. Missing
minutes are repaired: gaps of up to ``max_gap_min`` minutes are forward-filled (the cluster most
likely kept its last state); longer gaps split the series into segments, and a forecast window
never spans two segments. `check_filled_share` refuses a series mostly made of such repairs.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from rlalloc.env.errors import UserError

MINUTES_PER_DAY = 1440
DEFAULT_MAX_GAP_MIN = 10
"""Longest run of missing minutes that is forward-filled rather than splitting the series."""
MAX_FILLED_SHARE = 0.10
"""Largest share of a series' minutes that may be forward-filled: beyond it a model would be
trained (or scored) on flat spells the repair invented, as with a file of 5-minute samples."""

_LAYOUTS: list[tuple[tuple[str, ...], str]] = [
    (("running_gpu_num", "pending_gpu_num", "total_gpu_num"), "helios"),
    (("active", "total"), "philly"),
    (("demand",), "demand"),
]
_LAYOUT_SOURCES = {"helios": "Helios", "philly": "Philly", "demand": "plain"}
"""Where each of `_LAYOUTS` comes from, as the error for an unknown header names it."""
_DOCS = "docs/forecaster.md"
"""Where the series layouts are described, for errors about a file's columns."""


@dataclass(frozen=True)
class DemandSegment:
    """A gap-free run of per-minute demand.

    ``demand[i]`` is the demand fraction during minute ``start_minute_of_day + i`` (mod 1440).
    """

    demand: np.ndarray
    start_minute_of_day: int
    start: pd.Timestamp | None = None
    """When its first minute began, where the series had timestamps: what lines clusters up
    in time for `rlalloc.forecaster.unions`."""

    def minute_of_day(self) -> np.ndarray:
        """Minute of day (0..1439) of every sample; time-of-day features are built from it."""
        return (self.start_minute_of_day + np.arange(len(self.demand))) % MINUTES_PER_DAY


@dataclass(frozen=True)
class DemandSeries:
    """A demand series as gap-free segments, with where it came from."""

    source: str
    segments: tuple[DemandSegment, ...]
    filled_minutes: int
    """How many minutes of `segments` were forward-filled (repaired), reported so a repair is
    never silent."""
    size_gpus: float = 1.0
    """The cluster's median size in GPUs (its total column), which turns demand fractions back
    into GPUs (GPU-hours of the capacity rule); 1 for a plain demand file, which has none."""
    size_from_file: bool = False
    """Whether `size_gpus` was read from the file (False: a plain demand file, whose 1 is no
    size: GPUs then need the size from elsewhere, e.g. `forecast predict --gpus`)."""

    @property
    def minutes(self) -> int:
        """Minutes in all segments, the filled ones included."""
        return sum(len(segment.demand) for segment in self.segments)

    def unchanged_share(self, horizon_min: int) -> float | None:
        """Share of the series' ``horizon_min``-minute changes of demand that are exactly 0:
        how calm the cluster is, to compare clusters to forecast with those trained on
        (`forecast train --unions` is for busier ones). None where no segment is that long."""
        same = [segment.demand[horizon_min:] == segment.demand[:-horizon_min]
                for segment in self.segments if len(segment.demand) > horizon_min]
        return float(np.concatenate(same).mean()) if same else None


def load_demand_series(
    path: str | Path, max_gap_min: int = DEFAULT_MAX_GAP_MIN, min_points: int = 2
) -> DemandSeries:
    """Load ``path``, validate it, compute demand and repair short gaps.

    ``min_points`` is the shortest segment the caller can use (its window plus its horizon);
    shorter segments are dropped, and a file with none left is a `UserError`.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such file; pass --series a per-minute cluster CSV")
    frame = _read_rows(path)
    if frame.empty:
        raise UserError(f"{path}: no data rows below the header; pass a per-minute CSV with at "
                        f"least {min_points} rows")
    demand, size_gpus = _demand_column(path, frame)
    times = _parse_times(path, frame)
    segments = _segments(times, demand, max_gap_min)
    usable = [(s, filled) for s, filled in segments if len(s.demand) >= min_points]
    if not usable:
        longest = max((len(s.demand) for s, _ in segments), default=0)
        raise UserError(
            f"{path}: longest gap-free run is {longest} minutes but the forecaster needs at least "
            f"{min_points} (input window + horizon); supply a longer per-minute series"
        )
    return DemandSeries(source=str(path), segments=tuple(s for s, _ in usable),
                        filled_minutes=sum(filled for _, filled in usable),
                        size_gpus=1.0 if size_gpus is None else size_gpus,
                        size_from_file=size_gpus is not None)


def check_filled_share(series: DemandSeries) -> str:
    """The one line a command prints about how much of ``series`` was forward-filled, or a
    `UserError` when more than `MAX_FILLED_SHARE` of its minutes were: a model trained or scored
    on them would learn or be judged on demand nobody measured."""
    share = series.filled_minutes / series.minutes
    if share > MAX_FILLED_SHARE:
        raise UserError(
            f"{series.source}: {series.filled_minutes} of {series.minutes} minutes "
            f"({share:.0%}) would be forward-filled, more than {MAX_FILLED_SHARE:.0%}; its "
            "samples are sparser than one a minute: resample the file to 1-minute samples"
        )
    return (f"{series.source}: {series.filled_minutes} of {series.minutes} minutes "
            f"forward-filled ({share:.1%})")


def _read_rows(path: Path) -> pd.DataFrame:
    """The file's data rows as strings, indexed by the line of the file each starts on.

    pandas' own skipping of blank lines, and quoted cells spanning lines, would shift every
    later line number an error names; so blank lines are read as rows, counted, and dropped
    here (with rows of only empty cells, which hold no more).
    """
    with path.open("rb") as handle:  # before the header: pandas would take a blank one for it
        leading = sum(1 for _ in itertools.takewhile(lambda line: not line.strip(), handle))
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, skip_blank_lines=False,
                            skiprows=leading)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        cause = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"{path}: not a readable CSV ({cause}); pass a per-minute CSV") from err
    header_lines = 1 + sum(str(name).count("\n") for name in frame.columns)
    lines_per_row = 1 + sum(frame[name].str.count("\n").to_numpy() for name in frame.columns)
    frame.index = leading + header_lines + 1 + np.cumsum(lines_per_row) - lines_per_row
    blank = frame.apply(lambda column: column.str.strip() == "").all(axis=1)
    return frame[~blank]


def _demand_column(path: Path, frame: pd.DataFrame) -> tuple[np.ndarray, float | None]:
    """Demand fraction per row, from whichever known layout the header matches, and the
    cluster's median size (None where the layout has none)."""
    for columns, layout in _LAYOUTS:
        if all(c in frame.columns for c in columns):
            values = {c: _numeric(path, frame, c) for c in columns}
            if layout == "demand":
                return values["demand"], None
            total_name = "total_gpu_num" if layout == "helios" else "total"
            total = values[total_name]
            bad = np.flatnonzero(total <= 0)
            if bad.size:
                raise UserError(
                    f"{path}, line {frame.index[bad[0]]}: column '{total_name}' is "
                    f"{total[bad[0]]:g}; the cluster size must be positive, fix or drop that row"
                )
            size = float(np.median(total))
            if layout == "helios":
                return (values["running_gpu_num"] + values["pending_gpu_num"]) / total, size
            return values["active"] / total, size
    known = "; ".join(f"{_LAYOUT_SOURCES[layout]} {','.join(('time', *columns))}"
                      for columns, layout in _LAYOUTS)
    raise UserError(f"{path}: header {','.join(map(str, frame.columns))} matches no "
                    "demand-series layout; give a per-minute CSV whose header includes one of: "
                    f"{known} (see {_DOCS})")


def _numeric(path: Path, frame: pd.DataFrame, column: str) -> np.ndarray:
    """Column as float64, or a `UserError` at the first empty, non-numeric or negative cell
    (every known column counts GPUs or is a share of them, so below zero is a broken row)."""
    raw = frame[column].str.strip()
    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        row = bad[0]
        raise UserError(
            f"{path}, line {raw.index[row]}: column '{column}' has {raw.iloc[row]!r}, not a "
            "number; fix the value or delete the row (short gaps are forward-filled)"
        )
    negative = np.flatnonzero(values < 0)
    if negative.size:
        row = negative[0]
        raise UserError(
            f"{path}, line {raw.index[row]}: column '{column}' is {values[row]:g}; it counts "
            "GPUs (or a share of them) and cannot be negative, fix the value or delete the row"
        )
    return values


def _parse_times(path: Path, frame: pd.DataFrame) -> pd.DatetimeIndex:
    """Timestamps floored to the minute; strictly increasing or a `UserError`."""
    if "time" not in frame.columns:
        raise UserError(f"{path}: no 'time' column; name the column of per-minute timestamps "
                        f"'time' (see {_DOCS})")
    times = _to_datetimes(path, frame["time"])
    bad = np.flatnonzero(times.isna().to_numpy())
    if bad.size:
        raise UserError(
            f"{path}, line {frame.index[bad[0]]}: time {frame['time'].iloc[bad[0]]!r} is not a "
            "timestamp; use e.g. 2020-05-01 00:00:00"
        )
    minutes = pd.DatetimeIndex(times).floor("min")
    # Timedelta arithmetic rather than numpy datetime64, which has no time zones.
    step = np.asarray((minutes[1:] - minutes[:-1]) // pd.Timedelta(minutes=1), dtype=np.int64)
    if (step == 0).any():
        row = int(np.flatnonzero(step == 0)[0]) + 1
        raise UserError(
            f"{path}, line {frame.index[row]}: timestamp {minutes[row]} repeats the previous "
            "row's minute; keep one row per minute (drop or average the duplicates)"
        )
    if (step < 0).any():
        row = int(np.flatnonzero(step < 0)[0]) + 1
        raise UserError(
            f"{path}, line {frame.index[row]}: timestamp {minutes[row]} is earlier than the row "
            "before; sort the file by time"
        )
    return minutes


def _to_datetimes(path: Path, column: pd.Series) -> pd.Series:
    """Parse every time (unparsable ones become NaT); a column mixing time zones or UTC offsets
    is a `UserError`, since moving either side into the other's zone would be a guess (naive
    times may be local or UTC)."""
    try:
        return pd.to_datetime(column, errors="coerce", format="mixed")
    except ValueError as err:
        row = _first_other_zone(column)
        if row is None:
            raise  # not a zone problem: a bug worth its traceback
        first, other = column.iloc[0], column.iloc[row]
        raise UserError(
            f"{path}, line {column.index[row]}: time {other!r} ({_zone(other)}) is in another "
            f"zone than line {column.index[0]}'s {first!r} ({_zone(first)}); write every time in "
            "one zone (all with the same UTC offset, or all without one)"
        ) from err


def _first_other_zone(column: pd.Series) -> int | None:
    """Position of the first time whose zone differs from the first row's, if any."""
    zones = [_zone(text) for text in column]
    return next((i for i, zone in enumerate(zones) if zone != zones[0]), None)


def _zone(text: str) -> str:
    """How one timestamp states its zone, in words for the error message."""
    try:
        stamp = pd.Timestamp(text)
    except ValueError:
        return "not a timestamp"
    return "no UTC offset" if stamp.tzinfo is None else f"UTC offset {stamp.strftime('%z')}"


def _segments(
    minutes: pd.DatetimeIndex, demand: np.ndarray, max_gap_min: int
) -> list[tuple[DemandSegment, int]]:
    """Split at gaps longer than ``max_gap_min`` and forward-fill the shorter ones; every
    segment comes with how many of its minutes were filled."""
    offsets = np.asarray((minutes - minutes[0]) // pd.Timedelta(minutes=1), dtype=np.int64)
    missing = np.diff(offsets) - 1
    breaks = np.flatnonzero(missing > max_gap_min) + 1
    segments: list[tuple[DemandSegment, int]] = []
    for lo, hi in zip(np.r_[0, breaks], np.r_[breaks, len(offsets)], strict=True):
        local = offsets[lo:hi] - offsets[lo]
        # Index of the last observed row at or before every minute: a forward fill.
        grid_source = np.searchsorted(local, np.arange(local[-1] + 1), side="right") - 1
        start = minutes[lo]
        segment = DemandSegment(
            demand=demand[lo:hi][grid_source].astype(np.float32),
            start_minute_of_day=start.hour * 60 + start.minute,
            start=start,
        )
        segments.append((segment, int(local[-1] + 1 - len(local))))
    return segments
