"""Reading Prometheus: one instant query per signal of `Queries`, the cluster clock, the node
telemetry the risk model compares against (`RISK_QUERIES`, again `risk_lag_s` earlier) and the
per-minute demand history for the forecast, through prometheus-api-client.

Every instant query of a cycle is evaluated at the same Prometheus time (the `time` parameter),
so the readings are one consistent picture.

All-or-nothing by design: if any query fails or is slower than `prometheus_timeout_s`, the cycle
gets an `ObserveError` and makes no move — acting on half a picture (say, without the XID query)
is worse than waiting a cycle. Freshness of individual series is judged later, per node and per
job, by the state builder.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Protocol

import numpy as np
import requests
from prometheus_api_client.exceptions import PrometheusApiClientException
from prometheus_api_client.prometheus_connect import PrometheusConnect
from urllib3.util.retry import Retry

from rlalloc.actuator.config import ActuatorConfig, Queries
from rlalloc.actuator.state_builder import MetricResults

INSTANT_QUERIES = tuple(f.name for f in fields(Queries) if f.name not in ("demand_history",
                                                                            "clock"))
"""The `Queries` fields read every cycle as instant vectors."""
RISK_QUERIES = ("xid_errors", "xid_errors_30m", "ecc_errors", "row_remap_failures",
                "ready_flaps", "temperature_excess", "temperature_excess_delta",
                "dcgm_last_sample")
"""The node-telemetry queries also read `risk_lag_s` earlier (the risk model's ``earlier``)."""
DEFAULT_HISTORY_MIN = 360
"""Demand history read for a forecast that does not say how much it wants (6 hours)."""


class ObserveError(Exception):
    """Prometheus did not answer usefully this cycle (down, slow, or an invalid query)."""


@dataclass(frozen=True)
class MetricsSnapshot:
    """What one cycle read from the metrics side."""

    results: MetricResults
    clock_s: float
    """The cluster's clock (Unix seconds) at the time of the reading."""
    demand_history: np.ndarray | None = None
    """Per-minute demand, oldest first, the last sample at the cluster clock's current minute
    (None when not asked for)."""
    earlier: MetricResults = field(default_factory=dict)
    """`RISK_QUERIES` evaluated `risk_lag_s` of cluster time before `results` (empty when not
    asked for)."""


class MetricsSource(Protocol):
    """Where the metrics come from: Prometheus in the cluster, recorded results in tests."""

    def fetch(self, risk_lag_s: float | None, demand_minutes: int) -> MetricsSnapshot:
        """Read every signal now, the node telemetry `risk_lag_s` earlier (None: not needed) and
        `demand_minutes` of per-minute demand (0: none); raise `ObserveError` when impossible."""
        ...


class PrometheusSource:
    """`MetricsSource` backed by a Prometheus server."""

    def __init__(self, config: ActuatorConfig) -> None:
        self._queries = config.queries
        self._timeout_s = config.prometheus_timeout_s
        self._speedup = config.clock_speedup
        # one quick retry for a dropped connection; a slow or down server fails the cycle
        self._client = PrometheusConnect(url=config.prometheus_url,
                                         retry=Retry(total=1, backoff_factor=0.1),
                                         timeout=config.prometheus_timeout_s)

    def fetch(self, risk_lag_s: float | None, demand_minutes: int) -> MetricsSnapshot:
        """Run every instant query now, the risk queries `risk_lag_s` earlier and the demand
        range query (see `MetricsSource.fetch`)."""
        at_s = time.time()  # Prometheus time of every reading of this cycle
        clock_s = self._scalar(self._queries.clock, at_s) if self._queries.clock else at_s
        results = {name: self._query(name, getattr(self._queries, name), at_s)
                   for name in INSTANT_QUERIES}
        earlier: MetricResults = {}
        if risk_lag_s is not None:
            earlier_s = at_s - risk_lag_s / self._speedup
            earlier = {name: self._query(f"{name} (earlier)", getattr(self._queries, name),
                                         earlier_s) for name in RISK_QUERIES}
        history = (self._demand_history(at_s, clock_s, demand_minutes) if demand_minutes > 0
                   else None)
        return MetricsSnapshot(results, clock_s, history, earlier)

    def close(self) -> None:
        """Release the HTTP connections."""
        self._client.close()

    def _query(self, name: str, query: str, at_s: float, scalar: bool = False) -> list:
        """The query's instant-vector result (with `scalar`, a scalar's ``[time, value]`` too);
        `ObserveError` for any other result type, which the state builder cannot read."""
        try:
            result = self._client.custom_query(query, params={"time": repr(at_s)},
                                               timeout=self._timeout_s)
        except _FAILURES as err:
            raise _observe_error(f"Prometheus query {name}", err) from err
        kind = _result_kind(result)
        if kind != "vector" and not (scalar and kind == "scalar"):
            raise ObserveError(
                f"Prometheus query {name} ({query!r}) returned a {kind}, not an instant vector"
                + (" or a scalar" if scalar else "") + "; fix it in the actuator's queries "
                "(a range selector like [5m] needs a function around it, e.g. max_over_time)")
        return result

    def _scalar(self, query: str, at_s: float) -> float:
        """The clock: a scalar or a one-series vector, finite (``scalar()`` of an absent
        series is NaN, and a NaN clock turned every cooldown off)."""
        result = self._query("clock", query, at_s, scalar=True)
        if _result_kind(result) == "scalar":
            value = float(result[1])
        elif result:
            value = float(result[0]["value"][1])
        else:
            value = math.nan
        if not math.isfinite(value):
            raise ObserveError(f"the clock query {query!r} returned "
                               + ("no series" if math.isnan(value) and not result
                                  else f"{value}, not a time")
                               + "; is the exporter that serves it (the twin's) up, and is "
                               "Prometheus scraping it?")
        return value

    def _demand_history(self, at_s: float, clock_s: float, minutes: int) -> np.ndarray:
        """`minutes` samples, one per minute of cluster time, the last at the start of the
        cluster clock's current minute (where the simulator takes its samples). Gaps (no data,
        NaN) are left out; the forecast pads a short history as the simulator does."""
        minute_s = 60.0 / self._speedup
        end_s = at_s - (clock_s % 60.0) / self._speedup
        start_s = end_s - (minutes - 1) * minute_s
        try:
            # the client rounds start/end to whole seconds; the params keep them exact
            data = self._client.custom_query_range(
                self._queries.demand_history, start_time=_datetime(start_s),
                end_time=_datetime(end_s), step=repr(minute_s),
                params={"start": repr(start_s), "end": repr(end_s)}, timeout=self._timeout_s)
        except _FAILURES as err:
            raise _observe_error("Prometheus demand history", err) from err
        values = [float(v) for _, v in data[0]["values"]] if data else []
        return np.asarray([v for v in values if math.isfinite(v)], dtype=np.float64)


@dataclass(frozen=True)
class RecordedMetrics:
    """`MetricsSource` that replays recorded results (benchmark, tests, offline parity)."""

    snapshot: MetricsSnapshot

    def fetch(self, risk_lag_s: float | None, demand_minutes: int) -> MetricsSnapshot:
        """The recorded snapshot, whatever the time."""
        return self.snapshot


_FAILURES = (requests.RequestException, PrometheusApiClientException, ValueError, KeyError,
             TypeError)
"""What a request through the client raises when Prometheus is down, slow, refuses the query, or
answers with something other than its API's JSON (the client indexes ``["data"]["result"]``
of any 200 reply: KeyError or TypeError when those are missing)."""


def _result_kind(result: object) -> str:
    """What a query's ``data.result`` is: "vector" (a list of series with one ``value`` each;
    empty too), "scalar" or "string" (``[time, value]``), "range vector" (series with
    ``values``) or "malformed result"; the client hands back ``data.result`` without its
    ``resultType``."""
    if isinstance(result, list) and all(isinstance(s, dict) and "value" in s for s in result):
        return "vector"
    if isinstance(result, list) and len(result) == 2 and isinstance(result[0], int | float):
        return "scalar" if isinstance(result[1], str) and _is_number(result[1]) else "string"
    if isinstance(result, list) and all(isinstance(s, dict) and "values" in s for s in result):
        return "range vector"
    return "malformed result"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _observe_error(what: str, err: Exception) -> ObserveError:
    """The `ObserveError` of a failed request; a reply that is not JSON (an exporter's /metrics
    page, say) is named as not the Prometheus HTTP API, not by the JSON parser's complaint."""
    if isinstance(err, requests.JSONDecodeError):
        return ObserveError(f"{what} failed: the server answered, but not as the Prometheus HTTP "
                            "API (not JSON); is this Prometheus's URL?")
    if isinstance(err, KeyError | TypeError):
        return ObserveError(f"{what} failed: the server answered JSON without the Prometheus "
                            "HTTP API's data.result; is this Prometheus's URL?")
    return ObserveError(f"{what} failed: {_short(err)}")


def _datetime(unix_s: float) -> datetime:
    return datetime.fromtimestamp(unix_s, tz=UTC)


def _short(err: Exception) -> str:
    """The first line of `err`, or of the reason inside it: requests wraps a refused
    connection or a read timeout in a retry error whose text is mostly the query URL."""
    reason = getattr(err.args[0], "reason", None) if err.args else None
    text = str(reason or err)
    return (text.splitlines()[0] if text else type(err).__name__)[:200]
