"""How an all-to-all loads the links (the expert dispatch and combine, Ulysses' head exchange).

:func:`simdist.analytic.collectives.alltoall_parts` sends the (g-1)/n part of a rank's buffer
to its node's peers over NVLink and the (n-g)/n part through the NICs, at once; the transfer
lasts as long as the slower of the two. While it runs alone, the rank's switch port is busy the
NVLink part's share of that time and its NIC the network part's share; the link model scales
the NIC share by the ranks that share the NIC and the leaf uplinks by the part that leaves
the leaf, as for the other collectives.
"""

from __future__ import annotations

from simdist.analytic.collectives import GroupLayout, Network


def alltoall_fractions(g: GroupLayout, net: Network) -> tuple[float, float]:
    """(NIC, switch-port) use of one rank during an all-to-all over ``g`` at its solo speed."""
    n, gpn = g.size, g.ranks_per_node
    intra = (gpn - 1) / n / net.intra("alltoall")[1]
    if g.intra_only or n <= gpn:
        return 0.0, 1.0 if intra > 0 else 0.0
    inter = (n - gpn) / n / (net.inter_bw_node / g.concurrent_per_node)
    total = max(intra, inter)
    return inter / total, intra / total
