"""`rlalloc bench recovery`: what a move or a failure costs a training job, measured for real.

Two phases with the default model (tens of millions of parameters) on local CPU workers:

1. Checkpoint stall: one worker trains with a checkpoint every few steps, once with `sync` and
   once with `async` saves. A stall is the time the save call blocks the loop plus the extra
   time the steps took while the background copy or write ran: on a machine without spare
   cores those compete with training, and counting only the blocked time would flatter async.
   `*_blocked_s` is the outright wait (for async: the save call and the wait for the copy,
   which overlaps the next forward and backward pass). Means over the checkpoints after the
   first; the first (`*_first_stall_s`) also allocates the async staging buffers. The sync save
   time is `checkpoint_save_s`.
2. Recovery: `--workers` worker pods, each a torchrun of `--nproc-per-node` processes, on one
   rendezvous, with the default checkpoint interval; the process of the last rank (on the last
   worker) is SIGKILLed after `--kill-at-step` steps. `recovery_s` runs from the kill to the
   first step completed after the restart; `progress_preserved` is the share of the steps
   completed before the kill that the restart did not have to redo; `checkpoint_restore_s` is
   the restart's load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from rlalloc.cli.argtypes import add_json_out_flags, out_path, require_module
from rlalloc.env.errors import UserError
from rlalloc.env.output import prepare_out_file, write_json
from rlalloc.trainer_jobs.config import TrainConfig
from rlalloc.trainer_jobs.launch import Event, start_worker_pods, wait_for_event, worker_pids
from rlalloc.trainer_jobs.model import ModelConfig, TransformerLM, count_parameters
from rlalloc.trainer_jobs.runlog import read_events

_TIMEOUT_S = 300


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `rlalloc bench recovery`."""
    add_json_out_flags(parser)
    parser.add_argument("--workers", type=int, default=2,
                        help="worker pods (torchrun launchers) in the recovery phase "
                             "(default: %(default)s)")
    parser.add_argument("--nproc-per-node", type=int, default=1,
                        help="processes per worker, one per GPU of a pod (PyTorchJob "
                             "nprocPerNode); the last rank's is killed (default: %(default)s)")
    parser.add_argument("--kill-at-step", type=int, default=60,
                        help="SIGKILL the last rank's process once the job has completed this "
                             "many steps "
                             "(default: %(default)s)")
    parser.add_argument("--checkpoints", type=int, default=10,
                        help="periodic checkpoints per mode in the stall phase (the first is "
                             "reported apart; default: %(default)s)")
    parser.add_argument("--work-dir", type=out_path, default=None,
                        help="keep checkpoints and logs here; must be new or empty (default: "
                             "a temporary directory, removed at the end)")


def _validate(args: argparse.Namespace) -> None:
    """Reject unusable flag values before minutes of benchmarking."""
    processes = args.workers * args.nproc_per_node
    global_batch = TrainConfig(model=ModelConfig()).global_batch
    if args.workers < 1 or args.nproc_per_node < 1 or not 2 <= processes <= global_batch:
        raise UserError(f"--workers {args.workers} x --nproc-per-node {args.nproc_per_node}: "
                        f"need at least 1 of each and 2 to {global_batch} processes in all (one "
                        f"is killed; each takes a share of the global batch of {global_batch})")
    if args.kill_at_step < 1:
        raise UserError(f"--kill-at-step {args.kill_at_step}: must be at least 1")
    if args.checkpoints < 2:
        raise UserError(f"--checkpoints {args.checkpoints}: must be at least 2 (the first "
                        "is reported apart)")
    if args.work_dir is not None and args.work_dir.exists() and not args.work_dir.is_dir():
        raise UserError(f"--work-dir {args.work_dir}: is a file, not a directory; pass a new "
                        "or empty directory")
    if args.work_dir is not None and args.work_dir.is_dir() and any(args.work_dir.iterdir()):
        raise UserError(f"--work-dir {args.work_dir}: not an empty directory; a previous run's "
                        "logs there would be read as this run's: pass a new or empty directory")
    prepare_out_file(args.out, args.force)


@contextlib.contextmanager
def _work_dir(given: Path | None) -> Iterator[Path]:
    """The user's --work-dir (created, kept), or a temporary directory removed afterwards, also
    after a failure or a SIGTERM (`timeout`, a CI job's cancel), which would otherwise end the
    process where it stands: the benchmark's checkpoints take about 2 GB."""
    if given is None:
        previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            with tempfile.TemporaryDirectory(prefix="rlalloc-bench-recovery-",
                                             ignore_cleanup_errors=True) as temporary:
                yield Path(temporary)
        finally:
            signal.signal(signal.SIGTERM, previous)
        return
    try:
        given.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"--work-dir {given}: cannot create it ({err.strerror}); "
                        "pass a writable path") from err
    yield given


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _stall_phase(work_dir: Path, mode: str, checkpoints: int, progress: Progress) -> list[Event]:
    """Train one worker with a checkpoint every 4 steps in `mode`; return its events."""
    every, log = 4, work_dir / f"stall-{mode}.jsonl"
    max_steps = every * (checkpoints + 1)
    task = progress.add_task(f"{mode} checkpoint stall", total=max_steps)
    command = [sys.executable, "-m", "rlalloc.trainer_jobs.train", "--max-steps", str(max_steps),
               "--checkpoint-every-steps", str(every), "--checkpoint-mode", mode,
               "--checkpoint-dir", str(work_dir / f"ckpt-{mode}"), "--log-jsonl", str(log)]
    errors = work_dir / f"stall-{mode}.stderr"  # a file, not a pipe read only at the end:
    with errors.open("w") as stderr:  # a child that fills a pipe's 64 KB would block for ever
        job = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    while job.poll() is None:
        try:
            job.wait(0.5)
        except subprocess.TimeoutExpired:
            pass
        if log.exists():
            steps = [e["step"] for e in read_events(log) if e["event"] == "step"]
            progress.update(task, completed=max(steps, default=0))
    if job.returncode != 0:
        raise RuntimeError(f"stall run ({mode}) failed: {errors.read_text()[-2000:]}")
    return read_events(log)


def _stall_s(events: list[Event]) -> dict[str, float]:
    """Stall per periodic checkpoint: the time the save call blocked the loop plus the extra
    time of the steps that overlapped its background copy and write (over the median step
    without one). `blocked_s` is the time the loop waited outright: the save call and, for
    async, the wait for the copy before the next optimizer step.

    The first checkpoint of a run is reported apart (`first_stall_s`): an async save also
    allocates the staging buffers there that every later save reuses. `stall_s` and
    `blocked_s` are the means over the later ones, what a long job pays per checkpoint.
    """
    steps = [e for e in events if e["event"] == "step"]
    periodic = [e for e in events if e["event"] == "checkpoint" and e["reason"] == "periodic"]
    committed = {e["step"]: e["time"] for e in events if e["event"] == "checkpoint_committed"}
    # the steps that ended while the background copy and write ran, and always the step right
    # after the save (its optimizer step waits for the copy, however fast the write was)
    overlapping = {c["step"]: [s for s in steps if c["time"] < s["time"] and (
        s["time"] <= committed[c["step"]] or s["step"] == c["step"] + 1)] for c in periodic}
    overlapped = {s["step"] for group in overlapping.values() for s in group}
    # The first steps warm up the allocator and autograd; keep them out of the baseline.
    baseline_s = statistics.median(
        s["step_s"] for s in steps[2:] if s["step"] not in overlapped)
    stalls = [c["blocked_s"] + sum(max(0.0, s["step_s"] - baseline_s)
                                   for s in overlapping[c["step"]]) for c in periodic]
    copy_waits = {e["step"]: e["waited_s"] for e in events if e["event"] == "checkpoint_copied"}
    return {"stall_s": statistics.mean(stalls[1:]), "first_stall_s": stalls[0],
            "blocked_s": statistics.mean(c["blocked_s"] + copy_waits.get(c["step"], 0.0)
                                         for c in periodic[1:]),
            "step_s": baseline_s}


def _recovery_phase(work_dir: Path, workers: int, nproc_per_node: int, kill_at_step: int,
                    progress: Progress) -> dict[str, float]:
    """Kill a process of an elastic job mid-training and time its way back to training."""
    log = work_dir / "recovery.jsonl"
    task = progress.add_task("kill a process and recover", total=kill_at_step + 1)
    pods = start_worker_pods(workers, nproc_per_node, ["--max-steps", "1000000",
                                                       "--checkpoint-dir",
                                                       str(work_dir / "ckpt-recovery")],
                             log, max_restarts=1, output_dir=work_dir)
    job = pods[0]  # hosts the rendezvous: the job cannot go on without it
    try:
        reached = 0
        while reached < kill_at_step:
            event = wait_for_event(
                log, lambda e, after=reached: e["event"] == "step" and e["step"] > after,
                _TIMEOUT_S, job)
            reached = int(event["step"])
            progress.update(task, completed=reached)
        victim = worker_pids(log, restart=0)[workers * nproc_per_node - 1]
        os.kill(victim, signal.SIGKILL)
        killed_unix = time.time()  # the log's events carry the same wall clock
        resume = wait_for_event(log, lambda e: e["event"] == "resume" and e["rank"] == 0,
                                _TIMEOUT_S, job)
        first = wait_for_event(log, lambda e: e["event"] == "step" and e["time"] > resume["time"],
                               _TIMEOUT_S, job)
        progress.update(task, completed=kill_at_step + 1)
    finally:
        for pod in pods:
            pod.send_signal(signal.SIGTERM)
        for pod in pods:
            try:
                pod.wait(60)
            except subprocess.TimeoutExpired:
                pod.kill()
    steps_at_kill = max(int(e["step"]) for e in read_events(log)
                        if e["event"] == "step" and e["time"] <= killed_unix)
    return {
        "recovery_s": first["time"] - killed_unix,
        "progress_preserved": int(resume["step"]) / steps_at_kill,
        "steps_at_kill": steps_at_kill,
        "resumed_from_step": int(resume["step"]),
        "checkpoint_restore_s": resume["restore_s"],
    }


def run(args: argparse.Namespace) -> int:
    """Run both phases and write (or print) the JSON report."""
    _validate(args)
    require_module("prometheus_client")  # the trainers it launches export their metrics
    defaults = TrainConfig(model=ModelConfig())
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/"
               "{task.total} steps"), TimeElapsedColumn())
    with _work_dir(args.work_dir) as work_dir, Progress(*columns, transient=False) as progress:
        sync_events = _stall_phase(work_dir, "sync", args.checkpoints, progress)
        async_events = _stall_phase(work_dir, "async", args.checkpoints, progress)
        recovery = _recovery_phase(work_dir, args.workers, args.nproc_per_node,
                                   args.kill_at_step, progress)
    sync_stall, async_stall = _stall_s(sync_events), _stall_s(async_events)
    sync_saves = [e["blocked_s"] for e in sync_events
                  if e["event"] == "checkpoint" and e["reason"] == "periodic"]
    report = {
        **recovery,
        "sync_stall_s": sync_stall["stall_s"],
        "async_stall_s": async_stall["stall_s"],
        "async_over_sync_stall": async_stall["stall_s"] / sync_stall["stall_s"],
        "sync_blocked_s": sync_stall["blocked_s"],
        "async_blocked_s": async_stall["blocked_s"],
        "sync_first_stall_s": sync_stall["first_stall_s"],
        "async_first_stall_s": async_stall["first_stall_s"],
        "checkpoint_save_s": statistics.median(sync_saves),
        "step_s_one_worker": sync_stall["step_s"],
        "model_parameters": count_parameters(TransformerLM(defaults.model)),
        "checkpoint_every_steps": defaults.checkpoint_every_steps,
        "workers": args.workers,
        "nproc_per_node": args.nproc_per_node,
        "kill_at_step": args.kill_at_step,
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "work_dir": None if args.work_dir is None else str(args.work_dir),  # None: removed
    }
    if args.out is None:
        print(json.dumps(report, indent=2))
    else:
        write_json(args.out, report)
        print(f"wrote {args.out}")
    return 0
