"""The one exception type for mistakes a user can fix (bad trace, bad flag, unreachable service).

The CLI turns a `UserError` into a single line on stderr and a non-zero exit; anything else is a
bug and keeps its traceback. Messages name the file/row/flag and say what to do.
"""

from collections.abc import Iterator
from contextlib import contextmanager


class UserError(Exception):
    """A problem with the user's input or environment, reported as one line without a traceback."""


@contextmanager
def failures_named(what: str) -> Iterator[None]:
    """Re-raise a failure inside naming `what` (one of many runs: its policy, workload and
    seed): a `UserError` as one line prefixed with it, any other exception with a note (its
    traceback is a bug report)."""
    try:
        yield
    except UserError as err:
        raise UserError(f"{what}: {err}") from err
    except Exception as err:
        err.add_note(f"rlalloc: this failed in the run of {what}")
        raise
