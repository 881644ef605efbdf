"""The in-memory copy an asynchronous checkpoint makes while training goes on.

An async checkpoint must copy the state before anything modifies it; everything after the copy
(serialising, writing, committing) runs in the background anyway. Two things make that copy
cheap here. It runs on a thread of its own while the next step's forward and backward pass run:
those only read the model and optimizer state, and the trainer waits for the copy
(`Checkpointer.before_update`) before its optimizer step writes them. And it goes into buffers
kept from the previous save: DCP's `DefaultStager` without pinned memory (there is no
accelerator here) allocates a fresh copy every time, and a fresh 250 MB copy page-faults its way
into memory at several times the cost of copying into memory already mapped.

Reusing buffers is safe only because a new save never starts before the previous one is on
disk (`Checkpointer.save` waits for it first).
"""

from __future__ import annotations

import copy
from concurrent.futures import Future, ThreadPoolExecutor

import torch
from torch.distributed.checkpoint.staging import AsyncStager, DefaultStager, StagingOptions

_Path = tuple[object, ...]


class _NotPlain(Exception):
    """The state dict holds a tensor subclass (DTensor under FSDP): not ours to copy."""


class ReusingStager(AsyncStager):
    """Copies plain tensors, on a background thread, into buffers kept from the previous call;
    a state holding tensor subclasses (sharded FSDP state) is copied by DCP's own
    `DefaultStager` on that thread instead."""

    _synchronize_after_execute = False
    """The caller waits on the future `stage` returns (DCP's `staging_completion`)."""

    def __init__(self) -> None:
        self._buffers: dict[_Path, torch.Tensor] = {}
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-copy")
        self._fallback = DefaultStager(StagingOptions(use_pinned_memory=False,
                                                      use_shared_memory=False,
                                                      use_async_staging=False,
                                                      use_non_blocking_copy=False))

    def stage(self, state_dict: dict[str, object]) -> Future:
        """Start copying `state_dict` to CPU; the future holds the copy. Nothing may modify the
        state's tensors until it is done."""
        return self._thread.submit(self._stage_now, state_dict)

    def _stage_now(self, state_dict: dict[str, object]) -> dict[str, object]:
        try:
            return self._copy(state_dict, ())
        except _NotPlain:
            return self._fallback.stage(state_dict)

    def _copy(self, value: object, path: _Path) -> object:
        if isinstance(value, torch.Tensor):
            if type(value) is not torch.Tensor:
                raise _NotPlain(path)
            buffer = self._buffers.get(path)
            if buffer is None or buffer.shape != value.shape or buffer.dtype != value.dtype:
                buffer = self._buffers[path] = torch.empty_like(value, device="cpu")
            return buffer.copy_(value)
        if isinstance(value, dict):
            return {key: self._copy(item, (*path, key)) for key, item in value.items()}
        if type(value) in (list, tuple):
            return type(value)(self._copy(item, (*path, i)) for i, item in enumerate(value))
        return copy.deepcopy(value)

    def close(self) -> None:
        """Finish a copy in progress and release the buffers (and the fallback's)."""
        self._thread.shutdown()
        self._buffers.clear()
        self._fallback.close()
