"""The simulator's snapshot parts whose costly columns are computed only when a policy reads them.

Replaying the 82k-job Philly trace hands out hundreds of thousands of states, and a heuristic
like static FIFO never reads progress, attained service or time since checkpoint. Those columns
are derived from per-allocation inputs (captured when the snapshot is taken, so later simulation
cannot change them) and the snapshot time, on first access, then cached; node utilisation and
temperature and the demand forecast likewise. Everything else about the objects is a plain
`Jobs`, `Nodes` and `Demand`: `lazy` builds the deferred form, and the constructor takes every
field, as `dataclasses.replace` passes them (the guardrails replace columns of a state).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property

import numpy as np

from rlalloc.env.state import Demand, Jobs, JobStatus, Nodes

_QUEUED, _RUNNING = int(JobStatus.QUEUED), int(JobStatus.RUNNING)


class SnapshotJobs(Jobs):
    """`Jobs` whose progress, attained service, run time, throughput and time since the last
    checkpoint are computed from `inputs` (arrays frozen at snapshot time) when one of them is
    first read, all five together (they share their intermediate arrays)."""

    def __init__(self, **columns: object) -> None:
        """Every column given: nothing left to compute."""
        self.__dict__.update(columns)

    @classmethod
    def lazy(cls, columns: dict[str, object], inputs: dict[str, np.ndarray], time_s: float,
             checkpoint_interval_s: float) -> SnapshotJobs:
        """The jobs of `columns`, the time-dependent ones computed from `inputs` when read."""
        jobs = cls(**columns)
        jobs.__dict__.update(_inputs=inputs, _time_s=time_s, _interval_s=checkpoint_interval_s)
        return jobs

    def __getattr__(self, name: str) -> np.ndarray:
        # Python calls this only for attributes not set yet: here, the time-dependent columns
        if name not in _TIME_COLUMNS:
            raise AttributeError(name)
        inputs, t = self._inputs, self._time_s
        running = self.status == _RUNNING
        busy_since = np.where(running, t - inputs["busy_from"], 0.0)
        held = np.where(self.status != _QUEUED, t - inputs["anchor"], 0.0)
        done = inputs["done"] + inputs["rate"] * busy_since
        columns = {
            "throughput": np.where(running, inputs["rate"], 0.0).astype(np.float32),
            "progress": np.minimum(done / inputs["work"], 1.0).astype(np.float32),
            "attained_gpu_s": inputs["attained"] + self.workers * self.gpus_per_worker * held,
            "run_s": inputs["run_s"] + held,
            "since_checkpoint_s": np.mod(busy_since, self._interval_s).astype(np.float32),
        }
        self.__dict__.update(columns)
        return columns[name]


_TIME_COLUMNS = frozenset({"throughput", "progress", "attained_gpu_s", "run_s",
                           "since_checkpoint_s"})


class SnapshotNodes(Nodes):
    """`Nodes` whose utilisation and temperature are computed when first read: telemetry
    exporters read them, the policies do not, and allocations (which change both) happen at
    nearly every environment step."""

    def __init__(self, **columns: object) -> None:
        """Every column given: nothing left to compute."""
        self.__dict__.update(columns)

    @classmethod
    def lazy(cls, columns: dict[str, object], temperature: tuple[float, float],
             temperature_excess: np.ndarray | float) -> SnapshotNodes:
        """The nodes of `columns`, utilisation and temperature computed when read."""
        nodes = cls(**columns)
        nodes.__dict__.update(_temperature=temperature, _temperature_excess=temperature_excess)
        return nodes

    def __getattr__(self, name: str) -> np.ndarray:
        # Python calls this only for attributes not set yet: here, utilisation and temperature
        if name not in ("gpu_util", "temperature_c"):
            raise AttributeError(name)
        util = np.where(self.ready, 1.0 - self.gpus_free / self.gpus_total, 0.0)
        base_c, busy_rise_c = self._temperature
        temperature = base_c + busy_rise_c * util + self._temperature_excess
        self.__dict__.update(gpu_util=util.astype(np.float32),
                             temperature_c=temperature.astype(np.float32))
        return self.__dict__[name]


class SnapshotDemand(Demand):
    """`Demand` whose forecast is computed by `forecast()` on first access."""

    def __init__(self, **fields: object) -> None:
        """Every field given, the forecast included."""
        self.__dict__.update(fields)

    @classmethod
    def lazy(cls, pending_gpus: int, arrivals_1h: int,
             forecast: Callable[[], tuple[float, float, float]]) -> SnapshotDemand:
        """Demand whose forecast `forecast()` gives when first read."""
        demand = cls(pending_gpus=pending_gpus, arrivals_1h=arrivals_1h)
        demand.__dict__["_forecast"] = forecast
        return demand

    @cached_property
    def forecast_gpus(self) -> tuple[float, float, float]:
        return self._forecast()
