"""The simulator's snapshot parts whose costly columns are computed only when a policy reads them.

Replaying the 82k-job Philly trace hands out hundreds of thousands of states, and a heuristic
like static FIFO never reads progress, attained service or time since checkpoint. Those columns
are derived from per-allocation inputs (captured when the snapshot is taken, so later simulation
cannot change them) and the snapshot time, on first access, then cached; the demand forecast
likewise. Everything else about the objects is a plain `Jobs` and `Demand`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property

import numpy as np

from env.state import Demand, Jobs, JobStatus

_QUEUED, _RUNNING = int(JobStatus.QUEUED), int(JobStatus.RUNNING)


class SnapshotJobs(Jobs):
    """`Jobs` whose progress, attained service, run time, throughput and time since the last
    checkpoint are computed lazily from `inputs` (arrays frozen at snapshot time)."""

    def __init__(self, columns: dict[str, object], inputs: dict[str, np.ndarray], time_s: float,
                 checkpoint_interval_s: float) -> None:
        for name, value in columns.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_inputs", inputs)
        object.__setattr__(self, "_time_s", time_s)
        object.__setattr__(self, "_interval_s", checkpoint_interval_s)

    @cached_property
    def _busy_since(self) -> np.ndarray:
        return np.where(self.status == _RUNNING, self._time_s - self._inputs["busy_from"], 0.0)

    @cached_property
    def _held(self) -> np.ndarray:
        return np.where(self.status != _QUEUED, self._time_s - self._inputs["anchor"], 0.0)

    @cached_property
    def throughput(self) -> np.ndarray:
        return np.where(self.status == _RUNNING, self._inputs["rate"], 0.0).astype(np.float32)

    @cached_property
    def progress(self) -> np.ndarray:
        inputs = self._inputs
        done = inputs["done"] + inputs["rate"] * self._busy_since
        return np.minimum(done / inputs["work"], 1.0).astype(np.float32)

    @cached_property
    def attained_gpu_s(self) -> np.ndarray:
        return self._inputs["attained"] + self.workers * self._held

    @cached_property
    def run_s(self) -> np.ndarray:
        return self._inputs["run_s"] + self._held

    @cached_property
    def since_checkpoint_s(self) -> np.ndarray:
        return np.mod(self._busy_since, self._interval_s).astype(np.float32)


class SnapshotDemand(Demand):
    """`Demand` whose forecast is computed by `forecast()` on first access."""

    def __init__(self, pending_gpus: int, arrivals_1h: int,
                 forecast: Callable[[], tuple[float, float, float]]) -> None:
        object.__setattr__(self, "pending_gpus", pending_gpus)
        object.__setattr__(self, "arrivals_1h", arrivals_1h)
        object.__setattr__(self, "_forecast", forecast)

    @cached_property
    def forecast_gpus(self) -> tuple[float, float, float]:
        return self._forecast()
