"""Ctrl-C reaches the worker processes of `evaluate` and `headroom` too: an idle worker leaves
without a traceback, a busy one ends its run at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from rlalloc.env.workers import worker_pool


def _wait_until_exited(pid: int, timeout_s: float = 20.0) -> None:
    """Until process `pid` has ended (gone, or a zombie its pool has not reaped yet)."""
    stat = Path(f"/proc/{pid}/stat")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return
        except (FileNotFoundError, ProcessLookupError):  # gone before, or while, it was read
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
        _wait_until_exited(pid)  # it ends, not only its run: a worker left waiting for the
        # next run kept the interrupted command joining it at exit for ever
    assert isinstance(error, BrokenProcessPool)
    assert time.monotonic() - started < 20


def test_ctrl_c_of_the_whole_command_ends_it_quietly_and_at_once():
    # as a terminal's Ctrl-C: SIGINT to the command and its workers together. With pool.map the
    # stopped caller cancelled the runs left and the broken pool then printed a traceback
    # ("InvalidStateError: CANCELLED"); with SystemExit in the workers it could hang for ever
    # A job started in the background by a non-interactive shell (CI's, `make test &`) starts
    # with SIGINT ignored, and Python then installs no KeyboardInterrupt for it: the command
    # gets Ctrl-C's default back first, as it has in a terminal.
    script = ("import signal, sys, time\n"
              "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
              "from rlalloc.env.execution import LocalProcesses\n"
              "try:\n"
              "    runs = LocalProcesses(2).map(time.sleep, [30.0] * 6)\n"
              "    print('started', flush=True)\n"
              "    for _ in runs:\n"
              "        pass\n"
              "except KeyboardInterrupt:\n"
              "    print('interrupted', file=sys.stderr)\n")
    command = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True,
                               cwd=Path(__file__).resolve().parents[1])
    assert command.stdout.readline().strip() == "started"
    time.sleep(1.0)  # the workers have taken their runs
    os.killpg(command.pid, signal.SIGINT)
    _, err = command.communicate(timeout=20)
    assert err.strip() == "interrupted", err
