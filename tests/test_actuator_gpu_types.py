"""GPU types in the actuator: a node's GPU Feature Discovery product label mapped to a simulator
type by the config's product table, a node whose label the table does not know kept off new
placements (one warning), no placement across two types, and the twin's nodes labelled with
products that map back to their types."""

from __future__ import annotations

import logging

import pytest

from rlalloc.actuator.config import ActuatorConfig, load_config
from rlalloc.actuator.gpu_products import (
    DEFAULT_GPU_PRODUCTS,
    TWIN_PRODUCTS,
    GpuProduct,
    gpu_type_of,
)
from rlalloc.actuator.guardrails import DecisionHistory, decide, policy_view, rule_of
from rlalloc.actuator.state_builder import Ledger, Observation, build_state
from rlalloc.actuator.twin.kube_api import NODES, TwinKubeAPI
from rlalloc.actuator.twin.render import cluster_objects, node_object
from rlalloc.actuator.twin.runtime import Twin
from rlalloc.cli.main import main as cli_main
from rlalloc.env.cluster import parse_cluster
from rlalloc.env.errors import UserError
from rlalloc.env.params import GPU_POWER_W
from rlalloc.env.scenario import Scenario, job_speeds
from rlalloc.env.state import (
    NOOP,
    Action,
    ActionKind,
    ClusterState,
    Demand,
    JobInfo,
    Jobs,
    JobStatus,
    NodeInfo,
    Nodes,
)
from rlalloc.env.workload.spec import Workload

from actuator_fixtures import Scripted, job, quiet_params, served_state, state_controller

LABEL = "nvidia.com/gpu.product"


# ------------------------------------------------------------------------------ the table
@pytest.mark.parametrize(("product", "gpu_type"), [
    ("Tesla-T4", "T4"),
    ("Tesla-V100-SXM2-16GB", "V100"),
    ("Tesla-V100-SXM2-32GB", "V100"),
    ("Tesla-V100-PCIE-16GB", "V100"),
    ("Tesla-V100-PCIE-32GB", "V100"),
    ("Tesla-V100S-PCIE-32GB", "V100"),
    ("Tesla-V100-SXM3-32GB", "V100"),
    ("NVIDIA-A100-SXM4-40GB", "A100"),
    ("NVIDIA-A100-SXM4-80GB", "A100"),
    ("NVIDIA-A100-PCIE-40GB", "A100"),
    ("NVIDIA-A100-80GB-PCIe", "A100"),
    ("A100-SXM4-40GB", "A100"),  # older drivers wrote no NVIDIA prefix
    ("NVIDIA-H100-80GB-HBM3", "H100"),
    ("NVIDIA-H100-PCIe", "H100"),
    ("NVIDIA-H100-NVL", "H100"),
    ("NVIDIA-GeForce-RTX-2080-Ti", "RTX2080Ti"),
    ("GeForce-RTX-2080-Ti", "RTX2080Ti"),
    ("NVIDIA-GeForce-RTX-2080-Ti-Rev.-A", "RTX2080Ti"),
    ("Quadro-RTX-6000", "RTX6000"),
    # time-sliced GPUs: GFD appends -SHARED, the model is the same
    ("Tesla-T4-SHARED", "T4"),
    ("NVIDIA-A100-SXM4-80GB-SHARED", "A100"),
    # the simulator's own names (a label set by hand), any case
    ("a100", "A100"),
    ("RTX2080Ti", "RTX2080Ti"),
])
def test_the_shipped_table_maps_real_gfd_products_to_their_types(product, gpu_type):
    assert gpu_type_of(product, DEFAULT_GPU_PRODUCTS) == gpu_type


@pytest.mark.parametrize("product", [
    "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",  # a MIG slice is no whole A100
    "A100-SXM4-40GB-MIG-1g.5gb-SHARED",
    "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb",
    "NVIDIA-RTX-A6000",  # Ampere, not the Turing Quadro RTX 6000
    "NVIDIA-RTX-6000-Ada-Generation",
    "NVIDIA-A10",
    "NVIDIA-H200",
    "NVIDIA-L4",
    "NVIDIA-T400",
])
def test_the_shipped_table_knows_no_other_gpu(product):
    assert gpu_type_of(product, DEFAULT_GPU_PRODUCTS) is None


def test_the_twins_products_map_back_to_their_types():
    assert set(TWIN_PRODUCTS) == set(GPU_POWER_W)  # every type a cluster spec accepts
    for gpu_type, product in TWIN_PRODUCTS.items():
        assert gpu_type_of(product, DEFAULT_GPU_PRODUCTS) == gpu_type
        node = node_object("n", 8, gpu_type, 0, True)
        assert node["metadata"]["labels"][LABEL] == product


def test_a_config_files_rows_come_first_and_override_the_shipped_ones(tmp_path):
    path = tmp_path / "actuator.yaml"
    path.write_text("default_gpu_type: v100\n"
                    "gpu_products:\n"
                    "  - {pattern: NVIDIA-L4, type: t4}\n"
                    "  - {pattern: 'NVIDIA-A100-SXM4-80GB', type: H100}\n")
    config = load_config(path, environ={})
    assert config.default_gpu_type == "V100"
    assert config.gpu_products[:2] == (GpuProduct("NVIDIA-L4", "T4"),
                                       GpuProduct("NVIDIA-A100-SXM4-80GB", "H100"))
    assert config.gpu_products[2:] == DEFAULT_GPU_PRODUCTS
    assert gpu_type_of("NVIDIA-L4-SHARED", config.gpu_products) == "T4"
    assert gpu_type_of("NVIDIA-A100-SXM4-80GB", config.gpu_products) == "H100"
    assert gpu_type_of("NVIDIA-A100-SXM4-40GB", config.gpu_products) == "A100"


@pytest.mark.parametrize(("text", "expected"), [
    ("gpu_products:\n  - {pattern: NVIDIA-B200, type: B200}\n",
     "invalid actuator setting: gpu_products[0]: unknown GPU type 'B200'; use one of T4, "),
    ("gpu_products:\n  - {pattern: 'NVIDIA-(A10', type: A100}\n",
     "invalid actuator setting: gpu_products[0]: pattern 'NVIDIA-(A10' is not a regular "
     "expression"),
    ("gpu_products:\n  - [NVIDIA-L4, T4]\n",
     "gpu_products[0] must be a mapping {pattern: REGEX, type: GPU_TYPE}"),
    ("gpu_products: {NVIDIA-L4: T4}\n",
     "gpu_products must be a list of {pattern: REGEX, type: GPU_TYPE} mappings"),
    ("default_gpu_type: K80\n",
     "invalid actuator setting: default_gpu_type: unknown GPU type 'K80'"),
])
def test_a_bad_product_table_is_one_line_at_start_up(tmp_path, capsys, text, expected):
    path = tmp_path / "actuator.yaml"
    path.write_text(text)
    assert cli_main(["actuate", "--config", str(path), "--once"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"rlalloc: error: {path}: ")
    assert expected in err[0]


def test_the_table_comes_from_the_file_only_and_the_default_type_from_anywhere():
    with pytest.raises(UserError, match="RLALLOC_ACTUATOR_GPU_PRODUCTS: unknown actuator"):
        load_config(None, {"RLALLOC_ACTUATOR_GPU_PRODUCTS": "NVIDIA-L4=T4"})
    with pytest.raises(UserError) as refused:
        load_config(None, {"RLALLOC_ACTUATOR_DEFAULT_GPU_TYPE": "K80"})
    assert str(refused.value).startswith(
        "environment variable RLALLOC_ACTUATOR_DEFAULT_GPU_TYPE: invalid actuator setting: "
        "default_gpu_type: unknown GPU type 'K80'")
    assert load_config(None, {"RLALLOC_ACTUATOR_DEFAULT_GPU_TYPE": "h100"}).default_gpu_type == (
        "H100")


# ------------------------------------------------------------------------- state building
def _world(*gpu_types: str) -> ClusterState:
    """One 4-GPU node of each of `gpu_types` (node-0, node-1, ...), all free; job "wait"
    queued for 2 to 4 one-GPU workers."""
    nodes = Nodes.from_records([NodeInfo(f"node-{i}", 4, 4, gpu_type=t)
                                for i, t in enumerate(gpu_types)])
    jobs = Jobs.from_records([JobInfo("wait", JobStatus.QUEUED, 10.0, 4, 2, 4)])
    return ClusterState(time_s=1000.0, nodes=nodes, jobs=jobs, demand=Demand(pending_gpus=4))


def _observed(state: ClusterState, labels: dict[str, str | None]) -> Observation:
    """What a cluster in `state` shows (namespace "ns", no metrics), the product label of the
    nodes named in `labels` set to the given value (None: no label)."""
    nodes, pods, jobs = cluster_objects(state, "ns", {j: j for j in state.jobs.job_id})
    for node in nodes:
        name = node["metadata"]["name"]
        if name in labels:
            node["metadata"]["labels"].pop(LABEL)
            if labels[name] is not None:
                node["metadata"]["labels"][LABEL] = labels[name]
    return Observation(state.time_s, nodes, pods, jobs, {})


def test_a_nodes_type_is_its_products_and_without_a_label_the_default():
    state = _world("T4", "A100", "RTX2080Ti", "T4", "T4")
    observed = _observed(state, {"node-1": "NVIDIA-A100-SXM4-80GB-SHARED", "node-3": None})
    built = build_state(observed, ActuatorConfig(), Ledger())
    assert built.state.nodes.gpu_type == ("T4", "A100", "RTX2080Ti", "T4", "T4")
    assert built.untyped_nodes == {}
    config = ActuatorConfig(default_gpu_type="V100",
                            gpu_products=(GpuProduct("Tesla-T4", "RTX6000"),
                                          *DEFAULT_GPU_PRODUCTS))
    built = build_state(observed, config, Ledger())
    assert built.state.nodes.gpu_type == ("RTX6000", "A100", "RTX2080Ti", "V100", "RTX6000")


def test_a_node_of_an_unknown_product_takes_no_new_worker():
    state = _world("T4", "T4")
    config = ActuatorConfig(cooldown_s=0.0)
    built = build_state(_observed(state, {"node-1": "NVIDIA-L4"}), config, Ledger())
    assert built.untyped_nodes == {"node-1": "NVIDIA-L4"}
    # kept in the state as the cluster has it (not cordoned there: the apply step reads that),
    # typed as a node without a label, and shown to the policy cordoned
    assert built.state.nodes.gpu_type == ("T4", "T4")
    assert built.state.nodes.cordoned.tolist() == [False, False]
    untyped = frozenset(built.untyped_nodes)
    view = policy_view(built.state, config, frozenset(), untyped_nodes=untyped)
    assert view.nodes.cordoned.tolist() == [False, True]
    onto = Action(ActionKind.SCALE, "ns/wait", 2, ("node-1", "node-1"))
    [refused] = decide(built.state, Scripted(onto), config, DecisionHistory(),
                       untyped_nodes=untyped).decisions
    assert not refused.accepted and refused.reason == (
        "unknown GPU type of node node-1: its nvidia.com/gpu.product label matches no "
        "gpu_products pattern")
    assert rule_of(refused.reason) == "node_gpu_type"


def test_an_unknown_product_is_one_warning_per_node_and_its_node_is_not_used(tmp_path, caplog):
    state = _world("T4", "T4")
    server = served_state(state)
    try:
        node = server.call(server.api.get, NODES, None, "node-1")
        node["metadata"]["labels"][LABEL] = "NVIDIA-L4"
        server.call(server.api.put, NODES, None, "node-1", node)
        policy = Scripted(Action(ActionKind.SCALE, "default/wait", 2, ("node-1", "node-1")),
                          NOOP,  # (asked again in the cycle of the refusal)
                          Action(ActionKind.SCALE, "default/wait", 2, ("node-0", "node-0")))
        ctl = state_controller(tmp_path, server, state, policy)
        with caplog.at_level(logging.WARNING, logger="rlalloc.actuator"):
            reports = [ctl.run_cycle() for _ in range(3)]
        lines = [r.getMessage() for r in caplog.records if "NVIDIA-L4" in r.getMessage()]
        assert lines == [
            "node node-1: its GPU product nvidia.com/gpu.product=NVIDIA-L4 matches no "
            "gpu_products pattern, so rlalloc places no new workers there; add a pattern for it "
            "(and its simulator GPU type) to gpu_products in the actuator config"]
        outcomes = [(d.action.nodes, o) for r in reports for d, o in r.outcomes]
        assert outcomes[:2] == [(("node-1", "node-1"), "refused"),
                                (("node-0", "node-0"), "applied")]
    finally:
        server.stop()


# ------------------------------------------------------------------------------ guardrails
def test_no_placement_spans_two_gpu_types():
    state = _world("T4", "A100", "A100")
    config = ActuatorConfig(cooldown_s=0.0)
    across = Action(ActionKind.SCALE, "wait", 2, ("node-0", "node-1"))
    within = Action(ActionKind.SCALE, "wait", 2, ("node-1", "node-2"))
    [refused] = decide(state, Scripted(across), config, DecisionHistory()).decisions
    [accepted] = decide(state, Scripted(within), config, DecisionHistory()).decisions
    assert not refused.accepted and refused.reason == (
        "a job runs on one GPU type at a time: the new placement spans T4 and A100")
    assert rule_of(refused.reason) == "one_gpu_type"
    assert accepted.accepted, accepted.reason


# ------------------------------------------------------------------------------------ twin
def test_the_twin_of_a_mixed_cluster_labels_each_node_with_its_product():
    cluster = parse_cluster("2x4:T4+1x8:RTX2080Ti+1x8:A100")
    workload = Workload("test", (job("a", 0.0, 4, 1, 4),))
    gpu_types = tuple(dict.fromkeys(n.gpu_type for n in cluster.nodes))
    sim = Scenario(cluster, workload, job_speeds(workload, None, gpu_types)).simulator(
        quiet_params(60.0, 0.2))
    twin = Twin(sim, TwinKubeAPI())
    twin.tick(0.2)
    nodes = twin.api.list(NODES)
    assert [n["metadata"]["labels"][LABEL] for n in nodes] == [
        "Tesla-T4", "Tesla-T4", "NVIDIA-GeForce-RTX-2080-Ti", "NVIDIA-A100-SXM4-40GB"]
    built = build_state(Observation(sim.time_s, nodes, [], [], {}), ActuatorConfig(), Ledger())
    assert built.state.nodes.gpu_type == tuple(n.gpu_type for n in cluster.nodes)
    assert built.untyped_nodes == {}
