"""`rlalloc train`: train a MaskablePPO or DQN allocation policy (see `rlalloc.agent.training`)."""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import replace

from rlalloc.agent.train_config import TrainConfig
from rlalloc.cli.argtypes import POSITIVE_INT, SEED, above, at_least, out_path, within
from rlalloc.env.cluster import add_cluster_flag
from rlalloc.env.efficiency import add_efficiency_flag
from rlalloc.env.execution import add_ray_flag
from rlalloc.env.workload.loader import GENERATED_SOURCES

_DEFAULTS = TrainConfig()
_FRACTION = within(0.0, 1.0)
"""Probabilities, discounts and GAE lambda."""
_NON_NEGATIVE = at_least(0.0, float)
"""Costs, margins and time constants (0 = off)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `rlalloc train`."""
    parser.add_argument("--algo", choices=("ppo", "dqn"), default="ppo",
                        help="ppo = sb3-contrib MaskablePPO (masked), dqn = SB3 DQN with "
                             "double Q-learning over valid actions (rlalloc.agent.dqn)")
    parser.add_argument("--workload", action="append", dest="workloads", metavar="W",
                        help=f"training workload (repeatable): CSV path, {GENERATED_SOURCES};"
                             f" default {_DEFAULTS.workloads[0]}")
    add_cluster_flag(parser, _DEFAULTS.cluster)
    parser.add_argument("--timesteps", type=at_least(0), default=_DEFAULTS.timesteps,
                        help="RL environment steps after the warm start (default: "
                             "%(default)s), rounded up to whole rollouts: of --n-steps x "
                             "--n-envs steps (ppo), of 4 x --n-envs (dqn)")
    parser.add_argument("--seed", type=SEED, default=_DEFAULTS.seed,
                        help="seed of the environments, SB3 and the warm start")
    add_efficiency_flag(parser)
    parser.add_argument("--failures", default=_DEFAULTS.failures,
                        help="failures per GPU-day or none|default|stress (default: "
                             "%(default)s, unlike simulate and evaluate)")
    parser.add_argument("--n-envs", type=POSITIVE_INT, default=_DEFAULTS.n_envs,
                        help="environments stepped together (DummyVecEnv; with --ray, "
                             "spread over the cluster's actors)")
    parser.add_argument("--n-steps", type=POSITIVE_INT, default=_DEFAULTS.n_steps,
                        help="ppo: steps per environment per update (larger = less noisy "
                             "updates)")
    parser.add_argument("--batch-size", type=at_least(2), default=_DEFAULTS.batch_size,
                        help="ppo: minibatch size (advantages are normalised over it)")
    parser.add_argument("--gae-lambda", type=_FRACTION, default=_DEFAULTS.gae_lambda,
                        help="ppo: GAE lambda (lower = less variance, more critic bias)")
    parser.add_argument("--learning-rate", type=above(0.0), default=_DEFAULTS.learning_rate,
                        help="default %(default)g")
    parser.add_argument("--warm-start", default=_DEFAULTS.warm_start,
                        help="heuristic to behaviour-clone first ('' for none)")
    parser.add_argument("--dagger-rounds", type=at_least(0), default=_DEFAULTS.dagger_rounds,
                        help="rounds of DAgger after cloning the --warm-start heuristic")
    parser.add_argument("--residual", default="", metavar="H1[,H2...]",
                        help="add a 'follow H' action per heuristic and start as H1 (replaces "
                             "--warm-start; see rlalloc.agent.residual)")
    parser.add_argument("--learn-sizes", action="store_true",
                        help="residual: tell the heuristics and the policy job sizes learnt "
                             "from the training workloads (rlalloc.agent.job_sizes; saved in the "
                             "model), and the heuristics job speeds from their applications' "
                             "profiles where found (rlalloc.agent.job_speeds; copied into the "
                             "model)")
    parser.add_argument("--imitate", action="append", default=[], metavar="NPZ",
                        help="residual: fit the actor to these lookahead recordings first "
                             "(`rlalloc headroom --record`; repeatable; recorded with --base "
                             "and --alternatives equal to --residual's H1 and H2...)")
    parser.add_argument("--imitate-margin", type=_NON_NEGATIVE, default=_DEFAULTS.imitate_margin,
                        help="with --imitate: job-hours a deviation from H1 must be predicted "
                             "to save")
    parser.add_argument("--residual-veto-p", type=_FRACTION, default=_DEFAULTS.residual_veto_p,
                        help="residual PPO start: chance of sampling a veto of a proposal")
    parser.add_argument("--residual-raw-p", type=_FRACTION, default=_DEFAULTS.residual_raw_p,
                        help="residual PPO start: chance of sampling a raw action")
    parser.add_argument("--residual-switch-p", type=_FRACTION, default=_DEFAULTS.residual_switch_p,
                        help="residual PPO start: chance of following H2... where H1 is idle")
    parser.add_argument("--action-cost", type=_NON_NEGATIVE, default=_DEFAULTS.action_cost,
                        help="reward charged per applied action (rewards are scaled by 0.01)")
    parser.add_argument("--gamma", type=_FRACTION, default=_DEFAULTS.gamma,
                        help="discount per environment step (default 1: only simulated "
                             "time discounts)")
    parser.add_argument("--time-discount-s", type=_NON_NEGATIVE, default=_DEFAULTS.time_discount_s,
                        help="semi-MDP discount exp(-t/T) over simulated seconds, on top of "
                             "--gamma (default 1800; 0 = off, then set --gamma below 1)")
    parser.add_argument("--dqn-double", action=argparse.BooleanOptionalAction,
                        default=_DEFAULTS.dqn_double,
                        help="dqn: double Q-learning targets (default on)")
    parser.add_argument("--dqn-masked", action=argparse.BooleanOptionalAction,
                        default=_DEFAULTS.dqn_masked,
                        help="dqn: act and take the target's max over valid actions only "
                             "(default on; off: SB3's DQN, an invalid action a no-op)")
    parser.add_argument("--dqn-demo-weight", type=_NON_NEGATIVE,
                        default=_DEFAULTS.dqn_demo_weight,
                        help="residual dqn: weight of DQfD's large-margin loss toward the first "
                             "heuristic (0 = off)")
    parser.add_argument("--eval-every", type=POSITIVE_INT, default=_DEFAULTS.eval_every,
                        help="steps between evaluations on the training workloads")
    parser.add_argument("--keep-checkpoints", type=at_least(0),
                        default=_DEFAULTS.keep_checkpoints, metavar="N",
                        help="keep only the N newest periodic checkpoints (~2 MB each; "
                             "--resume needs the newest; default 0: keep all)")
    parser.add_argument("--eval-workload", action="append", dest="eval_workloads", metavar="W",
                        help="workload of the periodic evaluation that picks the exported "
                             "policy (repeatable; default: the first two training workloads;"
                             " never a held-out one)")
    add_ray_flag(parser, "the environments' steps (the learning stays in this process and "
                 "learns as without --ray)")
    parser.add_argument("--out", type=out_path, required=True, help="model directory")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--force", action="store_true",
                       help="replace an earlier run in OUT: its model, cards, config, "
                            "checkpoints/ and tb/ are removed before training starts")
    group.add_argument("--resume", action="store_true",
                       help="continue the run in OUT from its latest checkpoint up to --timesteps")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The `TrainConfig` that `rlalloc train` flags describe (the command line is kept in
    ``extra`` so that the model card can show it); under --resume, settings without a flag
    are the run's own (`saved_config`)."""
    from rlalloc.agent.run_dir import saved_config

    base = (saved_config(args.out) if args.resume else None) or _DEFAULTS
    return replace(
        base, algo=args.algo, workloads=tuple(args.workloads or _DEFAULTS.workloads),
        cluster=args.cluster, timesteps=args.timesteps, seed=args.seed, failures=args.failures,
        efficiency=args.efficiency,
        n_envs=args.n_envs, n_steps=args.n_steps, batch_size=args.batch_size,
        gae_lambda=args.gae_lambda, learning_rate=args.learning_rate, warm_start=args.warm_start,
        dagger_rounds=args.dagger_rounds,
        residual=tuple(name for name in args.residual.split(",") if name),
        learn_sizes=args.learn_sizes,
        imitate=tuple(args.imitate), imitate_margin=args.imitate_margin,
        residual_veto_p=args.residual_veto_p,
        residual_raw_p=args.residual_raw_p, residual_switch_p=args.residual_switch_p,
        action_cost=args.action_cost, gamma=args.gamma, time_discount_s=args.time_discount_s,
        dqn_double=args.dqn_double, dqn_masked=args.dqn_masked,
        dqn_demo_weight=args.dqn_demo_weight,
        eval_every=args.eval_every, keep_checkpoints=args.keep_checkpoints,
        eval_workloads=tuple(args.eval_workloads or ()),
        extra={"command": "rlalloc " + shlex.join(sys.argv[1:])})


def run(args: argparse.Namespace) -> int:
    """Train, export the best policy to OUT and write OUT/card.json (the flags' ranges are
    checked by argparse, everything else by `train` before it writes anything)."""
    if args.ray is not None:  # a cluster that does not answer fails now, before anything else
        from rlalloc.env.ray_cluster import connect

        connect(args.ray)
    from rlalloc.agent.checkpoints import CHECKPOINT_DIR
    from rlalloc.agent.model_card import heuristic_scores
    from rlalloc.agent.training import train

    try:
        summary = train(config_from_args(args), args.out, resume=args.resume, force=args.force,
                        ray_address=args.ray)
    except KeyboardInterrupt:
        if not any((args.out / CHECKPOINT_DIR).glob("*.zip")):
            raise  # `--resume` will say to start again with --force
        raise KeyboardInterrupt(f"--resume continues it from {args.out / CHECKPOINT_DIR} (add "
                                "it to the same command, without --force)") from None
    exported = summary["exported_timesteps"]
    start = " (the start, before any RL step)" if exported == 0 else ""
    print(f"saved {args.out}: the policy of step {exported:,}{start}, avg JCT "
          f"{summary['best_avg_jct_s']:,.0f} s on the training evaluation; there "
          f"{heuristic_scores(summary)} "
          f"({summary['timesteps']:,} steps, {summary['wall_s']:.0f} s wall; card.md has each "
          "evaluation)")
    return 0
