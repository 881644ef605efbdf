"""What a training run does while RL steps: periodic checkpoints and evaluations, step discounts;
and the timer with which `rlalloc bench rollouts` stops `learn` after one rollout."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.progress import Progress
from stable_baselines3.common.callbacks import BaseCallback

from rlalloc.agent.checkpoints import CHECKPOINT_DIR, prune_checkpoints, save_checkpoint
from rlalloc.agent.export import deployed_net, export_model, in_memory_policy, uses_mask
from rlalloc.agent.heuristics import Speedups
from rlalloc.agent.job_sizes import JobSizeHistory
from rlalloc.agent.model_card import CARD_FILE, jct_json, jct_read, jct_text
from rlalloc.agent.train_config import TrainConfig
from rlalloc.agent.train_evaluation import evaluate_jct
from rlalloc.env.featurizer import FeatureSpec
from rlalloc.env.output import write_json
from rlalloc.env.progress import progress_task
from rlalloc.env.simulator import GiveUp


@dataclass
class PeriodicEvaluation:
    """Evaluates the policy being trained on the run's evaluation workloads, adds the score to
    the card (written at once, so that it is kept if the run is killed), exports the policy
    when it beats every earlier score, and logs the score to the console and TensorBoard."""

    config: TrainConfig
    out: Path
    """The run's directory: card.json and the exported policy go there."""
    spec: FeatureSpec
    """The observation spec of the training environments, saved with an export."""
    summary: dict
    """The run's summary (card.json); each evaluation is appended to its ``evaluations``."""
    started: float
    """`time.perf_counter()` when the run started (for a resumed run, less its wall seconds
    so far), for each evaluation's ``wall_s``."""
    progress: Progress
    eval_workloads: tuple[str, ...]
    eval_jobs: int
    """Jobs in `eval_workloads`: the length of an evaluation's progress bar."""
    give_up: dict[str, GiveUp]
    """When an evaluation's run on each workload is given up (`give_up_bounds`)."""
    sizes: JobSizeHistory | None
    """What the residual heuristics are told (`training_sizes`, `training_speedups`)."""
    speedups: Speedups | None
    profiles: tuple[str, ...]
    """The applications whose profiles an export names (`ExportMeta.profiles`)."""
    log: Callable[[str], None]
    best: float = field(init=False)
    """The lowest average JCT so far, the exported policy's (a resumed run's earlier ones
    included): a later evaluation must beat it to replace the export."""

    def __post_init__(self) -> None:
        self.best = min(map(jct_read, self.summary["evaluations"]), default=math.inf)

    def __call__(self, model: object, step: int) -> None:
        """Evaluate `model`, which has taken `step` RL steps."""
        config = self.config
        net, _ = deployed_net(model, config.algo)
        policy = in_memory_policy(net, config.algo, self.spec, residual=config.residual,
                                  sizes=self.sizes, speedups=self.speedups,
                                  masked=uses_mask(model, config.algo))
        with progress_task(self.progress, f"evaluate step {step:,}", self.eval_jobs) as advance:
            jct = evaluate_jct(policy.act, config, self.eval_workloads, on_progress=advance,
                               give_up=self.give_up)
        self.summary["evaluations"].append({"timesteps": step, "avg_jct_s": jct_json(jct),
                                            "wall_s": time.perf_counter() - self.started})
        write_json(self.out / CARD_FILE, self.summary)  # kept if killed
        if jct < self.best:
            self.best = jct
            export_model(model, config.algo, self.spec, self.out, residual=config.residual,
                         sizes=self.sizes, profiles=self.profiles)
        self.log(f"step {step}: avg JCT {jct_text(jct_json(jct))} on "
                 f"{len(self.eval_workloads)} evaluation workload(s) "
                 f"(best {jct_text(jct_json(self.best))})")
        # at its own step, now: SB3 dumps at rollout or episode ends, by which time a later
        # evaluation may have replaced it (DQN), and never after the last step
        model.logger.record("eval/avg_jct_s", jct)
        model.logger.dump(step)


class StepsAndEvaluations(BaseCallback):
    """Counts the steps (`advance`: the RL steps' progress bar); every `eval_every`,
    checkpoints into ``out/checkpoints`` (keeping the `keep_checkpoints` newest,
    `prune_checkpoints`) and then evaluates (in that order, so that every evaluation on the
    card has a checkpoint to resume from)."""

    def __init__(self, advance: Callable[[float], None], evaluate: PeriodicEvaluation,
                 out: Path, eval_every: int, keep_checkpoints: int) -> None:
        super().__init__()
        self.advance = advance
        self.evaluate = evaluate
        self.out = out
        self.eval_every = eval_every
        self.keep_checkpoints = keep_checkpoints

    def _on_step(self) -> bool:
        n_envs = self.training_env.num_envs
        self.advance(n_envs)
        if self.num_timesteps % self.eval_every < n_envs:
            save_checkpoint(self.model,
                            self.out / CHECKPOINT_DIR / f"step_{self.num_timesteps}_steps.zip")
            prune_checkpoints(self.out, self.keep_checkpoints)
            self.evaluate(self.model, self.num_timesteps)
        return True


def discount_callbacks(config: TrainConfig) -> list:
    """The callback that feeds step discounts to PPO's buffer under a time discount."""
    if config.time_discount_s <= 0 or config.algo != "ppo":  # a DQN's buffer reads them itself
        return []
    from rlalloc.agent.smdp import RecordDiscounts
    return [RecordDiscounts()]


class RolloutTimer(BaseCallback):
    """When `learn`'s first rollout starts (after its set-up, which resets the environments)
    and when its `n_steps`-th vector step is taken; it then stops `learn`, before any update:
    SB3's own rollout collection, timed through its public callback hooks."""

    def __init__(self, n_steps: int) -> None:
        super().__init__()
        self.n_steps = n_steps
        self.steps = 0
        self.started = self.ended = math.nan

    def _on_rollout_start(self) -> None:
        self.started = time.perf_counter()

    def _on_step(self) -> bool:
        self.steps += 1
        if self.steps < self.n_steps:
            return True
        self.ended = time.perf_counter()
        return False
