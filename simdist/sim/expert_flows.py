"""The expert all-to-all as transfers on the event engine's network.

The closed form times a layer's dispatch and combine alone (:mod:`simdist.analytic.moe`); here
each task (one micro-batch through one chunk, forward or backward) puts the all-to-alls of all
its layers on the network as one transfer over the expert-parallel group, so that they share
the NICs and NVSwitch ports with the data-parallel and pipeline traffic of the moment (the
network backend's contention). Its solo time equals the closed form's sum: the bytes of every
all-to-all in one transfer, plus the latencies of the others as a fixed tail. Without overlap
the task waits for it (dispatch and combine sit between a layer's attention and its experts,
and between its experts and the next layer); with ``ep_comm_overlap`` or a DualPipe schedule it
runs beside the task's compute (another micro-batch's pass hides it) and the task ends when
both have.
"""

from __future__ import annotations

from dataclasses import replace

from simdist.analytic.collectives import collective_time, layout_for_axis
from simdist.analytic.moe import dispatch_overlapped, wire_factor
from simdist.analytic.stage import Chunk, StepDescription
from simdist.analytic.variants import comm_bytes, layer_ops, mtp_ops, recompute_ops
from simdist.sim.work import CommSpec, Task, size_label


def _flow(d: StepDescription, nbytes: float, seconds: float) -> CommSpec | None:
    if nbytes <= 0:
        return None
    plan = d.plan
    kind = "allgather" if plan.moe_dispatcher == "allgather" else "alltoall"
    g = layout_for_axis(d.scenario.cluster, plan, "ep")
    nbytes *= wire_factor(d.scenario.model, plan, g)
    solo = collective_time(kind, nbytes, g, d.net)
    return CommSpec(f"{kind} ep {size_label(nbytes)}", kind, "ep", nbytes, max(0.0, seconds - solo))


def chunk_flows(d: StepDescription, chunk: Chunk) -> tuple[CommSpec | None, CommSpec | None]:
    """(forward, backward) all-to-all transfer of one micro-batch through ``chunk``; backward
    includes the recomputed forward's."""
    sc = d.scenario
    m, plan = sc.model, sc.plan
    if plan.ep == 1 or not m.is_moe:
        return None, None
    f_bytes = b_bytes = f_s = b_s = 0.0
    for kind in chunk.layout:
        passes = d.passes(kind)
        f_bytes += comm_bytes(layer_ops(m, plan, "fwd", kind), "ep")
        b_bytes += comm_bytes(layer_ops(m, plan, "bwd", kind), "ep") + comm_bytes(recompute_ops(m, plan, kind), "ep")
        f_s += passes.fwd.ep
        b_s += passes.bwd.ep + passes.recompute.ep
    if chunk.last:
        f_bytes += comm_bytes(mtp_ops(m, plan, "fwd"), "ep")
        b_bytes += comm_bytes(mtp_ops(m, plan, "bwd"), "ep")
        f_s += d.head[0].ep
        b_s += d.head[1].ep
    return _flow(d, f_bytes, f_s), _flow(d, b_bytes, b_s)


def attach_expert_flows(d: StepDescription, chunk: Chunk, tasks: dict[tuple[str, bool], Task]
                        ) -> dict[tuple[str, bool], Task]:
    """The chunk's tasks with their all-to-all transfers (forward on F, backward on B)."""
    fwd, bwd = chunk_flows(d, chunk)
    if fwd is None and bwd is None:
        return tasks
    overlap = dispatch_overlapped(d.plan)
    out = {}
    for key, task in tasks.items():
        spec = fwd if key[0] == "F" else bwd if key[0] == "B" else None
        out[key] = replace(task, ep=spec, ep_overlap=overlap) if spec is not None else task
    return out
