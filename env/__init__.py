"""rlalloc's GPU-cluster simulator and its Gymnasium environment.

Importing `env` registers ``rlalloc/ClusterAlloc-v0`` (the class is imported only when made).
"""

import gymnasium

ENV_ID = "rlalloc/ClusterAlloc-v0"

if ENV_ID not in gymnasium.registry:
    gymnasium.register(id=ENV_ID, entry_point="env.gym_env:ClusterAllocEnv")
