"""The configuration of a training run (`TrainConfig`) and the checks of its settings."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rlalloc.agent.evaluation import GIVE_UP_FACTOR
from rlalloc.agent.job_sizes import JobSizeHistory
from rlalloc.agent.registry import load_policy
from rlalloc.agent.residual import residual_teachers
from rlalloc.env.errors import UserError
from rlalloc.env.failures import FailureParams, parse_failure_rate
from rlalloc.env.params import SimParams

CONFIG_FILE = "train_config.json"


@dataclass(frozen=True)
class TrainConfig:
    """One training run; saved as train_config.json next to the model so it can be re-run."""

    algo: str = "ppo"
    """'ppo' (sb3-contrib MaskablePPO, reads the action mask) or 'dqn' (`rlalloc.agent.dqn`)."""
    workloads: tuple[str, ...] = ("synthetic:160:1.0",)
    """Training workloads; each episode replays one, chosen at random."""
    cluster: str = "16x4"
    timesteps: int = 100_000
    """RL environment steps after the warm start."""
    seed: int = 0
    failures: str = "none"
    """Failure rate during training: a preset name or failures per GPU-day."""
    efficiency: str = "none"
    """Profiled jobs' progress model in training and its evaluations (`--efficiency`)."""
    n_envs: int = 2
    """Environments stepped in lock-step in one process (DummyVecEnv: an env step costs less
    than a sub-process round trip; docs/agent.md, "Training recipe and flags")."""
    net_arch: tuple[int, ...] = (128, 128)
    learning_rate: float = 1e-4
    """PPO and DQN alike (`rlalloc train`'s default for both): small, since large steps undo
    the warm start, but not 3e-5, which fell behind 1e-4 on the training workloads
    (docs/experiments/2026-11-21-ppo-dqn-plain-heuristics.md). 1e-4 is the raw-action recipe's
    and the shipped DQN's; the residual recipes pass 3e-4 to 1e-3 (models/ppo/card.md)."""
    n_steps: int = 1024
    """PPO steps per environment per update (`--n-steps`); larger = less noisy updates."""
    batch_size: int = 256
    n_epochs: int = 4
    gamma: float = 1.0
    time_discount_s: float = 1800.0
    """Semi-MDP discount: time constant (simulated seconds) of exp(-t/T), applied on top of
    `gamma` per step (`RewardWeights.time_discount_s`; PPO's GAE in `rlalloc.agent.smdp`, DQN's
    TD target in `rlalloc.agent.dqn`); 0: off. With gamma 1 (the default) zero-time actions
    are not discounted at all. On by default, as in the shipped PPO's and DQN's recipes: a
    per-step discount alone pays a policy for actions that take no time, since each defers
    the costs (docs/agent.md, "Reward and discounting")."""
    gae_lambda: float = 0.95
    """GAE lambda (`--gae-lambda`): lower trusts the critic sooner, less variance, more bias."""
    clip_range: float = 0.1
    ent_coef: float = 0.0
    target_kl: float = 0.02
    reward_scale: float = 0.01
    """Rewards (minus job-hours per step) are multiplied by this."""
    action_cost: float = 0.0
    """Charged (after scaling) per applied action; see `ScaledReward` for why. 0 for the
    shipped PPO; 0.05 (= 5 job-hours at reward_scale 0.01) after the warm start made PPO
    worse (docs/experiments/2026-11-21-reward-flaw.md): too large, a smaller one is untested."""
    warm_start: str = "elastic"
    """Heuristic to behaviour-clone before RL ('' for none); unused with `residual`."""
    residual: tuple[str, ...] = ()
    """Heuristics behind extra "follow its proposal" actions (`rlalloc.agent.residual`);
    none for the raw action space. Replaces the warm start by `_residual_start`."""
    learn_sizes: bool = False
    """Residual only: fit a job-size table on the training workloads (`JobSizeHistory`), tell
    it to the residual heuristics and show it in the observation; tell them job speeds from
    the profiles of its applications too (`training_speedups`). The table is saved in the
    model, copies of the profiles beside it."""
    imitate: tuple[str, ...] = ()
    """Lookahead recordings (`rlalloc headroom --record`) the residual actor is fitted to
    before RL (`rlalloc.agent.distill`); none: the actor starts as the first heuristic."""
    imitate_margin: float = 0.5
    """After `imitate`: job-hours a deviation must be predicted to save (`prefer_base`)."""
    residual_veto_p: float = 0.1
    """Residual PPO start: probability that the sampling policy vetoes the first heuristic."""
    residual_raw_p: float = 0.02
    """Residual PPO start: probability that the sampling policy takes a raw action instead."""
    residual_switch_p: float = 0.1
    """Residual PPO start: probability of following another heuristic where the first is idle."""
    bc_episodes_per_workload: int = 1
    bc_epochs: int = 30
    bc_learning_rate: float = 1e-3
    dagger_rounds: int = 2
    """Rounds of DAgger after cloning: the student drives, the teacher labels."""
    eval_every: int = 20_000
    """Environment steps between evaluations on `eval_workloads`."""
    keep_checkpoints: int = 0
    """Periodic checkpoints kept, the newest ones (0: all). Each is ~2 MB, one per
    evaluation; `--resume` needs only the newest, and the best policy is exported apart."""
    eval_workloads: tuple[str, ...] = ()
    """Workloads of the periodic evaluation (default: the first two training workloads)."""
    give_up_factor: float = GIVE_UP_FACTOR
    """A periodic evaluation's run is given up (counted as unfinished) once its average JCT is
    sure to exceed this many times `static`'s on the workload, or a job has waited this many
    times static's longest JCT (`give_up_bounds`; 0: never). A random start ran every
    evaluation to the time limit (a few jobs it never finished), for many minutes per Pollux
    workload (docs/agent.md, "Training recipe and flags"), to learn only that it was far worse
    than first come first served; no export should take such a policy."""
    dqn_buffer_size: int = 100_000
    dqn_exploration: tuple[float, float] = (0.05, 0.01)
    """DQN epsilon start and end (small: the warm start already acts like the heuristic)."""
    dqn_double: bool = True
    """DQN: double Q-learning, the online network choosing the target's next action
    (`rlalloc.agent.dqn`); False: SB3's max of the target network."""
    dqn_masked: bool = True
    """DQN: act, explore and take the target's max over valid actions only; False: over all
    (SB3's DQN; an invalid action is then a counted no-op in the env)."""
    dqn_demo_weight: float = 0.0
    """Residual DQN: weight of DQfD's large-margin loss keeping the first heuristic's action
    ahead of the others by the start's margin (`large_margin_loss`); 0: off."""
    extra: dict = field(default_factory=dict)
    """Free-form notes saved with the config (the command line that produced it)."""

    def sim_params(self) -> SimParams:
        """Simulator parameters implied by `failures`."""
        rate = parse_failure_rate(self.failures)
        return SimParams(failures=FailureParams(failures_per_gpu_day=rate))


def check_config(config: TrainConfig) -> None:
    """Refuse settings that SB3, the residual start or the simulator would reject only after
    minutes of work (each flag's own range is checked where it is parsed, `rlalloc.cli.train`;
    these are the combinations, and the names)."""
    if not (config.give_up_factor == 0 or 1 <= config.give_up_factor < math.inf):
        raise UserError(f"give_up_factor {config.give_up_factor}: 0 (never give up) or a finite "
                        "factor of at least 1 (a run is given up past that many times static)")
    if config.dqn_demo_weight > 0 and not (config.algo == "dqn" and config.residual):
        raise UserError("--dqn-demo-weight keeps a residual DQN near its first heuristic; use "
                        "it with --algo dqn --residual H1[,H2...]")
    if config.imitate and config.algo != "ppo":
        raise UserError("--imitate fits a PPO actor to the lookahead's advantages; use --algo "
                        "ppo, or --residual without --imitate for DQN")
    if config.learn_sizes:
        if not config.residual:
            raise UserError("--learn-sizes tells the residual heuristics job sizes; give "
                            "--residual too, e.g. elastic-srpt-0.25,elastic-srpt,elastic")
        if config.efficiency != "none":
            raise UserError(f"--learn-sizes needs --efficiency none: under {config.efficiency} "
                            "its heuristics would rank growth by the measured profiles' step "
                            "rates, not the goodput jobs train at; for sia told sizes under "
                            "efficiency use `rlalloc sizes fit --base sia --efficiency`")
        residual_teachers(config.residual, JobSizeHistory({}, {}))  # elastic ones only
    if config.imitate and not config.residual:
        raise UserError("--imitate fits a residual policy; give --residual with the "
                        "recording's base and alternatives, e.g. "
                        "elastic-srpt-0.25,elastic-srpt,elastic")
    if config.algo == "ppo" and config.n_steps * config.n_envs < 2:
        raise UserError(f"--n-steps {config.n_steps} x --n-envs {config.n_envs}: a PPO rollout "
                        "needs at least 2 steps (its advantages are normalised over them)")
    if config.algo == "ppo" and config.batch_size > config.n_steps * config.n_envs:
        # SB3 would take the whole rollout as one minibatch, silently ignoring the flag
        raise UserError(f"--batch-size {config.batch_size} is more than a rollout's --n-steps "
                        f"{config.n_steps} x --n-envs {config.n_envs} steps; give at most "
                        f"{config.n_steps * config.n_envs} or a larger --n-steps")
    if repeated := sorted({n for n in config.residual if config.residual.count(n) > 1}):
        raise UserError(f"--residual {','.join(config.residual)}: {', '.join(repeated)} is given "
                        "twice (its follow actions would be the same action); name each once")
    if config.residual:
        residual_teachers(config.residual)  # unknown names, before --out is looked at
    for flag, probability in (("--residual-veto-p", config.residual_veto_p),
                              ("--residual-raw-p", config.residual_raw_p),
                              ("--residual-switch-p", config.residual_switch_p)):
        if config.residual and not 0.0 < probability < 1.0:
            raise UserError(f"{flag} {probability:g}: must be strictly between 0 and 1 (the "
                            "start's logits are its log-odds); use e.g. 0.001 for almost never")
    parse_failure_rate(config.failures)
    if config.warm_start and not config.residual:
        load_policy(config.warm_start)  # fails fast with the list of valid names
