"""Closed-form step time: the fast engine (`predict --engine analytic`) and the search's ranker.

Per pipeline stage and micro-batch: compute from the layer's ops (simdist.analytic.ops) timed by the
cost model, TP collectives on the links their group crosses, exposed unless overlapped with a
GEMM (the backward data-grad all-reduce runs beside the weight-grad GEMM, Megatron's async TP
all-reduce; all TP traffic with ``tp_comm_overlap``). The pipeline then costs
  1F1B / GPipe:   (m - 1) * t_max + sum_s t_s                   (= (m + p - 1) t if uniform)
  interleaved:    m * t_max + (sum_s t_s - t_max) / v            (= (m + (p-1)/v) t)
  zero-bubble:    m * t_max + (p - 1)(t - 2 t_W)                  (ZB-H1, Qi et al. 2024)
(Narayanan et al. SC'21 sec 2.2; DualPipe README's bubble table for ZB1P), then the data-parallel
gradient sync that backward could not hide, and the optimizer step.

The mechanisms beyond 3D parallelism (hybrid sharding, ZeRO++ quantized collectives, gradient
compression, DDP buckets, CPU/NVMe offload, parameter servers) come from
:mod:`simdist.analytic.systems`, which the discrete-event engine's lowering shares; this module
only decides what overlaps with what in closed form and fills the breakdown (``offload`` and
``compression`` appear only when the plan uses them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simdist.analytic import systems
from simdist.analytic.collectives import Network, collective_time, layout_for_axis
from simdist.analytic.cost import CostModel, optimizer_bytes_per_param
from simdist.analytic.memory import state_bytes
from simdist.analytic.ops import Comm, Compute, Op, embedding_ops, head_ops, layer_ops
from simdist.analytic.params import params_per_rank, stage_num_layers
from simdist.spec.plan import ParallelPlan
from simdist.spec.scenario import Scenario


@dataclass(frozen=True, slots=True)
class PassTime:
    compute: float = 0.0
    tp_exposed: float = 0.0
    cp_exposed: float = 0.0
    weight_grad: float = 0.0  # the W part of backward (zero-bubble)
    sync_wait: float = 0.0  # waits at per-layer sync points for the slowest rank (sync_wait_fraction)

    def __add__(self, o: PassTime) -> PassTime:
        return PassTime(self.compute + o.compute, self.tp_exposed + o.tp_exposed,
                        self.cp_exposed + o.cp_exposed, self.weight_grad + o.weight_grad,
                        self.sync_wait + o.sync_wait)

    def __mul__(self, k: float) -> PassTime:
        return PassTime(self.compute * k, self.tp_exposed * k, self.cp_exposed * k, self.weight_grad * k,
                        self.sync_wait * k)

    @property
    def total(self) -> float:
        return self.compute + self.tp_exposed + self.cp_exposed + self.sync_wait


ZERO_PASS = PassTime()


class Timer:
    """Times op lists of one scenario with one cost model and network."""

    def __init__(self, sc: Scenario, cost: CostModel, net: Network):
        self.sc, self.cost, self.net = sc, cost, net
        self.layouts = {ax: layout_for_axis(sc.cluster, sc.plan, ax)
                        for ax in ("tp", "cp", "pp", "dp", "dp_shard", "dp_replica")}
        self.ctx = systems.CommContext(sc.cluster, sc.plan, net)
        self._passes: dict[tuple[Op, ...], PassTime] = {}
        self.op_extra = framework_overhead(sc, cost)
        self.sync_wait = sync_wait_fraction(sc, cost)

    def memory_time(self, nbytes: float, kernels: int = 1) -> float:
        """A memory-bound pass of ``nbytes`` of HBM traffic on one GPU."""
        if nbytes <= 0:
            return 0.0
        return nbytes / (self.cost.memory_bandwidth * self.cost.memory_efficiency(nbytes)) \
            + kernels * self.cost.kernel_overhead

    def comm(self, op: Comm) -> float:
        return collective_time(op.collective, op.bytes, self.layouts[op.axis], self.net)

    def passes(self, ops: tuple[Op, ...]) -> PassTime:
        """Sum an op list; a comm hides behind the GEMM it may overlap with (memoised: every
        stage times the same layer op lists)."""
        cached = self._passes.get(ops)
        if cached is None:
            cached = self._passes[ops] = self._sum(ops)
        return cached

    def _sum(self, ops: tuple[Op, ...]) -> PassTime:
        plan = self.sc.plan
        compute = tp = cp = w = 0.0
        prev: Compute | None = None
        for i, op in enumerate(ops):
            if isinstance(op, Compute):
                t = self.cost.time(op) + self.op_extra
                compute += t
                if op.name.endswith("wgrad"):
                    w += t
                prev = op
                continue
            t = self.comm(op)
            hide = 0.0
            nxt = ops[i + 1] if i + 1 < len(ops) and isinstance(ops[i + 1], Compute) else None
            if op.axis == "cp" and nxt is not None:
                hide = self.cost.time(nxt)  # ring attention overlaps KV exchange with compute
            elif prev is not None and prev.name.endswith("wgrad"):
                hide = self.cost.time(prev)  # async data-grad all-reduce beside the wgrad GEMM
            elif plan.tp_comm_overlap and nxt is not None and nxt.kind == "gemm":
                hide = self.cost.time(nxt)
            elif plan.tp_comm_overlap and prev is not None and prev.kind == "gemm":
                hide = self.cost.time(prev)
            exposed = max(0.0, t - hide)
            if op.axis == "cp":
                cp += exposed
            else:
                tp += exposed
        return PassTime(compute, tp, cp, w, compute * self.sync_wait)


def software_layers(sc: Scenario) -> tuple[str, ...]:
    """The software layers a calibration profile fits separately that this plan runs through:
    "tp" (DTensor tensor parallelism) and "zero3" (FSDP2 sharded parameters)."""
    return (("tp",) if sc.plan.tp > 1 else ()) + (("zero3",) if sc.plan.shards_params else ())


def framework_overhead(sc: Scenario, cost: CostModel) -> float:
    """Extra framework seconds per compute op that a calibration profile measured for the
    software layers this plan runs through; 0 otherwise."""
    over = cost.profile.framework_overheads_s if cost.profile else {}
    return sum(over.get(k, 0.0) for k in software_layers(sc))


def sync_wait_part(plan: ParallelPlan) -> str:
    """The breakdown part the sync-point waits belong to: the TP/CP collectives that are the
    sync points, or (ZeRO-3 without them) the parameter gathers."""
    return "tp_comm" if plan.tp * plan.cp > 1 else "dp_comm"


def sync_wait_fraction(sc: Scenario, cost: CostModel) -> float:
    """Wait at the per-layer sync points of this plan per second of compute (profile's
    ``sync_wait_fractions`` of its software layers); 0 otherwise."""
    fr = cost.profile.sync_wait_fractions if cost.profile else {}
    return sum(fr.get(k, 0.0) for k in software_layers(sc))


@dataclass(frozen=True, slots=True)
class StageTime:
    """One micro-batch through every chunk of one stage."""

    fwd: PassTime
    bwd: PassTime
    recompute: PassTime
    p2p: float  # exposed pipeline send/recv per micro-batch
    dp_per_microbatch: float  # exposed ZeRO-2/3 traffic per micro-batch
    offload_per_microbatch: float = 0.0  # exposed PCIe/NVMe traffic per micro-batch
    compression_per_microbatch: float = 0.0  # gradient compression kernels per micro-batch

    @property
    def total(self) -> float:
        return (self.fwd.total + self.bwd.total + self.recompute.total + self.p2p + self.dp_per_microbatch
                + self.offload_per_microbatch + self.compression_per_microbatch)


def stage_time(timer: Timer, stage: int) -> StageTime:
    sc = timer.sc
    m, plan = sc.model, sc.plan
    layers = stage_num_layers(m, plan, stage)
    fwd_layer = timer.passes(layer_ops(m, plan, "fwd"))
    bwd_layer = timer.passes(layer_ops(m, plan, "bwd"))
    fwd, bwd = fwd_layer * layers, bwd_layer * layers
    if stage == 0:
        fwd, bwd = fwd + timer.passes(embedding_ops(m, plan, "fwd")), bwd + timer.passes(embedding_ops(m, plan, "bwd"))
    if stage == plan.pp - 1:
        fwd, bwd = fwd + timer.passes(head_ops(m, plan, "fwd")), bwd + timer.passes(head_ops(m, plan, "bwd"))
    recompute = ZERO_PASS
    if plan.recompute == "full":
        recompute = fwd_layer * layers
    elif plan.recompute == "selective" and not plan.flash_attention:
        core = tuple(op for op in layer_ops(m, plan, "fwd")
                     if isinstance(op, Compute) and op.name in ("QK^T", "AV", "softmax"))
        recompute = timer.passes(core) * layers
    p2p = 0.0
    if plan.pp > 1:
        e = plan.element_bytes
        act = m.seq_length // plan.cp * plan.micro_batch_size * m.hidden_size * e
        # Megatron's scatter/gather: each TP rank sends 1/t of the activation, then all-gathers
        sent = act / plan.tp
        one = collective_time("sendrecv", sent, timer.layouts["pp"], timer.net)
        if plan.tp > 1:
            one += collective_time("allgather", act, timer.layouts["tp"], timer.net)
        p2p = 2 * plan.virtual_pipeline_stages * one
    t_fwd, t_bwd = fwd.total, bwd.total + recompute.total
    dp = data_parallel_times(timer, stage, t_fwd, t_bwd)
    off = offload_per_microbatch(timer, stage, t_fwd, t_bwd, dp)
    comp = 0.0
    if plan.shards_gradients and plan.dp > 1:  # ZeRO-2/3 compress every micro-batch's reduce-scatter
        comp = timer.memory_time(systems.compression_kernel_bytes(m, plan, stage), kernels=2 * layers)
    return StageTime(fwd, bwd, recompute, p2p, dp.per_microbatch, off, comp)


# --- data parallel ------------------------------------------------------------------------


def data_parallel_times(timer: Timer, stage: int, t_fwd: float, t_bwd: float,
                        last_bwd: float | None = None) -> systems.DataParallelTimes:
    """Exposed DP communication of one GPU of ``stage`` (systems.dp_traffic timed and overlapped
    with one micro-batch's forward ``t_fwd`` and backward ``t_bwd``)."""
    sc = timer.sc
    tr = systems.dp_traffic(sc.model, sc.plan, stage)
    return systems.dp_times(timer.ctx, tr, sc.plan, t_fwd, t_bwd, last_bwd=last_bwd)


def offload_per_microbatch(timer: Timer, stage: int, t_fwd: float, t_bwd: float,
                           dp: systems.DataParallelTimes) -> float:
    """Exposed PCIe/NVMe time per micro-batch beyond what the DP traffic already exposes.

    Gradient partitions go down layer by layer as their reduce-scatter finishes, on the copy
    engine, beside the backward (Ren et al. 2021 sec 4.2); offloaded parameter shards come up
    ahead of each layer's all-gather, prefetched like it. Each is its own pipeline, so the
    exposed time is the longest of: the DP exposure, the transfer's own exposure, and the
    last layer's reduce-scatter followed by its download (the first layer's upload followed by
    its gather)."""
    sc = timer.sc
    plan = sc.plan
    tr = systems.offload_traffic(sc.model, plan, sc.cluster, stage)
    if not (tr.pcie_down_per_microbatch or tr.pcie_up_per_microbatch):
        return 0.0
    t = systems.offload_times(tr, sc.cluster, plan)
    chunks = tr.gather_chunks
    extra = 0.0
    if t.pcie_down_per_microbatch:
        down = t.pcie_down_per_microbatch
        rs_tail = dp.grad_sync / chunks
        combined = max(dp.bwd_exposed, systems.prefetch_exposed(down, chunks, t_bwd), rs_tail + down / chunks)
        extra += combined - dp.bwd_exposed
    if t.pcie_up_per_microbatch:
        gathers = 3 if plan.recompute == "full" else 2
        up_f, up_b = t.pcie_up_per_microbatch / gathers, t.pcie_up_per_microbatch * (gathers - 1) / gathers
        f = max(dp.fwd_exposed, systems.prefetch_exposed(up_f, chunks, t_fwd),
                (up_f + dp.gather_fwd) / chunks)
        b = max(dp.bwd_exposed, systems.prefetch_exposed(up_b, chunks, t_bwd))
        extra += (f - dp.fwd_exposed) + (b - dp.bwd_exposed)
    return max(0.0, extra)


def optimizer_time(timer: Timer, stage: int) -> float:
    """The optimizer step on the GPU (fused multi-tensor kernels, HBM-bound; cost.py): zero when
    the optimizer runs on the CPU (ZeRO-Offload) or on parameter servers."""
    sc = timer.sc
    plan = sc.plan
    if plan.offload.optimizer != "none" or plan.uses_parameter_servers:
        return 0.0
    n = params_per_rank(sc.model, plan, stage)
    if plan.shards_optimizer:
        n /= plan.dp_shard
    b = state_bytes(sc.model, plan)
    traffic = n * optimizer_bytes_per_param(plan.optimizer, plan.precision, b.grads)
    return traffic / (timer.cost.memory_bandwidth * timer.cost.memory_efficiency(traffic)) + 20 * timer.cost.kernel_overhead


# --- the step -----------------------------------------------------------------------------


@dataclass(frozen=True)
class StepResult:
    step_time: float
    breakdown: dict[str, float]
    bubble_fraction: float
    stage_times: tuple[StageTime, ...]
    busiest_stage: int
    extras: dict[str, object] = field(default_factory=dict)


def pipeline_time(plan, times: list[float], weight_grads: list[float]) -> float:
    m, v = plan.num_microbatches, plan.virtual_pipeline_stages
    t_max = max(times)
    if plan.pp == 1:
        return m * t_max
    if plan.interleaved:
        return m * t_max + (sum(times) - t_max) / v
    if plan.split_backward:
        i = times.index(t_max)
        fill = sum(t - 2 * w for j, (t, w) in enumerate(zip(times, weight_grads, strict=True)) if j != i)
        return m * t_max + max(0.0, fill)
    return (m - 1) * t_max + sum(times)


@dataclass(frozen=True, slots=True)
class EndOfStep:
    """What one stage does after its last backward, exposed (seconds)."""

    dp: float = 0.0
    offload: float = 0.0
    compression: float = 0.0
    optimizer: float = 0.0


def end_of_step(timer: Timer, stage: int, st: StageTime) -> EndOfStep:
    """Gradient sync (all-reduce or parameter server), compression kernels of a once-per-step
    sync, offload transfers and the optimizer (GPU, or CPU under ZeRO-Offload)."""
    sc = timer.sc
    m, plan, cluster = sc.model, sc.plan, sc.cluster
    last_bwd = st.bwd.total + st.recompute.total
    first_fwd = st.fwd.total
    dp = data_parallel_times(timer, stage, first_fwd, last_bwd, last_bwd=last_bwd)
    comp = 0.0
    if not plan.shards_gradients and plan.grad_compression.enabled and plan.dp > 1:
        comp = timer.memory_time(systems.compression_kernel_bytes(m, plan, stage), kernels=4)
    tr = systems.offload_traffic(m, plan, cluster, stage)
    off_t = systems.offload_times(tr, cluster, plan)
    offload = 0.0
    if off_t.before_step:  # ZeRO-0/1 gradients go down in buckets as the sync finishes
        nb = systems.grad_buckets(tr.pcie_down_per_step, plan)
        offload += systems.bucketed_exposed(off_t.before_step / nb, nb, last_bwd, plan.overlap_grad_reduce)
    optimizer = optimizer_time(timer, stage)
    if plan.offload.optimizer != "none":
        optimizer += off_t.cpu_step
        offload += off_t.after_step - off_t.cpu_step
    elif off_t.after_step:
        offload += off_t.after_step
    return EndOfStep(dp.step_sync + dp.post_step, offload, comp, optimizer)


def parameter_server_step(timer: Timer, t_pipe: float, stages: list[StageTime]) -> tuple[float, float, float]:
    """(total step, exposed communication, exposed server update) of the parameter-server modes.

    Synchronous: every worker pushes its gradient in buckets as backward produces them; each
    server key is updated once all workers pushed it and pulled back, so the step pays what the
    busiest NIC or the servers' CPUs cannot do behind the last backward (systems.ps_times).
    Asynchronous (no barrier): a worker only waits for its own push and pull; the servers and the
    NICs must still carry every worker's traffic once per cycle, so the cycle is
    max(worker compute + own exposed push/pull, busiest NIC, server CPU)."""
    sc = timer.sc
    plan = sc.plan
    st = stages[-1]
    last_bwd = st.bwd.total + st.recompute.total
    t = systems.ps_times(sc.model, plan, sc.cluster, timer.net, stage=plan.pp - 1)
    n_bytes = systems.ps_traffic(sc.model, plan, sc.cluster, plan.pp - 1).worker_bytes
    nb = systems.grad_buckets(n_bytes, plan)
    rtt = 2 * timer.net.inter_latency  # each bucket is a push and a pull
    if plan.gradient_sync == "parameter-server":
        total = max(t.nic, t.server_cpu)
        exposed = systems.bucketed_exposed(total / nb + rtt, nb, last_bwd, plan.overlap_grad_reduce)
        cpu_part = min(exposed, max(0.0, t.server_cpu - t.nic))
        return t_pipe + exposed, exposed - cpu_part, cpu_part
    own = systems.bucketed_exposed(t.worker_nic / nb + rtt, nb, last_bwd, plan.overlap_grad_reduce)
    worker_cycle = t_pipe + own
    bound = max(t.nic, t.server_cpu)
    if bound <= worker_cycle:
        return worker_cycle, own, 0.0
    extra = bound - worker_cycle
    if t.server_cpu >= t.nic:
        return bound, own, extra
    return bound, own + extra, 0.0


def analytic_step(sc: Scenario, cost: CostModel, net: Network) -> StepResult:
    plan = sc.plan
    timer = Timer(sc, cost, net)
    stages = [stage_time(timer, s) for s in range(plan.pp)]
    totals = [st.total for st in stages]
    t_pipe = pipeline_time(plan, totals, [st.bwd.weight_grad for st in stages])
    busiest = max(range(plan.pp), key=lambda s: totals[s])
    m = plan.num_microbatches
    # the last backward of stage s ends about s backward-passes before stage 0's
    avg_bwd = sum(st.bwd.total + st.recompute.total for st in stages) / plan.pp
    ends = [end_of_step(timer, s, stages[s]) for s in range(plan.pp)]
    dp_end = max(max(0.0, e.dp - s * avg_bwd) for s, e in enumerate(ends))
    off_end = max(e.offload for e in ends)
    comp_end = max(e.compression for e in ends)
    opt = max(e.optimizer for e in ends)
    st = stages[busiest]
    extras: dict[str, object] = {}
    if not plan.uses_parameter_servers:
        step = t_pipe + dp_end + off_end + comp_end + opt
    else:  # the servers replace the all-reduce and run the optimizer on their CPUs
        t_ps, dp_end, server = parameter_server_step(timer, t_pipe, stages)
        step = t_ps + off_end + comp_end + opt
        opt += server
        if plan.async_parameter_servers:
            extras["staleness_steps"] = systems.async_staleness_steps(plan)
    breakdown = {
        "compute": m * (st.fwd.compute + st.bwd.compute),
        "recompute": m * st.recompute.compute,
        "tp_comm": m * (st.fwd.tp_exposed + st.bwd.tp_exposed + st.recompute.tp_exposed
                        + st.fwd.cp_exposed + st.bwd.cp_exposed + st.recompute.cp_exposed),
        "pp_comm": m * st.p2p,
        "dp_comm": m * st.dp_per_microbatch + dp_end,
    }
    # waits at the per-layer sync points: TP/CP collectives, else the ZeRO-3 gathers
    breakdown[sync_wait_part(plan)] += m * (st.fwd.sync_wait + st.bwd.sync_wait + st.recompute.sync_wait)
    breakdown |= {
        "bubble": t_pipe - m * totals[busiest],
        "optimizer": opt,
    }
    if plan.offload.any:
        breakdown["offload"] = m * st.offload_per_microbatch + off_end
    if plan.grad_compression.enabled:
        breakdown["compression"] = m * st.compression_per_microbatch + comp_end
    bubble = breakdown["bubble"] / step if plan.pp > 1 else 0.0
    return StepResult(step, breakdown, bubble, tuple(stages), busiest, extras)
