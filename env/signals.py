"""Look-ahead signals in the observation: the demand forecast and the node-failure risk.

The simulator calls two plain functions and knows nothing of the models behind them:

- ``demand_forecast(history, minute_of_day) -> 3 values``: demand 5, 15 and 60 minutes ahead
  from per-minute demand whose last sample is at `minute_of_day`;
- ``node_risk(now, earlier) -> risk per node``: from node telemetry features now and
  `Signals.risk_lag_s` earlier.

The simulator is handed a `Signals`; `rlalloc.forecaster.signals.load_signals` builds one from
the shipped models (the forecaster sits above the simulator, so the simulator never imports it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

SIGNAL_KINDS = ("none", "standin", "lstm")
"""none: zeros; standin: the EWMA stand-in (microseconds); lstm: the LSTM itself (milliseconds
per forecast; see docs/forecaster.md for the comparison)."""
DEFAULT_SIGNALS = "standin"
"""The kind the commands, training and the actuator load unless told otherwise. A `Simulator`,
scenario or `ClusterAllocEnv` built directly has none unless handed some."""


@dataclass(frozen=True)
class Signals:
    """The two look-ahead functions a simulator feeds into its `ClusterState`s."""

    demand_forecast: Callable[[np.ndarray, int], np.ndarray] | None = None
    node_risk: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None
    history_min: int = 0
    """Per-minute demand samples `demand_forecast` wants (older ones are not kept)."""
    risk_lag_s: float = 600.0
    """How far back `node_risk`'s ``earlier`` features are taken."""


NO_SIGNALS = Signals()
