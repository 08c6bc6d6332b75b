"""Full fidelity by groups of ranks that behave the same.

Full fidelity simulates every data-parallel replica of every pipeline stage, for what sets ranks
apart: stragglers and slow nodes (the collectives wait for them), and the asynchronous
parameter-server mode (each worker at its own pace). Where nothing does, the replicas of a
stage form one group that provably behaves alike: the same work, started together, in a
deterministic engine, so their collectives meet at the same instants and their flows load the
links they share exactly as the symmetric backend counts them (``replicas_alike``: the loads of
the other replicas on a simulated rank's links). One slice per group, that is one per stage, is
then simulated (with the periodic extension where it applies) and gives the answer of
simulating every rank: tests/test_rank_groups.py compares the two on every bundled scenario.

Not grouped: stragglers (their replica differs, and the ones waiting for it), parameter servers
(asynchronous: each worker at its own pace; synchronous: the same step, but the servers' links
are reported as contended only when every worker's flow is simulated), and a kept timeline (a
trace draws every rank's spans).
"""

from __future__ import annotations

from simdist.analytic.stage import StepDescription


def simulated_fidelity(d: StepDescription, fidelity: str, keep_spans: bool, stragglers: bool) -> str:
    """The fidelity simulated for the one asked: "symmetric" for a full-fidelity step whose
    ranks all behave alike (one group per stage), else ``fidelity``."""
    if fidelity == "full" and not stragglers and not keep_spans and not d.plan.uses_parameter_servers:
        return "symmetric"
    return fidelity


def grouped_line(d: StepDescription) -> str:
    plan = d.plan
    return (f"full fidelity: {plan.world_size} ranks in {plan.pp} groups of ranks that behave alike (no "
            "straggler sets one apart), one tensor/context-parallel slice simulated per group: the "
            "answer of simulating every rank")
