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
both have. An all-to-all hides only behind the compute node it is paired with (Megatron-Core's
combined 1F1B: :func:`simdist.analytic.moe.paired_hidden`), so the transfer also waits for the
task's compute that cannot run beside it (its pass time less the compute that hides it): the
task then takes its compute plus the exposed all-to-all, as in the closed form.
"""

from __future__ import annotations

from dataclasses import replace

from simdist.analytic.collectives import collective_time, layout_for_axis
from simdist.analytic.moe import dispatch_overlapped, wire_factor
from simdist.analytic.stage import Chunk, StepDescription
from simdist.analytic.variants import comm_bytes, layer_ops, mtp_ops, recompute_ops
from simdist.sim.work import CommSpec, Task, size_label


def _flow(d: StepDescription, nbytes: float, seconds: float, wait: float = 0.0) -> CommSpec | None:
    if nbytes <= 0:
        return None
    plan = d.plan
    kind = "allgather" if plan.moe_dispatcher == "allgather" else "alltoall"
    g = layout_for_axis(d.scenario.cluster, plan, "ep")
    nbytes *= wire_factor(d.scenario.model, plan, g)
    solo = collective_time(kind, nbytes, g, d.net)
    return CommSpec(f"{kind} ep {size_label(nbytes)}", kind, "ep", nbytes, max(0.0, seconds - solo) + wait)


def chunk_flows(d: StepDescription, chunk: Chunk, task_s: tuple[float, float] = (0.0, 0.0)
                ) -> tuple[CommSpec | None, CommSpec | None]:
    """(forward, backward) all-to-all transfer of one micro-batch through ``chunk``; backward
    includes the recomputed forward's. Overlapped, each also waits for the part of its task's
    ``task_s`` (forward, backward compute-stream seconds) that no all-to-all runs beside."""
    sc = d.scenario
    m, plan = sc.model, sc.plan
    if plan.ep == 1 or not m.is_moe:
        return None, None
    f_bytes = b_bytes = f_s = b_s = f_hide = b_hide = 0.0
    for kind in chunk.layout:
        passes = d.passes(kind)
        f_bytes += comm_bytes(layer_ops(m, plan, "fwd", kind), "ep")
        b_bytes += comm_bytes(layer_ops(m, plan, "bwd", kind), "ep") + comm_bytes(recompute_ops(m, plan, kind), "ep")
        f_s += passes.fwd.ep
        b_s += passes.bwd.ep + passes.recompute.ep
        f_hide += passes.fwd.ep_hide
        b_hide += passes.bwd.ep_hide + passes.recompute.ep_hide
    if chunk.last:
        f_bytes += comm_bytes(mtp_ops(m, plan, "fwd"), "ep")
        b_bytes += comm_bytes(mtp_ops(m, plan, "bwd"), "ep")
        f_s += d.head[0].ep
        b_s += d.head[1].ep
        f_hide += d.head[0].ep_hide
        b_hide += d.head[1].ep_hide
    return (_flow(d, f_bytes, f_s, max(0.0, task_s[0] - f_hide)),
            _flow(d, b_bytes, b_s, max(0.0, task_s[1] - b_hide)))


def attach_expert_flows(d: StepDescription, chunk: Chunk, tasks: dict[tuple[str, bool], Task]
                        ) -> dict[tuple[str, bool], Task]:
    """The chunk's tasks with their all-to-all transfers (forward on F, backward on B)."""
    overlap = dispatch_overlapped(d.plan)
    out = {}
    for key, task in tasks.items():
        if key[0] not in ("F", "B"):
            out[key] = task
            continue
        task_s = task.work.total() if overlap else 0.0
        fwd, bwd = chunk_flows(d, chunk, (task_s, task_s))
        spec = fwd if key[0] == "F" else bwd
        out[key] = replace(task, ep=spec, ep_overlap=overlap) if spec is not None else task
    return out
