"""Argparse types for numeric flags, lists and output paths: a bad value is argparse's one-line
error, exit 2.

Every command checks its numbers where they are parsed, before any work starts, so a negative
seed or a zero batch size never surfaces minutes later as a traceback from numpy or SB3.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
from collections.abc import Callable
from pathlib import Path


def _bounded(kind: Callable[[str], float], accept: Callable[[float], bool], rule: str,
             ) -> Callable[[str], float]:
    """A flag type: a finite number of `kind` (int or float) that `accept`s, else argparse's
    error saying `rule` ("must be at least 1")."""
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if not accept(value):
            raise argparse.ArgumentTypeError(f"{text}: {rule}")
        return value
    parse.__name__ = f"{kind.__name__} that {rule.removeprefix('must ')}"
    return parse


def at_least(minimum: float, kind: Callable[[str], float] = int) -> Callable[[str], float]:
    """A flag type: a number of `kind`, finite and >= `minimum`."""
    return _bounded(kind, lambda value: value >= minimum, f"must be at least {minimum:g}")


def above(minimum: float, kind: Callable[[str], float] = float) -> Callable[[str], float]:
    """A flag type: a number of `kind`, finite and > `minimum`."""
    return _bounded(kind, lambda value: value > minimum, f"must be > {minimum:g}")


def within(low: float, high: float, kind: Callable[[str], float] = float,
           ) -> Callable[[str], float]:
    """A flag type: a number of `kind`, finite and in [low, high]."""
    return _bounded(kind, lambda value: low <= value <= high,
                    f"must be within [{_plain(low)}, {_plain(high)}]")


def zero_or_at_least(minimum: float, kind: Callable[[str], float] = float,
                     ) -> Callable[[str], float]:
    """A flag type: a number of `kind`, finite, either 0 (the bound it sets is off) or >=
    `minimum`."""
    return _bounded(kind, lambda value: value == 0 or value >= minimum,
                    f"must be 0 (off) or at least {minimum:g}")


def _plain(number: float) -> str:
    """A bound as a user types it: 1000000, not 1e+06."""
    return str(int(number)) if float(number).is_integer() else f"{number:g}"


SEED = at_least(0)
"""A random seed: numpy and SB3 take non-negative integers only."""
POSITIVE_INT = at_least(1)
"""Counts that must be at least 1 (workers, environments, batch sizes, repeats)."""


def out_path(text: str) -> Path:
    """A flag type for a path to write to: refuses an empty one, which `Path` reads as the
    current directory (an unset variable in `--out $DIR` wrote a model into it)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; give a directory (or file) to write to")
    return Path(text)


def add_out_flags(parser: argparse.ArgumentParser, default: Path) -> None:
    """The --out directory and --force flags of a command whose results go through here."""
    parser.add_argument("--out", type=out_path, default=default,
                        help="output directory (default: %(default)s)")
    parser.add_argument("--force", action="store_true",
                        help="replace results already in --out (otherwise refused)")


def add_json_out_flags(parser: argparse.ArgumentParser) -> None:
    """--out FILE.json and --force of the commands that write one JSON file (`rlalloc bench`,
    `forecast predict`)."""
    parser.add_argument("--out", type=out_path, default=None,
                        help="also write the results as JSON to this file")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing --out file (otherwise refused)")


def require_module(name: str) -> None:
    """Raise `ModuleNotFoundError` now unless `name` can be imported: for a command that needs it
    only later (in a child process, or after minutes of work), so that `main` names the extra
    to install before any work is done."""
    if importlib.util.find_spec(name) is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def unique_names(text: str) -> list[str]:
    """A flag type: comma-separated names, blanks dropped, each at most once.

    A name listed twice would run twice and show as one row (or as two identical columns),
    which looks like a result while it is a typo, so it is refused where it is parsed.
    """
    names = [name.strip() for name in text.split(",") if name.strip()]
    if twice := next((name for i, name in enumerate(names) if name in names[:i]), None):
        raise argparse.ArgumentTypeError(f"{text!r} lists {twice} twice; name each once")
    return names


class AppendOnce(argparse.Action):
    """``action="append"`` that refuses a value given twice, for flags whose values are compared
    or counted (`rlalloc evaluate` and `headroom` --workload, `headroom --history`, `sizes fit`
    and `planner fit` --workload): a workload repeated would count its identical runs as
    independent samples and narrow the confidence intervals for nothing, or count its jobs
    twice as past jobs. (Training takes a repeat as a weighting, so its --workload appends
    plainly.) A file named by two paths (``w.csv``, ``../here/w.csv``, a link) is the same
    value too."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        """Append `values`, or raise argparse's error if it was given before."""
        given = list(getattr(namespace, self.dest, None) or [])
        same = next((g for g in given if _same_value(g, values)), None)
        if same is not None:
            again = "" if same == values else f" (as {same}: the same file)"
            raise argparse.ArgumentError(self, f"{values} is given twice{again}; give each once")
        setattr(namespace, self.dest, [*given, values])


def _same_value(first: object, second: object) -> bool:
    """Equal, or two paths of one existing file."""
    if first == second:
        return True
    try:
        return Path(str(first)).is_file() and Path(str(first)).samefile(Path(str(second)))
    except OSError:  # the second is no file (a spec like synthetic:8)
        return False
