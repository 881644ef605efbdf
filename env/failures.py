"""Node failures and the telemetry warnings that precede some of them.

A node fails as a Poisson process at `failures_per_gpu_day` x its GPU count; after a failure it
is down for `repair_s`. A share `warned_share` of failures announce themselves: a *warning
episode* starts a lead time before the failure, during which the node's GPUs log XID errors,
uncorrectable (double-bit) ECC errors and readiness flaps at the given rates, and run hotter,
by `temp_rise_c` over `temp_ramp_s` at most. False alarms are warning episodes that end
without a failure, at `false_warnings_per_warned_failure` times the rate of warned failures.
Everything is a named parameter below; the defaults and where they come from are in
docs/simulator.md.

The process depends only on its seed, not on the jobs, so the same timeline can drive the
simulator, the digital twin and the training data of the failure-risk model.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

import numpy as np

from rlalloc.env.errors import UserError

SECONDS_PER_DAY = 86_400.0
LLAMA3_FAILURES_PER_GPU_DAY = 4.7e-4
"""Llama 3 pre-training: 419 interruptions on 16,384 GPUs in 54 days (data README)."""
STRESS_FAILURES_PER_GPU_DAY = 0.05
"""~100x Llama 3: a few failures per day on a 64-GPU cluster, to test failover policies."""

FAILURE_PRESETS = {"none": 0.0, "default": LLAMA3_FAILURES_PER_GPU_DAY,
                   "stress": STRESS_FAILURES_PER_GPU_DAY}
MAX_FAILURES_PER_GPU_DAY = 10.0
"""Highest rate `parse_failure_rate` accepts: 200x the stress preset, where a node of 8 GPUs
fails every 18 minutes and, with 2 h repairs, is down nearly all the time. Higher rates only
make the failure process draw (and hold in memory) millions of events a week."""


def parse_failure_rate(text: str) -> float:
    """A ``--failures`` value: a preset name or a finite rate of failures per GPU-day in
    [0, `MAX_FAILURES_PER_GPU_DAY`] (one-line `UserError` otherwise)."""
    if text in FAILURE_PRESETS:
        return FAILURE_PRESETS[text]
    try:
        rate = float(text)
    except ValueError:
        rate = math.nan
    if not 0.0 <= rate <= MAX_FAILURES_PER_GPU_DAY:  # NaN and infinities fail too
        raise UserError(f"--failures {text!r}: give failures per GPU-day, a number from 0 to "
                        f"{MAX_FAILURES_PER_GPU_DAY:g} (stress is {STRESS_FAILURES_PER_GPU_DAY}),"
                        f" or one of {', '.join(FAILURE_PRESETS)}")
    return rate


@dataclass(frozen=True, slots=True)
class FailureParams:
    """Parameters of the node failure and warning process."""

    failures_per_gpu_day: float = LLAMA3_FAILURES_PER_GPU_DAY
    """Unexpected node failures per GPU-day; a node of g GPUs fails at g times this rate."""
    repair_s: float = 2 * 3600.0
    """Time a failed node stays down (drain, replace, re-admit)."""
    warned_share: float = 0.6
    """Share of failures preceded by a telemetry warning episode."""
    warning_lead_min_s: float = 600.0
    warning_lead_max_s: float = 3600.0
    """Lead time of a warning before its failure, drawn uniformly in [min, max]."""
    false_warnings_per_warned_failure: float = 1.0
    """False alarms per warned failure (1.0: half of all warning episodes are false alarms)."""
    false_warning_duration_s: float = 1800.0
    """How long a false-alarm episode lasts."""
    xid_per_hour: float = 12.0
    ecc_per_hour: float = 4.0
    flaps_per_hour: float = 2.0
    """Event rates during a warning episode (XID errors, double-bit ECC errors, NotReady flaps)."""
    temp_rise_c: float = 10.0
    """Extra GPU temperature a warning episode ramps up to (linearly, over `temp_ramp_s`)."""
    temp_ramp_s: float = 3600.0
    """Time the excess takes to reach `temp_rise_c`, the same in every episode. A ramp that
    reached it at the episode's end gave the failure time away: t + (rise - excess) x 1800 s /
    its 30-min change, exactly, a label that real telemetry does not carry and that a model
    trained on the simulator's would learn."""
    telemetry_window_s: float = 300.0
    """Window for 'recent' event counts, as the actuator's `changes(...[5m])` queries."""

    def __post_init__(self) -> None:
        assert self.failures_per_gpu_day >= 0, self.failures_per_gpu_day
        assert 0.0 <= self.warned_share <= 1.0, self.warned_share
        assert 0 < self.warning_lead_min_s <= self.warning_lead_max_s
        assert self.repair_s > 0
        assert self.temp_ramp_s > 0, self.temp_ramp_s


@dataclass(slots=True)
class WarningEpisode:
    """A period of bad telemetry on one node; `fail_s` is None for a false alarm."""

    node: int
    start_s: float
    end_s: float
    fail_s: float | None
    xid_s: list[float] = field(default_factory=list)
    ecc_s: list[float] = field(default_factory=list)
    flap_s: list[float] = field(default_factory=list)

    def temp_offset_c(self, t: float, rise_c: float, ramp_s: float) -> float:
        """Temperature excess at time t: ramps from 0 at the start by `rise_c` per `ramp_s`,
        up to `rise_c`, whenever the episode ends."""
        if not self.start_s <= t < self.end_s:
            return 0.0
        return min(rise_c * (t - self.start_s) / ramp_s, rise_c)


@dataclass(frozen=True, slots=True)
class HealthEvent:
    """A change of a node's health: 'warn' (episode starts), 'fail', 'repair', 'calm'."""

    time_s: float
    kind: str
    node: int
    episode: WarningEpisode | None = None


def _poisson_times(rng: np.random.Generator, rate_per_s: float, start: float,
                   end: float) -> list[float]:
    if rate_per_s <= 0 or end <= start:
        return []
    count = rng.poisson(rate_per_s * (end - start))
    return sorted(rng.uniform(start, end, size=count).tolist())


class NodeHealthTimeline:
    """Generates the failure/warning events of every node, lazily, in time order chunks.

    `events_until(t)` returns all events with time < t not returned before, so a simulator can
    pull them as its clock advances without knowing the horizon in advance.
    """

    CHUNK_S = 7 * SECONDS_PER_DAY

    def __init__(self, params: FailureParams, gpus_per_node: np.ndarray,
                 rng: np.random.Generator) -> None:
        self.params = params
        self._rate_per_s = (np.asarray(gpus_per_node, dtype=float) * params.failures_per_gpu_day
                            / SECONDS_PER_DAY)
        self._rng = rng
        self._generated_until = 0.0
        self._down_until = np.zeros(len(self._rate_per_s))
        self._pending: list[HealthEvent] = []

    def events_until(self, t: float) -> list[HealthEvent]:
        """Events in [previous call's t, t), ordered by time."""
        while self._generated_until < t + self.params.warning_lead_max_s:
            self._generate_chunk()
        cut = bisect.bisect_left([e.time_s for e in self._pending], t)
        due, self._pending = self._pending[:cut], self._pending[cut:]
        return due

    def _generate_chunk(self) -> None:
        p, rng = self.params, self._rng
        start, end = self._generated_until, self._generated_until + self.CHUNK_S
        new: list[HealthEvent] = []
        for node, rate in enumerate(self._rate_per_s):
            for fail_s in _poisson_times(rng, rate, start, end):
                if fail_s < self._down_until[node]:
                    continue  # a node that is down cannot fail again
                self._down_until[node] = fail_s + p.repair_s
                if rng.random() < p.warned_share:
                    lead = rng.uniform(p.warning_lead_min_s, p.warning_lead_max_s)
                    episode = self._episode(node, max(fail_s - lead, start), fail_s, fail_s)
                    new.append(HealthEvent(episode.start_s, "warn", node, episode))
                new.append(HealthEvent(fail_s, "fail", node))
                new.append(HealthEvent(fail_s + p.repair_s, "repair", node))
            false_rate = rate * p.warned_share * p.false_warnings_per_warned_failure
            for warn_s in _poisson_times(rng, false_rate, start, end):
                episode = self._episode(node, warn_s, warn_s + p.false_warning_duration_s, None)
                new.append(HealthEvent(warn_s, "warn", node, episode))
                new.append(HealthEvent(episode.end_s, "calm", node, episode))
        self._pending = sorted(self._pending + new, key=lambda e: (e.time_s, e.node, e.kind))
        self._generated_until = end

    def _episode(self, node: int, start: float, end: float,
                 fail_s: float | None) -> WarningEpisode:
        p, rng = self.params, self._rng
        return WarningEpisode(
            node, start, end, fail_s,
            xid_s=_poisson_times(rng, p.xid_per_hour / 3600.0, start, end),
            ecc_s=_poisson_times(rng, p.ecc_per_hour / 3600.0, start, end),
            flap_s=_poisson_times(rng, p.flaps_per_hour / 3600.0, start, end),
        )


def count_in_window(times: list[float], t: float, window_s: float) -> int:
    """Number of event times in (t - window_s, t]."""
    return bisect.bisect_right(times, t) - bisect.bisect_right(times, t - window_s)


NODE_FEATURE_NAMES = ("xid_5m", "xid_30m", "ecc_30m", "flaps_60m", "temp_excess_c",
                      "temp_excess_delta_30m")
"""Per-node telemetry features for the failure-risk model, computable from Prometheus too."""


def node_features(episode: WarningEpisode | None, t: float, params: FailureParams) -> list[float]:
    """Feature vector of `NODE_FEATURE_NAMES` for one node at time t (zeros when healthy)."""
    if episode is None:
        return [0.0] * len(NODE_FEATURE_NAMES)
    rise, ramp = params.temp_rise_c, params.temp_ramp_s
    return [
        float(count_in_window(episode.xid_s, t, 300.0)),
        float(count_in_window(episode.xid_s, t, 1800.0)),
        float(count_in_window(episode.ecc_s, t, 1800.0)),
        float(count_in_window(episode.flap_s, t, 3600.0)),
        episode.temp_offset_c(t, rise, ramp),
        episode.temp_offset_c(t, rise, ramp) - episode.temp_offset_c(t - 1800.0, rise, ramp),
    ]


@dataclass(frozen=True)
class NodeTelemetrySample:
    """Telemetry of `n_nodes` nodes sampled every `step_s`, with the true failure times."""

    times_s: np.ndarray
    """(T,) sample times."""
    features: np.ndarray
    """(T, n_nodes, F) features named by `feature_names`; temperature as excess over normal."""
    feature_names: tuple[str, ...]
    fail_times_s: tuple[np.ndarray, ...]
    """Per node, the sorted times at which it failed."""
    down: np.ndarray
    """(T, n_nodes) True while the node is down (excluded from risk training/evaluation)."""

    def labels(self, horizon_s: float) -> np.ndarray:
        """(T, n_nodes) True where the node fails within (t, t + horizon_s]."""
        out = np.zeros(self.down.shape, dtype=bool)
        for node, fails in enumerate(self.fail_times_s):
            if len(fails) == 0:
                continue
            nxt = np.searchsorted(fails, self.times_s, side="right")
            has_next = nxt < len(fails)
            gap = np.where(has_next, fails[np.minimum(nxt, len(fails) - 1)] - self.times_s, np.inf)
            out[:, node] = gap <= horizon_s
        return out


def sample_node_telemetry(params: FailureParams, n_nodes: int, duration_s: float, step_s: float,
                          seed: int, gpus_per_node: int = 8) -> NodeTelemetrySample:
    """Run the failure process alone and sample each node's telemetry features every `step_s`.

    This is the training and test data of the failure-risk model: no public per-node failure
    telemetry exists, so the model learns the simulator's warning process.
    """
    timeline = NodeHealthTimeline(params, np.full(n_nodes, gpus_per_node),
                                  np.random.default_rng(seed))
    times = np.arange(0.0, duration_s, step_s)
    features = np.zeros((len(times), n_nodes, len(NODE_FEATURE_NAMES)), dtype=np.float32)
    down = np.zeros((len(times), n_nodes), dtype=bool)
    fails: list[list[float]] = [[] for _ in range(n_nodes)]
    episodes: dict[int, WarningEpisode] = {}
    # keep an ended episode visible for an hour so windowed counts decay as in Prometheus
    lingering: dict[int, WarningEpisode] = {}
    down_until = np.zeros(n_nodes)
    for i, t in enumerate(times):
        for event in timeline.events_until(t + 1e-9):
            if event.kind == "warn":
                episodes[event.node] = event.episode
            elif event.kind in ("fail", "calm"):
                if event.node in episodes:
                    lingering[event.node] = episodes.pop(event.node)
                if event.kind == "fail":
                    fails[event.node].append(event.time_s)
                    down_until[event.node] = event.time_s + params.repair_s
        for node, episode in list(lingering.items()):
            if t - episode.end_s > 3600.0:
                del lingering[node]
        for node in set(episodes) | set(lingering):
            features[i, node] = node_features(episodes.get(node) or lingering.get(node), t,
                                              params)
        down[i] = t < down_until
    return NodeTelemetrySample(times, features, NODE_FEATURE_NAMES,
                               tuple(np.asarray(f) for f in fails), down)
