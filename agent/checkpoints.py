"""A training run's SB3 checkpoints: saved whole, found, pruned and loaded to train on."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from rlalloc.agent.dqn import dqn_class, masked_replay_buffer_class
from rlalloc.agent.sb3_models import DQN_LEARNING_STARTS, configure_dqn_from
from rlalloc.agent.train_config import TrainConfig
from rlalloc.env.errors import UserError
from rlalloc.env.output import write_atomic

CHECKPOINT_DIR = "checkpoints"
LAST_CHECKPOINT = "last.zip"


def latest_checkpoint(out: Path) -> Path | None:
    """The checkpoint with the most timesteps in ``out/checkpoints`` (periodic ones are
    ``step_<N>_steps.zip``; ``last.zip`` is written when a run ends)."""
    found = sorted((out / CHECKPOINT_DIR).glob("*.zip"))
    if not found:
        return None
    return max(found, key=checkpoint_timesteps)


def prune_checkpoints(out: Path, keep: int) -> None:
    """Remove all but the `keep` newest periodic checkpoints of ``out/checkpoints`` (by the
    step in their names; ``last.zip`` is not periodic); `keep` 0 keeps every one."""
    if keep <= 0:
        return
    periodic = sorted((out / CHECKPOINT_DIR).glob("step_*_steps.zip"),
                      key=lambda path: int(path.name.split("_")[1]))
    for old in periodic[:-keep]:
        old.unlink(missing_ok=True)


def checkpoint_timesteps(checkpoint: Path) -> int:
    """The RL steps an SB3 checkpoint zip had taken when it was saved; a `UserError` naming
    it if it cannot be read (one written by an older rlalloc that was killed while saving:
    `save_checkpoint` now writes whole files only)."""
    from stable_baselines3.common.save_util import load_from_zip_file

    try:
        return int(load_from_zip_file(checkpoint, load_data=True)[0]["num_timesteps"])
    except (ValueError, KeyError, TypeError, OSError) as err:
        raise UserError(f"{checkpoint}: damaged checkpoint ({str(err).splitlines()[0][:80]}); "
                        "delete it to resume from the one before, or start again with "
                        "--force") from None


def save_checkpoint(model: object, path: Path) -> None:
    """Save `model` (SB3 zip) to `path` whole or not at all: SB3 writes the zip in place, so
    a run killed while saving left a truncated checkpoint that `--resume` then picked."""
    buffer = io.BytesIO()
    model.save(buffer)
    path.parent.mkdir(exist_ok=True)
    write_atomic(path, buffer.getvalue())


def resumed_seed(seed: int, step: int) -> int:
    """The seed a run of `seed` resumed from its checkpoint at `step` seeds its environments,
    numpy and torch with. SB3's load seeds them with the run's own seed again, so every resume
    replayed the run's first episodes and random numbers; a fresh run keeps `seed` itself, and
    a resume from the same checkpoint is as reproducible as the run."""
    return int(np.random.SeedSequence((seed, step)).generate_state(1)[0])


def load_model(config: TrainConfig, path: Path, vec_env: object) -> object:
    """The model saved at `path`, to go on training in `vec_env`, its random streams and
    environments seeded by `resumed_seed`. A DQN's replay buffer is not in its checkpoint
    (100k transitions would make each one hundreds of MB): it starts empty and, as at the
    start, is filled with `DQN_LEARNING_STARTS` steps before the first update, instead of
    updating on batches drawn from the first few transitions."""
    from sb3_contrib import MaskablePPO

    if config.algo == "ppo":
        model = MaskablePPO.load(path, env=vec_env, device="cpu")
    else:
        # a checkpoint of an older rlalloc names SB3's own buffer, which keeps no masks
        model = dqn_class().load(path, env=vec_env, device="cpu", custom_objects={
            "replay_buffer_class": masked_replay_buffer_class()})
        configure_dqn_from(model, config)
        model.acts_from_start = bool(config.warm_start or config.residual
                                     or model.num_timesteps >= model.learning_starts)
        model.learning_starts = model.num_timesteps + DQN_LEARNING_STARTS
    model.set_random_seed(resumed_seed(config.seed, model.num_timesteps))
    return model
