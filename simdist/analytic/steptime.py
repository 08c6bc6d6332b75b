"""Closed-form step time: the fast engine (`predict --engine analytic`) and the search's ranker.

Per pipeline stage and micro-batch: compute from the layer's ops (simdist.sim.ops) timed by the
cost model, TP collectives on the links their group crosses, exposed unless overlapped with a
GEMM (the backward data-grad all-reduce runs beside the weight-grad GEMM, Megatron's async TP
all-reduce; all TP traffic with ``tp_comm_overlap``). The pipeline then costs
  1F1B / GPipe:   (m - 1) * t_max + sum_s t_s                   (= (m + p - 1) t if uniform)
  interleaved:    m * t_max + (sum_s t_s - t_max) / v            (= (m + (p-1)/v) t)
  zero-bubble:    m * t_max + (p - 1)(t - 2 t_W)                  (ZB-H1, Qi et al. 2024)
(Narayanan et al. SC'21 sec 2.2; DualPipe README's bubble table for ZB1P), then the data-parallel
gradient sync that backward could not hide, and the optimizer step.
"""

from __future__ import annotations

from dataclasses import dataclass

from simdist.analytic.memory import state_bytes
from simdist.analytic.params import params_per_rank, stage_num_layers
from simdist.cost import CostModel, optimizer_bytes_per_param
from simdist.sim.collectives import Network, collective_time, layout_for_axis
from simdist.sim.ops import Comm, Compute, Op, embedding_ops, head_ops, layer_ops
from simdist.spec.scenario import Scenario


@dataclass(frozen=True, slots=True)
class PassTime:
    compute: float = 0.0
    tp_exposed: float = 0.0
    cp_exposed: float = 0.0
    weight_grad: float = 0.0  # the W part of backward (zero-bubble)

    def __add__(self, o: PassTime) -> PassTime:
        return PassTime(self.compute + o.compute, self.tp_exposed + o.tp_exposed,
                        self.cp_exposed + o.cp_exposed, self.weight_grad + o.weight_grad)

    def __mul__(self, k: float) -> PassTime:
        return PassTime(self.compute * k, self.tp_exposed * k, self.cp_exposed * k, self.weight_grad * k)

    @property
    def total(self) -> float:
        return self.compute + self.tp_exposed + self.cp_exposed


ZERO_PASS = PassTime()


class Timer:
    """Times op lists of one scenario with one cost model and network."""

    def __init__(self, sc: Scenario, cost: CostModel, net: Network):
        self.sc, self.cost, self.net = sc, cost, net
        self.layouts = {ax: layout_for_axis(sc.cluster, sc.plan, ax)
                        for ax in ("tp", "cp", "pp", "dp", "dp_shard", "dp_replica")}

    def comm(self, op: Comm) -> float:
        return collective_time(op.collective, op.bytes, self.layouts[op.axis], self.net)

    def passes(self, ops: tuple[Op, ...]) -> PassTime:
        """Sum an op list; a comm hides behind the GEMM it may overlap with."""
        plan = self.sc.plan
        compute = tp = cp = w = 0.0
        prev: Compute | None = None
        for i, op in enumerate(ops):
            if isinstance(op, Compute):
                t = self.cost.time(op)
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
        return PassTime(compute, tp, cp, w)


@dataclass(frozen=True, slots=True)
class StageTime:
    """One micro-batch through every chunk of one stage."""

    fwd: PassTime
    bwd: PassTime
    recompute: PassTime
    p2p: float  # exposed pipeline send/recv per micro-batch
    dp_per_microbatch: float  # exposed ZeRO-2/3 traffic per micro-batch

    @property
    def total(self) -> float:
        return self.fwd.total + self.bwd.total + self.recompute.total + self.p2p + self.dp_per_microbatch


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
        e = 4 if plan.precision == "fp32" else 2
        act = m.seq_length // plan.cp * plan.micro_batch_size * m.hidden_size * e
        # Megatron's scatter/gather: each TP rank sends 1/t of the activation, then all-gathers
        sent = act / plan.tp
        one = collective_time("sendrecv", sent, timer.layouts["pp"], timer.net)
        if plan.tp > 1:
            one += collective_time("allgather", act, timer.layouts["tp"], timer.net)
        p2p = 2 * plan.virtual_pipeline_stages * one
    dp_mb = dp_per_microbatch(timer, stage, fwd.total, bwd.total + recompute.total)
    return StageTime(fwd, bwd, recompute, p2p, dp_mb)


# --- data parallel ------------------------------------------------------------------------


def _shard_axis(plan) -> str:
    return "dp_shard" if plan.dp_shard < plan.dp else "dp"


def dp_per_microbatch(timer: Timer, stage: int, t_fwd: float, t_bwd: float) -> float:
    """ZeRO-2 reduce-scatters every micro-batch's gradients; ZeRO-3/FSDP also all-gathers the
    parameters before forward and backward. Prefetching hides them behind compute, except
    the first layer's gather and the last layer's reduce-scatter."""
    sc = timer.sc
    plan = sc.plan
    if plan.zero_stage < 2 or plan.dp == 1:
        return 0.0
    n = params_per_rank(sc.model, plan, stage)
    b = state_bytes(sc.model, plan)
    layers = max(1, stage_num_layers(sc.model, plan, stage))
    ax = _shard_axis(plan)
    g = timer.layouts[ax]
    grad_bytes = n * min(b.grads, 2.0 if plan.precision != "fp32" else 4.0)
    rs = collective_time("reducescatter", grad_bytes, g, timer.net)
    if plan.dp_shard < plan.dp:  # HSDP: the shard's gradients are all-reduced across replicas
        rs += collective_time("allreduce", grad_bytes / plan.dp_shard, timer.layouts["dp_replica"], timer.net)
    if plan.zero_stage == 2:
        return max(rs / layers, rs - t_bwd)
    param_bytes = n * (1.0 if plan.zero_quantized_weights else b.params)
    # one collective per layer (FSDP) or per submodule (DeepSpeed): each pays the ring latency
    calls = layers * (zero3_modules_per_layer(sc.model) if plan.zero3_fetch == "module" else 1)
    ag = calls * collective_time("allgather", param_bytes / calls, g, timer.net)
    rs = calls * collective_time("reducescatter", grad_bytes / calls, g, timer.net) + (rs - collective_time("reducescatter", grad_bytes, g, timer.net))
    gathers = 3 if plan.recompute == "full" else 2  # recomputation gathers the parameters again
    if not plan.overlap_param_gather:
        return gathers * ag + rs
    fwd_exposed = max(ag / layers, ag - t_fwd)
    bwd_exposed = max((ag + rs) / layers, (gathers - 1) * ag + rs - t_bwd)
    return fwd_exposed + bwd_exposed


def zero3_modules_per_layer(m) -> int:
    """Submodules with parameters in a layer: two norms, QKV, output projection, MLP linears."""
    return 4 + (3 if m.mlp == "swiglu" else 2)


def dp_end_of_step(timer: Timer, stage: int, last_bwd: float) -> float:
    """Gradient sync once per step (DDP, ZeRO-1) and the parameter all-gather after the
    optimizer (ZeRO-1/2); DDP's buckets overlap the last micro-batch's backward."""
    sc = timer.sc
    plan = sc.plan
    if plan.dp == 1:
        return 0.0
    n = params_per_rank(sc.model, plan, stage)
    b = state_bytes(sc.model, plan)
    ax = _shard_axis(plan)
    t = 0.0
    if plan.zero_stage == 0:
        grad = collective_time("allreduce", n * b.grads, timer.layouts["dp"], timer.net)
        bucket = collective_time("allreduce", min(n * b.grads, plan.ddp_bucket_size_bytes), timer.layouts["dp"], timer.net)
        t += max(bucket, grad - last_bwd) if plan.overlap_grad_reduce else grad
    elif plan.zero_stage == 1:
        rs = collective_time("reducescatter", n * b.grads, timer.layouts[ax], timer.net)
        if plan.dp_shard < plan.dp:
            rs += collective_time("allreduce", n * b.grads / plan.dp_shard, timer.layouts["dp_replica"], timer.net)
        t += max(rs / 8, rs - last_bwd) if plan.overlap_grad_reduce else rs
    if plan.zero_stage in (1, 2):
        ag = collective_time("allgather", n * b.params, timer.layouts[ax], timer.net)
        t += ag  # the next step's forward cannot start without its parameters
    return t


def optimizer_time(timer: Timer, stage: int) -> float:
    sc = timer.sc
    plan = sc.plan
    n = params_per_rank(sc.model, plan, stage)
    if plan.zero_stage >= 1:
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


def pipeline_time(plan, times: list[float], weight_grads: list[float]) -> float:
    m, v = plan.num_microbatches, plan.virtual_pipeline_stages
    t_max = max(times)
    if plan.pp == 1:
        return m * t_max
    if plan.schedule == "interleaved-1f1b":
        return m * t_max + (sum(times) - t_max) / v
    if plan.schedule == "zero-bubble":
        i = times.index(t_max)
        fill = sum(t - 2 * w for j, (t, w) in enumerate(zip(times, weight_grads, strict=True)) if j != i)
        return m * t_max + max(0.0, fill)
    return (m - 1) * t_max + sum(times)


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
    dp_end = max(
        max(0.0, dp_end_of_step(timer, s, stages[s].bwd.total) - s * avg_bwd) for s in range(plan.pp)
    )
    opt = max(optimizer_time(timer, s) for s in range(plan.pp))
    st = stages[busiest]
    breakdown = {
        "compute": m * (st.fwd.compute + st.bwd.compute),
        "recompute": m * st.recompute.compute,
        "tp_comm": m * (st.fwd.tp_exposed + st.bwd.tp_exposed + st.recompute.tp_exposed
                        + st.fwd.cp_exposed + st.bwd.cp_exposed + st.recompute.cp_exposed),
        "pp_comm": m * st.p2p,
        "dp_comm": m * st.dp_per_microbatch + dp_end,
        "bubble": t_pipe - m * totals[busiest],
        "optimizer": opt,
    }
    step = t_pipe + dp_end + opt
    bubble = breakdown["bubble"] / step if plan.pp > 1 else 0.0
    return StepResult(step, breakdown, bubble, tuple(stages), busiest)
