"""Which links a transfer loads, and how much: the contention part of the fluid network backend.

:class:`LinkModel` turns a collective, a pipeline send, a host transfer or a parameter-server
push/pull into a :class:`FlowTiming`: its latency, its *solo* transfer time (the two parts of
:func:`simdist.analytic.collectives.collective_choice`, the algorithm NCCL's tuning model picks,
so that the engine and the closed form agree when nothing contends) and the *load* it puts on each link of the topology
(:mod:`simdist.spec.topology`) while it runs at that solo speed, as a fraction of the link's
bandwidth. :mod:`simdist.sim.network.fluid` shares the links among the flows.

Loads follow the closed form's assumptions. An inter-node collective's bus bandwidth is the
node's NIC bandwidth shared by the ``concurrent_per_node`` ranks of the node (GroupLayout), so
each rank uses ``nics / gpus_per_node`` of its own NIC (rail-optimized), scaled down when
NVLink rather than the NIC bounds the ring; the ranks on one NIC that do the same work (the same
pipeline stage: its TP/CP peers and, by symmetry, other DP replicas) add up. A leaf's uplink
carries the part of its ranks' traffic that leaves the leaf (a ring over nodes in order leaves
a leaf once per visit). Intra-node transfers load the GPUs' switch ports.

Beyond the topology graph's links, three host resources are shared the same way: each GPU's
PCIe link to its host (``gpu3~host0``, per direction, at the contract's per-GPU bandwidth), the
node's NVMe (``nvme0``) and the node's CPU (``cpu0``: the ZeRO-Offload optimizer step and the
parameter servers' updates). A host transfer is given as one GPU's solo seconds on the resource;
the GPUs of the node that do the same at the same time add up on the node's NVMe and CPU.

Parameter-server traffic (:meth:`LinkModel.ps`) is many-to-many: a worker's push is split evenly
over the servers (Li et al. OSDI'14), so it loads the worker's NIC and the NICs of every server
node (servers spread evenly over the nodes, :func:`server_nodes`), and, across leaves, the leaf
uplinks; a server node's NIC carries every remote worker's share, which makes it the bottleneck
when there are few servers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from simdist.analytic import fabric
from simdist.analytic.collectives import (
    GroupLayout,
    Network,
    busbw_cap,
    collective_choice,
    collective_time,
    layout_for_axis,
)
from simdist.analytic.param_server import ps_server_count, server_counts
from simdist.sim.network.alltoall import alltoall_fractions
from simdist.spec import topology as topo
from simdist.spec.cluster import ClusterSpec
from simdist.spec.plan import RankCoord, rank_coord, rank_of
from simdist.spec.scenario import Scenario

LinkKey = tuple[str, str]  # (link id, "up" | "down")
Loads = tuple[tuple[LinkKey, float], ...]


@dataclass(frozen=True, slots=True)
class FlowTiming:
    latency: float  # seconds of per-step latency (not shared)
    work: float  # seconds the transfer takes alone at its achieved bandwidth
    loads: Loads  # fraction of each link's bandwidth the flow uses when alone


HOST_DIRECTION = {"pcie_down": "up", "pcie_up": "down"}  # GPU -> host is "up" the PCIe link


# --- which links, how much ----------------------------------------------------------------


def host_link(cluster: ClusterSpec, rank: int) -> str:
    """The GPU's PCIe link to its host memory (not the GPU-NIC path of the topology graph)."""
    return f"{topo.gpu_name(rank)}~host{cluster.node_of(rank)}"


def node_resource(resource: str, node: int) -> str:
    """A node's shared NVMe (``nvme``) or CPU (``cpu``), as a link id of the fluid network."""
    return f"{resource}{node}"


def software_resource(rank: int) -> str:
    """The collective-issuing software of one rank (a :func:`~simdist.analytic.collectives.busbw_cap`
    ceiling), as a link id of the fluid network, so that the rank's concurrent capped collectives
    share it."""
    return f"dpsw{rank}"


def server_nodes(cluster: ClusterSpec, servers: int) -> tuple[int, ...]:
    """Servers per node (simdist.analytic.param_server.server_counts: spread evenly)."""
    return server_counts(cluster, servers)


def node_nic_links(cluster: ClusterSpec, node: int) -> tuple[str, ...]:
    """Every NIC cable of ``node`` (a server process's traffic is spread over them)."""
    gpn = cluster.gpus_per_node
    return tuple(dict.fromkeys(topo.nic_link(cluster, r) for r in range(node * gpn, (node + 1) * gpn)))


class LinkModel:
    """Times and loads of the transfers of one scenario.

    ``replicas_alike`` (symmetric fidelity): every DP replica does the same work at the same
    time, so ranks of other replicas that share a link with a simulated rank add their load to
    it. Otherwise (full fidelity) each replica's flows are separate, and a DP collective's
    flow covers exactly the replicas of its group.
    """

    def __init__(self, sc: Scenario, net: Network, replicas_alike: bool):
        self.sc, self.net, self.alike = sc, net, replicas_alike
        self.cluster, self.plan = sc.cluster, sc.plan
        self._loads: dict[tuple, Loads] = {}
        self._times: dict[tuple, tuple[float, float, float]] = {}
        self._flows: dict[tuple, FlowTiming] = {}
        self._layouts: dict[str, GroupLayout] = {}

    def _split(self, kind: str, nbytes: float, layout: GroupLayout, cap: float = 0.0) -> tuple[float, float, float]:
        """(latency, transfer) parts of the closed-form time, and the time under a software
        ceiling ``cap`` (0 without one)."""
        key = (kind, nbytes, layout, cap)
        got = self._times.get(key)
        if got is None:
            choice = collective_choice(kind, nbytes, layout, self.net)
            capped = collective_time(kind, nbytes, layout, self.net, cap) if cap else 0.0
            got = self._times[key] = (choice.latency_s, choice.transfer_s, capped)
        return got

    def rep(self, replica: int, stage: int) -> int:
        """The simulated (first) rank of a (replica, stage) slice."""
        return rank_of(RankCoord(replica, stage, 0, 0), self.plan)

    def _member(self, stage: int, replicas: Iterable[int]) -> Callable[[RankCoord], bool]:
        if self.alike:
            return fabric.SameStage(stage)
        allowed = frozenset(replicas)
        return lambda c: c.pp == stage and c.dp in allowed

    def collective(self, kind: str, nbytes: float, axis: str, stage: int, replicas: tuple[int, ...]) -> FlowTiming:
        """A collective over ``axis`` of the ranks of ``stage`` in ``replicas``."""
        layout = self._layouts.get(axis)
        if layout is None:
            layout = self._layouts[axis] = layout_for_axis(self.cluster, self.plan, axis)
        latency, work, capped = self._split(kind, nbytes, layout, busbw_cap(self.plan, axis))
        key = ("c", axis, stage, replicas, layout.intra_only, kind == "alltoall")
        loads = self._loads.get(key)
        if loads is None:
            fractions = alltoall_fractions(layout, self.net) if kind == "alltoall" else None
            loads = self._loads[key] = self._collective_loads(axis, stage, replicas, layout, fractions)
        if capped > latency + work:
            # a software ceiling (each rank's copies and host waits) sets the pace, latency
            # included: the rank's concurrent capped collectives share it, and the links run
            # below their share
            loads = tuple((k, v * work / capped) for k, v in loads) + tuple(
                ((software_resource(self.rep(d, stage)), "up"), 1.0) for d in replicas)
            latency, work = 0.0, capped
        return FlowTiming(latency, work, loads)

    def p2p(self, nbytes: float, src_stage: int, dst_stage: int, replica: int) -> FlowTiming:
        """A pipeline send from one stage to another inside one replica (each TP/CP rank
        sends its part to its peer; the simulated rank's pair stands for them all)."""
        key = ("p", nbytes, src_stage, dst_stage, replica)
        got = self._flows.get(key)
        if got is None:
            got = self._flows[key] = self._p2p(nbytes, src_stage, dst_stage, replica)
        return got

    def _p2p(self, nbytes: float, src_stage: int, dst_stage: int, replica: int) -> FlowTiming:
        src, dst = self.rep(replica, src_stage), self.rep(replica, dst_stage)
        c = self.cluster
        same_node = c.node_of(src) == c.node_of(dst)
        layout = GroupLayout(2, 2, 1, c.gpus_per_node) if same_node else GroupLayout(2, 1, 2, c.gpus_per_node)
        latency, work, _ = self._split("sendrecv", nbytes, layout)
        loads = self._p2p_loads(src, dst, src_stage, dst_stage, replica)
        return FlowTiming(latency, work, loads)

    def host(self, resource: str, seconds: float, stage: int, replica: int) -> FlowTiming:
        """One GPU's share of a host resource (work.HostXfer): its PCIe link, alone; the
        node's NVMe or CPU, with every member rank of the node that does the same (the replicas
        of the stage under symmetry; the rest of the slice in full fidelity)."""
        key = ("h", resource, stage, replica)
        loads = self._loads.get(key)
        if loads is None:
            c = self.cluster
            rep = self.rep(replica, stage)
            if resource in HOST_DIRECTION:
                loads = (((host_link(c, rep), HOST_DIRECTION[resource]), 1.0),)
            else:
                node = c.node_of(rep)
                member = self._member(stage, (replica,))
                gpn = c.gpus_per_node
                images = sum(1 for r in range(node * gpn, (node + 1) * gpn) if member(rank_coord(r, self.plan)))
                loads = (((node_resource(resource, node), "up"), float(max(1, images))),)
            self._loads[key] = loads
        return FlowTiming(0.0, seconds, loads)

    def ps(self, kind: str, nbytes: float, stage: int, replicas: tuple[int, ...]) -> FlowTiming:
        """A parameter-server push (``kind`` "push": workers to servers) or pull ("pull": back)
        of ``nbytes`` per worker rank, for the worker ranks of ``stage`` in ``replicas`` (every
        replica under symmetry). Each worker's bytes are split evenly over the servers; bytes to
        a server on the worker's own node stay off the network. The flow's solo time is set by
        its busiest link; every link it crosses is loaded in proportion."""
        key = ("ps", kind, nbytes, stage, replicas)
        got = self._flows.get(key)
        if got is None:
            got = self._flows[key] = self._ps(kind, nbytes, stage, replicas)
        return got

    def _ps(self, kind: str, nbytes: float, stage: int, replicas: tuple[int, ...]) -> FlowTiming:
        c, plan, net = self.cluster, self.plan, self.net
        k = ps_server_count(plan, c)
        on_node = server_nodes(c, k)
        member = self._member(stage, replicas)
        workers = [r for r in range(c.world_size) if member(rank_coord(r, plan))]
        out_dir, in_dir = ("up", "down") if kind == "push" else ("down", "up")
        nic_bw = net.inter_bw_node / c.nics_per_node
        seconds: dict[LinkKey, float] = {}

        def add(link: str, direction: str, s: float) -> None:
            if s > 0:
                seconds[(link, direction)] = seconds.get((link, direction), 0.0) + s

        per_node = [0] * c.num_nodes
        for r in workers:
            node = c.node_of(r)
            per_node[node] += 1
            add(topo.nic_link(c, r), out_dir, nbytes * (k - on_node[node]) / k / nic_bw)
        for node, s in enumerate(on_node):
            remote = len(workers) - per_node[node]
            if s and remote:
                nics = node_nic_links(c, node)
                for link in nics:
                    add(link, in_dir, s / k * nbytes * remote / len(nics) / nic_bw)
        if topo.num_leaves(c) > 1:
            up_bw = c.nodes_per_leaf * net.inter_bw_node / c.spine_oversubscription
            for leaf in range(topo.num_leaves(c)):
                nodes = range(leaf * c.nodes_per_leaf, min(c.num_nodes, (leaf + 1) * c.nodes_per_leaf))
                here_servers = sum(on_node[n] for n in nodes)
                here_workers = sum(per_node[n] for n in nodes)
                add(topo.uplink(c, leaf), out_dir, here_workers * nbytes * (k - here_servers) / k / up_bw)
                add(topo.uplink(c, leaf), in_dir,
                    here_servers / k * nbytes * (len(workers) - here_workers) / up_bw)
        work = max(seconds.values(), default=0.0)
        loads = tuple((key, s / work) for key, s in seconds.items()) if work > 0 else ()
        return FlowTiming(net.inter_latency, work, loads)

    def ps_update(self, seconds: float) -> FlowTiming:
        """The servers applying one bucket: ``seconds`` on the busiest server node's CPU alone,
        every server node's CPU loaded by its number of servers."""
        key = ("u",)
        loads = self._loads.get(key)
        if loads is None:
            on_node = server_nodes(self.cluster, ps_server_count(self.plan, self.cluster))
            most = max(on_node)
            loads = self._loads[key] = tuple(((node_resource("cpu", n), "up"), s / most)
                                             for n, s in enumerate(on_node) if s)
        return FlowTiming(0.0, seconds, loads)

    # --- loads (the arithmetic both engines share: simdist.analytic.fabric) ---

    def _collective_loads(self, axis: str, stage: int, replicas: tuple[int, ...], layout: GroupLayout,
                          fractions: tuple[float, float] | None = None) -> Loads:
        c, plan = self.cluster, self.plan
        f_inter, f_intra = fractions or fabric.fractions(self.net, layout)
        member = self._member(stage, replicas)
        out: dict[LinkKey, float] = {}
        for d in replicas:
            rep = self.rep(d, stage)
            if f_intra > 0.0:
                _add_both(out, topo.port_link(c, rep), f_intra)
            if f_inter <= 0.0:
                continue
            _add_both(out, topo.nic_link(c, rep), fabric.nic_load(c, plan, rep, member, f_inter), replace_value=True)
            leaf = topo.leaf_of(c, c.node_of(rep))
            cross = fabric.leaf_crossing(c, fabric.group_ranks(plan, rep, axis), leaf)
            load = fabric.uplink_load(c, plan, leaf, member, f_inter, cross)
            if load > 0.0:
                _add_both(out, topo.uplink(c, leaf), load, replace_value=True)
        return tuple(out.items())

    def _p2p_loads(self, src: int, dst: int, src_stage: int, dst_stage: int, replica: int) -> Loads:
        """Loads along the path from ``src`` to ``dst`` (simdist.spec.topology.path_hops): switch
        ports, the NICs at both ends with every rank of the same stage that shares them, and the
        leaf uplinks; PCIe to the NIC is not a bottleneck and is not loaded."""
        c = self.cluster
        send, recv = self._member(src_stage, (replica,)), self._member(dst_stage, (replica,))
        out: dict[LinkKey, float] = {}
        for link, direction in topo.path_hops(c, src, dst):
            end, member = (src, send) if direction == "up" else (dst, recv)
            kind = topo.link_kind(link)
            if kind == "intra":
                out[(link, direction)] = 1.0
            elif kind == "nic":
                out[(link, direction)] = fabric.nic_load(c, self.plan, end, member, 1.0)
            elif kind == "uplink":
                out[(link, direction)] = fabric.uplink_load(c, self.plan, topo.leaf_of(c, c.node_of(end)), member,
                                                            1.0, 1.0)
        return tuple(out.items())


def _add_both(out: dict[LinkKey, float], link: str, load: float, replace_value: bool = False) -> None:
    """A collective loads both directions of a link (a ring sends and receives)."""
    for direction in ("up", "down"):
        key = (link, direction)
        out[key] = load if replace_value else out.get(key, 0.0) + load
