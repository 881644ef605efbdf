"""The in-memory copy an asynchronous checkpoint makes before training goes on.

`dcp.async_save` blocks the training loop exactly as long as its stager takes to copy the state
dict; everything after that runs in the background. DCP's `DefaultStager` without pinned memory
(there is no accelerator here) allocates a fresh copy every time, and a fresh 250 MB copy
page-faults its way into memory at several times the cost of copying into memory that is
already mapped; its generic object walk adds more. `ReusingStager` keeps one CPU buffer per
tensor of the state dict and copies into it with `Tensor.copy_`, so from the second checkpoint
on the stall is little more than a memcpy.

Reusing buffers is safe only because a new save never starts before the previous one is on
disk (`Checkpointer.save` waits for it first).
"""

from __future__ import annotations

import copy
from concurrent.futures import Future

import torch
from torch.distributed.checkpoint.staging import AsyncStager, DefaultStager, StagingOptions

_Path = tuple[object, ...]


class _NotPlain(Exception):
    """The state dict holds a tensor subclass (DTensor under FSDP): not ours to copy."""


class ReusingStager(AsyncStager):
    """Copies plain tensors into buffers kept from the previous call; anything holding tensor
    subclasses (sharded FSDP state) is staged by DCP's own `DefaultStager` instead."""

    _synchronize_after_execute = False
    """`stage` returns a finished copy: there is nothing to wait for afterwards."""

    def __init__(self) -> None:
        self._buffers: dict[_Path, torch.Tensor] = {}
        self._fallback = DefaultStager(StagingOptions(use_pinned_memory=False,
                                                      use_shared_memory=False,
                                                      use_async_staging=False,
                                                      use_non_blocking_copy=False))

    def stage(self, state_dict: dict[str, object]) -> dict[str, object] | Future:
        """A copy of `state_dict` on CPU that later training steps cannot change."""
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
        """Release the buffers (and the fallback's)."""
        self._buffers.clear()
        self._fallback.close()
