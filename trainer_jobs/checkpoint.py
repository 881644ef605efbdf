"""Saving and restoring the training state with torch.distributed.checkpoint (DCP).

What is saved: model and optimizer (through DCP's `get_state_dict`, so DDP and FSDP give the same
fully-qualified names and a checkpoint can be loaded at any world size), the step and the data
position (a global sample offset, see `data.py`), and each rank's RNG state. The directory layout
and its atomic commit are in `layout.py`.

Two modes. `sync` blocks every rank until the files and the commit marker are written. `async`
(DCP `async_save`) makes an in-memory copy while the next step's forward and backward pass run
(the loop waits for it in `before_update`, before the optimizer step), then writes from a
background thread; the commit runs on rank 0 in the same thread once every rank's data is on
disk. Checkpoint collectives use their own gloo process group so the background thread never
interleaves its collectives with the training loop's gradient all-reduces.

Keeping the async stall small: the in-memory copy goes into the same buffers every time
(`staging.ReusingStager`), which is safe because a save first waits for the previous one;
and torch.save's per-record CRC-32 is off, because `layout.commit` already records the CRC-32 of
every file and `layout.verify` checks it before anything is loaded: computing it twice only takes
CPU away from the training steps that overlap the background write.

A save that cannot be written (a full or read-only volume) ends the job with one `UserError`
line naming the directory, instead of a traceback: its half-written `.tmp` is removed, and a
restart resumes from the newest committed checkpoint, which the failed save never touched.
Every rank ends that way, also when the failure was rank 0's alone (its `.tmp` directory, its
commit): a one-element all-reduce per save tells the others, instead of a gloo traceback at
their next collective.
"""

from __future__ import annotations

import fcntl
import shutil
import tempfile
import time
import warnings
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.serialization import config as serialization_config

from rlalloc.env.errors import UserError
from rlalloc.trainer_jobs import layout
from rlalloc.trainer_jobs.config import resume_conflicts
from rlalloc.trainer_jobs.data import DataPosition
from rlalloc.trainer_jobs.runlog import RunLog
from rlalloc.trainer_jobs.staging import ReusingStager


@dataclass
class Progress:
    """How far the job is; continues across restarts and world-size changes."""

    step: int
    """Optimizer steps completed."""
    position: DataPosition
    """Next unseen sample of the data stream."""

    def as_tensor(self) -> torch.Tensor:
        """Packed form for DCP (plain tensors load back reliably at any world size)."""
        return torch.tensor([self.step, self.position.epoch, self.position.sample_offset])

    @classmethod
    def from_tensor(cls, packed: torch.Tensor) -> Progress:
        """Inverse of `as_tensor`."""
        step, epoch, offset = (int(v) for v in packed.tolist())
        return cls(step=step, position=DataPosition(epoch=epoch, sample_offset=offset))


class TrainState(Stateful):
    """Model, optimizer and progress as one DCP `Stateful` (DCP calls it at save and load)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 progress: Progress) -> None:
        self.model = model
        self.optimizer = optimizer
        self.progress = progress

    def state_dict(self) -> dict[str, object]:
        """Model and optimizer under parallelism-independent names, plus the progress."""
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optim": optim_state, "progress": self.progress.as_tensor()}

    def load_state_dict(self, state_dict: dict[str, object]) -> None:
        """Copy loaded tensors into the live model and optimizer and adopt the progress."""
        set_state_dict(self.model, self.optimizer, model_state_dict=state_dict["model"],
                       optim_state_dict=state_dict["optim"])
        self.progress = Progress.from_tensor(state_dict["progress"])


_WRITE_ERRORS = (OSError, CheckpointException)
"""What a failed write raises: an OSError in the committing process, DCP's CheckpointException
(one per failed rank, gathered onto every rank) from a save."""


def _first_cause(err: BaseException) -> str:
    """The underlying error of a failed write, in a few words (`No space left on device`)."""
    if isinstance(err, CheckpointException) and err.failures:
        err = next(iter(err.failures.values()))[0]
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return str(err).splitlines()[0] if str(err) else type(err).__name__


def first_failure(failure: UserError | None,
                  group: dist.ProcessGroup | None = None) -> str | None:
    """Collective over `group`: the message of the lowest rank whose `failure` is not None, on
    every rank, or None when no rank failed.

    For work one rank does alone (rank 0 creates directories, commits, serves metrics): the
    others would otherwise go on to their next collective and fail there with a gloo traceback
    once the failed rank has exited. Costs one one-element all-reduce; the message only
    travels on failure.
    """
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    first_failed = torch.tensor([world_size if failure is None else rank])
    dist.all_reduce(first_failed, op=dist.ReduceOp.MIN, group=group)
    source = int(first_failed.item())
    if source == world_size:
        return None
    message = [str(failure) if rank == source else None]
    dist.broadcast_object_list(message, group=group, group_src=source)
    return str(message[0])


@contextmanager
def _machine_lock(root: Path) -> Iterator[None]:
    """Hold this machine's lock on emergency saves into `root` (a file in the temporary
    directory, locked with flock: the kernel releases it when its holder dies, SIGKILL
    included). Without a writable temporary directory the saves go ahead unserialised."""
    key = zlib.crc32(str(root.resolve()).encode())
    try:
        handle = (Path(tempfile.gettempdir()) / f"rlalloc-emergency-{key:08x}.lock").open("a")
    except OSError:
        handle = None
    if handle is None:
        yield
        return
    with handle:  # closing the file releases the lock
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _rng_key(rank: int) -> str:
    """Key of one rank's RNG state (per rank: dropout masks differ between ranks)."""
    return f"rng_rank{rank}"


class Checkpointer:
    """Writes, commits, prunes and restores the checkpoints of one job (one per rank).

    `save` and `restore` are collective: every rank calls them at the same step.
    `on_commit(step, committed_unix)` runs on rank 0 each time a checkpoint becomes loadable.
    `config` (`TrainConfig.to_json_dict()`) goes into every marker; a resume compares it.
    """

    def __init__(self, root: Path, rank: int, world_size: int, process_group: dist.ProcessGroup,
                 keep_last: int, config: dict[str, object], run_log: RunLog,
                 on_commit: Callable[[int, float], None]) -> None:
        self.root = root
        self.rank = rank
        self.world_size = world_size
        self.process_group = process_group
        self.keep_last = keep_last
        self.config = config
        self.run_log = run_log
        self.on_commit = on_commit
        self.last_saved_step = -1
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self._pending: Future[None] | None = None
        self._copying: Future[None] | None = None
        self._stager = ReusingStager()
        serialization_config.save.compute_crc32 = False  # see the module docstring

    def _commit(self, tmp_dir: Path, step: int, rng_ranks: list[int], started: float) -> None:
        """Rank 0 (or an emergency saver): make the checkpoint loadable and prune old ones."""
        final = layout.commit(tmp_dir, step, self.world_size, rng_ranks, self.config)
        committed_unix = time.time()
        self.run_log.event("checkpoint_committed", step=step, path=str(final),
                           duration_s=time.perf_counter() - started)
        layout.prune(self.root, self.keep_last)
        self.on_commit(step, committed_unix)

    def wait(self) -> None:
        """Block until an in-flight async checkpoint is committed (re-raising its error)."""
        if self._pending is not None:
            pending, self._pending, self._copying = self._pending, None, None
            pending.result()

    def before_update(self) -> float:
        """Wait until an async save's in-memory copy is complete; the trainer calls this before
        its optimizer step, the first thing after a save that modifies the saved tensors.
        Returns the seconds waited (part of the checkpoint's stall)."""
        if self._copying is None:
            return 0.0
        started = time.perf_counter()
        copying, self._copying = self._copying, None
        copying.result()
        waited_s = time.perf_counter() - started
        self.run_log.event("checkpoint_copied", step=self.last_saved_step, waited_s=waited_s)
        return waited_s

    def save(self, state: TrainState, mode: str, reason: str) -> float:
        """Checkpoint the current step on every rank; return the seconds the caller was blocked.

        A failure on any rank (the previous async save's, rank 0's `.tmp` directory or commit,
        a rank's write) ends every rank with the same `UserError` (`_agree`), so no rank is left
        waiting in a collective for one that has gone.
        """
        step = state.progress.step
        failure = self._wait_for_pending()
        fresh = step != self.last_saved_step
        started = time.perf_counter()
        tmp_dir = self.root / layout.tmp_dir_name(step)
        if self.rank == 0 and fresh and failure is None:
            shutil.rmtree(tmp_dir, ignore_errors=True)
            try:
                tmp_dir.mkdir(parents=True)
            except OSError as err:
                failure = self._write_failure(tmp_dir, step, err)
        self._agree(failure)  # also the barrier: no rank writes before the directory exists
        if not fresh:
            return 0.0
        state_dict = {"train": state, _rng_key(self.rank): torch.get_rng_state()}
        rng_ranks = list(range(self.world_size))
        if mode == "sync":
            try:
                dcp.save(state_dict, checkpoint_id=tmp_dir, process_group=self.process_group)
                if self.rank == 0:
                    self._commit(tmp_dir, step, rng_ranks, started)
            except _WRITE_ERRORS as err:
                failure = self._write_failure(tmp_dir, step, err)
            self._agree(failure)  # only rank 0 commits: the others learn whether it did
        else:
            response = dcp.async_save(state_dict, checkpoint_id=tmp_dir,
                                      process_group=self.process_group, async_stager=self._stager)
            assert isinstance(response, AsyncSaveResponse)  # the stager copies in the background
            self._copying = response.staging_completion
            self._pending = self._executor.submit(self._finish_async, response.upload_completion,
                                                  tmp_dir, step, rng_ranks, started)
        blocked_s = time.perf_counter() - started
        self.last_saved_step = step
        self.run_log.event("checkpoint", step=step, mode=mode, reason=reason, blocked_s=blocked_s)
        return blocked_s

    def _wait_for_pending(self) -> UserError | None:
        """`wait`, returning an in-flight async save's write failure instead of raising it (its
        commit ran on rank 0 alone, so the other ranks learn of it only through `_agree`)."""
        try:
            self.wait()
        except UserError as failure:
            return failure
        return None

    def _agree(self, failure: UserError | None) -> None:
        """Collective: raise the same `UserError` on every rank if any rank's part of a save
        failed (`first_failure`); one one-element all-reduce when none did."""
        message = first_failure(failure, self.process_group)
        if message is None:
            return
        if failure is None:
            self.run_log.event("checkpoint_failed", error=message[:200])
        raise UserError(message) from failure

    def _finish_async(self, upload: Future, tmp_dir: Path, step: int, rng_ranks: list[int],
                      started: float) -> None:
        """Background half of an async save: wait for DCP's writes, then commit on rank 0."""
        try:
            upload.result()
            if self.rank == 0:
                self._commit(tmp_dir, step, rng_ranks, started)
        except _WRITE_ERRORS as err:
            raise self._write_failure(tmp_dir, step, err) from err

    def _write_failure(self, tmp_dir: Path, step: int, err: BaseException) -> UserError:
        """Remove what a failed save left (rank 0, or the emergency saver that wrote it) and say
        what to do; training on would only lose more work at the next failed save."""
        if self.rank == 0 or tmp_dir.name.endswith(f"-rank{self.rank}"):
            shutil.rmtree(tmp_dir, ignore_errors=True)
        self.run_log.event("checkpoint_failed", step=step, error=str(err)[:200])
        return UserError(
            f"--checkpoint-dir {self.root}: could not write the checkpoint of step {step} "
            f"({_first_cause(err)}); free space on its volume or pass a writable "
            "--checkpoint-dir, and the restart resumes from the newest committed checkpoint")

    def emergency_save(self, state: TrainState) -> Path:
        """Save this rank's replica alone (no collectives) after a peer died mid-step; return the
        committed checkpoint of `state.progress.step`.

        Only valid for DDP, where every rank holds the whole model and optimizer; the optimizer
        has not stepped since the failed all-reduce, so the state is exactly that of
        `state.progress.step`. The survivors of one machine (the processes of a worker) take
        turns (`_machine_lock`), and each first looks for a sibling's commit: one replica is
        written per surviving worker, not one per GPU at once (each a full copy in host memory
        and on the volume). Survivors on other workers race; the first commit wins. A save of
        this step that is not committed yet (an async one still writing, or one whose committing
        rank 0 died) does not count: its collectives may never complete.
        """
        step = state.progress.step
        final = self.root / layout.step_dir_name(step)
        with _machine_lock(self.root):
            if final.is_dir():
                return final
            started = time.perf_counter()
            tmp_dir = self.root / layout.tmp_dir_name(step, self.rank)
            shutil.rmtree(tmp_dir, ignore_errors=True)
            state_dict = {"train": state, _rng_key(self.rank): torch.get_rng_state()}
            try:
                tmp_dir.mkdir(parents=True)
                with warnings.catch_warnings():  # no_dist is the point, not a misconfiguration
                    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
                    dcp.save(state_dict, checkpoint_id=tmp_dir, no_dist=True)
                self._commit(tmp_dir, step, [self.rank], started)
            except _WRITE_ERRORS as err:
                raise self._write_failure(tmp_dir, step, err) from err
        self.last_saved_step = step
        self.run_log.event("checkpoint", step=step, mode="sync", reason="emergency",
                           blocked_s=time.perf_counter() - started)
        return final

    def restore(self, state: TrainState) -> layout.CheckpointInfo | None:
        """Load the newest checkpoint that verifies into `state` (collective); None if none.

        Rank 0 verifies and picks; the others follow its choice, so all ranks load the same step.
        Raises `UserError` instead when resuming or starting over would be wrong (`_refusal`).
        """
        choice: list[object] = [None, None]
        if self.rank == 0:
            try:
                info, problems = layout.latest_valid(self.root)
            except OSError as err:  # the others wait in the broadcast: send them the error
                choice = [None, f"--checkpoint-dir {self.root}: could not read its checkpoints "
                                f"({err.strerror or err}); make the volume readable and writable "
                                "by this process, or pass another --checkpoint-dir"]
            else:
                for problem in problems:
                    self.run_log.event("checkpoint_corrupt", problem=problem)
                    print(f"trainer: skipping bad checkpoint: {problem}", flush=True)
                choice = [info, self._refusal(info)]
        dist.broadcast_object_list(choice, src=0)
        info, error = choice
        if error is not None:
            raise UserError(str(error))
        if info is None:
            return None
        started = time.perf_counter()
        state_dict: dict[str, object] = {"train": state}
        rng_key = _rng_key(self.rank)
        if self.rank in info.rng_ranks:
            state_dict[rng_key] = torch.get_rng_state()
        dcp.load(state_dict, checkpoint_id=info.path, process_group=self.process_group)
        if rng_key in state_dict:
            torch.set_rng_state(state_dict[rng_key])
        self.last_saved_step = info.step
        self.run_log.event("resume", step=info.step, path=str(info.path),
                           saved_world_size=info.world_size, world_size=self.world_size,
                           restore_s=time.perf_counter() - started)
        return info

    def _refusal(self, info: layout.CheckpointInfo | None) -> str | None:
        """Why this run must neither resume from `info` nor start over (None: go ahead).

        With no valid checkpoint but quarantined ones, starting over would silently throw the
        job's progress away, on this start and on every restart after it, so the refusal holds
        until a person has looked at them. A checkpoint written with other data settings (see
        `config.RESUME_FIXED_SETTINGS`) holds a data position that means nothing to this run.
        """
        if info is None:
            quarantined = layout.quarantined_dirs(self.root)
            if not quarantined:
                return None
            return (f"no valid checkpoint in {self.root} ({len(quarantined)} corrupt, moved to "
                    "*.corrupt); inspect them, then move them out of the directory to start "
                    "over, or pass a new --checkpoint-dir")
        conflicts = resume_conflicts(info.config, self.config)
        if not conflicts:
            return None
        return (f"{info.path} was written with {', '.join(conflicts)}; resuming would change "
                "the data order or the training run: pass the checkpoint's values or a new "
                "--checkpoint-dir")

    def close(self) -> None:
        """Finish any in-flight save and stop the background thread."""
        self.wait()
        self._executor.shutdown()
        self._stager.close()
