"""How much of a link a transfer uses, when every rank that does the same work transfers at once:
the load arithmetic both engines share.

A collective over a plan axis runs, by symmetry, in every group of that axis of the same pipeline
stage at once (every DP replica reduces its gradients together; every TP group of a stage
all-gathers together). At its solo speed (simdist.analytic.collectives) a rank uses a fraction of
its NIC and of its switch port (:func:`fractions`); the ranks that share a NIC add up
(:func:`nic_load`), and a leaf switch's uplink carries the part of its member ranks' NIC traffic
that leaves the leaf (:func:`uplink_load`: a ring over nodes in order leaves a leaf once per
visit, :func:`leaf_crossing`), over the leaf's downlink bandwidth divided by
``spine_oversubscription``. A load above 1 slows the transfer by that factor.

The event engine's fluid network (simdist.sim.network.links) puts these loads on its links and
shares them among whatever runs at the same time; the closed form multiplies a collective's
transfer by the largest load its group meets when its peers run it too (:func:`slowdown`), so
the two agree wherever nothing else runs beside the collective.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from simdist.analytic.collectives import GroupLayout, Network, grid, layout_for_axis
from simdist.spec import groups
from simdist.spec import topology as topo
from simdist.spec.cluster import ClusterSpec
from simdist.spec.plan import ParallelPlan, RankCoord, rank_coord, rank_of

Member = Callable[[RankCoord], bool]
MAX_WALKED_GROUP = 1 << 20  # ranks of a group walked node by node (larger ones: see slowdown)


class SameStage:
    """The member test "rank of pipeline stage ``stage``", which :func:`members` counts over a
    range of ranks in O(1) instead of rank by rank."""

    __slots__ = ("stage",)

    def __init__(self, stage: int):
        self.stage = stage

    def __call__(self, c: RankCoord) -> bool:
        return c.pp == self.stage


def _below(plan: ParallelPlan, n: int, stage: int) -> int:
    """Ranks of ``stage`` among ranks 0..n-1 (the rank order of simdist.spec.plan.rank_coord)."""
    blk = plan.tp * plan.cp  # ranks of one (dp, pp) slot
    if plan.pipeline_outermost:  # stage s holds ranks [s*dp*blk, (s+1)*dp*blk)
        span = plan.dp * blk
        return min(max(n - stage * span, 0), span)
    period = plan.pp * blk  # each replica: stage s holds [s*blk, (s+1)*blk) of its period
    return (n // period) * blk + min(max(n % period - stage * blk, 0), blk)


def members(plan: ParallelPlan, first: int, last: int, member: Member) -> int:
    """How many ranks ``first``..``last``-1 pass ``member``."""
    if type(member) is SameStage:
        return _below(plan, last, member.stage) - _below(plan, first, member.stage)
    return sum(1 for r in range(first, last) if member(rank_coord(r, plan)))


def fractions(net: Network, layout: GroupLayout) -> tuple[float, float]:
    """(NIC, switch-port) use of one rank at the collective's solo speed."""
    if layout.intra_only:
        return 0.0, 1.0
    share = net.inter_share(layout)
    if layout.ranks_per_node == 1:
        return 1.0, 0.0
    busbw = min(share, net.intra_bw)
    return busbw / share, busbw / net.intra_bw


def nic_load(cluster: ClusterSpec, plan: ParallelPlan, rank: int, member: Member, f_inter: float) -> float:
    """Load on ``rank``'s NIC from every member rank that shares it."""
    gpn = cluster.gpus_per_node
    first = cluster.node_of(rank) * gpn
    local = topo.nic_locals(cluster, topo.nic_of(cluster, rank))  # consecutive: counted in closed form
    images = members(plan, first + local.start, first + local.stop, member)
    return images * f_inter * cluster.nics_per_node / gpn


def uplink_load(cluster: ClusterSpec, plan: ParallelPlan, leaf: int, member: Member, f_inter: float,
                cross: float) -> float:
    """Load on a leaf's uplink: each member rank's NIC traffic times the part leaving the leaf."""
    if cross <= 0.0:
        return 0.0
    gpn, npl = cluster.gpus_per_node, cluster.nodes_per_leaf
    first, last = leaf * npl * gpn, min(cluster.num_nodes, (leaf + 1) * npl) * gpn
    images = members(plan, first, last, member)
    return images * f_inter * cross * cluster.spine_oversubscription / (gpn * npl)


def leaf_crossing(cluster: ClusterSpec, group: list[int], leaf: int) -> float:
    """Part of a member node's ring traffic that leaves ``leaf``: a ring over the group's nodes
    in order enters and leaves each leaf once, shared by that leaf's member nodes."""
    nodes = sorted({cluster.node_of(r) for r in group})
    leaves = {topo.leaf_of(cluster, n) for n in nodes}
    if len(leaves) <= 1:
        return 0.0
    here = sum(1 for n in nodes if topo.leaf_of(cluster, n) == leaf)
    return 1.0 / max(1, here)


def group_ranks(plan: ParallelPlan, rep: int, axis: str) -> list[int]:
    """The ranks of ``rep``'s group along ``axis`` (a rank-grid axis or an expert/context group)."""
    return list(groups.group_ranks(plan, axis, rep))


def same_stage(stage: int) -> Member:
    return SameStage(stage)


def slowdown(cluster: ClusterSpec, plan: ParallelPlan, net: Network, axis: str, stage: int = 0) -> float:
    """How much slower a collective over ``axis`` transfers when every group of the stage runs
    it at once: the largest load on the NICs and leaf uplinks a group's representative rank
    meets (1.0: nothing shared beyond what its solo speed assumes). Memoised on the plan's rank
    grid (simdist.analytic.collectives.grid), all it reads of the plan."""
    key = (cluster, grid(plan), net, axis, stage)
    s = _SLOWDOWN.get(key)
    if s is None:
        if len(_SLOWDOWN) >= 65536:
            _SLOWDOWN.clear()
        s = _SLOWDOWN[key] = _slowdown(cluster, plan, net, axis, stage)
    return s


_SLOWDOWN: dict[tuple[object, ...], float] = {}


def _slowdown(cluster: ClusterSpec, plan: ParallelPlan, net: Network, axis: str, stage: int) -> float:
    layout = layout_for_axis(cluster, plan, axis)
    if layout.size <= 1 or layout.intra_only:
        return 1.0
    f_inter, _ = fractions(net, layout)
    member = same_stage(stage)
    rep = rank_of(RankCoord(0, stage, 0, 0), plan)  # by symmetry, the first replica's group
    leaf = topo.leaf_of(cluster, cluster.node_of(rep))
    if layout.size > MAX_WALKED_GROUP:  # a group spanning leaves, each leaf's nodes all members
        cross = 1.0 / cluster.nodes_per_leaf if topo.num_leaves(cluster) > 1 else 0.0
    else:
        cross = leaf_crossing(cluster, group_ranks(plan, rep, axis), leaf)
    return max(1.0, nic_load(cluster, plan, rep, member, f_inter),
               uplink_load(cluster, plan, leaf, member, f_inter, cross))


def worst_p2p_slowdown(cluster: ClusterSpec, plan: ParallelPlan) -> float:
    """The largest :func:`p2p_slowdown` over the pipeline's neighbouring stages (memoised on the
    plan's rank grid, simdist.analytic.collectives.grid)."""
    key = (cluster, grid(plan))
    worst = _WORST_P2P.get(key)
    if worst is None:
        if len(_WORST_P2P) >= 4096:
            _WORST_P2P.clear()
        worst = _WORST_P2P[key] = max(p2p_slowdown(cluster, plan, s, s + 1) for s in range(plan.pp - 1))
    return worst


_WORST_P2P: dict[tuple[ClusterSpec, tuple[int, ...]], float] = {}


@cache
def p2p_slowdown(cluster: ClusterSpec, plan: ParallelPlan, src_stage: int, dst_stage: int) -> float:
    """The same for a pipeline send of the first replica from one stage to the next (every
    replica's pair sends at once): the largest load on the NICs and uplinks of its path."""
    src, dst = rank_of(RankCoord(0, src_stage, 0, 0), plan), rank_of(RankCoord(0, dst_stage, 0, 0), plan)
    send, recv = same_stage(src_stage), same_stage(dst_stage)
    worst = 1.0
    for link, direction in topo.path_hops(cluster, src, dst):
        end, member = (src, send) if direction == "up" else (dst, recv)
        kind = topo.link_kind(link)
        if kind == "nic":
            worst = max(worst, nic_load(cluster, plan, end, member, 1.0))
        elif kind == "uplink":
            worst = max(worst, uplink_load(cluster, plan, topo.leaf_of(cluster, cluster.node_of(end)), member,
                                           1.0, 1.0))
    return worst
