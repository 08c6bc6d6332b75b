"""Closed-form step time: the fast engine (`predict --engine analytic`) and the search's ranker.

It only reduces the per-stage descriptions (:mod:`simdist.analytic.stage`), where every pass,
collective and host transfer is already timed alone. Per stage and micro-batch: the passes
(compute and exposed TP/CP communication), the pipeline sends, and the data-parallel and
offload traffic that forward and backward cannot hide (:func:`simdist.analytic.data_parallel.
dp_times`, :func:`offload_per_microbatch`). The pipeline then costs
  1F1B / GPipe:   (m - 1) * t_max + sum_s t_s                   (= (m + p - 1) t if uniform)
  interleaved:    m * t_max + (sum_s t_s - t_max) / v            (= (m + (p-1)/v) t)
  zero-bubble:    m * t_max + (p - 1)(t - 2 t_W)                  (ZB-H1, Qi et al. 2024)
(Narayanan et al. SC'21 sec 2.2; DualPipe README's bubble table for ZB1P), plus, on a CPU whose
cores all compute, the wait of the first sends posted before a stage computes on
(:func:`wake_lags`), then what each stage does after its last backward (:func:`end_of_step`: the
gradient sync that backward could not hide, offload, compression kernels, the optimizer), or the
parameter servers' push, update and pull (:func:`parameter_server_step`). ``offload`` and
``compression`` appear in the breakdown only when the plan uses them.
"""

from __future__ import annotations

from dataclasses import replace

from simdist.analytic.collectives import Network
from simdist.analytic.cost import CostModel
from simdist.analytic.data_parallel import DataParallelTimes, dp_times
from simdist.analytic.dualpipe import dualpipe_time
from simdist.analytic.overlap import bucketed_exposed, prefetch_exposed
from simdist.analytic.param_server import async_staleness_steps
from simdist.analytic.passes import PassTime
from simdist.analytic.profile_terms import sync_wait_part
from simdist.analytic.result import StepResult
from simdist.analytic.stage import StageDescription, StepDescription, describe
from simdist.analytic.transport_wake import wake_lag_s
from simdist.frozen import frozen
from simdist.spec.plan import ParallelPlan
from simdist.spec.scenario import Scenario


@frozen(slots=True)
class StageTime:
    """One micro-batch through every chunk of one stage, with what it could not hide."""

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

    @property
    def last_backward(self) -> float:
        return self.bwd.total + self.recompute.total


def stage_time(d: StepDescription, s: StageDescription) -> StageTime:
    plan = d.plan
    p2p = 0.0
    t_fwd, t_bwd = s.fwd.total, s.bwd.total + s.recompute.total
    if d.send is not None:  # each chunk sends its output on (but the last) and its input gradient back (but the first)
        # Every send shows, also under Megatron's overlap_p2p_comm (the sender goes on while
        # its isend runs): the interleaved schedule runs micro-batches in groups of p, so chunk
        # j+1 of a micro-batch on stage 0 waits for chunk j of the same micro-batch to pass all
        # p stages, p compute slots later with no slack; the loop holds p sends, one per chunk
        # (Narayanan et al. SC'21 sec 2.2.2: the interleaved schedule's communication grows with
        # v; its scatter/gather experiment: cutting those bytes gains up to 11% on interleaved
        # schedules with large batches, which sends hidden behind compute could not). The event
        # engine, which runs the dependencies, agrees.
        sends = sum(1 for c in s.chunks if not c.last) + sum(1 for c in s.chunks if not c.first)
        p2p = sends * (d.send.send_s + d.send.after_s)
    dp = dp_times(s.dp, plan, t_fwd, t_bwd)
    off = offload_per_microbatch(s, plan, t_fwd, t_bwd, dp)
    return StageTime(s.fwd, s.bwd, s.recompute, p2p, dp.per_microbatch, off, s.compression_per_microbatch)


def offload_per_microbatch(s: StageDescription, plan: ParallelPlan, t_fwd: float, t_bwd: float,
                           dp: DataParallelTimes) -> float:
    """Exposed PCIe/NVMe time per micro-batch beyond what the DP traffic already exposes.

    Gradient partitions go down layer by layer as their reduce-scatter finishes, on the copy
    engine, beside the backward (Ren et al. 2021 sec 4.2); offloaded parameter shards come up
    ahead of each layer's all-gather, prefetched like it. Each is its own pipeline, so the
    exposed time is the longest of: the DP exposure, the transfer's own exposure, and the
    last layer's reduce-scatter followed by its download (the first layer's upload followed by
    its gather)."""
    tr, t = s.offload, s.offload_s
    if not (tr.pcie_down_per_microbatch or tr.pcie_up_per_microbatch):
        return 0.0
    chunks = tr.gather_chunks
    extra = 0.0
    if t.pcie_down_per_microbatch:
        down = t.pcie_down_per_microbatch
        rs_tail = dp.grad_sync / chunks
        combined = max(dp.bwd_exposed, prefetch_exposed(down, chunks, t_bwd), rs_tail + down / chunks)
        extra += combined - dp.bwd_exposed
    if t.up_per_microbatch:
        gathers = tr.gathers
        up_f, up_b = t.up_per_microbatch / gathers, t.up_per_microbatch * (gathers - 1) / gathers
        f = max(dp.fwd_exposed, prefetch_exposed(up_f, chunks, t_fwd), (up_f + dp.gather_fwd) / chunks)
        b = max(dp.bwd_exposed, prefetch_exposed(up_b, chunks, t_bwd))
        extra += (f - dp.fwd_exposed) + (b - dp.bwd_exposed)
    return max(0.0, extra)


@frozen(slots=True)
class EndOfStep:
    """What one stage does after its last backward, exposed (seconds)."""

    dp: float = 0.0
    offload: float = 0.0
    compression: float = 0.0
    optimizer: float = 0.0
    stretch: float = 0.0  # the last backward slowed by the gradient sync beside it (in dp)


def end_of_step(s: StageDescription, plan: ParallelPlan, st: StageTime) -> EndOfStep:
    """Gradient sync (all-reduce or parameter server), compression kernels of a once-per-step
    sync, offload transfers and the optimizer (GPU, or CPU under ZeRO-Offload)."""
    last_bwd = st.last_backward
    total = sum(c.params for c in s.chunks) or 1
    shares = tuple(c.params / total for c in s.chunks) if plan.interleaved else (1.0,)
    dp = dp_times(s.dp, plan, st.fwd.total, last_bwd, last_bwd=last_bwd, chunk_shares=shares)
    off = s.offload_s
    offload = 0.0
    if off.before_step:  # ZeRO-0/1 gradients go down in buckets as the sync finishes
        nb = s.offload.down_buckets
        offload += bucketed_exposed(off.before_step / nb, nb, last_bwd, plan.overlap_grad_reduce)
    optimizer = s.optimizer
    if plan.offload.optimizer != "none":
        optimizer += off.cpu_step
        offload += off.after_step - off.cpu_step
    elif off.after_step:
        offload += off.after_step
    return EndOfStep(dp.stretch + dp.step_sync + dp.post_step, offload, s.compression_per_step, optimizer,
                     dp.stretch)


def pipeline_time(plan: ParallelPlan, times: list[float], weight_grads: list[float]) -> float:
    m, v = plan.num_microbatches, plan.virtual_pipeline_stages
    t_max = max(times)
    if plan.pp == 1:
        return m * t_max
    if plan.interleaved:
        return m * t_max + (sum(times) - t_max) / v
    if plan.split_backward:
        # ZB-H1 moves one W per stage into the cool-down gap, which needs micro-batches to spare:
        # with a single micro-batch each W just follows its B (a 1F1B pipeline); in between the
        # gap closes in proportion
        spare = min(1.0, (m - 1) / (plan.pp - 1))
        i = times.index(t_max)
        fill = sum(t - (1 + spare) * w for j, (t, w) in enumerate(zip(times, weight_grads, strict=True)) if j != i)
        return m * t_max + max(0.0, fill)
    return (m - 1) * t_max + sum(times)


def wake_lags(plan: ParallelPlan, stages: list[StageTime], tick_s: float) -> float:
    """What the critical path of a GPipe or 1F1B step waits for the first sends whose stage
    computes on after posting them (simdist.analytic.transport_wake): stage 0's first forward
    send, posted before its other forwards that need no input (GPipe: m - 1 of them; 1F1B's
    warm-up: one), and under GPipe the last stage's first backward send, before its other m - 1
    backwards. A receiver faster than its sender makes up the wait while the later sends come,
    (m - 1) times the difference: the event engine, which runs the dependencies, agrees."""
    m, p = plan.num_microbatches, plan.pp
    if tick_s <= 0 or m == 1 or plan.interleaved or plan.split_backward or plan.dualpipe:
        return 0.0

    def exposed(busy: float, sender: float, receiver: float) -> float:
        return max(0.0, wake_lag_s(busy, tick_s) - (m - 1) * max(0.0, sender - receiver))

    f0, f1 = stages[0].fwd.total, stages[1].fwd.total
    if plan.schedule != "gpipe":
        return exposed(f0, stages[0].total, stages[1].total)
    b_last, b_before = stages[p - 1].last_backward, stages[p - 2].last_backward
    return exposed((m - 1) * f0, f0, f1) + exposed((m - 1) * b_last, b_last, b_before)


def parameter_server_step(d: StepDescription, t_pipe: float, last: StageTime) -> tuple[float, float, float]:
    """(total step, exposed communication, exposed server update) of the parameter-server modes.

    Synchronous: every worker pushes its gradient in buckets as backward produces them; each
    server key is updated once all workers pushed it and pulled back, so the step pays what the
    busiest NIC or the servers' CPUs cannot do behind the last backward (param_server.ps_times),
    and the last bucket's remaining stages (a pull after its push and update).
    Asynchronous (no barrier): a worker only waits for its own push and pull; the servers and the
    NICs must still carry every worker's traffic once per cycle, so the cycle is
    max(worker compute + own exposed push/pull, busiest NIC, server CPU)."""
    plan = d.plan
    ps = d.stages[0].ps  # stage 0's last backward ends last; the later stages' pushes went earlier
    assert ps is not None
    t, nb, last_bwd = ps.times, ps.buckets, last.last_backward
    if plan.sync_parameter_servers:
        if plan.pp > 1:  # the servers' CPUs apply stage 0's part then: its share of the update
            t = replace(t, server_cpu=ps.update_s)
        # each bucket: push, update (server CPU), pull; pushes and pulls of different buckets
        # share the NICs (nic: both, per direction), the servers' CPUs update: the slower paces
        # the buckets, and the last bucket's push, update and pull run one after the other
        nic, update = t.nic / nb, t.server_cpu / nb
        pace = max(nic, update)
        chain = 2 * t.push / nb + update
        exposed = bucketed_exposed(pace + ps.rtt, nb, last_bwd, plan.overlap_grad_reduce) + max(0.0, chain - pace)
        cpu_part = min(exposed, max(0.0, t.server_cpu - t.nic) + (update if update < pace else 0.0))
        return t_pipe + exposed, exposed - cpu_part, cpu_part
    own = bucketed_exposed(t.worker_nic / nb + ps.rtt, nb, last_bwd, plan.overlap_grad_reduce)
    worker_cycle = t_pipe + own
    bound = max(t.nic, t.server_cpu)
    if bound <= worker_cycle:
        return worker_cycle, own, 0.0
    extra = bound - worker_cycle
    if t.server_cpu >= t.nic:
        return bound, own, extra
    return bound, own + extra, 0.0


def reduce_step(d: StepDescription) -> StepResult:
    """The closed-form step of a described scenario (each stage kind reduced once)."""
    plan = d.plan
    kind_times = [stage_time(d, s) for s in d.kinds]
    kind_ends = [end_of_step(s, plan, st) for s, st in zip(d.kinds, kind_times, strict=True)]
    stages = [kind_times[k] for k in d.kind_of]
    kind_totals = [st.total for st in kind_times]  # each kind's sums once, then per stage
    kind_last = [st.last_backward for st in kind_times]
    totals = [kind_totals[k] for k in d.kind_of]
    last_backwards = [kind_last[k] for k in d.kind_of]
    if plan.dualpipe:  # DeepSeek-V3's bidirectional schedules (v1.2)
        t_pipe = dualpipe_time(plan, totals, last_backwards)
    else:
        t_pipe = pipeline_time(plan, totals, [st.bwd.weight_grad for st in stages])
    lag = wake_lags(plan, stages, d.send.wake_tick_s) if d.send is not None else 0.0
    t_pipe += lag
    busiest = max(range(plan.pp), key=totals.__getitem__)
    m = plan.num_microbatches
    # the last backward of stage s ends about s backward-passes before stage 0's, later by what
    # the gradient sync beside it slowed it and the stages after it (each waits for the next's)
    avg_bwd = sum(last_backwards) / plan.pp
    ends = [kind_ends[k] for k in d.kind_of]
    later = ([sum(e.stretch for e in ends[s + 1:]) for s in range(plan.pp)] if any(e.stretch for e in kind_ends)
             else [0.0] * plan.pp)  # (quadratic in pp: skipped where no stage is stretched)
    dp_end = max(max(0.0, e.dp + later[s] - s * avg_bwd) for s, e in enumerate(ends))
    off_end = max(e.offload for e in ends)
    comp_end = max(e.compression for e in ends)
    opt = max(e.optimizer for e in ends)
    st = stages[busiest]
    extras: dict[str, object] = {}
    server = 0.0
    if not plan.uses_parameter_servers:
        step = t_pipe + dp_end + off_end + comp_end + opt
    else:  # the servers replace the all-reduce and run the optimizer on their CPUs
        t_ps, dp_end, server = parameter_server_step(d, t_pipe, stages[0])
        step = t_ps + off_end + comp_end + opt
        opt += server
        if plan.async_parameter_servers:
            extras["staleness_steps"] = async_staleness_steps(plan)
    breakdown = {
        "compute": m * (st.fwd.compute + st.bwd.compute) + ends[busiest].stretch,
        "recompute": m * st.recompute.compute,
        "tp_comm": m * sum(p.tp_exposed + (0.0 if plan.cp > 1 else p.cp_exposed) + (0.0 if plan.ep > 1 else p.ep_exposed)
                           for p in (st.fwd, st.bwd, st.recompute)),
        "pp_comm": m * st.p2p + lag,
        "dp_comm": m * st.dp_per_microbatch + dp_end - ends[busiest].stretch,
    }
    # waits at the per-layer sync points: TP/CP collectives, else the ZeRO-3 gathers
    breakdown[sync_wait_part(plan)] += m * (st.fwd.sync_wait + st.bwd.sync_wait + st.recompute.sync_wait)
    breakdown |= {
        "bubble": t_pipe - lag - m * totals[busiest],
        "optimizer": opt,
    }
    if plan.offload.any:
        breakdown["offload"] = m * st.offload_per_microbatch + off_end
    if plan.grad_compression.enabled:
        breakdown["compression"] = m * st.compression_per_microbatch + comp_end
    if plan.ep > 1:  # contract v1.2: exposed expert all-to-all
        breakdown["ep_comm"] = m * sum(p.ep_exposed for p in (st.fwd, st.bwd, st.recompute))
    if plan.cp > 1:  # contract v1.2: exposed context-parallel communication
        breakdown["cp_comm"] = m * sum(p.cp_exposed for p in (st.fwd, st.bwd, st.recompute))
    bubble = breakdown["bubble"] / step if plan.pp > 1 else 0.0
    return StepResult(step, breakdown, bubble, busiest, extras=extras, server_update_s=server)


def analytic_step(sc: Scenario, cost: CostModel, net: Network) -> StepResult:
    """Describe ``sc`` and reduce it in closed form."""
    return reduce_step(describe(sc, cost, net))
