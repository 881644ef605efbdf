"""A JSON-lines event log of a training run, read by the fault tests and the benchmark.

Every rank may append (the rank that saves an emergency checkpoint is not always rank 0); each
event is one `write` of one line to a file opened with O_APPEND, so lines from different
processes never interleave. Without a path the log is a no-op.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path


class RunLog:
    """Appends `{"event": ..., "time": unix, "rank": r, ...}` lines to a file."""

    def __init__(self, path: Path | None, rank: int) -> None:
        self.rank = rank
        self._fd = None if path is None else os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)

    def event(self, name: str, **fields: object) -> None:
        """Append one event; a no-op when the run has no log."""
        if self._fd is None:
            return
        record = {"event": name, "time": time.time(), "rank": self.rank, **fields}
        os.write(self._fd, (json.dumps(record) + "\n").encode())


def read_events(path: Path) -> list[dict[str, object]]:
    """All events of a log, in the order they were written (a torn last line is skipped)."""
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events
