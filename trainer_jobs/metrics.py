"""Rank 0's Prometheus exporter: throughput, progress and checkpoint age of the training job.

The names come from `env.telemetry_names` so the actuator that queries them and the simulator that
imitates them cannot drift. Labels: `job` (the PyTorchJob), `namespace`, `rank` (always "0":
one exporter per job keeps the series count flat when the job scales).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, start_http_server

from env.telemetry_names import (
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
        labels = {"job": job, "namespace": namespace, "rank": "0"}

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, _LABELS, registry=self.registry).labels(**labels)

        self.samples_per_s = gauge(TRAINER_SAMPLES_PER_S, "Training samples per second, whole job")
        self.step = gauge(TRAINER_STEP, "Optimizer steps completed (continues across restarts)")
        self.total_steps = gauge(TRAINER_TOTAL_STEPS, "Steps the job is configured to run")
        self.world_size = gauge(TRAINER_WORLD_SIZE, "Workers in the current rendezvous")
        self.loss = gauge(TRAINER_LOSS, "Training loss of the latest step")
        self.last_checkpoint_time = gauge(
            TRAINER_LAST_CHECKPOINT_TIME, "Unix time the latest complete checkpoint was committed")
        self.last_checkpoint_step = gauge(
            TRAINER_LAST_CHECKPOINT_STEP, "Step stored in the latest complete checkpoint")
        self.checkpoint_duration = gauge(
            TRAINER_CHECKPOINT_DURATION,
            "Seconds the training loop was blocked by the latest checkpoint")
        self.total_steps.set(total_steps)

    def start(self, port: int) -> None:
        """Serve the registry on all interfaces (Prometheus scrapes the pod's IP)."""
        start_http_server(port, registry=self.registry)

    def on_step(self, step: int, loss: float, samples_per_s: float, world_size: int) -> None:
        """Record one completed optimizer step."""
        self.step.set(step)
        self.loss.set(loss)
        self.samples_per_s.set(samples_per_s)
        self.world_size.set(world_size)

    def on_checkpoint_blocked(self, blocked_s: float) -> None:
        """Record how long the loop waited for the latest checkpoint call."""
        self.checkpoint_duration.set(blocked_s)

    def on_checkpoint_committed(self, step: int, committed_unix: float) -> None:
        """Record a checkpoint that became loadable (the age the actuator weighs before a move)."""
        self.last_checkpoint_step.set(step)
        self.last_checkpoint_time.set(committed_unix)
