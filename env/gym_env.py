"""`rlalloc/ClusterAlloc-v0`: the simulator as a Gymnasium environment.

Importing this module registers the id, so ``gymnasium.make("rlalloc.env.gym_env:rlalloc/
ClusterAlloc-v0")`` works without an import of ours first (Gymnasium's ``module:id`` form).

One step = one decision. The action (see `rlalloc.env.featurizer` for the layout) is applied at the
current decision point; after a no-op, an invalid action, or `max_actions_per_decision`
actions, the simulator advances to the next decision point (next event or periodic tick).

Reward (the design sketch's): minus the number of jobs in the system integrated over the time
that passed, in job-hours, so the episode return is minus the total JCT / 3600 and maximising
it minimises average JCT; minus `lost_gpu_weight` per GPU-hour lost to failures; minus
`energy_weight` per kWh. Invalid actions (possible only when the mask is ignored, e.g. DQN)
are no-ops and are counted in ``info["invalid_actions"]``.

Discounting: a learner's per-step gamma pays for extra zero-time actions (each one pushes the
negative rewards one more step away), so the environment can instead discount by simulated
time (semi-MDP, `RewardWeights.time_discount_s`); see `ClusterAllocEnv.step`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from rlalloc.env.featurizer import OBS_BOUND, FeatureSpec, Featurizer
from rlalloc.env.params import SimParams
from rlalloc.env.scenario import Scenario, build_scenario
from rlalloc.env.signals import NO_SIGNALS, Signals
from rlalloc.env.state import ActionKind
from rlalloc.env.workload.loader import EMBEDDED_DEFAULT

_NOOP = ActionKind.NOOP

ENV_ID = "rlalloc/ClusterAlloc-v0"


@dataclass(frozen=True, slots=True)
class RewardWeights:
    """Weights of the reward terms (per unit of each quantity) and their discounting."""

    jobs_weight: float = 1.0
    """Per job-hour in the system (makes the return track total JCT)."""
    lost_gpu_weight: float = 1.0
    """Per GPU-hour of work lost to failures."""
    energy_weight: float = 0.0
    """Per kWh of GPU energy (0: energy is reported, not optimised, by default)."""
    time_discount_s: float = 0.0
    """Time constant T of a semi-MDP discount exp(-t/T) over simulated seconds; 0: off (the
    reward is undiscounted and the learner's per-step gamma applies). With T > 0 each step's
    reward is its cost discounted from the step's start, and ``info["discount"]`` is
    exp(-elapsed/T), the factor to apply to the next step's return in place of a per-step
    gamma. A zero-time step (an action at a decision point) then has discount 1: extra
    actions neither defer costs nor are penalised."""


class ClusterAllocEnv(gym.Env):
    """Allocation of GPUs to elastic training jobs; see the module docstring."""

    metadata = {"render_modes": []}

    def __init__(self, workloads: Sequence[str | Scenario] = (EMBEDDED_DEFAULT,),
                 cluster: str = "16x4", params: SimParams | None = None,
                 features: FeatureSpec | None = None, reward: RewardWeights | None = None,
                 max_episode_steps: int = 50_000, efficiency: str = "none",
                 signals: Signals = NO_SIGNALS) -> None:
        self.params = params or SimParams()
        self.signals = signals
        """Look-ahead signals of the workloads given as strings (`rlalloc.forecaster.signals`
        builds the shipped ones; training passes them, so policies see what evaluation shows)."""
        self.efficiency = efficiency
        """Profiled jobs' progress model (`rlalloc.env.efficiency.EFFICIENCY_MODES`)."""
        self.featurizer = Featurizer(features or FeatureSpec(
            checkpoint_interval_s=self.params.checkpoint_interval_s))
        self.reward_weights = reward or RewardWeights()
        self.max_episode_steps = max_episode_steps
        self._sources = list(workloads)
        self._cluster = cluster
        self._scenarios: dict[tuple[int, int], Scenario] = {}
        spec = self.featurizer.spec
        self.observation_space = gym.spaces.Box(-OBS_BOUND, OBS_BOUND, (spec.obs_size,), np.float32)
        self.action_space = gym.spaces.Discrete(spec.num_actions)
        self.sim = None
        self._state = None

    # ------------------------------------------------------------------ gymnasium API
    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        """Start a new episode on one of the workloads (chosen by the seeded RNG)."""
        super().reset(seed=seed)
        index = int(self.np_random.integers(len(self._sources)))
        episode_seed = int(self.np_random.integers(2**31))
        scenario = self._scenario(index, episode_seed)
        self.sim = scenario.simulator(self.params, seed=episode_seed)
        self.featurizer.start_episode()
        self._steps = 0
        self._actions_here = 0
        self._last = self._totals()
        self._last_time_s = self.sim.time_s
        self._refresh()
        return self._observation(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Apply one discrete action; advance time after a no-op or invalid action."""
        sim = self.sim
        decoded = self.featurizer.decode(self._state, int(action))
        if decoded.kind != _NOOP:
            applied = sim.apply(decoded)  # counts an invalid action itself
        else:
            applied = False
            sim.invalid_actions += int(action) != 0  # a non-zero index that decodes to nothing
        self._actions_here = self._actions_here + 1 if applied else 0
        if not applied or self._actions_here >= self.params.max_actions_per_decision:
            self._actions_here = 0
            sim.advance()
        self._steps += 1
        elapsed_s = sim.time_s - self._last_time_s
        self._last_time_s = sim.time_s
        reward = self._reward() * self._in_step_discount(elapsed_s)
        terminated = sim.done
        truncated = not terminated and self._steps >= self.max_episode_steps
        self._refresh()
        info = {"invalid_actions": sim.invalid_actions}
        if self.reward_weights.time_discount_s > 0:
            info["discount"] = math.exp(-elapsed_s / self.reward_weights.time_discount_s)
        if terminated or truncated:  # a vector env resets at once: the last state's mask
            info["metrics"] = sim.accounting.summary()
            info["terminal_action_mask"] = self.action_masks()
        return self._observation(), reward, terminated, truncated, info

    def action_masks(self) -> np.ndarray:
        """Valid actions now (read by sb3-contrib's MaskablePPO)."""
        return self.featurizer.action_mask(self._state)

    # ------------------------------------------------------------------ internals
    def _scenario(self, index: int, seed: int) -> Scenario:
        source = self._sources[index]
        if isinstance(source, Scenario):
            return source
        # files are deterministic; synthetic workloads are drawn anew per episode seed
        key = (index, seed if source.startswith("synthetic") else 0)
        if key not in self._scenarios:
            if len(self._scenarios) > 64:
                self._scenarios.clear()
            self._scenarios[key] = build_scenario(source, self._cluster, seed=key[1],
                                                  efficiency=self.efficiency,
                                                  signals=self.signals)
        return self._scenarios[key]

    def _refresh(self) -> None:
        self._state = self.sim.state()

    def _observation(self) -> np.ndarray:
        return self.featurizer.observe(self._state)

    def _totals(self) -> tuple[float, float, float]:
        acc = self.sim.accounting
        return acc.jobs_in_system_s, acc.lost_gpu_s, acc.energy_kwh()

    def _in_step_discount(self, elapsed_s: float) -> float:
        """Mean of exp(-t/T) over a step of `elapsed_s` seconds (1 without a time discount).

        The number of jobs in the system and the power draw are constant within a step (the
        simulator stops at every event), so the step's JCT and energy cost times this mean is
        that cost discounted, exactly, to the step's start. Work lost to a failure is spread
        over the step the same way (an approximation: it is lost at one instant)."""
        horizon_s = self.reward_weights.time_discount_s
        if horizon_s <= 0 or elapsed_s <= 0:
            return 1.0
        return -math.expm1(-elapsed_s / horizon_s) * horizon_s / elapsed_s

    def _reward(self) -> float:
        jobs_s, lost_s, energy_kwh = now = self._totals()
        w = self.reward_weights
        reward = -(w.jobs_weight * (jobs_s - self._last[0]) / 3600.0
                   + w.lost_gpu_weight * (lost_s - self._last[1]) / 3600.0
                   + w.energy_weight * (energy_kwh - self._last[2]))
        self._last = now
        return float(reward)


if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point=ClusterAllocEnv)
