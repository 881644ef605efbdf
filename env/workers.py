"""Worker processes for the commands that run many simulations side by side (`rlalloc evaluate`,
`rlalloc headroom`; `rlalloc.env.execution.LocalProcesses`).

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

import os
import signal
import sys
from concurrent.futures import ProcessPoolExecutor
from types import FrameType
from typing import NoReturn

INTERRUPTED_EXIT_CODE = 130
"""128 + SIGINT, as a shell reports a process that Ctrl-C ended."""


def worker_pool(max_workers: int) -> ProcessPoolExecutor:
    """A process pool whose workers end without a traceback on Ctrl-C. Submit runs one by one
    and wait on each (`rlalloc.env.execution.LocalProcesses`), not `pool.map`: a caller
    stopped by Ctrl-C then does not cancel the runs left, whose workers, interrupted too, have
    ended; the broken pool (Python 3.11) printed a traceback setting its error on the
    cancelled runs ("InvalidStateError")."""
    return ProcessPoolExecutor(max_workers=max_workers, initializer=_leave_quietly_on_interrupt)


def _leave_quietly_on_interrupt() -> None:
    """Worker initializer: SIGINT ends the worker at once and silently; torch,
    if the parent imported it, keeps to the worker's own thread (see the module docstring)."""
    signal.signal(signal.SIGINT, _exit_interrupted)
    torch_on_one_thread()


def torch_on_one_thread() -> None:
    """Run torch on this process's own thread, if anything imported it (a learned policy):
    without importing it for runs that need none (heuristics), which would cost each worker
    torch's start-up time and memory (docs/architecture.md)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def _exit_interrupted(signum: int, frame: FrameType | None) -> NoReturn:
    # os._exit, not SystemExit: concurrent.futures' worker loop catches a SystemExit raised in
    # a run, hands it back as that run's result and waits for the next, so the worker lived on
    # and the interrupted command hung joining it at exit (2 of 5 Ctrl-C of `evaluate`)
    os._exit(INTERRUPTED_EXIT_CODE)
