"""`load_policy`: any allocation policy by name or by saved-model path.

Built-in names are those of `rlalloc.agent.catalogue` (the heuristics and the learned models
shipped in ``models/``); anything else must be a directory written by ``rlalloc train`` (a
trained model, `rlalloc.agent.deployed`), ``rlalloc sizes fit`` (a heuristic told job sizes,
`rlalloc.agent.sized_policy`) or ``rlalloc planner fit`` (a lookahead over such heuristics,
`rlalloc.agent.planner`), each kind recognised by its own file and loaded by its own loader.
The actuator, `rlalloc evaluate` and the simulator all go through here, so one string picks
the same policy everywhere.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from rlalloc.agent.catalogue import HEURISTICS, MODELS_DIR, SHIPPED_MODELS, builtin_names
from rlalloc.agent.model_files import META_FILE
from rlalloc.agent.policy import Policy
from rlalloc.env.errors import UserError

if TYPE_CHECKING:
    from rlalloc.agent.job_sizes import JobSizeHistory


class SavedKind(NamedTuple):
    """A kind of saved policy directory."""

    description: str
    """What it holds and the command that writes it, for messages."""
    load: Callable[[Path, str], Policy]
    """Its loader: the policy saved in a directory, given a name."""


def saved_kinds() -> dict[str, SavedKind]:
    """Each kind of saved policy by the file that makes a directory one. The kinds' modules are
    imported here, not at the top: a size table and a planner bring the simulator and the
    measured profiles, which commands running only heuristics never need."""
    from rlalloc.agent.planner import PLANNER_FILE, load_planner
    from rlalloc.agent.sized_policy import SIZES_FILE, load_sized_policy

    return {SIZES_FILE: SavedKind("a size table (`rlalloc sizes fit`)", load_sized_policy),
            META_FILE: SavedKind("a trained model (`rlalloc train`)", _load_learned),
            PLANNER_FILE: SavedKind("a planner (`rlalloc planner fit`)", load_planner)}


def refuse_other_policy(out: Path, own: str) -> None:
    """A one-line `UserError` if `out` holds a saved policy of a kind other than the one whose
    file is `own` (a `saved_kinds` key): each writes card.md, so a `--force` of one command
    into another's directory would replace that card and leave a directory that is neither."""
    for name, kind in saved_kinds().items():
        if name != own and (Path(out) / name).exists():
            raise UserError(f"--out {out}: holds {kind.description} ({name}), which --force "
                            "does not replace; choose another --out")


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
                            "reinstall rlalloc, or pass the directory of a trained model")
        return _load_learned(directory, name_or_path)
    path = Path(name_or_path)
    kinds = saved_kinds()
    found = [name for name in kinds if (path / name).is_file()]
    if len(found) > 1:  # `--force` of one command into another's OUT, before they refused it
        raise UserError(f"{path}: holds both {kinds[found[0]].description} ({found[0]}) and "
                        f"{kinds[found[1]].description} ({found[1]}), so which policy it is is "
                        "unclear; move one of them to a directory of its own")
    if found:
        return kinds[found[0]].load(path, path.name)
    if path.is_dir():
        raise UserError(f"{path}: not a saved policy (no {', '.join(kinds)}); give the "
                        "directory that `rlalloc train`, `sizes fit` or `planner fit` wrote")
    if path.is_file():  # e.g. DIR/policy.pt: a saved model is the directory, not one of its files
        saved = any((path.parent / f).is_file() for f in kinds)
        hint = (f"give its directory, {path.parent}" if saved else
                "give the directory that `rlalloc train`, `sizes fit` or `planner fit` wrote")
        raise UserError(f"policy {name_or_path!r} is a file, not a saved model; {hint}")
    raise UserError(f"unknown policy {name_or_path!r}: use one of {', '.join(builtin_names())} "
                    f"or the directory of a saved model")


def told_size_table(name_or_path: str) -> JobSizeHistory | None:
    """The job-size table the policy `name_or_path` is told (`rlalloc.agent.job_sizes`): a
    size-told heuristic's (`rlalloc sizes fit`) or a model's trained with ``--learn-sizes``;
    None for any other policy. Read from its files without loading the policy, which
    `load_policy` has checked."""
    from rlalloc.agent.job_sizes import JobSizeHistory
    from rlalloc.agent.sized_policy import FORMAT_VERSION, SIZES_FILE, read_saved_policy

    if name_or_path in HEURISTICS:
        return None
    directory = MODELS_DIR / name_or_path if name_or_path in SHIPPED_MODELS else Path(
        name_or_path)
    if (directory / SIZES_FILE).is_file():
        return JobSizeHistory.from_json(read_saved_policy(
            directory / SIZES_FILE, FORMAT_VERSION, "rlalloc sizes fit")["curves"])
    if (directory / META_FILE).is_file():
        entries = json.loads((directory / META_FILE).read_text()).get("job_sizes")
        return None if entries is None else JobSizeHistory.from_json(entries)
    return None


def _load_learned(directory: Path, name: str) -> Policy:
    """The trained model saved in `directory`. Imported here, not at the top: it brings torch
    (memory and start-up time, docs/architecture.md), which commands running only heuristics
    never need."""
    from rlalloc.agent.deployed import load_deployed

    return load_deployed(directory, name=name)
