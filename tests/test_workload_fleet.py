"""The LLM-fleet workload generator (`rlalloc.env.workload.fleet`, source ``synthetic-fleet``)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from scipy.special import ndtr

from rlalloc.env.cluster import parse_cluster
from rlalloc.env.errors import UserError
from rlalloc.env.profiles import GenericScaling, packed_shape
from rlalloc.env.workload.fleet import (
    ACME_LONGEST_RUN_S,
    DEFAULT_CLASSES,
    EVAL,
    LLM_SCALING,
    FleetConfig,
    FleetJobClass,
    generate_fleet,
    worker_slots,
)
from rlalloc.env.workload.loader import generator_of, load_workload
from rlalloc.env.workload.spec import Workload
from rlalloc.env.workload.synthetic import lognormal_sigma

FLEET_CLUSTER = parse_cluster("128x8:H100")
SMALL_CLUSTER = parse_cluster("16x8:H100")


def run_times(jobs, gpus_per_node: int = 8) -> np.ndarray:
    """Each job's run time on its request packed on nodes (its work at that speed, on the
    curve the job carries)."""
    return np.array([j.work / GenericScaling(*j.scaling).iterations_per_s(
        packed_shape(j.requested_gpus, gpus_per_node)) for j in jobs])


def kind_of(job) -> str:
    return job.job_id.rsplit("-", 1)[0]


def rejected(source: str, cluster=FLEET_CLUSTER) -> str:
    with pytest.raises(UserError) as info:
        load_workload(source, cluster)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_fleet_is_deterministic_by_seed():
    first = load_workload("synthetic-fleet:300:0.8", FLEET_CLUSTER, seed=3)
    again = load_workload("synthetic-fleet:300:0.8", FLEET_CLUSTER, seed=3)
    other = load_workload("synthetic-fleet:300:0.8", FLEET_CLUSTER, seed=4)
    assert first == again and first != other
    assert len(first.jobs) == 300
    assert first.name == "synthetic-fleet-300-load0.8-seed3"


def test_a_bare_source_takes_the_config_defaults():
    jobs = load_workload("synthetic-fleet", FLEET_CLUSTER).jobs
    assert len(jobs) == FleetConfig.num_jobs
    assert run_times(jobs).max() <= ACME_LONGEST_RUN_S * (1 + 1e-9)  # the default cap
    assert generator_of("synthetic-fleet") == "synthetic-fleet"
    assert generator_of("synthetic-fleet:10") == "synthetic-fleet"
    assert generator_of("synthetic:10") == "synthetic"
    assert generator_of("synthetic-fleet.csv") is None


@pytest.mark.parametrize("cluster", ["128x8:H100", "16x8:H100", "2x8", "4x16", "3x8+4x4"])
def test_every_job_is_whole_workers_that_fit_the_cluster(cluster):
    spec = parse_cluster(cluster)
    jobs = generate_fleet(FleetConfig(num_jobs=3000, seed=1), spec).jobs
    for job in jobs:
        k = job.gpus_per_worker
        assert k == (8 if job.requested_gpus >= 8 else job.requested_gpus)
        assert job.requested_gpus % k == 0
        workers = job.requested_gpus // k
        assert 1 <= job.min_workers <= workers <= job.max_workers <= worker_slots(spec, k)
        assert job.requested_gpus <= spec.total_gpus
    assert any(j.gpus_per_worker == 1 for j in jobs)  # the single-GPU evaluations


def test_sizes_beyond_the_cluster_are_dropped_and_the_rest_renormalised():
    jobs = generate_fleet(FleetConfig(num_jobs=5000, seed=2), SMALL_CLUSTER).jobs
    pretrain = np.array([j.requested_gpus for j in jobs if kind_of(j) == "pretrain"])
    assert pretrain.max() == 128
    kept = {g: w for g, w in DEFAULT_CLASSES[0].gpu_mix if g <= 128}
    share_8 = kept[8] / sum(kept.values())
    sd = math.sqrt(share_8 * (1 - share_8) / len(pretrain))
    assert np.mean(pretrain == 8) == pytest.approx(share_8, abs=4 * sd)


def test_the_mix_matches_the_configured_figures():
    """Class shares, sizes within a class and each class's log-normal run time, within four
    standard errors of a 40,000-job sample."""
    config = FleetConfig(num_jobs=40_000, seed=5, max_duration_s=None)
    jobs = generate_fleet(config, FLEET_CLUSTER).jobs
    kinds = np.array([kind_of(j) for j in jobs])
    gpus = np.array([j.requested_gpus for j in jobs])
    duration_s = run_times(jobs)
    total_share = sum(c.share for c in config.classes)
    for job_class in config.classes:
        mine = kinds == job_class.name
        share = job_class.share / total_share
        assert mine.mean() == pytest.approx(share, abs=4 * math.sqrt(share * (1 - share) / 40_000))
        weights = sum(w for _, w in job_class.gpu_mix)
        for size, weight in job_class.gpu_mix:
            p = weight / weights
            sd = math.sqrt(p * (1 - p) / mine.sum())
            assert np.mean(gpus[mine] == size) == pytest.approx(p, abs=4 * sd)
        logs = np.log(duration_s[mine])
        sigma = lognormal_sigma(job_class.median_duration_s, job_class.mean_duration_s)
        assert logs.mean() == pytest.approx(math.log(job_class.median_duration_s),
                                            abs=4 * sigma / math.sqrt(mine.sum()))
        assert logs.std() == pytest.approx(sigma, rel=0.05)


def test_pretraining_takes_most_gpu_time_and_evaluation_most_jobs():
    """The two published qualitative facts the default figures are chosen to reproduce."""
    jobs = generate_fleet(FleetConfig(num_jobs=20_000, seed=6), FLEET_CLUSTER).jobs
    gpu_s = np.array([j.requested_gpus for j in jobs]) * run_times(jobs)
    kinds = np.array([kind_of(j) for j in jobs])
    assert gpu_s[kinds == "pretrain"].sum() / gpu_s.sum() > 0.8
    assert np.mean(kinds == "eval") > 0.7


@pytest.mark.parametrize("load", [0.5, 0.8, 2.0])
def test_offered_load_over_the_arrival_span_is_the_configured_load(load):
    jobs = load_workload(f"synthetic-fleet:4000:{load}", FLEET_CLUSTER, seed=7).jobs
    offered = np.array([j.requested_gpus for j in jobs]) @ run_times(jobs)
    span_s = jobs[-1].submit_s - jobs[0].submit_s
    assert offered / (FLEET_CLUSTER.total_gpus * span_s) == pytest.approx(load, rel=0.02)


def test_max_hours_truncates_the_run_time_distribution():
    """Every run time is under the cap, and the share below a point is the truncated
    log-normal's, even with a cap far below the pre-training median (no redraw loop)."""
    jobs = load_workload("synthetic-fleet:20000:0.8:24", FLEET_CLUSTER, seed=8).jobs
    duration_s = run_times(jobs)
    assert duration_s.max() <= 24 * 3600.0 * (1 + 1e-9)
    pretrain = duration_s[np.array([kind_of(j) == "pretrain" for j in jobs])]
    mu = math.log(1.5 * 86_400.0)
    sigma = lognormal_sigma(1.5 * 86_400.0, 2.5 * 86_400.0)
    below_12h = ndtr((math.log(12 * 3600.0) - mu) / sigma) / ndtr((math.log(24 * 3600.0) - mu)
                                                                  / sigma)
    sd = math.sqrt(below_12h * (1 - below_12h) / len(pretrain))
    assert np.mean(pretrain <= 12 * 3600.0) == pytest.approx(below_12h, abs=4 * sd)
    tiny = load_workload("synthetic-fleet:2000:0.8:0.1", FLEET_CLUSTER, seed=8).jobs
    assert run_times(tiny).max() <= 360.0 * (1 + 1e-9)


def test_bad_fleet_sources_are_one_line():
    assert "synthetic-fleet[:NUM_JOBS[:LOAD[:MAX_HOURS]]]" in rejected("synthetic-fleet:many")
    assert "too many fields" in rejected("synthetic-fleet:1:1:1:1")


@pytest.mark.parametrize(("source", "problem"), [
    ("synthetic-fleet:0", "synthetic-fleet workload: NUM_JOBS must be 1..100,000, not 0"),
    ("synthetic-fleet:10:inf", "synthetic-fleet workload: LOAD (offered load) must be in "
                               "[0.01, 100], not inf"),
    ("synthetic-fleet:10:1:0", "synthetic-fleet workload: MAX_HOURS (the run-time cap) must be "
                               "in [0.1, 8760] hours, not 0"),
    ("synthetic-fleet:10:1:nan", "synthetic-fleet workload: MAX_HOURS (the run-time cap) must "
                                 "be in [0.1, 8760] hours, not nan"),
])
def test_fleet_fields_are_checked_against_their_ranges(source, problem):
    assert rejected(source) == problem


def test_a_cluster_without_8_gpu_nodes_is_refused():
    assert "the largest node of the cluster has 4 GPUs; simulate nodes of 8 GPUs" in rejected(
        "synthetic-fleet:10", parse_cluster("16x4"))


@pytest.mark.parametrize(("fields", "problem"), [
    ({"classes": (replace(EVAL, gpu_mix=((12, 1.0),)),)},
     "job class 'eval' asks 12 GPUs, not whole 8-GPU workers"),
    ({"classes": ()}, "needs at least one job class"),
    ({"min_worker_share": 0.0}, "need 0 < min_worker_share <= 1 and max_worker_factor >= 1"),
])
def test_fleet_rejects_bad_config(fields, problem):
    with pytest.raises(UserError) as info:
        FleetConfig(**fields)
    assert str(info.value) == f"synthetic-fleet workload: {problem}"


def test_a_job_class_checks_its_own_figures():
    with pytest.raises(UserError, match="job class 'x': need mean_duration_s > median"):
        FleetJobClass("x", 1.0, ((8, 1.0),), 100.0, 100.0, 60.0)
    with pytest.raises(UserError, match="job class 'x': share must be > 0"):
        FleetJobClass("x", 0.0, ((8, 1.0),), 100.0, 200.0, 60.0)


@pytest.mark.parametrize("policy", ["static", "elastic"])
def test_a_small_fleet_runs_to_completion(policy):
    """40 jobs on 16x8:H100 run to the end; every state conserves GPUs counted k per worker,
    and static starts each job on the workers it asked for."""
    from rlalloc.agent.registry import load_policy
    from rlalloc.env.failures import FailureParams
    from rlalloc.env.params import SimParams
    from rlalloc.env.scenario import build_scenario
    from rlalloc.env.state import ActionKind

    scenario = build_scenario("synthetic-fleet:40:0.8:12", SMALL_CLUSTER, seed=0)
    sim = scenario.simulator(SimParams(failures=FailureParams(failures_per_gpu_day=0.0)))
    act = load_policy(policy).act
    first_workers: dict[str, int] = {}
    while not sim.done:
        assert sim.time_s < 30 * 86_400.0, "stuck"
        for _ in range(sim.params.max_actions_per_decision):
            action = act(sim.state())
            if action.kind == ActionKind.NOOP or not sim.apply(action):
                break
            first_workers.setdefault(action.job_id, action.workers)
        state = sim.state()
        used = np.zeros(state.nodes.count, dtype=np.int64)
        for row, placement in enumerate(state.jobs.placement):
            for node in placement:
                used[node] += state.jobs.gpus_per_worker[row]
        assert (used + state.nodes.gpus_free == state.nodes.gpus_total).all()
        sim.advance()
    assert sim.accounting.summary()["jobs_completed"] == 40
    if policy == "static":
        requested = {j.job_id: j.requested_gpus // j.gpus_per_worker
                     for j in scenario.workload.jobs}
        assert first_workers == requested


def test_fleet_jobs_run_on_the_llm_curve_in_the_simulator():
    """The scenario hands each fleet job its near-linear curve: 16 GPUs on two nodes run at
    the curve's rate, almost twice one node's, where the Pollux-fitted curve is far below."""
    from rlalloc.env.scenario import job_speeds

    jobs = load_workload("synthetic-fleet:50", FLEET_CLUSTER).jobs
    assert {j.scaling for j in jobs} == {(LLM_SCALING.alpha, LLM_SCALING.beta)}
    speed = job_speeds(Workload("w", jobs), None)[0]
    assert speed.iterations_per_s((8, 8)) == LLM_SCALING.iterations_per_s((8, 8))
    assert speed.iterations_per_s((8, 8)) > 1.99 * speed.iterations_per_s((8,))
    assert (speed.scaling_alpha, speed.scaling_beta) == (LLM_SCALING.alpha, LLM_SCALING.beta)
