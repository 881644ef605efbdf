"""One-step lookahead over heuristics: how much a policy that picks between them could gain.

Residual PPO (`agent.residual`) never learnt to deviate from its starting heuristic. That is
only a failure of learning if there is something to learn. This module measures it. At every
decision where the heuristics propose different actions, `LookaheadPolicy` forks the
simulator once per distinct proposal, applies it, lets the base heuristic run the fork to the
end, and takes the proposal whose fork has the least remaining job-time (the integral of
jobs in the system, i.e. the rest of the total JCT). This is the rollout algorithm of
approximate dynamic programming: with a deterministic simulator and the future known it
improves on its base (the cost-improvement property; it did on every Pollux workload
measured), and its gain estimates what "which heuristic to follow when" is worth.

What the forks know of the future is `arrivals_known_s`: the arrivals of the next that many
seconds. ``inf`` (future "known") is an oracle, an upper bound and not a policy a cluster could
run; ``0`` (future "none") is all a live controller knows, the jobs already submitted; in
between, the exact jobs (size and length) arriving within the horizon: more than a demand
forecast over it could tell, so an upper bound on such a forecast's value. The gaps between
them are the value of knowing the arrivals. The policy needs the simulator it runs in, so it is a
measurement tool for `rlalloc headroom`, not a `Policy` the actuator could load.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from agent.policy import Policy
from env.simulator import Simulator
from env.state import NOOP, Action, ActionKind, ClusterState

FUTURE_WORDS = {"known": math.inf, "none": 0.0}
"""Named futures; any other is a horizon such as ``1h`` or ``30m``."""


def parse_future(text: str) -> float:
    """Seconds of arrivals a fork knows, from ``known``, ``none`` or ``<N>h`` / ``<N>m``
    (ValueError otherwise)."""
    if text in FUTURE_WORDS:
        return FUTURE_WORDS[text]
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([hm])", text)
    if not match:
        raise ValueError(text)
    return float(match[1]) * (3600.0 if match[2] == "h" else 60.0)


def cost_to_go(sim: Simulator, policy: Policy, stop_deciding: bool = False) -> float:
    """Job-seconds still to be spent in the system when `policy` runs `sim` to the end (the
    end of the known jobs, for a fork without future arrivals), from the current instant.

    `stop_deciding` first ends the current decision point without further actions: the
    continuation of a veto. The simulator stops at every event, so the number of jobs in the
    system is constant over each `advance` and the integral is exact.
    """
    cost = 0.0
    ask = not stop_deciding
    while not sim.done and (sim.jobs_in_system or sim.has_pending_arrivals):
        if ask:
            for _ in range(sim.params.max_actions_per_decision):
                action = policy.act(sim.state())
                if action.kind == ActionKind.NOOP or not sim.apply(action):
                    break
        ask = True
        jobs = sim.jobs_in_system
        cost += jobs * sim.advance()
    return cost


class LookaheadPolicy:
    """The rollout policy over `base` and `alternatives` in the simulator `sim` it decides for
    (see the module docstring). Counts the decisions where proposals differed (`contested`)
    and those where it did not follow `base` (`deviations`)."""

    def __init__(self, sim: Simulator, base: Policy, alternatives: Sequence[Policy],
                 arrivals_known_s: float) -> None:
        self.sim = sim
        self.base = base
        self.alternatives = tuple(alternatives)
        self.arrivals_known_s = arrivals_known_s
        self.name = "lookahead"
        self.contested = 0
        self.deviations = 0

    def act(self, state: ClusterState) -> Action:
        """The proposal whose fork ends with the least job-time; the base's on ties."""
        base_action = self.base.act(state)
        candidates = list(dict.fromkeys([base_action,
                                         *(policy.act(state) for policy in self.alternatives)]))
        if len(candidates) == 1:
            return base_action
        self.contested += 1
        best_action, best_cost = base_action, self._cost(base_action)
        for action in candidates[1:]:
            cost = self._cost(action)
            if cost < best_cost - 1e-6:
                best_action, best_cost = action, cost
        self.deviations += best_action != base_action
        return best_action

    def _cost(self, action: Action) -> float:
        fork = self.sim.fork(self.arrivals_known_s)
        if action == NOOP:
            return cost_to_go(fork, self.base, stop_deciding=True)
        applied = fork.apply(action)
        assert applied, (action, fork.validate(action))
        return cost_to_go(fork, self.base)
