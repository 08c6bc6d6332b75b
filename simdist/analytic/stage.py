"""The per-stage description: what one GPU of each pipeline stage does in one optimizer step and
what each piece costs alone, computed once and consumed by both engines.

:func:`describe` times every op list, collective and host transfer of the scenario once, on one
GPU alone (the cost model for compute, the alpha-beta model for the links, the host's figures
for offload and parameter servers), and lays the results out per stage
(:class:`StageDescription`). What overlaps with what is decided elsewhere: the closed form
(:mod:`simdist.analytic.steptime`) and the event engine's lowering (:mod:`simdist.sim.lowering`).

Stages of one *kind* (the same layers per model chunk and the same first/last role: the
embedding before virtual stage 0, the LM head after the last) are identical, so a deep
pipeline describes at most a handful: the first, the last, and the middle ones (two kinds of
middle stage when the layers do not divide evenly).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import cached_property, lru_cache

from simdist.analytic import fabric
from simdist.analytic.collectives import (
    CommContext,
    Network,
    collective_choice,
    collective_time,
    layout_for_axis,
)
from simdist.analytic.compression import compression_times
from simdist.analytic.cost import CostModel, grad_buffer_pass_bytes, optimizer_bytes_per_param
from simdist.analytic.cpu_optimizer import per_tensor_optimizer_time, ps_worker_time
from simdist.analytic.data_parallel import DataParallelTraffic
from simdist.analytic.dp_groups import data_parallel_traffic
from simdist.analytic.fsdp2 import (
    layer_params_on_rank,
    reduces_in_line,
    root_params_on_rank,
    runs_fsdp2,
)
from simdist.analytic.grad_accumulation import accumulation_time
from simdist.analytic.memory import (
    StageMemory,
    model_state_bytes,
    optimizer_shard_params,
    stage_memory,
    state_bytes,
)
from simdist.analytic.offload import OffloadTimes, OffloadTraffic, offload_times, offload_traffic
from simdist.analytic.ops import embedding_ops, head_ops
from simdist.analytic.overlap import compute_slowdown, grad_buckets
from simdist.analytic.param_server import (
    PSTimes,
    PSTraffic,
    ps_times,
    ps_traffic,
    server_update_time,
)
from simdist.analytic.params import (
    embedding_params,
    head_params,
    layers_params,
    mtp_params,
    params_per_rank,
)
from simdist.analytic.passes import ZERO_PASS, OpTimer, PassTime
from simdist.analytic.profile_terms import transfer_wait
from simdist.analytic.reducer import reducer_time
from simdist.analytic.runtime_memory import runtime_memory
from simdist.analytic.transport_wake import wake_tick_s
from simdist.analytic.variants import layer_ops, mtp_ops, recompute_ops
from simdist.frozen import frozen
from simdist.spec.frameworks import framework_of
from simdist.spec.layers import DENSE, LayerKind, kinds_of, model_kind_counts
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan
from simdist.spec.scenario import Scenario
from simdist.spec.stages import stage_chunks as spec_stage_chunks
from simdist.spec.stages import virtual_stages


@frozen(slots=True)
class Chunk:
    """One model chunk (virtual pipeline stage) held by a stage."""

    layers: int
    params: int  # parameters per GPU, after tensor parallelism
    first: bool  # virtual stage 0: the embedding runs before its first layer
    last: bool  # the last virtual stage: the LM head runs after its last layer
    layout: tuple[LayerKind, ...] = ()  # each layer's kind, in order (simdist.spec.layers)


@frozen(slots=True)
class LayerPasses:
    """One transformer layer, one micro-batch, on one GPU."""

    fwd: PassTime
    bwd: PassTime
    recompute: PassTime  # the forward that backward runs again (full, or the selective core)
    split_weight: PassTime = ZERO_PASS  # zero-bubble's weight-pass traversals, past virtual stage 0 (OpTimer.split_weight)


@frozen(slots=True)
class PipelineSend:
    """One activation (or its gradient) to the neighbouring virtual stage: Megatron's scatter/
    gather p2p, each TP rank sends 1/t of it and the receiver all-gathers it over TP (Narayanan
    et al. SC'21, sec 4.1)."""

    nbytes: float  # what each TP rank sends
    send_s: float  # the send alone on the pp axis's links
    gather_s: float  # the receiver's TP all-gather
    overlapped: bool = False  # the sender does not wait for its sends (Megatron's interleaved overlap_p2p_comm)
    wait_s: float = 0.0  # a calibration profile's wait per pipeline transfer (simdist.analytic.profile_terms.transfer_wait)
    wake_tick_s: float = 0.0  # the tick that delays isends on a CPU (simdist.analytic.transport_wake)

    @property
    def after_s(self) -> float:
        """The fixed time after the transfer itself: the gather and the measured wait."""
        return self.gather_s + self.wait_s


@frozen(slots=True)
class ServerTraffic:
    """One worker's parameter-server traffic in one step."""

    traffic: PSTraffic
    times: PSTimes
    buckets: int  # the gradient buckets it is pushed in
    update_s: float  # the busiest server node's CPU update of this stage, per step
    rtt: float  # a push and a pull: two inter-node latencies


@frozen
class StageDescription:
    """One GPU of one pipeline stage: its passes for one micro-batch through every chunk, its
    data-parallel, host and parameter-server traffic in one step (each piece timed alone), its
    compression kernels and its optimizer step."""

    chunks: tuple[Chunk, ...]
    fwd: PassTime
    bwd: PassTime
    recompute: PassTime
    dp: DataParallelTraffic  # every call timed alone on the links
    offload: OffloadTraffic
    offload_s: OffloadTimes
    ps: ServerTraffic | None
    compression_per_microbatch: float  # ZeRO-2/3: the kernels of every micro-batch's sync
    compression_per_step: float  # ZeRO-0/1 and parameter servers: the kernels of the one sync
    optimizer: float  # the optimizer step on the GPU (0 on the CPU or on the servers)
    accumulation: float = 0.0  # of bwd beyond its ops: the gradients' adds, DDP's reducer

    @property
    def layers(self) -> int:
        return sum(c.layers for c in self.chunks)

    @property
    def params(self) -> int:
        return sum(c.params for c in self.chunks)


@frozen(eq=False)
class StepDescription:
    """Every stage of one scenario, and the per-layer passes they share. ``stages[s]`` is stage
    s's description; stages of one kind share one object (``kinds``, ``kind_of``)."""

    scenario: Scenario
    cost: CostModel
    net: Network
    layer: LayerPasses  # the first layer's kind (every layer's, for a dense model)
    embedding: tuple[PassTime, PassTime]  # forward, backward (on the first stage)
    head: tuple[PassTime, PassTime]  # forward, backward (on the last stage)
    send: PipelineSend | None  # None without a pipeline
    kinds: tuple[StageDescription, ...]
    kind_of: tuple[int, ...]  # stage -> index into kinds
    layer_kinds: tuple[tuple[LayerKind, LayerPasses], ...] = ()  # every layer kind's passes

    @property
    def plan(self) -> ParallelPlan:
        return self.scenario.plan

    def passes(self, kind: LayerKind) -> LayerPasses:
        """The passes of one layer of ``kind``."""
        return next((p for k, p in self.layer_kinds if k == kind), self.layer)

    @cached_property
    def stages(self) -> tuple[StageDescription, ...]:
        return tuple(self.kinds[k] for k in self.kind_of)

    @cached_property
    def memory(self) -> tuple[StageMemory, ...]:
        """Memory per GPU of each stage (the micro-batches in flight differ from stage to stage;
        the model states only from one stage kind to another, and the runtime's not at all)."""
        m, plan, cluster = self.scenario.model, self.scenario.plan, self.scenario.cluster
        rt = runtime_memory(plan, cluster)
        states: dict[int, dict[str, float]] = {}  # per stage kind (read, not changed, by stage_memory)
        for s, k in enumerate(self.kind_of):
            if k not in states:
                states[k] = model_state_bytes(m, plan, s, cluster)
        return tuple(stage_memory(m, plan, s, cluster, states[k], rt) for s, k in enumerate(self.kind_of))


@frozen(slots=True)
class ModelPasses:
    """The passes of one micro-batch through each layer kind, the embedding and the LM head:
    what :func:`describe` times first. They read the plan's layer shapes and TP/CP/EP groups,
    not its schedule or ZeRO stage, so a search shares them between plans differing only there
    (simdist.search.evaluate)."""

    layer_kinds: tuple[tuple[LayerKind, LayerPasses], ...]
    embedding: tuple[PassTime, PassTime]  # forward, backward
    head: tuple[PassTime, PassTime]


def model_passes(sc: Scenario, cost: CostModel, net: Network) -> ModelPasses:
    m, plan = sc.model, sc.plan
    timer = OpTimer(sc, cost, net)
    kinds_passes = tuple((k, layer_passes(timer, k)) for k, _ in model_kind_counts(m))
    # FSDP2's root module (the embedding and the head) is gathered, and copied, once before the
    # forward, at the embedding, and once before the backward, which starts at the head (nothing
    # per micro-batch in a pipeline: OpTimer.fsdp2_copies)
    root = timer.fsdp2_copies(root_params_on_rank(m, plan))
    emb_copy, head_copy = (root[0], ZERO_PASS), (ZERO_PASS, root[1])
    embedding = (timer.passes(embedding_ops(m, plan, "fwd")) + emb_copy[0],
                 timer.passes(embedding_ops(m, plan, "bwd")) + emb_copy[1])
    head_bwd, mtp_bwd = head_ops(m, plan, "bwd"), mtp_ops(m, plan, "bwd")  # never on virtual stage 0: split_weight
    head = (timer.passes(head_ops(m, plan, "fwd")) + timer.passes(mtp_ops(m, plan, "fwd")) + head_copy[0],
            timer.passes(head_bwd) + timer.passes(mtp_bwd) + head_copy[1] + timer.split_weight(head_bwd + mtp_bwd))
    return ModelPasses(kinds_passes, embedding, head)


def describe(sc: Scenario, cost: CostModel, net: Network, per_kind: bool = True,
             passes_of: ModelPasses | None = None, sync_of: SyncOf | None = None) -> StepDescription:
    """Describe every stage of ``sc`` once per stage kind (see the module docstring);
    ``per_kind=False`` describes each stage on its own (the same result, more slowly);
    ``passes_of``: :func:`model_passes` of ``sc``, when the caller has them already;
    ``sync_of(ctx, stage)``: :func:`stage_sync` of ``sc``, the caller's (a search shares them)."""
    m, plan = sc.model, sc.plan
    mp = passes_of or model_passes(sc, cost, net)
    kinds_passes, embedding, head = mp.layer_kinds, mp.embedding, mp.head
    layer = kinds_passes[0][1]
    ctx = CommContext(sc.cluster, plan, net, lambda axis: fabric.slowdown(sc.cluster, plan, net, axis))
    passes = dict(kinds_passes)
    if per_kind:
        firsts, kind_of = _stage_kinds(m, plan.tp, plan.pp, plan.virtual_pipeline_stages, plan.schedule,
                                       plan.pipeline_layout)
    else:
        firsts, kind_of = tuple(range(plan.pp)), tuple(range(plan.pp))
    sync = sync_of or (lambda c, s: stage_sync(sc, c, cost, s))
    kinds = tuple(_describe_stage(sc, ctx, cost, passes, embedding, head, stage_chunks(sc, s), s, sync(ctx, s))
                  for s in firsts)
    send = pipeline_send(sc, net, transfer_wait(sc, cost), wake_tick_s(sc, cost.profile))
    return StepDescription(sc, cost, net, layer, embedding, head, send, kinds, kind_of, kinds_passes)


@lru_cache(maxsize=1024)
def _stage_kinds(m: ModelSpec, tp: int, p: int, v: int, schedule: str, layout: str | None = None
                 ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the first stage of each kind, the kind of every stage): stages whose chunks are alike
    (:func:`stage_chunks`) are one kind."""
    index: dict[tuple[Chunk, ...], int] = {}
    firsts, kind_of = [], []
    for s, chunks in enumerate(_stage_chunks(m, tp, p, v, schedule, layout)):
        k = index.get(chunks)
        if k is None:
            k = index[chunks] = len(firsts)
            firsts.append(s)
        kind_of.append(k)
    return tuple(firsts), tuple(kind_of)


def layer_passes(timer: OpTimer, kind: LayerKind = DENSE) -> LayerPasses:
    """A layer's forward and backward, and what recomputation runs again (ops.recompute_ops),
    for a layer of ``kind`` (simdist.analytic.variants)."""
    m, plan = timer.sc.model, timer.sc.plan
    bwd_ops = layer_ops(m, plan, "bwd", kind)
    fwd, bwd = timer.pair(layer_ops(m, plan, "fwd", kind), bwd_ops)
    copy_fwd, copy_bwd = timer.fsdp2_copies(layer_params_on_rank(m, plan, kind.moe))
    return LayerPasses(fwd + copy_fwd, bwd + copy_bwd, timer.recompute(recompute_ops(m, plan, kind)),
                       timer.split_weight(bwd_ops))


def stage_chunks(sc: Scenario, stage: int) -> tuple[Chunk, ...]:
    """The chunks of ``stage`` (Megatron's interleaved layout: chunk c is virtual stage c*pp + s;
    DualPipe and DualPipeV: simdist.spec.stages.stage_chunks)."""
    plan = sc.plan
    return _stage_chunks(sc.model, plan.tp, plan.pp, plan.virtual_pipeline_stages, plan.schedule,
                         plan.pipeline_layout)[stage]


@lru_cache(maxsize=1024)  # read only the model and the layout: a search's plans share them
def _stage_chunks(m: ModelSpec, tp: int, p: int, v: int, schedule: str, layout: str | None = None
                  ) -> tuple[tuple[Chunk, ...], ...]:
    n = virtual_stages(p, v, schedule)
    out = []
    for stage_chunk in spec_stage_chunks(m.num_layers, p, v, schedule, layout):
        chunks = []
        for vs, layers in stage_chunk:
            first, last = vs == 0, vs == n - 1
            count = layers_params(m, layers)
            if first:
                count = count + embedding_params(m)
            if last:
                count = count + head_params(m, separate_copy=p > 1) + mtp_params(m, p > 1)
            chunks.append(Chunk(len(layers), count.per_tp_rank(tp), first, last, kinds_of(m, layers)))
        out.append(tuple(chunks))
    return tuple(out)


def pipeline_send(sc: Scenario, net: Network, wait_s: float = 0.0, tick_s: float = 0.0) -> PipelineSend | None:
    """One micro-batch's activation between neighbouring virtual stages ([s/cp, b, h] per rank).
    With sequence parallelism the activation is already split over the TP ranks, so each sends
    its shard and nothing is gathered (Megatron-Core sends the [s/tp, b, h] tensor; torchtitan's
    stage outputs are sequence-sharded DTensors)."""
    m, plan = sc.model, sc.plan
    if plan.pp == 1:
        return None
    act = m.seq_length // plan.cp * plan.micro_batch_size * m.hidden_size * plan.element_bytes
    sent = act / plan.tp
    choice = collective_choice("sendrecv", sent, layout_for_axis(sc.cluster, plan, "pp"), net)
    worst = fabric.worst_p2p_slowdown(sc.cluster, plan)
    send = choice.latency_s + choice.transfer_s * worst  # every replica's pair sends at once
    gather = 0.0
    if plan.tp > 1 and not plan.sequence_parallel:
        gather = collective_time("allgather", act, layout_for_axis(sc.cluster, plan, "tp"), net)
    overlapped = plan.interleaved and framework_of(plan.framework).overlap_p2p
    return PipelineSend(sent, send, gather, overlapped, wait_s, tick_s)


def _describe_stage(sc: Scenario, ctx: CommContext, cost: CostModel, passes: dict[LayerKind, LayerPasses],
                    embedding: tuple[PassTime, PassTime], head: tuple[PassTime, PassTime],
                    chunks: tuple[Chunk, ...], stage: int,
                    sync: tuple[DataParallelTraffic, float]) -> StageDescription:
    """One stage kind, described through ``stage``, a stage of that kind."""
    m, plan, cluster = sc.model, sc.plan, sc.cluster
    layers = sum(c.layers for c in chunks)
    counts: dict[LayerKind, int] = {}
    for c in chunks:
        for k in c.layout:
            counts[k] = counts.get(k, 0) + 1
    accumulation = accumulation_time(sc, cost, stage) + reducer_time(sc, cost, stage)
    fwd = recompute = PassTime()
    bwd = PassTime(compute=accumulation, weight_grad=accumulation if plan.split_backward else 0.0)
    for k, n in counts.items():
        fwd, bwd, recompute = fwd + passes[k].fwd * n, bwd + passes[k].bwd * n, recompute + passes[k].recompute * n
    for k in (k for c in chunks if not c.first for k in c.layout):  # zero-bubble's weight-pass traversals
        bwd = bwd + passes[k].split_weight
    if any(c.first for c in chunks):
        fwd, bwd = fwd + embedding[0], bwd + embedding[1]
    if any(c.last for c in chunks):
        fwd, bwd = fwd + head[0], bwd + head[1]
    if plan.schedule == "dualpipe":  # a micro-batch runs one of the rank's two chunks (either way)
        fwd, bwd, recompute = fwd * 0.5, bwd * 0.5, recompute * 0.5
    offload = offload_traffic(m, plan, cluster, stage)
    ps = None
    if plan.uses_parameter_servers:
        tr = ps_traffic(m, plan, cluster, stage)
        ps = ServerTraffic(tr, ps_times(m, plan, cluster, ctx.net, stage), grad_buckets(tr.worker_bytes, plan),
                           server_update_time(m, plan, cluster, stage), 2 * ctx.net.inter_latency)
    per_mb, per_step = compression_times(m, plan, stage, max(1, sync[0].step_buckets), layers, cost)
    return StageDescription(
        chunks=chunks, fwd=fwd, bwd=bwd, recompute=recompute, dp=sync[0],
        offload=offload, offload_s=offload_times(offload, cluster, plan), ps=ps,
        compression_per_microbatch=per_mb, compression_per_step=per_step,
        optimizer=sync[1], accumulation=accumulation,
    )


SyncOf = Callable[[CommContext, int], tuple[DataParallelTraffic, float]]


def stage_sync(sc: Scenario, ctx: CommContext, cost: CostModel, stage: int) -> tuple[DataParallelTraffic, float]:
    """A stage's data-parallel traffic, each call timed alone, and its GPU optimizer step: they
    read the stage's parameters, the rank grid and the ZeRO stage, not the micro-batch's shape."""
    fsdp2 = runs_fsdp2(sc.plan, cost.profile)
    traffic = data_parallel_traffic(sc.model, sc.plan, stage, fsdp2).timed(ctx, compute_slowdown(cost.profile))
    traffic = replace(traffic, in_line=reduces_in_line(sc.plan, cost.profile))
    wait = cost.profile.dp_step_wait_s if cost.profile else 0.0
    if wait and traffic.step_grad_sync:  # the fixed wait once per step at the gradient sync (profile v5)
        *rest, last = traffic.step_grad_sync  # on its last calls: the training thread blocks on them
        each = wait / last.calls
        traffic = replace(traffic, step_grad_sync=(*rest, replace(last, seconds=last.seconds + each, wait_s=each)))
    return traffic, gpu_optimizer_time(sc, cost, stage)


def gpu_optimizer_time(sc: Scenario, cost: CostModel, stage: int) -> float:
    """The optimizer step on the GPU (fused multi-tensor kernels, HBM-bound; cost.py) over the
    GPU's optimizer partition: zero when the optimizer runs on the CPU (ZeRO-Offload) or on
    parameter servers."""
    plan = sc.plan
    if plan.uses_parameter_servers:  # a CPU profile's worker still copies per tensor (cpu_optimizer)
        return ps_worker_time(sc, cost.profile, stage)
    if plan.offload.optimizer != "none":
        return 0.0
    n = optimizer_shard_params(sc.model, plan, stage)
    traffic = n * optimizer_bytes_per_param(plan.optimizer, plan.precision, state_bytes(sc.model, plan).grads)
    traffic += grad_buffer_pass_bytes(params_per_rank(sc.model, plan, stage), plan)
    per_tensor = per_tensor_optimizer_time(sc, cost.profile, stage)  # a CPU profile's loop over tensors
    if per_tensor is not None:
        return cost.memory_time(traffic, kernels=0) + per_tensor
    return cost.memory_time(traffic, kernels=20)
