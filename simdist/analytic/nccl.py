"""Which algorithm and protocol NCCL runs a collective with, and what it costs, after NCCL's own
tuning model (NVIDIA/nccl src/graph/tuning.cc, NCCL 2.30.7 @5067397c: ncclTopoTuneModel and
ncclTopoGetAlgoTime). NCCL predicts time = latency + bytes / bandwidth for every enabled
(algorithm, protocol) pair and runs the fastest; so does this module, with NCCL's constants for
what NCCL tunes (per-step latencies, protocol and algorithm bandwidth factors) and the cluster's
links for what they carry (the Simple ring's bus bandwidth, from nccl-tests measurements in
:mod:`simdist.analytic.collectives`).

Algorithms: ``ring``; ``tree`` (double binary tree, all-reduce); ``pat`` (parallel aggregated
trees, all-gather and reduce-scatter with one rank per node); ``nvls`` (NVLink SHARP inside one
node, all-reduce); ``nvls_tree`` (NVLS in the node, trees across nodes); ``collnet`` (SHARP
in-network reduction across nodes, CollNet Direct). Protocols: ``LL`` (8-byte flag+data stores:
lowest latency, half the bandwidth), ``LL128`` (128-byte lines, 120/128 of the bandwidth,
NVLink systems only), ``Simple`` (bulk copies: full bandwidth, highest latency).

Latency of one call, per tuning.cc (microseconds; per step is NCCL's hwLatencies for the link
class, base is baseLatencies):
  ring:      base + (steps - inter_steps) * intra_step + inter_steps * inter_step,
             steps = 2(n-1) (all-reduce) or n-1, inter_steps = 2(k-1) or k-1 over k nodes;
             x1.4 for a multi-node Simple all-reduce (NCCL's "plateau effect of ring", Ampere+)
  tree:      base + 2 ((n/k - 1) intra_step + log2(k) inter_step)
  pat:       base + log2(k) inter_step / 3.5 + 2.8 n
  nvls:      intra_step (+ inter_step across nodes);  nvls_tree: intra_step + 2 log2(k) inter_step
  collnet:   2 (min(1, n/k - 1) intra_step + 0.4 (n/k - 1)) + inter_step
A step across nodes with one rank per node uses the tree's network latency (tuning.cc: "with
ppn=1 latencies are fully exposed").

Bandwidth relative to the Simple ring's bus bandwidth B (tuning.cc "various model
refinements"): ring LL 0.5 B (capped at NCCL's LL ceiling across nodes: 39 GB/s over 2 nodes,
20.4 GB/s over more), LL128 0.92 B; tree 0.92 B (LL / 3.8, LL128 x 7/9 in one node, x 120/128
across nodes) with NCCL's size correction factors, algorithm bandwidth half the bus bandwidth;
PAT 0.75 B; NVLS all-reduce at the NVLS efficiency measured on the switch
(collectives.NVLS_EFFICIENCY); NVLS tree at the ring's bandwidth; CollNet: each byte crosses a
NIC once each way (the switch reduces), 0.9 B of algorithm bandwidth, twice the ring's.

The cluster's link ``latency`` is the per-step latency of a Simple ring step on that link (NCCL:
3.4 us NVLink, 14 us network); the other algorithms' and protocols' step latencies scale with
NCCL's table relative to it, so a cluster with slower links slows them all alike.
"""

from __future__ import annotations

import math
from functools import lru_cache

from simdist.frozen import frozen
from simdist.spec.cluster import NCCL_ALGORITHMS as ALGORITHMS
from simdist.spec.cluster import NCCL_PROTOCOLS as PROTOCOLS

US = 1e-6
# baseLatencies (us): per call
BASE_US = {("tree", "LL"): 6.8, ("tree", "LL128"): 14.0, ("tree", "Simple"): 8.4,
           ("ring", "LL"): 6.6, ("ring", "LL128"): 14.0, ("ring", "Simple"): 8.4, ("pat", "Simple"): 8.0}
# hwLatencies (us): per step, by link class (nvlink, pci, net)
STEP_US = {
    "nvlink": {("tree", "LL"): 0.6, ("tree", "LL128"): 1.25, ("tree", "Simple"): 4.0,
               ("ring", "LL"): 0.6, ("ring", "LL128"): 1.9, ("ring", "Simple"): 3.4,
               ("collnet", "Simple"): 3.7, ("nvls", "Simple"): 25.0, ("nvls_tree", "Simple"): 25.0,
               ("pat", "Simple"): 4.0},
    "pci": {("tree", "LL"): 1.0, ("tree", "LL128"): 1.9, ("tree", "Simple"): 4.0,
            ("ring", "LL"): 1.0, ("ring", "LL128"): 2.5, ("ring", "Simple"): 5.7,
            ("collnet", "Simple"): 3.7, ("pat", "Simple"): 4.0},
    "net": {("tree", "LL"): 5.0, ("tree", "LL128"): 8.5, ("tree", "Simple"): 14.0,
            ("ring", "LL"): 2.7, ("ring", "LL128"): 4.0, ("ring", "Simple"): 14.0,
            ("collnet", "Simple"): 31.0, ("nvls", "Simple"): 18.0, ("nvls_tree", "Simple"): 20.9,
            ("pat", "Simple"): 14.0},
}
# treeCorrectionFactor: tree bandwidth x f for sizes 64 B * 2^i (i = 0..23), per protocol
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
}
LL_MAX_BUSBW = {2: 39.0e9, 3: 20.4e9}  # NCCL's LL ceiling across 2 / more nodes (x86 Intel hosts)
RING_PLATEAU = 1.4  # multi-node Simple ring all-reduce latency factor (compute capability >= 8.0)
PAT_PER_RANK_US = 2.8


@frozen(slots=True)
class Links:
    """What NCCL's model needs to know about a group's links."""

    ranks: int  # n
    nodes: int  # k
    intra_class: str  # "nvlink" | "pci"
    ring_busbw: float  # the Simple ring's bus bandwidth (bytes/s), from the links
    intra_step_s: float  # the cluster's per-step latency of a Simple ring step inside a node
    inter_step_s: float  # ... across nodes
    nvls: bool = False  # NVLink SHARP in the node's switches
    nvls_algbw: float = 0.0  # NVLS all-reduce algorithm bandwidth (bytes/s)
    collnet: bool = False  # SHARP in the network switches
    ll128: bool = True  # LL128 enabled (NVLink systems)
    enabled: frozenset[str] = frozenset(ALGORITHMS)
    protocols: frozenset[str] = frozenset(PROTOCOLS)

    @property
    def ppn(self) -> int:
        return max(1, self.ranks // self.nodes)


@frozen(slots=True)
class Choice:
    """The (algorithm, protocol) NCCL's model picks for one call, and its time in two parts."""

    algorithm: str
    protocol: str
    latency_s: float
    transfer_s: float

    @property
    def seconds(self) -> float:
        return self.latency_s + self.transfer_s

    @property
    def label(self) -> str:
        return f"{self.algorithm}/{self.protocol}"


def _step(links: Links, where: str, algo: str, proto: str) -> float:
    """Per-step latency (s) of ``algo``/``proto`` inside a node or across nodes, scaled by the
    cluster's Simple ring step on that link."""
    if where == "intra":
        cls, ref = links.intra_class, links.intra_step_s
    else:
        cls, ref = "net", links.inter_step_s
        if links.ppn == 1 and algo == "ring":  # one rank per node: the tree's network latency
            algo = "tree"
    table = STEP_US[cls]
    return table.get((algo, proto), 0.0) / table[("ring", "Simple")] * ref


def _latency(links: Links, kind: str, algo: str, proto: str, nbytes: float) -> float:
    n, k = links.ranks, links.nodes
    ppn = links.ppn
    base = BASE_US.get((algo, proto), 0.0) * US
    intra, inter = _step(links, "intra", algo, proto), _step(links, "inter", algo, proto)
    log_k = math.floor(math.log2(k)) if k > 1 else 0
    if algo == "ring":
        steps = 2 * (n - 1) if kind == "allreduce" else n - 1
        inter_steps = 0 if k == 1 else (2 * (k - 1) if kind == "allreduce" else k - 1)
        lat = base + (steps - inter_steps) * intra + inter_steps * inter
        if k > 1 and kind == "allreduce" and proto == "Simple":
            lat *= RING_PLATEAU
        return lat
    if algo == "tree":
        return base + 2 * ((ppn - 1) * intra + log_k * inter)
    if algo == "pat":
        return base + log_k * inter / 3.5 + PAT_PER_RANK_US * US * n
    if algo == "nvls":
        return intra + (inter if k > 1 else 0.0)
    if algo == "nvls_tree":
        return intra + 2 * log_k * inter
    # collnet (Direct): arity serialization 0.4 us per local rank
    return 2 * (min(1, ppn - 1) * intra + (ppn - 1) * 0.4 * US) + inter


def _algbw(links: Links, kind: str, algo: str, proto: str, nbytes: float) -> float:
    """Algorithm bandwidth (bytes of the buffer per second) of ``algo``/``proto``."""
    n, k, b = links.ranks, links.nodes, links.ring_busbw
    steps = 2 * (n - 1) if kind == "allreduce" else n - 1
    if algo == "ring":
        bus = b * {"LL": 0.5, "LL128": 0.92, "Simple": 1.0}[proto]
        if proto == "LL" and k > 1:
            bus = min(bus, LL_MAX_BUSBW[min(k, 3)])
        return bus * n / steps
    if algo == "tree":
        bus = 0.92 * b
        if proto == "LL":
            bus /= 3.8
        elif proto == "LL128":
            bus *= 7 / 9 if k == 1 else 120 / 128
        size_log = int(math.log2(nbytes / 64)) if nbytes >= 64 else 0
        if size_log < len(TREE_CORRECTION[proto]):
            bus *= TREE_CORRECTION[proto][size_log]
        return 0.5 * bus
    if algo == "pat":
        return 0.75 * b * n / steps
    if algo == "nvls":
        return links.nvls_algbw
    if algo == "nvls_tree":
        return b * n / steps
    return 0.9 * b  # collnet: one crossing of each NIC per direction


def available(links: Links, kind: str) -> list[tuple[str, str]]:
    """The (algorithm, protocol) pairs NCCL could run ``kind`` with on these links."""
    k = links.nodes
    algos = ["ring"]
    if kind == "allreduce":
        algos.append("tree")
        if links.nvls and k == 1:
            algos.append("nvls")
        if links.nvls and k > 1:
            algos.append("nvls_tree")
        if links.collnet and k > 1:
            algos.append("collnet")
    elif kind in ("allgather", "reducescatter") and k > 1 and links.ppn == 1:
        algos.append("pat")
    out = []
    for a in algos:
        if a not in links.enabled:
            continue
        protos = PROTOCOLS if a in ("ring", "tree") else ("Simple",)
        for p in protos:
            if p not in links.protocols or (p == "LL128" and not links.ll128):
                continue
            out.append((a, p))
    if not out:  # every algorithm disabled for this kind: NCCL falls back to the ring
        out = [("ring", "Simple")]
    return out


@lru_cache(maxsize=16384)  # pure; a search asks the same collectives of many plans
def choose(links: Links, kind: str, nbytes: float) -> Choice:
    """The fastest (algorithm, protocol) for one ``kind`` collective of ``nbytes`` (the buffer
    size S of nccl-tests: the whole reduced or gathered buffer)."""
    best: Choice | None = None
    for algo, proto in available(links, kind):
        bw = _algbw(links, kind, algo, proto, nbytes)
        if bw <= 0:
            continue
        c = Choice(algo, proto, _latency(links, kind, algo, proto, nbytes), nbytes / bw)
        if best is None or c.seconds < best.seconds:
            best = c
    assert best is not None
    return best
