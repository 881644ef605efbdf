"""The one exception type for mistakes a user can fix (bad trace, bad flag, unreachable service).

The CLI turns a `UserError` into a single line on stderr and a non-zero exit; anything else is a
bug and keeps its traceback. Messages name the file/row/flag and say what to do.
"""


class UserError(Exception):
    """A problem with the user's input or environment, reported as one line without a traceback."""
