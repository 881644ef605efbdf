"""A training run's directory: the checks before a run starts or resumes there, and its files."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

from rlalloc.agent.checkpoints import CHECKPOINT_DIR, checkpoint_timesteps, latest_checkpoint
from rlalloc.agent.deployed import load_deployed
from rlalloc.agent.heuristics import Speedups
from rlalloc.agent.job_sizes import JobSizeHistory
from rlalloc.agent.job_speeds import PROFILES_DIR, copy_profiles
from rlalloc.agent.model_card import CARD_FILE, CARD_MD_FILE
from rlalloc.agent.model_files import META_FILE, WEIGHTS_FILE
from rlalloc.agent.registry import refuse_other_policy
from rlalloc.agent.sb3_models import TB_DIR
from rlalloc.agent.train_config import CONFIG_FILE, TrainConfig
from rlalloc.env.errors import UserError
from rlalloc.env.output import prepare_out_dir, remove_outputs, staged_outputs, write_json

RUN_FILES = (WEIGHTS_FILE, META_FILE, PROFILES_DIR, CONFIG_FILE, CARD_FILE, CARD_MD_FILE,
             CHECKPOINT_DIR, TB_DIR)
"""Everything a run writes into its directory. A new run refuses to write over any of them
without --force, and --force removes them all first: left behind, the replaced run's
checkpoints would be what --resume continues, its curves would show in TensorBoard as this
run's, and its policy would stand for this run's if this one exported none."""


def check_out(config: TrainConfig, out: Path, resume: bool, force: bool) -> Path | None:
    """The checkpoint a resumed run continues from (None for a new run); a `UserError` if
    `out` holds an earlier run and neither `resume` nor `force` says what to do with it, or
    if a resume finds no run there, changes the network's algorithm or action space or would
    add no steps."""
    refuse_other_policy(out, META_FILE)  # not ours to replace, ambiguous beside a model
    earlier = [name for name in RUN_FILES if (out / name).exists()]
    if not resume:
        if earlier and not force:
            raise UserError(f"{out}: holds an earlier run ({', '.join(earlier)}); pass --force "
                            "to replace all of it (checkpoints and TensorBoard logs included),"
                            " --resume to continue it, or choose another --out")
        return None
    if not earlier:
        raise UserError(f"--resume: there is no run in {out} to resume; leave out --resume to "
                        "start one there")
    checkpoint = latest_checkpoint(out)
    if checkpoint is None:
        raise UserError(f"{out}: nothing to resume (no checkpoint in {out / CHECKPOINT_DIR}, "
                        "as a run stopped before its first leaves none); start it again with "
                        "--force in place of --resume (--force replaces what it left)")
    if (out / META_FILE).is_file():  # else it fails to load only after the resumed steps
        try:
            load_deployed(out)
        except UserError as err:
            raise UserError(f"--resume: the policy exported into {out} ({META_FILE}, "
                            f"{WEIGHTS_FILE}) does not load; restore both from a copy, or start "
                            "the run again with --force") from err
    previous = _run_json(out / CONFIG_FILE)
    _run_json(out / CARD_FILE)  # read once the run goes on: refused while nothing is written
    algo, residual = previous.get("algo", config.algo), tuple(previous.get("residual", ()))
    learn_sizes = previous.get("learn_sizes", False)
    if (algo, residual, learn_sizes) != (config.algo, config.residual, config.learn_sizes):
        flag = " --learn-sizes" if learn_sizes else ""
        raise UserError(f"--resume: {out} was trained with --algo {algo} --residual "
                        f"'{','.join(residual)}'{flag}; resume it with the same (they fix the "
                        "network), or start a new run in another --out")
    given = asdict(config)
    changed = [f"{_flag_of(key)} {_flag_text(previous[key])}" for key in given
               if key in previous and key not in RESUME_MAY_CHANGE
               and _flag_text(previous[key]) != _flag_text(given[key])]
    if changed:  # left out, they took their defaults: evaluations no longer comparable, and
        # SB3 restores its own settings from the checkpoint whatever train_config.json says
        raise UserError(f"--resume: {out} was trained with {'; '.join(changed)}; give the same "
                        "(a resume continues one run on one setting; train_config.json has "
                        "them all), or start a new run in another --out")
    done = checkpoint_timesteps(checkpoint)
    if done >= config.timesteps and _finished(out):
        # it would train nothing, yet rewrite the card and config with this command's numbers
        # (a run stopped after its last steps still resumes: its final evaluation is missing)
        raise UserError(f"--resume: {out} is already at {done:,} steps, --timesteps "
                        f"{config.timesteps:,} adds none; give a larger --timesteps (the "
                        "total to reach, not the steps to add)")
    return checkpoint


RESUME_MAY_CHANGE = frozenset({"timesteps", "eval_every", "keep_checkpoints", "extra"})
"""The `TrainConfig` fields a resume may change: how far it goes and how often it evaluates
and checkpoints. Every other one is the run's (the network, the training setting, the start,
the algorithm's settings, which SB3 restores from the checkpoint whatever a resume says)."""


def saved_config(out: Path) -> TrainConfig | None:
    """The `TrainConfig` of the run in `out` (its train_config.json), None if it has none: a
    resume starts from it, so that the settings `rlalloc train` has no flag for (``n_epochs``,
    ``clip_range``, ...) are the run's own rather than today's defaults."""
    saved = _run_json(Path(out) / CONFIG_FILE)
    if not saved:
        return None
    defaults = asdict(TrainConfig())
    try:
        return replace(TrainConfig(), **{
            key: tuple(value) if isinstance(defaults[key], tuple) else value
            for key, value in saved.items() if key in defaults})
    except (TypeError, ValueError) as err:  # a list field null or a number, say
        raise UserError(f"{Path(out) / CONFIG_FILE}: damaged ({err}); restore it from a copy, "
                        "or start the run again with --force (which replaces the whole run)"
                        ) from err


def _run_json(path: Path) -> dict:
    """The object a run's JSON file (train_config.json, card.json) holds, {} if there is none;
    a one-line `UserError` naming it if it is damaged."""
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        problem = f"{err.__class__.__name__}: {str(err).splitlines()[0][:80]}"
    else:
        if isinstance(value, dict):
            return value
        problem = f"it holds a {type(value).__name__}, not an object"
    raise UserError(f"{path}: damaged ({problem}); restore it from a copy, or start the run "
                    "again with --force (which replaces the whole run)")


def _flag_of(key: str) -> str:
    """The `rlalloc train` flag of `TrainConfig` field `key`."""
    return {"workloads": "--workload", "eval_workloads": "--eval-workload"}.get(
        key, "--" + key.replace("_", "-"))


def _flag_text(value: object) -> str:
    """A saved setting as the flags give it (a list of workloads as one text)."""
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value)) or "(none)"
    return str(value)


def start_run_dir(config: TrainConfig, out: Path, force: bool,
                  log: Callable[[str], None]) -> None:
    """Create `out` now that the run is known to start (a failed check leaves no directory
    behind), clear the earlier run's files under `force`, and save the configuration."""
    prepare_out_dir(out, [], force)
    if force and (removed := remove_outputs(out, RUN_FILES)):
        log(f"--force: removed the earlier run's {', '.join(removed)} from {out}")
    write_json(out / CONFIG_FILE, asdict(config))


def with_earlier_commands(config: TrainConfig, out: Path) -> TrainConfig:
    """`config` with the command lines of the run it resumes (``extra["earlier_commands"]``,
    oldest first): the resume rewrites train_config.json, and a resume may change
    --timesteps, --eval-every and --keep-checkpoints, so the command that started the run is
    kept."""
    previous = _run_json(out / CONFIG_FILE).get("extra", {})
    earlier = [*previous.get("earlier_commands", []),
               *([previous["command"]] if "command" in previous else [])]
    return replace(config, extra={**config.extra, "earlier_commands": earlier}) if earlier \
        else config


def _finished(out: Path) -> bool:
    """Whether the run in `out` ended (its card has the totals written at the end)."""
    return "timesteps" in _run_json(out / CARD_FILE)


def resume_summary(summary: dict, out: Path, step: int) -> float:
    """Take the evaluations and warm start of the run being resumed from its checkpoint at
    `step` into `summary` and return its wall seconds so far: the finished run's, else
    (killed) its last evaluation's. Evaluations past `step` (a run killed after its last
    evaluation but before its last checkpoint, or resumed from an earlier checkpoint) are of
    steps the resume trains again: they stay, marked ``discarded``, since the exported policy
    may be one of them (a later one must beat it), but they neither stand for the new steps
    nor keep them from being evaluated."""
    card = out / CARD_FILE
    previous = _run_json(card)
    summary["evaluations"] = [{**e, "discarded": True} if e["timesteps"] > step else e
                              for e in previous.get("evaluations", [])]
    summary["warm_start"] = previous.get("warm_start")
    last = summary["evaluations"][-1]["wall_s"] if summary["evaluations"] else 0.0
    return previous.get("wall_s", last)


def copy_run_profiles(out: Path, sizes: JobSizeHistory | None, speedups: Speedups | None,
                      profiles_root: Path | None) -> tuple[str, ...]:
    """Copy into `out` the profiles behind `speedups` (`training_speedups`), replacing an
    earlier copy (a resumed run's) whole or not at all, and return their applications, which
    every export of the run names (`ExportMeta.profiles`); none, and no copies left, when the
    heuristics rank by the curves."""
    copied: list[str] = []
    if sizes is not None and speedups is not None:
        with staged_outputs(out) as staging:
            copied = copy_profiles(sizes, profiles_root, staging)
    if not copied:  # an earlier run's profiles must not pass for this one's
        remove_outputs(out, [PROFILES_DIR])
    return tuple(copied)


def resumed_profiles(out: Path) -> tuple[str, ...] | None:
    """The applications whose profiles a resumed `learn_sizes` run's heuristics were told:
    those its export names (none for a model exported on the curves, or before profiles were
    copied), else those copied into `out` before its first export; None when the run kept
    neither, and only then are they looked for anew. A resume must not change what its
    teachers rank by, nor remove the copies its exported model needs."""
    meta = out / META_FILE
    if meta.is_file():
        return tuple(str(a) for a in json.loads(meta.read_text()).get("profiles", ()))
    copies = out / PROFILES_DIR
    return tuple(sorted(p.name for p in copies.iterdir() if p.is_dir())) \
        if copies.is_dir() else None
