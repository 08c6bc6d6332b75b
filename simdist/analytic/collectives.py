"""Collective times on the cluster's links: the algorithm and protocol NCCL's tuning model picks
(ring, tree, PAT, NVLS, NVLS tree, CollNet x LL, LL128, Simple; :mod:`simdist.analytic.nccl`),
on the bus bandwidth the links give a Simple ring.

The ring's bus bandwidth follows nccl-tests (doc/PERFORMANCE.md): an all-reduce moves
2(n-1)/n x S over each rank's link, all-gather and reduce-scatter (n-1)/n x S. Across nodes, a
ring's inter-node edges run through the NICs, so its bus bandwidth is the node's NIC bandwidth
shared by the ranks of that node that communicate at the same time. A calibration profile's
measured links (gloo on CPU) keep the plain alpha-beta model: steps x latency + bytes / busbw.

Achieved-bandwidth factors (fraction of line rate), from the NCCL maintainers' figures in
tests/data/validation/collectives.csv: A100 NVSwitch ring ~230 of 300 GB/s (nccl-tests #149),
H100 ring ~370 of 450 GB/s (nccl-tests #212), H100 NVLS all-reduce algbw ~275 GB/s (#212),
HDR ~24 of 25 GB/s per NIC (nccl #412), NDR 46-48 of 50 GB/s per NIC (nccl-tests #290).

What this module offers the rest: :class:`Network` (achieved bandwidth and latency of the two
link levels), :func:`collective_time` and :func:`collective_choice` (one collective alone on the
links, and how NCCL runs it), and for the
per-stage description :class:`CollectiveCall` (calls of one collective over a plan axis) timed
by :class:`CommContext`. The event engine's network backend starts from the same solo times and
adds contention.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache

from simdist.analytic import nccl as tuning
from simdist.frozen import frozen
from simdist.spec.cluster import ClusterSpec
from simdist.spec.fields import hash_once
from simdist.spec.groups import GROUP_AXES, group_ranks
from simdist.spec.plan import ParallelPlan
from simdist.spec.profile import CalibrationProfile

LINK_EFFICIENCY = {
    "nvswitch": 0.80, "nvlink": 0.80, "pcie": 0.80, "loopback": 1.0,
    "infiniband": 0.94, "roce": 0.90, "ethernet": 0.85, "omnipath": 0.90, "none": 1.0,
}
NVLS_EFFICIENCY = 0.61  # algbw / per-GPU NVLink line rate for NVLink-SHARP all-reduce
DEEPSPEED_ZERO3_BUSBW = 21e9
"""Bus bandwidth (bytes/s per GPU) that DeepSpeed ZeRO-3's per-submodule parameter fetch
reaches, whatever the links carry: one p4d node (8 A100, NVSwitch) spent 420 ms more per forward
under ZeRO-3 than ZeRO-2 gathering a 5.1B-parameter model, 10.2 GB x 7/8 in 0.42 s = 21 GB/s
(DeepSpeed issue #1174, 2021, v0.3.16). Each fetch is a list all_gather followed by copies
and a host synchronisation (DeepSpeed PR #1188), so it is bound by the GPU's copies and the
host, not the network: the same ceiling shows on Selene's 8 x HDR nodes, where ZeRO-3's step
stops shrinking past 768 GPUs (Narayanan et al. SC'21 Table 2).

A call takes max(NCCL's latency + transfer, bytes over the ceiling), not their sum: ZeRO-3
prefetches the next submodules' parameters (DeepSpeed config ``stage3_prefetch_bucket_size``)
while the current one's are copied, so the fetch is a pipeline whose slowest stage sets the pace
and NCCL's per-call ring latency hides under the copies. The published rows show it: the
latency of a ring over 1,536 ranks is twice that over 768 (NCCL's model: ~7 ms against ~3.6 ms per
call, over ~1,500 calls a step), yet the step is 66.7 s at both (and 180 s / 184 s at 1,120 /
2,240 GPUs); adding the latency to the capped transfer (alpha + n beta with beta at the ceiling)
predicts +5 to +16% on those four rows where the maximum predicts -0.5 to +12%
(tests/test_validation.py)."""


def busbw_cap(plan: ParallelPlan, axis: str = "dp") -> float:
    """Bus-bandwidth ceiling of the plan's collectives over ``axis`` (0 = the network's): the
    data-parallel ones of DeepSpeed ZeRO-3."""
    if axis.startswith("dp") and plan.shards_params and plan.zero3_fetch != "layer":
        return DEEPSPEED_ZERO3_BUSBW
    return 0.0


@frozen(slots=True)
class GroupLayout:
    """Where the ranks of one communication group sit."""

    size: int  # n ranks in the group
    ranks_per_node: int  # g ranks of the group in each node it spans
    nodes: int  # k nodes spanned
    concurrent_per_node: int  # ranks of a node running the same kind of collective at once

    @property
    def intra_only(self) -> bool:
        return self.nodes == 1


def group_layout(cluster: ClusterSpec, size: int, stride: int) -> GroupLayout:
    gpn = cluster.gpus_per_node
    if size <= 1:
        return GroupLayout(1, 1, 1, gpn)
    per_node = max(1, min(size, gpn // stride)) if stride < gpn else 1
    nodes = math.ceil(size / per_node)
    return GroupLayout(size, per_node, nodes, gpn)


def node_gpus(cluster: ClusterSpec) -> int:
    """GPUs of the job in one node (a job smaller than a node uses only some of them)."""
    return min(cluster.gpus_per_node, cluster.world_size)


def grid(plan: ParallelPlan) -> tuple[int, ...]:
    """What the rank grid and its groups read of a plan (simdist.spec.plan.rank_of,
    simdist.spec.groups): the functions that see a plan only through its grid are memoised on
    it, so that the plans of a search that share a grid share their answers."""
    return plan.tp, plan.cp, plan.pp, plan.dp, plan.ep, plan.etp, plan.dp_shard


def layout_for_axis(cluster: ClusterSpec, plan: ParallelPlan, axis: str) -> GroupLayout:
    """Where a group along ``axis`` sits (memoised on the plan's :func:`grid`)."""
    key = (cluster, grid(plan), axis)
    g = _LAYOUTS.get(key)
    if g is None:
        if len(_LAYOUTS) >= 65536:
            _LAYOUTS.clear()
        g = _LAYOUTS[key] = _layout_for_axis(cluster, plan, axis)
    return g


_LAYOUTS: dict[tuple[object, ...], GroupLayout] = {}


def _layout_for_axis(cluster: ClusterSpec, plan: ParallelPlan, axis: str) -> GroupLayout:
    if axis in GROUP_AXES:  # expert and data-with-context groups (v1.2): not one stride apart
        return layout_of_ranks(cluster, group_ranks(plan, axis, 0))
    return group_layout(cluster, plan.axis_size(axis), plan.axis_stride(axis))


def layout_of_ranks(cluster: ClusterSpec, ranks: tuple[int, ...]) -> GroupLayout:
    """Where the given ranks sit: the most of them on one node, and the nodes they span."""
    per: dict[int, int] = {}
    for r in ranks:
        per[cluster.node_of(r)] = per.get(cluster.node_of(r), 0) + 1
    return GroupLayout(len(ranks), max(per.values()), len(per), cluster.gpus_per_node)


INTRA_CLASS = {"nvswitch": "nvlink", "nvlink": "nvlink", "pcie": "pci", "loopback": "pci"}


@hash_once
@frozen
class Network:
    """Achieved bandwidth and latency of the two link levels, from the catalog or a profile, and
    what NCCL's tuning model needs (``nccl``: collectives priced by :mod:`simdist.analytic.nccl`;
    off when a calibration profile measured the links, whose library runs its own algorithm)."""

    intra_bw: float  # per GPU per direction, achieved
    intra_latency: float
    inter_bw_node: float  # all NICs of a node, per direction, achieved
    inter_latency: float
    nvls: bool
    intra_line_rate: float
    # per collective kind (latency, bandwidth) inside a node, from a calibration profile whose
    # library (gloo on CPU) runs each kind with its own algorithm
    intra_by_kind: tuple[tuple[str, float, float], ...] = ()
    nccl: bool = False
    intra_class: str = "nvlink"  # NCCL's hardware class of the intra-node link: nvlink | pci
    collnet: bool = False  # SHARP in-network reduction (NCCL CollNet)
    algorithms: frozenset[str] = frozenset(tuning.ALGORITHMS)
    protocols: frozenset[str] = frozenset(tuning.PROTOCOLS)

    @classmethod
    def of(cls, cluster: ClusterSpec, profile: CalibrationProfile | None = None) -> Network:
        intra, inter = cluster.intra_node, cluster.inter_node
        intra_bw = intra.bandwidth_bytes_per_s * LINK_EFFICIENCY.get(intra.kind, 0.8)
        inter_bw = cluster.node_injection_bytes_per_s * LINK_EFFICIENCY.get(inter.kind, 0.85)
        intra_lat, inter_lat = intra.latency_s, inter.latency_s
        measured = False
        if profile:
            if "intra" in profile.links:
                intra_bw = profile.links["intra"].bandwidth_bytes_per_s
                intra_lat = profile.links["intra"].latency_s
                measured = True
            if "inter" in profile.links:
                inter_bw = profile.links["inter"].bandwidth_bytes_per_s * cluster.nics_per_node
                inter_lat = profile.links["inter"].latency_s
                measured = True
        by_kind: tuple[tuple[str, float, float], ...] = ()
        if profile:
            by_kind = tuple((k.split(".", 1)[1], v.latency_s, v.bandwidth_bytes_per_s)
                            for k, v in profile.links.items() if k.startswith("intra."))
            measured = measured or bool(by_kind)
        return cls(intra_bw, intra_lat, inter_bw, inter_lat,
                   cluster.in_switch_reduction, intra.bandwidth_bytes_per_s, by_kind,
                   nccl=not measured, intra_class=INTRA_CLASS.get(intra.kind, "pci"),
                   collnet=cluster.in_network_reduction, algorithms=cluster.nccl_algorithm_set,
                   protocols=cluster.nccl_protocol_set)

    def intra(self, kind: str) -> tuple[float, float]:
        """(latency, bandwidth) of ``kind`` inside a node."""
        for k, lat, bw in self.intra_by_kind:
            if k == kind:
                return lat, bw
        return self.intra_latency, self.intra_bw

    def inter_share(self, g: GroupLayout) -> float:
        """NIC bandwidth available to one rank's ring edge when the node's ranks all talk."""
        return self.inter_bw_node * g.ranks_per_node / g.concurrent_per_node

    def ring_busbw(self, kind: str, g: GroupLayout) -> float:
        """Bus bandwidth of a Simple ring over ``g``: NVLink inside a node; across nodes the NIC
        share, or NVLink if slower when several ranks of a node take part."""
        if g.intra_only:
            return self.intra(kind)[1]
        busbw = self.inter_share(g)
        return min(busbw, self.intra_bw) if g.ranks_per_node > 1 else busbw

    def nccl_links(self, kind: str, g: GroupLayout) -> tuning.Links:
        """What NCCL's tuning model needs about group ``g`` on these links."""
        return tuning.Links(g.size, g.nodes, self.intra_class, self.ring_busbw(kind, g), self.intra_latency,
                          self.inter_latency, nvls=self.nvls, nvls_algbw=self.intra_line_rate * NVLS_EFFICIENCY,
                          collnet=self.collnet, ll128=self.intra_class == "nvlink", enabled=self.algorithms,
                          protocols=self.protocols)


def collective_time(kind: str, nbytes: float, g: GroupLayout, net: Network, busbw_cap: float = 0.0) -> float:
    """Seconds for one collective of buffer size ``nbytes`` (nccl-tests' S) over group ``g``:
    the algorithm and protocol NCCL's tuning model picks (:func:`collective_choice`).

    ``busbw_cap`` (bytes/s, 0 = none) is a ceiling on the bus bandwidth that the software issuing
    the collective reaches, whatever the links could carry (see :func:`busbw_cap`)."""
    n = g.size
    if n <= 1 or nbytes <= 0:
        return 0.0
    t = collective_choice(kind, nbytes, g, net).seconds
    if busbw_cap > 0:
        t = max(t, ring_steps(kind, n) / n * nbytes / busbw_cap)
    return t


@lru_cache(maxsize=65536)  # pure; a search asks the same collectives of many plans
def collective_choice(kind: str, nbytes: float, g: GroupLayout, net: Network) -> tuning.Choice:
    """How one collective runs alone on the links: its algorithm, protocol, latency and
    transfer time. Point-to-point kinds (sendrecv, all-to-all: grouped sends; broadcast as a ring
    all-gather) and networks measured by a calibration profile use the alpha-beta ring;
    NCCL's collectives its tuning model (:mod:`simdist.analytic.nccl`)."""
    if g.size <= 1 or nbytes <= 0:
        return tuning.Choice("none", "", 0.0, 0.0)
    if kind == "sendrecv":
        lat, bw = net.intra("sendrecv") if g.intra_only else (net.inter_latency, net.inter_share(g))
        return tuning.Choice("p2p", "Simple", lat, nbytes / bw)
    if kind == "alltoall":  # grouped sends and receives, not one of NCCL's tuned collectives
        return tuning.Choice("p2p", "Simple", *alltoall_parts(nbytes, g, net))
    if kind == "broadcast":
        kind, nbytes = "allgather", nbytes * g.size
    if net.nccl:
        return tuning.choose(net.nccl_links(kind, g), kind, nbytes)
    return _measured_choice(kind, nbytes, g, net)


def ring_steps(kind: str, n: int) -> int:
    """Steps of a ring collective over n ranks; each moves S/n over every rank's link."""
    return 2 * (n - 1) if kind == "allreduce" else n - 1


def _measured_choice(kind: str, nbytes: float, g: GroupLayout, net: Network) -> tuning.Choice:
    """Alpha-beta on links a calibration profile measured (or a network built by hand): the
    ring, and for all-reduce the tree, the hierarchical pattern and NVLS where they are faster."""
    options = [("ring", ring_parts(kind, nbytes, g, net))]
    if kind == "allreduce":
        if g.intra_only and net.nvls:
            options.append(("nvls", (2 * net.intra_latency, nbytes / (net.intra_line_rate * NVLS_EFFICIENCY))))
        if not g.intra_only:
            options.append(("tree", tree_allreduce_parts(nbytes, g, net)))
            if g.ranks_per_node > 1:
                options.append(("hierarchical", hierarchical_allreduce_parts(nbytes, g, net)))
    name, (lat, xfer) = min(options, key=lambda o: sum(o[1]))
    return tuning.Choice(name, "measured", lat, xfer)


def ring_parts(kind: str, nbytes: float, g: GroupLayout, net: Network) -> tuple[float, float]:
    """(latency, transfer) of an alpha-beta ring: steps x latency + (steps/n) S / busbw."""
    n = g.size
    steps = ring_steps(kind, n)
    lat = net.intra(kind)[0] if g.intra_only else net.inter_latency
    return steps * lat, steps / n * nbytes / net.ring_busbw(kind, g)


def alltoall_parts(nbytes: float, g: GroupLayout, net: Network) -> tuple[float, float]:
    """All-to-all of S = ``nbytes`` per rank (S/n to every peer): the (g-1)/n part for peers on
    the rank's node over NVLink and the (n-g)/n part for the other nodes through the NICs, at
    once (NCCL's all-to-all is one grouped send/receive per peer; the expert dispatchers of
    Megatron-Core and DeepEP move tokens the same way: NVLink inside the node, RDMA between
    nodes). A node's NICs are shared by all its ranks doing the same."""
    n, gpn = g.size, g.ranks_per_node
    intra = (gpn - 1) / n * nbytes / net.intra("alltoall")[1]
    if g.intra_only:
        return net.intra("alltoall")[0], intra
    inter = (n - gpn) / n * nbytes / (net.inter_bw_node / g.concurrent_per_node)
    return net.inter_latency, max(intra, inter)


def tree_allreduce_parts(nbytes: float, g: GroupLayout, net: Network) -> tuple[float, float]:
    """Double binary tree across nodes (chain inside each node): log-depth latency, about the
    ring's bandwidth for large messages (NCCL 2.4 release notes / NVIDIA blog)."""
    depth = math.ceil(math.log2(g.nodes)) + (g.ranks_per_node - 1)
    return 2 * depth * net.inter_latency, 2 * nbytes / net.ring_busbw("allreduce", g)


def hierarchical_allreduce_parts(nbytes: float, g: GroupLayout, net: Network) -> tuple[float, float]:
    """Reduce-scatter inside each node, all-reduce of 1/g of the data across nodes, all-gather
    inside the node (the NVLS-tree / 2D pattern)."""
    intra = GroupLayout(g.ranks_per_node, g.ranks_per_node, 1, g.concurrent_per_node)
    inter = GroupLayout(g.nodes, 1, g.nodes, g.concurrent_per_node)
    part = nbytes / g.ranks_per_node
    cross = min((ring_parts("allreduce", part, inter, net), tree_allreduce_parts(part, inter, net)), key=sum)
    rs, ag = ring_parts("reducescatter", nbytes, intra, net), ring_parts("allgather", nbytes, intra, net)
    return rs[0] + cross[0] + ag[0], rs[1] + cross[1] + ag[1]


# --- calls of the plan's collectives, timed ---------------------------------------------------


@frozen(slots=True)
class CollectiveCall:
    """``calls`` back-to-back collectives of one kind, each of buffer size ``bytes`` (the S of
    nccl-tests), over the ranks of one plan axis (dp, dp_shard, dp_replica); ``seconds`` is one
    call alone on the links once :meth:`CommContext.timed` has timed it."""

    name: str
    kind: str  # allreduce | allgather | reducescatter | alltoall
    axis: str
    bytes: float
    calls: int = 1
    seconds: float = 0.0
    links: str = ""  # "intra" (inside a node) or "inter" (across nodes), once timed
    wait_s: float = 0.0  # a fixed wait after each call, in ``seconds`` (a share of a profile's dp_step_wait_s)

    @property
    def total_bytes(self) -> float:
        return self.bytes * self.calls

    @property
    def total_seconds(self) -> float:
        """All calls, back to back."""
        return self.calls * self.seconds


class CommContext:
    """Times collectives of one scenario on its cluster: NCCL's choice, the plan's ceilings, and
    ``slowdown(axis)``, how much slower a transfer runs when every group of the axis runs it at
    once on shared links (simdist.analytic.fabric; None: never)."""

    def __init__(self, cluster: ClusterSpec, plan: ParallelPlan, net: Network,
                 slowdown: Callable[[str], float] | None = None):
        self.cluster, self.plan, self.net = cluster, plan, net
        self.slowdown = slowdown
        self._layouts: dict[str, GroupLayout] = {}

    def layout(self, axis: str) -> GroupLayout:
        g = self._layouts.get(axis)
        if g is None:
            g = self._layouts[axis] = layout_for_axis(self.cluster, self.plan, axis)
        return g

    def time(self, kind: str, nbytes: float, axis: str) -> float:
        """One collective over ``axis``, its peer groups running it at the same time."""
        g = self.layout(axis)
        if g.size <= 1 or nbytes <= 0:
            return 0.0
        c = collective_choice(kind, nbytes, g, self.net)
        t = c.latency_s + c.transfer_s * (self.slowdown(axis) if self.slowdown else 1.0)
        cap = busbw_cap(self.plan, axis)
        return max(t, ring_steps(kind, g.size) / g.size * nbytes / cap) if cap > 0 else t

    def timed(self, calls: tuple[CollectiveCall, ...]) -> tuple[CollectiveCall, ...]:
        """``calls`` with the seconds of one call of each, and the links it runs on, filled in."""
        return tuple(replace(c, seconds=self.time(c.kind, c.bytes, c.axis),
                             links="intra" if self.layout(c.axis).intra_only else "inter") for c in calls)


def calls_seconds(calls: tuple[CollectiveCall, ...]) -> float:
    """Every call of timed ``calls``, back to back."""
    return sum(c.total_seconds for c in calls)
