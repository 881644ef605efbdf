"""On-disk checkpoint layout: atomic commit, verification, quarantine and pruning.

A checkpoint for step N is written by DCP into `step-<N>.tmp/` (or `step-<N>.tmp-rank<r>/` for
a rank's emergency save). Only when every rank's data is on disk does one process write
`COMPLETE.json` into it — the step, the world size, the run's configuration and the size and
CRC-32 of every file — fsync it, and rename the directory to `step-<N>/`. A crash at any point
before the rename leaves a `.tmp` directory that nothing loads; a directory that was renamed
but later truncated or overwritten fails its checksums. Either way the newest checkpoint that
verifies is the one used, and a bad one is renamed to `step-<N>.corrupt` (kept for inspection,
never loaded, never counted as one of the `keep_last` checkpoints).

This module is plain filesystem code so it can be tested without torch.distributed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

COMMIT_MARKER = "COMPLETE.json"
LAYOUT_VERSION = 1
_STEP_DIR = re.compile(r"^step-(\d{9})$")
_TMP_DIR = re.compile(r"^step-(\d{9})\.tmp(-rank\d+)?$")
_CORRUPT_DIR = re.compile(r"^step-(\d{9})\.corrupt(\.\d+)?$")
_CHUNK_BYTES = 8 << 20


class CorruptCheckpointError(Exception):
    """A checkpoint directory whose marker is missing, unreadable or disagrees with its files."""


@dataclass(frozen=True)
class CheckpointInfo:
    """A verified, complete checkpoint."""

    step: int
    path: Path
    world_size: int
    rng_ranks: tuple[int, ...]
    """Ranks whose RNG state is stored (all ranks, or the one rank of an emergency save)."""
    config: dict[str, object]
    """The writing run's `TrainConfig.to_json_dict()`: a resume must keep its data settings."""
    created_unix: float


def step_dir_name(step: int) -> str:
    """Directory name of the committed checkpoint of `step` (zero-padded so names sort)."""
    return f"step-{step:09d}"


def tmp_dir_name(step: int, rank: int | None = None) -> str:
    """Directory a checkpoint is written into before it is committed."""
    suffix = "" if rank is None else f"-rank{rank}"
    return f"{step_dir_name(step)}.tmp{suffix}"


def _crc32(path: Path) -> int:
    """CRC-32 of a file, read in chunks (zlib releases the GIL, so async saves stay async)."""
    crc = 0
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            crc = zlib.crc32(chunk, crc)
    return crc


def _fsync_dir(path: Path) -> None:
    """Make a rename or a new file in `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(tmp_dir: Path, step: int, world_size: int, rng_ranks: list[int],
           config: dict[str, object]) -> Path | None:
    """Checksum the files DCP wrote, add the marker and rename `tmp_dir` to its final name.

    Returns the committed path, or None when a checkpoint of this step was already committed
    (by another rank's emergency save); the redundant `tmp_dir` is then removed.
    """
    files = {}
    for path in sorted(p for p in tmp_dir.rglob("*") if p.is_file()):
        with path.open("rb") as handle:
            os.fsync(handle.fileno())
        files[str(path.relative_to(tmp_dir))] = {"bytes": path.stat().st_size,
                                                 "crc32": _crc32(path)}
    marker = {
        "layout_version": LAYOUT_VERSION, "step": step, "world_size": world_size,
        "rng_ranks": rng_ranks, "config": config,
        "created_unix": time.time(), "files": files,
    }
    marker_tmp = tmp_dir / (COMMIT_MARKER + ".partial")
    with marker_tmp.open("w") as handle:
        json.dump(marker, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    marker_tmp.rename(tmp_dir / COMMIT_MARKER)
    _fsync_dir(tmp_dir)
    final = tmp_dir.parent / step_dir_name(step)
    try:
        tmp_dir.rename(final)
    except OSError:
        if not final.is_dir():
            raise
        shutil.rmtree(tmp_dir, ignore_errors=True)
        return None
    _fsync_dir(final.parent)
    return final


def verify(path: Path) -> CheckpointInfo:
    """Check a committed checkpoint against its marker; raise `CorruptCheckpointError` if not,
    and the `OSError` of storage that cannot be read now (not the checkpoint's fault)."""
    match = _STEP_DIR.match(path.name)
    if match is None:
        raise CorruptCheckpointError(f"{path}: not a step-<N> checkpoint directory")
    try:
        marker = json.loads((path / COMMIT_MARKER).read_text())
        # every field is read here: a marker that parses but lacks one (hand-edited, or a
        # write that went wrong) is a corrupt checkpoint to skip, not a crash on every restart
        files = {str(name): (int(entry["bytes"]), int(entry["crc32"]))
                 for name, entry in marker["files"].items()}
        info = CheckpointInfo(
            step=int(marker["step"]), path=path, world_size=int(marker["world_size"]),
            rng_ranks=tuple(int(r) for r in marker["rng_ranks"]), config=dict(marker["config"]),
            created_unix=float(marker["created_unix"]),
        )
    except FileNotFoundError as err:
        raise CorruptCheckpointError(f"{path}: no {COMMIT_MARKER} (incomplete save)") from err
    except (IsADirectoryError, NotADirectoryError, ValueError, KeyError, TypeError,
            AttributeError) as err:
        raise CorruptCheckpointError(f"{path}: unreadable {COMMIT_MARKER} ({err!r})") from err
    # any other OSError (EIO, an NFS ESTALE, a permission) goes up as for a data file: the
    # storage failed, not the checkpoint, which a quarantine would set aside for good
    if info.step != int(match.group(1)):
        raise CorruptCheckpointError(f"{path}: marker says step {info.step}, directory disagrees")
    if ".metadata" not in files:
        raise CorruptCheckpointError(f"{path}: marker lists no DCP .metadata file")
    for name, (expected_bytes, expected_crc32) in files.items():
        file_path = path / name
        if not file_path.is_file():
            raise CorruptCheckpointError(f"{path}: {name} is missing")
        size = file_path.stat().st_size
        if size != expected_bytes:
            raise CorruptCheckpointError(
                f"{path}: {name} has {size} bytes, marker says {expected_bytes} (truncated?)")
        if _crc32(file_path) != expected_crc32:
            raise CorruptCheckpointError(f"{path}: {name} fails its CRC-32 check (corrupted)")
    return info


def committed_dirs(root: Path) -> list[tuple[int, Path]]:
    """(step, path) of every `step-<N>` directory under `root`, oldest first."""
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _STEP_DIR.match(path.name)
        if match and path.is_dir():
            found.append((int(match.group(1)), path))
    return sorted(found)


def quarantine(path: Path) -> Path:
    """Rename a bad checkpoint to `<name>.corrupt[.k]` so it is neither loaded nor pruned."""
    target = path.with_name(path.name + ".corrupt")
    attempt = 1
    while target.exists():
        target = path.with_name(f"{path.name}.corrupt.{attempt}")
        attempt += 1
    path.rename(target)
    return target


def quarantined_dirs(root: Path) -> list[Path]:
    """Checkpoints an earlier start found corrupt (`step-<N>.corrupt[.k]`), oldest first."""
    if not root.is_dir():
        return []
    return sorted(path for path in root.iterdir() if _CORRUPT_DIR.match(path.name))


def latest_valid(root: Path) -> tuple[CheckpointInfo | None, list[str]]:
    """Newest checkpoint that verifies, plus one line per newer one that did not (quarantined);
    an `OSError` of storage that cannot be read now goes up, moving nothing."""
    problems = []
    for _, path in reversed(committed_dirs(root)):
        try:
            return verify(path), problems
        except CorruptCheckpointError as err:
            moved = quarantine(path)
            problems.append(f"{err}; moved to {moved.name}")
    return None, problems


def prune(root: Path, keep_last: int) -> list[Path]:
    """Delete committed checkpoints beyond the newest `keep_last`, and stale `.tmp` directories.

    A `.tmp` directory is stale once a checkpoint of the same or a later step is committed: it is
    what a crashed or superseded save left behind. Returns the removed paths.
    """
    committed = committed_dirs(root)
    if not committed:
        return []
    newest_step = committed[-1][0]
    doomed = [path for _, path in committed[:-keep_last]]
    for path in root.iterdir():
        match = _TMP_DIR.match(path.name)
        if match and int(match.group(1)) <= newest_step:
            doomed.append(path)
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed
