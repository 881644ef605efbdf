"""Running rlalloc's parallel work on a Ray cluster the user already runs (often KubeRay inside
the same Kubernetes cluster; docs/ray.md). The one module that imports Ray, an optional extra
(``pip install 'rlalloc[ray]'``; an import-linter contract keeps it so): others, such as
`rlalloc.agent.ray_vec_env`, get it from `ray_module`.

`connect` joins the cluster once per process; `RayTasks` is the `rlalloc.env.execution.Executor`
whose runs are Ray tasks. A task runs in the driver's working directory where the worker has it
(the same machine, or a volume mounted at the same path on every node), so the relative paths
of workloads and saved policies mean on the workers what they mean to the user, and it gets
the driver's ``RLALLOC_*`` settings (`rlalloc.env.profiles.PROFILES_ENV_VAR`): the same inputs,
so the same results as `LocalProcesses`.

A task whose worker process or node dies is run again (`TASK_RETRIES`); one that raises is not
(the simulator is deterministic: it would fail again) and is reported with what it was.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import TypeVar
from urllib.parse import urlsplit

from rlalloc.env.errors import UserError, failures_named

T = TypeVar("T")
R = TypeVar("R")

TASK_RETRIES = 3
"""Times a task is run again after its worker process or node died (Ray's `max_retries`)."""
CONNECT_TIMEOUT_S = 5.0
"""How long an address may take to accept a connection before it counts as not answering:
``ray.init`` itself retries a dead address for minutes."""
_DEFAULT_PORT = {"ray": 10001, "": 6379}
"""A Ray Client server's port and a GCS server's, where an address names none."""


def ray_module() -> ModuleType:
    """The `ray` package, or a one-line `UserError` saying how to install it."""
    try:
        import ray
    except ImportError:
        raise UserError("--ray needs the [ray] extra (ray is not installed); pip install "
                        "'rlalloc[ray]', or leave out --ray to run on this machine") from None
    return ray


def connect(address: str) -> ModuleType:
    """Join the Ray cluster at `address` (``auto``: the one `ray start` or RAY_ADDRESS names;
    ``HOST:PORT``: a head node's GCS; ``ray://HOST:PORT``: a Ray Client server; ``local``: a
    new one on this machine for this process) unless this process has already; return `ray`.
    A one-line `UserError` where Ray is not installed or nothing answers at `address`."""
    ray = ray_module()
    if ray.is_initialized():
        return ray
    if address not in ("auto", "local"):
        _require_answer(address)
    environment = {name: value for name, value in os.environ.items()
                   if name.startswith("RLALLOC_")}
    # "local" said, not left out: ray.init() without an address joins a Ray this machine runs
    options = {"include_dashboard": False} if address == "local" else {}
    try:
        ray.init(address, runtime_env={"env_vars": environment} if environment else None,
                 logging_level=logging.ERROR, **options)
    except ConnectionError as err:
        raise UserError(f"--ray {address}: {_first_line(err)}; start one (`ray start --head`) "
                        f"or give its address ({_ADDRESS_HELP})") from None
    return ray


_ADDRESS_HELP = "auto, HOST:PORT, ray://HOST:PORT or local"


def _require_answer(address: str) -> None:
    """A one-line `UserError` unless `address` is HOST:PORT or ray://HOST:PORT and accepts a
    TCP connection within `CONNECT_TIMEOUT_S`."""
    parts = urlsplit(address if "://" in address else f"//{address}")
    if parts.scheme not in _DEFAULT_PORT or not parts.hostname:
        raise UserError(f"--ray {address}: not a Ray address; give {_ADDRESS_HELP}")
    try:
        port = parts.port or _DEFAULT_PORT[parts.scheme]
    except ValueError:
        raise UserError(f"--ray {address}: the port is not a number; give "
                        f"{_ADDRESS_HELP}") from None
    try:
        socket.create_connection((parts.hostname, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as err:
        raise UserError(f"--ray {address}: nothing answers there ({err.strerror or err}); "
                        "start the cluster (`ray start --head`), check the address, or leave "
                        "out --ray") from None


def _first_line(err: BaseException) -> str:
    """The first line of Ray's error `err` (its messages run on with tracebacks), for a
    one-line `UserError`."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0].rstrip(".")


class RayTasks:
    """`rlalloc.env.execution.Executor` on the Ray cluster this process joined (`connect`):
    one task per item, all submitted at once, each asking for one CPU."""

    def __init__(self) -> None:
        ray = ray_module()
        assert ray.is_initialized(), "connect() first"
        self._ray = ray
        self._task = ray.remote(num_cpus=1, max_retries=TASK_RETRIES,
                                retry_exceptions=False)(_in_directory)

    def map(self, run: Callable[[T], R], items: Sequence[T],
            describe: Callable[[T], str] = str) -> Iterator[R]:
        """See `rlalloc.env.execution.Executor.map`."""
        directory = os.getcwd()
        shared_run = self._ray.put(run)  # once, not per task: a planner's forks share a copy
        refs = [self._task.remote(directory, shared_run, item) for item in items]
        done = 0
        try:
            for item, ref in zip(items, refs, strict=True):
                yield self._result(ref, describe(item))
                done += 1
        finally:  # stopped early (an error, Ctrl-C): the runs not yet finished are not wanted
            left = refs[done + 1:]
            if left:
                _, unfinished = self._ray.wait(left, num_returns=len(left), timeout=0)
                for ref in unfinished:
                    self._ray.cancel(ref)

    def _result(self, ref: object, what: str) -> R:
        """The task's result; its own exception where it raised one, named by `what`."""
        with failures_named(what):
            return gathered(ref, f"its Ray worker was lost {TASK_RETRIES + 1} times")


def gathered(refs: object, lost: str) -> object:
    """``ray.get(refs)`` (one reference or a list), where a task or actor method that raised a
    `UserError` raises it again, as one line, and any other exception keeps the remote
    traceback (a bug); a worker, actor or node lost is a one-line `UserError` saying `lost`."""
    ray = ray_module()
    exceptions = ray.exceptions
    try:
        return ray.get(refs)
    except exceptions.RayTaskError as err:
        if isinstance(err.cause, UserError):
            raise err.cause from None
        raise  # a bug: its message holds the task's traceback
    except (exceptions.RayActorError, exceptions.WorkerCrashedError, exceptions.NodeDiedError,
            exceptions.ObjectLostError) as err:
        raise UserError(f"{lost} ({_first_line(err)}); check the cluster's nodes and memory, "
                        "then run it again") from None


def _in_directory(directory: str, run: Callable[[T], R], item: T) -> R:
    """The task: `run(item)` in the driver's working `directory` where this worker has it."""
    prepare_worker(directory)
    return run(item)


def prepare_worker(directory: str) -> None:
    """Set this Ray worker process up as the driver runs: in the driver's working `directory`
    where this worker has it (see the module docstring), torch on one thread
    (`rlalloc.env.workers.torch_on_one_thread`). For `RayTasks`' tasks and the actors of
    `rlalloc.agent.ray_vec_env`."""
    from rlalloc.env.workers import torch_on_one_thread

    if os.path.isdir(directory):
        os.chdir(directory)
    torch_on_one_thread()
