"""`rlalloc actuate`: run the in-cluster control loop (see docs/actuator.md).

Wires the pieces together — config, Kubernetes client, Prometheus source, policy, status server,
controller — and runs until SIGTERM/SIGINT, when it finishes the current cycle and hands the
lease over, promptly: from the signal on, Kubernetes calls are not retried (an API that has gone
would otherwise hold the exit for every call's backoff). `--once` prints what the cycle decided
on stdout, a move per line and a summary, so a `--dry-run --once` shows what the policy would
do; it starts no status server (its port may be the running actuator's). Everything that can
be wrong with the setup (config, kubeconfig, policy, the PyTorchJob CRD, status port) is checked
before the first cycle and reported as one line, and so is a `--once` cycle that cannot reach
Prometheus or the API server.

Every PyTorchJob patch is checked against the CRD before it is sent: the one the cluster has
installed, read at start-up (a dry run too), or the file RLALLOC_CRD_PATH names, when set.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import threading
from pathlib import Path

from rlalloc.actuator.config import CONFIG_ENV, ActuatorConfig, load_config
from rlalloc.actuator.crd_schema import CRD_PATH_ENV, PyTorchJobValidator, file_validator
from rlalloc.actuator.k8s_names import PYTORCHJOB_CRD
from rlalloc.actuator.kube import KubeClient, KubeError, api_client_from
from rlalloc.actuator.loop import Controller, cycle_summary
from rlalloc.actuator.observe import ObserveError, PrometheusSource
from rlalloc.actuator.server import (
    ActuatorMetrics,
    Health,
    StatusServer,
    configure_json_logging,
    listen_error,
)
from rlalloc.agent.registry import load_policy
from rlalloc.env.errors import UserError
from rlalloc.env.execution import add_ray_flag, executor_for
from rlalloc.env.signals import Signals
from rlalloc.forecaster.signals import load_signals

_EPILOG = """\
settings: defaults < YAML file (--config or $RLALLOC_ACTUATOR_CONFIG) < environment
(RLALLOC_ACTUATOR_<SETTING>) < flags. Every setting is documented in actuator/config.py.

install (docs/actuator.md):
  kubectl apply -f actuator/deploy/         # Namespace, RBAC, ConfigMap, Deployment
  kubectl label pytorchjob NAME rlalloc.io/managed=true   # opt a job in
  start with dry_run: true in the ConfigMap, read the logs, then set it to false

roll back:
  kubectl -n rlalloc-system scale deployment rlalloc-actuator --replicas=0   # stop acting
  kubectl label pytorchjob NAME rlalloc.io/managed-                          # opt a job out
  kubectl uncordon NODE                     # for nodes the actuator cordoned (see its Events)
  kubectl delete -f actuator/deploy/        # remove it entirely
"""

_FLAGS = {
    "prometheus_url": "base URL of the Prometheus HTTP API",
    "kubeconfig": "kubeconfig file (default: in-cluster service account, else ~/.kube/config)",
    "policy": "policy name or saved model (static, tiresias, elastic, reactive, proactive, "
              "elastic-srpt, elastic-srpt-0.25, gavel, sia, ppo, dqn, PATH)",
    "interval_s": "seconds between decision cycles",
    "listen_port": "port of /metrics, /healthz and /livez",
    "identity": "this replica's name in the Lease (default: $POD_NAME, else the host name)",
    "lease_namespace": "namespace of the leader-election Lease",
    "namespaces": "comma-separated namespaces whose PyTorchJobs may be managed (default: all)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `rlalloc actuate`."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _EPILOG
    parser.add_argument("--config", default=os.environ.get(CONFIG_ENV),
                        help=f"YAML settings file (default: ${CONFIG_ENV})")
    defaults = ActuatorConfig()
    for name, help_text in _FLAGS.items():
        if "(default" not in help_text:  # the others say what their empty default means
            help_text += f" (default: {getattr(defaults, name)})".replace("%", "%%")
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, default=None,
                            metavar=name.split("_")[-1].upper(), help=help_text)
    parser.add_argument("--dry-run", dest="dry_run", action="store_true", default=None,
                        help="decide and log, write nothing to the cluster (default: off)")
    parser.add_argument("--leader-election", dest="leader_election",
                        action=argparse.BooleanOptionalAction, default=None,
                        help="hold the Lease before acting (default: on)")
    add_ray_flag(parser, "a planner policy's forks")
    parser.add_argument("--once", action="store_true",
                        help="run one cycle and exit; with --dry-run, a smoke test of the "
                             "installation that writes nothing")


def run(args: argparse.Namespace) -> int:
    """Load everything, then cycle until SIGTERM/SIGINT."""
    forks = None if args.ray is None else executor_for(1, args.ray)
    overrides = {name: getattr(args, name) for name in (*_FLAGS, "dry_run", "leader_election")}
    config = load_config(args.config, os.environ, overrides)
    configure_json_logging()
    log = logging.getLogger("rlalloc.actuator")
    policy = load_policy(config.policy)
    if forks is not None:
        from rlalloc.agent.lookahead import fork_on

        fork_on(policy, forks)
    signals = load_actuator_signals(config.signals)
    kube = KubeClient(config, api_client_from(config))
    validate = pytorchjob_validator(kube)
    identity = config.identity or os.environ.get("POD_NAME") or socket.gethostname()
    metrics, health = ActuatorMetrics(), Health(stale_after_s=5 * config.interval_s + 60.0)
    # one cycle serves no probes: a `--once` smoke test beside the running actuator found its
    # port taken
    server = None if args.once else _status_server(config, metrics, health)
    source = PrometheusSource(config)
    controller = Controller(config, kube, source, policy, identity, validate, signals=signals,
                            metrics=metrics, health=health)
    log.info("actuator started", extra={"event": {
        "identity": identity, "policy": config.policy, "signals": config.signals,
        "dry_run": config.dry_run,
        "status_port": server.port if server else None,
        "prometheus": config.prometheus_url}})
    try:
        if args.once:
            return _run_once(controller, kube)
        stop = threading.Event()

        def stop_soon(signum: int, frame: object) -> None:
            stop.set()
            kube.stop_retrying()  # the cycle under way ends at once if the API has gone

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, stop_soon)
        controller.run(stop)
        counts = controller.policy_counts()
        planner = {} if counts is None else {"contested": counts[0], "deviations": counts[1]}
        log.info("actuator stopped" + ("" if counts is None else
                                       f"; planner: {counts[0]} contested decisions, "
                                       f"{counts[1]} deviated from its base"),
                 extra={"event": {"identity": identity, **planner}})
        return 0
    finally:
        if server is not None:
            server.stop()
        source.close()


def _status_server(config: ActuatorConfig, metrics: ActuatorMetrics,
                   health: Health) -> StatusServer:
    """/metrics, /healthz and /livez, started (a port in use is one line)."""
    try:
        server = StatusServer(config.listen_host, config.listen_port, metrics, health)
    except OSError as err:
        raise listen_error("/metrics, /healthz and /livez", config.listen_host,
                           config.listen_port, err, "--listen-port", "listen_host") from err
    server.start()
    return server


def _run_once(controller: Controller, kube: KubeClient) -> int:
    """One cycle. `--once` is the installation's smoke test, so a cycle that cannot see the
    cluster ends in a one-line error naming what could not be reached and what to check (the
    long-running loop instead keeps retrying, with /healthz red)."""
    report = controller.run_cycle()
    controller.shutdown()
    if report.cause is None:
        print(cycle_summary(report, controller.config.dry_run), flush=True)
        for line in report.lines:
            print(f"  {line}", flush=True)
    if isinstance(report.cause, ObserveError):
        raise UserError(f"--once: cannot read Prometheus at {controller.config.prometheus_url} "
                        f"({report.cause}); check --prometheus-url and that Prometheus is up")
    if isinstance(report.cause, KubeError):
        raise UserError(f"--once: cannot use the Kubernetes API at {kube.server_url} "
                        f"({report.cause}); {_api_check(report.cause.status)}")
    return 0


def pytorchjob_validator(kube: KubeClient) -> PyTorchJobValidator:
    """What every PyTorchJob patch is checked against: the CRD file RLALLOC_CRD_PATH names,
    when it is set, else the CRD the cluster has installed (what its API server checks them
    against). Read at start-up, so a wrong file, or a CRD that cannot be read, stops the
    start-up with one line naming the fix, not every cycle's first write (a dry run, which
    writes nothing, would never notice)."""
    path = os.environ.get(CRD_PATH_ENV)
    if path:
        return file_validator(Path(path))
    try:
        crd = kube.read_pytorchjob_crd()
    except KubeError as err:
        raise UserError(f"cannot read the PyTorchJob CRD from the Kubernetes API at "
                        f"{kube.server_url} ({err}); "
                        f"{_CRD_CHECKS.get(err.status) or _api_check(err.status)}") from err
    return PyTorchJobValidator(crd, f"the cluster's CRD {PYTORCHJOB_CRD}")


_API_CHECKS = {
    401: "check the kubeconfig's credentials",
    403: "check that the RBAC of actuator/deploy/ is applied to this identity",
    404: "check that the kubeconfig points at a Kubernetes API server with the Training "
         "Operator's PyTorchJob CRD installed",
}
"""What to check when the API answers with these statuses (otherwise: is it up at all)."""
_CRD_CHECKS = {
    403: f"grant get on customresourcedefinitions named {PYTORCHJOB_CRD}, as the ClusterRole "
         f"of actuator/deploy/20-rbac.yaml does, or set {CRD_PATH_ENV} to a copy of the CRD",
    404: "the Kubeflow Training Operator's PyTorchJob CRD is not installed in this cluster; "
         "install the Training Operator, or point the kubeconfig at a cluster that has it",
}
"""The same, for reading the PyTorchJob CRD at start-up."""


def _api_check(status: int) -> str:
    """What to check when the API answered a call with HTTP `status` (0: no answer)."""
    return _API_CHECKS.get(status, "check the kubeconfig and that the API server is up")


def load_actuator_signals(kind: str) -> Signals:
    """The look-ahead signals `kind` (as in simulation), or a UserError when the shipped models
    cannot be loaded (missing files, no torch for "lstm")."""
    try:
        return load_signals(kind)
    except (OSError, ImportError, ValueError, KeyError) as err:
        raise UserError(f"signals {kind!r}: cannot load the shipped models ({err}); "
                        "reinstall rlalloc, or set signals: none") from err
