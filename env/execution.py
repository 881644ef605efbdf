"""Where the embarrassingly parallel work runs: `rlalloc evaluate`'s and `headroom`'s runs,
`workload sample`'s draws and a planner's forks (`rlalloc.agent.lookahead.fork_on`).

Local worker processes by default (`LocalProcesses`, `--jobs N`), or the tasks of a Ray cluster
the user already runs (`--ray auto|HOST:PORT|ray://HOST:PORT|local`; `rlalloc.env.ray_cluster`,
the one module of the simulator's layer that imports Ray, an optional extra). Both run the same
module-level function on the same items and hand back the results in the items' order, so a
command's output does not depend on where it ran. A run that fails is reported with what it was
(`describe`: policy, workload and seed): a `UserError` it raised stays one line, prefixed so;
any other exception (a bug) keeps its traceback, with a note naming the run.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol, TypeVar

from rlalloc.env.errors import failures_named
from rlalloc.env.workers import worker_pool

T = TypeVar("T")
R = TypeVar("R")

RAY_ADDRESSES = "auto|HOST:PORT|ray://HOST:PORT|local"
"""What --ray takes (`rlalloc.env.ray_cluster.connect`)."""


class Executor(Protocol):
    """Runs one function on many items, in parallel where it can."""

    def map(self, run: Callable[[T], R], items: Sequence[T],
            describe: Callable[[T], str] = str) -> Iterator[R]:
        """`run(item)` for each of `items`, yielded in their order as each is ready. `run` is
        a module-level function or a `functools.partial` of one (workers import it by name);
        `describe` names an item in the error of a run that failed."""
        ...


class LocalProcesses:
    """`jobs` worker processes of this machine (`rlalloc.env.workers`); with one, the runs
    run in this process, one after the other."""

    def __init__(self, jobs: int) -> None:
        assert jobs >= 1, jobs
        self.jobs = jobs

    def map(self, run: Callable[[T], R], items: Sequence[T],
            describe: Callable[[T], str] = str) -> Iterator[R]:
        """See `Executor.map`."""
        if self.jobs == 1 or len(items) <= 1:
            for item in items:
                with failures_named(describe(item)):
                    result = run(item)
                yield result
            return
        with worker_pool(min(self.jobs, len(items))) as pool:
            # submitted one by one, not `pool.map`: see `rlalloc.env.workers.worker_pool`
            futures = [pool.submit(run, item) for item in items]
            for item, future in zip(items, futures, strict=True):
                with failures_named(describe(item)):
                    result = future.result()
                yield result


def add_ray_flag(parser: argparse.ArgumentParser, what: str, default: str | None = None) -> None:
    """--ray: send `what` to a Ray cluster (`default`: none, this machine's processes)."""
    shown = default or "none, on this machine"
    parser.add_argument("--ray", default=default, metavar="ADDRESS",
                        help=f"send {what} to a Ray cluster ({RAY_ADDRESSES}: auto joins the one "
                             "`ray start` or RAY_ADDRESS names, local starts one on this machine)"
                             f"; needs the [ray] extra (default: {shown})")


def executor_for(jobs: int, ray_address: str | None) -> Executor:
    """The Ray cluster at `ray_address`, joined now (a one-line `UserError` where Ray is not
    installed or nothing answers there), or `jobs` local processes where it is None."""
    if ray_address is None:
        return LocalProcesses(jobs)
    from rlalloc.env.ray_cluster import RayTasks, connect

    connect(ray_address)
    return RayTasks()
