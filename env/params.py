"""Every tunable assumption of the simulator, with its default and where the default comes from.

Saved next to every result and trained model (`dataclasses.asdict`), so a run can be repeated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlalloc.env.failures import FailureParams

GPU_POWER_W: dict[str, tuple[float, float]] = {
    "T4": (10.0, 70.0),
    "V100": (40.0, 300.0),
    "A100": (50.0, 400.0),
    "H100": (70.0, 700.0),
    "RTX2080Ti": (20.0, 250.0),
    "RTX6000": (20.0, 295.0),
}
"""(idle, busy) watts per GPU type: busy = board power limit from NVIDIA's datasheets (T4 70 W,
V100 SXM2 300 W, A100 SXM 400 W, H100 SXM 700 W, GeForce RTX 2080 Ti 250 W, Quadro RTX 6000
295 W); idle = typical nvidia-smi idle draw."""
DEFAULT_GPU_POWER_W = (50.0, 400.0)


@dataclass(frozen=True, slots=True)
class SimParams:
    """Simulator parameters (see docs/simulator.md for the sources)."""

    checkpoint_interval_s: float = 1800.0
    """Training time between periodic checkpoints (30 min, a common default; a failure loses
    at most this much work)."""
    checkpoint_stall_s: float = 0.0
    """Training time lost to each periodic checkpoint (async checkpoints make it ~0; see
    `rlalloc bench recovery` for measured figures)."""
    first_start_restore: bool = False
    """Whether a job's very first start pays its restore time (it has no checkpoint yet)."""
    decision_interval_s: float = 300.0
    """A policy is asked at every event (arrival, completion, failure, warning) and at least
    this often, so it can re-balance."""
    max_actions_per_decision: int = 32
    """Actions a policy may take at one decision point before time moves on."""
    failures: FailureParams = field(default_factory=FailureParams)
    base_temperature_c: float = 35.0
    busy_temperature_rise_c: float = 40.0
    """GPU temperature = base + rise * utilisation (plus a warning episode's excess)."""
    series_interval_s: float = 60.0
    """Sampling interval of the utilisation/queue time series kept for plots."""
