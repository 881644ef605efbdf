"""Every knob of the actuator in one frozen dataclass, from a YAML file, the environment and flags.

Precedence (lowest to highest): the defaults below, the YAML file (a ConfigMap mounted into the
pod), environment variables ``RLALLOC_ACTUATOR_<FIELD>`` (upper case), then command-line flags.
The PromQL queries (`queries:`, a mapping) and the GPU product table (`gpu_products:`, a list)
come from the file only. A malformed file or value, or an unknown RLALLOC_ACTUATOR_* variable,
ends the start-up with one `UserError` naming the file/variable, the key and the fix, so a bad
ConfigMap shows up as one line in `kubectl logs`, not as a traceback at the first cycle.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from rlalloc.actuator.gpu_products import DEFAULT_GPU_PRODUCTS, GpuProduct, checked_table
from rlalloc.actuator.k8s_names import NAMESPACE_RULE, is_namespace_name
from rlalloc.env.cluster import DEFAULT_GPU_TYPE, gpu_type_named
from rlalloc.env.errors import UserError
from rlalloc.env.signals import SIGNAL_KINDS
from rlalloc.env.telemetry_names import (
    DCGM_ECC_DBE_VOLATILE,
    DCGM_GPU_TEMP,
    DCGM_GPU_UTIL,
    DCGM_HOSTNAME_LABEL,
    DCGM_ROW_REMAP_FAILURE,
    DCGM_XID_ERRORS,
    KSM_NODE_CONDITION,
    MANAGED_LABEL,
    TRAINER_LAST_CHECKPOINT_STEP,
    TRAINER_LAST_CHECKPOINT_TIME,
    TRAINER_SAMPLES_PER_S,
    TRAINER_STEP,
    TRAINER_TOTAL_STEPS,
)

ENV_PREFIX = "RLALLOC_ACTUATOR_"
"""Environment variables named ENV_PREFIX + FIELD (upper case) override the file."""
CONFIG_ENV = ENV_PREFIX + "CONFIG"
"""Environment variable naming the YAML config file (the mounted ConfigMap)."""

_H = DCGM_HOSTNAME_LABEL

NORMAL_IDLE_TEMPERATURE_C = 35.0
"""A healthy idle GPU's temperature in the default `temperature_excess` query (the simulator's
`SimParams.base_temperature_c`)."""
NORMAL_BUSY_RISE_C = 40.0
"""How much warmer a healthy fully busy GPU runs in that query (the simulator's
`SimParams.busy_temperature_rise_c`)."""


def _normal_temperature(offset: str = "") -> str:
    """PromQL: each node's mean GPU temperature minus what a healthy GPU runs at under its load
    (idle + rise x utilisation), `offset` (e.g. " offset 30m") earlier."""
    rise_per_percent = NORMAL_BUSY_RISE_C / 100.0
    return (f"(avg by ({_H}) ({DCGM_GPU_TEMP}{offset}) - {rise_per_percent:g} * "
            f"avg by ({_H}) ({DCGM_GPU_UTIL}{offset}) - {NORMAL_IDLE_TEMPERATURE_C:g})")


@dataclass(frozen=True)
class Queries:
    """PromQL for each signal; the defaults use the real exporters' names (env.telemetry_names).

    Per-node queries must return one series per node labelled by `ActuatorConfig.node_label`
    (dcgm-exporter's `Hostname`) or, for kube-state-metrics, by `node`; per-job queries one series
    per job labelled `namespace` and `ActuatorConfig.trainer_job_label`. Windows are real time:
    the twin (`rlalloc twin`) writes them scaled to its acceleration into its actuator.yaml.
    """

    gpu_util: str = f"avg by ({_H}) ({DCGM_GPU_UTIL}) / 100"
    """Mean GPU utilisation per node in [0, 1]."""
    gpu_temperature: str = f"avg by ({_H}) ({DCGM_GPU_TEMP})"
    """Mean GPU temperature per node, Celsius."""
    temperature_excess: str = _normal_temperature()
    """Temperature per node above its normal: the simulator's model, idle temperature + rise x
    utilisation (`NORMAL_IDLE_TEMPERATURE_C`, `NORMAL_BUSY_RISE_C`); calibrate the constants to
    your GPUs, or replace the normal by a trailing median, e.g. ``avg by (Hostname)
    (DCGM_FI_DEV_GPU_TEMP) - avg by (Hostname) (quantile_over_time(0.5,
    DCGM_FI_DEV_GPU_TEMP[1d]))``."""
    temperature_excess_delta: str = (f"{_normal_temperature()} - "
                                     f"{_normal_temperature(' offset 30m')}")
    """Change of `temperature_excess` over the last 30 minutes (a node without samples then
    has none: no signal)."""
    xid_errors: str = f"sum by ({_H}) (changes({DCGM_XID_ERRORS}[5m]))"
    """New XID errors per node in 5 minutes (the gauge holds the last XID, so count changes)."""
    xid_errors_30m: str = f"sum by ({_H}) (changes({DCGM_XID_ERRORS}[30m]))"
    """New XID errors per node in 30 minutes."""
    ecc_errors: str = f"sum by ({_H}) (increase({DCGM_ECC_DBE_VOLATILE}[30m]))"
    """New uncorrectable (double-bit) ECC errors per node in 30 minutes."""
    row_remap_failures: str = f"max by ({_H}) ({DCGM_ROW_REMAP_FAILURE})"
    """1 when a GPU of the node failed to remap an HBM row; counted as one more ECC error."""
    ready_flaps: str = (f'sum by (node) (resets({KSM_NODE_CONDITION}'
                        f'{{condition="Ready",status="true"}}[1h]))')
    """Ready -> NotReady transitions per node in the last hour (kube-state-metrics)."""
    dcgm_last_sample: str = f"max by ({_H}) (timestamp({DCGM_GPU_TEMP}))"
    """Time of each node's newest DCGM sample; older than `max_metric_age_s` = missing."""
    trainer_throughput: str = f"max by (namespace, job) ({TRAINER_SAMPLES_PER_S})"
    """Training throughput per job."""
    trainer_step: str = f"max by (namespace, job) ({TRAINER_STEP})"
    """Optimizer steps done per job."""
    trainer_total_steps: str = f"max by (namespace, job) ({TRAINER_TOTAL_STEPS})"
    """Steps each job is configured to run (progress = step / total)."""
    trainer_last_checkpoint: str = f"max by (namespace, job) ({TRAINER_LAST_CHECKPOINT_TIME})"
    """Unix time of each job's latest complete checkpoint."""
    trainer_checkpoint_step: str = f"max by (namespace, job) ({TRAINER_LAST_CHECKPOINT_STEP})"
    """Step in each job's latest complete checkpoint: where a job that lost a node resumes."""
    trainer_last_sample: str = f"max by (namespace, job) (timestamp({TRAINER_STEP}))"
    """Time of each job's newest trainer sample; older than `max_metric_age_s` = missing."""
    demand_history: str = (
        'sum(kube_pod_container_resource_requests{resource="nvidia_com_gpu"}'
        ' * on(namespace, pod) group_left()'
        ' max by (namespace, pod) (kube_pod_status_phase{phase=~"Pending|Running"}))'
        ' / sum(kube_node_status_allocatable{resource="nvidia_com_gpu"})')
    """Cluster GPU demand as a share of capacity, read as a per-minute range (as many minutes as
    the demand forecast of `signals` wants) when `signals` is not "none": the GPU requests of
    pods Pending or Running (kube-state-metrics keeps exporting finished pods' requests, which
    would read as demand wherever completed pods are kept). The simulator counts queued jobs'
    GPUs too: export them (e.g. from the queue) and add them here to match it."""
    clock: str = ""
    """PromQL scalar giving the cluster's clock in Unix seconds; empty = this machine's clock.
    The digital twin exports `rlalloc_twin_clock_seconds` so policies see simulated time."""


@dataclass(frozen=True)
class ActuatorConfig:
    """Settings of `rlalloc actuate` (see docs/actuator.md for the install and rollback steps)."""

    prometheus_url: str = "http://prometheus-k8s.monitoring.svc:9090"
    """Base URL of the Prometheus HTTP API."""
    prometheus_timeout_s: float = 5.0
    """Per-query timeout; a slower Prometheus counts as down for the cycle (no moves)."""
    max_metric_age_s: float = 120.0
    """A sample older than this is stale and treated as missing."""
    kubeconfig: str = ""
    """Path of a kubeconfig; empty = in-cluster service account, else ~/.kube/config."""
    kube_context: str = ""
    """kubeconfig context to use; empty = the current context."""
    namespaces: tuple[str, ...] = ()
    """Namespaces whose PyTorchJobs may be managed; empty = all namespaces."""
    managed_label: str = MANAGED_LABEL
    """Opt-in label; only PyTorchJobs carrying it with value "true" are ever touched."""
    policy: str = "elastic"
    """Policy name or path for `rlalloc.agent.registry.load_policy` (static, tiresias, elastic,
    reactive, proactive, elastic-srpt, elastic-srpt-0.25, gavel, sia, ppo, dqn, or a saved
    model)."""
    interval_s: float = 30.0
    """Seconds between decision cycles."""
    dry_run: bool = False
    """Decide and log, but write nothing to the Kubernetes API (no lease, no events either)."""
    max_actions_per_cycle: int = 8
    """Actions the policy may take in one cycle before the next observation."""
    cooldown_s: float = 300.0
    """A job changed less than this long ago is left alone (failover moves are exempt)."""
    max_disruptions_per_cycle: int = 2
    """Moves that restart running workers (resize, suspend, migrate) allowed per cycle."""
    max_disruptions_per_hour: int = 20
    """Moves that restart running workers allowed in any sliding hour."""
    move_backoff_s: float = 60.0
    """Wait after a job's move failed before the job is changed again; doubles each failure."""
    move_backoff_max_s: float = 300.0
    """Longest wait between tries of a job's failing move (the doubling stops there)."""
    max_move_failures: int = 5
    """Consecutive failed tries after which a job's move is given up: rolled back, the job
    marked (Event MoveGivenUp, annotation rlalloc.io/held) and left alone until it changes."""
    require_node_telemetry: bool = True
    """Refuse to place workers on a node whose DCGM metrics are missing or stale."""
    node_affinity: bool = True
    """Pin new workers to the policy's nodes (required node affinity on the pod template);
    False = only change the worker count through the /scale subresource."""
    pod_grace_s: int = 45
    """Grace period when deleting a job's pod on a reachable node (the trainer checkpoints on
    SIGTERM); pods on an unreachable node are deleted with grace 0. A delete's grace replaces
    the pod's own terminationGracePeriodSeconds, so it must be at least that: the shipped
    trainer manifest budgets 30 s (trainer) < 35 s (torchrun) < 45 s (pod), and the 30 s this
    was SIGKILLed a trainer still writing its final checkpoint."""
    api_retries: int = 4
    """Retries of a Kubernetes API call answered 409, 429 or 5xx (or not answered)."""
    api_backoff_s: float = 0.5
    """First retry delay; doubles each retry (429 Retry-After wins when longer)."""
    api_timeout_s: float = 10.0
    """Timeout of one Kubernetes API request."""
    leader_election: bool = True
    """Hold a coordination.k8s.io Lease before writing, so only one replica acts."""
    lease_name: str = "rlalloc-actuator"
    """Name of the Lease object."""
    lease_namespace: str = "rlalloc-system"
    """Namespace of the Lease object."""
    lease_duration_s: float = 90.0
    """How long a lease holds without renewal; a standby takes over after this. The holder
    renews it once per cycle, so it must last at least two `interval_s` (checked): a lease no
    longer than a cycle lapses whenever one cycle runs late, and a standby takes it from a
    healthy leader."""
    identity: str = ""
    """This replica's name in the Lease; empty = $POD_NAME, else the host name."""
    listen_host: str = "0.0.0.0"
    """Address of the /metrics, /healthz and /livez server."""
    listen_port: int = 8080
    """Port of the /metrics, /healthz and /livez server (0 = any free port)."""
    node_label: str = DCGM_HOSTNAME_LABEL
    """Label of the DCGM series that names the Kubernetes node."""
    trainer_job_label: str = "job"
    """Label of the trainer series naming the PyTorchJob (scrape with honor_labels: true)."""
    gpu_resource: str = "nvidia.com/gpu"
    """Extended resource counted as GPUs on nodes and pods."""
    rack_label: str = "topology.rlalloc.io/rack"
    """Node label giving the rack (or switch); nodes without it are in rack 0."""
    gpu_type_label: str = "nvidia.com/gpu.product"
    """Node label giving the GPU model (set by NVIDIA GPU Feature Discovery), which
    `gpu_products` maps to a simulator GPU type."""
    gpu_products: tuple[GpuProduct, ...] = DEFAULT_GPU_PRODUCTS
    """The product table (file only): a node's `gpu_type_label` value is the type of the first
    row whose regular expression matches it whole, in any case, after a trailing ``-SHARED``
    (time-sliced GPUs) is removed. Rows a file gives (a list of ``{pattern: REGEX, type:
    TYPE}``) come before the shipped ones (`rlalloc.actuator.gpu_products.DEFAULT_GPU_PRODUCTS`),
    so they add products and override the shipped rows. A node whose label no row matches is
    kept off every new placement, with one warning naming it (see `state_builder`)."""
    default_gpu_type: str = DEFAULT_GPU_TYPE
    """GPU type of a node without the `gpu_type_label` label (T4, the Pollux profiles')."""
    event_component: str = "rlalloc-actuator"
    """`source.component` of the Events the actuator writes."""
    signals: str = "standin"
    """Look-ahead signals in the state, as in simulation
    (`rlalloc.forecaster.signals.load_signals`): "none" (zeros), "standin" (EWMA demand forecast
    + risk model, the simulator's default) or "lstm" (the LSTM demand forecaster + risk model)."""
    clock_speedup: float = 1.0
    """Cluster-clock seconds per Prometheus second: 1 in a real cluster, the twin's `--speed`
    against the twin. Look-backs in cluster time (the risk model's lag, the per-minute demand
    history) are divided by it to give Prometheus times."""
    queries: Queries = field(default_factory=Queries)
    """PromQL per signal (file only)."""

    def __post_init__(self) -> None:
        problems = _range_problems(self)
        if problems:
            raise InvalidSettings(problems)
        # the types as the simulator spells them (a file may say a100): checked above
        object.__setattr__(self, "gpu_products", checked_table(self.gpu_products, "gpu_products"))
        object.__setattr__(self, "default_gpu_type",
                           gpu_type_named(self.default_gpu_type, "default_gpu_type"))


class InvalidSettings(UserError):
    """Settings out of range; `problems` maps each setting to what is wrong with it, so that
    `load_config` can say where each bad value came from (file, environment or flag)."""

    def __init__(self, problems: dict[str, str]) -> None:
        super().__init__("invalid actuator setting: " + "; ".join(problems.values()))
        self.problems = problems


def _range_problems(config: ActuatorConfig) -> dict[str, str]:
    positive = ("prometheus_timeout_s", "max_metric_age_s", "interval_s", "api_timeout_s",
                "lease_duration_s", "clock_speedup")
    non_negative = ("cooldown_s", "max_disruptions_per_cycle", "max_disruptions_per_hour",
                    "api_retries", "api_backoff_s", "pod_grace_s", "move_backoff_s",
                    "move_backoff_max_s")
    # finite too: NaN passed "< 0" (a NaN cooldown refused nothing), and an infinite timeout
    # overflowed the HTTP client's clock
    problems = {name: f"{name} must be a finite number > 0 (got {getattr(config, name)})"
                for name in positive
                if not 0 < getattr(config, name) < math.inf}
    problems |= {name: f"{name} must be a finite number >= 0 (got {getattr(config, name)})"
                 for name in non_negative
                 if not 0 <= getattr(config, name) < math.inf}
    for name in ("max_actions_per_cycle", "max_move_failures"):
        if getattr(config, name) < 1:
            problems[name] = f"{name} must be >= 1 (got {getattr(config, name)})"
    if "move_backoff_max_s" not in problems and config.move_backoff_max_s < config.move_backoff_s:
        problems["move_backoff_max_s"] = (
            f"move_backoff_max_s must be at least move_backoff_s (got "
            f"{config.move_backoff_max_s:g} with move_backoff_s {config.move_backoff_s:g})")
    if config.leader_election and config.lease_duration_s < 2 * config.interval_s:
        problems["lease_duration_s"] = (
            f"lease_duration_s must be at least twice interval_s, as the Lease is renewed once "
            f"per cycle (got {config.lease_duration_s:g} with interval_s {config.interval_s:g})")
    if not 0 <= config.listen_port <= 65535:
        problems["listen_port"] = f"listen_port must be a TCP port (got {config.listen_port})"
    if not config.prometheus_url.startswith(("http://", "https://")):
        problems["prometheus_url"] = (f"prometheus_url must start with http:// or https:// "
                                      f"(got {config.prometheus_url!r})")
    for name, values in (("lease_namespace", (config.lease_namespace,)),
                         ("namespaces", config.namespaces)):
        if bad := next((v for v in values if not is_namespace_name(v)), None):
            problems[name] = f"{name}: {bad!r} cannot name a namespace ({NAMESPACE_RULE})"
    if config.signals not in SIGNAL_KINDS:
        problems["signals"] = (f"signals must be one of {', '.join(SIGNAL_KINDS)} "
                               f"(got {config.signals!r})")
    try:
        checked_table(config.gpu_products, "gpu_products")
    except UserError as err:
        problems["gpu_products"] = str(err)
    try:
        gpu_type_named(config.default_gpu_type, "default_gpu_type")
    except UserError as err:
        problems["default_gpu_type"] = str(err)
    return problems


def load_config(path: str | Path | None = None, environ: dict[str, str] | None = None,
                overrides: dict[str, Any] | None = None) -> ActuatorConfig:
    """Build the config from the YAML file at `path`, then `environ`, then `overrides` (flags).

    `overrides` holds only the flags the user gave (None values are ignored). Raises
    `UserError` for unknown keys, wrong types and out-of-range values.
    """
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}  # where each value came from, for the error naming a bad one
    if path:
        values.update(_read_file(Path(path)))
        origins.update(dict.fromkeys(values, str(path)))
    environ = os.environ if environ is None else environ
    _check_environment(environ)
    for f in fields(ActuatorConfig):
        name = ENV_PREFIX + f.name.upper()
        if f.name not in _FILE_ONLY and name in environ:
            origins[f.name] = f"environment variable {name}"
            values[f.name] = _coerce(f, environ[name], origins[f.name])
    for key, value in (overrides or {}).items():
        if value is not None:
            origins[key] = f"flag --{key.replace('_', '-')}"
            values[key] = _coerce(_field(key), value, origins[key])
    try:
        return ActuatorConfig(**values)
    except InvalidSettings as err:
        raise UserError("; ".join(
            f"{_blame(name, origins)}: invalid actuator setting: {problem}"
            for name, problem in err.problems.items())) from err


_FILE_ONLY = ("queries", "gpu_products")
"""Settings too structured for a variable or a flag: the file gives them."""
_CHECKED_AGAINST = {"lease_duration_s": "interval_s", "move_backoff_max_s": "move_backoff_s"}
"""Settings checked against another one: the error names where either value came from."""
_PRECEDENCE = ("flag --", "environment variable ")
"""Origins that override others, highest first (then the file)."""


def _blame(name: str, origins: dict[str, str]) -> str:
    """Where the bad value of `name` came from ("default" when nowhere): for a setting checked
    against another one, where either came from, the highest precedence first, so a flag
    that broke a file's lease duration is named (the file alone was named before)."""
    found = {origins[n] for n in (name, _CHECKED_AGAINST.get(name, "")) if n in origins}
    ranked = sorted(found, key=lambda origin: next(
        (i for i, prefix in enumerate(_PRECEDENCE) if origin.startswith(prefix)),
        len(_PRECEDENCE)))
    return " and ".join(ranked) or "default"


def _check_environment(environ: dict[str, str]) -> None:
    """Refuse an unknown RLALLOC_ACTUATOR_* variable: a misspelled one, silently ignored, would
    leave its setting at the default while the user believes it set (as a misspelled file key
    would, which `_read_file` refuses too)."""
    settings = [f.name for f in fields(ActuatorConfig) if f.name not in _FILE_ONLY]
    known = [ENV_PREFIX + name.upper() for name in settings] + [CONFIG_ENV]
    for name in sorted(environ):
        if name.startswith(ENV_PREFIX) and name not in known and not _is_service_link(
                name, environ[name]):
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise UserError(f"environment variable {name}: unknown actuator setting; {hint}"
                            f"use {ENV_PREFIX}<SETTING> for one of {', '.join(settings)}, or "
                            f"{CONFIG_ENV}")


_SERVICE_LINK = re.compile(r"(_\w+)?(_SERVICE_HOST|_SERVICE_PORT(_\w+)?"
                           r"|_PORT_\d+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)")
"""The names of Kubernetes' service-link variables after the Service's own name."""


def _is_service_link(name: str, value: str) -> bool:
    """True for the variables Kubernetes puts into every pod for each Service of its namespace
    (`enableServiceLinks`): a Service named rlalloc-actuator, the natural name for one in front
    of /metrics, gives RLALLOC_ACTUATOR_SERVICE_HOST, RLALLOC_ACTUATOR_PORT=tcp://... and
    more, which are no settings and must not stop the start-up."""
    suffix = name[len(ENV_PREFIX) - 1:]
    return bool(_SERVICE_LINK.fullmatch(suffix)) or (
        name.endswith("_PORT") and value.startswith(("tcp://", "udp://", "sctp://")))


def _read_file(path: Path) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as err:
        raise UserError(f"{path}: cannot read the actuator config ({err.strerror})") from err
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise UserError(f"{path}: not valid YAML{where}; fix the file") from err
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise UserError(f"{path}: expected a mapping of settings, got {type(doc).__name__}")
    values: dict[str, Any] = {}
    for key, raw in doc.items():
        f = _field(str(key), where=str(path))
        if f.name == "queries":
            values["queries"] = _queries(raw, path)
        elif f.name == "gpu_products":
            values["gpu_products"] = _gpu_products(raw, path) + DEFAULT_GPU_PRODUCTS
        else:
            values[f.name] = _coerce(f, raw, f"{path}: {key}")
    return values


def _queries(raw: object, path: Path) -> Queries:
    if not isinstance(raw, dict):
        raise UserError(f"{path}: queries must be a mapping of signal name to PromQL")
    known = {f.name for f in fields(Queries)}
    for key, value in raw.items():
        if key not in known:
            raise UserError(f"{path}: queries.{key} is not a known signal; "
                            f"use one of {', '.join(sorted(known))}")
        if not isinstance(value, str):
            raise UserError(f"{path}: queries.{key} must be a PromQL string")
    return Queries(**raw)


def _gpu_products(raw: object, path: Path) -> tuple[GpuProduct, ...]:
    """The file's rows of the product table (their patterns and types are checked with the
    other settings, `_range_problems`)."""
    if not isinstance(raw, list):
        raise UserError(f"{path}: gpu_products must be a list of {{pattern: REGEX, type: "
                        f"GPU_TYPE}} mappings, got {raw!r}")
    for i, row in enumerate(raw):
        if (not isinstance(row, dict) or set(row) != {"pattern", "type"}
                or not isinstance(row["pattern"], str)):
            raise UserError(f"{path}: gpu_products[{i}] must be a mapping {{pattern: REGEX, "
                            f"type: GPU_TYPE}}, got {row!r}")
    return tuple(GpuProduct(row["pattern"], row["type"]) for row in raw)


def _field(name: str, where: str = "") -> dataclasses.Field:
    for f in fields(ActuatorConfig):
        if f.name == name:
            return f
    prefix = f"{where}: " if where else ""
    raise UserError(f"{prefix}unknown actuator setting {name!r}; known settings: "
                    f"{', '.join(f.name for f in fields(ActuatorConfig))}")


_HINTS = typing.get_type_hints(ActuatorConfig)


def _coerce(f: dataclasses.Field, raw: object, where: str) -> Any:
    """Convert `raw` (YAML value, env string or flag value) to the field's type, or explain."""
    kind = _HINTS[f.name]
    try:
        if kind is bool:
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in ("true", "1", "yes", "on"):
                return True
            if text in ("false", "0", "no", "off"):
                return False
            raise ValueError(raw)
        if kind is int:
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError(raw)
            return int(raw)
        if kind is float:
            if isinstance(raw, bool):
                raise ValueError(raw)
            return float(raw)
        if kind is str:
            if isinstance(raw, (dict, list)):
                raise ValueError(raw)
            return str(raw)
        if typing.get_origin(kind) is tuple or isinstance(kind, types.GenericAlias):
            items = raw.split(",") if isinstance(raw, str) else raw
            if not isinstance(items, (list, tuple)):
                raise ValueError(raw)
            return tuple(str(item).strip() for item in items if str(item).strip())
    except (TypeError, ValueError) as err:
        raise UserError(f"{where}: expected {getattr(kind, '__name__', kind)} for "
                        f"{f.name}, got {raw!r}") from err
    raise AssertionError(f"unhandled config field type {kind!r} of {f.name}")
