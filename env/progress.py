"""One look for every progress bar in rlalloc (replays, training, evaluation, benchmarks)."""

from __future__ import annotations

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
