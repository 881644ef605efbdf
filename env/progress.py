"""One look for every progress bar in rlalloc (replays, training, evaluation, benchmarks)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


def progress_bar(transient: bool = False) -> Progress:
    """A rich `Progress` with description, bar, count, elapsed and remaining time (stderr)."""
    from rich.console import Console

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=transient,
    )


@contextmanager
def progress_task(progress: Progress, description: str,
                  total: float) -> Iterator[Callable[[float], None]]:
    """A bar in `progress` for one phase of a run, removed when the phase ends; yields
    the function that advances it."""
    task = progress.add_task(description, total=total)
    try:
        yield partial(progress.advance, task)
    finally:
        progress.remove_task(task)
