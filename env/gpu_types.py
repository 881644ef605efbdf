"""GPU types as the speed model sees them: which measured profile stands for each, and how fast
each is where an application has no profile on it.

A job's speed on a type is its application's profile measured on that type (Sia's profiles,
SOSP'23: ``placements-<suffix>.csv`` beside the Pollux T4 files in ``app_profiles``). Where an
application has no profile on a type (gpt_pmp on T4; every application on H100), and for jobs
without an application, the documented fallback is a **relative speed**: the type's
`RELATIVE_SPEED` over that of a type the job does have a speed on. The factors of the profiled
types are the median, over the applications profiled on both, of the single-GPU throughput
ratio to T4 at the largest measured local batch (`rlalloc.env.profiles.fit_relative_speeds`
refits them; a test checks they match). H100 has no profile: its factor is A100's times the
ratio of their dense BF16 tensor throughputs on NVIDIA's datasheets (989 / 312 TFLOPS), an
upper estimate of what training gains.

A job without an application has a speed only in the trace's own unit (GPU-seconds). Its work
is taken as measured on the cluster's slowest type (`reference_type`), so on a cluster of one
type nothing changes, and on a mixed one a faster type runs it `RELATIVE_SPEED` times faster.
"""

from __future__ import annotations

from collections.abc import Iterable

PROFILE_SUFFIX: dict[str, str] = {
    "T4": "",
    "RTX2080Ti": "-rtx",
    "RTX6000": "-quad",
    "V100": "-azure",
    "A100": "-dgx-ext",
}
"""Profile file suffix (``placements<suffix>.csv``) measured on each type: the Sia artifact's
cluster names (aws = T4 = the Pollux files, rtx, quad, azure, dgx-ext = A100 with more batch
sizes than ``dgx``). A type not listed has no profiles."""

RELATIVE_SPEED: dict[str, float] = {
    "T4": 1.0,
    "RTX2080Ti": 1.84,
    "RTX6000": 2.17,
    "V100": 2.84,
    "A100": 3.84,
    "H100": 3.84 * 989.0 / 312.0,
}
"""Single-GPU speed relative to T4 (module docstring): the fallback where no profile exists."""


def relative_speed(gpu_type: str) -> float:
    """`RELATIVE_SPEED` of `gpu_type` (every type a cluster spec accepts has one)."""
    return RELATIVE_SPEED[gpu_type]


def reference_type(gpu_types: Iterable[str]) -> str:
    """The slowest of `gpu_types` (first listed among equals): the type whose curve `Jobs`
    carries on a mixed cluster, and in whose time a job without an application is measured."""
    types = list(dict.fromkeys(gpu_types))
    return min(types, key=lambda t: (RELATIVE_SPEED[t], types.index(t)))


def speed_over_reference(gpu_type: str, gpu_types: Iterable[str]) -> float:
    """How much faster `gpu_type` runs a job known only in the reference type's time (the
    slowest of the cluster's `gpu_types`): the ratio of their `RELATIVE_SPEED`s; 1 on it."""
    return RELATIVE_SPEED[gpu_type] / RELATIVE_SPEED[reference_type(gpu_types)]


def fastest_first(gpu_types: Iterable[str]) -> list[str]:
    """`gpu_types` (duplicates dropped) from the fastest to the slowest by `RELATIVE_SPEED`:
    the order a type-unaware operator tries them in."""
    types = list(dict.fromkeys(gpu_types))
    return sorted(types, key=lambda t: (-RELATIVE_SPEED[t], types.index(t)))


__all__ = [
    "PROFILE_SUFFIX",
    "RELATIVE_SPEED",
    "fastest_first",
    "reference_type",
    "relative_speed",
    "speed_over_reference",
]
