"""Lowering: a described step (:mod:`simdist.analytic.stage`) -> the work of each pipeline stage
(:mod:`simdist.sim.work`) for the event engine. Pure, no events, and no timing of its own: every
length and byte count comes from the description, which the closed form reduces too.

Each (micro-batch, chunk) action of the pipeline schedule becomes one task on the stage's
compute stream: a chunk's layers aggregated into one task, the exposed TP/CP communication kept
as its own figure. Under ZeRO-3 a task is split per layer, because each layer waits for its own
parameter all-gather.

Communication that the engine puts on the network is described, not timed, here
(:class:`~simdist.sim.work.CommSpec`): pipeline sends (Megatron's scatter/gather p2p), and the
data-parallel collectives of the description's :class:`~simdist.analytic.data_parallel.
DataParallelTraffic` (ZeRO-0/1/2/3, FSDP/HSDP, ZeRO++ quantized gathers, compressed gradients),
attached to the tasks that make them ready:

- gradient sync once per step (DDP all-reduce, ZeRO-1 reduce-scatter) in ``ddp_bucket_size``
  buckets filled as each chunk's last backward runs (PyTorch DDP, Li et al. VLDB 2020;
  Megatron's overlapped grad reduce), or after the pipeline flush without ``overlap_grad_reduce``;
- ZeRO-2/3: every micro-batch's per-layer gradient reduce-scatter as backward produces it;
- ZeRO-3 / FSDP: each layer's parameter all-gathers before its forward and its backward (again
  for the recomputed forward), prefetched one layer ahead (Zhao et al. VLDB 2023, sec 3.3.2);
- ZeRO-1/2: the updated parameters all-gathered after the optimizer (with Megatron's
  ``--overlap-param-gather``, bucket by bucket behind the next step's first forward).

The mechanisms beyond 3D parallelism come from the same description:

- offload (its traffic and solo seconds): each GPU's PCIe copies
  (:class:`~simdist.sim.work.HostXfer`): gradient partitions down after each layer's reduction
  (ZeRO-2/3, every micro-batch) or after each bucket (ZeRO-0/1, once per step); parameter shards
  up before each layer's gather (ZeRO-Infinity / FSDP parameter offload, with the NVMe reads that
  feed them); after the last backward, the CPU optimizer step, the upload of the updated
  parameters and the NVMe swap of the states, which DeepSpeed pipelines tile by tile, as
  concurrent work on the node's CPU, the GPU's PCIe link and the node's NVMe (shared by the
  node's GPUs);
- parameter servers: per gradient bucket a push to the servers, their optimizer update on the
  servers' CPUs and a pull of the parameters (:class:`~simdist.sim.work.PsSpec`), issued as
  backward fills the buckets;
- gradient compression: the kernels as GPU work inside the backward that produces the gradients
  (``Work``'s ``compression``), before the smaller collectives the traffic already lists (top-k
  as an all-gather, PowerSGD as the P and Q all-reduces of each bucket).

Stages of one kind share their chunks' tasks; only the schedule's actions differ per stage.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from simdist.analytic.collectives import CollectiveCall, node_gpus
from simdist.analytic.data_parallel import (
    DataParallelTraffic,
    contention_stretch,
    gather_unit,
)
from simdist.analytic.ops import Comm, Op
from simdist.analytic.passes import ZERO_PASS, PassTime
from simdist.analytic.stage import Chunk, StageDescription, StepDescription
from simdist.analytic.variants import layer_ops
from simdist.sim.actions import StageActions, stage_actions
from simdist.sim.expert_flows import attach_expert_flows
from simdist.sim.synced_fetch import first_of_layers, synced_pieces, synced_segments
from simdist.sim.work import (
    ChunkWork,
    CommSpec,
    GradPiece,
    HostXfer,
    Lowered,
    PsSpec,
    StageWork,
    Task,
    Work,
    comm,
    size_label,
)
from simdist.spec.layers import DENSE
from simdist.spec.plan import ParallelPlan
from simdist.spec.scenario import Scenario


@dataclass(frozen=True)
class StageSystems:
    """What the mechanisms beyond 3D add to one stage's work, as host transfers and seconds."""

    down_per_layer: HostXfer | None = None  # ZeRO-2/3 + optimizer offload, every micro-batch
    up_fwd_per_layer: HostXfer | None = None  # parameter offload: before each forward gather
    up_bwd_per_layer: HostXfer | None = None  # ... and each backward (and recompute) gather
    down_per_step: HostXfer | None = None  # ZeRO-0/1 + optimizer offload: the gradients, once
    host_step: HostXfer | None = None
    host_after_optimizer: HostXfer | None = None
    compression_per_microbatch: float = 0.0  # ZeRO-2/3: kernels of every micro-batch's sync
    compression_per_step: float = 0.0  # ZeRO-0/1 and parameter servers: kernels of the one sync
    accumulation: float = 0.0  # the gradients' adds, DDP's reducer (StageDescription)
    down_buckets: int = 1  # buckets of down_per_step when no collective sets them (dp = 1)
    ps_bytes: float = 0.0  # parameter servers: one worker rank's push (= its pull) per step
    ps_buckets: int = 0  # buckets it is pushed in (0: no parameter servers)
    ps_update_s: float = 0.0  # the busiest server node's CPU update of the stage, per step


# --- helpers ------------------------------------------------------------------------------


def calls(entries: tuple[CollectiveCall, ...], per: int = 1, share: float = 1.0) -> tuple[CommSpec, ...]:
    """The collectives of one of ``per`` equal pieces (a layer, a bucket) of ``entries``' calls,
    bytes scaled by ``share``: e.g. one layer of a ZeRO-3 gather issued calls/layers times."""
    out: list[CommSpec] = []
    for e in entries:
        n = max(1, round(e.calls / per))
        out += [comm(e.kind, e.axis, e.bytes * share * e.calls / per / n, e.wait_s)] * n
    return tuple(out)


def tp_label(ops: tuple[Op, ...], times: int) -> str:
    """Name of a task's TP/CP traffic, e.g. "allreduce tp 288 MiB"."""
    comms = [op for op in ops if isinstance(op, Comm) and op.axis != "ep"]
    if not comms:
        return ""
    kind = Counter(op.collective for op in comms).most_common(1)[0][0]
    axis = "cp" if all(op.axis == "cp" for op in comms) else "tp"
    return f"{kind} {axis} {size_label(sum(op.bytes for op in comms) * times)}"


def _work(p: PassTime, recompute: PassTime = ZERO_PASS, drop_weight_grad: bool = False) -> Work:
    """A pass as compute-stream work; its expert all-to-all goes on the network instead
    (simdist.sim.expert_flows)."""
    compute = p.compute - (p.weight_grad if drop_weight_grad else 0.0)
    return Work(compute, recompute.compute, p.tp_exposed + recompute.tp_exposed,
                sync=p.sync_wait + recompute.sync_wait, cp=p.cp_exposed + recompute.cp_exposed)


# --- the stage's work ---------------------------------------------------------------------


def lower(d: StepDescription, microbatches: int | None = None) -> Lowered:
    """The work of every pipeline stage for one optimizer step of the described scenario
    (``microbatches`` micro-batches per pipeline instead of the plan's: the shortened step that
    :mod:`simdist.sim.engine.periodic` extends)."""
    plan = d.plan
    split = plan.split_backward
    m = plan.num_microbatches if microbatches is None else microbatches
    sched = stage_actions(plan.schedule, plan.pp, m, plan.virtual_pipeline_stages, split, plan.dualpipe)
    kinds = [_kind_work(d, s, split) for s in d.kinds]
    stages = tuple(replace(kinds[d.kind_of[stage]], stage=stage, schedule=actions)
                   for stage, actions in enumerate(sched))
    return Lowered(stages, split, tuple(_notes(d.scenario)))


NO_ACTIONS = StageActions((), (), (), ())  # a stage kind's work, before its stages' actions are filled in


def _kind_work(d: StepDescription, s: StageDescription, split: bool) -> StageWork:
    """The work of every stage of one kind (its schedule's actions are filled in per stage)."""
    plan = d.plan
    traffic = s.dp
    extra = stage_systems(d, s)
    total = sum(c.params for c in s.chunks)
    chunks = tuple(_chunk(d, c, i, split, traffic, extra, c.params / total) for i, c in enumerate(s.chunks))
    if plan.overlap_grad_reduce and traffic.step_grad_sync and not plan.interleaved:
        # the last backward runs slower beside the buckets it reduces, by the closed form's seconds
        t_bwd = s.bwd.total + s.recompute.total
        stretch = contention_stretch(traffic, plan, s.fwd.total, t_bwd)[0]
        chunks = tuple(_slowed(cw, stretch * c.params / total, "W" if split else "B")
                       for cw, c in zip(chunks, s.chunks, strict=True))
    flush: tuple[GradPiece, ...] = ()
    flush_compression = 0.0
    if not plan.overlap_grad_reduce:  # one sync of the whole buffer after the pipeline flush
        comms: tuple[CommSpec | PsSpec, ...] = calls(traffic.step_grad_sync)
        if extra.ps_buckets:
            comms += (_ps_spec(extra, (0, 0), 1.0),)
        if comms or extra.down_per_step:
            flush = (GradPiece(0, 1.0, comms, extra.down_per_step),)
        flush_compression = extra.compression_per_step
    first_forward = sum(c.task("F", False).work.total() for c in chunks)
    forward_stretch = contention_stretch(traffic, plan, s.fwd.total, s.bwd.total + s.recompute.total)[1]
    return StageWork(-1, chunks, NO_ACTIONS, flush, s.optimizer, calls(traffic.post_step_gathers),
                     traffic.post_step_behind_forward, first_forward, flush_compression, extra.host_step,
                     extra.host_after_optimizer, forward_stretch, d.send.wake_tick_s if d.send is not None else 0.0)


def stage_systems(d: StepDescription, s: StageDescription) -> StageSystems:
    """Offload transfers, parameter-server buckets and compression kernels of one GPU of a stage,
    from the description (each resource's solo seconds become a transfer of its own)."""
    plan, cluster = d.plan, d.scenario.cluster
    out: dict[str, object] = {}
    if s.offload.used and cluster.host is not None:
        out.update(_offload_work(plan, node_gpus(cluster), s))
    out["compression_per_microbatch"] = s.compression_per_microbatch
    out["compression_per_step"] = s.compression_per_step
    out["accumulation"] = s.accumulation
    if s.ps is not None:
        out["ps_bytes"] = s.ps.traffic.worker_bytes
        out["ps_buckets"] = s.ps.buckets
        out["ps_update_s"] = s.ps.update_s
    return StageSystems(**out)  # type: ignore[arg-type]


def _offload_work(plan: ParallelPlan, gpn: int, s: StageDescription) -> dict[str, object]:
    """Host transfers of one GPU; the node's resources (NVMe, CPU) as one GPU's share: the
    engine adds up the node's GPUs."""
    t = s.offload_s
    layers = max(1, s.offload.gather_chunks)

    def xfer(name: str, *parts: tuple[str, float]) -> HostXfer | None:
        kept = tuple(p for p in parts if p[1] > 0)
        return HostXfer(name, kept) if kept else None

    out: dict[str, object] = {}
    out["down_per_layer"] = xfer("gradients to host", ("pcie_down", t.pcie_down_per_microbatch / layers))
    up = xfer(f"parameters from {plan.offload.params}", ("pcie_up", t.pcie_up_per_microbatch),
              ("nvme", t.nvme_per_microbatch / gpn))
    if up is not None:  # one forward gather and (gathers - 1) in backward, per layer
        gathers = s.offload.gathers
        out["up_fwd_per_layer"] = up.scaled(1 / (gathers * layers))
        out["up_bwd_per_layer"] = up.scaled((gathers - 1) / (gathers * layers))
    nvme_step = t.nvme_per_step / gpn
    if plan.offload.optimizer != "none":
        out["down_per_step"] = xfer("gradients to host", ("pcie_down", t.pcie_down_per_step))
        out["down_buckets"] = s.offload.down_buckets
        out["host_step"] = xfer("CPU optimizer step", ("cpu", t.cpu_step / gpn), ("pcie_up", t.pcie_up_per_step),
                                ("nvme", nvme_step))
    else:  # the GPU optimizer's updated parameter shard goes back to the host (and NVMe)
        out["host_after_optimizer"] = xfer("updated parameters to host", ("pcie_down", t.pcie_down_per_step),
                                           ("nvme", nvme_step))
    return out


def _ps_spec(extra: StageSystems, key: tuple[int, int], share: float) -> PsSpec:
    nbytes = extra.ps_bytes * share
    return PsSpec(f"push+pull ps {size_label(nbytes)}", key, nbytes, extra.ps_update_s * share)


def _chunk(d: StepDescription, chunk: Chunk, index: int, split: bool, traffic: DataParallelTraffic,
           extra: StageSystems, share: float) -> ChunkWork:
    """One chunk's tasks (per layer; the embedding and the head join its first / last layer; a
    chunk without layers, plan.pipeline_layout's ``E`` or ``mL`` alone, one empty slot for them)."""
    plan, layer = d.plan, d.layer
    n = chunk.layers
    kinds = [d.passes(k) for k in chunk.layout] if chunk.layout else [layer] * n
    fwd = [_work(k.fwd) for k in kinds] or [Work()]
    bwd = [_work(k.bwd, k.recompute, split) for k in kinds] or [Work()]
    wgt = [Work(k.bwd.weight_grad) for k in kinds] or [Work()]
    if split and not chunk.first and kinds:  # zero-bubble's weight-pass traversals (OpTimer.split_weight)
        wgt = [w + Work(k.split_weight.compute, sync=k.split_weight.sync_wait) for w, k in zip(wgt, kinds, strict=True)]
    if chunk.first:
        emb_fwd, emb_bwd = d.embedding
        fwd[0] = fwd[0] + _work(emb_fwd)
        bwd[-1] = bwd[-1] + _work(emb_bwd, drop_weight_grad=split)
        wgt[-1] = wgt[-1] + Work(emb_bwd.weight_grad)
    if chunk.last:
        head_fwd, head_bwd = d.head
        fwd[-1] = fwd[-1] + _work(head_fwd)
        bwd[0] = bwd[0] + _work(head_bwd, drop_weight_grad=split)
        wgt[0] = wgt[0] + Work(head_bwd.weight_grad)
    if extra.compression_per_microbatch or extra.accumulation:  # as each layer's gradients come
        per_layer = Work(compute=extra.accumulation * share / len(fwd),
                         compression=extra.compression_per_microbatch * share / len(fwd))
        if split:
            wgt = [w + per_layer for w in wgt]
        else:
            bwd = [w + per_layer for w in bwd]
    m = d.scenario.model
    first = chunk.layout[0] if chunk.layout else DENSE
    labels = (tp_label(layer_ops(m, plan, "fwd", first), n), tp_label(layer_ops(m, plan, "bwd", first), n))
    tasks = attach_expert_flows(d, chunk, _tasks(plan, fwd, bwd, wgt, split, labels, traffic, extra, index, share))
    send = None
    if d.send is not None:
        send = comm("sendrecv", "pp", d.send.nbytes, d.send.after_s)
    return ChunkWork(tasks, None if chunk.last else send, None if chunk.first else send, n,
                     send_async=d.send is not None and (d.send.overlapped or d.send.wake_tick_s > 0))


def _tasks(plan: ParallelPlan, fwd: list[Work], bwd: list[Work], wgt: list[Work], split: bool,
           labels: tuple[str, str], traffic: DataParallelTraffic, extra: StageSystems, chunk: int,
           share: float) -> dict[tuple[str, bool], Task]:
    """A chunk's tasks with the data-parallel (or parameter-server) traffic and host copies they
    start or wait for; ``share`` is the chunk's part of the stage's parameters. Per-layer traffic
    is listed per stage layer."""
    producer = "W" if split else "B"  # the task that produces the weight gradients
    f_label, b_label = labels
    layers, per = len(fwd), max(1, traffic.gather_chunks)
    down = extra.down_per_layer
    if traffic.fwd_gathers or extra.up_fwd_per_layer:  # ZeRO-3: per layer, each waiting for its parameters
        rs = calls(traffic.microbatch_grad_sync, per=per)
        pieces = tuple(GradPiece(k, 1.0, rs, down) for k in range(layers)) if rs or down else ()
        up_f = (extra.up_fwd_per_layer,) * layers if extra.up_fwd_per_layer else ()
        up_b = (extra.up_bwd_per_layer,) * layers if extra.up_bwd_per_layer else ()
        # without overlap_param_gather nothing is prefetched and every reduction is waited for
        # (data_parallel.dp_times charges all of it)
        lap = plan.overlap_param_gather or not traffic.fwd_gathers
        seg_f, g_f = tuple(fwd), (calls(traffic.fwd_gathers, per=per),) * layers
        seg_b, g_b = tuple(bwd), (calls(traffic.bwd_gathers, per=per),) * layers
        if gather_unit(plan) == "module_sync" and traffic.fwd_gathers:  # one submodule ahead
            seg_f, g_f, at_f = synced_segments(fwd, tuple(calls((c,), per=per) for c in traffic.fwd_gathers), False)
            seg_b, g_b, at_b = synced_segments(bwd, tuple(calls((c,), per=per) for c in traffic.bwd_gathers), True)
            up_f, up_b = (first_of_layers(up_f, at_f, len(seg_f)), first_of_layers(up_b, at_b, len(seg_b)))
            if not split and pieces:  # each submodule's gradients reduce-scattered as it ends
                k, total = len(traffic.fwd_gathers), sum(c.bytes for c in traffic.fwd_gathers)
                rs_parts = tuple(calls(traffic.microbatch_grad_sync, per=per * k, share=k * c.bytes / total)
                                 for c in traffic.fwd_gathers)
                pieces = synced_pieces(rs_parts, down, at_b)
        waits = traffic.in_line or not lap  # each layer's reductions waited for before the next
        tasks = {
            ("F", False): Task(seg_f, g_f, (), f_label, uploads=up_f, overlapped=lap),
            ("B", False): Task(seg_b, g_b, () if split else pieces, b_label, drain=bool(pieces) and not split,
                               uploads=up_b, overlapped=lap, in_line=waits),
        }
        if split:
            tasks[("W", False)] = Task(tuple(wgt), (), pieces, drain=bool(pieces), overlapped=lap, in_line=waits)
        return tasks
    whole = {"F": Task((_sum(fwd),), (), (), f_label), "B": Task((_sum(bwd),), (), (), b_label)}
    if split:
        whole["W"] = Task((_sum(wgt),))
    tasks = {(k, False): t for k, t in whole.items()}
    if traffic.microbatch_grad_sync or down:  # ZeRO-2: each layer's gradients as backward produces them
        one = calls(traffic.microbatch_grad_sync, per=per)
        if traffic.in_line:  # each layer's reduction waited for as it ends
            layered = replace(whole[producer], segments=tuple(wgt if split else bwd), in_line=True)
            tasks[(producer, False)] = _with_pieces(layered, tuple(GradPiece(k, 1.0, one, down) for k in range(layers)),
                                                    drain=True)
        else:
            pieces = tuple(GradPiece(0, (k + 1) / layers, one, down) for k in range(layers))
            tasks[(producer, False)] = _with_pieces(whole[producer], pieces, drain=True)
    elif plan.overlap_grad_reduce and (traffic.step_grad_sync or extra.ps_buckets or extra.down_per_step):
        # the last micro-batch's buckets: DDP all-reduces, parameter-server pushes, host copies
        nb = traffic.step_buckets if traffic.step_grad_sync else extra.ps_buckets or extra.down_buckets
        mine = max(1, round(nb * share))  # this chunk's buckets
        bucket = calls(traffic.step_grad_sync, per=nb, share=nb * share / mine)
        dn = extra.down_per_step.scaled(share / mine) if extra.down_per_step else None
        pieces = tuple(GradPiece(0, 1.0 if traffic.in_line else (k + 1) / mine,
                                 bucket + ((_ps_spec(extra, (chunk, k), share / mine),) if extra.ps_buckets else ()), dn)
                       for k in range(mine))
        task = replace(_with_pieces(whole[producer], pieces), in_line=traffic.in_line)  # in line: after backward
        if extra.compression_per_step:  # the buckets' compression kernels, as backward fills them
            seg = task.segments[0] + Work(compression=extra.compression_per_step * share)
            task = replace(task, segments=(seg,))
        tasks[(producer, True)] = task
    return tasks


def _slowed(cw: ChunkWork, seconds: float, producer: str) -> ChunkWork:
    """``cw`` with the task that fills the step's gradient buckets ``seconds`` longer, more
    compute in each segment in proportion to its length (simdist.analytic.overlap.
    contended_buckets)."""
    task = cw.tasks.get((producer, True))
    length = sum(w.total() for w in task.segments) if task is not None else 0.0
    if task is None or seconds <= 0 or length <= 0:
        return cw
    segs = tuple(w + Work(seconds * w.total() / length) for w in task.segments)
    return replace(cw, tasks={**cw.tasks, (producer, True): replace(task, segments=segs)})


def _with_pieces(task: Task, pieces: tuple[GradPiece, ...], drain: bool = False) -> Task:
    return replace(task, pieces=pieces, drain=drain)


def _sum(works: list[Work]) -> Work:
    out = Work()
    for w in works:
        out = out + w
    return out


def _notes(sc: Scenario) -> list[str]:
    plan = sc.plan
    out: list[str] = []
    if plan.uses_parameter_servers:
        mode = "no barrier: each worker pushes, the servers apply it at once, it pulls and goes on" \
            if plan.async_parameter_servers else \
            "each bucket updated once every worker pushed it, then pulled"
        out.append(f"parameter servers: gradient buckets pushed during the last backward through the NICs to the "
                   f"servers' nodes, applied on their CPUs, pulled back ({mode})")
    if plan.offload.any and sc.cluster.host is not None:
        out.append("offload: PCIe copies per GPU beside compute, the node's NVMe and CPU shared by its GPUs; "
                   "the CPU step, parameter upload and NVMe swap run together (tile pipeline)")
    if plan.grad_compression.enabled and plan.dp > 1:
        out.append("gradient compression kernels run on the compute stream as backward produces the gradients")
    if plan.dp == 1 or plan.uses_parameter_servers:
        return out
    if plan.shards_params:
        out.append("ZeRO-3/FSDP: per-layer parameter all-gathers (prefetched one layer ahead) and "
                   "gradient reduce-scatters")
    elif plan.shards_gradients:
        out.append("ZeRO-2: every micro-batch's gradients reduce-scattered layer by layer during its backward")
    elif plan.overlap_grad_reduce:
        out.append(f"gradient sync in {size_label(plan.ddp_bucket_size_bytes)} buckets overlapping each "
                   "chunk's last backward")
    else:
        out.append("gradient sync after the pipeline flush (no overlap)")
    return out

