"""The actuator's own telemetry: Prometheus metrics, health endpoints and JSON log lines.

`/metrics` serves the registry below; `/healthz` answers 200 only while the last cycle could
observe the cluster, or for a standby reach the Lease (use it as the readiness probe: a replica
blind to Prometheus is not ready), and the `rlalloc_actuator_healthy` gauge says the same;
`/livez` answers 200 while the control loop keeps cycling (the liveness probe: restarting a pod
because Prometheus is down would not help). Each registry is per actuator, so tests can run two
replicas in one process.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from rlalloc.env.errors import UserError


class ActuatorMetrics:
    """Counters and gauges of one actuator replica."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.cycle_seconds = Histogram(
            "rlalloc_actuator_cycle_seconds", "Duration of one control cycle (observe to act)",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=r)
        self.decisions = Counter(
            "rlalloc_actuator_decisions_total", "Policy decisions by action kind and outcome "
            "(applied, refused, failed, dry_run)", ("kind", "outcome"), registry=r)
        self.refused = Counter("rlalloc_actuator_refused_actions_total",
                               "Actions the guardrails refused, by rule", ("rule",), registry=r)
        self.errors = Counter("rlalloc_actuator_errors_total",
                              "Errors by stage (observe, decide, act, event)", ("stage",),
                              registry=r)
        self.api_retries = Counter("rlalloc_actuator_api_retries_total",
                                   "Kubernetes API calls retried after 409/429/5xx", registry=r)
        self.leader = Gauge("rlalloc_actuator_leader", "1 while this replica holds the lease",
                            registry=r)
        self.healthy = Gauge("rlalloc_actuator_healthy",
                             "1 while /healthz answers 200: the last cycle could observe the "
                             "cluster (a standby: reach the Lease)", registry=r)
        self.last_success = Gauge("rlalloc_actuator_last_success_timestamp_seconds",
                                  "Unix time of the last cycle that observed successfully",
                                  registry=r)


class Health:
    """Thread-safe health status the loop updates and the HTTP server reads."""

    def __init__(self, stale_after_s: float) -> None:
        self._lock = threading.Lock()
        self._stale_after_s = stale_after_s
        self._ok = False
        self._reason = "starting"
        self._last_tick = time.monotonic()

    def set(self, ok: bool, reason: str = "") -> None:
        """Record the outcome of a cycle."""
        with self._lock:
            self._ok, self._reason = ok, reason
            self._last_tick = time.monotonic()

    def ready(self) -> tuple[bool, str]:
        """(healthy, reason) for /healthz."""
        with self._lock:
            return self._ok, self._reason or "ok"

    def alive(self) -> bool:
        """True while cycles keep happening (for /livez)."""
        with self._lock:
            return time.monotonic() - self._last_tick < self._stale_after_s


class StatusServer:
    """A tiny HTTP server for /metrics, /healthz and /livez, in a daemon thread."""

    def __init__(self, host: str, port: int, metrics: ActuatorMetrics, health: Health) -> None:
        registry = metrics.registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/metrics":
                    self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
                elif self.path == "/healthz":
                    ok, reason = health.ready()
                    self._send(200 if ok else 503, reason.encode() + b"\n")
                elif self.path == "/livez":
                    alive = health.alive()
                    self._send(200 if alive else 503, b"ok\n" if alive else b"stalled\n")
                else:
                    self._send(404, b"not found\n")

            def _send(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return  # probes every few seconds would flood the JSON log

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="status-http",
                                        daemon=True)

    def start(self) -> None:
        """Serve in the background."""
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()


def listen_error(what: str, host: str, port: int, err: OSError, port_flag: str,
                 host_flag: str) -> UserError:
    """The one-line error for a server that cannot listen: what could not be served, where,
    why, and the flag to change (the port when it is taken, else the address)."""
    # a name that does not resolve is a gaierror, whose errno is getaddrinfo's (os.strerror
    # calls -2 "Unknown error"): its own strerror says "Name or service not known"
    reason = err.strerror or (os.strerror(err.errno) if err.errno else str(err))
    fix = (f"choose another {port_flag} (0 = any free port)" if err.errno == errno.EADDRINUSE
           else f"check {host_flag} and {port_flag}")
    return UserError(f"cannot serve {what} on {host}:{port} ({reason}); {fix}")


class JsonFormatter(logging.Formatter):
    """One JSON object per log line; `extra={"event": {...}}` fields are merged in."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a JSON line."""
        line = {"time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
                "level": record.levelname.lower(), "logger": record.name,
                "message": record.getMessage()}
        line.update(getattr(record, "event", {}) or {})
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure_json_logging(level: int = logging.INFO) -> None:
    """Send every log record to stderr as a JSON line, but not urllib3's warning of each retry
    it makes inside a request: the actuator reports the failure that matters itself, once."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("urllib3").setLevel(logging.ERROR)
