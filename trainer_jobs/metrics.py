"""Rank 0's Prometheus exporter: throughput, progress and checkpoint age of the training job.

The names come from `rlalloc.env.telemetry_names` so the actuator that queries them and the
simulator that imitates them cannot drift. Labels: `job` (the PyTorchJob), `namespace`, `rank`
(always "0": one exporter per job keeps the series count flat when the job scales).

A gauge appears only once it has a value: a series that read 0 before the first step or commit
would tell the actuator that a resumed job is back at step 0 and that its last checkpoint was
taken in 1970. A (re)start sets the step and the last-checkpoint step from the checkpoint it
resumed from (step 0 for a fresh start), and the last-checkpoint time to the (re)start
(`on_resumed`); until then the job reads as silent, which the actuator handles.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, start_http_server

from rlalloc.env.telemetry_names import (
    TRAINER_CHECKPOINT_DURATION,
    TRAINER_LAST_CHECKPOINT_STEP,
    TRAINER_LAST_CHECKPOINT_TIME,
    TRAINER_LOSS,
    TRAINER_SAMPLES_PER_S,
    TRAINER_STEP,
    TRAINER_TOTAL_STEPS,
    TRAINER_WORLD_SIZE,
)

_LABELS = ("job", "namespace", "rank")


class TrainerMetrics:
    """Gauges of one training job, served over HTTP on `port` once `start` is called."""

    def __init__(self, job: str, namespace: str, total_steps: int) -> None:
        self.registry = CollectorRegistry()
        self._labels = {"job": job, "namespace": namespace, "rank": "0"}

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, _LABELS, registry=self.registry)

        self._samples_per_s = gauge(TRAINER_SAMPLES_PER_S,
                                    "Training samples per second, whole job")
        self._step = gauge(TRAINER_STEP, "Optimizer steps completed (continues across restarts)")
        self._total_steps = gauge(TRAINER_TOTAL_STEPS, "Steps the job is configured to run")
        self._world_size = gauge(TRAINER_WORLD_SIZE, "Ranks in the current rendezvous "
                                 "(workers x processes per worker)")
        self._loss = gauge(TRAINER_LOSS, "Training loss of the latest step")
        self._last_checkpoint_time = gauge(
            TRAINER_LAST_CHECKPOINT_TIME,
            "Unix time of the latest checkpoint commit, or of the (re)start if later")
        self._last_checkpoint_step = gauge(
            TRAINER_LAST_CHECKPOINT_STEP, "Step stored in the latest complete checkpoint")
        self._checkpoint_duration = gauge(
            TRAINER_CHECKPOINT_DURATION,
            "Seconds the training loop was blocked by the latest checkpoint")
        self._set(self._total_steps, total_steps)

    def _set(self, gauge: Gauge, value: float) -> None:
        """Set the job's series of `gauge`, creating it on first use (see the module docstring)."""
        gauge.labels(**self._labels).set(value)

    def start(self, port: int) -> None:
        """Serve the registry on all interfaces (Prometheus scrapes the pod's IP)."""
        start_http_server(port, registry=self.registry)

    def on_resumed(self, step: int, world_size: int, checkpoint_step: int,
                   started_unix: float) -> None:
        """Record where a (re)started job stands before its first step: the restored step and
        the point a restart would resume from, the checkpoint it loaded (step 0 for a fresh
        start), as of `started_unix`, the (re)start: nothing trained before it is at risk.
        The simulator counts a job's (re)start as such a checkpoint too, so the actuator sees
        the same time since the last checkpoint (not the hours a suspended job's checkpoint
        aged while it waited) and rolls a job that loses a node back to that step, not to
        progress it never saved."""
        self._set(self._step, step)
        self._set(self._world_size, world_size)
        self.on_checkpoint_committed(checkpoint_step, started_unix)

    def on_step(self, step: int, loss: float, samples_per_s: float, world_size: int) -> None:
        """Record one completed optimizer step."""
        self._set(self._step, step)
        self._set(self._loss, loss)
        self._set(self._samples_per_s, samples_per_s)
        self._set(self._world_size, world_size)

    def on_checkpoint_blocked(self, blocked_s: float) -> None:
        """Record how long the loop waited for the latest checkpoint call."""
        self._set(self._checkpoint_duration, blocked_s)

    def on_checkpoint_committed(self, step: int, committed_unix: float) -> None:
        """Record a checkpoint that became loadable (the age the actuator weighs before a move)."""
        self._set(self._last_checkpoint_step, step)
        self._set(self._last_checkpoint_time, committed_unix)
