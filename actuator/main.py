"""`rlalloc actuate`: run the in-cluster control loop (see docs/actuator.md).

Wires the pieces together — config, Kubernetes client, Prometheus source, policy, status server,
controller — and runs until SIGTERM/SIGINT, when it finishes the current cycle and hands the
lease over. Everything that can be wrong with the setup (config, kubeconfig, policy, CRD file) is
checked before the first cycle and reported as one line.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import socket
import threading

from actuator.config import ENV_PREFIX, load_config
from actuator.guardrails import Policy
from actuator.kube import KubeClient, api_client_from
from actuator.loop import Controller
from actuator.observe import PrometheusSource
from actuator.server import ActuatorMetrics, Health, StatusServer, configure_json_logging
from env.errors import UserError
from env.signals import Signals, load_signals
from trainer_jobs.crd_schema import CRD_PATH_ENV, resolve_crd_path

CONFIG_ENV = ENV_PREFIX + "CONFIG"
"""Environment variable naming the YAML config file (the mounted ConfigMap)."""

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
              "elastic-srpt, elastic-srpt-0.25, ppo, dqn, PATH)",
    "interval_s": "seconds between decision cycles",
    "listen_port": "port of /metrics, /healthz and /livez",
    "identity": "this replica's name in the Lease (default $POD_NAME, else the host name)",
    "lease_namespace": "namespace of the leader-election Lease",
    "namespaces": "comma-separated namespaces whose PyTorchJobs may be managed (default all)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `rlalloc actuate`."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _EPILOG
    parser.add_argument("--config", default=os.environ.get(CONFIG_ENV),
                        help=f"YAML settings file (default ${CONFIG_ENV})")
    for name, help_text in _FLAGS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, default=None,
                            metavar=name.split("_")[-1].upper(), help=help_text)
    parser.add_argument("--dry-run", dest="dry_run", action="store_true", default=None,
                        help="decide and log, write nothing to the cluster")
    parser.add_argument("--leader-election", dest="leader_election",
                        action=argparse.BooleanOptionalAction, default=None,
                        help="hold the Lease before acting (default: on)")
    parser.add_argument("--once", action="store_true",
                        help="run one cycle and exit (a smoke test of the installation)")


def run(args: argparse.Namespace) -> int:
    """Load everything, then cycle until SIGTERM/SIGINT."""
    overrides = {name: getattr(args, name) for name in (*_FLAGS, "dry_run", "leader_election")}
    config = load_config(args.config, os.environ, overrides)
    configure_json_logging()
    log = logging.getLogger("rlalloc.actuator")
    policy = load_policy(config.policy)
    signals = load_actuator_signals(config.signals)
    crd_path = resolve_crd_path()
    if not crd_path.is_file():
        raise UserError(f"PyTorchJob CRD not found at {crd_path}; set {CRD_PATH_ENV} to "
                        "kubeflow.org_pytorchjobs.v1.9.0.yaml (the image ships it)")
    kube = KubeClient(config, api_client_from(config))
    source = PrometheusSource(config)
    identity = config.identity or os.environ.get("POD_NAME") or socket.gethostname()
    metrics, health = ActuatorMetrics(), Health(stale_after_s=5 * config.interval_s + 60.0)
    server = StatusServer(config.listen_host, config.listen_port, metrics, health)
    server.start()
    controller = Controller(config, kube, source, policy, identity, signals=signals,
                            metrics=metrics, health=health)
    log.info("actuator started", extra={"event": {
        "identity": identity, "policy": config.policy, "signals": config.signals,
        "dry_run": config.dry_run,
        "status_port": server.port, "prometheus": config.prometheus_url}})
    try:
        if args.once:
            controller.run_cycle()
            controller.shutdown()
            return 0 if health.ready()[0] else 1
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        controller.run(stop)
        log.info("actuator stopped", extra={"event": {"identity": identity}})
        return 0
    finally:
        server.stop()
        source.close()


def load_policy(name: str) -> Policy:
    """The policy `name` from agent.registry (UserError if the agent package cannot give it)."""
    try:
        registry = importlib.import_module("agent.registry")
    except ImportError as err:
        raise UserError(f"cannot load policy {name!r}: agent.registry is not installed "
                        f"({err})") from err
    return registry.load_policy(name)


def load_actuator_signals(kind: str) -> Signals:
    """The look-ahead signals `kind` (as in simulation), or a UserError when the shipped models
    cannot be loaded (missing files, no torch for "lstm")."""
    try:
        return load_signals(kind)
    except (OSError, ImportError, ValueError, KeyError) as err:
        raise UserError(f"signals {kind!r}: cannot load the shipped models ({err}); install "
                        "rlalloc with its models/ directory, or set signals: none") from err
