"""The one interface every allocator implements: `ClusterState` in, `Action` out.

Heuristics and learned policies both satisfy `Policy`, so the simulator, `rlalloc evaluate` and
the in-cluster actuator run any of them by name (see `rlalloc.agent.registry.load_policy`). A
policy is asked repeatedly at one decision point (the simulator re-asks after every applied
action, until the policy answers no-op), so it should be a function of the state alone: it
proposes the single most useful change now and trusts to be asked again. A policy that
remembers between calls, as Gavel's and Sia's round-based schedulers do, says so
(`remembers = True`), and a run in a forked simulator gets its own copy (`for_a_fork`).
"""

from __future__ import annotations

import copy
from typing import Protocol, runtime_checkable

from rlalloc.env.state import Action, ClusterState


@runtime_checkable
class Policy(Protocol):
    """An allocation policy: `act` returns the next action for `state` (NOOP: nothing to do)."""

    name: str
    """Short name used in reports and by `load_policy`."""

    def act(self, state: ClusterState) -> Action:
        """The next action to take in `state`; must not modify the state's arrays."""
        ...


def for_a_fork(policy: Policy) -> Policy:
    """`policy` to run in a fork of the simulator it decides in: a copy if it remembers
    between calls (what it learns in the fork must not leak into the real run), else itself."""
    return copy.deepcopy(policy) if getattr(policy, "remembers", False) else policy
