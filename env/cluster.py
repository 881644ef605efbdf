"""Cluster shape: nodes x GPUs, GPU type and rack, from a short spec (``16x4``) or a YAML file.

The same `ClusterSpec` sizes the simulator and tells the workload loaders how many GPUs one job
may ask for. A YAML file lists node groups so heterogeneous clusters can be described::

    racks_of: 8                 # nodes per rack when a group gives no rack (default 8)
    nodes:
      - count: 12
        gpus: 4
        gpu_type: T4
      - count: 4
        gpus: 8
        gpu_type: A100
        rack: 9                 # optional: all nodes of this group in rack 9
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from env.errors import UserError

DEFAULT_GPU_TYPE = "T4"
"""The Pollux profiles were measured on NVIDIA T4 GPUs; the default cluster matches them."""
DEFAULT_NODES_PER_RACK = 8

_SHORT_SPEC = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*(?::\s*([A-Za-z0-9_-]+))?\s*$")


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One node of the cluster as configured (not its run-time health)."""

    name: str
    gpus: int
    gpu_type: str
    rack: int


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """The static shape of a cluster; `describe()` gives it back as a short string."""

    nodes: tuple[NodeSpec, ...]

    @property
    def total_gpus(self) -> int:
        """GPUs in the whole cluster."""
        return sum(n.gpus for n in self.nodes)

    @property
    def max_gpus_per_node(self) -> int:
        """The largest node's GPU count (the unit of a packed placement)."""
        return max(n.gpus for n in self.nodes)

    def describe(self) -> str:
        """`16x4` for a uniform T4 cluster, otherwise a count per (GPUs, type) group."""
        groups: dict[tuple[int, str], int] = {}
        for n in self.nodes:
            groups[(n.gpus, n.gpu_type)] = groups.get((n.gpus, n.gpu_type), 0) + 1
        parts = [
            f"{count}x{gpus}" + ("" if gtype == DEFAULT_GPU_TYPE else f":{gtype}")
            for (gpus, gtype), count in groups.items()
        ]
        return "+".join(parts)


def uniform_cluster(
    num_nodes: int, gpus_per_node: int, gpu_type: str = DEFAULT_GPU_TYPE
) -> ClusterSpec:
    """`num_nodes` identical nodes, racks of `DEFAULT_NODES_PER_RACK` consecutive nodes."""
    return ClusterSpec(
        tuple(
            NodeSpec(f"node-{i:04d}", gpus_per_node, gpu_type, i // DEFAULT_NODES_PER_RACK)
            for i in range(num_nodes)
        )
    )


def parse_cluster(spec: str) -> ClusterSpec:
    """Parse ``NxG`` (optionally ``NxG:TYPE``) or the path of a YAML cluster file."""
    match = _SHORT_SPEC.match(spec)
    if match:
        num_nodes, gpus = int(match.group(1)), int(match.group(2))
        if num_nodes < 1 or gpus < 1:
            raise UserError(f"cluster spec {spec!r}: nodes and GPUs per node must be at least 1")
        return uniform_cluster(num_nodes, gpus, match.group(3) or DEFAULT_GPU_TYPE)
    path = Path(spec)
    if not path.exists():
        raise UserError(
            f"cluster spec {spec!r} is neither NODESxGPUS (e.g. 16x4) nor an existing YAML file"
        )
    return _cluster_from_yaml(path)


def _cluster_from_yaml(path: Path) -> ClusterSpec:
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise UserError(f"{path}: not valid YAML ({err.__class__.__name__}); fix the file") from err
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list) or not doc["nodes"]:
        raise UserError(f"{path}: expected a mapping with a non-empty 'nodes' list of node groups")
    per_rack = int(doc.get("racks_of", DEFAULT_NODES_PER_RACK))
    nodes: list[NodeSpec] = []
    for index, group in enumerate(doc["nodes"]):
        where = f"{path}: nodes[{index}]"
        if not isinstance(group, dict):
            raise UserError(f"{where}: expected a mapping with count and gpus")
        try:
            count, gpus = int(group.get("count", 1)), int(group["gpus"])
        except (KeyError, TypeError, ValueError) as err:
            raise UserError(f"{where}: 'gpus' (and 'count') must be integers") from err
        if count < 1 or gpus < 1:
            raise UserError(f"{where}: count and gpus must be at least 1")
        gpu_type = str(group.get("gpu_type", DEFAULT_GPU_TYPE))
        for _ in range(count):
            i = len(nodes)
            rack = int(group["rack"]) if "rack" in group else i // per_rack
            nodes.append(NodeSpec(str(group.get("name_prefix", "node-")) + f"{i:04d}", gpus,
                                  gpu_type, rack))
    return ClusterSpec(tuple(nodes))
