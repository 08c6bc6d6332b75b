"""The cluster as a graph of GPUs, switches and links, and the links a transfer crosses.

Layout (a rail-optimized fat tree, as in NVIDIA's DGX SuperPOD reference architecture):

- every node has one intra-node switch (NVSwitch, or the NVLink mesh / PCIe fabric modelled as
  a switch with one port per GPU at the per-GPU bandwidth of ``cluster.intra_node``);
- ``nics_per_node`` NICs per node; local GPU ``i`` uses NIC ``i * nics // gpus_per_node``
  (rail-optimized: GPU i of every node sits on rail i), reached over PCIe;
- every NIC is cabled to its node's leaf switch (``nodes_per_leaf`` nodes per leaf);
- leaves connect to one logical spine (an aggregate of the spine switches) with the leaf's
  downlink bandwidth divided by ``spine_oversubscription``.

Link ids are strings ``"<lower end>~<upper end>"`` (``gpu3~nvswitch0``, ``gpu3~nic0.3``,
``nic0.3~leaf0``, ``leaf0~spine``). Paths are computed arithmetically, so the engine never needs
the graph; :func:`build_graph` builds it (cached) for inspection, drawing and tests.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Literal

from simdist.spec.cluster import ClusterSpec

if TYPE_CHECKING:  # networkx is imported only when a graph is built
    import networkx as nx

LinkId = str
Direction = Literal["up", "down"]  # up: from the link's lower end towards the spine
SPINE = "spine"


# --- names --------------------------------------------------------------------------------


def gpu_name(rank: int) -> str:
    return f"gpu{rank}"


def switch_name(cluster: ClusterSpec, node: int) -> str:
    return f"{cluster.intra_node.kind}{node}"


def nic_of(cluster: ClusterSpec, rank: int) -> int:
    """Index of the NIC (rail) that ``rank`` uses inside its node."""
    local = rank % cluster.gpus_per_node
    return local * cluster.nics_per_node // cluster.gpus_per_node


def nic_locals(cluster: ClusterSpec, nic: int) -> range:
    """The local indices of a node's GPUs that use NIC ``nic`` (:func:`nic_of`'s inverse: local
    * nics // gpus_per_node == nic, a run of consecutive GPUs)."""
    gpn, nics = cluster.gpus_per_node, cluster.nics_per_node
    return range(-(-nic * gpn // nics), -(-(nic + 1) * gpn // nics))


def nic_name(cluster: ClusterSpec, rank: int) -> str:
    return f"nic{cluster.node_of(rank)}.{nic_of(cluster, rank)}"


def leaf_of(cluster: ClusterSpec, node: int) -> int:
    return node // cluster.nodes_per_leaf


def num_leaves(cluster: ClusterSpec) -> int:
    return -(-cluster.num_nodes // cluster.nodes_per_leaf)


# --- link ids -----------------------------------------------------------------------------


def port_link(cluster: ClusterSpec, rank: int) -> LinkId:
    """The GPU's port on its node's switch (NVLink / NVSwitch / PCIe)."""
    return f"{gpu_name(rank)}~{switch_name(cluster, cluster.node_of(rank))}"


def pcie_link(cluster: ClusterSpec, rank: int) -> LinkId:
    """GPU to its NIC (PCIe, GPUDirect RDMA)."""
    return f"{gpu_name(rank)}~{nic_name(cluster, rank)}"


def nic_link(cluster: ClusterSpec, rank: int) -> LinkId:
    """The network cable from the rank's NIC to its leaf switch."""
    return f"{nic_name(cluster, rank)}~leaf{leaf_of(cluster, cluster.node_of(rank))}"


def uplink(cluster: ClusterSpec, leaf: int) -> LinkId:
    """A leaf switch's (aggregate) uplink to the spine."""
    return f"leaf{leaf}~{SPINE}"


def link_kind(link: LinkId) -> str:
    """The kind of a link id: intra (GPU to its node's switch), pcie (GPU to NIC), nic (NIC to
    leaf) or uplink (leaf to spine); the same ``kind`` the graph's edges carry."""
    low, high = link.split("~")
    if high == SPINE:
        return "uplink"
    if low.startswith("nic"):
        return "nic"
    return "pcie" if high.startswith("nic") else "intra"


# --- paths --------------------------------------------------------------------------------


def path_hops(cluster: ClusterSpec, src: int, dst: int) -> list[tuple[LinkId, Direction]]:
    """The links from ``src`` to ``dst`` in order, each with the direction it is crossed in."""
    if src == dst:
        return []
    n_src, n_dst = cluster.node_of(src), cluster.node_of(dst)
    if n_src == n_dst:
        return [(port_link(cluster, src), "up"), (port_link(cluster, dst), "down")]
    hops: list[tuple[LinkId, Direction]] = [(pcie_link(cluster, src), "up"), (nic_link(cluster, src), "up")]
    l_src, l_dst = leaf_of(cluster, n_src), leaf_of(cluster, n_dst)
    if l_src != l_dst:
        hops += [(uplink(cluster, l_src), "up"), (uplink(cluster, l_dst), "down")]
    hops += [(nic_link(cluster, dst), "down"), (pcie_link(cluster, dst), "down")]
    return hops


def path_links(cluster: ClusterSpec, src_rank: int, dst_rank: int) -> list[LinkId]:
    """Link ids on the path from ``src_rank`` to ``dst_rank``, in order."""
    return [link for link, _ in path_hops(cluster, src_rank, dst_rank)]


def links_crossed(cluster: ClusterSpec, ranks: list[int] | tuple[int, ...]) -> set[LinkId]:
    """Links a ring over ``ranks`` (in the given order) crosses."""
    n = len(ranks)
    if n < 2:
        return set()
    out: set[LinkId] = set()
    for i, r in enumerate(ranks):
        out.update(path_links(cluster, r, ranks[(i + 1) % n]))
    return out


# --- the graph ----------------------------------------------------------------------------


def link_bandwidths(cluster: ClusterSpec) -> dict[str, float]:
    """Line-rate bandwidth per direction of each kind of link, bytes/s."""
    nic = cluster.inter_node.bandwidth_bytes_per_s
    pcie = cluster.host.pcie_bandwidth_bytes_per_s if cluster.host else nic
    leaf_down = cluster.nodes_per_leaf * cluster.node_injection_bytes_per_s
    return {
        "intra": cluster.intra_node.bandwidth_bytes_per_s,
        "pcie": pcie,
        "nic": nic,
        "uplink": leaf_down / cluster.spine_oversubscription,
    }


@cache
def build_graph(cluster: ClusterSpec) -> nx.Graph:
    """The cluster as an undirected networkx graph (cached per cluster).

    Nodes carry ``kind`` (gpu, nvswitch/nvlink/pcie/..., nic, leaf, spine) and, where it applies,
    ``node`` (the server). Edges carry ``id`` (the link id), ``kind`` (intra, pcie, nic, uplink),
    ``bandwidth_bytes_per_s`` (line rate per direction) and ``latency_s``. Built in bulk, so a
    2,048-node cluster (~50,000 links) takes well under a second.
    """
    import networkx as nx

    g = nx.Graph(name=cluster.name)
    bw = link_bandwidths(cluster)
    intra, inter = cluster.intra_node, cluster.inter_node
    gpn = cluster.gpus_per_node
    nodes: list[tuple[str, dict]] = []
    edges: list[tuple[str, str, dict]] = []
    for node in range(cluster.num_nodes):
        sw = switch_name(cluster, node)
        leaf = f"leaf{leaf_of(cluster, node)}"
        nodes.append((sw, {"kind": intra.kind, "node": node}))
        for i in range(cluster.nics_per_node):
            nic = f"nic{node}.{i}"
            nodes.append((nic, {"kind": "nic", "node": node}))
            edges.append((nic, leaf, {"id": f"{nic}~{leaf}", "kind": "nic",
                                      "bandwidth_bytes_per_s": bw["nic"], "latency_s": inter.latency_s}))
        for rank in range(node * gpn, (node + 1) * gpn):
            gpu = gpu_name(rank)
            nic = nic_name(cluster, rank)
            nodes.append((gpu, {"kind": "gpu", "node": node}))
            edges.append((gpu, sw, {"id": f"{gpu}~{sw}", "kind": "intra",
                                    "bandwidth_bytes_per_s": bw["intra"], "latency_s": intra.latency_s}))
            edges.append((gpu, nic, {"id": f"{gpu}~{nic}", "kind": "pcie",
                                     "bandwidth_bytes_per_s": bw["pcie"], "latency_s": 0.0}))
    for leaf in range(num_leaves(cluster)):
        nodes.append((f"leaf{leaf}", {"kind": "leaf"}))
    if num_leaves(cluster) > 1:
        nodes.append((SPINE, {"kind": "spine"}))
        for leaf in range(num_leaves(cluster)):
            edges.append((f"leaf{leaf}", SPINE, {"id": uplink(cluster, leaf), "kind": "uplink",
                                                 "bandwidth_bytes_per_s": bw["uplink"], "latency_s": 0.0}))
    g.add_nodes_from(nodes)
    g.add_edges_from(edges)
    return g
