"""Start local torchrun jobs and watch their event logs (used by the benchmark and fault tests).

The job runs exactly as in a pod — `torchrun ... -m rlalloc.trainer_jobs.train` with c10d
rendezvous — only on 127.0.0.1 with CPU processes. Several worker pods are several torchrun
launchers sharing one rendezvous (`start_worker_pods`), each running its worker's processes.
Observation goes through the run's JSON-lines log (`runlog.py`), so nothing here reaches into the
trainer's internals.
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
                   output_path: Path | None = None, nnodes: str = "1",
                   rdzv_port: int | None = None, rdzv_conf: str = "") -> subprocess.Popen:
    """Launch `torchrun` with `nproc` local CPU processes running the trainer.

    Alone by default (`--nnodes=1`, a rendezvous of its own); `start_worker_pods` passes the
    `nnodes` range, the shared `rdzv_port` and `rdzv_conf` (torchrun's `--rdzv-conf`) of a job
    of several launchers.
    Processes get OMP_NUM_THREADS=1 (two cores are shared by everything) and stdout/stderr go to
    `output_path` (or are discarded) so a chatty job cannot block on a full pipe.
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 gives every restart round a fresh TCPStore: with the
    agent's shared store, restarted gloo workers read their dead peers' addresses left over
    from the previous round and fail to connect (pytorch/pytorch#135712).
    """
    port = free_port() if rdzv_port is None else rdzv_port
    command = [
        sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id=job-{port}", *([f"--rdzv-conf={rdzv_conf}"] if rdzv_conf else []),
        f"--max-restarts={max_restarts}", "--monitor-interval=0.1",
        "-m", "rlalloc.trainer_jobs.train", "--log-jsonl", str(log_path), *train_args,
    ]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                   "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    if output_path is None:
        return subprocess.Popen(command, env=environment, stdout=subprocess.DEVNULL,
                                stderr=subprocess.STDOUT)
    with output_path.open("w") as output:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(command, env=environment, stdout=output, stderr=subprocess.STDOUT)


def start_worker_pods(workers: int, nproc_per_node: int, train_args: list[str], log_path: Path,
                      max_restarts: int = 0, output_dir: Path | None = None,
                      min_workers: int | None = None,
                      rdzv_conf: str = "") -> list[subprocess.Popen]:
    """Launch `workers` torchrun launchers of `nproc_per_node` processes each on one rendezvous:
    the worker pods of an elastic PyTorchJob (`nprocPerNode`, elasticPolicy replicas), locally.

    `--nnodes` is `min_workers:workers`, or a fixed `workers` when `min_workers` is None.
    Launcher 0 hosts the rendezvous store, as worker 0 does in a PyTorchJob (the operator points
    every pod's rendezvous endpoint at it), so stopping any other launcher leaves the rendezvous
    to the rest. The others are told not to host it (`is_host=false`, added to `rdzv_conf`):
    on one machine the endpoint 127.0.0.1 is every launcher's own address, and a second
    launcher binds a store of its own to the same port, which splits the job into separate
    worlds training into one checkpoint directory. Worker i's output goes to
    `output_dir / worker-<i>.out` (or is discarded).
    """
    port = free_port()
    nnodes = str(workers) if min_workers is None else f"{min_workers}:{workers}"
    launchers = []
    for index in range(workers):
        output = None if output_dir is None else output_dir / f"worker-{index}.out"
        conf = ",".join(filter(None, [rdzv_conf, f"is_host={str(index == 0).lower()}"]))
        launchers.append(start_torchrun(nproc_per_node, train_args, log_path, max_restarts,
                                        output, nnodes, port, conf))
    return launchers


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
