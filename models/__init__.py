"""The models rlalloc ships (policies, demand forecaster, failure-risk model), as package data.

Each is a folder with its card; `shipped(name)` is where an installed rlalloc finds it.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def shipped(name: str) -> Path:
    """The folder of the shipped model `name` (``ppo``, ``dqn``, ``forecaster``, ``risk``).

    Wheels install unpacked, so the package's resources are plain files on disk."""
    return Path(str(files(__name__) / name))
