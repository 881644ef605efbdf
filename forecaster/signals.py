"""The simulator's look-ahead signals built from the shipped forecaster and risk model.

The demand signal is a point forecast: the stand-in's, or the LSTM's median. A policy that
wants the LSTM's quantiles loads it itself (`rlalloc.forecaster.model.load_demand_forecaster`,
whose `predict` returns them all).
"""

from __future__ import annotations

import functools

import numpy as np

from rlalloc.env.errors import UserError
from rlalloc.env.signals import DEFAULT_SIGNALS, NO_SIGNALS, SIGNAL_KINDS, Signals
from rlalloc.forecaster.risk import load_risk_model
from rlalloc.forecaster.standin import load_standin


@functools.cache
def load_signals(kind: str = DEFAULT_SIGNALS) -> Signals:
    """Signals from the shipped forecaster (`kind`) and the shipped risk model, loaded once per
    process whatever the number of scenarios."""
    if kind not in SIGNAL_KINDS:
        raise UserError(f"signals {kind!r}: use one of {', '.join(SIGNAL_KINDS)}")
    if kind == "none":
        return NO_SIGNALS
    try:
        if kind == "standin":
            model = load_standin()
            point_forecast = model.predict
        else:  # torch is imported only for the LSTM itself
            from rlalloc.forecaster.model import load_demand_forecaster

            model = load_demand_forecaster()
            median = model.median_index

            def point_forecast(history: np.ndarray, minute_of_day: int) -> np.ndarray:
                return model.predict(history, minute_of_day)[:, median]
        risk = load_risk_model()
    except FileNotFoundError as err:  # a damaged install
        raise UserError(f"signals {kind!r}: the shipped model file {err.filename} is missing; "
                        "reinstall rlalloc, or use signals none") from err
    needed = int(model.min_history_min)

    def demand_forecast(history: np.ndarray, minute_of_day: int) -> np.ndarray:
        # early in a run the history is short: pad with its oldest value (a flat past)
        if len(history) < needed:
            history = np.concatenate([np.full(needed - len(history), history[0]), history])
        return np.clip(point_forecast(history, minute_of_day), 0.0, None)

    return Signals(demand_forecast=demand_forecast, node_risk=risk.predict_proba,
                   history_min=needed, risk_lag_s=risk.config.lag_steps * risk.config.step_s)


def default_signals() -> Signals:
    """`load_signals` of `DEFAULT_SIGNALS`: what the commands hand every simulation."""
    return load_signals(DEFAULT_SIGNALS)
