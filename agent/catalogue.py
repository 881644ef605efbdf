"""The built-in policies by name: the heuristics of `rlalloc.agent.heuristics`, the
heterogeneity-aware baselines (`rlalloc.agent.gavel`, `rlalloc.agent.sia`) and the learned
models shipped in ``models/`` (``ppo``, ``dqn``).

Named apart from `rlalloc.agent.registry`, the factory that also loads saved policies, so that
the saved kinds it loads (a size table, a planner, a trained model) can name their heuristics
without importing it.
"""

from __future__ import annotations

from collections.abc import Callable

from rlalloc.agent.gavel import GavelPolicy
from rlalloc.agent.heuristics import ElasticConfig, ElasticPolicy, StaticPolicy, TiresiasPolicy
from rlalloc.agent.policy import Policy
from rlalloc.agent.sia import SiaPolicy
from rlalloc.models import shipped

MODELS_DIR = shipped("ppo").parent
"""The shipped models (``models/ppo``, ``models/dqn``), package data of `rlalloc.models`."""


def elastic_srpt(remaining_power: float, name: str) -> Policy:
    """`elastic` with each step up ranked by speed-up gain per GPU / remaining work **
    `remaining_power` (`ElasticConfig.remaining_power`): the strength of the pull towards
    shortest remaining time first. 0.25 gave the lowest average JCT of the powers tried on the
    training workloads (docs/agent.md, "The baselines")."""
    return ElasticPolicy(ElasticConfig(remaining_power=remaining_power), name=name)


HEURISTICS: dict[str, Callable[[], Policy]] = {
    "static": StaticPolicy,
    "tiresias": TiresiasPolicy,
    "elastic": ElasticPolicy,
    "reactive": lambda: ElasticPolicy(ElasticConfig(failover=True), name="reactive"),
    "proactive": lambda: ElasticPolicy(ElasticConfig(proactive=True), name="proactive"),
    "elastic-srpt": lambda: elastic_srpt(0.5, "elastic-srpt"),
    "elastic-srpt-0.25": lambda: elastic_srpt(0.25, "elastic-srpt-0.25"),
    "gavel": GavelPolicy,
    "sia": SiaPolicy,
}
"""Built-in heuristics by name."""
SHIPPED_MODELS = ("ppo", "dqn")
"""Names of the learned policies shipped in `MODELS_DIR`."""


def builtin_names() -> tuple[str, ...]:
    """Every built-in policy name, heuristics first."""
    return (*HEURISTICS, *SHIPPED_MODELS)


def elastic_names() -> tuple[str, ...]:
    """The built-in heuristics that are `ElasticPolicy`s: they estimate job sizes, so they can be
    told them (`rlalloc.agent.job_sizes.told_sizes`, which takes `sia` too), and a planner
    rebuilds its forks from the sizes they believe (`rlalloc.agent.planner`)."""
    return tuple(name for name, make in HEURISTICS.items() if isinstance(make(), ElasticPolicy))
