"""The caching allocator's reserved-over-allocated gap of one GPU: the tensors of two training
steps, allocated and freed in the order the step runs them, replayed through
simdist.analytic.allocator.

The trace uses the quantities of the memory model, tensor by tensor: the model states (the
optimizer's created lazily at the first step, as PyTorch optimizers do), each layer's saved
tensors and the rest of its activations as temporaries (activations.layer_saved_tensors with and
without recomputation), the gradients flowing back, the LM head and the loss's logit buffers
(transients), ZeRO-3/FSDP's gathered weights on their own stream and its reduce-scatter buffers,
the pipeline schedule's order of forwards and backwards (warm-up, steady 1F1B, cool-down;
Megatron's interleaved order), and the optimizer step's temporaries. Two steps are replayed so
the second starts from the first one's cache, as a long run does; the schedule is cut after the
warm-up plus two more micro-batches (the steady state repeats itself).
The calls are recorded (simdist.analytic.allocation_record) and replayed at once; the second
step's forwards and backwards are the first one's recording appended again when the keys they
depended on are live or not as they were (always so far; else they are worked out again).

Only the gap is taken from the replay (``peak reserved - peak allocated`` of the replay); the
allocated peak itself is the closed form of simdist.analytic.memory. Host processes (the
``local`` cluster) have no caching allocator: gap 0.
"""

from __future__ import annotations

import gc
from functools import lru_cache

from simdist.analytic.activations import (
    head_saved_tensors,
    in_flight,
    layer_saved_tensors,
    logits_elements,
)
from simdist.analytic.allocation_record import Segment, Trace
from simdist.analytic.fp8_memory import gathered_weight_bytes, saved_fp8_weight_bytes
from simdist.analytic.memory import model_state_bytes, shard_group
from simdist.analytic.memory_conventions import conventions
from simdist.analytic.params import layer_params, matrix_shapes, params_per_rank
from simdist.analytic.runtime_memory import is_cuda, runtime_memory
from simdist.analytic.transients import step_temporaries
from simdist.spec.cluster import ClusterSpec
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan
from simdist.spec.stages import stage_layer_ranges

GRAD_WINDOW = 3  # activation gradients alive at once while backward walks a layer
FORWARD_WINDOW = 2  # temporaries alive at once in a forward that does not save them
GPIPE_CAP = 32  # GPipe micro-batches replayed (each adds the same blocks)
# Layer passes (a layer's forward or backward for one micro-batch) one replay may take: past
# it (10^5-layer models, hundreds of layers per stage under deep warm-ups) the gap is not
# replayed and counts as 0, and predict says so: the replay would take minutes.
MAX_LAYER_PASSES = 20_000


class _Replay:
    def __init__(self, m: ModelSpec, plan: ParallelPlan, stage: int, limit: float,
                 windows: tuple[int, int] = (FORWARD_WINDOW, GRAD_WINDOW)) -> None:
        self.m, self.plan, self.stage = m, plan, stage
        self.forward_window, self.grad_window = windows
        self.conv = conventions(plan)
        self.limit = limit
        self.alloc = Trace()  # recorded, then replayed at once by the caching allocator's rules
        self.saved = layer_saved_tensors(m, plan)
        if (w := saved_fp8_weight_bytes(m, plan)) > 0:
            self.saved = [*self.saved, ("fp8 weights", w)]
        names = {n for n, _ in self.saved}
        full = layer_saved_tensors(m, plan, "none")
        e, split = plan.element_bytes, (plan.tp if plan.sequence_parallel and plan.tp > 1 else 1)
        sbh = m.seq_length // plan.cp * plan.micro_batch_size * m.hidden_size
        norm_tmp = [("norm fp32", 4.0 * sbh / split)]
        self.order = norm_tmp + full  # the layer's tensors in the order its forward makes them
        self.transient = {i for i, (n, _) in enumerate(self.order) if n not in names}
        self.extra_saved = [(n, b) for n, b in self.saved if n not in {x for x, _ in full}]
        self.recompute = [(n, b) for i, (n, b) in enumerate(self.order) if i in self.transient] \
            if plan.recompute != "none" else []
        self.grad_input = e * sbh / split
        self.layer_params = layer_params(m).per_tp_rank(plan.tp)
        self.matrices = [r * c // plan.tp for r, c, k in matrix_shapes(m) for _ in range(k)]
        ranges = stage_layer_ranges(m.num_layers, plan.pp, plan.virtual_pipeline_stages, plan.pipeline_layout)
        self.chunks = [len(r) for r in ranges[stage]]
        self.zero3 = plan.shards_params and not (self.conv.fsdp2_fp32_shards and plan.pp > 1)
        self.pp_fsdp = plan.shards_params and self.conv.fsdp2_fp32_shards and plan.pp > 1
        self.torch_grads = plan.shards_params and self.conv.fsdp2_fp32_shards
        self.states = model_state_bytes(m, plan, stage)
        self._kept = [i for i in range(len(self.order)) if i not in self.transient]  # saved for backward
        # (tag, index, sized) of the layer's tensors, sized by the trace on first use
        self._forward: list[tuple[str, int, tuple[int, int]]] | None = None
        self._extra: list[tuple[int, int]] | None = None
        self._recomputed: list[tuple[int, int]] | None = None
        self._backward: list[tuple[int, tuple[int, int]]] | None = None

    # --- pieces -----------------------------------------------------------------------------

    def init(self) -> None:
        a, layers = self.alloc, sum(self.chunks)
        st = self.states
        params, grads = st["params"], (0.0 if self.torch_grads else st["grads"])
        if self.pp_fsdp:  # the gathered copies are made by the step's first forward
            params -= params_per_rank(self.m, self.plan, self.stage) * gathered_weight_bytes(self.plan)
        for i in range(layers):
            a.malloc(("param", i), params / layers)
            if grads:
                a.malloc(("grad", i), grads / layers)
        if self.conv.pipeline_keeps_outputs and self.plan.pp > 1:
            act = self.grad_input
            directions = (self.stage > 0) + (self.stage < self.plan.pp - 1)
            for k in range(self.plan.num_microbatches * directions):
                a.malloc(("recv", k), act)

    def forward(self, mb: int, layer: int, last: bool) -> None:
        a = self.alloc
        if self.zero3:
            self._gather(layer)
        elif self.pp_fsdp and not a.live(("ag", layer)):
            a.malloc(("ag", layer), self.layer_params * gathered_weight_bytes(self.plan), "ag")
        put, free, window = a.put, a.free, self.forward_window
        if self._forward is None:  # sized on first use, in the order malloc would number the pools
            self._forward = [("t" if i in self.transient else "s", i, a.sized(b)) for i, (_, b) in enumerate(self.order)]
        live: list[tuple] = []
        for tag, i, sized in self._forward:
            key = (tag, mb, layer, i)
            put(key, sized)
            if tag == "t":
                live.append(key)
                if len(live) > window:  # an op's inputs die once its consumers ran
                    free(live.pop(0))
        if self._extra is None:
            self._extra = [a.sized(b) for _, b in self.extra_saved]
        for j, sized in enumerate(self._extra):
            put(("x", mb, layer, j), sized)
        for key in live:
            free(key)
        if self.zero3:
            a.free(("ag", layer))
        if last:
            self._loss_forward(mb)

    def backward(self, mb: int, layer: int, last: bool) -> None:
        a = self.alloc
        if last:
            self._loss_backward(mb)
        if self.zero3:
            self._gather(layer)
        put, free, window = a.put, a.free, self.grad_window
        if self._recomputed is None:  # sized on first use, in the order malloc would number the pools
            self._recomputed = [a.sized(b) for _, b in self.recompute]
        for i, sized in enumerate(self._recomputed):
            put(("r", mb, layer, i), sized)
        if self._backward is None:
            self._backward = [(i, a.sized(b)) for i, (_, b) in reversed(list(enumerate(self.order)))]
        grads: list[tuple] = []
        for i, sized in self._backward:
            key = ("g", mb, layer, i)
            put(key, sized)
            grads.append(key)
            if len(grads) > window:
                free(grads.pop(0))
        self._weight_grads(mb, layer)
        for key in grads:
            free(key)
        for i in range(len(self.recompute)):
            free(("r", mb, layer, i))
        for i in self._kept:
            free(("s", mb, layer, i))
        for j in range(len(self.extra_saved)):
            free(("x", mb, layer, j))
        a.malloc(("gx", mb, layer), self.grad_input)
        if a.live(("gx", mb, layer + 1)):
            a.free(("gx", mb, layer + 1))
        if self.zero3:
            a.free(("ag", layer))

    def _gather(self, layer: int) -> None:
        a = self.alloc
        size = self.layer_params * gathered_weight_bytes(self.plan)
        if not a.live(("ag", layer)):
            a.malloc(("ag", layer), size, "ag")

    def _weight_grads(self, mb: int, layer: int) -> None:
        a, e = self.alloc, self.plan.element_bytes
        if not (self.zero3 or self.pp_fsdp):
            return  # accumulated in place into the persistent gradient buffers
        keys = []
        for j, n in enumerate(self.matrices):
            a.malloc(("wg", mb, layer, j), n * e)
            keys.append(("wg", mb, layer, j))
            if self.pp_fsdp and not a.live(("acc", layer, j)):
                a.malloc(("acc", layer, j), n * 4.0)  # FSDP2 upcasts to reduce_dtype and keeps it
        if self.zero3:
            rs_bytes = 4.0 if self.torch_grads else e
            a.malloc(("rsin", layer), self.layer_params * rs_bytes)
        for k in keys:
            a.free(k)
        if self.zero3:
            shard = self.layer_params * (4.0 if self.torch_grads else e) / shard_group(self.plan)
            if self.torch_grads and not a.live(("gshard", layer)):
                a.malloc(("gshard", layer), shard, "rs")
            else:
                a.malloc(("rsout", layer), shard, "rs")
                a.free(("rsout", layer))
            a.free(("rsin", layer))

    def _loss_forward(self, mb: int) -> None:
        a, n = self.alloc, logits_elements(self.m, self.plan)
        for j, (_, nbytes) in enumerate(head_saved_tensors(self.m, self.plan)[:-1]):
            a.malloc(("head", mb, j), nbytes)
        a.malloc(("logits16", mb), self.plan.element_bytes * n)
        if self.conv.loss == "torch":
            seq = ["f32", "shift", "exp"] if self.plan.tp > 1 else ["f32"]
            for k in seq:
                a.malloc((k, mb), 4 * n)
            if self.plan.tp > 1:
                a.free(("exp", mb))
            a.malloc(("lsm", mb), 4 * n)
            for k in seq[:2] if self.plan.tp > 1 else seq:
                a.free((k, mb))
        else:
            a.malloc(("lsm", mb), 4 * n)
        if not (self.conv.pipeline_keeps_outputs and self.plan.pp > 1):
            a.free(("logits16", mb))

    def _loss_backward(self, mb: int) -> None:
        a, n = self.alloc, logits_elements(self.m, self.plan)
        if self.conv.loss == "torch":
            a.malloc(("nll", mb), 4 * n)
            if self.plan.tp > 1:
                a.malloc(("expo", mb), 4 * n)
                a.malloc(("mul", mb), 4 * n)
                a.free(("expo", mb))
            a.malloc(("dlsm", mb), 4 * n)
            for k in (("mul", mb), ("nll", mb)) if self.plan.tp > 1 else (("nll", mb),):
                a.free(k)
        else:
            a.malloc(("dlsm", mb), 4 * n)
        a.free(("lsm", mb))
        a.malloc(("dlogits16", mb), self.plan.element_bytes * n)
        a.free(("dlsm", mb))
        a.free(("dlogits16", mb))
        for j in range(len(head_saved_tensors(self.m, self.plan)) - 1):
            a.free(("head", mb, j))

    def end_of_step(self, step: int) -> None:
        a, layers = self.alloc, sum(self.chunks)
        if self.pp_fsdp:
            for layer in range(layers):
                a.malloc(("rsin", layer), self.layer_params * 4.0)
                for j in range(len(self.matrices)):
                    if a.live(("acc", layer, j)):
                        a.free(("acc", layer, j))
                a.malloc(("gshard", layer), self.layer_params * 4.0 / shard_group(self.plan), "rs")
                a.free(("rsin", layer))
                if a.live(("ag", layer)):
                    a.free(("ag", layer))
        if step == 0:  # PyTorch optimizers create their states at the first step
            for i in range(layers):
                a.malloc(("opt", i), self.states["optimizer"] / layers)
        temps = sum(b for _, b in step_temporaries(self.m, self.plan, self.stage))
        if temps:
            for i in range(layers):
                a.malloc(("tmp", i), temps / layers)
            for i in range(layers):
                a.free(("tmp", i))
        if self.torch_grads:  # zero_grad(set_to_none=True) before the next step
            for layer in range(layers):
                if a.live(("gshard", layer)):
                    a.free(("gshard", layer))
        for k in a.live_keys():  # the pipeline's kept outputs go when the step returns
            if isinstance(k, tuple) and k[0] == "logits16":
                a.free(k)

    # --- the schedule -----------------------------------------------------------------------

    def units(self) -> list[tuple[str, int, int]]:
        """(F|B, micro-batch, chunk) in the stage's order, cut after warm-up + 2."""
        plan = self.plan
        p, v, m = plan.pp, len(self.chunks), plan.num_microbatches
        total = m * v
        warm = min(total, GPIPE_CAP if plan.schedule == "gpipe" else in_flight(plan, self.stage))
        n = min(total, warm + 2)  # only the units replayed are listed (a step may hold 2^46)
        if plan.interleaved:  # Megatron: groups of p micro-batches through each chunk in turn
            fwd = [((i // (p * v)) * p + i % p, (i // p) % v) for i in range(n)]
            bwd = [((i // (p * v)) * p + i % p, v - 1 - (i // p) % v) for i in range(n)]
        else:
            fwd = [(i, 0) for i in range(n)]
            bwd = list(fwd)
        out = [("F", *fwd[i]) for i in range(warm)]
        f, b = warm, 0
        while b < n:
            out.append(("B", *bwd[b]))
            b += 1
            if f < n:
                out.append(("F", *fwd[f]))
                f += 1
        return out

    def run(self, steps: int = 2) -> tuple[int, int]:
        self.init()
        starts = [sum(self.chunks[:c]) for c in range(len(self.chunks))]
        pv = self.plan.pp * len(self.chunks)
        seg: Segment | None = None
        for step in range(steps):
            if seg is not None and self.alloc.repeat(seg):  # the step's passes as the last one's
                self.end_of_step(step)
                continue
            start = self.alloc.begin()
            done: set[tuple[int, int]] = set()
            for kind, mb, c in self.units():
                if kind == "B" and (mb, c) not in done:
                    continue  # its forward lies beyond the replayed part of the schedule
                done.add((mb, c))
                first_layer, count = starts[c], self.chunks[c]
                last = (c * self.plan.pp + self.stage) == pv - 1
                layers = range(first_layer, first_layer + count)
                if kind == "F":
                    for i, layer in enumerate(layers):
                        self.forward(mb, layer, last and i == count - 1)
                else:
                    for i, layer in enumerate(reversed(layers)):
                        self.backward(mb, layer, last and i == 0)
            seg = self.alloc.end(start)
            self.end_of_step(step)
        return self.alloc.peaks(self.limit)


@lru_cache(maxsize=2048)
def allocator_gap(m: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec | None, stage: int,
                  windows: tuple[int, int] = (FORWARD_WINDOW, GRAD_WINDOW)) -> float:
    """Bytes the caching allocator holds reserved beyond its allocated peak on one GPU of
    ``stage`` (0 for host processes and without a cluster). ``windows``: how many temporaries
    a forward that does not save them, and how many activation gradients, are alive at once."""
    if cluster is None or not is_cuda(cluster) or not replay_is_bounded(m, plan):
        return 0.0
    limit = cluster.gpu.memory_bytes - runtime_memory(plan, cluster).outside_allocator
    collecting = gc.isenabled()
    gc.disable()  # the replay makes ~10^4 containers that form no cycles and die with it: a
    try:  # collection they trigger only walks the whole heap (a full one: 25 ms of `predict`)
        allocated, reserved = _Replay(m, plan, stage, limit, windows).run()
    finally:
        if collecting:
            gc.enable()
    return max(0.0, float(reserved - allocated))


def layer_passes(m: ModelSpec, plan: ParallelPlan) -> int:
    """An upper bound of the layer passes of one stage's replay (two steps, forward and backward
    of the replayed micro-batches of every chunk)."""
    layers = -(-m.num_layers // plan.pp)  # the largest stage's layers, all its chunks
    if plan.pipeline_layout is not None:
        ranges = stage_layer_ranges(m.num_layers, plan.pp, plan.virtual_pipeline_stages, plan.pipeline_layout)
        layers = max(sum(len(r) for r in chunks) for chunks in ranges)
    micro = min(plan.num_microbatches, max(GPIPE_CAP, plan.pp * plan.virtual_pipeline_stages) + 2)
    return 2 * 2 * layers * micro


def replay_is_bounded(m: ModelSpec, plan: ParallelPlan) -> bool:
    return layer_passes(m, plan) <= MAX_LAYER_PASSES


def stage_gaps(m: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec | None,
               windows: tuple[int, int] = (FORWARD_WINDOW, GRAD_WINDOW)) -> list[float]:
    """:func:`allocator_gap` of every stage, replayed once per stage kind (the same chunks and the
    same first/last role; the kind's first stage, which holds the most micro-batches)."""
    ranges = stage_layer_ranges(m.num_layers, plan.pp, plan.virtual_pipeline_stages, plan.pipeline_layout)
    by_kind: dict[tuple, float] = {}
    out = []
    for s in range(plan.pp):
        kind = (tuple(len(r) for r in ranges[s]), s == 0, s == plan.pp - 1)
        if kind not in by_kind:
            by_kind[kind] = allocator_gap(m, plan, cluster, s, windows)
        out.append(by_kind[kind])
    return out


class LazyStageGaps:
    """:func:`stage_gaps` worked out on the first request and kept (predict's reports)."""

    def __init__(self, m: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec | None) -> None:
        self._args = (m, plan, cluster)
        self._gaps: list[float] | None = None

    def gib(self, stage: int) -> float:
        if self._gaps is None:
            self._gaps = stage_gaps(*self._args)
        return self._gaps[stage] / 2**30
