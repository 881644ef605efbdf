"""Reading Prometheus: one instant query per signal of `Queries`, the cluster clock and the demand
history, through prometheus-api-client.

All-or-nothing by design: if any query fails or is slower than `prometheus_timeout_s`, the cycle
gets an `ObserveError` and makes no move — acting on half a picture (say, without the XID query)
is worse than waiting a cycle. Freshness of individual series is judged later, per node and per
job, by the state builder.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Protocol

import numpy as np
import requests
from prometheus_api_client.exceptions import PrometheusApiClientException
from prometheus_api_client.prometheus_connect import PrometheusConnect
from urllib3.util.retry import Retry

from actuator.config import ActuatorConfig, Queries
from actuator.state_builder import MetricResults

INSTANT_QUERIES = tuple(f.name for f in fields(Queries) if f.name not in ("demand_history",
                                                                            "clock"))
"""The `Queries` fields read every cycle as instant vectors."""
DEMAND_HISTORY_S = 6 * 3600.0
"""Length of the demand history handed to the forecaster (per-minute samples)."""


class ObserveError(Exception):
    """Prometheus did not answer usefully this cycle (down, slow, or an invalid query)."""


@dataclass(frozen=True)
class MetricsSnapshot:
    """What one cycle read from the metrics side."""

    results: MetricResults
    clock_s: float
    """The cluster's clock (Unix seconds) at the time of the reading."""
    demand_history: np.ndarray | None = None


class MetricsSource(Protocol):
    """Where the metrics come from: Prometheus in the cluster, recorded results in tests."""

    def fetch(self, with_demand_history: bool) -> MetricsSnapshot:
        """Read every signal now; raise `ObserveError` when that is impossible."""
        ...


class PrometheusSource:
    """`MetricsSource` backed by a Prometheus server."""

    def __init__(self, config: ActuatorConfig) -> None:
        self._queries = config.queries
        self._timeout_s = config.prometheus_timeout_s
        # one quick retry for a dropped connection; a slow or down server fails the cycle
        self._client = PrometheusConnect(url=config.prometheus_url,
                                         retry=Retry(total=1, backoff_factor=0.1),
                                         timeout=config.prometheus_timeout_s)

    def fetch(self, with_demand_history: bool) -> MetricsSnapshot:
        """Run every instant query (and the demand range query when asked)."""
        clock_s = (self._scalar(self._queries.clock) if self._queries.clock else time.time())
        results = {name: self._query(name, getattr(self._queries, name))
                   for name in INSTANT_QUERIES}
        history = self._demand_history(clock_s) if with_demand_history else None
        return MetricsSnapshot(results, clock_s, history)

    def close(self) -> None:
        """Release the HTTP connections."""
        self._client.close()

    def _query(self, name: str, query: str) -> list[dict]:
        try:
            return self._client.custom_query(query, timeout=self._timeout_s)
        except (requests.RequestException, PrometheusApiClientException, ValueError) as err:
            raise ObserveError(f"Prometheus query {name} failed: {_short(err)}") from err

    def _scalar(self, query: str) -> float:
        result = self._query("clock", query)
        if not result:
            raise ObserveError(f"the clock query {query!r} returned no series")
        return float(result[0]["value"][1])

    def _demand_history(self, clock_s: float) -> np.ndarray:
        try:
            data = self._client.custom_query_range(
                self._queries.demand_history,
                start_time=_datetime(clock_s - DEMAND_HISTORY_S), end_time=_datetime(clock_s),
                step="60s")
        except (requests.RequestException, PrometheusApiClientException, ValueError) as err:
            raise ObserveError(f"Prometheus demand history failed: {_short(err)}") from err
        values = data[0]["values"] if data else []
        return np.asarray([float(v) for _, v in values], dtype=np.float32)


@dataclass(frozen=True)
class RecordedMetrics:
    """`MetricsSource` that replays recorded results (benchmark, tests, offline parity)."""

    snapshot: MetricsSnapshot

    def fetch(self, with_demand_history: bool) -> MetricsSnapshot:
        """The recorded snapshot, whatever the time."""
        return self.snapshot


def _datetime(unix_s: float) -> datetime:
    return datetime.fromtimestamp(unix_s, tz=UTC)


def _short(err: Exception) -> str:
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    return text[:200]
