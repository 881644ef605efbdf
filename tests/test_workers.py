"""Ctrl-C reaches the worker processes of `evaluate` and `headroom` too: an idle worker leaves
without a traceback, a busy one ends its run at once."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from env.workers import INTERRUPTED_EXIT_CODE, worker_pool


def _wait_until_exited(pid: int, timeout_s: float = 20.0) -> None:
    """Until process `pid` has ended (gone, or a zombie its pool has not reaped yet)."""
    stat = Path(f"/proc/{pid}/stat")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return
        except FileNotFoundError:
            return
        time.sleep(0.05)
    raise AssertionError(f"worker {pid} still runs {timeout_s} s after SIGINT")


def test_an_idle_worker_leaves_quietly_on_ctrl_c(capfd):
    with worker_pool(1) as pool:
        pid = pool.submit(os.getpid).result()  # the worker now waits for its next run
        os.kill(pid, signal.SIGINT)
        _wait_until_exited(pid)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


def test_a_busy_worker_ends_its_run_at_once_on_ctrl_c():
    with worker_pool(1) as pool:
        pid = pool.submit(os.getpid).result()
        run = pool.submit(time.sleep, 60)
        time.sleep(0.5)  # the sleep has started
        started = time.monotonic()
        os.kill(pid, signal.SIGINT)
        error = run.exception(timeout=20)
    assert isinstance(error, SystemExit) and error.code == INTERRUPTED_EXIT_CODE
    assert time.monotonic() - started < 20
