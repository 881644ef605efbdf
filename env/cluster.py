"""Cluster shape: nodes x GPUs, GPU type and rack, from a short spec (``16x4``, or groups joined
by ``+``: ``4x8:A100+8x4``) or a YAML file.

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

GPU types are those whose power the simulator knows (`rlalloc.env.params.GPU_POWER_W`: T4, V100,
A100, H100), in any case; unknown keys, fractional counts and unknown types are one-line errors.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from rlalloc.env.errors import UserError
from rlalloc.env.params import GPU_POWER_W

DEFAULT_GPU_TYPE = "T4"
"""The Pollux profiles were measured on NVIDIA T4 GPUs; the default cluster matches them."""
DEFAULT_NODES_PER_RACK = 8
MAX_NODES = 1_000_000
"""Most nodes a cluster may have: beyond any real cluster, and a cap on the memory a typo
(``count: 1000000000``) could ask for."""
MAX_GPUS_PER_NODE = 1024
"""Most GPUs one node may have (real ones have up to 8, a rack-scale NVL72 domain 72)."""
_FILE_KEYS = ("racks_of", "nodes")
_GROUP_KEYS = ("count", "gpus", "gpu_type", "rack", "name_prefix")

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

    def job_gpus(self, gpus_per_worker: int = 1) -> int:
        """The most GPUs one job can hold, in whole workers of `gpus_per_worker` GPUs: those of
        the cluster's largest GPU type (a job runs on one type at a time), or all of a one-type
        cluster's."""
        by_type: dict[str, int] = {}
        for n in self.nodes:
            by_type[n.gpu_type] = by_type.get(n.gpu_type, 0) + n.gpus // gpus_per_worker
        return max(by_type.values()) * gpus_per_worker

    @property
    def max_gpus_per_node(self) -> int:
        """The largest node's GPU count (the unit of a packed placement)."""
        return max(n.gpus for n in self.nodes)

    def describe(self) -> str:
        """`16x4` for a uniform T4 cluster, otherwise a count per (GPUs, type) group joined by
        ``+`` (``3x8:A100+4x4``): a spec `parse_cluster` accepts, giving a cluster of the same
        nodes but numbered and racked afresh (a YAML file's names and racks are not kept)."""
        groups: dict[tuple[int, str], int] = {}
        for n in self.nodes:
            groups[(n.gpus, n.gpu_type)] = groups.get((n.gpus, n.gpu_type), 0) + 1
        parts = [
            f"{count}x{gpus}" + ("" if gtype == DEFAULT_GPU_TYPE else f":{gtype}")
            for (gpus, gtype), count in groups.items()
        ]
        return "+".join(parts)


def add_cluster_flag(parser: argparse.ArgumentParser, default: str = "16x4") -> None:
    """--cluster, described alike by every command that simulates (`parse_cluster` reads it)."""
    parser.add_argument("--cluster", default=default,
                        help="NODESxGPUS[:TYPE], several joined by + (e.g. 16x4, 128x8:A100, "
                             "4x8:A100+8x4), or a cluster YAML (default: %(default)s)")


def uniform_cluster(
    num_nodes: int, gpus_per_node: int, gpu_type: str = DEFAULT_GPU_TYPE
) -> ClusterSpec:
    """`num_nodes` identical nodes, racks of `DEFAULT_NODES_PER_RACK` consecutive nodes."""
    return ClusterSpec(tuple(_numbered_nodes(0, num_nodes, gpus_per_node, gpu_type)))


def _numbered_nodes(first: int, count: int, gpus: int, gpu_type: str,
                    per_rack: int = DEFAULT_NODES_PER_RACK, rack: int | None = None,
                    prefix: str = "node-") -> list[NodeSpec]:
    """`count` nodes of a group starting at node index `first`: named `prefix` and the index,
    in `rack`, by default index // `per_rack` (groups number and rack nodes across them)."""
    return [NodeSpec(f"{prefix}{i:04d}", gpus, gpu_type, i // per_rack if rack is None else rack)
            for i in range(first, first + count)]


def parse_cluster(spec: str) -> ClusterSpec:
    """Parse ``NxG`` (optionally ``NxG:TYPE``, several joined by ``+``) or the path of a YAML
    cluster file."""
    return _cluster_and_content(spec)[0]


def cluster_record(spec: str) -> dict | None:
    """How a card records the cluster of a YAML file `spec`: its path, `describe()` and its
    groups as used (``content``: every key filled in, defaults included; saved as YAML it gives
    the same cluster back), since the path alone names nothing once the file moves or changes.
    None for ``NODESxGPUS[:TYPE]``, which is its own record. It reads the file again: call it
    where the cluster is built."""
    cluster, content = _cluster_and_content(spec)
    return None if content is None else {"path": spec, "shape": cluster.describe(),
                                         "content": content}


def cluster_markdown(record: dict) -> list[str]:
    """Markdown lines showing a `cluster_record`: its content as a YAML block to save as a
    file and pass as --cluster."""
    return [f"Cluster file `{record['path']}` ({record['shape']}) as it was used; saved as a "
            ".yaml file, this gives the same cluster:", "", "```yaml",
            yaml.safe_dump(record["content"], sort_keys=False).rstrip(), "```"]


def _cluster_and_content(spec: str) -> tuple[ClusterSpec, dict | None]:
    """`parse_cluster`, and the content of a YAML file as read (None for a short spec)."""
    groups = [_SHORT_SPEC.match(part) for part in spec.split("+")]
    if all(groups):
        return _short_cluster(spec, groups), None
    path = Path(spec)
    if path.suffix.lower() in (".yaml", ".yml") and not path.exists():
        raise UserError(f"cluster file {spec}: no such file; check the path, or give "
                        "NODESxGPUS[:TYPE] (e.g. 16x4)")
    if not path.is_file():
        raise UserError(
            f"cluster spec {spec!r} is neither NODESxGPUS[:TYPE] (e.g. 16x4, 8x8:A100, several "
            "joined by +) nor a YAML file"
            + (" (it is a directory)" if spec and path.is_dir() else "")
        )
    return _cluster_from_yaml(path)


def _short_cluster(spec: str, groups: list[re.Match]) -> ClusterSpec:
    """The nodes of ``NODESxGPUS[:TYPE]`` groups (joined by ``+`` in `spec`), numbered and
    racked across the groups as a YAML file's are; one group is a `uniform_cluster`."""
    where = f"cluster spec {spec!r}"
    nodes: list[NodeSpec] = []
    for group in groups:
        count = _whole(int(group.group(1)), f"{where}: nodes", 1, MAX_NODES - len(nodes))
        gpus = _whole(int(group.group(2)), f"{where}: GPUs per node", 1, MAX_GPUS_PER_NODE)
        gpu_type = gpu_type_named(group.group(3) or DEFAULT_GPU_TYPE, where)
        nodes.extend(_numbered_nodes(len(nodes), count, gpus, gpu_type))
    return ClusterSpec(tuple(nodes))


def gpu_type_named(name: object, where: str) -> str:
    """`name` as a GPU type the simulator knows the power and speed of (`GPU_POWER_W`,
    `RELATIVE_SPEED`), in any case: ``a100`` is ``A100``. Another type would be charged a
    guessed power and run at a guessed speed, so it is refused."""
    known = {gpu_type.lower(): gpu_type for gpu_type in GPU_POWER_W}
    if isinstance(name, str) and name.strip().lower() in known:
        return known[name.strip().lower()]
    raise UserError(f"{where}: unknown GPU type {name!r}; use one of {', '.join(GPU_POWER_W)} "
                    "(any case), or add its power (GPU_POWER_W, env/params.py) and speed "
                    "(RELATIVE_SPEED, env/gpu_types.py)")


def _whole(value: object, where: str, minimum: int, maximum: int) -> int:
    """`value` if it is an integer in [minimum, maximum]. YAML reads ``2.7`` as a float and
    ``abc`` as a string: both are refused, not truncated or crashed on."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise UserError(f"{where} must be a whole number, at least {minimum} and at most "
                        f"{maximum:,}; not {value!r}")
    return value


def _cluster_from_yaml(path: Path) -> tuple[ClusterSpec, dict]:
    """The nodes of a YAML cluster file (module docstring), every key checked, and the file
    as read: its values checked, defaults filled in (for `cluster_record`)."""
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: not UTF-8 text; save the cluster file as UTF-8 YAML") from err
    except OSError as err:
        raise UserError(f"{path}: cannot read ({err.strerror}); check the path") from err
    except yaml.YAMLError as err:
        raise UserError(f"{path}: not valid YAML{_yaml_position(err)}; fix the indentation or "
                        "syntax there (docs/simulator.md shows an example)") from err
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list) or not doc["nodes"]:
        raise UserError(f"{path}: expected a mapping with a non-empty 'nodes' list of node groups")
    _reject_unknown_keys(doc, _FILE_KEYS, f"{path}")
    per_rack = _whole(doc.get("racks_of", DEFAULT_NODES_PER_RACK), f"{path}: racks_of", 1,
                      MAX_NODES)
    nodes: list[NodeSpec] = []
    groups: list[dict] = []
    for index, group in enumerate(doc["nodes"]):
        where = f"{path}: nodes[{index}]"
        if not isinstance(group, dict):
            raise UserError(f"{where}: expected a mapping with count and gpus")
        _reject_unknown_keys(group, _GROUP_KEYS, where)
        if "gpus" not in group:
            raise UserError(f"{where}: 'gpus' is missing; give the GPUs of each node")
        count = _whole(group.get("count", 1), f"{where}.count", 1, MAX_NODES - len(nodes))
        gpus = _whole(group["gpus"], f"{where}.gpus", 1, MAX_GPUS_PER_NODE)
        gpu_type = gpu_type_named(group.get("gpu_type", DEFAULT_GPU_TYPE), f"{where}.gpu_type")
        rack = _whole(group["rack"], f"{where}.rack", 0, MAX_NODES) if "rack" in group else None
        prefix = str(group.get("name_prefix", "node-"))
        # the first node's name against Kubernetes' DNS subdomain rule (the others differ in
        # their digits alone)
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*",
                            f"{prefix}0000") or len(prefix) > 200:
            # the twin and the actuator use these names as Kubernetes Node names: one that is
            # not a DNS subdomain cannot be created, cordoned or pinned to (HTTP 404)
            raise UserError(f"{where}.name_prefix {prefix!r}: node names must be Kubernetes "
                            "names: lowercase letters, digits, '-' and '.', starting with a "
                            "letter or digit, e.g. 'a100-'")
        nodes.extend(_numbered_nodes(len(nodes), count, gpus, gpu_type, per_rack, rack, prefix))
        groups.append({"count": count, "gpus": gpus, "gpu_type": gpu_type,
                       **({} if rack is None else {"rack": rack}), "name_prefix": prefix})
    _reject_repeated_names(path, nodes, groups)
    return ClusterSpec(tuple(nodes)), {"racks_of": per_rack, "nodes": groups}


def _reject_repeated_names(path: Path, nodes: list[NodeSpec], groups: list[dict]) -> None:
    """One-line `UserError` if two nodes share a name, which groups whose prefixes differ by
    trailing digits give (``n-1`` + ``0000`` and ``n-`` + ``10000``): the simulator would
    reach only one of them by name, yet count both, and Kubernetes has one Node per name."""
    names = [node.name for node in nodes]
    if len(set(names)) == len(names):
        return
    starts = list(itertools.accumulate((group["count"] for group in groups), initial=0))
    first_index: dict[str, int] = {}
    for index, name in enumerate(names):
        if name in first_index:
            earlier, later = (bisect.bisect_right(starts, i) - 1
                              for i in (first_index[name], index))
            prefix = next(groups[g]["name_prefix"] for g in (earlier, later)
                          if groups[g]["name_prefix"][-1:].isdigit())
            raise UserError(f"{path}: nodes[{later}] and nodes[{earlier}] both name a node "
                            f"{name!r}; end name_prefix {prefix!r} in a non-digit, e.g. "
                            f"{prefix + '-'!r}")
        first_index[name] = index


def _yaml_position(err: yaml.YAMLError) -> str:
    """Where PyYAML found `err` and what it found (`` at line 6, column 4 (expected ...)``);
    its class name alone (``ParserError``) would leave a user searching the whole file."""
    mark = getattr(err, "problem_mark", None)
    if mark is None:
        return f" ({err.__class__.__name__})"
    problem = getattr(err, "problem", None) or err.__class__.__name__
    return f" at line {mark.line + 1}, column {mark.column + 1} ({problem})"


def _reject_unknown_keys(mapping: dict, known: tuple[str, ...], where: str) -> None:
    """A misspelt key (``gpu_typ``) would otherwise be ignored without a word."""
    unknown = [str(key) for key in mapping if key not in known]
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(unknown)}; use {', '.join(known)}")
