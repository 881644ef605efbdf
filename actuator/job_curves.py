"""A job's scaling curve on each GPU type, as a PyTorchJob annotation, and the `TypeSpeeds`
table the actuator builds from it on a cluster that mixes types.

A job's curve annotations (`rlalloc.io/speed-1gpu`, `scaling-alpha`, `scaling-beta`) describe
it on the cluster's reference type, its slowest (`rlalloc.env.gpu_types.reference_type`), as
`ClusterState.jobs` does. `rlalloc.io/type-speeds` adds the curve on other types, as JSON::

    {"A100": [3.2, 0.05, 0.1], "RTX2080Ti": [1.7, 0.06, 0.1]}

(iterations per second on one GPU of the type, alpha, beta; `rlalloc simulate`'s profiles give
them, and the digital twin writes them). A type the annotation does not list takes the
documented fallback the simulator uses for a job without a profile: the reference curve, faster
by the ratio of the two types' `RELATIVE_SPEED`. A malformed annotation leaves the job alone
with one line naming the problem (`build_state`'s unmanageable jobs), never a guess.
"""

from __future__ import annotations

import json
import math

import numpy as np

from rlalloc.env.gpu_types import speed_over_reference
from rlalloc.env.state import Jobs, TypeSpeeds

TYPE_SPEEDS_ANNOTATION = "rlalloc.io/type-speeds"
"""The job's curve per GPU type: JSON ``{type: [speed_1gpu, alpha, beta]}`` (optional)."""

Curve = tuple[float, float, float]


def format_type_speeds(table: TypeSpeeds, row: int) -> str:
    """The annotation value for job `row` of a state's `table`."""
    return json.dumps({gpu_type: [float(table.speed_1gpu[row, col]),
                                  float(table.scaling_alpha[row, col]),
                                  float(table.scaling_beta[row, col])]
                       for col, gpu_type in enumerate(table.gpu_types)}, sort_keys=True)


def parse_type_speeds(text: str | None) -> tuple[dict[str, Curve], str]:
    """(curve per type, "") from an annotation value (None: no annotation, no curves), or
    ({}, the problem) when it is not JSON ``{type: [speed > 0, alpha >= 0, beta >= 0]}``."""
    if text is None:
        return {}, ""
    problem = (f"annotation {TYPE_SPEEDS_ANNOTATION} must be JSON {{\"TYPE\": [speed_1gpu, "
               "alpha, beta], ...}} with speed > 0 and alpha, beta >= 0; fix or remove it")
    try:
        parsed = json.loads(text)
    except ValueError:
        return {}, problem
    if not isinstance(parsed, dict):
        return {}, problem
    curves: dict[str, Curve] = {}
    for gpu_type, values in parsed.items():
        if (not isinstance(values, list) or len(values) != 3
                or not all(isinstance(v, int | float) and math.isfinite(v) for v in values)
                or values[0] <= 0 or values[1] < 0 or values[2] < 0):
            return {}, problem
        curves[str(gpu_type)] = (float(values[0]), float(values[1]), float(values[2]))
    return curves, ""


def type_speeds_table(jobs: Jobs, curves: list[dict[str, Curve]],
                      gpu_types: tuple[str, ...]) -> TypeSpeeds:
    """The state's table on a cluster of `gpu_types`: each job's annotated curve per type
    (`curves`, in `jobs` order), else the module's fallback from its reference curve."""
    factor = {gpu_type: speed_over_reference(gpu_type, gpu_types) for gpu_type in gpu_types}
    table = np.empty((jobs.count, len(gpu_types), 3), dtype=np.float32)
    for row, annotated in enumerate(curves):
        own = (float(jobs.speed_1gpu[row]), float(jobs.scaling_alpha[row]),
               float(jobs.scaling_beta[row]))
        for col, gpu_type in enumerate(gpu_types):
            table[row, col] = annotated.get(gpu_type, (own[0] * factor[gpu_type], *own[1:]))
    return TypeSpeeds(gpu_types, table[:, :, 0], table[:, :, 1], table[:, :, 2])
