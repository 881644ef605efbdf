"""rlalloc's GPU-cluster simulator and the contract it shares with the actuator.

`rlalloc.env.state` (the `ClusterState` both worlds build), `errors` and `output` are the bottom
layer; the simulator and its Gymnasium environment (`rlalloc.env.gym_env`, which registers
``rlalloc/ClusterAlloc-v0`` when imported) sit above them. Importing this package imports
neither gymnasium nor the simulator.
"""
