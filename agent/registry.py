"""`load_policy`: any allocation policy by name or by saved-model path.

Built-in names are the heuristics of `rlalloc.agent.heuristics` and the learned models shipped in
``models/`` (``ppo``, ``dqn``); anything else must be a directory written by ``rlalloc train``
or by ``rlalloc sizes fit`` (a heuristic told job sizes, `rlalloc.agent.job_sizes`) or ``rlalloc planner
fit`` (a lookahead over such heuristics, `rlalloc.agent.planner`).
The actuator, `rlalloc evaluate` and the simulator all go through here, so one string picks
the same policy everywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rlalloc.agent.heuristics import ElasticConfig, ElasticPolicy, StaticPolicy, TiresiasPolicy
from rlalloc.agent.job_sizes import SIZES_FILE
from rlalloc.agent.policy import Policy
from rlalloc.env.errors import UserError
from rlalloc.models import shipped

MODELS_DIR = shipped("ppo").parent
"""The shipped models (``models/ppo``, ``models/dqn``), package data of `rlalloc.models`."""


def elastic_srpt(remaining_power: float, name: str) -> Policy:
    """`elastic` with each step up ranked by speed-up gain per GPU / remaining work **
    `remaining_power` (`ElasticConfig.remaining_power`): the strength of the pull towards
    shortest remaining time first. On Pollux workload-1..6 (failures none, seed 0) 0.25 gave
    3,060 s average JCT, 0.5 3,113 s, 0.75 3,229 s, 1.0 3,326 s, 0 (elastic) 3,473 s."""
    return ElasticPolicy(ElasticConfig(remaining_power=remaining_power), name=name)


HEURISTICS: dict[str, Callable[[], Policy]] = {
    "static": StaticPolicy,
    "tiresias": TiresiasPolicy,
    "elastic": ElasticPolicy,
    "reactive": lambda: ElasticPolicy(ElasticConfig(failover=True), name="reactive"),
    "proactive": lambda: ElasticPolicy(ElasticConfig(proactive=True), name="proactive"),
    "elastic-srpt": lambda: elastic_srpt(0.5, "elastic-srpt"),
    "elastic-srpt-0.25": lambda: elastic_srpt(0.25, "elastic-srpt-0.25"),
}
"""Built-in heuristics by name."""
PLANNER_FILE = "planner.json"
"""A planner's file (`rlalloc planner fit`, `rlalloc.agent.planner`), named here so that recognising one
imports nothing of it."""
MODEL_META_FILE = "policy.json"
"""A saved model's metadata file (`rlalloc.agent.deployed` writes it), named here so that recognising a
saved model imports no torch."""
POLICY_FILES = {SIZES_FILE: "a size table (`rlalloc sizes fit`)",
                MODEL_META_FILE: "a trained model (`rlalloc train`)",
                PLANNER_FILE: "a planner (`rlalloc planner fit`)"}
"""The file that makes a directory each kind of saved policy, with what writes it."""
SHIPPED_MODELS = ("ppo", "dqn")
"""Names of the learned policies shipped in `MODELS_DIR`."""


def builtin_names() -> tuple[str, ...]:
    """Every built-in policy name, heuristics first."""
    return (*HEURISTICS, *SHIPPED_MODELS)


def elastic_names() -> tuple[str, ...]:
    """The built-in heuristics that are `ElasticPolicy`s: only they estimate job sizes, so only
    they can be told them (`rlalloc.agent.job_sizes.told_sizes`)."""
    return tuple(name for name, make in HEURISTICS.items() if isinstance(make(), ElasticPolicy))


def refuse_other_policy(out: Path, own: str) -> None:
    """A one-line `UserError` if `out` holds a saved policy of a kind other than the one whose
    file is `own` (a `POLICY_FILES` key): each writes card.md, so a `--force` of one command
    into another's directory would replace that card and leave a directory that is neither."""
    for name, kind in POLICY_FILES.items():
        if name != own and (Path(out) / name).exists():
            raise UserError(f"--out {out}: holds {kind} ({name}), which --force does not "
                            "replace; choose another --out")


def load_policy(name_or_path: str) -> Policy:
    """The policy called `name_or_path` (built-in name) or saved at that path.

    Raises `UserError` (one line, listing the valid names) for an unknown name or a path that
    holds no saved policy.
    """
    if name_or_path in HEURISTICS:
        return HEURISTICS[name_or_path]()
    if name_or_path in SHIPPED_MODELS:
        directory = MODELS_DIR / name_or_path
        if not directory.is_dir():
            raise UserError(f"policy {name_or_path!r}: shipped model {directory} is missing; "
                            f"train one with `rlalloc train --algo {name_or_path} --out "
                            f"{directory}` or pass a model directory")
        return _load_learned(directory, name_or_path)
    path = Path(name_or_path)
    kinds = [name for name in POLICY_FILES if (path / name).is_file()]
    if len(kinds) > 1:  # `--force` of one command into another's OUT, before they refused it
        raise UserError(f"{path}: holds both {POLICY_FILES[kinds[0]]} ({kinds[0]}) and "
                        f"{POLICY_FILES[kinds[1]]} ({kinds[1]}), so which policy it is is "
                        "unclear; move one of them to a directory of its own")
    if PLANNER_FILE in kinds:
        from rlalloc.agent.planner import load_planner

        return load_planner(path, name=path.name)
    if SIZES_FILE in kinds:
        from rlalloc.agent.job_sizes import load_sized_policy

        return load_sized_policy(path, name=path.name)
    if path.is_dir() and not kinds:
        raise UserError(f"{path}: not a saved policy (no {', '.join(POLICY_FILES)}); give the "
                        "directory that `rlalloc train`, `sizes fit` or `planner fit` wrote")
    if path.is_dir():
        return _load_learned(path, path.name)
    if path.is_file():  # e.g. DIR/policy.pt: a saved model is the directory, not one of its files
        saved = any((path.parent / f).is_file() for f in POLICY_FILES)
        hint = (f"give its directory, {path.parent}" if saved else
                "give the directory that `rlalloc train`, `sizes fit` or `planner fit` wrote")
        raise UserError(f"policy {name_or_path!r} is a file, not a saved model; {hint}")
    raise UserError(f"unknown policy {name_or_path!r}: use one of {', '.join(builtin_names())} "
                    f"or the directory of a saved model")


def _load_learned(directory: Path, name: str) -> Policy:
    """The trained model saved in `directory`. Imported here, not at the top: it brings torch
    (~110 MB and a second of start-up), which commands running only heuristics never need."""
    from rlalloc.agent.deployed import load_deployed

    return load_deployed(directory, name=name)
