"""Learned policies in their deployed form: plain torch weights + a versioned JSON, no SB3.

A saved model directory holds

- ``policy.pt``: the ``state_dict`` of `PolicyNet` (an MLP: observation -> one score per
  discrete action: action logits for PPO, Q-values for DQN);
- ``policy.json``: `ExportMeta` (format version, algorithm, layer sizes, activation, the
  `FeatureSpec` the observation and action layout come from, observation-normalisation
  statistics if training used them, whether the action mask applies, and, for a residual
  policy, the heuristics its extra "follow" actions defer to, the job-size table they are
  told, if any, and the applications whose profiles tell them job speeds: see
  `rlalloc.agent.residual`);
- ``profiles/``: copies of those applications' measured profiles (`rlalloc.agent.job_speeds`),
  so that the model runs anywhere, whatever profiles are installed there.

The actuator loads this with torch alone, so the training stack (and SB3's pickled zips, which
break across Python versions) never enters the cluster. `rlalloc.agent.export` writes it from a
trained SB3 model, and a test checks it picks the same actions as SB3's ``predict``.
"""

from __future__ import annotations

import io
import json
import pickle
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from rlalloc.agent.catalogue import HEURISTICS
from rlalloc.agent.job_sizes import JobSizeHistory
from rlalloc.agent.model_files import META_FILE, WEIGHTS_FILE
from rlalloc.env.errors import UserError
from rlalloc.env.featurizer import FeatureSpec, Featurizer
from rlalloc.env.output import write_atomic
from rlalloc.env.state import Action, ClusterState, Strategy

if TYPE_CHECKING:
    from rlalloc.agent.heuristics import Speedups

FORMAT_VERSION = 5
"""Bumped whenever `policy.json` or the network layout changes incompatibly (2 added
`residual`, 3 `job_sizes`, 4 `profiles`, 5 `feature_spec.gpu_types`)."""
READABLE_VERSIONS = (1, 2, 3, 4, 5)
"""Versions this rlalloc loads (a version-1 file is a policy over the raw actions; before 4,
told heuristics rank by the state's speed curves; before 5, every policy is untyped)."""
RETRAIN_TOLD = "rlalloc train --residual ... --learn-sizes"
"""The command that writes a model told sizes and speeds again, for errors naming it."""
_ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}


@dataclass(frozen=True)
class ObsNormalization:
    """VecNormalize's observation statistics: ``clip((obs - mean) / sqrt(var + eps))``."""

    mean: tuple[float, ...]
    var: tuple[float, ...]
    clip: float = 10.0
    epsilon: float = 1e-8


@dataclass(frozen=True)
class ExportMeta:
    """Everything inference needs besides the weights (saved as policy.json)."""

    algo: str
    """'ppo' (MaskablePPO: argmax of masked logits) or 'dqn' (argmax of Q-values)."""
    obs_size: int
    num_actions: int
    hidden_sizes: tuple[int, ...]
    activation: str
    feature_spec: dict
    """`FeatureSpec` fields (strategies as ints; `gpu_types` absent before format 5)."""
    masked: bool
    """Apply the action mask before the argmax (as MaskablePPO's predict does; DQN does not)."""
    obs_norm: ObsNormalization | None = None
    residual: tuple[str, ...] = ()
    """Heuristics behind the extra last actions, "follow its proposal" (none: raw actions)."""
    job_sizes: tuple[dict, ...] | None = None
    """Residual only: the job-size table (`JobSizeHistory.to_json`) the heuristics are told and
    the observation shows (`rlalloc train --learn-sizes`); None: not told."""
    profiles: tuple[str, ...] = ()
    """Told sizes only: the applications whose measured profiles, copied into the model
    directory (`rlalloc.agent.job_speeds.PROFILES_DIR`), tell the heuristics job speed-ups
    (`speedups_in`); none: the state's curves (so every model before format 4)."""
    format_version: int = FORMAT_VERSION

    def spec(self) -> FeatureSpec:
        """The `FeatureSpec` the model was trained with."""
        fields = dict(self.feature_spec)
        fields["worker_levels"] = tuple(fields["worker_levels"])
        fields["strategies"] = tuple(Strategy(s) for s in fields["strategies"])
        fields["gpu_types"] = tuple(str(t) for t in fields.get("gpu_types", ()))
        return FeatureSpec(**fields)

    def featurizer(self, speedups: Speedups | None = None) -> Featurizer:
        """The featurizer the model was trained with (residual if `residual` names any), its
        told heuristics ranking by `speedups` (`speedups_in` of the model's directory; None:
        the state's curves)."""
        if not self.residual:
            return Featurizer(self.spec())
        from rlalloc.agent.residual import residual_featurizer  # needs the heuristics, not SB3

        return residual_featurizer(self.spec(), self.residual, self.sizes(), speedups)

    def speedups_in(self, directory: Path) -> Speedups | None:
        """The speed-ups the told heuristics rank by, from the `profiles` copied into the
        model `directory` (None, the state's curves, where there are none); a one-line
        `UserError` when a copy is missing or unreadable."""
        from rlalloc.agent.job_speeds import read_copied_profiles, speedups_of

        sizes = self.sizes()
        if sizes is None:
            return None
        models = read_copied_profiles(directory, list(self.profiles), sizes, RETRAIN_TOLD)
        return speedups_of(models)

    def sizes(self) -> JobSizeHistory | None:
        """The job-size table of `job_sizes` (None if the model is not told sizes)."""
        return None if self.job_sizes is None else JobSizeHistory.from_json(list(self.job_sizes))

    def expected_obs_size(self) -> int:
        """Observation length of this rlalloc's `featurizer()` for the model."""
        if not self.residual:
            return self.spec().obs_size
        from rlalloc.agent.residual import residual_obs_size

        return residual_obs_size(self.spec(), len(self.residual), self.job_sizes is not None)

    @staticmethod
    def spec_fields(spec: FeatureSpec) -> dict:
        """JSON-ready fields of `spec`."""
        return {"top_k": spec.top_k, "worker_levels": list(spec.worker_levels),
                "strategies": [int(s) for s in spec.strategies],
                "checkpoint_interval_s": spec.checkpoint_interval_s,
                "gpu_types": list(spec.gpu_types)}


class PolicyNet(nn.Module):
    """The MLP of a trained policy: hidden layers with one activation, then a linear head."""

    def __init__(self, obs_size: int, hidden_sizes: tuple[int, ...], num_actions: int,
                 activation: str) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = obs_size
        for size in hidden_sizes:
            layers += [nn.Linear(width, size), _ACTIVATIONS[activation]()]
            width = size
        layers.append(nn.Linear(width, num_actions))
        self.layers = nn.Sequential(*layers)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Scores (logits or Q-values) per action."""
        return self.layers(obs)


class LearnedPolicy:
    """A deployed learned policy: featurize, normalise, score, mask, argmax, decode."""

    def __init__(self, name: str, meta: ExportMeta, net: PolicyNet,
                 speedups: Speedups | None = None) -> None:
        """`speedups`: what the told heuristics of a residual policy rank growth by
        (`ExportMeta.speedups_in`; None: the state's curves)."""
        self.name = name
        self.meta = meta
        self.net = net.eval()
        self.featurizer = meta.featurizer(speedups)
        norm = meta.obs_norm
        self._norm = None if norm is None else (
            np.asarray(norm.mean, dtype=np.float32),
            np.sqrt(np.asarray(norm.var, dtype=np.float32) + norm.epsilon), norm.clip)

    def scores(self, obs: np.ndarray) -> np.ndarray:
        """Action scores for a batch (or one) of raw observations."""
        if self._norm is not None:
            mean, std, clip = self._norm
            obs = np.clip((obs - mean) / std, -clip, clip)
        with torch.no_grad():
            return self.net(torch.as_tensor(obs, dtype=torch.float32)).numpy()

    def choose(self, obs: np.ndarray, mask: np.ndarray | None) -> int:
        """Discrete action for one observation (masked argmax if the model uses masks)."""
        scores = self.scores(obs)
        if self.meta.masked and mask is not None:
            scores = np.where(mask, scores, -np.inf)
        return int(np.argmax(scores))

    def act(self, state: ClusterState) -> Action:
        """The policy's action in `state`."""
        obs = self.featurizer.observe(state)
        mask = self.featurizer.action_mask(state) if self.meta.masked else None
        return self.featurizer.decode(state, self.choose(obs, mask))


def save_deployed(directory: Path, meta: ExportMeta, state_dict: dict) -> None:
    """Write policy.pt and policy.json into `directory` (created if missing), each whole or
    not at all: training re-exports at every better evaluation, and a run killed while writing
    in place would leave a truncated policy that the next resume and the actuator cannot
    load. The profiles `meta` names must be in `directory` already
    (`rlalloc.agent.job_speeds.copy_profiles`; a training run copies them once, as it starts)."""
    directory.mkdir(parents=True, exist_ok=True)
    weights = io.BytesIO()
    torch.save(state_dict, weights)
    write_atomic(directory / WEIGHTS_FILE, weights.getvalue())
    write_atomic(directory / META_FILE, json.dumps(asdict(meta), indent=2) + "\n")


def _check_algo(raw: dict) -> None:
    """A ValueError unless ``algo`` and ``masked`` are what `export_model` writes: a PPO that
    takes the argmax over valid actions, or a DQN that takes it over valid actions or all
    (as it was trained, `rlalloc.agent.dqn`). Another algorithm or an unmasked PPO loaded and
    ran, choosing actions as its network was never trained to."""
    algo, masked = raw.get("algo"), raw.get("masked")
    if algo not in ("ppo", "dqn") or not isinstance(masked, bool) or (algo == "ppo"
                                                                       and not masked):
        raise ValueError(f"algo {algo!r} with masked {masked!r}: this rlalloc runs a masked "
                         "ppo or a dqn, masked or not")


def _residual_names(value: object) -> tuple[str, ...]:
    """``residual`` as the heuristics' names; a ValueError for anything but a list of built-in
    heuristic names (a damaged one was reported as an observation size mismatch)."""
    if not isinstance(value, list) or not all(name in HEURISTICS for name in value):
        raise ValueError(f"residual {value!r}: not a list of heuristic names "
                         f"({', '.join(HEURISTICS)})")
    return tuple(value)


def load_deployed(directory: Path, name: str | None = None) -> LearnedPolicy:
    """Load a saved model directory, with the profiles copied into it; a missing or foreign
    one, or a missing copy, is a `UserError`."""
    directory = Path(directory)
    meta_path = directory / META_FILE
    if not meta_path.is_file() or not (directory / WEIGHTS_FILE).is_file():
        raise UserError(f"{directory}: not a saved policy (needs {META_FILE} and {WEIGHTS_FILE};"
                        f" create one with `rlalloc train`)")
    try:
        raw = json.loads(meta_path.read_text())
        if not isinstance(raw, dict):
            raise TypeError(f"{META_FILE} holds a {type(raw).__name__}, not an object")
        if raw.get("format_version") not in READABLE_VERSIONS:
            raise UserError(f"{meta_path}: format_version {raw.get('format_version')!r}, this "
                            f"rlalloc reads {READABLE_VERSIONS}; train it again with this rlalloc")
        norm = raw.pop("obs_norm", None)
        raw["hidden_sizes"] = tuple(raw["hidden_sizes"])
        _check_algo(raw)
        raw["residual"] = _residual_names(raw.get("residual", []))
        raw["profiles"] = tuple(str(a) for a in raw.get("profiles", ()))
        if raw["profiles"] and raw.get("job_sizes") is None:
            raise ValueError("profiles without the job_sizes they go with")
        if raw.get("job_sizes") is not None:
            raw["job_sizes"] = tuple(raw["job_sizes"])
            JobSizeHistory.from_json(list(raw["job_sizes"]))  # damaged entries fail here
        meta = ExportMeta(**raw, obs_norm=None if norm is None else ObsNormalization(
            tuple(norm["mean"]), tuple(norm["var"]), norm["clip"], norm["epsilon"]))
        net = PolicyNet(meta.obs_size, meta.hidden_sizes, meta.num_actions, meta.activation)
        net.load_state_dict(torch.load(directory / WEIGHTS_FILE, weights_only=True))
        expected_obs_size = meta.expected_obs_size()  # a foreign feature_spec fails here
    except (ValueError, KeyError, TypeError, RuntimeError, pickle.UnpicklingError) as err:
        raise UserError(f"{directory}: damaged saved policy ({err.__class__.__name__}: "
                        f"{str(err).splitlines()[0][:120]}); restore it from a copy or train "
                        "it again (`rlalloc train`)") from err
    if meta.obs_size != expected_obs_size:
        raise UserError(f"{meta_path}: observation size {meta.obs_size} does not match this "
                        f"rlalloc's featurizer; retrain the model")
    return LearnedPolicy(name or directory.name, meta, net, meta.speedups_in(directory))
