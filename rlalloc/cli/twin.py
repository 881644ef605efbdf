"""`rlalloc twin`: the simulator as a cluster you can point the actuator (or kubectl) at.

It serves a Kubernetes API (Nodes, Pods, PyTorchJobs, Events, Leases) and a Prometheus exporter
under the real exporters' metric names, runs the workload in accelerated real time, and reacts to
the actuator's writes like the training operator and the scheduler. It writes the three files a
first demo needs — a kubeconfig, a Prometheus config and an actuator config — and prints the two
commands to run next. While it runs it prints a line per node warning, failure, repair and
finished job, at its simulated time, and when it stops, what the run came to (`TwinSummary`):
a user who scripted a failure sees it happen and what the actuator did about it.

The demo files point at this twin's ports, so a second twin is refused the same directory unless
`--force`: it would leave the first one's files pointing at its own ports.
"""

from __future__ import annotations

import argparse
import math
import os
import queue
import signal
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from rlalloc.actuator.config import load_config
from rlalloc.actuator.k8s_names import NAMESPACE_RULE, is_namespace_name
from rlalloc.cli.argtypes import SEED, above, at_least, out_path, within
from rlalloc.env.cluster import ClusterSpec, add_cluster_flag
from rlalloc.env.errors import UserError
from rlalloc.env.failures import (
    FAILURE_PRESETS,
    LLAMA3_FAILURES_PER_GPU_DAY,
    MAX_FAILURES_PER_GPU_DAY,
    STRESS_FAILURES_PER_GPU_DAY,
    FailureParams,
    parse_failure_rate,
)
from rlalloc.env.output import out_dir_for_run
from rlalloc.env.params import SimParams
from rlalloc.env.scenario import Scenario, build_scenario
from rlalloc.env.workload.loader import GENERATED_SOURCES
from rlalloc.forecaster.signals import default_signals

if TYPE_CHECKING:
    from rlalloc.actuator.twin.runtime import ScriptedFailure, TwinEvent, TwinSummary


_PORT = within(0, 65535, int)
"""A TCP port to listen on; 0 lets the system pick a free one."""
DEMO_FILES = ("kubeconfig", "prometheus.yml", "actuator.yaml")
"""What the twin writes into --out-dir."""
_PROMETHEUS_DEFAULT_PORT = 9090
"""Where Prometheus listens unless told `--web.listen-address` (all interfaces)."""
_EVENTS_EVERY_S = 0.2
"""Wall seconds between looks at the twin's events (12 simulated seconds at 60x)."""


def _namespace(text: str) -> str:
    """A flag type: a valid namespace name (`is_namespace_name`)."""
    if not is_namespace_name(text):
        raise argparse.ArgumentTypeError(f"{text!r} cannot name a namespace ({NAMESPACE_RULE})")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `rlalloc twin`."""
    parser.add_argument("--workload", default="synthetic:40:0.9",
                        help=f"workload CSV, {GENERATED_SOURCES} (default: %(default)s)")
    add_cluster_flag(parser, default="8x4")  # mixed types too: each node shows its product
    parser.add_argument("--seed", type=SEED, default=0,
                        help="seed of workload and failures (default: %(default)s)")
    parser.add_argument("--failures", default="stress", metavar="RATE",
                        help="random node failures, as for simulate and evaluate: failures per "
                             f"GPU-day (0 to {MAX_FAILURES_PER_GPU_DAY:g}) or a preset, "
                             f"{'|'.join(FAILURE_PRESETS)} (default: stress, "
                             f"{STRESS_FAILURES_PER_GPU_DAY:g} per GPU-day: a few per simulated "
                             "day, most announced by XID/ECC warnings); `default` is the Llama "
                             f"3 rate ({LLAMA3_FAILURES_PER_GPU_DAY:g} per GPU-day, the default "
                             "of simulate and evaluate), `none` or 0 leaves only --fail-node ones")
    parser.add_argument("--speed", type=above(0.0), default=60.0,
                        help="simulated seconds per wall second (default: %(default)s)")
    parser.add_argument("--tick-s", type=above(0.0), default=0.25,
                        help="wall seconds per step (default: %(default)s)")
    parser.add_argument("--namespace", type=_namespace, default="default",
                        help="namespace of the jobs (default: %(default)s)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to serve on (default: %(default)s)")
    parser.add_argument("--kube-port", type=_PORT, default=8001,
                        help="Kubernetes API port, 0: any free one (default: %(default)s)")
    # not 9400: the training example's exporter (--metrics-port in trainer_jobs) listens there
    parser.add_argument("--metrics-port", type=_PORT, default=9401,
                        help="exporter port, 0: any free one (default: %(default)s)")
    parser.add_argument("--prometheus-url", default="http://127.0.0.1:9090",
                        help="where your Prometheus will listen, goes into the actuator config "
                             "(default: %(default)s)")
    parser.add_argument("--scrape-interval-s", type=above(0.0), default=1.0,
                        help="Prometheus scrape interval to configure, seconds > 0 "
                             "(default: %(default)s)")
    parser.add_argument("--out-dir", type=out_path, default=Path("twin"),
                        help=f"where to write {', '.join(DEMO_FILES)} (default: %(default)s)")
    parser.add_argument("--force", action="store_true",
                        help="replace those files if --out-dir holds them (otherwise refused)")
    parser.add_argument("--fail-node", metavar="NODE:WARN_S:FAIL_S", action="append", default=[],
                        help="scripted failure: NODE warns (XID errors) from simulated second "
                             "WARN_S and fails at FAIL_S; repeatable")
    parser.add_argument("--duration-s", type=at_least(0.0, float), default=0.0,
                        help="stop after this many wall seconds; 0: until Ctrl-C or SIGTERM "
                             "(default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    """Start the twin, write the demo files, run until interrupted (Ctrl-C or SIGTERM).

    SIGTERM during start-up stops it as Ctrl-C does (one line, exit 130, no twin left
    serving, a directory it created for --out-dir removed again); once serving, either signal
    stops the twin and the command returns 0. The process's own handlers are given back.
    """
    with _stopping_on_signals() as stop:
        return _run(args, stop)


def _run(args: argparse.Namespace, stop: _Stop) -> int:
    """`run` inside its signal handlers: check the flags, start, write the files, serve."""
    # imported here, after the flags are read: a missing [twin] extra is named by `main`
    from rlalloc.actuator.twin.harness import actuator_settings, prometheus_config, start_twin
    from rlalloc.actuator.twin.kube_api import dump_kubeconfig

    # the URL goes into actuator.yaml: refuse now what `actuate` would refuse there
    load_config(environ={}, overrides={"prometheus_url": args.prometheus_url})
    rate = parse_failure_rate(args.failures)
    failures = [_failure(text) for text in args.fail_node]
    scenario = build_scenario(args.workload, args.cluster, seed=args.seed,
                              signals=default_signals())
    _check_failing_nodes(failures, scenario.cluster)
    params = SimParams(decision_interval_s=max(args.speed * args.tick_s, 1.0),
                       failures=FailureParams(failures_per_gpu_day=rate))
    events: queue.SimpleQueue[TwinEvent] = queue.SimpleQueue()
    with out_dir_for_run(args.out_dir, list(DEMO_FILES), args.force, flag="--out-dir") as out:
        try:
            running = start_twin(scenario, seed=args.seed, speed=args.speed,
                                 tick_s=args.tick_s, namespace=args.namespace,
                                 epoch_s=_midnight_utc(), params=params, host=args.host,
                                 kube_port=args.kube_port, metrics_port=args.metrics_port,
                                 failures=failures, on_event=events.put,
                                 scrape_interval_s=args.scrape_interval_s)
        except ValueError as err:  # each was checked on its own; the simulator's view here
            raise UserError(f"--fail-node: {err}") from err
        try:
            target = f"{args.host}:{running.metrics_port}"
            settings = actuator_settings(args.speed, args.prometheus_url,
                                         args.scrape_interval_s)
            settings.update(kubeconfig=str((out / "kubeconfig").resolve()),
                            interval_s=max(300.0 / args.speed, 1.0),
                            lease_namespace=args.namespace)
            _write_demo_files(out, {
                "kubeconfig": dump_kubeconfig(running.kube_url),
                "prometheus.yml": yaml.safe_dump(
                    prometheus_config(target, args.scrape_interval_s), sort_keys=False),
                "actuator.yaml": yaml.safe_dump(settings, sort_keys=False)})
            started = time.monotonic()
            _serve(args, scenario, running.kube_url, target, out, stop, events)
            summary = running.call(running.twin.summary)
        finally:
            running.stop()
    _print_events(events)
    print(_summary_text(summary, time.monotonic() - started, args.speed), flush=True)
    return 0


def _serve(args: argparse.Namespace, scenario: Scenario, kube_url: str, target: str, out: Path,
           stop: _Stop, events: queue.SimpleQueue[TwinEvent]) -> None:
    """Say where the twin serves and what to run next, then print its `events` as they come
    until a signal or the end of --duration-s. They are queued by the twin's thread and printed
    here, so that none comes before these lines (the twin ticks while it starts: an idle
    cluster's first tick may already pass a scripted warning)."""
    print(f"twin of {scenario.workload.name} on {scenario.cluster.describe()} at "
          f"{args.speed:g}x real time\n"
          f"  Kubernetes API  {kube_url}   (kubectl --kubeconfig {out}/kubeconfig "
          f"get pytorchjobs,pods)\n"
          f"  exporter        http://{target}/metrics\n"
          f"next:\n"
          f"  {prometheus_command(out, args.prometheus_url)}\n"
          f"  rlalloc actuate --config {out}/actuator.yaml --policy proactive", flush=True)
    stop.serving = True  # a signal from now on stops the twin cleanly: exit 0
    deadline = time.monotonic() + args.duration_s if args.duration_s > 0 else None
    while not stop.wait(_EVENTS_EVERY_S if deadline is None
                        else min(max(deadline - time.monotonic(), 0.0), _EVENTS_EVERY_S)):
        _print_events(events)
        if deadline is not None and time.monotonic() >= deadline:
            break


def prometheus_command(out: Path, prometheus_url: str) -> str:
    """The Prometheus command line that scrapes the twin and answers at `prometheus_url`, where
    `actuator.yaml` sends the actuator: its port (and path, as the route prefix) when they are
    not Prometheus's defaults, 9090 and none; otherwise Prometheus would listen where the
    actuator does not look."""
    url = urllib.parse.urlsplit(prometheus_url)
    port = url.port or (443 if url.scheme == "https" else 80)
    command = f"prometheus --config.file={out}/prometheus.yml --storage.tsdb.path={out}/tsdb"
    if port != _PROMETHEUS_DEFAULT_PORT:
        command += f" --web.listen-address=:{port}"
    if url.path.strip("/"):
        command += f" --web.route-prefix=/{url.path.strip('/')}"
    if url.scheme == "https":  # Prometheus serves TLS only from a web config the twin cannot
        command += (" --web.config.file=WEB_CONFIG.yml  # with tls_server_config: cert_file "
                    "and key_file, for https")  # write: it has no certificate to put there
    return command


def sim_clock(seconds: float) -> str:
    """Simulated seconds as a clock reading, "0:40:00" or "1d 2:03:04": the twin's time zero
    is midnight, so it is also the time of day the twin's objects and metrics show."""
    days, rest = divmod(int(seconds), 86_400)
    clock = f"{rest // 3600}:{rest // 60 % 60:02d}:{rest % 60:02d}"
    return f"{days}d {clock}" if days else clock


def event_line(event: TwinEvent) -> str:
    """The line `rlalloc twin` prints for `event`, prefixed with its simulated time."""
    what = {"warning": "warns: XID errors (the simulator's sign of a coming failure)",
            "repaired": "repaired, schedulable again",
            "finished": "finished"}.get(event.kind, event.kind)
    if event.kind == "failed":
        what = ("failed; requeued from their checkpoints: " + ", ".join(event.requeued)
                if event.requeued else "failed; no job was running on it")
    return f"[sim {sim_clock(event.time_s)}] {event.subject} {what}"


def _print_events(events: queue.SimpleQueue[TwinEvent]) -> None:
    """An `event_line` on stdout for each event queued so far."""
    while not events.empty():
        print(event_line(events.get()), flush=True)


def _summary_text(summary: TwinSummary, wall_s: float, speed: float) -> str:
    """The lines `rlalloc twin` ends with: time covered, jobs, failures, the actuator's
    actions (read from the Events it recorded: the twin sees nothing else of its decisions)."""
    scripted = (summary.scripted_failures - summary.scripted_pending
                - summary.scripted_found_down)
    failures = (f"node failures: {summary.failures} ({scripted} scripted, "
                f"{summary.failures - scripted} from --failures) after {summary.warnings} "
                f"warning(s)\n  jobs requeued from a checkpoint: {summary.jobs_requeued}")
    if summary.scripted_found_down:
        failures += (f"; {summary.scripted_found_down} scripted failure(s) came while the node "
                     "was already down (no failure of their own)")
    if summary.scripted_pending:
        failures += f"; {summary.scripted_pending} scripted failure(s) still to come"
    events = ", ".join(f"{reason} {count}" for reason, count in
                       sorted(summary.actuator_events.items(), key=lambda item: -item[1]))
    actions = (f"actuator Events: {events}" if events else
               "actuator: no Events recorded (none ran against the twin, or only in dry run)")
    return (f"twin stopped after {sim_clock(summary.simulated_s)} of simulated time "
            f"({wall_s:.0f} s at {speed:g}x)\n"
            f"  jobs: {summary.jobs_finished} finished, {summary.jobs_in_system} in the system, "
            f"{summary.jobs_to_arrive} still to arrive\n"
            f"  {failures}\n  {actions}")


class _Stop(threading.Event):
    """Set by SIGINT/SIGTERM once `serving`; before that they interrupt the start-up."""

    serving = False


@contextmanager
def _stopping_on_signals() -> Iterator[_Stop]:
    """A `_Stop` that SIGINT and SIGTERM set while the twin serves; during start-up they
    raise KeyboardInterrupt (SIGTERM would otherwise kill the process half started). The
    handlers in place before are restored on the way out."""
    stop = _Stop()

    def handle(signum: int, frame: object) -> None:
        if stop.serving:
            stop.set()
        else:
            raise KeyboardInterrupt

    signums = (signal.SIGINT, signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread():
        yield stop  # signals reach the main thread only: nothing to install
        return
    previous = {signum: signal.getsignal(signum) for signum in signums}
    try:
        for signum in signums:
            signal.signal(signum, handle)
        yield stop
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def _write_demo_files(out: Path, texts: dict[str, str]) -> None:
    """Write the demo files all or none: each into a temporary file first, then all renamed
    over the old ones (a failure leaves the old files as they were)."""
    staged: list[tuple[Path, Path]] = []
    try:
        for name, text in texts.items():
            target = out / name
            if target.is_dir():
                raise UserError(f"--out-dir {out}: {name} is a directory; remove it or choose "
                                "another --out-dir")
            temporary = out / f".{name}.{os.getpid()}.tmp"
            staged.append((temporary, target))
            try:
                temporary.write_text(text)
            except OSError as err:
                raise UserError(f"--out-dir {out}: cannot write {name} ({err.strerror}); "
                                "check the directory's permissions and free space") from err
        for temporary, target in staged:
            temporary.replace(target)
    finally:
        for temporary, _ in staged:
            temporary.unlink(missing_ok=True)


def _failure(text: str) -> ScriptedFailure:
    """The `ScriptedFailure` of a --fail-node NODE:WARN_S:FAIL_S flag."""
    from rlalloc.actuator.twin.runtime import (
        ScriptedFailure,  # needs kmock: imported late, see run()
    )

    node, _, times = text.partition(":")
    warn, _, fail = times.partition(":")
    try:
        failure = ScriptedFailure(node, float(warn), float(fail))
    except ValueError as err:
        raise UserError(f"--fail-node {text!r}: expected NODE:WARN_S:FAIL_S, e.g. "
                        "node-0001:600:1800") from err
    if not node:
        raise UserError(f"--fail-node {text!r}: NODE is missing; expected NODE:WARN_S:FAIL_S, "
                        "e.g. node-0001:600:1800")
    if not (math.isfinite(failure.warn_at_s) and math.isfinite(failure.fail_at_s)):
        raise UserError(f"--fail-node {text!r}: WARN_S and FAIL_S must be finite numbers of "
                        "simulated seconds")
    if failure.fail_at_s <= failure.warn_at_s:
        raise UserError(f"--fail-node {text!r}: FAIL_S must come after WARN_S")
    return failure


def _check_failing_nodes(failures: list[ScriptedFailure], cluster: ClusterSpec) -> None:
    """Refuse a --fail-node naming no node of the cluster: it would never fail, silently."""
    names = [node.name for node in cluster.nodes]
    for failure in failures:
        if failure.node not in names:
            shown = (", ".join(names) if len(names) <= 4
                     else f"{names[0]} ... {names[-1]} ({len(names)} nodes)")
            raise UserError(f"--fail-node {failure.node}: no such node in the cluster "
                            f"{cluster.describe()}; its nodes are {shown}")


def _midnight_utc() -> float:
    """Today's midnight (UTC), the twin's time zero: time of day matches the simulator's."""
    return float(int(time.time()) // 86_400 * 86_400)
