"""The trainer's configuration: one frozen dataclass, built from command-line flags.

Every knob is a flag of `python -m rlalloc.trainer_jobs.train` (and of torchrun running it), and the
resolved configuration is written next to every checkpoint, so a run can be repeated from what it
left behind and a resume can be checked against it (`resume_conflicts`). Bad values end in a
`UserError` naming the flag and the fix.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, fields
from pathlib import Path

from rlalloc.env.errors import UserError
from rlalloc.trainer_jobs.model import ModelConfig

PARALLELISMS = ("ddp", "fsdp")
CHECKPOINT_MODES = ("sync", "async")


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run needs besides the torchrun environment."""

    model: ModelConfig
    """Shape of the language model."""
    max_steps: int = 1000
    """Total optimizer steps of the job; the step count continues across restarts."""
    global_batch: int = 8
    """Samples per optimizer step over all ranks; fixed, so world-size changes keep the maths."""
    lr: float = 3e-4
    """AdamW learning rate; unchanged by world size because the global batch is fixed."""
    num_samples: int = 65536
    """Samples per epoch of the generated data set."""
    seed: int = 0
    """Seeds the data, the weights and the per-epoch permutations."""
    parallelism: str = "ddp"
    """`ddp` (replicated weights) or `fsdp` (sharded, for models that do not fit one device)."""
    checkpoint_dir: Path = Path("checkpoints")
    """Where checkpoints live (a shared volume in Kubernetes)."""
    checkpoint_every_steps: int = 50
    """Checkpoint after every N steps (0: never by steps)."""
    checkpoint_every_s: float = 0.0
    """Checkpoint when M seconds passed since the last one (0: never by time)."""
    checkpoint_mode: str = "async"
    """`async` writes in a background thread after a quick in-memory copy; `sync` blocks."""
    keep_last: int = 3
    """Complete checkpoints kept; older ones are deleted after each new one commits."""
    sigterm_grace_s: float = 25.0
    """Budget for the final checkpoint after SIGTERM; keep it below the pod's grace period."""
    metrics_port: int = 0
    """Port of rank 0's Prometheus exporter (0: no exporter)."""
    job_name: str = "local"
    """Value of the `job` label on the metrics (the PyTorchJob's name)."""
    namespace: str = "default"
    """Value of the `namespace` label on the metrics."""
    log_jsonl: Path | None = None
    """Append one JSON line per step, checkpoint and restart here (read by tests, benchmark)."""

    def to_json_dict(self) -> dict[str, object]:
        """Plain-JSON form of the configuration, stored with each checkpoint."""
        result: dict[str, object] = {}
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, ModelConfig):
                value = {f.name: getattr(value, f.name) for f in fields(value)}
            elif isinstance(value, Path):
                value = str(value)
            result[field.name] = value
        return result


RESUME_FIXED_SETTINGS = ("global_batch", "num_samples", "seed", "lr")
"""Settings a checkpoint depends on besides the model shape (every `ModelConfig` field): the
saved data position is an offset into the permutation that --seed, --num-samples and
--global-batch define, and the restored optimizer state brings its own learning rate back, so a
changed --lr would be silently ignored. Everything else may change between restarts: the world
size, --parallelism (DCP loads across DDP and FSDP), --max-steps, the checkpoint and telemetry
flags."""


def _flag(name: str) -> str:
    """The command-line flag of a `TrainConfig` or `ModelConfig` field."""
    return "--" + name.replace("_", "-")


def _resume_fixed_values(config_json: dict[str, object]) -> dict[str, object]:
    """Flag -> value of every setting a resume must keep, from a `TrainConfig.to_json_dict()`
    form (None where the form lacks it)."""
    model = config_json.get("model")
    model = model if isinstance(model, dict) else {}
    values = {_flag(f.name): model.get(f.name) for f in fields(ModelConfig)}
    values.update({_flag(name): config_json.get(name) for name in RESUME_FIXED_SETTINGS})
    return values


def resume_fixed_flags() -> list[str]:
    """The flags a resume must keep (for the help text)."""
    return list(_resume_fixed_values({}))


def resume_conflicts(saved: dict[str, object], current: dict[str, object]) -> list[str]:
    """`--flag SAVED (flags: NEW)` for each setting a resume must keep that the flags change.

    `saved` comes from a checkpoint's marker, `current` from this run (both `to_json_dict()`
    forms). A setting the saved form lacks counts as changed: the checkpoint's data position
    cannot be trusted without it.
    """
    old, new = _resume_fixed_values(saved), _resume_fixed_values(current)
    return [f"{flag} {old[flag]} (flags: {new[flag]})" for flag in new if old[flag] != new[flag]]


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the trainer's flags (defaults come from the dataclasses)."""
    model, train = ModelConfig(), TrainConfig(model=ModelConfig())
    group = parser.add_argument_group("model")
    group.add_argument("--vocab-size", type=int, default=model.vocab_size,
                       help="tokens in the vocabulary")
    group.add_argument("--d-model", type=int, default=model.d_model,
                       help="width of the transformer (a multiple of --n-heads)")
    group.add_argument("--n-layers", type=int, default=model.n_layers,
                       help="transformer blocks")
    group.add_argument("--n-heads", type=int, default=model.n_heads,
                       help="attention heads per block")
    group.add_argument("--seq-len", type=int, default=model.seq_len,
                       help="tokens per sample the model predicts")
    group.add_argument("--dropout", type=float, default=model.dropout,
                       help="dropout probability in [0, 1)")
    group = parser.add_argument_group("training")
    group.add_argument("--max-steps", type=int, default=train.max_steps,
                       help="total optimizer steps of the job; the count continues across restarts")
    group.add_argument("--global-batch", type=int, default=train.global_batch,
                       help="samples per step over all ranks, whatever the world size")
    group.add_argument("--lr", type=float, default=train.lr,
                       help="AdamW learning rate (not scaled with the world size)")
    group.add_argument("--num-samples", type=int, default=train.num_samples,
                       help="samples per epoch of the generated data")
    group.add_argument("--seed", type=int, default=train.seed,
                       help="seed of the data, the initial weights and the per-epoch permutations")
    group.add_argument("--parallelism", choices=PARALLELISMS, default=train.parallelism,
                       help="ddp replicates the model, fsdp shards it")
    group = parser.add_argument_group("checkpointing")
    group.add_argument("--checkpoint-dir", type=Path, default=train.checkpoint_dir,
                       help="where checkpoints are written and resumed from (shared by all ranks)")
    group.add_argument("--checkpoint-every-steps", type=int, default=train.checkpoint_every_steps,
                       help="checkpoint every N steps (0: never by steps)")
    group.add_argument("--checkpoint-every-s", type=float, default=train.checkpoint_every_s,
                       help="checkpoint when S seconds passed since the last one "
                            "(0: never by time)")
    group.add_argument("--checkpoint-mode", choices=CHECKPOINT_MODES, default=train.checkpoint_mode,
                       help="async overlaps the write with training, sync blocks until written")
    group.add_argument("--keep-last", type=int, default=train.keep_last,
                       help="committed checkpoints kept; older ones are deleted")
    group.add_argument("--sigterm-grace-s", type=float, default=train.sigterm_grace_s,
                       help="budget for the final checkpoint after SIGTERM (keep it below the "
                            "pod's grace period)")
    group = parser.add_argument_group("telemetry")
    group.add_argument("--metrics-port", type=int, default=train.metrics_port,
                       help="port of rank 0's Prometheus exporter (0: no exporter)")
    group.add_argument("--job-name", default=os.environ.get("RLALLOC_JOB_NAME", train.job_name),
                       help="job label of the metrics (default $RLALLOC_JOB_NAME or local)")
    group.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", train.namespace),
                       help="namespace label of the metrics (default $POD_NAMESPACE or default)")
    group.add_argument("--log-jsonl", type=Path, default=None,
                       help="append a JSON line per step, checkpoint and restart to this file")


def _require(condition: bool, message: str) -> None:
    """Raise a one-line `UserError` unless `condition` holds."""
    if not condition:
        raise UserError(message)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """Validate parsed flags and build the configuration; a bad value raises `UserError`."""
    _require(args.vocab_size >= 2, f"--vocab-size {args.vocab_size}: need at least 2 tokens")
    _require(args.d_model > 0 and args.n_heads > 0 and args.d_model % args.n_heads == 0,
             f"--d-model {args.d_model} must be a positive multiple of --n-heads {args.n_heads}")
    _require(args.n_layers >= 1, f"--n-layers {args.n_layers}: need at least one block")
    _require(args.seq_len >= 2, f"--seq-len {args.seq_len}: need at least 2 tokens")
    _require(0.0 <= args.dropout < 1.0, f"--dropout {args.dropout}: must be in [0, 1)")
    _require(args.max_steps >= 1, f"--max-steps {args.max_steps}: must be at least 1")
    _require(args.global_batch >= 1, f"--global-batch {args.global_batch}: must be at least 1")
    _require(args.lr > 0, f"--lr {args.lr}: must be positive")
    # the per-rank seeds (seed x 4e9 + ...) must stay within torch's 64 bits: 5e9 crashed
    # every rank with an overflow traceback
    _require(0 <= args.seed < 2**31, f"--seed {args.seed}: must be within [0, 2147483647]")
    _require(args.num_samples >= args.global_batch,
             f"--num-samples {args.num_samples} must be >= --global-batch {args.global_batch}")
    _require(args.checkpoint_every_steps >= 0,
             f"--checkpoint-every-steps {args.checkpoint_every_steps}: must be >= 0")
    _require(args.checkpoint_every_s >= 0,
             f"--checkpoint-every-s {args.checkpoint_every_s}: must be >= 0")
    _require(args.keep_last >= 1, f"--keep-last {args.keep_last}: keep at least one checkpoint")
    _require(args.sigterm_grace_s > 0, f"--sigterm-grace-s {args.sigterm_grace_s}: must be > 0")
    _require(0 <= args.metrics_port < 65536, f"--metrics-port {args.metrics_port}: not a port")
    if args.checkpoint_dir.exists():
        _require(args.checkpoint_dir.is_dir(),
                 f"--checkpoint-dir {args.checkpoint_dir} is a file; pass a directory")
    model = ModelConfig(
        vocab_size=args.vocab_size, d_model=args.d_model, n_layers=args.n_layers,
        n_heads=args.n_heads, seq_len=args.seq_len, dropout=args.dropout,
    )
    return TrainConfig(
        model=model, max_steps=args.max_steps, global_batch=args.global_batch, lr=args.lr,
        num_samples=args.num_samples, seed=args.seed, parallelism=args.parallelism,
        checkpoint_dir=args.checkpoint_dir, checkpoint_every_steps=args.checkpoint_every_steps,
        checkpoint_every_s=args.checkpoint_every_s, checkpoint_mode=args.checkpoint_mode,
        keep_last=args.keep_last, sigterm_grace_s=args.sigterm_grace_s,
        metrics_port=args.metrics_port, job_name=args.job_name, namespace=args.namespace,
        log_jsonl=args.log_jsonl,
    )
