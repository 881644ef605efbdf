"""One-step lookahead over heuristics: how much a policy that picks between them could gain.

Residual PPO (`rlalloc.agent.residual`) never learnt to deviate from its starting heuristic. That is
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
them are the value of knowing the arrivals. Every fork runs the jobs already in the system
with their true remaining work (it is a copy of the simulator): on the Pollux workloads a size
table of past jobs knows it exactly (`rlalloc.agent.job_sizes`), elsewhere that is knowledge a
controller lacks. A *sampled* future (``sampled-1h``) is what a live
controller could do instead: each fork gets the jobs that arrived within the horizon at the same
time of day in one of a few history workloads (`HistoryArrivals`), or jobs drawn from a model
of the next hour's arrivals given the last hour's (`ModelArrivals`), the same draws for every
candidate, and a candidate replaces the base's proposal only if it wins in every draw. Forking
the simulator the run happens in makes it a measurement (`rlalloc headroom`); forking one
rebuilt from the state alone (`rlalloc.env.rebuild`) makes it a policy a controller can run
(`rlalloc.agent.planner`).
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Protocol

import numpy as np

from rlalloc.agent.policy import Policy, for_a_fork
from rlalloc.env.errors import UserError
from rlalloc.env.execution import Executor, LocalProcesses
from rlalloc.env.scenario import Scenario
from rlalloc.env.simulator import JobSpeed, Simulator, time_limit_s
from rlalloc.env.state import NOOP, Action, ActionKind, ClusterState
from rlalloc.env.workload.spec import JobSpec
from rlalloc.forecaster.arrivals import ArrivalsModel

FUTURE_WORDS = {"known": math.inf, "none": 0.0}
"""Named futures; any other is a horizon such as ``1h`` or ``30m``, or ``sampled-1h``."""


@dataclass(frozen=True)
class Future:
    """What a fork knows of the arrivals after now: the real ones within `horizon_s`, or, when
    `sampled`, jobs drawn from history within it (the real ones unknown)."""

    horizon_s: float
    sampled: bool = False


def parse_future(text: str) -> Future:
    """The `Future` named by ``known``, ``none``, ``<N>h`` / ``<N>m`` or ``sampled-<N>h`` /
    ``sampled-<N>m`` (ValueError otherwise)."""
    if text in FUTURE_WORDS:
        return Future(FUTURE_WORDS[text])
    match = re.fullmatch(r"(sampled-)?(\d+(?:\.\d+)?)([hm])", text)
    if not match:
        raise ValueError(text)
    return Future(float(match[2]) * (3600.0 if match[3] == "h" else 60.0), bool(match[1]))


_DAY_S = 86_400.0

Arrivals = tuple[tuple[JobSpec, ...], tuple[JobSpeed, ...]]
"""Jobs a fork is told will arrive, with their speed models."""


class FutureSource(Protocol):
    """Where a sampled future's arrivals come from: past days at the same time of day
    (`HistoryArrivals`) or an arrivals model (`ModelArrivals`)."""

    horizon_s: float
    """How far ahead each future reaches."""
    samples: int
    """Futures per call to `futures`."""

    def futures(self, now_s: float, state: ClusterState) -> list[Arrivals]:
        """`samples` futures for a decision on `state`, their jobs submitted after `now_s` (the
        fork's clock) and within the horizon."""
        ...


class HistoryArrivals:
    """Sampled futures: the jobs that arrived in the next `horizon_s` at the same time of day on
    past days of the cluster (a job's submit time read as a time of day: a workload starts at
    midnight, as the simulator counts time, and one longer than a day gives a day each).

    The Pollux workloads are 8-hour samples of one trace and share its daily shape (each of the
    eight gets the most arrivals in hour 6, about twice its hourly mean), so the same hour of
    another workload is a plausible next hour. Each call to `draw` picks `samples` distinct past
    days at random (seeded: runs repeat). A horizon that runs past midnight continues at the
    start of the same day, as if it came again (one of a day or more takes the rest of the day).
    """

    def __init__(self, history: Sequence[Arrivals], horizon_s: float, samples: int,
                 seed: int) -> None:
        assert history and samples > 0 and horizon_s > 0
        self.horizon_s = horizon_s
        self._rng = np.random.default_rng(seed)
        self._pool: list[tuple[list[float], tuple[JobSpec, ...], tuple[JobSpeed, ...]]] = []
        for index, (jobs, speeds) in enumerate(history):
            for day, rows in sorted(_rows_by_day(jobs).items()):
                renamed = tuple(replace(jobs[row], job_id=f"history{index}/{jobs[row].job_id}",
                                        submit_s=jobs[row].submit_s - day * _DAY_S)
                                for row in rows)
                self._pool.append(([job.submit_s for job in renamed], renamed,
                                   tuple(speeds[row] for row in rows)))
        self.samples = min(samples, len(self._pool))

    @staticmethod
    def of_scenarios(history: Sequence[Scenario], horizon_s: float, samples: int,
                     seed: int) -> HistoryArrivals:
        """Futures drawn from the workloads of `history`, with their exact speed models."""
        return HistoryArrivals([(s.workload.jobs, s.speeds) for s in history], horizon_s,
                               samples, seed)

    def draw(self, now_s: float, time_of_day_s: float | None = None) -> list[Arrivals]:
        """`samples` futures for the instant `now_s`, which is `time_of_day_s` into its day
        (default: `now_s` into the first day): the jobs submitted in the next horizon after
        that time of day on as many past days, moved to the same offset from `now_s`."""
        day_s = (now_s if time_of_day_s is None else time_of_day_s) % _DAY_S
        futures = []
        for pick in self._rng.choice(len(self._pool), size=self.samples, replace=False):
            submit, jobs, speeds = self._pool[pick]
            windows = [(day_s, day_s + self.horizon_s, now_s - day_s)]
            if day_s + self.horizon_s > _DAY_S > self.horizon_s:  # the day's start again
                windows.append((-1.0, day_s + self.horizon_s - _DAY_S, now_s - day_s + _DAY_S))
            drawn, drawn_speeds = [], []
            for after, until, shift in windows:
                lo, hi = bisect.bisect_right(submit, after), bisect.bisect_right(submit, until)
                drawn += [replace(job, submit_s=job.submit_s + shift) if shift else job
                          for job in jobs[lo:hi]]
                drawn_speeds += speeds[lo:hi]
            futures.append((tuple(drawn), tuple(drawn_speeds)))
        return futures

    def futures(self, now_s: float, state: ClusterState) -> list[Arrivals]:
        """`draw` at the state's time of day."""
        return self.draw(now_s, state.time_of_day_s)


class ModelArrivals:
    """Sampled futures drawn from an arrivals model (`rlalloc.forecaster.arrivals`): how many
    jobs arrive in the horizon follows the state's time of day and its last hour of arrivals
    (`Demand.arrivals_1h`), and each arrival is one of `history`'s jobs (the jobs the model was
    fitted on, in the same order, with the speed models a fork runs them on). Each future is an
    independent draw (seeded: runs repeat)."""

    def __init__(self, model: ArrivalsModel, history: Arrivals, samples: int, seed: int) -> None:
        assert len(history[0]) == len(model.job_gpus) and samples > 0
        self.model = model
        self.horizon_s = model.horizon_s
        self.samples = samples
        self._jobs, self._speeds = history
        self._rng = np.random.default_rng(seed)

    def futures(self, now_s: float, state: ClusterState) -> list[Arrivals]:
        """`samples` draws of the model, each arrival a history job renamed and moved to its
        drawn time after `now_s`."""
        futures = []
        for _ in range(self.samples):
            drawn = self.model.draw(state.time_of_day_s, state.demand.arrivals_1h, self._rng)
            jobs = tuple(replace(self._jobs[row], job_id=f"arrival{k}/{self._jobs[row].job_id}",
                                 submit_s=now_s + offset_s)
                         for k, (offset_s, row) in enumerate(drawn))
            futures.append((jobs, tuple(self._speeds[row] for _, row in drawn)))
        return futures


def _rows_by_day(jobs: Sequence[JobSpec]) -> dict[int, list[int]]:
    """The rows of `jobs` by the day they were submitted on (the past days a future is drawn
    from)."""
    days: dict[int, list[int]] = {}
    for row, job in enumerate(jobs):
        days.setdefault(int(job.submit_s // _DAY_S), []).append(row)
    return days


def refuse_more_samples_than_days(samples: int, history: Sequence[Scenario], what: str) -> None:
    """A one-line `UserError` when `history` (`what`, as the user gave it) holds fewer past days
    than `samples`: each decision draws distinct days, so the sampling was capped there without
    a word, and 2 draws where 5 were asked let noise pick the deviations."""
    days = sum(len(_rows_by_day(scenario.workload.jobs)) for scenario in history)
    if days < samples:
        raise UserError(f"--samples {samples}: {what} holds {days} past day"
                        f"{'' if days == 1 else 's'} to draw futures from, and each decision "
                        f"draws distinct ones; pass --samples {days} or more history")


def cost_to_go(sim: Simulator, policy: Policy, stop_deciding: bool = False) -> float:
    """Job-seconds still to be spent in the system when `policy` runs `sim` to the end (the
    end of the known jobs, for a fork without future arrivals), from the current instant.

    `stop_deciding` first ends the current decision point without further actions: the
    continuation of a veto. The simulator stops at every event, so the number of jobs in the
    system is constant over each `advance` and the integral is exact. Infinite where the jobs
    are still in the system after `time_limit_s` from now: in a copy rebuilt from a state a job
    may never start (a node that is down stays down, another tenant's GPUs stay taken), and
    the loop ran for ever, freezing the planner's every contested decision.
    """
    cost = 0.0
    ask = not stop_deciding
    deadline_s = sim.time_s + time_limit_s(sim)
    while not sim.done and (sim.jobs_in_system or sim.has_pending_arrivals):
        if sim.time_s > deadline_s:
            return math.inf
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
    """The rollout policy over `base` and `alternatives` (see the module docstring), forking
    the simulator `sim_at` gives for the state it decides on: the one the run happens in, for
    `rlalloc headroom`, or one rebuilt from the state, for a controller (`rlalloc.agent.planner`).
    Counts the decisions where proposals differed (`contested`) and those where it did not
    follow `base` (`deviations`). A sampled `future` needs `history` to draw from."""

    def __init__(self, sim_at: Callable[[ClusterState], Simulator], base: Policy,
                 alternatives: Sequence[Policy], future: Future,
                 history: FutureSource | None = None, name: str = "lookahead") -> None:
        assert history is not None or not future.sampled, "a sampled future needs history"
        self.sim_at = sim_at
        self.base = base
        self.alternatives = tuple(alternatives)
        self.future = future
        self.history = history
        self.name = name
        self.contested = 0
        self.deviations = 0
        self.forks: Executor = LocalProcesses(1)
        """Where the forks of a contested decision run (`fork_on`)."""
        self.last_costs: dict[Action, np.ndarray] = {}
        """Each candidate's cost-to-go per future drawn, at the last contested decision
        (what `rlalloc.agent.distill` turns into advantages)."""

    def act(self, state: ClusterState) -> Action:
        """The proposal whose forks end with the least mean job-time, among those that beat the
        base's in every future drawn (the base's when none does).

        With one future that is plainly the cheapest proposal. With sampled futures, a
        deviation must win in each of them: taking the cheapest mean let sampling noise pick
        the deviations, far more of them than the real next hour makes, and it raised the JCT
        (docs/experiments/2026-11-22-headroom-lookahead.md).
        """
        base_action = self.base.act(state)
        candidates = list(dict.fromkeys([base_action,
                                         *(policy.act(state) for policy in self.alternatives)]))
        if len(candidates) == 1:
            return base_action
        self.contested += 1
        sim = self.sim_at(state)  # its clock may be the state's less whole days (env.rebuild)
        futures: list[Arrivals] = (self.history.futures(sim.time_s, state)
                                   if self.future.sampled else [((), ())])
        self.last_costs = self._costs(sim, candidates, futures)
        base_costs = self.last_costs[base_action]
        if not np.isfinite(base_costs).all():
            return base_action  # nothing to weigh the others against
        best_action, best_cost = base_action, float(np.mean(base_costs))
        for action in candidates[1:]:
            costs = self.last_costs[action]
            if all(costs < base_costs - 1e-6) and float(np.mean(costs)) < best_cost:
                best_action, best_cost = action, float(np.mean(costs))
        self.deviations += best_action != base_action
        return best_action

    def _costs(self, sim: Simulator, candidates: list[Action],
               futures: list[Arrivals]) -> dict[Action, np.ndarray]:
        """Each candidate's cost-to-go in one fork of `sim` per future, the forks run by
        `forks` (in this process unless a command handed the policy a Ray cluster's)."""
        known_s = 0.0 if self.future.sampled else self.future.horizon_s
        forks = [(action, future) for action in candidates for future in futures]
        costs = np.fromiter(self.forks.map(partial(fork_cost, sim, self.base, known_s), forks,
                                           describe=lambda fork: f"the fork of {fork[0]}"),
                            dtype=float, count=len(forks))
        return {action: costs[i * len(futures):(i + 1) * len(futures)]
                for i, action in enumerate(candidates)}


def fork_cost(sim: Simulator, base: Policy, known_s: float,
              fork: tuple[Action, Arrivals]) -> float:
    """The cost-to-go of a fork of `sim` that knows the real arrivals of the next `known_s`
    and the drawn ones of `fork`'s future, after `fork`'s action, with `base` deciding."""
    action, (jobs, speeds) = fork
    copy = sim.fork(known_s, jobs, speeds)
    if action == NOOP:
        return cost_to_go(copy, for_a_fork(base), stop_deciding=True)
    # valid in the state, a proposal can still be refused by a copy rebuilt from it (a job on
    # a down node is queued there): it cannot be weighed, so it never wins
    return cost_to_go(copy, for_a_fork(base)) if copy.apply(action) else math.inf


def fork_on(policy: Policy, forks: Executor) -> None:
    """Have `policy`, a lookahead (a planner), run its forks on `forks` (a Ray cluster's
    tasks): the forks of a contested decision are independent. A one-line `UserError` for a
    policy that forks nothing."""
    if not isinstance(policy, LookaheadPolicy):
        raise UserError(f"--ray runs a planner's forks in parallel, and {policy.name} forks "
                        "nothing; give a planner (`rlalloc planner fit`) or leave out --ray")
    policy.forks = forks
