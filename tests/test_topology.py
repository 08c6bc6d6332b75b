"""The cluster graph and the links that groups of ranks cross (DGX A100 presets)."""

from __future__ import annotations

import networkx as nx
import pytest

from simdist.spec import topology as topo
from simdist.spec.cluster import ClusterSpec
from simdist.spec.scenario import scenario_from_dict


def cluster(nodes: int, preset: str = "dgx-a100-80gb", **extra) -> ClusterSpec:
    sc = scenario_from_dict({"name": "t", "model": {"preset": "gpt3-1.3b"},
                             "cluster": {"preset": preset, "num_nodes": nodes, **extra},
                             "plan": {"tp": 8, "global_batch_size": 8 * nodes}})
    return sc.cluster


def kinds(c: ClusterSpec, links: set[str]) -> set[str]:
    g = topo.build_graph(c)
    by_id = {d["id"]: d["kind"] for _, _, d in g.edges(data=True)}
    return {by_id[link] for link in links}


def test_tp_group_crosses_only_nvswitch() -> None:
    c = cluster(2)
    links = topo.links_crossed(c, list(range(8)))
    assert links == {f"gpu{r}~nvswitch0" for r in range(8)}
    assert kinds(c, links) == {"intra"}


def test_dp_group_across_nodes_crosses_nics_and_leaf() -> None:
    c = cluster(4)
    links = topo.links_crossed(c, [0, 8, 16, 24])  # local GPU 0 of four nodes (rail 0)
    assert kinds(c, links) == {"pcie", "nic"}
    assert "nic0.0~leaf0" in links and "nic3.0~leaf0" in links
    assert not any("spine" in link for link in links)


def test_nodes_under_different_leaves_cross_the_spine() -> None:
    c = cluster(64)  # 32 nodes per leaf: two leaves
    path = topo.path_links(c, 0, 8 * 40)
    assert "leaf0~spine" in path and "leaf1~spine" in path
    assert kinds(c, set(path)) == {"pcie", "nic", "uplink"}
    assert topo.path_links(c, 8 * 40, 0) == list(reversed(path))


def test_paths_are_shortest_paths_of_the_graph() -> None:
    c = cluster(40, nodes_per_leaf=16)
    g = topo.build_graph(c)
    for src, dst in [(0, 5), (0, 8), (3, 8 * 20 + 3), (7, 8 * 39 + 1), (9, 9)]:
        ids = [g.edges[u, v]["id"] for u, v in nx.utils.pairwise(nx.shortest_path(g, f"gpu{src}", f"gpu{dst}"))]
        assert ids == topo.path_links(c, src, dst)


def test_graph_shape_and_attributes() -> None:
    c = cluster(64)
    g = topo.build_graph(c)
    assert topo.build_graph(c) is g  # cached
    gpus = [n for n, d in g.nodes(data=True) if d["kind"] == "gpu"]
    nics = [n for n, d in g.nodes(data=True) if d["kind"] == "nic"]
    assert len(gpus) == 512 and len(nics) == 512
    assert sum(1 for _, d in g.nodes(data=True) if d["kind"] == "leaf") == 2
    edge = g.edges["nic0.0", "leaf0"]
    assert edge["bandwidth_bytes_per_s"] == pytest.approx(25e9)  # HDR 200 Gb/s
    assert edge["latency_s"] == pytest.approx(c.inter_node.latency_s)
    assert g.edges["gpu0", "nvswitch0"]["bandwidth_bytes_per_s"] == pytest.approx(300e9)
    assert g.edges["leaf0", "spine"]["bandwidth_bytes_per_s"] == pytest.approx(32 * 8 * 25e9)


def test_rail_optimized_nic_mapping() -> None:
    c = cluster(2, inter_node={"nics_per_node": 4})
    assert [topo.nic_of(c, r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert topo.nic_name(c, 13) == "nic1.2"
    assert topo.path_links(c, 1, 9)[:2] == ["gpu1~nic0.0", "nic0.0~leaf0"]


@pytest.mark.parametrize(("gpn", "nics"), [(8, 8), (8, 4), (8, 1), (8, 3), (16, 6), (8, 16)])
def test_a_nics_gpus_are_the_ones_nic_of_maps_to_it(gpn: int, nics: int) -> None:
    c = cluster(1, gpus_per_node=gpn, inter_node={"nics_per_node": nics})
    for nic in range(nics):
        assert list(topo.nic_locals(c, nic)) == [r for r in range(gpn) if topo.nic_of(c, r) == nic]


def test_link_kind_matches_graph() -> None:
    c = cluster(64)
    for _, _, d in topo.build_graph(c).edges(data=True):
        assert topo.link_kind(d["id"]) == d["kind"]


def test_small_groups() -> None:
    c = cluster(1)
    assert topo.links_crossed(c, [3]) == set()
    assert topo.path_links(c, 2, 2) == []
    assert topo.links_crossed(c, [0, 1]) == {"gpu0~nvswitch0", "gpu1~nvswitch0"}
