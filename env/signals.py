"""Look-ahead signals in the observation: the demand forecast and the node-failure risk.

The simulator calls two plain functions and knows nothing of the models behind them:

- ``demand_forecast(history, minute_of_day) -> 3 values``: demand 5, 15 and 60 minutes ahead
  from per-minute demand whose last sample is at `minute_of_day`;
- ``node_risk(now, earlier) -> risk per node``: from node telemetry features now and
  `Signals.risk_lag_s` earlier.
 `load_signals` builds them from the shipped models in ``models/``; the
forecaster package is imported only then, so the simulator core stays free of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from env.errors import UserError

SIGNAL_KINDS = ("none", "standin", "lstm")
"""none: zeros; standin: the EWMA stand-in (microseconds, the default for simulation);
lstm: the LSTM itself (milliseconds per forecast; see docs/forecaster.md for the comparison)."""


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


def load_signals(kind: str = "standin") -> Signals:
    """Signals from the shipped forecaster (`kind`) and the shipped risk model."""
    if kind not in SIGNAL_KINDS:
        raise UserError(f"signals {kind!r}: use one of {', '.join(SIGNAL_KINDS)}")
    if kind == "none":
        return NO_SIGNALS
    import forecaster

    try:
        model = (forecaster.load_standin() if kind == "standin"
                 else forecaster.load_demand_forecaster())
        risk = forecaster.load_risk_model()
    except FileNotFoundError as err:  # an install without the checkout's models/ directory
        raise UserError(f"signals {kind!r}: the shipped model file {err.filename} is missing; "
                        "install rlalloc from its checkout with `pip install -e .`, which keeps "
                        "models/ beside the code") from err
    needed = int(model.min_history_min)

    def demand_forecast(history: np.ndarray, minute_of_day: int) -> np.ndarray:
        # early in a run the history is short: pad with its oldest value (a flat past)
        if len(history) < needed:
            history = np.concatenate([np.full(needed - len(history), history[0]), history])
        return np.clip(model.predict(history, minute_of_day), 0.0, None)

    return Signals(demand_forecast=demand_forecast, node_risk=risk.predict_proba,
                   history_min=needed, risk_lag_s=risk.config.lag_steps * risk.config.step_s)
