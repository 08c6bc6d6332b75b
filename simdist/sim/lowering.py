"""Lowering: a scenario -> the work of each pipeline stage in one optimizer step (pure, no simpy).

Each (micro-batch, chunk) action of the pipeline schedule becomes one task on the stage's
compute stream whose length comes from the layer's op list (:mod:`simdist.sim.ops`) timed with
the cost model and the closed-form TP/CP collective times at op granularity, exactly as the
closed-form engine does (:class:`simdist.analytic.steptime.Timer`): a chunk's layers are
aggregated into one task, the exposed TP communication kept as its own figure. Under ZeRO-3 a
task is split per layer, because each layer waits for its own parameter all-gather.

Communication that the engine puts on the network is described, not timed, here
(:class:`CommSpec`): pipeline sends (Megatron's scatter/gather p2p), and the data-parallel
collectives of the plan as :func:`simdist.analytic.systems.dp_traffic` lists them for both
engines (ZeRO-0/1/2/3, FSDP/HSDP, ZeRO++ quantized gathers, compressed gradients), attached to
the tasks that make them ready:

- gradient sync once per step (DDP all-reduce, ZeRO-1 reduce-scatter) in ``ddp_bucket_size``
  buckets filled as each chunk's last backward runs (PyTorch DDP, Li et al. VLDB 2020;
  Megatron's overlapped grad reduce), or after the pipeline flush without ``overlap_grad_reduce``;
- ZeRO-2/3: every micro-batch's per-layer gradient reduce-scatter as backward produces it;
- ZeRO-3 / FSDP: each layer's parameter all-gathers before its forward and its backward (again
  for the recomputed forward), prefetched one layer ahead (Zhao et al. VLDB 2023, sec 3.3.2);
- ZeRO-1/2: the updated parameters all-gathered after the optimizer (with Megatron's
  ``--overlap-param-gather``, bucket by bucket behind the next step's first forward).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from simdist.analytic.params import (
    embedding_params,
    head_params,
    layer_params,
    stage_layer_ranges,
    stage_num_layers,
)
from simdist.analytic.steptime import ZERO_PASS, PassTime, Timer, optimizer_time, stage_time
from simdist.analytic.systems import CollectiveCall, DataParallelTraffic, dp_traffic
from simdist.cost import CostModel
from simdist.sim.collectives import Network, collective_time
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
    gathers: tuple[tuple[CommSpec, ...], ...] = ()  # ZeRO-3: per segment, prefetched one ahead
    pieces: tuple[GradPiece, ...] = ()  # gradient reductions it starts, ordered by segment
    tp_name: str = ""
    # ZeRO-2/3: the backward returns only when its reductions are done (DeepSpeed's
    # overlapping_partition_gradients_reduce_epilogue; FSDP's post-backward final callback)
    drain: bool = False

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
    post_hides_in_forward: bool = False  # Megatron --overlap-param-gather: behind the next
    first_forward: float = 0.0  # step's first forward, which takes this long on the stage


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


def calls(entries: tuple[CollectiveCall, ...], per: int = 1, share: float = 1.0) -> tuple[CommSpec, ...]:
    """The collectives of one of ``per`` equal pieces (a layer, a bucket) of ``entries``' calls,
    bytes scaled by ``share``: e.g. one layer of a ZeRO-3 gather issued calls/layers times."""
    out: list[CommSpec] = []
    for e in entries:
        n = max(1, round(e.calls / per))
        out += [comm(e.kind, e.axis, e.bytes * share * e.calls / per / n)] * n
    return tuple(out)


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
        # the recomputation the closed form charges stage 0, per layer (full or selective)
        self.recompute = stage_time(timer, 0).recompute * (1.0 / stage_num_layers(m, plan, 0))


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


def _stage(sc: Scenario, timer: Timer, passes: _Passes, stage: int, actions: list[Action],
           split: bool) -> StageWork:
    plan = sc.plan
    p, v = plan.pp, plan.virtual_pipeline_stages
    traffic = dp_traffic(sc.model, plan, stage)
    params = [_chunk_params(sc, stage, c)[1] for c in range(v)]
    chunks = tuple(_chunk(sc, timer, passes, stage, c, split, traffic, params[c] / sum(params))
                   for c in range(v))
    deps = tuple(tuple(d for d in dependencies(a, stage, p, v, split) if d[0] != stage) for a in actions)
    flush = calls(traffic.step_grad_sync) if traffic.step_grad_sync and not plan.overlap_grad_reduce else ()
    nb = traffic.step_buckets
    behind_forward = (bool(traffic.post_step_gathers) and plan.zero_stage == 1 and plan.overlap_param_gather
                      and plan.overlap_grad_reduce and nb > 1)
    post = calls(traffic.post_step_gathers, per=nb) * nb if behind_forward else calls(traffic.post_step_gathers)
    first_forward = sum(c.task("F", False).work.total() for c in chunks)
    return StageWork(stage, chunks, tuple(actions), deps, flush, optimizer_time(timer, stage), post,
                     behind_forward, first_forward)


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


def _chunk(sc: Scenario, timer: Timer, ps: _Passes, stage: int, chunk: int, split: bool,
           traffic: DataParallelTraffic, share: float) -> ChunkWork:
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
    labels = (tp_label(layer_ops(sc.model, plan, "fwd"), layers),
              tp_label(layer_ops(sc.model, plan, "bwd"), layers))
    tasks = _tasks(sc, fwd, bwd, wgt, split, labels, traffic, share)
    send_fwd, send_bwd = _send_specs(sc, timer, vs)
    return ChunkWork(tasks, send_fwd, send_bwd, layers)


def _tasks(sc: Scenario, fwd: list[Work], bwd: list[Work], wgt: list[Work], split: bool,
           labels: tuple[str, str], traffic: DataParallelTraffic, share: float) -> dict[tuple[str, bool], Task]:
    """A chunk's tasks with the data-parallel traffic they start or wait for; ``share`` is the
    chunk's part of the stage's parameters. Per-layer traffic is listed per stage layer."""
    producer = "W" if split else "B"  # the task that produces the weight gradients
    f_label, b_label = labels
    layers, per = len(fwd), max(1, traffic.gather_chunks)
    if traffic.fwd_gathers:  # ZeRO-3: per layer, each waiting for its own parameters
        rs = calls(traffic.microbatch_grad_sync, per=per)
        pieces = tuple(GradPiece(k, 1.0, rs) for k in range(layers)) if rs else ()
        tasks = {
            ("F", False): Task(tuple(fwd), (calls(traffic.fwd_gathers, per=per),) * layers, (), f_label),
            ("B", False): Task(tuple(bwd), (calls(traffic.bwd_gathers, per=per),) * layers,
                               () if split else pieces, b_label, drain=bool(pieces) and not split),
        }
        if split:
            tasks[("W", False)] = Task(tuple(wgt), (), pieces, drain=bool(pieces))
        return tasks
    whole = {"F": Task((_sum(fwd),), (), (), f_label), "B": Task((_sum(bwd),), (), (), b_label)}
    if split:
        whole["W"] = Task((_sum(wgt),))
    tasks = {(k, False): t for k, t in whole.items()}
    if traffic.microbatch_grad_sync:  # ZeRO-2: each layer's gradients as backward produces them
        one = calls(traffic.microbatch_grad_sync, per=per)
        pieces = tuple(GradPiece(0, (k + 1) / layers, one) for k in range(layers))
        tasks[(producer, False)] = _with_pieces(whole[producer], pieces, drain=True)
    elif traffic.step_grad_sync and sc.plan.overlap_grad_reduce:  # the last micro-batch's buckets
        nb = traffic.step_buckets
        mine = max(1, round(nb * share))  # this chunk's buckets
        bucket = calls(traffic.step_grad_sync, per=nb, share=nb * share / mine)
        pieces = tuple(GradPiece(0, (k + 1) / mine, bucket) for k in range(mine))
        tasks[(producer, True)] = _with_pieces(whole[producer], pieces)
    return tasks


def _with_pieces(task: Task, pieces: tuple[GradPiece, ...], drain: bool = False) -> Task:
    return Task(task.segments, task.gathers, pieces, task.tp_name, drain)


def _sum(works: list[Work]) -> Work:
    out = Work()
    for w in works:
        out = out + w
    return out


def _notes(sc: Scenario) -> list[str]:
    plan = sc.plan
    if plan.dp == 1:
        return []
    if plan.zero_stage == 3:
        return ["ZeRO-3/FSDP: per-layer parameter all-gathers (prefetched one layer ahead) and "
                "gradient reduce-scatters"]
    if plan.zero_stage == 2:
        return ["ZeRO-2: every micro-batch's gradients reduce-scattered layer by layer during its backward"]
    if plan.overlap_grad_reduce:
        return [f"gradient sync in {size_label(plan.ddp_bucket_size_bytes)} buckets overlapping each "
                "chunk's last backward"]
    return ["gradient sync after the pipeline flush (no overlap)"]
