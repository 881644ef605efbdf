"""rlalloc: reinforcement-learning GPU allocation for distributed training jobs on Kubernetes.

Layers, lowest first (enforced by import-linter, see `.importlinter`): the contract every
world shares (`rlalloc.env.state`, `.errors`, `.output`); the simulator (`rlalloc.env`); the
forecaster; the agent, the actuator and the trainer jobs; the command line (`rlalloc.cli`).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rlalloc")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
