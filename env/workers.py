"""Worker processes for the commands that run many simulations side by side (`rlalloc evaluate`,
`rlalloc headroom`).

Ctrl-C in a terminal signals every process of the command, workers included. A worker that was
waiting for its next run would die of a KeyboardInterrupt raised inside concurrent.futures and
print its traceback under the command's one-line "rlalloc: interrupted". Workers from here
leave quietly instead (exit status 130, the shell's for SIGINT); a worker in the middle of a run
ends it at once, so the command stops without waiting for its runs to finish.

Workers are forked, so a parent that loaded a saved model (to check a `--policy` or `--base`
before any run) hands them a torch whose intra-op thread pool did not survive the fork: the
first parallel torch call in a worker then waits for ever on those threads (`rlalloc headroom
--base ppo` hung at 0 %). Workers therefore run torch on one thread, as the style guide asks
of every simulation process on this machine anyway.
"""

from __future__ import annotations

import signal
import sys
from concurrent.futures import ProcessPoolExecutor
from types import FrameType
from typing import NoReturn

INTERRUPTED_EXIT_CODE = 130
"""128 + SIGINT, as a shell reports a process that Ctrl-C ended."""


def worker_pool(max_workers: int) -> ProcessPoolExecutor:
    """A process pool whose workers end without a traceback on Ctrl-C."""
    return ProcessPoolExecutor(max_workers=max_workers, initializer=_leave_quietly_on_interrupt)


def _leave_quietly_on_interrupt() -> None:
    """Worker initializer: SIGINT raises SystemExit, which a process ends on silently; torch,
    if the parent imported it, keeps to the worker's own thread (see the module docstring)."""
    signal.signal(signal.SIGINT, _exit_interrupted)
    torch_on_one_thread()


def torch_on_one_thread() -> None:
    """Run torch on this process's own thread, if anything imported it (a learned policy):
    without importing it for runs that need none (heuristics), which would cost each worker
    ~1 s and ~180 MB."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def _exit_interrupted(signum: int, frame: FrameType | None) -> NoReturn:
    raise SystemExit(INTERRUPTED_EXIT_CODE)
