"""Start local torchrun jobs and watch their event logs (used by the benchmark and fault tests).

The job runs exactly as in a pod — `torchrun ... -m rlalloc.trainer_jobs.train` with c10d
rendezvous — only on 127.0.0.1 with CPU workers. Observation goes through the run's JSON-lines log
(`runlog.py`), so nothing here reaches into the trainer's internals.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rlalloc.trainer_jobs.runlog import read_events

Event = dict[str, object]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (one per rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_torchrun(nproc: int, train_args: list[str], log_path: Path, max_restarts: int = 0,
                   output_path: Path | None = None) -> subprocess.Popen:
    """Launch `torchrun` with `nproc` local CPU workers running the trainer.

    Workers get OMP_NUM_THREADS=1 (two cores are shared by everything) and stdout/stderr go to
    `output_path` (or are discarded) so a chatty job cannot block on a full pipe.
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 gives every restart round a fresh TCPStore: with the
    agent's shared store, restarted gloo workers read their dead peers' addresses left over
    from the previous round and fail to connect (pytorch/pytorch#135712).
    """
    port = free_port()
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
        f"--nproc-per-node={nproc}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id=job-{port}", f"--max-restarts={max_restarts}", "--monitor-interval=0.1",
        "-m", "rlalloc.trainer_jobs.train", "--log-jsonl", str(log_path), *train_args,
    ]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                   "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    if output_path is None:
        return subprocess.Popen(command, env=environment, stdout=subprocess.DEVNULL,
                                stderr=subprocess.STDOUT)
    with output_path.open("w") as output:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(command, env=environment, stdout=output, stderr=subprocess.STDOUT)


def wait_for_event(log_path: Path, predicate: Callable[[Event], bool], timeout_s: float,
                   process: subprocess.Popen | None = None) -> Event:
    """Poll the log for an event satisfying `predicate`; TimeoutError if late or `process` exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log_path.exists():
            for event in read_events(log_path):
                if predicate(event):
                    return event
        if process is not None and process.poll() is not None:
            raise TimeoutError(f"torchrun exited with {process.returncode} before the event came")
        time.sleep(0.05)
    raise TimeoutError(f"no matching event in {log_path} within {timeout_s} s")


def worker_pids(log_path: Path, restart: int) -> dict[int, int]:
    """Rank -> pid of the workers of the given restart round (from their `start` events)."""
    return {int(e["rank"]): int(e["pid"]) for e in read_events(log_path)
            if e["event"] == "start" and e["restart"] == restart}


def final_timeline(events: list[Event]) -> dict[int, Event]:
    """Step -> the last `step` event for it: after a rollback, replayed steps replace lost ones."""
    timeline: dict[int, Event] = {}
    for event in events:
        if event["event"] == "step":
            timeline[int(event["step"])] = event
    return timeline
