"""Generated training data and the global-batch sampler that makes restarts lossless.

Nothing is downloaded: sample `i` of the data set is a pure function of (seed, i), an arithmetic
progression of token ids modulo the vocabulary whose start and stride come from a hash of `i`.
A model learns to continue it, so the loss falls quickly and a restart that lost its weights
would be visible as a jump back to ln(vocab_size).

Data order is the part that must survive restarts and world-size changes. Each epoch is one
deterministic permutation of all sample indices (seeded by seed and epoch). The position in the
data is a *global* sample offset into that permutation; step `s` consumes the `global_batch`
indices after the offset, and each rank takes a contiguous slice of them. Because neither the
permutation nor the global batch depends on the world size, a job that resumes with any number
of workers continues at exactly the next unseen sample: nothing skipped, nothing repeated.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_MASK64 = (1 << 64) - 1
_MAX_STRIDE = 7


@dataclass(frozen=True)
class DataPosition:
    """Where the job is in its data stream; stored in every checkpoint."""

    epoch: int
    """Epochs completed before the current one."""
    sample_offset: int
    """Global offset into the current epoch's permutation of the next unseen sample."""


def _splitmix64(value: int) -> int:
    """A well-mixed 64-bit hash, so neighbouring sample indices get unrelated sequences."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def sample_tokens(indices: list[int], seed: int, seq_len: int, vocab_size: int) -> torch.Tensor:
    """Token ids (len(indices), seq_len + 1) of the given samples: inputs plus shifted targets."""
    starts, strides = [], []
    for index in indices:
        mixed = _splitmix64((seed << 40) ^ index)
        starts.append(mixed % vocab_size)
        strides.append(1 + (mixed >> 32) % _MAX_STRIDE)
    steps = torch.arange(seq_len + 1, dtype=torch.int64)
    start = torch.tensor(starts, dtype=torch.int64).unsqueeze(1)
    stride = torch.tensor(strides, dtype=torch.int64).unsqueeze(1)
    return (start + stride * steps) % vocab_size


def rank_slice(global_indices: list[int], rank: int, world_size: int) -> list[int]:
    """This rank's contiguous share of the global batch; shares differ in size by at most one."""
    base, extra = divmod(len(global_indices), world_size)
    begin = rank * base + min(rank, extra)
    return global_indices[begin : begin + base + (1 if rank < extra else 0)]


class GlobalBatchSampler:
    """Yields the global batch for a data position, independent of the world size.

    An epoch has `num_samples // global_batch` steps; the last `num_samples % global_batch`
    samples of each permutation are dropped (like `drop_last`), so every step sees a full batch.
    """

    def __init__(self, num_samples: int, global_batch: int, seed: int) -> None:
        if global_batch > num_samples:
            raise ValueError(f"global batch {global_batch} exceeds the {num_samples} samples")
        self.num_samples = num_samples
        self.global_batch = global_batch
        self.seed = seed
        self._cached_epoch = -1
        self._permutation: list[int] = []

    def permutation(self, epoch: int) -> list[int]:
        """The epoch's order of sample indices (cached: one epoch is in use at a time)."""
        if epoch != self._cached_epoch:
            generator = torch.Generator().manual_seed(_splitmix64(self.seed * 1_000_003 + epoch))
            self._permutation = torch.randperm(self.num_samples, generator=generator).tolist()
            self._cached_epoch = epoch
        return self._permutation

    def global_batch_indices(self, position: DataPosition) -> list[int]:
        """Sample indices of the global batch that starts at `position`."""
        offset = position.sample_offset
        return self.permutation(position.epoch)[offset : offset + self.global_batch]

    def advance(self, position: DataPosition) -> DataPosition:
        """The position after one global batch, rolling into the next epoch before a short batch."""
        offset = position.sample_offset + self.global_batch
        if offset + self.global_batch > self.num_samples:
            return DataPosition(epoch=position.epoch + 1, sample_offset=0)
        return DataPosition(epoch=position.epoch, sample_offset=offset)
