"""Lowering: a scenario -> the work of each pipeline stage in one optimizer step (pure, no simpy).

Each (micro-batch, chunk) action of the pipeline schedule becomes one task on the stage's
compute stream whose length comes from the layer's op list (:mod:`simdist.sim.ops`) timed with
the cost model and the closed-form TP/CP collective times at op granularity, exactly as the
closed-form engine does (:class:`simdist.analytic.steptime.Timer`): a chunk's layers are
aggregated into one task, the exposed TP communication kept as its own figure. Under ZeRO-3 a
task is split per layer, because each layer waits for its own parameter all-gather.

Communication that the engine puts on the network is described, not timed, here
(:class:`CommSpec`): pipeline sends, and the data-parallel traffic of the plan --

- DDP (ZeRO-0): gradient all-reduce in ``ddp_bucket_size`` buckets, started as the last
  micro-batch's backward produces them (``overlap_grad_reduce``; PyTorch DDP, Li et al. VLDB
  2020; Megatron-LM's overlapped grad reduce), else one all-reduce after the pipeline flush;
- ZeRO-1: the same with reduce-scatter, and a parameter all-gather after the optimizer
  (Rajbhandari et al. SC'20; Megatron's distributed optimizer);
- ZeRO-2: a reduce-scatter of every micro-batch's gradients as its backward produces them;
- ZeRO-3 / FSDP: per-layer parameter all-gather before forward and backward, prefetched one
  layer ahead, and a per-layer gradient reduce-scatter (Zhao et al. VLDB 2023, FSDP);
- HSDP: the shard group's reduce-scatter followed by an all-reduce across replicas.

Gradients travel in 16-bit under ZeRO-2/3 and in the gradient buffer's precision otherwise,
as in :mod:`simdist.analytic.steptime`, so the two engines agree where nothing overlaps.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from simdist.analytic.memory import state_bytes
from simdist.analytic.params import (
    embedding_params,
    head_params,
    layer_params,
    stage_layer_ranges,
)
from simdist.analytic.steptime import ZERO_PASS, PassTime, Timer, optimizer_time
from simdist.cost import CostModel
from simdist.sim.collectives import Network, axis_size, collective_time
from simdist.sim.ops import Comm, Op, embedding_ops, head_ops, layer_ops
from simdist.sim.schedules import Action, dependencies, schedule, virtual_stage
from simdist.spec.scenario import Scenario

MiB = 2**20


@dataclass(frozen=True, slots=True)
class Work:
    """Compute-stream time of one piece of a task."""

    compute: float = 0.0
    recompute: float = 0.0
    tp: float = 0.0  # exposed TP/CP communication inside the task

    def total(self, factor: float = 1.0) -> float:
        """Length on a GPU whose compute is ``factor`` times slower."""
        return (self.compute + self.recompute) * factor + self.tp

    def __add__(self, o: Work) -> Work:
        return Work(self.compute + o.compute, self.recompute + o.recompute, self.tp + o.tp)


@dataclass(frozen=True, slots=True)
class CommSpec:
    """One transfer the engine times on the network."""

    name: str  # "allreduce dp 25 MiB", "sendrecv pp 6 MiB"
    collective: str
    axis: str  # dp | dp_shard | dp_replica (collectives), pp (point-to-point)
    nbytes: float
    extra_s: float = 0.0  # fixed time after it (Megatron's TP all-gather after a scattered send)


@dataclass(frozen=True, slots=True)
class GradPiece:
    """Gradients ready ``at`` (a fraction) through segment ``segment`` of a task, then reduced."""

    segment: int
    at: float
    comms: tuple[CommSpec, ...]


@dataclass(frozen=True)
class Task:
    """One action's work: segments run back to back on the compute stream."""

    segments: tuple[Work, ...]
    gathers: tuple[CommSpec, ...] = ()  # ZeRO-3: one per segment, prefetched one ahead
    pieces: tuple[GradPiece, ...] = ()  # gradient reductions it starts on the dp stream
    tp_name: str = ""

    @property
    def work(self) -> Work:
        out = Work()
        for w in self.segments:
            out = out + w
        return out


@dataclass(frozen=True)
class ChunkWork:
    """One model chunk of a stage: its tasks per action kind and its pipeline sends."""

    tasks: dict[tuple[str, bool], Task]  # (kind F/B/W, last micro-batch?) -> task
    send_fwd: CommSpec | None  # activation to the next virtual stage
    send_bwd: CommSpec | None  # input gradient to the previous virtual stage
    layers: int

    def task(self, kind: str, last: bool) -> Task:
        return self.tasks.get((kind, last)) or self.tasks[(kind, False)]


@dataclass(frozen=True)
class StageWork:
    stage: int
    chunks: tuple[ChunkWork, ...]
    actions: tuple[Action, ...]
    deps: tuple[tuple[tuple[int, Action], ...], ...]  # per action: cross-stage dependencies
    flush: tuple[CommSpec, ...]  # gradient sync after the pipeline flush (no overlap)
    optimizer: float
    post_optimizer: tuple[CommSpec, ...]  # ZeRO-1/2 parameter all-gather


@dataclass(frozen=True)
class Lowered:
    stages: tuple[StageWork, ...]
    split_backward: bool
    notes: tuple[str, ...]


# --- helpers ------------------------------------------------------------------------------


def size_label(nbytes: float) -> str:
    if nbytes >= 10 * MiB:
        return f"{nbytes / MiB:.0f} MiB"
    if nbytes >= MiB:
        return f"{nbytes / MiB:.1f} MiB"
    return f"{nbytes / 1024:.0f} KiB"


def comm(collective: str, axis: str, nbytes: float, extra_s: float = 0.0) -> CommSpec:
    label = "dp" if axis.startswith("dp") else axis
    return CommSpec(f"{collective} {label} {size_label(nbytes)}", collective, axis, nbytes, extra_s)


def tp_label(ops: tuple[Op, ...], times: int) -> str:
    """Name of a task's TP/CP traffic, e.g. "allreduce tp 288 MiB"."""
    comms = [op for op in ops if isinstance(op, Comm)]
    if not comms:
        return ""
    kind = Counter(op.collective for op in comms).most_common(1)[0][0]
    axis = "cp" if all(op.axis == "cp" for op in comms) else "tp"
    return f"{kind} {axis} {size_label(sum(op.bytes for op in comms) * times)}"


def _work(p: PassTime, recompute: PassTime = ZERO_PASS, drop_weight_grad: bool = False) -> Work:
    compute = p.compute - (p.weight_grad if drop_weight_grad else 0.0)
    return Work(compute, recompute.compute, p.tp_exposed + p.cp_exposed + recompute.tp_exposed + recompute.cp_exposed)


class _Passes:
    """Per-layer and embedding/head pass times of one scenario (timed once)."""

    def __init__(self, timer: Timer):
        sc = timer.sc
        m, plan = sc.model, sc.plan
        self.fwd = timer.passes(layer_ops(m, plan, "fwd"))
        self.bwd = timer.passes(layer_ops(m, plan, "bwd"))
        self.emb_fwd = timer.passes(embedding_ops(m, plan, "fwd"))
        self.emb_bwd = timer.passes(embedding_ops(m, plan, "bwd"))
        self.head_fwd = timer.passes(head_ops(m, plan, "fwd"))
        self.head_bwd = timer.passes(head_ops(m, plan, "bwd"))
        self.recompute = ZERO_PASS
        if plan.recompute == "full":
            self.recompute = self.fwd
        elif plan.recompute == "selective" and not plan.flash_attention:
            core = tuple(op for op in layer_ops(m, plan, "fwd") if op.name in ("QK^T", "AV", "softmax"))
            self.recompute = timer.passes(core)
        self.fwd_label = tp_label(layer_ops(m, plan, "fwd"), 1)
        self.bwd_label = tp_label(layer_ops(m, plan, "bwd"), 1)


# --- the stage's work ---------------------------------------------------------------------


def lower(sc: Scenario, cost: CostModel, net: Network) -> Lowered:
    """The work of every pipeline stage for one optimizer step of ``sc``."""
    plan = sc.plan
    timer = Timer(sc, cost, net)
    passes = _Passes(timer)
    split = plan.schedule == "zero-bubble"
    sched = schedule(plan.schedule, plan.pp, plan.num_microbatches, plan.virtual_pipeline_stages)
    stages = tuple(_stage(sc, timer, passes, s, sched[s], split) for s in range(plan.pp))
    return Lowered(stages, split, tuple(_notes(sc)))


def _stage(sc: Scenario, timer: Timer, passes: _Passes, stage: int, actions: list[Action], split: bool) -> StageWork:
    plan = sc.plan
    p, v = plan.pp, plan.virtual_pipeline_stages
    chunks = tuple(_chunk(sc, timer, passes, stage, c, split) for c in range(v))
    deps = tuple(
        tuple(d for d in dependencies(a, stage, p, v, split) if d[0] != stage) for a in actions
    )
    grads = _dp_bytes(sc, stage)
    flush: tuple[CommSpec, ...] = ()
    if plan.dp > 1 and plan.zero_stage <= 1 and not plan.overlap_grad_reduce:
        flush = _grad_sync(sc, grads["grads"])
    post: tuple[CommSpec, ...] = ()
    if plan.zero_stage in (1, 2) and axis_size(plan, _shard_axis(plan)) > 1:
        post = (comm("allgather", _shard_axis(plan), grads["params"]),)
    return StageWork(stage, chunks, tuple(actions), deps, flush, optimizer_time(timer, stage), post)


def _shard_axis(plan) -> str:
    return "dp_shard" if plan.dp_shard < plan.dp else "dp"


def _chunk_params(sc: Scenario, stage: int, chunk: int) -> tuple[int, int]:
    """(layers, parameters per rank) of one chunk of a stage."""
    m, plan = sc.model, sc.plan
    layers = len(stage_layer_ranges(m.num_layers, plan.pp, plan.virtual_pipeline_stages)[stage][chunk])
    vs, last = virtual_stage(stage, chunk, plan.pp), plan.pp * plan.virtual_pipeline_stages - 1
    count = layer_params(m) * layers
    if vs == 0:
        count = count + embedding_params(m)
    if vs == last:
        count = count + head_params(m, separate_copy=plan.pp > 1)
    return layers, count.per_tp_rank(plan.tp)


def _dp_bytes(sc: Scenario, stage: int, chunk: int | None = None) -> dict[str, float]:
    """Gradient and parameter bytes one rank reduces / gathers (a chunk, or the whole stage)."""
    plan = sc.plan
    chunks = range(plan.virtual_pipeline_stages) if chunk is None else (chunk,)
    n = sum(_chunk_params(sc, stage, c)[1] for c in chunks)
    b = state_bytes(sc.model, plan)
    sharded_grads = min(b.grads, 4.0 if plan.precision == "fp32" else 2.0)
    return {
        "grads": n * b.grads,
        "grads16": n * sharded_grads,
        "params": n * b.params,
        "gather": n * (1.0 if plan.zero_quantized_weights else b.params),
    }


def _grad_sync(sc: Scenario, nbytes: float) -> tuple[CommSpec, ...]:
    """The collectives that reduce ``nbytes`` of gradients under the plan's ZeRO stage."""
    plan = sc.plan
    if plan.zero_stage == 0:
        return (comm("allreduce", "dp", nbytes),)
    out = []
    if axis_size(plan, _shard_axis(plan)) > 1:
        out.append(comm("reducescatter", _shard_axis(plan), nbytes))
    if plan.dp_shard < plan.dp:
        out.append(comm("allreduce", "dp_replica", nbytes / plan.dp_shard))
    return tuple(out)


def _pieces(sc: Scenario, nbytes: float, count: int, per_segment: bool) -> tuple[GradPiece, ...]:
    """``nbytes`` of gradients split into ``count`` equal pieces over one task: the k-th is
    ready at (k+1)/count of the task, or at the end of segment k when ``per_segment``."""
    if nbytes <= 0 or count < 1:
        return ()
    comms = _grad_sync(sc, nbytes / count)
    if not comms:
        return ()
    if per_segment:
        return tuple(GradPiece(k, 1.0, comms) for k in range(count))
    return tuple(GradPiece(0, (k + 1) / count, comms) for k in range(count))


def _bucket_pieces(sc: Scenario, nbytes: float) -> tuple[GradPiece, ...]:
    """DDP buckets of ``ddp_bucket_size`` (the last one smaller), in backward order."""
    bucket = sc.plan.ddp_bucket_size_bytes
    full = int(nbytes // bucket)
    sizes = [bucket] * full + ([nbytes - full * bucket] if nbytes - full * bucket > 0 else [])
    out, done = [], 0.0
    for size in sizes:
        done += size
        out.append(GradPiece(0, done / nbytes, _grad_sync(sc, size)))
    return tuple(p for p in out if p.comms)


def _send_specs(sc: Scenario, timer: Timer, vs: int) -> tuple[CommSpec | None, CommSpec | None]:
    """Megatron's scatter/gather p2p: each TP rank sends 1/t of the activation, the receiver
    all-gathers it over TP (Narayanan et al. SC'21, sec 4.1)."""
    m, plan = sc.model, sc.plan
    if plan.pp == 1:
        return None, None
    e = 4 if plan.precision == "fp32" else 2
    act = m.seq_length // plan.cp * plan.micro_batch_size * m.hidden_size * e
    gather = collective_time("allgather", act, timer.layouts["tp"], timer.net) if plan.tp > 1 else 0.0
    spec = comm("sendrecv", "pp", act / plan.tp, gather)
    last = plan.pp * plan.virtual_pipeline_stages - 1
    return (spec if vs < last else None), (spec if vs > 0 else None)


def _chunk(sc: Scenario, timer: Timer, ps: _Passes, stage: int, chunk: int, split: bool) -> ChunkWork:
    plan = sc.plan
    layers, _ = _chunk_params(sc, stage, chunk)
    vs = virtual_stage(stage, chunk, plan.pp)
    first, last = vs == 0, vs == plan.pp * plan.virtual_pipeline_stages - 1
    fwd = [_work(ps.fwd)] * layers  # per layer; embedding and head join the first / last one
    bwd = [_work(ps.bwd, ps.recompute, split)] * layers
    wgt = [Work(ps.bwd.weight_grad)] * layers
    if first:
        fwd[0] = fwd[0] + _work(ps.emb_fwd)
        bwd[-1] = bwd[-1] + _work(ps.emb_bwd, drop_weight_grad=split)
        wgt[-1] = wgt[-1] + Work(ps.emb_bwd.weight_grad)
    if last:
        fwd[-1] = fwd[-1] + _work(ps.head_fwd)
        bwd[0] = bwd[0] + _work(ps.head_bwd, drop_weight_grad=split)
        wgt[0] = wgt[0] + Work(ps.head_bwd.weight_grad)
    bwd_label = ps.bwd_label or ps.fwd_label
    f_label = tp_label(layer_ops(sc.model, plan, "fwd"), layers)
    b_label = tp_label(layer_ops(sc.model, plan, "bwd"), layers) or bwd_label
    tasks = _tasks(sc, stage, chunk, fwd, bwd, wgt, split, (f_label, b_label))
    send_fwd, send_bwd = _send_specs(sc, timer, vs)
    return ChunkWork(tasks, send_fwd, send_bwd, layers)


def _tasks(sc: Scenario, stage: int, chunk: int, fwd: list[Work], bwd: list[Work], wgt: list[Work],
           split: bool, labels: tuple[str, str]) -> dict[tuple[str, bool], Task]:
    """Tasks of one chunk, with the plan's data-parallel traffic attached."""
    plan = sc.plan
    nbytes = _dp_bytes(sc, stage, chunk)
    producer = "W" if split else "B"
    f_label, b_label = labels
    zero3 = plan.zero_stage == 3 and axis_size(plan, _shard_axis(plan)) > 1
    if zero3:  # per layer: each waits for its own all-gathered parameters
        layers = len(fwd)
        gather = comm("allgather", _shard_axis(plan), nbytes["gather"] / layers)
        rs = _pieces(sc, nbytes["grads16"], layers, per_segment=True)
        tasks = {
            ("F", False): Task(tuple(fwd), (gather,) * layers, (), f_label),
            ("B", False): Task(tuple(bwd), (gather,) * layers, rs if not split else (), b_label),
        }
        if split:
            tasks[("W", False)] = Task(tuple(wgt), (), rs)
        return tasks
    whole = {"F": Task((_sum(fwd),), (), (), f_label), "B": Task((_sum(bwd),), (), (), b_label)}
    if split:
        whole["W"] = Task((_sum(wgt),))
    tasks = {(k, False): t for k, t in whole.items()}
    pieces: tuple[GradPiece, ...] = ()
    if plan.dp > 1 and plan.zero_stage == 2:  # every micro-batch, as its backward produces them
        count = min(len(fwd), math.ceil(nbytes["grads16"] / plan.ddp_bucket_size_bytes))
        pieces = _pieces(sc, nbytes["grads16"], count, per_segment=False)
        tasks[(producer, False)] = _with_pieces(whole[producer], pieces)
    elif plan.dp > 1 and plan.overlap_grad_reduce:  # DDP / ZeRO-1: the last micro-batch's buckets
        tasks[(producer, True)] = _with_pieces(whole[producer], _bucket_pieces(sc, nbytes["grads"]))
    return tasks


def _with_pieces(task: Task, pieces: tuple[GradPiece, ...]) -> Task:
    return Task(task.segments, task.gathers, pieces, task.tp_name)


def _sum(works: list[Work]) -> Work:
    out = Work()
    for w in works:
        out = out + w
    return out


def _notes(sc: Scenario) -> list[str]:
    plan = sc.plan
    notes = []
    if plan.dp > 1:
        if plan.zero_stage == 3:
            notes.append("ZeRO-3/FSDP: per-layer parameter all-gather (prefetched one layer ahead) "
                         "and gradient reduce-scatter")
        elif plan.zero_stage == 2:
            notes.append("ZeRO-2: every micro-batch's gradients reduce-scattered during its backward")
        elif plan.overlap_grad_reduce:
            kind = "all-reduce" if plan.zero_stage == 0 else "reduce-scatter"
            notes.append(f"gradient {kind} in {size_label(plan.ddp_bucket_size_bytes)} buckets "
                         "overlapping each chunk's last backward")
        else:
            notes.append("gradient sync after the pipeline flush (no overlap)")
    if plan.offload.any:
        notes.append("offload is not simulated by the event engine (use --engine analytic)")
    if plan.grad_compression.enabled:
        notes.append("gradient compression is not simulated by the event engine")
    if plan.gradient_sync != "allreduce":
        notes.append(f"{plan.gradient_sync} simulated as an all-reduce")
    return notes
