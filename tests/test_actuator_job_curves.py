"""A job's curve per GPU type travels as a PyTorchJob annotation; what is missing takes the
simulator's documented fallback, what is malformed is refused."""

from __future__ import annotations

import numpy as np
import pytest

from rlalloc.actuator.job_curves import (
    format_type_speeds,
    parse_type_speeds,
    type_speeds_table,
)
from rlalloc.env.gpu_types import RELATIVE_SPEED
from rlalloc.env.state import JobInfo, Jobs, JobStatus, TypeSpeeds


def _jobs() -> Jobs:
    return Jobs.from_records([
        JobInfo("a", JobStatus.QUEUED, 0.0, 2, 1, 4, speed_1gpu=2.0, scaling_alpha=0.1,
                scaling_beta=0.2),
        JobInfo("b", JobStatus.QUEUED, 1.0, 1, 1, 1, speed_1gpu=1.0, scaling_alpha=0.0,
                scaling_beta=0.0)])


def test_the_annotation_round_trips_the_table():
    table = TypeSpeeds(("T4", "A100"), np.array([[1.0, 4.5], [2.0, 3.0]], dtype=np.float32),
                       np.array([[0.1, 0.2], [0.0, 0.05]], dtype=np.float32),
                       np.array([[0.3, 0.1], [0.2, 0.0]], dtype=np.float32))
    curves = [parse_type_speeds(format_type_speeds(table, row))[0] for row in range(2)]
    again = type_speeds_table(_jobs(), curves, table.gpu_types)
    for column in ("speed_1gpu", "scaling_alpha", "scaling_beta"):
        np.testing.assert_array_equal(getattr(again, column), getattr(table, column))


def test_a_type_without_a_curve_takes_the_relative_speed_fallback():
    jobs = _jobs()
    table = type_speeds_table(jobs, [{"A100": (9.0, 0.01, 0.02)}, {}], ("A100", "T4"))
    assert table.speed_1gpu[0].tolist() == pytest.approx([9.0, 2.0])  # annotated; reference
    # job b says nothing: its curve is the reference (T4) one, faster on A100 by the factor
    assert table.speed_1gpu[1].tolist() == pytest.approx([RELATIVE_SPEED["A100"], 1.0])
    assert table.scaling_alpha[1].tolist() == [0.0, 0.0]


@pytest.mark.parametrize("text", ["not json", "[1, 2]", '{"A100": [1, 2]}',
                                  '{"A100": [0, 0.1, 0.1]}', '{"A100": [1, -0.1, 0.1]}',
                                  '{"A100": ["fast", 0.1, 0.1]}', '{"A100": [1, NaN, 0.1]}'])
def test_a_malformed_annotation_is_one_line_naming_the_fix(text):
    curves, problem = parse_type_speeds(text)
    assert curves == {} and "rlalloc.io/type-speeds" in problem and "\n" not in problem


def test_no_annotation_is_no_curves_and_no_problem():
    assert parse_type_speeds(None) == ({}, "")


def test_the_state_builder_reads_the_annotation_and_leaves_a_malformed_one_alone():
    from rlalloc.actuator.config import ActuatorConfig
    from rlalloc.actuator.job_curves import TYPE_SPEEDS_ANNOTATION
    from rlalloc.actuator.state_builder import Ledger, Observation, build_state
    from rlalloc.actuator.twin.render import cluster_objects, query_results
    from rlalloc.env.state import ClusterState, Demand, NodeInfo, Nodes

    jobs = _jobs()
    table = TypeSpeeds(("T4", "A100"), np.array([[2.0, 7.0], [1.0, 2.5]], dtype=np.float32),
                       np.zeros((2, 2), dtype=np.float32), np.zeros((2, 2), dtype=np.float32))
    state = ClusterState(time_s=1000.0, jobs=jobs, demand=Demand(pending_gpus=3),
                         nodes=Nodes.from_records([NodeInfo("node-0", 4, 4, gpu_type="T4"),
                                                   NodeInfo("node-1", 4, 4, gpu_type="A100")]),
                         type_speeds=table)
    names = {job_id: job_id for job_id in jobs.job_id}

    def observe(edit: dict[str, str]) -> Observation:
        nodes, pods, objects = cluster_objects(state, "default", names)
        for obj in objects:
            if obj["metadata"]["name"] in edit:
                obj["metadata"]["annotations"][TYPE_SPEEDS_ANNOTATION] = edit[
                    obj["metadata"]["name"]]
        return Observation(1000.0, nodes, pods, objects,
                           query_results(state, "default", names, 1000.0))

    built = build_state(observe({}), ActuatorConfig(), Ledger())
    assert not built.unmanageable
    np.testing.assert_array_equal(built.state.type_speeds.speed_1gpu, table.speed_1gpu)
    broken = build_state(observe({"b": "{oops"}), ActuatorConfig(), Ledger())
    assert broken.state.jobs.job_id == ("default/a",)
    assert "rlalloc.io/type-speeds" in broken.unmanageable["default/b"]
    assert broken.state.type_speeds.speed_1gpu.shape == (1, 2)


def test_a_job_hidden_from_the_policy_takes_its_row_of_curves_along():
    """The guardrails show the policy a state without the jobs refused this cycle: the curves
    per type must stay those of the jobs shown, row for row."""
    from rlalloc.actuator.config import ActuatorConfig
    from rlalloc.actuator.guardrails import policy_view
    from rlalloc.env.state import ClusterState, Demand, NodeInfo, Nodes

    table = TypeSpeeds(("T4", "A100"), np.array([[2.0, 7.0], [1.0, 2.5]], dtype=np.float32),
                       np.zeros((2, 2), dtype=np.float32), np.zeros((2, 2), dtype=np.float32))
    state = ClusterState(time_s=0.0, jobs=_jobs(), demand=Demand(pending_gpus=3),
                         nodes=Nodes.from_records([NodeInfo("n0", 4, 4, gpu_type="T4"),
                                                   NodeInfo("n1", 4, 4, gpu_type="A100")]),
                         type_speeds=table)
    view = policy_view(state, ActuatorConfig(), frozenset(), frozenset({"a"}))
    assert view.jobs.job_id == ("b",)
    assert view.type_speeds.speed_1gpu.tolist() == [[1.0, 2.5]]
