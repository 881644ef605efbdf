"""The files of a saved trained model's directory (`rlalloc.agent.deployed` writes and loads them).

Named apart from `rlalloc.agent.deployed`, which imports torch, so that recognising a saved model
among the other saved policies (`rlalloc.agent.registry`) imports none.
"""

from __future__ import annotations

META_FILE = "policy.json"
"""A saved model's metadata (`ExportMeta`): the file that makes a directory a trained model."""
WEIGHTS_FILE = "policy.pt"
"""A saved model's weights (the ``state_dict`` of `PolicyNet`)."""
