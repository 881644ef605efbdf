"""Demand forecasting and node-failure risk for the allocator.

`rlalloc.forecaster.signals.load_signals` turns the shipped models into the look-ahead signals
the simulator and the actuator put into `ClusterState`; `model` (the LSTM, torch), `standin`
(its EWMA stand-in) and `risk` (the node-failure risk model) load one model each.
Demand is (running + pending GPUs) / total GPUs; see `rlalloc.forecaster.series`.
"""
