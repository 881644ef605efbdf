"""Export a trained SB3 model (MaskablePPO or DQN) to the deployed form of `rlalloc.agent.deployed`.

Only the parts inference needs are kept: the policy MLP (PPO: the actor's hidden layers and
action head; DQN: the Q-network), the layer sizes, the feature spec and the observation
normalisation, if any, and the heuristics behind a residual policy's "follow" actions
with the job-size table they are told and the applications whose profiles tell them job
speeds (`rlalloc.agent.residual`). The value network, optimizer and replay buffer stay behind.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from torch import nn

from rlalloc.agent.deployed import (
    ExportMeta,
    LearnedPolicy,
    ObsNormalization,
    PolicyNet,
    save_deployed,
)
from rlalloc.agent.job_sizes import JobSizeHistory
from rlalloc.env.featurizer import FeatureSpec

if TYPE_CHECKING:
    from rlalloc.agent.heuristics import Speedups


def _linear_stack(modules: list[nn.Module]) -> tuple[list[nn.Linear], str]:
    linears = [m for m in modules if isinstance(m, nn.Linear)]
    kinds = {type(m) for m in modules if not isinstance(m, nn.Linear)}
    activation = {nn.Tanh: "tanh", nn.ReLU: "relu"}
    assert len(kinds) <= 1 and kinds <= set(activation), f"unsupported layers {kinds}"
    return linears, activation[kinds.pop()] if kinds else "tanh"


def deployed_net(model: object, algo: str) -> tuple[PolicyNet, str]:
    """A `PolicyNet` holding the weights of `model`'s policy MLP, and its activation name."""
    policy = model.policy
    if algo == "ppo":
        modules = [*policy.mlp_extractor.policy_net, policy.action_net]
    else:
        modules = list(policy.q_net.q_net)
    linears, activation = _linear_stack(modules)
    hidden = tuple(layer.out_features for layer in linears[:-1])
    net = PolicyNet(linears[0].in_features, hidden, linears[-1].out_features, activation)
    targets = [m for m in net.layers if isinstance(m, nn.Linear)]
    for source, target in zip(linears, targets, strict=True):
        target.load_state_dict(source.state_dict())
    return net, activation


def uses_mask(model: object, algo: str) -> bool:
    """Whether `model` acts by the argmax over valid actions only: MaskablePPO always, a DQN
    where it was trained so (`rlalloc.agent.dqn`; SB3's own DQN takes the plain argmax)."""
    return algo == "ppo" or bool(getattr(model, "masked", False))


def _meta(net: PolicyNet, algo: str, activation: str, spec: FeatureSpec,
          obs_norm: ObsNormalization | None, residual: tuple[str, ...],
          sizes: JobSizeHistory | None, masked: bool, profiles: tuple[str, ...] = ()) -> ExportMeta:
    linears = [m for m in net.layers if isinstance(m, nn.Linear)]
    return ExportMeta(
        algo=algo, obs_size=linears[0].in_features, num_actions=linears[-1].out_features,
        hidden_sizes=tuple(m.out_features for m in linears[:-1]), activation=activation,
        feature_spec=ExportMeta.spec_fields(spec), masked=masked, obs_norm=obs_norm,
        residual=residual, job_sizes=None if sizes is None else tuple(sizes.to_json()),
        profiles=profiles)


def in_memory_policy(net: PolicyNet, algo: str, spec: FeatureSpec, activation: str = "tanh",
                     residual: tuple[str, ...] = (),
                     sizes: JobSizeHistory | None = None,
                     speedups: Speedups | None = None,
                     masked: bool | None = None) -> LearnedPolicy:
    """The deployed policy for `net` without a round trip through files (for evaluations
    during training); `sizes` and `speedups` are what its heuristics are told; `masked`
    whether it acts over valid actions only (`uses_mask`; None: as `algo`'s SB3 class does)."""
    masked = algo == "ppo" if masked is None else masked
    return LearnedPolicy(algo, _meta(net, algo, activation, spec, None, residual, sizes, masked),
                         net, speedups)


def export_model(model: object, algo: str, spec: FeatureSpec, directory: Path,
                 obs_norm: ObsNormalization | None = None,
                 residual: tuple[str, ...] = (),
                 sizes: JobSizeHistory | None = None,
                 profiles: tuple[str, ...] = ()) -> ExportMeta:
    """Write ``policy.pt`` + ``policy.json`` for `model` into `directory`; `residual` names
    the heuristics of the model's extra "follow" actions (none: the raw action space), `sizes`
    the job-size table they are told (None: not told) and `profiles` the applications whose
    profiles, copied into `directory` already (`rlalloc.agent.job_speeds.copy_profiles`), tell them
    job speeds."""
    net, activation = deployed_net(model, algo)
    meta = _meta(net, algo, activation, spec, obs_norm, residual, sizes,
                 uses_mask(model, algo), profiles)
    save_deployed(Path(directory), meta, net.state_dict())
    return meta
