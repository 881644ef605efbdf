"""Elastic, checkpointing training program: `python -m rlalloc.trainer_jobs.train` or torchrun.

    torchrun --nnodes=1:4 --nproc-per-node=8 --rdzv-backend=c10d --rdzv-endpoint=HOST:29400 \
        --max-restarts=3 -m rlalloc.trainer_jobs.train --checkpoint-dir /ckpt --global-batch 256

Workers and ranks: torchrun on each worker (node, pod) runs `--nproc-per-node` k processes, one
per GPU of the worker, so the W ranks of the job are workers x k, and the job grows and shrinks by
whole workers, k ranks at a time. Nothing below depends on how the ranks are grouped: each rank
uses its local rank's GPU, and the data, the loss scaling and the checkpoints go by the global
rank and W alone.

Batch and learning-rate rule: the global batch (`--global-batch`) is fixed for the whole job;
each of the W ranks takes a contiguous slice of it (sizes differ by at most one) and scales its
summed token loss by W / global_tokens, so after DDP's (or FSDP's) gradient averaging every rank
holds the gradient of the mean loss over the global batch, whatever W is. The learning rate is
therefore left unchanged when the world size changes, and a run that changes world size follows
the same trajectory, up to floating-point summation order, as one that does not.

Restarts: every (re)start restores the newest checkpoint that verifies, including the data
position, so the step count carries on and no sample is skipped or repeated within an epoch.
SIGTERM makes all ranks agree on a last step, write a synchronous checkpoint within
`--sigterm-grace-s` and exit with 143, which a PyTorchJob's `ExitCode` restart policy treats as
retryable. When a peer dies mid-step under DDP, each surviving rank still holds a full replica
of the state of the last completed step and saves it alone before exiting, so a killed worker
typically costs no completed steps at all.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from rlalloc.env.errors import UserError
from rlalloc.trainer_jobs.checkpoint import Checkpointer, Progress, TrainState, first_failure
from rlalloc.trainer_jobs.config import (
    TrainConfig,
    add_train_arguments,
    config_from_args,
    resume_fixed_flags,
)
from rlalloc.trainer_jobs.data import DataPosition, GlobalBatchSampler, rank_slice, sample_tokens
from rlalloc.trainer_jobs.launch import free_port
from rlalloc.trainer_jobs.metrics import TrainerMetrics
from rlalloc.trainer_jobs.model import TransformerLM, count_parameters, format_count
from rlalloc.trainer_jobs.runlog import RunLog

SIGTERM_EXIT_CODE = 128 + signal.SIGTERM
PEER_FAILURE_EXIT_CODE = 1
_THROUGHPUT_WINDOW_STEPS = 10
_BACKEND_LOCATION = re.compile(r"^\[[^\]]*\]\s*")  # gloo's "[.../pair.cc:537] " prefix


class PeerFailure(Exception):
    """A collective failed mid-step and this rank has saved its replica: the process ends with
    one line and a non-zero exit, which makes torchrun restart the group from that checkpoint."""


def _short_cause(err: BaseException) -> str:
    """The first sentence of a backend error, without its source location (the full text is in
    the JSONL log's `peer_failure` event): enough to tell a dead peer from, say, out of memory."""
    first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return _BACKEND_LOCATION.sub("", first_line).split(". ")[0][:160]


class StopSignal:
    """Remembers when SIGTERM arrived; the loop turns it into a collective, orderly stop."""

    def __init__(self) -> None:
        self.received_monotonic: float | None = None
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        if self.received_monotonic is None:
            self.received_monotonic = time.monotonic()


def _init_distributed() -> tuple[int, int, torch.device]:
    """Join torchrun's process group (or make a world of one); return rank, world size, device."""
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(free_port()))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "cpu:gloo,cuda:nccl"  # gloo for DCP's CPU-side collectives
    else:
        device = torch.device("cpu")
        backend = "gloo"
    dist.init_process_group(backend=backend)
    return dist.get_rank(), dist.get_world_size(), device


def _worker_shape() -> tuple[int, int]:
    """(workers, processes per worker) of this rendezvous, as torchrun sets them
    (GROUP_WORLD_SIZE, LOCAL_WORLD_SIZE); a world of one without torchrun."""
    workers = int(os.environ.get("GROUP_WORLD_SIZE", "1"))
    return workers, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def _wrap_model(model: nn.Module, config: TrainConfig, device: torch.device) -> nn.Module:
    """DDP (replicated) or FSDP2 (each block and the root sharded over all ranks)."""
    if config.parallelism == "ddp":
        device_ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block)
    return fully_shard(model)


def _rank_seed(seed: int, step: int, rank: int) -> int:
    """Seed of a rank's RNG stream when no saved state exists for it (fresh start, new rank)."""
    return (seed * 1_000_003 + step) * 4099 + rank


@contextmanager
def _flag_os_errors(flag: str, value: object, fix: str) -> Iterator[None]:
    """Turn an OSError of the setup the flag drives into a one-line `UserError` saying `fix`."""
    try:
        yield
    except OSError as err:
        raise UserError(f"{flag} {value}: {err.strerror or err}; {fix}") from err


def _check_writable(directory: Path) -> None:
    """Create and delete a file in `directory`: an existing directory that this process cannot
    write would otherwise fail only at the first checkpoint, after that much training."""
    handle, probe = tempfile.mkstemp(prefix=".write-test-", dir=directory)
    os.close(handle)
    os.unlink(probe)


def _open_outputs(config: TrainConfig, rank: int) -> tuple[RunLog, TrainerMetrics | None]:
    """Create the checkpoint directory (rank 0), open the event log and start rank 0's exporter.

    Done before any training work so that a bad path or a port in use ends in one line naming
    the flag, not in a traceback minutes later.
    """
    if rank == 0:
        with _flag_os_errors("--checkpoint-dir", config.checkpoint_dir,
                             "pass a directory this process can create and write"):
            config.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            _check_writable(config.checkpoint_dir)
    with _flag_os_errors("--log-jsonl", config.log_jsonl,
                         "create its directory first or pass another file"):
        run_log = RunLog(config.log_jsonl, rank)
    if rank != 0:
        return run_log, None
    metrics = TrainerMetrics(config.job_name, config.namespace, config.max_steps)
    if config.metrics_port:
        with _flag_os_errors("--metrics-port", config.metrics_port,
                             "pass a free port, or 0 for no exporter"):
            metrics.start(config.metrics_port)
    return run_log, metrics


def train(config: TrainConfig) -> int:
    """Run (or resume) the job to `max_steps`; return the process exit code."""
    stop_signal = StopSignal()
    rank, world_size, device = _init_distributed()
    # A failure propagates with the process group alive: `main` ends the process inside its
    # handler (`_exit_now`), because tearing a failed run's torch state down can hang.
    exit_code = _run(config, stop_signal, rank, world_size, device)
    dist.destroy_process_group()
    return exit_code


def _run(config: TrainConfig, stop_signal: StopSignal, rank: int, world_size: int,
         device: torch.device) -> int:
    """`train` inside the process group: set up, restore, train, close the checkpointer."""
    workers, per_worker = _worker_shape()
    shape = f"world size {world_size} ({workers} workers x {per_worker} processes)"
    if world_size > config.global_batch:
        raise UserError(f"{shape} exceeds --global-batch {config.global_batch}; every rank needs "
                        "at least one sample per step: pass a --global-batch of at least the "
                        "largest world size (max workers x processes per worker)")
    setup_failure = None
    try:
        run_log, metrics = _open_outputs(config, rank)
    except UserError as failure:  # rank 0's checks are its alone: tell the others
        setup_failure = failure
    message = first_failure(setup_failure)
    if message is not None:
        raise UserError(message) from setup_failure
    run_log.event("start", pid=os.getpid(), world_size=world_size, workers=workers,
                  local_rank=int(os.environ["LOCAL_RANK"]),
                  restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))

    torch.manual_seed(config.seed)  # identical initial weights on every rank
    model = TransformerLM(config.model).to(device)
    parameters = count_parameters(model)
    wrapped = _wrap_model(model, config, device)
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=config.lr)
    state = TrainState(wrapped, optimizer, Progress(0, DataPosition(0, 0)))
    checkpoint_group = dist.new_group(backend="gloo")
    checkpointer = Checkpointer(
        root=config.checkpoint_dir, rank=rank, world_size=world_size,
        process_group=checkpoint_group, keep_last=config.keep_last,
        config=config.to_json_dict(), run_log=run_log,
        on_commit=metrics.on_checkpoint_committed if metrics else lambda step, unix: None,
    )
    info = checkpointer.restore(state)
    if info is None or rank not in info.rng_ranks:
        torch.manual_seed(_rank_seed(config.seed, state.progress.step, rank))
    if metrics:  # where a restart would resume: the checkpoint loaded (step 0 if none), now
        metrics.on_resumed(state.progress.step, world_size, info.step if info else 0,
                           time.time())
    if rank == 0:
        origin = f"resumed from {info.path} (world size {info.world_size})" if info else "fresh"
        print(f"trainer: {format_count(parameters)} parameters, {shape}, "
              f"step {state.progress.step}/{config.max_steps}, {origin}", flush=True)

    exit_code = _train_loop(config, state, checkpointer, stop_signal, metrics, run_log,
                            rank, world_size, device)
    checkpointer.close()
    return exit_code


def _train_loop(config: TrainConfig, state: TrainState, checkpointer: Checkpointer,
                stop_signal: StopSignal, metrics: TrainerMetrics | None, run_log: RunLog,
                rank: int, world_size: int, device: torch.device) -> int:
    """Steps until `max_steps` or an agreed stop; checkpoints on schedule and at the end."""
    sampler = GlobalBatchSampler(config.num_samples, config.global_batch, config.seed)
    global_tokens = config.global_batch * config.model.seq_len
    step_times: deque[float] = deque(maxlen=_THROUGHPUT_WINDOW_STEPS)
    last_checkpoint = time.monotonic()
    stopping = False
    blocked_s = 0.0  # the latest checkpoint's stall so far (save call + copy wait)
    while state.progress.step < config.max_steps:
        started = time.perf_counter()
        global_indices = sampler.global_batch_indices(state.progress.position)
        tokens = sample_tokens(rank_slice(global_indices, rank, world_size), config.seed,
                               config.model.seq_len, config.model.vocab_size).to(device)
        checkpoint_due = (rank == 0 and config.checkpoint_every_s > 0
                          and time.monotonic() - last_checkpoint >= config.checkpoint_every_s)
        with _peer_failures(config, world_size, state, checkpointer, run_log):
            logits = state.model(tokens[:, :-1])
            loss_sum = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten(),
                                       reduction="sum")
            (loss_sum * (world_size / global_tokens)).backward()
            # One all-reduce carries the loss and the two flags every rank must agree on.
            shared = torch.tensor([loss_sum.item(), stop_signal.received_monotonic is not None,
                                   checkpoint_due], dtype=torch.float64, device=device)
            dist.all_reduce(shared)
        copy_wait_s = checkpointer.before_update()  # an async save may still be copying
        if copy_wait_s and metrics:
            blocked_s += copy_wait_s
            metrics.on_checkpoint_blocked(blocked_s)
        state.optimizer.step()
        state.optimizer.zero_grad(set_to_none=True)
        drawn_from = state.progress.position  # the batch's, before the next one's
        state.progress = Progress(state.progress.step + 1, sampler.advance(drawn_from))
        step = state.progress.step
        step_times.append(time.perf_counter() - started)
        loss = shared[0].item() / global_tokens
        samples_per_s = config.global_batch * len(step_times) / sum(step_times)
        if metrics:
            metrics.on_step(step, loss, samples_per_s, world_size)
        if rank == 0:
            run_log.event("step", step=step, loss=loss, world_size=world_size,
                          step_s=step_times[-1], samples=global_indices,
                          epoch=drawn_from.epoch)
            if step % 10 == 0 or step == config.max_steps:
                print(f"trainer: step {step} loss {loss:.4f} {samples_per_s:.1f} samples/s",
                      flush=True)
        if shared[1].item() > 0:
            stopping = True
            break
        by_steps = config.checkpoint_every_steps and step % config.checkpoint_every_steps == 0
        if (by_steps or shared[2].item() > 0) and step < config.max_steps:
            # its collectives fail like the step's when a peer dies during the save
            with _peer_failures(config, world_size, state, checkpointer, run_log):
                blocked_s = checkpointer.save(state, config.checkpoint_mode, reason="periodic")
            last_checkpoint = time.monotonic()
            if metrics:
                metrics.on_checkpoint_blocked(blocked_s)

    if stopping:
        _arm_grace_watchdog(config.sigterm_grace_s, stop_signal.received_monotonic)
        run_log.event("stop", step=state.progress.step, reason="SIGTERM")
    with _peer_failures(config, world_size, state, checkpointer, run_log):
        blocked_s = checkpointer.save(state, "sync", reason="sigterm" if stopping else "final")
    if metrics:
        metrics.on_checkpoint_blocked(blocked_s)
    return SIGTERM_EXIT_CODE if stopping else 0


@contextlib.contextmanager
def _peer_failures(config: TrainConfig, world_size: int, state: TrainState,
                   checkpointer: Checkpointer, run_log: RunLog) -> Iterator[None]:
    """Around collectives: with DDP and peers, a `RuntimeError` means one of them died, so save
    this rank's replica (`Checkpointer.emergency_save`, no collectives) and raise
    `PeerFailure` to exit with; otherwise the error is a bug, shown as it is."""
    try:
        yield
    except RuntimeError as err:
        if config.parallelism != "ddp" or world_size == 1:
            raise
        step = state.progress.step
        run_log.event("peer_failure", step=step, error=str(err)[:200])
        saved = checkpointer.emergency_save(state)
        raise PeerFailure(f"peer failure at step {step}: saved checkpoint {saved}; exiting for "
                          f"torchrun to restart the group ({_short_cause(err)})") from err


def _arm_grace_watchdog(grace_s: float, signalled_monotonic: float | None) -> None:
    """Exit hard if the final checkpoint overruns the grace period.

    Being killed by the kubelet mid-save is no worse (the half-written `.tmp` directory is never
    loaded), but exiting first makes the overrun visible in the logs instead of a bare SIGKILL.
    """
    started = signalled_monotonic if signalled_monotonic is not None else time.monotonic()
    remaining_s = max(0.0, grace_s - (time.monotonic() - started))

    def expire() -> None:
        print(f"trainer: final checkpoint overran --sigterm-grace-s {grace_s}; exiting without it",
              file=sys.stderr, flush=True)
        os._exit(SIGTERM_EXIT_CODE)

    watchdog = threading.Timer(remaining_s, expire)
    watchdog.daemon = True
    watchdog.start()


def main(argv: list[str] | None = None) -> int:
    """Parse flags and train; a user-fixable problem ends in one line on stderr and exit code 2,
    a peer failure (after the emergency save) in one line and `PEER_FAILURE_EXIT_CODE`.

    A bad flag returns 2. A run that fails once training has begun ends this process on the
    spot (`_exit_now`): `main` is the job's process, not a library call.
    """
    parser = argparse.ArgumentParser(
        prog="python -m rlalloc.trainer_jobs.train",
        description="Elastic, checkpointing LM training job.",
        epilog="A restart resumes from the newest valid checkpoint in --checkpoint-dir and "
               f"refuses to if any of {', '.join(resume_fixed_flags())} differs from it.")
    add_train_arguments(parser)
    try:
        config = config_from_args(parser.parse_args(argv))
    except UserError as err:
        _last_line(f"trainer: error: {err}")
        return 2
    try:
        return train(config)
    except UserError as err:
        _last_line(f"trainer: error: {err}")
        _exit_now(2)
    except PeerFailure as failure:
        _last_line(f"trainer: {failure}")
        _exit_now(PEER_FAILURE_EXIT_CODE)


def _last_line(text: str) -> None:
    """Print a rank's closing line to stderr in one write: every rank of a failed job prints
    one, and `print` writes the text and its newline apart, so two ranks sharing a terminal
    (local torchrun) ran their lines together."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def _exit_now(exit_code: int) -> NoReturn:
    """End the process without tearing torch down.

    A failed or stopped run's teardown is where it goes wrong: freeing a DDP model's gloo
    process group joins the group's worker threads with the GIL held, and deadlocks when a
    worker still needs the GIL to free the tensors of the collective just finished (a refused
    resume hung this way); after a failed async checkpoint, torch's C++ teardown at interpreter
    exit sometimes aborts ("terminate called without an active exception"), and torchrun then
    reports -6 instead of our exit code. Everything the run leaves is already written (the run
    log unbuffered, checkpoints committed or removed), so there is nothing to tear down for.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


if __name__ == "__main__":
    exit_code = main()
    if exit_code != 0:  # a stop on SIGTERM, its final checkpoint saved
        _exit_now(exit_code)
    sys.exit(exit_code)
