"""`rlalloc bench actuator`: time one decision cycle on a large cluster, network excluded.

A cycle here is what the actuator computes between its API calls: building the `ClusterState`
from the listed objects and query results (as decoded JSON), asking the policy and passing its
answers through the guardrails. The input is a synthetic 500-node (8 GPUs each), 1,000-job
cluster rendered by the twin's renderer into the very objects and query results a cluster in
that state would return (with the look-ahead signals of the default config: the risk model on
the telemetry now and `risk_lag_s` earlier, the demand forecast on a flat history), so nothing
but the actuator's own work is timed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from rlalloc.actuator.config import ActuatorConfig
from rlalloc.actuator.guardrails import DecisionHistory, Policy, decide
from rlalloc.actuator.state_builder import Ledger, Observation, build_state
from rlalloc.actuator.twin.render import cluster_objects, k8s_name, query_results, telemetry_results
from rlalloc.agent.registry import load_policy
from rlalloc.agent.type_plans import RoundPlanner, round_solve_s
from rlalloc.cli.argtypes import POSITIVE_INT, SEED, add_json_out_flags, within
from rlalloc.env.cluster import gpu_type_named
from rlalloc.env.failures import NODE_FEATURE_NAMES
from rlalloc.env.gpu_types import speed_over_reference
from rlalloc.env.output import prepare_out_file, write_json_out
from rlalloc.env.state import (
    ClusterState,
    Demand,
    JobInfo,
    Jobs,
    JobStatus,
    NodeInfo,
    Nodes,
    TypeSpeeds,
)
from rlalloc.forecaster.signals import load_signals

_CLOCK_S = 1_767_225_600.0 + 8 * 3600.0
"""The cluster's wall clock, 2026-01-01 08:00 UTC in Unix seconds, as the actuator reads it:
a policy that rebuilds a simulator from the state (`rlalloc.agent.planner`) pays for a clock far
from 0 if it mishandles one."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `rlalloc bench actuator`."""
    # bounded: 10^7 nodes took minutes and GBs before the first line, with no way to tell
    parser.add_argument("--nodes", type=within(1, 100_000, int), default=500,
                        help="nodes (8 GPUs each), at most 100,000 (default: %(default)s)")
    parser.add_argument("--jobs", type=within(0, 1_000_000, int), default=1000,
                        help="jobs in the system, at most 1,000,000 (default: %(default)s)")
    parser.add_argument("--policy", default="elastic",
                        help="a policy name or a saved policy directory, as `evaluate --policies` "
                             "takes (default: %(default)s)")
    parser.add_argument("--repeats", type=POSITIVE_INT, default=5,
                        help="cycles timed (median reported) (default: %(default)s)")
    parser.add_argument("--seed", type=SEED, default=0,
                        help="seed of the synthetic cluster (default: %(default)s)")
    parser.add_argument("--gpu-types", type=gpu_type_list, default=(),
                        help="GPU types of the nodes, comma-separated (e.g. T4,RTX2080Ti,A100): "
                             "consecutive equal blocks of nodes, and each job a speed per type; "
                             "a round-based policy (gavel, sia) also reports its solve time per "
                             "round (default: one type, T4)")
    add_json_out_flags(parser)


def run(args: argparse.Namespace) -> int:
    """Time the cycle and print (and optionally save) the figures."""
    prepare_out_file(args.out, args.force)
    result = measure(load_policy(args.policy), args.nodes, args.jobs, args.repeats, args.seed,
                     args.gpu_types)
    result["policy"] = args.policy
    print(json.dumps(result, indent=2))
    write_json_out(args.out, result)
    return 0


def gpu_type_list(text: str) -> tuple[str, ...]:
    """`--gpu-types`: known type names, comma-separated, each once (one-line error else)."""
    types = tuple(gpu_type_named(name, "--gpu-types") for name in text.split(","))
    if len(set(types)) != len(types):
        raise argparse.ArgumentTypeError(f"{text!r} names a type twice; name each once")
    return types


def synthetic_state(n_nodes: int, n_jobs: int, seed: int,
                    gpu_types: tuple[str, ...] = ()) -> ClusterState:
    """A busy cluster: ~70% of the jobs placed (packed, 1-8 workers), the rest queued, and a
    few nodes warning (XID errors). With several `gpu_types`, the nodes are consecutive equal
    blocks of them and each job's speed on a type is the type's `speed_over_reference` (over the
    slowest type's), times a job's own factor from 0.5 to 2 (jobs gain unequally)."""
    rng = np.random.default_rng(seed)
    node_types = [gpu_types[i * len(gpu_types) // n_nodes] if gpu_types else "T4"
                  for i in range(n_nodes)]
    free = np.full(n_nodes, 8, dtype=np.int64)
    jobs = []
    for j in range(n_jobs):
        requested = int(rng.choice([1, 2, 4, 8], p=[0.5, 0.2, 0.2, 0.1]))
        placement: tuple[int, ...] = ()
        if rng.random() < 0.7:
            fits = np.flatnonzero(free >= requested)
            if len(fits):
                node = int(fits[0])
                free[node] -= requested
                placement = (node,) * requested
        status = JobStatus.RUNNING if placement else JobStatus.QUEUED
        jobs.append(JobInfo(
            job_id=f"job-{j:05d}", status=status, submit_s=_CLOCK_S - n_jobs + j,
            requested_gpus=requested,
            min_workers=1, max_workers=max(requested * 2, 2), workers=len(placement),
            placement=placement, throughput=float(len(placement)), progress=float(rng.random()),
            since_checkpoint_s=float(rng.uniform(0, 1800))))
    warned = set(rng.choice(n_nodes, size=max(n_nodes // 100, 1), replace=False).tolist())
    nodes = [NodeInfo(f"node-{i:04d}", 8, int(free[i]), gpu_type=node_types[i], rack=i // 8,
                      xid_errors_5m=2 if i in warned else 0, gpu_util=1.0 - free[i] / 8)
             for i in range(n_nodes)]
    queued = sum(j.requested_gpus for j in jobs if not j.placement)
    node_records = Nodes.from_records(nodes)
    return ClusterState(time_s=_CLOCK_S + 3600.0, nodes=node_records,
                        jobs=Jobs.from_records(jobs), demand=Demand(pending_gpus=queued),
                        time_of_day_s=(_CLOCK_S + 3600.0) % 86_400.0,
                        type_speeds=_type_speeds(node_records.type_names, n_jobs, rng))


def _type_speeds(gpu_types: tuple[str, ...], n_jobs: int,
                 rng: np.random.Generator) -> TypeSpeeds | None:
    """Each job's curve per type (`synthetic_state`), None for one type."""
    if len(gpu_types) < 2:
        return None
    factors = np.array([speed_over_reference(t, gpu_types) for t in gpu_types])
    speeds = factors[None, :] * rng.uniform(0.5, 2.0, (n_jobs, len(gpu_types)))
    speeds[:, factors == 1.0] = 1.0  # the jobs' own curve (speed 1) is the slowest type's
    shape = (n_jobs, len(gpu_types))
    return TypeSpeeds(gpu_types, speeds.astype(np.float32),
                      np.full(shape, 0.05, dtype=np.float32), np.full(shape, 0.1, np.float32))


def measure(policy: Policy, n_nodes: int = 500, n_jobs: int = 1000, repeats: int = 5,
            seed: int = 0, gpu_types: tuple[str, ...] = ()) -> dict:
    """Median seconds of one cycle, and of its parts (state building; policy + guardrails);
    for a round-based policy (`RoundPlanner`: gavel, sia), also of one round's solve."""
    state = synthetic_state(n_nodes, n_jobs, seed, gpu_types)
    names = {job_id: k8s_name(job_id) for job_id in state.jobs.job_id}
    nodes, pods, jobs = cluster_objects(state, "default", names)
    # a real cycle works on freshly decoded JSON: round-trip once so nothing is shared
    nodes, pods, jobs = json.loads(json.dumps([nodes, pods, jobs]))
    config = ActuatorConfig()
    signals = load_signals(config.signals)
    now_s = time.time()
    results = query_results(state, "default", names, now_s)
    earlier = telemetry_results(state.nodes.name,
                                np.zeros((n_nodes, len(NODE_FEATURE_NAMES)), dtype=np.float32),
                                now_s - signals.risk_lag_s)
    history = np.full(max(signals.history_min, 1), 0.8)
    build_s, decide_s, actions = [], [], 0
    for _ in range(repeats):
        started = time.perf_counter()
        built = build_state(Observation(state.time_s, nodes, pods, jobs, results, history,
                                        earlier), config, Ledger(), signals)
        built_at = time.perf_counter()
        cycle = decide(built.state, policy, config, DecisionHistory(),
                       built.nodes_without_telemetry)
        done = time.perf_counter()
        build_s.append(built_at - started)
        decide_s.append(done - built_at)
        actions = len(cycle.decisions)
    cycle_s = [b + d for b, d in zip(build_s, decide_s, strict=True)]
    result = {"cycle_s": statistics.median(cycle_s), "build_state_s": statistics.median(build_s),
              "policy_and_guardrails_s": statistics.median(decide_s), "nodes": n_nodes,
              "gpus": 8 * n_nodes, "gpu_types": list(built.state.nodes.type_names),
              "jobs": n_jobs, "pods": len(pods), "decisions_per_cycle": actions,
              "repeats": repeats}
    if isinstance(policy, RoundPlanner):
        result["round_solve_s"] = statistics.median(
            round_solve_s(policy, built.state) for _ in range(repeats))
    return result
