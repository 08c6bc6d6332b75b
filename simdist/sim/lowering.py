"""Lowering: a scenario -> the work of each pipeline stage in one optimizer step (pure, no simpy).

Each (micro-batch, chunk) action of the pipeline schedule becomes one task on the stage's
compute stream whose length comes from the layer's op list (:mod:`simdist.analytic.ops`) timed with
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

The mechanisms beyond 3D parallelism are lowered from the same pure descriptions the closed form
times (:mod:`simdist.analytic.systems`), never re-derived here:

- offload (:func:`~simdist.analytic.systems.offload_traffic` and ``offload_times``): each GPU's
  PCIe copies (:class:`HostXfer`): gradient partitions down after each layer's reduction (ZeRO-2/3,
  every micro-batch) or after each bucket (ZeRO-0/1, once per step); parameter shards up before
  each layer's gather (ZeRO-Infinity / FSDP parameter offload, with the NVMe reads that feed
  them); after the last backward, the CPU optimizer step, the upload of the updated parameters
  and the NVMe swap of the states, which DeepSpeed pipelines tile by tile, as concurrent work on
  the node's CPU, the GPU's PCIe link and the node's NVMe (shared by the node's GPUs);
- parameter servers (``ps_traffic``, ``cpu_optimizer_time``): per gradient bucket a push to the
  servers, their optimizer update on the servers' CPUs and a pull of the parameters
  (:class:`PsSpec`), issued as backward fills the buckets;
- gradient compression (``compression_kernel_bytes`` timed by the closed form's memory-bound
  model): the kernels as GPU work inside the backward that produces the gradients (``Work``'s
  ``compression``), before the smaller collectives ``dp_traffic`` already lists (top-k as an
  all-gather, PowerSGD as the P and Q all-reduces of each bucket).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from simdist.analytic import systems
from simdist.analytic.collectives import Network, collective_time
from simdist.analytic.cost import CostModel
from simdist.analytic.ops import Comm, Op, embedding_ops, head_ops, layer_ops
from simdist.analytic.params import (
    embedding_params,
    head_params,
    layer_params,
    params_per_rank,
    stage_layer_ranges,
    stage_num_layers,
)
from simdist.analytic.steptime import (
    ZERO_PASS,
    PassTime,
    Timer,
    end_of_step,
    optimizer_time,
    stage_time,
)
from simdist.analytic.systems import CollectiveCall, DataParallelTraffic, dp_traffic
from simdist.sim.schedules import Action, dependencies, schedule, virtual_stage
from simdist.spec.scenario import Scenario

MiB = 2**20


@dataclass(frozen=True, slots=True)
class Work:
    """Compute-stream time of one piece of a task."""

    compute: float = 0.0
    recompute: float = 0.0
    tp: float = 0.0  # exposed TP/CP communication inside the task
    compression: float = 0.0  # gradient compression kernels (memory-bound GPU work)
    sync: float = 0.0  # waits at per-layer sync points (PassTime.sync_wait): already the slowest rank's

    def total(self, factor: float = 1.0) -> float:
        """Length on a GPU whose compute is ``factor`` times slower."""
        return (self.compute + self.recompute + self.compression) * factor + self.tp + self.sync

    def __add__(self, o: Work) -> Work:
        return Work(self.compute + o.compute, self.recompute + o.recompute, self.tp + o.tp,
                    self.compression + o.compression, self.sync + o.sync)


@dataclass(frozen=True, slots=True)
class CommSpec:
    """One transfer the engine times on the network."""

    name: str  # "allreduce dp 25 MiB", "sendrecv pp 6 MiB"
    collective: str
    axis: str  # dp | dp_shard | dp_replica (collectives), pp (point-to-point)
    nbytes: float
    extra_s: float = 0.0  # fixed time after it (Megatron's TP all-gather after a scattered send)


HOST_RESOURCES = ("pcie_down", "pcie_up", "nvme", "cpu")


@dataclass(frozen=True, slots=True)
class HostXfer:
    """Host-side work of one GPU: ``parts`` are (resource, solo seconds) pairs that run at the
    same time, each on its own resource (see HOST_RESOURCES): the GPU's PCIe link down (GPU to
    host) or up, and this GPU's share of the node's NVMe traffic and of the node's CPU optimizer
    step, timed as if it had the resource alone; the engine shares the node's NVMe and CPU
    among the GPUs that use them at once (:meth:`simdist.sim.network.LinkModel.host`)."""

    name: str
    parts: tuple[tuple[str, float], ...]

    def seconds(self, resource: str) -> float:
        return sum(t for r, t in self.parts if r == resource)

    def scaled(self, k: float, name: str | None = None) -> HostXfer:
        return HostXfer(name or self.name, tuple((r, t * k) for r, t in self.parts))


@dataclass(frozen=True, slots=True)
class PsSpec:
    """One gradient bucket of the parameter-server modes: pushed to the servers (``nbytes`` per
    worker rank, split evenly over them), applied by the servers' CPUs (``update_s`` on the
    busiest server node, alone) and pulled back."""

    name: str
    key: tuple[int, int]  # (chunk, bucket): the servers' key range, met by every replica (sync)
    nbytes: float
    update_s: float


@dataclass(frozen=True, slots=True)
class GradPiece:
    """Gradients ready ``at`` (a fraction) through segment ``segment`` of a task, then reduced
    (``comms``: collectives, or the parameter-server push/pull) and copied to the host (``down``,
    optimizer offload), in that order."""

    segment: int
    at: float
    comms: tuple[CommSpec | PsSpec, ...]
    down: HostXfer | None = None


@dataclass(frozen=True)
class Task:
    """One action's work: segments run back to back on the compute stream."""

    segments: tuple[Work, ...]
    gathers: tuple[tuple[CommSpec, ...], ...] = ()  # ZeRO-3: per segment, prefetched one ahead
    pieces: tuple[GradPiece, ...] = ()  # gradient reductions it starts, ordered by segment
    tp_name: str = ""
    # ZeRO-2/3: the backward returns only when its reductions (and, with optimizer offload, the
    # copies to the host) are done (DeepSpeed's overlapping_partition_gradients_reduce_epilogue;
    # FSDP's post-backward final callback)
    drain: bool = False
    # parameter offload: per segment, the shard fetched from the host (and NVMe) before its gather
    uploads: tuple[HostXfer | None, ...] = ()

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
    flush: tuple[GradPiece, ...]  # gradient sync after the pipeline flush (no overlap)
    optimizer: float
    post_optimizer: tuple[CommSpec, ...]  # ZeRO-1/2 parameter all-gather
    post_hides_in_forward: bool = False  # Megatron --overlap-param-gather: behind the next
    first_forward: float = 0.0  # step's first forward, which takes this long on the stage
    flush_compression: float = 0.0  # compression kernels before a sync after the flush
    host_step: HostXfer | None = None  # ZeRO-Offload: CPU step + parameter upload + NVMe swap
    host_after_optimizer: HostXfer | None = None  # parameter offload: updated shard back to host


@dataclass(frozen=True)
class Lowered:
    stages: tuple[StageWork, ...]
    split_backward: bool
    notes: tuple[str, ...]


@dataclass(frozen=True)
class StageSystems:
    """What the mechanisms beyond 3D add to one stage's work (from simdist.analytic.systems)."""

    down_per_layer: HostXfer | None = None  # ZeRO-2/3 + optimizer offload, every micro-batch
    up_fwd_per_layer: HostXfer | None = None  # parameter offload: before each forward gather
    up_bwd_per_layer: HostXfer | None = None  # ... and each backward (and recompute) gather
    down_per_step: HostXfer | None = None  # ZeRO-0/1 + optimizer offload: the gradients, once
    host_step: HostXfer | None = None
    host_after_optimizer: HostXfer | None = None
    compression_per_microbatch: float = 0.0  # ZeRO-2/3: kernels of every micro-batch's sync
    compression_per_step: float = 0.0  # ZeRO-0/1 and parameter servers: kernels of the one sync
    down_buckets: int = 1  # buckets of down_per_step when no collective sets them (dp = 1)
    ps_bytes: float = 0.0  # parameter servers: one worker rank's push (= its pull) per step
    ps_buckets: int = 0  # buckets it is pushed in (0: no parameter servers)
    ps_update_s: float = 0.0  # the busiest server node's CPU update of the stage, per step


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
    return Work(compute, recompute.compute, p.tp_exposed + p.cp_exposed + recompute.tp_exposed + recompute.cp_exposed,
                sync=p.sync_wait + recompute.sync_wait)


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
    split = plan.split_backward
    sched = schedule(plan.schedule, plan.pp, plan.num_microbatches, plan.virtual_pipeline_stages)
    stages = tuple(_stage(sc, timer, passes, s, sched[s], split) for s in range(plan.pp))
    return Lowered(stages, split, tuple(_notes(sc)))


def _stage(sc: Scenario, timer: Timer, passes: _Passes, stage: int, actions: list[Action],
           split: bool) -> StageWork:
    plan = sc.plan
    p, v = plan.pp, plan.virtual_pipeline_stages
    traffic = dp_traffic(sc.model, plan, stage)
    extra = stage_systems(sc, timer, stage)
    params = [_chunk_params(sc, stage, c)[1] for c in range(v)]
    chunks = tuple(_chunk(sc, timer, passes, stage, c, split, traffic, extra, params[c] / sum(params))
                   for c in range(v))
    deps = tuple(tuple(d for d in dependencies(a, stage, p, v, split) if d[0] != stage) for a in actions)
    flush: tuple[GradPiece, ...] = ()
    flush_compression = 0.0
    if not plan.overlap_grad_reduce:  # one sync of the whole buffer after the pipeline flush
        comms: tuple[CommSpec | PsSpec, ...] = calls(traffic.step_grad_sync)
        if extra.ps_buckets:
            comms += (_ps_spec(extra, (0, 0), 1.0),)
        if comms or extra.down_per_step:
            flush = (GradPiece(0, 1.0, comms, extra.down_per_step),)
        flush_compression = extra.compression_per_step
    nb = traffic.step_buckets
    behind_forward = (bool(traffic.post_step_gathers) and plan.zero_stage == 1 and plan.overlap_param_gather
                      and plan.overlap_grad_reduce and nb > 1)
    post = calls(traffic.post_step_gathers, per=nb) * nb if behind_forward else calls(traffic.post_step_gathers)
    first_forward = sum(c.task("F", False).work.total() for c in chunks)
    return StageWork(stage, chunks, tuple(actions), deps, flush, optimizer_time(timer, stage), post,
                     behind_forward, first_forward, flush_compression, extra.host_step,
                     extra.host_after_optimizer)


def stage_systems(sc: Scenario, timer: Timer, stage: int) -> StageSystems:
    """Offload transfers, parameter-server buckets and compression kernels of one GPU of
    ``stage``: the byte counts and solo seconds of :mod:`simdist.analytic.systems` (offload_times
    applied to one kind of traffic at a time, so each resource gets its own transfer), and the
    kernel times the closed form charges (steptime.stage_time / end_of_step)."""
    m, plan, cluster = sc.model, sc.plan, sc.cluster
    out: dict[str, object] = {}
    tr = systems.offload_traffic(m, plan, cluster, stage)
    if tr.used and cluster.host is not None:
        out.update(_offload_work(sc, tr))
    if plan.grad_compression.enabled and plan.dp > 1:
        st = stage_time(timer, stage)
        if plan.shards_gradients:
            out["compression_per_microbatch"] = st.compression_per_microbatch
        else:
            out["compression_per_step"] = end_of_step(timer, stage, st).compression
    if plan.uses_parameter_servers:
        ps = systems.ps_traffic(m, plan, cluster, stage)
        out["ps_bytes"] = ps.worker_bytes
        out["ps_buckets"] = systems.grad_buckets(ps.worker_bytes, plan)
        if cluster.host is not None:
            # the busiest server node applies its servers' share of this stage's parameters
            # (every TP/CP rank's shard) once per push: systems.ps_times' server step, per stage
            n = params_per_rank(m, plan, stage) * plan.tp * plan.cp / ps.servers * ps.servers_per_node
            out["ps_update_s"] = systems.cpu_optimizer_time(n, plan, cluster.host)
    return StageSystems(**out)  # type: ignore[arg-type]


def _offload_work(sc: Scenario, tr: systems.OffloadTraffic) -> dict[str, object]:
    plan, cluster = sc.plan, sc.cluster
    gpn = systems.gpus_per_node_in_job(cluster)
    layers = max(1, tr.gather_chunks)

    def alone(**traffic: float) -> systems.OffloadTimes:
        """offload_times of one kind of traffic: its seconds on its own resource."""
        return systems.offload_times(systems.OffloadTraffic(**traffic), cluster, plan)  # type: ignore[arg-type]

    def xfer(name: str, *parts: tuple[str, float]) -> HostXfer | None:
        kept = tuple(p for p in parts if p[1] > 0)
        return HostXfer(name, kept) if kept else None

    out: dict[str, object] = {}
    # node resources (NVMe, CPU) are given as one GPU's share: the engine adds the node's GPUs
    down_mb = alone(pcie_down_per_microbatch=tr.pcie_down_per_microbatch).pcie_down_per_microbatch
    out["down_per_layer"] = xfer("gradients to host", ("pcie_down", down_mb / layers))
    up_mb = alone(pcie_up_per_microbatch=tr.pcie_up_per_microbatch).pcie_up_per_microbatch
    nvme_mb = alone(nvme_per_microbatch_node=tr.nvme_per_microbatch_node).pcie_up_per_microbatch / gpn
    up = xfer(f"parameters from {plan.offload.params}", ("pcie_up", up_mb), ("nvme", nvme_mb))
    if up is not None:  # one forward gather and (gathers - 1) in backward, per layer
        gathers = 3 if plan.recompute == "full" else 2
        out["up_fwd_per_layer"] = up.scaled(1 / (gathers * layers))
        out["up_bwd_per_layer"] = up.scaled((gathers - 1) / (gathers * layers))
    down_step = alone(pcie_down_per_step=tr.pcie_down_per_step).before_step
    up_step = alone(pcie_up_per_step=tr.pcie_up_per_step).after_step
    nvme_step = alone(nvme_per_step_node=tr.nvme_per_step_node).after_step / gpn
    cpu = alone(cpu_params_node=tr.cpu_params_node).cpu_step / gpn
    if plan.offload.optimizer != "none":
        out["down_per_step"] = xfer("gradients to host", ("pcie_down", down_step))
        out["down_buckets"] = systems.grad_buckets(tr.pcie_down_per_step, plan)
        out["host_step"] = xfer("CPU optimizer step", ("cpu", cpu), ("pcie_up", up_step), ("nvme", nvme_step))
    else:  # the GPU optimizer's updated parameter shard goes back to the host (and NVMe)
        out["host_after_optimizer"] = xfer("updated parameters to host", ("pcie_down", down_step),
                                           ("nvme", nvme_step))
    return out


def _ps_spec(extra: StageSystems, key: tuple[int, int], share: float) -> PsSpec:
    nbytes = extra.ps_bytes * share
    return PsSpec(f"push+pull ps {size_label(nbytes)}", key, nbytes, extra.ps_update_s * share)


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
    e = plan.element_bytes
    act = m.seq_length // plan.cp * plan.micro_batch_size * m.hidden_size * e
    gather = collective_time("allgather", act, timer.layouts["tp"], timer.net) if plan.tp > 1 else 0.0
    spec = comm("sendrecv", "pp", act / plan.tp, gather)
    last = plan.pp * plan.virtual_pipeline_stages - 1
    return (spec if vs < last else None), (spec if vs > 0 else None)


def _chunk(sc: Scenario, timer: Timer, ps: _Passes, stage: int, chunk: int, split: bool,
           traffic: DataParallelTraffic, extra: StageSystems, share: float) -> ChunkWork:
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
    if extra.compression_per_microbatch:  # ZeRO-2/3: each layer's gradients compressed as produced
        kernels = Work(compression=extra.compression_per_microbatch * share / layers)
        if split:
            wgt = [w + kernels for w in wgt]
        else:
            bwd = [w + kernels for w in bwd]
    labels = (tp_label(layer_ops(sc.model, plan, "fwd"), layers),
              tp_label(layer_ops(sc.model, plan, "bwd"), layers))
    tasks = _tasks(sc, fwd, bwd, wgt, split, labels, traffic, extra, chunk, share)
    send_fwd, send_bwd = _send_specs(sc, timer, vs)
    return ChunkWork(tasks, send_fwd, send_bwd, layers)


def _tasks(sc: Scenario, fwd: list[Work], bwd: list[Work], wgt: list[Work], split: bool,
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
        tasks = {
            ("F", False): Task(tuple(fwd), (calls(traffic.fwd_gathers, per=per),) * layers, (), f_label,
                               uploads=up_f),
            ("B", False): Task(tuple(bwd), (calls(traffic.bwd_gathers, per=per),) * layers,
                               () if split else pieces, b_label, drain=bool(pieces) and not split, uploads=up_b),
        }
        if split:
            tasks[("W", False)] = Task(tuple(wgt), (), pieces, drain=bool(pieces))
        return tasks
    whole = {"F": Task((_sum(fwd),), (), (), f_label), "B": Task((_sum(bwd),), (), (), b_label)}
    if split:
        whole["W"] = Task((_sum(wgt),))
    tasks = {(k, False): t for k, t in whole.items()}
    if traffic.microbatch_grad_sync or down:  # ZeRO-2: each layer's gradients as backward produces them
        one = calls(traffic.microbatch_grad_sync, per=per)
        pieces = tuple(GradPiece(0, (k + 1) / layers, one, down) for k in range(layers))
        tasks[(producer, False)] = _with_pieces(whole[producer], pieces, drain=True)
    elif sc.plan.overlap_grad_reduce and (traffic.step_grad_sync or extra.ps_buckets or extra.down_per_step):
        # the last micro-batch's buckets: DDP all-reduces, parameter-server pushes, host copies
        nb = traffic.step_buckets if traffic.step_grad_sync else extra.ps_buckets or extra.down_buckets
        mine = max(1, round(nb * share))  # this chunk's buckets
        bucket = calls(traffic.step_grad_sync, per=nb, share=nb * share / mine)
        dn = extra.down_per_step.scaled(share / mine) if extra.down_per_step else None
        pieces = tuple(GradPiece(0, (k + 1) / mine, bucket + ((_ps_spec(extra, (chunk, k), share / mine),)
                                                              if extra.ps_buckets else ()), dn)
                       for k in range(mine))
        task = _with_pieces(whole[producer], pieces)
        if extra.compression_per_step:  # the buckets' compression kernels, as backward fills them
            seg = task.segments[0] + Work(compression=extra.compression_per_step * share)
            task = Task((seg,), task.gathers, task.pieces, task.tp_name, task.drain)
        tasks[(producer, True)] = task
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
    elif plan.zero_stage == 2:
        out.append("ZeRO-2: every micro-batch's gradients reduce-scattered layer by layer during its backward")
    elif plan.overlap_grad_reduce:
        out.append(f"gradient sync in {size_label(plan.ddp_bucket_size_bytes)} buckets overlapping each "
                   "chunk's last backward")
    else:
        out.append("gradient sync after the pipeline flush (no overlap)")
    return out
