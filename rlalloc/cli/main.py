"""The `rlalloc` command line: one entry point dispatching to one module per subcommand.

Each subcommand is a module of `rlalloc.cli` exposing two functions:
``add_arguments(parser)`` and ``run(args) -> int``. Modules are imported only when their
subcommand runs, so `rlalloc simulate` never pays for torch or the Kubernetes client.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn

from rlalloc import __version__
from rlalloc.env.errors import UserError

# (words of the subcommand, its module in rlalloc.cli, one-line help)
COMMANDS: list[tuple[tuple[str, ...], str, str]] = [
    (("simulate",), "simulate", "replay a workload through the simulator under one policy"),
    (("workload", "sample"), "workload_sample",
     "draw new Pollux- or Sia-style workloads from the Philly trace"),
    (("bench", "sim"), "bench_sim", "benchmark trace replay and environment step speed"),
    (("bench", "recovery"), "bench_recovery",
     "benchmark recovery time and checkpoint stalls of the training jobs"),
    (("bench", "forecast"), "bench_forecast", "benchmark forecaster training and inference"),
    (("bench", "actuator"), "bench_actuator", "benchmark one actuator decision cycle"),
    (("bench", "rollouts"), "bench_rollouts",
     "benchmark training rollouts stepped here, in local processes or on Ray"),
    (("train",), "train", "train a PPO or DQN allocation policy"),
    (("evaluate",), "evaluate", "compare allocation policies over workloads and seeds"),
    (("sizes", "fit"), "sizes",
     "fit job sizes from past workloads for an elastic heuristic (a policy directory)"),
    (("planner", "fit"), "planner",
     "fit the planning policy (lookahead over size-told heuristics) on past workloads"),
    (("headroom",), "headroom",
     "measure what one-step lookahead over heuristics gains, with and without the future"),
    (("forecast", "train"), "forecast_train",
     "train the demand forecaster or the node-failure risk model (--model)"),
    (("forecast", "evaluate"), "forecast_evaluate", "evaluate forecasters on a series"),
    (("forecast", "predict"), "forecast_predict",
     "forecast a cluster's demand quantiles from the end of its series, in GPUs to keep"),
    (("actuate",), "actuate", "run the in-cluster actuator control loop"),
    (("twin",), "twin", "run the digital twin: simulator exposed as Prometheus + K8s"),
]


EXTRAS: dict[str, str] = {
    "stable_baselines3": "train", "sb3_contrib": "train", "tensorboard": "train",
    "statsmodels": "train",
    "kubernetes": "actuator", "prometheus_api_client": "actuator",
    "prometheus_client": "actuator", "jsonschema": "actuator",
    "kmock": "twin", "aiohttp": "twin",
}
"""Which install extra brings each optional package (pyproject.toml's optional-dependencies)."""
COMMAND_EXTRAS: dict[tuple[str, ...], str] = {
    ("train",): "train", ("forecast", "train"): "train", ("forecast", "evaluate"): "train",
    ("bench", "forecast"): "train", ("bench", "rollouts"): "train", ("actuate",): "actuator",
    ("bench", "actuator"): "actuator", ("twin",): "twin", ("bench", "recovery"): "trainer",
}
"""The extra each command needs, where it needs one: named whichever of its packages is missing
(the twin needs the actuator's client as well as its own server)."""


def missing_extra(err: ModuleNotFoundError, words: tuple[str, ...]) -> UserError | None:
    """The one-line error for the command `words` when it needs a package of an extra that is
    not installed, or None when the missing module is none of the extras' (a bug, left to
    raise)."""
    package = (err.name or "").partition(".")[0]
    if package not in EXTRAS:
        return None
    extra = COMMAND_EXTRAS.get(words, EXTRAS[package])
    return UserError(f"rlalloc {' '.join(words)} needs the [{extra}] extra ({package} is not "
                     f"installed); pip install 'rlalloc[{extra}]'")


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag ends like every other bad input: one line naming it and where
    to look, exit 2 (`main` prints the `UserError`), not a usage block before the error.
    Subcommand parsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        """Raise the parse error as a `UserError`."""
        command = self.prog.removeprefix("rlalloc").strip()
        raise UserError(f"{command + ': ' if command else ''}{message} (see {self.prog} --help)")

    def parse_args(self, args: list[str] | None = None,
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        """argparse's, but a flag no parser knows is reported by the subcommand it was given
        to (whose --help lists its flags), not by the top-level parser as argparse does."""
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            report = getattr(parsed, "_error", self.error)
            report(f"unrecognized arguments: {' '.join(unknown)}")
        return parsed


def _match(argv: list[str]) -> tuple[tuple[str, ...], str, str] | None:
    """The command whose words start `argv`, if any."""
    for words, module, help_text in COMMANDS:
        if tuple(argv[: len(words)]) == words:
            return words, module, help_text
    return None


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """The parser tree; only the module of the command named in `argv` is imported."""
    parser = _OneLineParser(
        prog="rlalloc",
        description="RL resource allocation for distributed training jobs on Kubernetes.",
    )
    parser.add_argument("--version", action="version", version=f"rlalloc {__version__}")
    groups: dict[tuple[str, ...], argparse._SubParsersAction] = {
        (): parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    }
    chosen = _match(argv)
    for words, module, help_text in COMMANDS:
        for depth in range(1, len(words)):
            prefix = words[:depth]
            if prefix not in groups:
                group = groups[words[: depth - 1]].add_parser(
                    prefix[-1], help=f"{prefix[-1]} subcommands")
                groups[prefix] = group.add_subparsers(
                    dest=f"command_{depth}", required=True, metavar="COMMAND")
        sub = groups[words[:-1]].add_parser(words[-1], help=help_text, description=help_text)
        if chosen is not None and chosen[0] == words:
            implementation = importlib.import_module(f"rlalloc.cli.{module}")
            implementation.add_arguments(sub)
            sub.set_defaults(_run=implementation.run, _error=sub.error)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `rlalloc` console script."""
    argv = sys.argv[1:] if argv is None else argv
    try:  # Ctrl-C while the subcommand's modules are still importing is an interrupt too
        parser = build_parser(argv)
        args = parser.parse_args(argv)
        return int(args._run(args) or 0)
    except UserError as err:
        print(f"rlalloc: error: {err}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:
        chosen = _match(argv)
        error = missing_extra(err, chosen[0] if chosen else ())
        if error is None:
            raise
        print(f"rlalloc: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupt:  # its text, if any, says how to go on
        print(f"rlalloc: interrupted{f'; {interrupt}' if str(interrupt) else ''}",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
