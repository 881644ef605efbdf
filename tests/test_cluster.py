"""Cluster specs: the short form, YAML files, and one-line errors for bad ones."""

from __future__ import annotations

import re

import pytest
import yaml

from rlalloc.env.cluster import cluster_record, parse_cluster
from rlalloc.env.errors import UserError


def test_short_spec_gives_uniform_racked_nodes():
    cluster = parse_cluster("16x4")
    assert len(cluster.nodes) == 16 and cluster.total_gpus == 64
    assert {n.gpu_type for n in cluster.nodes} == {"T4"}
    assert [n.rack for n in cluster.nodes[:9]] == [0] * 8 + [1]
    assert parse_cluster("128x8:A100").describe() == "128x8:A100"


def test_yaml_groups_make_a_heterogeneous_cluster(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text("nodes:\n  - {count: 2, gpus: 4}\n"
                    "  - {count: 1, gpus: 8, gpu_type: A100, rack: 5}\n")
    cluster = parse_cluster(str(path))
    assert [n.gpus for n in cluster.nodes] == [4, 4, 8]
    assert cluster.nodes[2].gpu_type == "A100" and cluster.nodes[2].rack == 5
    assert cluster.describe() == "2x4+1x8:A100"


def test_a_cluster_record_gives_the_same_cluster_back_without_the_file(tmp_path):
    """What a card keeps of a cluster file: saved again as YAML, its content is the same
    cluster (defaults filled in, the GPU type's case settled); a short spec needs none."""
    path = tmp_path / "cluster.yaml"
    path.write_text("racks_of: 2\nnodes:\n  - {count: 3, gpus: 4, name_prefix: a-}\n"
                    "  - {count: 1, gpus: 8, gpu_type: a100, rack: 5}\n")
    cluster = parse_cluster(str(path))
    record = cluster_record(str(path))
    path.unlink()
    assert record["path"] == str(path) and record["shape"] == cluster.describe() == "3x4+1x8:A100"
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump(record["content"]))
    assert parse_cluster(str(again)) == cluster
    assert cluster_record("16x4:a100") is None


@pytest.mark.parametrize("text, fragment", [
    ("nodes: []\n", "non-empty 'nodes'"),
    ("nodes:\n  - {count: 2}\n", "'gpus'"),
    ("nodes:\n  - {count: 0, gpus: 4}\n", "at least 1"),
    ("nodes: [\n", "not valid YAML at line 2, column 1"),
    # a group indented one space less than the one before: the line to fix is named
    ("nodes:\n  - count: 4\n    gpus: 8\n  - count: 8\n   gpus: 4\n",
     "not valid YAML at line 5, column 4"),
    ("racks_of: 0\nnodes:\n  - {count: 2, gpus: 4}\n", "racks_of must be a whole number"),
    ("racks_of: abc\nnodes:\n  - {count: 2, gpus: 4}\n", "racks_of must be a whole number"),
    ("nodes:\n  - {count: 2, gpus: 4, rack: x}\n", "nodes[0].rack must be a whole number"),
    ("nodes:\n  - {count: 2.7, gpus: 4}\n", "nodes[0].count must be a whole number"),
    ("nodes:\n  - {count: two, gpus: 4}\n", "nodes[0].count must be a whole number"),
    ("nodes:\n  - {count: 2, gpus: [4]}\n", "nodes[0].gpus must be a whole number"),
    ("nodes:\n  - {count: 1000000000, gpus: 4}\n", "at most 1,000,000"),
    ("nodes:\n  - {count: 2, gpus: 4, gpu_typ: A100}\n", "unknown key(s) gpu_typ"),
    ("nodes:\n  - {count: 2, gpus: 4, gpu_type: B200}\n", "unknown GPU type 'B200'"),
    ('nodes:\n  - {count: 2, gpus: 4, name_prefix: "a b/c"}\n',
     "nodes[0].name_prefix 'a b/c': node names must be Kubernetes names"),
    ("nodes:\n  - {count: 2, gpus: 4, name_prefix: GPU-}\n", "name_prefix 'GPU-'"),
    ("nodes:\n  - {count: 2, gpus: 4, name_prefix: -a}\n", "name_prefix '-a'"),
    ("nodes:\n  - {count: 2, gpus: 4, name_prefix: a.-}\n", "name_prefix 'a.-'"),
    ("nodes:\n  - {count: 2, gpus: 4, name_prefix: a..}\n", "name_prefix 'a..'"),
    # n-1 + 0000 is n- + 10000: one name for two nodes, of which the simulator reaches one
    ("nodes:\n  - {count: 1, gpus: 8, name_prefix: n-1}\n"
     "  - {count: 10001, gpus: 1, name_prefix: n-}\n",
     "nodes[1] and nodes[0] both name a node 'n-10000'; end name_prefix 'n-1' in a non-digit"),
])
def test_bad_yaml_is_one_clear_error(tmp_path, text, fragment):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as err:
        parse_cluster(str(path))
    assert fragment in str(err.value) and str(path) in str(err.value)
    assert "\n" not in str(err.value)


def test_a_description_is_a_spec_of_the_same_nodes(tmp_path):
    """`describe()` (printed by simulate, kept by cards) can be given back to --cluster: the
    same GPUs and types, numbered and racked across the groups as in a YAML file."""
    path = tmp_path / "cluster.yaml"
    path.write_text("nodes:\n  - {count: 2, gpus: 4}\n  - {count: 1, gpus: 8, gpu_type: A100}\n"
                    "  - {count: 1, gpus: 4, name_prefix: t-}\n")
    cluster = parse_cluster(str(path))
    again = parse_cluster(cluster.describe())
    assert cluster.describe() == again.describe() == "3x4+1x8:A100"
    assert sorted((n.gpus, n.gpu_type) for n in again.nodes) == sorted(
        (n.gpus, n.gpu_type) for n in cluster.nodes)
    mixed = parse_cluster(" 4x8:a100 + 8x4 ")
    assert [n.name for n in mixed.nodes] == [f"node-{i:04d}" for i in range(12)]
    assert [n.rack for n in mixed.nodes] == [0] * 8 + [1] * 4
    assert [n.gpu_type for n in mixed.nodes] == ["A100"] * 4 + ["T4"] * 8
    for spec, fragment in [("2x4+", "neither NODESxGPUS"), ("2x4+0x4", "at least 1"),
                           ("999999x4+2x4", "at most 1; not 2")]:
        with pytest.raises(UserError, match=re.escape(fragment)):
            parse_cluster(spec)


def test_unknown_spec_names_the_accepted_forms():
    with pytest.raises(UserError, match="NODESxGPUS"):
        parse_cluster("sixteen")
    with pytest.raises(UserError, match="at least 1"):
        parse_cluster("0x4")


def test_unreadable_cluster_files_are_one_line_errors(tmp_path):
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe")
    for spec, fragment in [(str(binary), "not UTF-8"), (str(tmp_path), "(it is a directory)"),
                           ("", "neither NODESxGPUS"),
                           (str(tmp_path / "nothere.yml"), "nothere.yml: no such file")]:
        with pytest.raises(UserError) as err:
            parse_cluster(spec)
        assert fragment in str(err.value) and "\n" not in str(err.value)


def test_gpu_types_are_known_ones_in_any_case():
    assert {n.gpu_type for n in parse_cluster("2x4:t4").nodes} == {"T4"}
    assert parse_cluster("2x4:a100").describe() == "2x4:A100"
    with pytest.raises(UserError, match="unknown GPU type 'B200'; use one of T4, V100, A100"):
        parse_cluster("16x4:B200")
