"""Start a whole twin: simulator + Kubernetes API on a port + exporter on another + ticking.

Shared by `rlalloc twin` and the actuator's end-to-end tests, so the demo a new user runs is the
harness the tests trust.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from rlalloc.actuator.config import Queries
from rlalloc.actuator.server import listen_error
from rlalloc.actuator.twin.exporter import CLOCK_METRIC, TwinExporter
from rlalloc.actuator.twin.kube_api import ApiServerThread, TwinKubeAPI
from rlalloc.actuator.twin.runtime import ScriptedFailure, Twin, TwinEvent
from rlalloc.env.params import SimParams
from rlalloc.env.scenario import Scenario


@dataclass
class RunningTwin:
    """A started twin; `call` runs a function in its thread (where the twin's state lives)."""

    server: ApiServerThread
    twin: Twin
    exporter: TwinExporter
    metrics_port: int

    @property
    def kube_url(self) -> str:
        """Base URL of the twin's Kubernetes API."""
        return self.server.url

    @property
    def api(self) -> TwinKubeAPI:
        """The API emulator (its request log and fault injection)."""
        return self.server.api

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(*args)` in the twin's thread and return its result."""
        return self.server.call(fn, *args)

    def stop(self) -> None:
        """Stop ticking and serving the API and the exporter (both ports are closed)."""
        self.server.stop()
        self.exporter.stop()


def start_twin(scenario: Scenario, seed: int = 0, speed: float = 60.0, tick_s: float = 0.25,
               namespace: str = "default", epoch_s: float = 0.0,
               params: SimParams | None = None, host: str = "127.0.0.1", kube_port: int = 0,
               metrics_port: int = 0, failures: Sequence[ScriptedFailure] = (),
               on_event: Callable[[TwinEvent], None] | None = None,
               scrape_interval_s: float = 1.0) -> RunningTwin:
    """Start the twin of `scenario` running `speed` x real time (see `Twin`), with scripted
    `failures` scheduled before its first tick (after it, one early in the run would already
    be in the simulator's past; a ValueError names an impossible one). `on_event` is told of
    each warning, failure, repair and finished job as it happens, in the twin's thread;
    `scrape_interval_s` is the interval Prometheus scrapes its exporter at.

    Unless `params` say otherwise, the simulator's decision interval is one tick of simulated
    time, so a tick never jumps past more than one periodic step.
    """
    params = params or SimParams(decision_interval_s=max(speed * tick_s, 1.0))
    try:
        server = ApiServerThread(TwinKubeAPI(), host, kube_port).start()
    except OSError as err:
        raise listen_error("the twin's Kubernetes API", host, kube_port, err, "--kube-port",
                           "--host") from err
    exporter = TwinExporter()
    try:  # whatever stops the start (Ctrl-C included) leaves no port open
        sim = scenario.simulator(params, seed)
        twin = server.call(lambda: Twin(sim, server.api, namespace, speed, epoch_s, on_event,
                                               scrape_interval_s))
        for failure in failures:
            server.call(twin.script_failure, failure)
        exporter.publish(twin.frame)
        try:
            port = exporter.serve(metrics_port, host)
        except OSError as err:
            raise listen_error("the twin's exporter", host, metrics_port, err,
                               "--metrics-port", "--host") from err
    except BaseException:
        server.stop()
        exporter.stop()
        raise
    last = [time.monotonic()]

    def step() -> None:
        now = time.monotonic()
        twin.tick(now - last[0])
        last[0] = now
        exporter.publish(twin.frame)

    server.every(tick_s, step)
    return RunningTwin(server, twin, exporter, port)


_WINDOWS = {"5m": 300.0, "30m": 1800.0, "1h": 3600.0}
"""Durations the default queries use, as range windows (``[5m]``) and offsets (``offset 30m``)."""


def actuator_settings(speed: float, prometheus_url: str, scrape_interval_s: float = 1.0) -> dict:
    """Actuator settings (the YAML mapping) for running against a twin at `speed`.

    Query windows and offsets shrink with the acceleration (never below four scrapes), the clock
    is the twin's and `clock_speedup` is the speed, so "five minutes" means five simulated
    minutes to the actuator as to the simulator (the risk model's look-back too).
    """
    queries = {}
    for f in fields(Queries):
        query = getattr(Queries(), f.name)
        for window, sim_s in _WINDOWS.items():
            wall = prometheus_duration(max(sim_s / speed, 4 * scrape_interval_s))
            query = query.replace(f"[{window}]", f"[{wall}]").replace(
                f" offset {window}", f" offset {wall}")
        queries[f.name] = query
    queries["clock"] = CLOCK_METRIC
    return {"prometheus_url": prometheus_url, "queries": queries, "clock_speedup": speed,
            "max_metric_age_s": max(30.0, 10 * scrape_interval_s)}


def prometheus_config(metrics_target: str, scrape_interval_s: float = 1.0) -> dict:
    """A Prometheus config scraping the twin's exporter; `honor_labels` keeps the trainer
    series' own `job` label (the PyTorchJob) instead of the scrape job's."""
    interval = prometheus_duration(scrape_interval_s)
    return {"global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": [{"job_name": "rlalloc-twin", "honor_labels": True,
                                "static_configs": [{"targets": [metrics_target]}]}]}


def prometheus_duration(seconds: float) -> str:
    """`seconds` (> 0) as Prometheus writes durations: "5s", or "500ms" for a fraction of a
    second, since it accepts no decimals ("0.5s" fails its config check and PromQL alike)."""
    if float(seconds).is_integer():
        return f"{int(seconds)}s"
    return f"{max(round(seconds * 1000), 1)}ms"
