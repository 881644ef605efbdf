"""Environments stepped by the actors of a Ray cluster behind SB3's `VecEnv` (`RayVecEnv`):
`rlalloc train --ray` collects its rollouts on the cluster while learning stays in the driver.

Each of the actors (one CPU each) holds a plain SB3 `DummyVecEnv` over a contiguous slice of
the environments, so auto-reset, ``terminal_observation``, ``TimeLimit.truncated``, reset
infos, seeds and options behave exactly as in one `DummyVecEnv` over all of them: with the
same seeds the observations, rewards, dones and infos are the same step by step, and so is
what a model learns from them. A vector step is one call per actor, all in flight together,
gathered with one ``ray.get``; it pays where a slice's simulator steps cost more than that
round trip (`rlalloc bench rollouts` measures both). The action masks that MaskablePPO (and
rlalloc's DQN) ask every environment for before each step travel with the step's answer, so
they cost no round trip of their own.

Actors run in the driver's working directory where they have it, torch on one thread
(`rlalloc.env.ray_cluster.prepare_worker`), as `rlalloc.env.ray_cluster.RayTasks`' tasks do.
Their answers travel pickled, as through `SubprocVecEnv`'s pipes: Ray would hand the arrays
in them over read-only (views on its object store), unlike SB3's own vector environments.
"""

from __future__ import annotations

import os
import pickle
from bisect import bisect_right
from collections.abc import Callable, Sequence
from copy import deepcopy
from typing import Any

import gymnasium as gym
import numpy as np
from sb3_contrib.common.maskable.utils import EXPECTED_METHOD_NAME as MASKS_METHOD
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv
from stable_baselines3.common.vec_env.base_vec_env import (
    VecEnvIndices,
    VecEnvObs,
    VecEnvStepReturn,
)

from rlalloc.env.ray_cluster import gathered, prepare_worker, ray_module

EnvFactory = Callable[[], gym.Env]
"""Builds one environment; picklable (a module-level function or a `functools.partial` of
one), since the actors build the environments where they run."""


class RayVecEnv(VecEnv):
    """SB3's `VecEnv` over `env_fns` stepped by Ray actors (see the module docstring):
    `n_workers` of them (default: one per CPU of the cluster), at most one per environment,
    each holding a contiguous slice of the environments, sizes differing by one at most.
    Joins no cluster itself: `rlalloc.env.ray_cluster.connect` first. `close` ends the
    actors."""

    def __init__(self, env_fns: Sequence[EnvFactory], n_workers: int | None = None) -> None:
        ray = ray_module()
        assert ray.is_initialized(), "connect() first"
        assert env_fns and (n_workers is None or n_workers >= 1), (len(env_fns), n_workers)
        self._ray = ray
        n_envs = len(env_fns)
        # an autoscaling cluster may have no worker's CPU yet: its first actor brings one up
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        n_workers = min(n_envs, n_workers or cpus)
        self._bounds = [worker * n_envs // n_workers for worker in range(n_workers + 1)]
        """Environments bounds[i] to bounds[i + 1] (excluded) are worker i's."""
        actor = ray.remote(num_cpus=1)(_EnvSlice)
        self._workers = [actor.remote(os.getcwd()) for _ in range(n_workers)]
        self._pending: list = []
        self._masks: list | None = None
        """Each environment's action mask as the last step or reset left it, sent with it;
        None where the environments have none or something since may have changed them."""
        spaces = self._gather([worker.start.remote(env_fns[start:stop])
                               for worker, start, stop in self._slices()])
        observation_space, action_space = spaces[0]
        assert isinstance(observation_space, gym.spaces.Box), observation_space
        super().__init__(n_envs, observation_space, action_space)

    @property
    def n_workers(self) -> int:
        """How many actors step the environments."""
        return len(self._workers)

    def reset(self) -> VecEnvObs:
        """Reset every environment, with the seeds and options set for this reset (`seed`,
        `set_options`) where set, each where it runs, as `SubprocVecEnv` does."""
        parts = self._gather([
            worker.reset.remote(self._seeds[start:stop], self._options[start:stop])
            for worker, start, stop in self._slices()])
        obs, reset_infos, masks = zip(*parts, strict=True)
        self.reset_infos = [info for part in reset_infos for info in part]
        self._masks = _joined(masks)
        self._reset_seeds()
        self._reset_options()
        return np.concatenate(obs)

    def step_async(self, actions: np.ndarray) -> None:
        """Send each actor its slice of `actions`."""
        self._masks = None
        self._pending = [worker.step.remote(actions[start:stop])
                         for worker, start, stop in self._slices()]

    def step_wait(self) -> VecEnvStepReturn:
        """The actors' steps, gathered in the environments' order."""
        parts = self._gather(self._pending)
        self._pending = []
        obs, rewards, dones, infos, reset_infos, masks = zip(*parts, strict=True)
        self.reset_infos = [info for part in reset_infos for info in part]
        self._masks = _joined(masks)
        return (np.concatenate(obs), np.concatenate(rewards), np.concatenate(dones),
                [info for part in infos for info in part])

    def close(self) -> None:
        """End the actors (a step still in flight is dropped)."""
        for worker in self._workers:
            self._ray.kill(worker)
        self._workers = []
        self._pending = []
        self._masks = None

    def has_attr(self, attr_name: str) -> bool:
        """Whether every environment has `attr_name`, looked up where it runs (a method such
        as MaskablePPO's ``action_masks`` is not sent back)."""
        return all(self._gather([worker.call.remote("has_attr", (attr_name,), {})
                                 for worker in self._workers]))

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """See `VecEnv.get_attr`."""
        return self._on_envs(indices, "get_attr", attr_name)

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """See `VecEnv.set_attr`."""
        self._masks = None
        self._on_envs(indices, "set_attr", attr_name, value)

    def env_method(self, method_name: str, *method_args: Any, indices: VecEnvIndices = None,
                   **method_kwargs: Any) -> list[Any]:
        """See `VecEnv.env_method`; the action masks without a round trip where the last step
        or reset brought them and nothing has been called since that may change them."""
        brought = self._masks is not None and not (method_args or method_kwargs)
        if method_name == MASKS_METHOD and brought:
            return deepcopy([self._masks[index] for index in self._get_indices(indices)])
        self._masks = None
        return self._on_envs(indices, "env_method", method_name, *method_args, **method_kwargs)

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper],
                       indices: VecEnvIndices = None) -> list[bool]:
        """See `VecEnv.env_is_wrapped`."""
        return self._on_envs(indices, "env_is_wrapped", wrapper_class)

    def _slices(self) -> list[tuple[Any, int, int]]:
        """(actor, first environment, end) of each worker."""
        return [(worker, self._bounds[i], self._bounds[i + 1])
                for i, worker in enumerate(self._workers)]

    def _on_envs(self, indices: VecEnvIndices, method: str, *args: Any, **kwargs: Any) -> list:
        """`DummyVecEnv`'s `method` on the environments of `indices`: one call per actor
        holding some, in parallel, with their indices in its slice; each environment's
        answer in the order of `indices` (None for a method that answers nothing)."""
        wanted = list(self._get_indices(indices))
        groups: dict[int, list[int]] = {}
        for index in wanted:
            groups.setdefault(bisect_right(self._bounds, index) - 1, []).append(index)
        answers = self._gather([
            self._workers[worker].call.remote(method, args, {
                **kwargs, "indices": [index - self._bounds[worker] for index in group]})
            for worker, group in groups.items()])
        by_index: dict[int, Any] = {}
        for group, answer in zip(groups.values(), answers, strict=True):
            by_index.update(zip(group, answer or [None] * len(group), strict=True))
        return [by_index[index] for index in wanted]

    def _gather(self, refs: list) -> list:
        """The actors' answers to `refs`, unpickled, in order (`gathered`: the `UserError` an
        environment raised stays one line, a workload the worker cannot read; a lost actor is
        one too)."""
        answers = gathered(refs, "a Ray worker stepping the environments was lost")
        return [pickle.loads(answer) for answer in answers]


def _joined(masks: tuple[list | None, ...]) -> list | None:
    """The actors' masks as one list, None where they sent none."""
    return None if masks[0] is None else [mask for part in masks for mask in part]


class _EnvSlice:
    """The Ray actor: a `DummyVecEnv` over a slice of the environments. Built in `start`,
    not the constructor, so that an error building them reaches the driver as what it was
    (an actor whose constructor raised reports only that it died)."""

    def __init__(self, directory: str) -> None:
        prepare_worker(directory)
        self._venv: DummyVecEnv | None = None
        self._masked = False

    def start(self, env_fns: list[EnvFactory]) -> bytes:
        """Build the slice's environments; their observation and action spaces."""
        self._venv = DummyVecEnv(env_fns)
        self._masked = self._venv.has_attr(MASKS_METHOD)
        return pickle.dumps((self._venv.observation_space, self._venv.action_space))

    def reset(self, seeds: list[int | None], options: list[dict]) -> bytes:
        """`DummyVecEnv.reset` with each environment's seed and options (where `VecEnv` keeps
        those of its next reset); the observations, reset infos and masks."""
        self._venv._seeds, self._venv._options = seeds, options
        obs = self._venv.reset()
        return pickle.dumps((obs, self._venv.reset_infos, self._masks()))

    def step(self, actions: np.ndarray) -> bytes:
        """`DummyVecEnv.step`, the reset infos (of the episodes it started, and before) and
        the masks."""
        obs, rewards, dones, infos = self._venv.step(actions)
        return pickle.dumps((obs, rewards, dones, infos, self._venv.reset_infos, self._masks()))

    def _masks(self) -> list | None:
        """Each environment's action mask now, None where they have none."""
        return self._venv.env_method(MASKS_METHOD) if self._masked else None

    def call(self, method: str, args: tuple, kwargs: dict) -> bytes:
        """`DummyVecEnv`'s `method` (get_attr, set_attr, env_method, env_is_wrapped, has_attr)."""
        return pickle.dumps(getattr(self._venv, method)(*args, **kwargs))
