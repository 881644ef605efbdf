"""The SB3 models a training run trains (MaskablePPO, DQN) and their TensorBoard logger."""

from __future__ import annotations

from pathlib import Path

from rlalloc.agent.dqn import configure_dqn, dqn_class, masked_replay_buffer_class
from rlalloc.agent.train_config import TrainConfig

TB_DIR = "tb"
DQN_LEARNING_STARTS = 1000
"""Steps a DQN collects into its replay buffer before its first update (again on a resume),
acting epsilon-greedily as after them (`rlalloc.agent.dqn.dqn_class`)."""


def build_model(config: TrainConfig, vec_env: object) -> object:
    """The SB3 model `rlalloc train` starts from, untrained: MaskablePPO or DQN (`dqn_class`)
    with `config`'s hyperparameters, in `vec_env` (also what `rlalloc bench sim` times)."""
    from sb3_contrib import MaskablePPO

    if config.algo == "ppo":
        return MaskablePPO(
            "MlpPolicy", vec_env, learning_rate=config.learning_rate, n_steps=config.n_steps,
            batch_size=config.batch_size, n_epochs=config.n_epochs, gamma=config.gamma,
            gae_lambda=config.gae_lambda, clip_range=config.clip_range,
            ent_coef=config.ent_coef, target_kl=config.target_kl, seed=config.seed,
            rollout_buffer_class=_rollout_buffer_class(config),
            policy_kwargs={"net_arch": {"pi": list(config.net_arch),
                                        "vf": list(config.net_arch)}},
            device="cpu", verbose=0)
    start_eps, end_eps = config.dqn_exploration
    model = dqn_class()(
        "MlpPolicy", vec_env, learning_rate=config.learning_rate,
        buffer_size=config.dqn_buffer_size, learning_starts=DQN_LEARNING_STARTS, batch_size=64,
        gamma=config.gamma, train_freq=4, target_update_interval=2000,
        exploration_initial_eps=start_eps, exploration_final_eps=end_eps,
        exploration_fraction=0.3, seed=config.seed,
        replay_buffer_class=masked_replay_buffer_class(),
        policy_kwargs={"net_arch": list(config.net_arch)}, device="cpu", verbose=0)
    configure_dqn_from(model, config)
    return model


def configure_dqn_from(model: object, config: TrainConfig) -> None:
    """Give a built or loaded DQN `config`'s learning settings (`rlalloc.agent.dqn`)."""
    configure_dqn(model, config.dqn_double, config.dqn_masked, config.dqn_demo_weight,
                  len(config.residual))


def _rollout_buffer_class(config: TrainConfig) -> type | None:
    """PPO's rollout buffer: per-step discounts under a time discount, else SB3's default."""
    if config.time_discount_s <= 0:
        return None
    from rlalloc.agent.smdp import SemiMdpRolloutBuffer
    return SemiMdpRolloutBuffer


def tensorboard_logger(out: Path, algo: str, purge_from: int | None = None) -> object:
    """The SB3 logger of a run: TensorBoard events in ``out/tb/<algo>_1`` (where SB3 would put
    them; set on the model, so a resume writes there even if `out` has moved since the
    checkpoint was saved). A resumed run purges the events from step `purge_from` on (its
    checkpoint's step + 1): the stopped run's steps after its checkpoint are taken again, and
    TensorBoard would otherwise draw both. (The checkpoint's own evaluation, if the stopped
    run got to it, is on the card before it is logged, so it is not logged twice.)"""
    from stable_baselines3.common.logger import Logger, TensorBoardOutputFormat
    from torch.utils.tensorboard import SummaryWriter

    class PurgingTensorBoard(TensorBoardOutputFormat):
        def __init__(self, folder: str) -> None:  # SB3's, with the purge step
            self.writer = SummaryWriter(log_dir=folder, purge_step=purge_from)
            self._is_closed = False

    folder = str(out / TB_DIR / f"{algo}_1")
    return Logger(folder, [PurgingTensorBoard(folder)])
