"""Data-parallel traffic (DDP, ZeRO-1/2/3, FSDP/HSDP, ZeRO++, compressed syncs) and how much of
it backward and forward hide.

:func:`dp_traffic` lists every data-parallel collective of one GPU of a stage in one step,
grouped by when it runs (:class:`DataParallelTraffic`); the per-stage description
(:mod:`simdist.analytic.stage`) times each call alone on the links, the event engine puts the
same calls on its network, and :func:`dp_times` is the closed form's overlap of them.
"""

from __future__ import annotations

from dataclasses import replace

from simdist.analytic.collectives import CollectiveCall, CommContext, calls_seconds
from simdist.analytic.compression import (
    grad_wire_bytes,
    param_wire_bytes,
    powersgd_elements,
    topk_elements,
    topk_wire_bytes,
    uncompressed_grad_bytes,
)
from simdist.analytic.overlap import (
    bucketed_exposed,
    chunked_buckets_exposed,
    contended_buckets,
    contended_prefetch,
    grad_buckets,
    prefetch_exposed,
)
from simdist.analytic.params import params_per_rank, stage_num_layers
from simdist.analytic.zero3_sync import submodule_shares, synced_exposed
from simdist.frozen import frozen
from simdist.spec.frameworks import framework_of
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan


def zero3_modules_per_layer(m: ModelSpec) -> int:
    """Submodules with parameters in a layer: two norms, QKV, output projection, MLP linears."""
    return 4 + (3 if m.mlp == "swiglu" else 2)


def gather_unit(plan: ParallelPlan) -> str:
    """What one all-gather fetches: ``zero3_fetch`` under ZeRO-3; FSDP2's ZeRO-2 (the executor's)
    gathers whole modules, as its ``fully_shard`` wraps them (executor.parallelize)."""
    return plan.zero3_fetch if plan.shards_params else "layer"


def param_gathers_per_microbatch(plan: ParallelPlan, fsdp2: bool) -> int:
    """Times a micro-batch needs each layer's full parameters (ZeRO-3 / FSDP gathers, parameter
    offload uploads): its forward, its backward, and the recomputed forward under full
    recompute, except under FSDP2 (``fsdp2``: simdist.analytic.fsdp2.runs_fsdp2), whose
    pre-forward hook does not gather again in the pre-backward state."""
    return 3 if plan.recompute == "full" and not fsdp2 else 2


@frozen(slots=True)
class DataParallelTraffic:
    """Every data-parallel collective of one GPU of one stage in one step, grouped by when it
    runs. Bytes are per call, after quantization / compression.

    - ``fwd_gathers``: per micro-batch, parameter all-gathers before each layer's forward
      (ZeRO-3/FSDP), ``gather_chunks`` pieces prefetched one ahead;
    - ``bwd_gathers``: per micro-batch, the all-gathers again for backward (and for the
      recomputed forward under full recompute);
    - ``microbatch_grad_sync``: per micro-batch, the gradient reduce-scatter (ZeRO-2/3) and, under
      hybrid sharding, the all-reduce of the shard across replicas, per layer;
    - ``step_grad_sync``: once per step, during the last micro-batch's backward (DDP all-reduce,
      ZeRO-1 reduce-scatter, compressed syncs), issued as ``step_buckets`` buckets (each call list
      divided evenly: one bucket = one call of each entry);
    - ``post_step_gathers``: after the optimizer, the updated parameter shards all-gathered
      (ZeRO-1/2); with ``post_step_behind_forward`` (Megatron's distributed optimizer with
      ``--overlap-param-gather``) one all-gather per bucket, each issued ahead of the next
      step's forward of the layers it holds.
    """

    fwd_gathers: tuple[CollectiveCall, ...] = ()
    bwd_gathers: tuple[CollectiveCall, ...] = ()
    microbatch_grad_sync: tuple[CollectiveCall, ...] = ()
    step_grad_sync: tuple[CollectiveCall, ...] = ()
    post_step_gathers: tuple[CollectiveCall, ...] = ()
    gather_chunks: int = 1
    step_buckets: int = 1
    post_step_behind_forward: bool = False
    # how much slower compute runs beside these collectives (overlap.compute_slowdown; set by timed)
    contention: float = 0.0
    # the backward waits for each micro-batch reduction as it is issued (FSDP2 on a CPU:
    # simdist.analytic.fsdp2.reduces_in_line), instead of running on beside it
    in_line: bool = False

    def step_bytes(self, microbatches: int) -> float:
        """Bytes this GPU puts into DP collectives per step (sum of buffer sizes)."""
        per_mb = sum(c.total_bytes for c in self.fwd_gathers + self.bwd_gathers + self.microbatch_grad_sync)
        once = sum(c.total_bytes for c in self.step_grad_sync + self.post_step_gathers)
        return microbatches * per_mb + once

    def timed(self, ctx: CommContext, contention: float) -> DataParallelTraffic:
        """The same traffic with the seconds of each call alone on the links, and the slowdown
        of the compute beside them (:func:`simdist.analytic.overlap.compute_slowdown`)."""
        return replace(self, contention=contention, fwd_gathers=ctx.timed(self.fwd_gathers), bwd_gathers=ctx.timed(self.bwd_gathers),
                       microbatch_grad_sync=ctx.timed(self.microbatch_grad_sync),
                       step_grad_sync=ctx.timed(self.step_grad_sync),
                       post_step_gathers=ctx.timed(self.post_step_gathers))


def dp_traffic(m: ModelSpec, plan: ParallelPlan, stage: int, n: int | None = None,
               fsdp2: bool = False) -> DataParallelTraffic:
    """The DP collectives of one GPU of ``stage`` in one optimizer step (allreduce mode; the
    parameter-server modes use :func:`simdist.analytic.param_server.ps_traffic` instead).

    Hybrid sharding (``dp_shard`` < dp: FSDP HYBRID_SHARD / HSDP, Zhao et al. VLDB 2023 sec 3.2.2;
    ZeRO++ hpZ, Wang et al. 2023 sec 4.2): parameters are gathered and gradients reduce-scattered
    inside the shard group (one node when dp_shard <= GPUs per node), and the shard's gradients
    all-reduced across the dp/dp_shard replicas.
    ZeRO stages (Rajbhandari et al. SC'20 sec 5): 0 all-reduces the gradients once per step;
    1 reduce-scatters them once per step and all-gathers the updated parameters; 2 reduce-scatters
    every micro-batch's gradients; 3 also all-gathers each layer's parameters before its forward
    and backward, per layer (FSDP units) or per submodule (DeepSpeed ``zero3_fetch: module``).
    ``n``: the parameters synchronised (default: all the GPU holds; simdist.analytic.dp_groups
    passes the dense and the expert parameters apart); ``fsdp2``: ZeRO-2/3 runs as FSDP2
    (simdist.analytic.fsdp2.runs_fsdp2: no gather for the recomputed forward; ZeRO-2 gathers
    before each micro-batch's forward; in a pipeline, gathered and reduced once a step as
    :func:`_fsdp_under_pipeline` says).
    """
    if plan.dp == 1 or plan.uses_parameter_servers:
        return DataParallelTraffic()
    n = params_per_rank(m, plan, stage) if n is None else n
    ax = plan.shard_axis
    hybrid = plan.hybrid_sharding
    shard = plan.dp_shard
    layers = max(1, stage_num_layers(m, plan, stage))
    method = plan.grad_compression.method

    if reduced_once_under_pipeline(plan, fsdp2):
        return _fsdp_under_pipeline(plan, n, layers)
    if plan.shards_gradients:
        gb = grad_wire_bytes(plan, sharded=True)
        grad_bytes = n * gb
        post: tuple[CollectiveCall, ...] = ()
        if not plan.shards_params and not fsdp2:  # ZeRO-2 (FSDP2's runs as ZeRO-3 without backward gathers)
            sync = [CollectiveCall("reducescatter grads", "reducescatter", ax, grad_bytes / layers, layers)]
            if hybrid:
                sync.append(CollectiveCall("allreduce grads across replicas", "allreduce", "dp_replica",
                                           grad_bytes / shard / layers, layers))
            if plan.axis_size(ax) > 1:
                post = (CollectiveCall("allgather params", "allgather", ax, n * float(plan.element_bytes)),)
            return DataParallelTraffic(microbatch_grad_sync=tuple(sync), post_step_gathers=post,
                                       gather_chunks=layers)
        # FSDP2 wraps the rest of the model (embedding, final norm, LM head) as one more module, the
        # root, gathered and reduced like a layer (executor.parallelize.apply_fsdp, torchtitan);
        # under a pipeline, torch.distributed.pipelining defers FSDP2's reduce and reshard, which
        # only torchtitan's rule (_fsdp_under_pipeline) follows
        root = 1 if fsdp2 and plan.pp == 1 else 0
        unit = gather_unit(plan)
        calls = layers * (zero3_modules_per_layer(m) if unit == "module" else 1) + root
        pb = param_wire_bytes(plan)
        gathers_bwd = param_gathers_per_microbatch(plan, fsdp2) - 1 if plan.shards_params else 0
        if unit == "module_sync":  # each linear's own bytes (analytic.zero3_sync)
            parts = submodule_shares(m)
            calls = layers * len(parts)
            fwd = tuple(CollectiveCall(f"allgather params fwd {k}", "allgather", ax, n * pb / layers * s, layers)
                        for k, s in parts)
            bwd = tuple(CollectiveCall(f"allgather params bwd {k}", "allgather", ax, n * pb / layers * s,
                                       layers * gathers_bwd) for k, s in parts)
        else:
            fwd = (CollectiveCall("allgather params fwd", "allgather", ax, n * pb / calls, calls),)
            bwd = (CollectiveCall("allgather params bwd", "allgather", ax, n * pb / calls, calls * gathers_bwd),
                   ) if gathers_bwd else ()
        sync = [CollectiveCall("reducescatter grads", "reducescatter", ax, grad_bytes / calls, calls)]
        if hybrid:
            sync.append(CollectiveCall("allreduce grads across replicas", "allreduce", "dp_replica",
                                       grad_bytes / shard / (layers + root), layers + root))
        return DataParallelTraffic(fwd_gathers=fwd, bwd_gathers=bwd, microbatch_grad_sync=tuple(sync),
                                   gather_chunks=layers)

    # ZeRO-0 / ZeRO-1: one gradient sync per step, in buckets during the last backward
    if method == "topk":
        k = topk_elements(n, plan)
        nbytes = n * uncompressed_grad_bytes(plan, False)
        nb = grad_buckets(nbytes, plan)
        # values + int32 indices are not summable: all-gathered, so the buffer grows with dp
        calls = [CollectiveCall("allgather top-k values+indices", "allgather", "dp",
                                plan.dp * k * topk_wire_bytes(plan) / nb, nb)]
    elif method == "powersgd":
        ps = powersgd_elements(m, plan, stage)
        b = uncompressed_grad_bytes(plan, False)
        nb = grad_buckets(n * b, plan)
        calls = [CollectiveCall("allreduce PowerSGD P", "allreduce", "dp", ps.p * b / nb, nb),
                 CollectiveCall("allreduce PowerSGD Q", "allreduce", "dp", ps.q * b / nb, nb)]
        if ps.uncompressed:
            calls.append(CollectiveCall("allreduce 1-D tensors", "allreduce", "dp", ps.uncompressed * b / nb, nb))
    else:
        gb = grad_wire_bytes(plan, sharded=False)
        nbytes = n * gb
        nb = grad_buckets(n * uncompressed_grad_bytes(plan, False), plan)
        if not plan.shards_optimizer:  # DDP / ZeRO-0
            calls = [CollectiveCall("allreduce grads", "allreduce", "dp", nbytes / nb, nb)]
        else:
            calls = [CollectiveCall("reducescatter grads", "reducescatter", ax, nbytes / nb, nb)]
            if hybrid:
                calls.append(CollectiveCall("allreduce grads across replicas", "allreduce", "dp_replica",
                                            nbytes / shard / nb, nb))
    post = ()
    behind = False
    if plan.shards_optimizer and plan.axis_size(ax) > 1:  # ZeRO-1: the updated shards, gathered
        params = n * float(plan.element_bytes)
        # Megatron's distributed optimizer (--overlap-param-gather): one all-gather per bucket
        behind = plan.overlap_param_gather and nb > 1
        post = (CollectiveCall("allgather params", "allgather", ax, params / nb, nb) if behind
                else CollectiveCall("allgather params", "allgather", ax, params),)
    return DataParallelTraffic(step_grad_sync=tuple(calls), post_step_gathers=post, step_buckets=nb,
                               post_step_behind_forward=behind)


def reduced_once_under_pipeline(plan: ParallelPlan, fsdp2: bool) -> bool:
    """Whether sharded data parallelism inside a pipeline keeps each step's gradients unreduced
    (and unsharded) until the last micro-batch: FSDP2 (``fsdp2``), or a framework whose ZeRO-3
    stage does so (:func:`_fsdp_under_pipeline`)."""
    return plan.pp > 1 and (fsdp2 or (plan.shards_params and framework_of(plan.framework).fsdp_pipeline_no_sync))


def _fsdp_under_pipeline(plan: ParallelPlan, n: float, layers: int) -> DataParallelTraffic:
    """FSDP2 inside a torch.distributed.pipelining schedule (torchtitan, and the executor, which
    shards as torchtitan does there): the stage keeps its parameters unsharded and its gradients
    unreduced until the last micro-batch (stage.backward_maybe_with_nosync sets
    requires_gradient_sync and reshard_after_backward off before it; parallelize_llama:
    reshard_after_forward off under PP), so each layer's parameters are gathered once per step,
    ahead of its first forward, and its gradients reduce-scattered once, in the last backward
    (after it where the reductions block: ``in_line``). Measured on the executor's
    ``scenarios/tiny-2d-pp-fsdp.yaml`` (torch 2.13, 2026-11-29): one reduce-scatter per module a
    step; three gathers per module with ``reshard_after_forward`` on (every action after a
    forward gathers again: micro-batches + 1), which is why the executor now leaves it off."""
    ax = plan.shard_axis
    grad = n * grad_wire_bytes(plan, sharded=True)
    modules = layers + plan.virtual_pipeline_stages  # and each chunk's root (embedding, norm, head)
    sync = [CollectiveCall("reducescatter grads", "reducescatter", ax, grad / modules, modules)]
    if plan.hybrid_sharding:
        sync.append(CollectiveCall("allreduce grads across replicas", "allreduce", "dp_replica",
                                   grad / plan.dp_shard / modules, modules))
    gathers = (CollectiveCall("allgather params", "allgather", ax, n * param_wire_bytes(plan) / modules, modules),)
    return DataParallelTraffic(step_grad_sync=tuple(sync), post_step_gathers=gathers, step_buckets=modules,
                               post_step_behind_forward=plan.overlap_param_gather)


def _synced_times(tr: DataParallelTraffic, v: int, t_fwd: float, t_bwd: float) -> tuple[float, float]:
    """Exposed (forward, backward) gathers of DeepSpeed <= 0.4.0's ZeRO-3 per micro-batch: each
    of the ``v`` model chunks is a pass whose submodules wait one ahead
    (:func:`simdist.analytic.zero3_sync.synced_exposed`); backward reduce-scatters each
    submodule's gradients as it ends (its part of the layer's, pro rata)."""
    layers = max(1, tr.gather_chunks // v)
    total = sum(c.bytes for c in tr.fwd_gathers) or 1.0
    shares = tuple(c.bytes / total for c in tr.fwd_gathers)
    per = v * layers
    fwd = tuple(c.total_seconds / per for c in tr.fwd_gathers)
    rs = calls_seconds(tr.microbatch_grad_sync) / per
    bwd = tuple(c.total_seconds / per for c in tr.bwd_gathers)
    red = tuple(rs * s for s in shares)
    return (v * synced_exposed(shares, layers, t_fwd / v, fwd),
            v * synced_exposed(shares, layers, t_bwd / v, bwd, red, reverse=True))


def _seconds_by_links(calls: tuple[CollectiveCall, ...]) -> dict[str, float]:
    """Seconds of timed ``calls`` per link class (intra-node, inter-node)."""
    out: dict[str, float] = {}
    for c in calls:
        out[c.links] = out.get(c.links, 0.0) + c.total_seconds
    return out


@frozen(slots=True)
class DataParallelTimes:
    """Exposed DP time of one GPU: per micro-batch (ZeRO-2/3) and once per step."""

    fwd_exposed: float  # per micro-batch, in forward (ZeRO-3 gathers)
    bwd_exposed: float  # per micro-batch, in backward (ZeRO-3 gathers, ZeRO-2/3 reduce-scatters)
    step_sync: float  # the last backward's gradient sync that did not hide
    post_step: float  # parameter all-gather after the optimizer that did not hide
    gather_fwd: float = 0.0  # un-overlapped: one micro-batch's forward gathers
    grad_sync: float = 0.0  # un-overlapped: its reduce-scatters (+ replica all-reduces)
    stretch: float = 0.0  # the last backward's compute slowed by the step sync beside it
    post_stretch: float = 0.0  # the next first forward slowed by the post-step gathers (in post_step)

    @property
    def per_microbatch(self) -> float:
        return self.fwd_exposed + self.bwd_exposed


def _bucket_seconds(tr: DataParallelTraffic) -> float:
    """One bucket of the per-step gradient sync, timed alone."""
    return sum(c.seconds * c.calls / tr.step_buckets for c in tr.step_grad_sync)


def contention_stretch(tr: DataParallelTraffic, plan: ParallelPlan, t_fwd: float, t_bwd: float) -> tuple[float, float]:
    """Seconds by which (the last backward, the next step's first forward) run longer beside the
    per-step gradient sync and the post-step gathers, as :func:`dp_times` prices them (the event
    engine lengthens its tasks by these: simdist.sim.lowering); the interleaved schedule's
    chunked sync is not slowed."""
    back = fwd = 0.0
    if tr.step_grad_sync and plan.overlap_grad_reduce and not plan.interleaved:
        back = contended_buckets(_bucket_seconds(tr), tr.step_buckets, t_bwd, tr.contention)[0]
    if tr.post_step_behind_forward:
        fwd = contended_prefetch(calls_seconds(tr.post_step_gathers), tr.step_buckets, t_fwd, tr.contention)[0]
    return back, fwd


def dp_times(tr: DataParallelTraffic, plan: ParallelPlan, t_fwd: float, t_bwd: float,
             last_bwd: float | None = None, first_fwd: float | None = None,
             chunk_shares: tuple[float, ...] = (1.0,)) -> DataParallelTimes:
    """Exposed time of the timed traffic ``tr`` (:meth:`DataParallelTraffic.timed`) given one
    micro-batch's forward and backward compute on the stage.

    ZeRO-3: prefetched all-gathers and per-layer reduce-scatters hide behind compute except the
    first gather and the last reduce-scatter (prefetch_exposed); without ``overlap_param_gather``
    all of it waits. ZeRO-2: the per-layer reduce-scatters trail backward (the first chunk
    exposed). The per-step sync runs in buckets during the last backward, which runs slower beside
    it (contended_buckets: ``stretch``); under
    the interleaved schedule each model chunk's buckets (``chunk_shares``: the chunks' parts of
    the stage's parameters, in chunk order) during that chunk's last backward, which ends
    pp chunk-backwards per lower chunk before the stage's last (chunked_buckets_exposed).
    The post-step all-gather overlaps the next step's first forward with Megatron's
    ``--overlap-param-gather`` (overlap_param_gather), slowing it (contended_prefetch:
    ``post_stretch``, counted in ``post_step``), and waits in full otherwise.
    """
    last_bwd = t_bwd if last_bwd is None else last_bwd
    first_fwd = t_fwd if first_fwd is None else first_fwd
    chunks = tr.gather_chunks
    ag_f = calls_seconds(tr.fwd_gathers)
    ag_b = calls_seconds(tr.bwd_gathers)
    rs = calls_seconds(tr.microbatch_grad_sync)
    fwd_exp = bwd_exp = 0.0
    v = plan.virtual_pipeline_stages  # each model chunk runs on its own: its first gather waits
    if tr.fwd_gathers:  # ZeRO-3 (and FSDP2's ZeRO-2, which gathers for the forward only)
        if not plan.overlap_param_gather:
            fwd_exp, bwd_exp = ag_f, ag_b + rs
        elif gather_unit(plan) == "module_sync":  # one submodule ahead (analytic.zero3_sync)
            fwd_exp, bwd_exp = _synced_times(tr, v, t_fwd, t_bwd)
        else:
            fwd_exp = max(min(v, chunks) * ag_f / chunks, ag_f - t_fwd) if ag_f > 0 else 0.0
            # one layer's gather and one layer's reduce-scatter per chunk cannot hide; gathers
            # and reductions on the same links share them, on different links (HSDP's node-local
            # shard group and cross-node replicas) they run side by side
            busiest = max(_seconds_by_links(tr.bwd_gathers + tr.microbatch_grad_sync).values(), default=0.0)
            if tr.in_line:  # every reduction waited for, the next layer's gather beside it
                bwd_exp = max(min(v, chunks) * ag_b / chunks + rs, busiest - t_bwd)
            else:
                bwd_exp = max(min(v, chunks) * (ag_f + rs) / chunks, busiest - t_bwd) if (ag_b + rs) > 0 else 0.0
    elif tr.microbatch_grad_sync:  # ZeRO-2
        bwd_exp = rs if tr.in_line else prefetch_exposed(rs, chunks, t_bwd)
    step = stretch = 0.0
    if tr.step_grad_sync:
        nb = tr.step_buckets
        t_b = _bucket_seconds(tr)
        if tr.in_line:  # each bucket waited for as it is issued, after the backward
            step = nb * t_b
        elif plan.overlap_grad_reduce and len(chunk_shares) > 1:
            groups, below = [], 0.0
            for share in chunk_shares:  # chunk 0 ends last; each chunk above waits pp backwards of those below
                t_c = last_bwd * share
                groups.append((below + t_c, below, max(1, round(nb * share))))
                below += plan.pp * t_c
            step = chunked_buckets_exposed(t_b, groups[::-1])
        elif plan.overlap_grad_reduce:  # beside the last backward, which it slows down
            stretch, step = contended_buckets(t_b, nb, last_bwd, tr.contention)
        else:
            step = bucketed_exposed(t_b, nb, last_bwd, False)
    post = calls_seconds(tr.post_step_gathers)
    post_stretch = 0.0
    if tr.post_step_behind_forward:  # each bucket's gather ahead of the forward that needs it, slowing it
        post_stretch, post = contended_prefetch(post, tr.step_buckets, first_fwd, tr.contention)
        post += post_stretch
    return DataParallelTimes(fwd_exp, bwd_exp, step, post, ag_f, rs, stretch, post_stretch)

