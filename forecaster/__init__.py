"""Demand forecasting and node-failure risk for the allocator.

Public entry points (imported lazily so that `import forecaster` does not load torch):

* `load_demand_forecaster(path=None)`: the LSTM forecaster (default: models/forecaster);
* `load_standin(path=None)`: its cheap EWMA stand-in with the same `predict`;
* `load_risk_model(path=None)`: the node-failure risk model (default: models/risk).

Demand is (running + pending GPUs) / total GPUs; see `forecaster.series`.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "load_demand_forecaster": "forecaster.model",
    "load_standin": "forecaster.standin",
    "load_risk_model": "forecaster.risk",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import the module behind a public name on first use."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'forecaster' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
