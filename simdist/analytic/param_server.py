"""Parameter servers (synchronous and asynchronous): the push/pull bytes of every worker and
server (:func:`ps_traffic`), their seconds on the busiest NIC and the servers' CPUs
(:func:`ps_times`), and the staleness of the asynchronous mode.
"""

from __future__ import annotations

import math

from simdist.analytic.collectives import Network, node_gpus
from simdist.analytic.compression import compression_ratio, uncompressed_grad_bytes
from simdist.analytic.cost import cpu_optimizer_time
from simdist.analytic.params import params_per_rank
from simdist.frozen import frozen
from simdist.spec.cluster import ClusterSpec
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan


@frozen(slots=True)
class PSTraffic:
    """Push/pull traffic of the parameter-server modes in one step (bytes).

    Every worker (GPU) pushes its gradient and pulls the updated parameters, each split evenly
    over the servers (Li et al. OSDI'14, "Scaling Distributed Machine Learning with the
    Parameter Server"; BytePS docs/rationale.md): a server receives G x workers / servers and
    sends as much, with G = a worker's gradient bytes. Servers sit on the training nodes, spread
    evenly (one per node by default), so the traffic between a worker and a server on its own
    node stays off the NIC. Per node NIC and direction:
      out = g G (K - s)/K  [local workers' pushes to remote servers]
          + s G (W - g)/K  [local servers' replies to remote workers]
    and the same in, for g workers and s servers on the node, W workers and K servers in all.
    """

    workers: int
    servers: int
    worker_bytes: float  # G: one worker's push (= its pull)
    per_server_bytes: float  # in + out of one server: 2 G W / K
    node_nic_bytes: float  # per direction, the busiest node's NIC
    servers_per_node: int
    node_phase_bytes: float = 0.0  # the busiest node's NIC, one direction, pushes alone (= pulls alone)


def ps_server_count(plan: ParallelPlan, cluster: ClusterSpec) -> int:
    return plan.parameter_servers or cluster.num_nodes


def ps_traffic(m: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, stage: int = 0) -> PSTraffic:
    """Push/pull bytes of the parameter-server modes (see PSTraffic). Gradient compression
    shrinks both the push and the pull by its ratio (BytePS compresses both directions)."""
    n = params_per_rank(m, plan, stage)
    w = cluster.world_size
    k = ps_server_count(plan, cluster)
    g_node = node_gpus(cluster)
    wire = uncompressed_grad_bytes(plan, False) * compression_ratio(m, plan, stage)
    worker_bytes = n * wire
    spn_max = math.ceil(k / cluster.num_nodes)
    spn_min = k // cluster.num_nodes

    def parts(s: int) -> tuple[float, float]:
        """(local workers' pushes out, local servers' replies out) of a node with s servers."""
        return g_node * worker_bytes * (k - s) / k, s * worker_bytes * (w - g_node) / k

    busiest = max(sum(parts(spn_max)), sum(parts(spn_min)))
    phase = max(*parts(spn_max), *parts(spn_min))
    return PSTraffic(workers=w, servers=k, worker_bytes=worker_bytes,
                     per_server_bytes=2 * worker_bytes * w / k, node_nic_bytes=busiest,
                     servers_per_node=spn_max, node_phase_bytes=phase)


@frozen(slots=True)
class PSTimes:
    nic: float  # the busiest NIC's push/pull time (full duplex: push in, pull out)
    server_cpu: float  # the servers' optimizer step per step (sync) or per worker cycle (async)
    worker_nic: float  # one worker's own push and pull at its share of the node's NIC
    push: float = 0.0  # the pushes alone on their busiest link (= the pulls alone)


def ps_times(m: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, net: Network, stage: int = 0) -> PSTimes:
    """Seconds of one step's push/pull and server update. The NICs are full duplex, so pushes
    (in) and pulls (out) of different keys overlap: the busiest NIC carries ``node_nic_bytes`` per
    direction. A node's NIC bandwidth is net.inter_bw_node (achieved, all NICs); per push/pull a
    round trip of the inter-node latency. The servers apply the optimizer on the CPU
    (classic parameter server): the synchronous mode updates each server's 1/K of the parameters
    once per step; the asynchronous mode updates on every worker's push."""
    tr = ps_traffic(m, plan, cluster, stage)
    up_total, up_phase = leaf_uplink_seconds(plan, cluster, net, tr.worker_bytes)
    nic = 2 * net.inter_latency + max(tr.node_nic_bytes / net.inter_bw_node, up_total)
    push = max(tr.node_phase_bytes / net.inter_bw_node, up_phase)
    # a worker pushes G and pulls G at its share of the node's NIC (full duplex)
    own = 2 * net.inter_latency + tr.worker_bytes / (net.inter_bw_node / node_gpus(cluster))
    cpu = 0.0
    if cluster.host is not None:
        n_total = params_per_rank(m, plan, stage) * plan.model_parallel_size
        per_server = n_total / tr.servers
        updates = plan.dp if plan.async_parameter_servers else 1
        cpu = cpu_optimizer_time(per_server * tr.servers_per_node * updates, plan, cluster.host)
    return PSTimes(nic, cpu, own, push)


def server_counts(cluster: ClusterSpec, servers: int) -> tuple[int, ...]:
    """Servers per node: server i sits on node i * nodes // servers, so they spread evenly (one
    per node by default; ceil or floor of servers / nodes on each)."""
    counts = [0] * cluster.num_nodes
    for i in range(servers):
        counts[i * cluster.num_nodes // servers] += 1
    return tuple(counts)


def leaf_uplink_seconds(plan: ParallelPlan, cluster: ClusterSpec, net: Network,
                        worker_bytes: float) -> tuple[float, float]:
    """Seconds of the busiest leaf uplink (per direction) carrying the push/pull traffic that
    leaves its leaf: its workers' pushes to remote servers plus its servers' replies to remote
    workers (the same sum as a node's NIC in PSTraffic), at the leaf's downlink bandwidth over
    ``spine_oversubscription``, and the pushes (or the pulls) alone; (0, 0) in one leaf.
    The event engine's links load the same uplinks (simdist.sim.network.links.LinkModel.ps)."""
    npl = cluster.nodes_per_leaf
    if cluster.num_nodes <= npl:
        return 0.0, 0.0
    k = ps_server_count(plan, cluster)
    on_node = server_counts(cluster, k)
    gpn = node_gpus(cluster)
    workers = cluster.world_size
    up_bw = npl * net.inter_bw_node / cluster.spine_oversubscription
    worst = phase = 0.0
    for first in range(0, cluster.num_nodes, npl):
        nodes = range(first, min(cluster.num_nodes, first + npl))
        here_servers, here_workers = sum(on_node[n] for n in nodes), gpn * len(nodes)
        out = here_workers * worker_bytes * (k - here_servers) / k
        back = here_servers / k * worker_bytes * (workers - here_workers)
        worst = max(worst, (out + back) / up_bw)  # both leave through the uplink's up direction
        phase = max(phase, out / up_bw, back / up_bw)
    return worst, phase


def async_staleness_steps(plan: ParallelPlan) -> float:
    """Mean staleness of an asynchronous parameter server in updates: with W workers of equal
    speed taking turns, W - 1 other updates land between a worker's pull and its push (Dean et
    al. NIPS'12, Downpour SGD; Lian et al. NIPS'15, the staleness bound tau ~ number of workers).
    Counted per model replica (dp workers update the same parameters)."""
    return float(max(0, plan.dp - 1))


def server_update_time(m: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, stage: int) -> float:
    """The busiest server node's CPU update of ``stage``'s parameters (every TP/CP rank's shard)
    once per push: ps_times' server step, per pipeline stage (0 without a host spec)."""
    if cluster.host is None:
        return 0.0
    k = ps_server_count(plan, cluster)
    n = params_per_rank(m, plan, stage) * plan.tp * plan.cp / k * math.ceil(k / cluster.num_nodes)
    return cpu_optimizer_time(n, plan, cluster.host)
