"""Writing results without ever destroying earlier ones.

Every command that writes results goes through here: an existing result file is never
overwritten unless the user passed ``--force``, and files are written to a temporary name and
renamed, so an interrupted run leaves either the old file or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rlalloc.env.errors import UserError


def prepare_out_dir(out: Path, produces: list[str], force: bool, flag: str = "--out") -> Path:
    """Create `out` if needed; refuse if any file in `produces` exists there and not `force`.
    `flag`: the option that named `out`, as the errors call it."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"{flag} {out}: exists and is not a directory; choose another path")
    existing = [name for name in produces if (out / name).exists()]
    if existing and not force:
        raise UserError(f"{flag} {out}: already holds {', '.join(existing)}; "
                        "pass --force to replace them or choose another directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"{flag} {out}: cannot create directory ({err.strerror})") from err
    return out


@contextmanager
def out_dir_for_run(out: Path, produces: list[str], force: bool,
                    flag: str = "--out") -> Iterator[Path]:
    """`prepare_out_dir` around a run that may stop before it writes anything (Ctrl-C, an
    error): the directories it created for `out` are removed again, deepest first, while they
    are still empty, so a stopped run leaves nothing new behind. A directory that existed
    before, or one something was written into, is left alone."""
    out = Path(out)
    created = [path for path in (out, *out.parents) if not path.exists()]
    out = prepare_out_dir(out, produces, force, flag)
    try:
        yield out
    except BaseException:
        for directory in created:
            try:
                directory.rmdir()
            except OSError:  # not empty (something was written) or already gone
                break
        raise


STAGING_PREFIX = ".staging-"
"""Hidden directories inside --out where a run writes results before they replace the old."""


def new_staging_dir(out: Path, flag: str = "--out") -> Path:
    """A new hidden directory inside `out` for results that replace the old ones only once all
    of them exist; the caller moves them in and removes it.

    A run killed outright (SIGKILL, power loss) cannot remove its own: the name carries the
    host and process id, so this removes every leftover whose process is gone, while one whose
    process still runs (a second run into the same `out`) is left alone, as is any it cannot
    attribute.
    """
    for leftover in Path(out).glob(f"{STAGING_PREFIX}*"):
        if _is_abandoned(leftover):
            shutil.rmtree(leftover, ignore_errors=True)
    try:
        return Path(tempfile.mkdtemp(
            prefix=f"{STAGING_PREFIX}{socket.gethostname()}-{os.getpid()}-", dir=out))
    except OSError as err:
        raise UserError(f"{flag} {out}: cannot write there ({err.strerror}); choose another "
                        "directory") from err


@contextmanager
def staged_outputs(out: Path, flag: str = "--out") -> Iterator[Path]:
    """A new hidden directory inside `out` (`new_staging_dir`) to write results into; what it
    holds moves into `out` (one rename each, replacing an entry of the same name) only when the
    block ends without an error, so a run stopped or failing halfway leaves the earlier results
    whole. The directory is removed in any case."""
    staging = new_staging_dir(out, flag)
    try:
        yield staging
        for path in sorted(staging.iterdir()):
            target = Path(out) / path.name
            if path.is_dir():  # a rename cannot replace a directory that holds files
                remove_outputs(out, [path.name])
            os.replace(path, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _is_abandoned(staging: Path) -> bool:
    """Whether `staging` (made by `new_staging_dir`) belongs to a process of this host that is
    gone. Names of another shape (an older version's, another host's) are never abandoned."""
    owner = staging.name.removeprefix(STAGING_PREFIX).rpartition("-")[0]  # less mkdtemp's part
    host, _, pid = owner.rpartition("-")
    if host != socket.gethostname() or not pid.isdigit() or staging.is_symlink():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):  # alive under another user, or no valid process id
        pass
    return False


def write_json_out(out: Path | None, result: dict) -> None:
    """Write a command's `result` (a benchmark's figures, a forecast) to `out`, the file of
    `--out` checked by `prepare_out_file` before the work, and say where; nothing when `out`
    is None."""
    if out is not None:
        write_json(out, result)
        print(f"wrote {out}")


def prepare_out_file(out: Path | None, force: bool) -> None:
    """Before minutes of measuring, make sure the figures can be kept: create the file's
    directory, check that a file can be written there, and refuse to replace an existing file
    without `force`."""
    if out is None:
        return
    if out.is_dir():
        raise UserError(f"--out {out}: is a directory; name a .json file")
    if out.exists() and not force:
        raise UserError(f"--out {out}: already exists; pass --force to replace it or choose "
                        "another file")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"--out {out}: cannot create {out.parent} ({err.strerror})") from err
    try:  # e.g. a read-only mount: found now, not after the measuring
        with tempfile.TemporaryFile(dir=out.parent):
            pass
    except OSError as err:
        raise UserError(f"--out {out}: cannot write in {out.parent} ({err.strerror}); choose "
                        "another file") from err


def _file_mode() -> int:
    """The mode `open()` would give a new file: 0666 less the process umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


_FILE_MODE = _file_mode()


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write `text` (or bytes) to `path` through a temporary file in the same directory and a
    rename."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as handle:
            handle.write(text)
        os.chmod(tmp, _FILE_MODE)  # mkstemp's 0600 would hide results from other users
        os.replace(tmp, path)
    except OSError as err:
        raise UserError(f"{path}: cannot write ({err.strerror}); check the directory") from err


def write_json(path: Path, payload: Any) -> None:
    """`write_atomic` of `payload` as indented JSON (numpy scalars converted)."""
    write_atomic(Path(path), json.dumps(payload, indent=2, default=_plain) + "\n")


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def remove_outputs(out: Path, owned: Iterable[str]) -> list[str]:
    """Remove the files and folders named `owned` from `out` and return the names removed.

    For ``--force``: what an earlier run wrote and this one does not rewrite would otherwise
    sit beside the new results as if this run had produced it. Only names a command owns are
    touched; anything else the user keeps in `out` stays.
    """
    removed = []
    for name in owned:
        path = Path(out) / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        removed.append(name)
    return removed
