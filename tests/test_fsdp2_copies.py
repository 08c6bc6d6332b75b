"""FSDP2's copies around its collectives (simdist.analytic.fsdp2) and its gathers under recompute."""

from dataclasses import replace
from pathlib import Path

import pytest

from simdist.analytic.collectives import CommContext, Network
from simdist.analytic.cost import CostModel
from simdist.analytic.data_parallel import dp_times, dp_traffic, param_gathers_per_microbatch
from simdist.analytic.fsdp2 import (
    copy_ops,
    layer_params_on_rank,
    reduces_in_line,
    root_params_on_rank,
    runs_fsdp2,
)
from simdist.analytic.offload import offload_traffic
from simdist.analytic.ops import Compute
from simdist.analytic.params import layer_params, params_per_rank
from simdist.analytic.passes import OpTimer
from simdist.analytic.stage import stage_sync
from simdist.predict import predict
from simdist.spec.profile import CalibrationProfile
from simdist.spec.scenario import load_scenario

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


def llama(framework: str | None, **plan):
    sc = load_scenario(SCENARIOS / "llama3-8b-fsdp-8xh100.yaml")
    return replace(sc, plan=replace(sc.plan, framework=framework, **plan))


def gloo_profile() -> CalibrationProfile:
    return CalibrationProfile(device="cpu", backend="gloo")


def test_who_runs_fsdp2():
    assert runs_fsdp2(llama("torchtitan").plan, None)
    # FSDP1, DeepSpeed and Megatron-FSDP gather into the buffer their parameters are views of
    for framework in (None, "pytorch", "deepspeed", "megatron"):
        assert not runs_fsdp2(llama(framework).plan, None), framework
    assert runs_fsdp2(llama(None).plan, gloo_profile())  # the executor's CPU runs
    assert not runs_fsdp2(llama("torchtitan", zero_stage=1).plan, None)
    # context-parallel ranks hold the same weights: FSDP shards over dp x cp (memory.shard_group)
    assert runs_fsdp2(llama("torchtitan", dp=1, cp=8).plan, None)
    # the executor's ZeRO-2 is FSDP2 without resharding after forward; a GPU's ZeRO-2 gathers nothing
    assert runs_fsdp2(llama(None, zero_stage=2).plan, gloo_profile())
    assert not runs_fsdp2(llama("torchtitan", zero_stage=2).plan, None)


def test_copies_read_and_write_the_module_once_each():
    plan = llama("torchtitan").plan
    n = layer_params_on_rank(llama("torchtitan").model, plan, moe=False)
    assert n == layer_params(llama("torchtitan").model).total  # tp 1: the whole layer
    fwd, bwd = copy_ops(plan, n, on_cpu=False)  # a GPU: only the copy-out is on the compute stream
    assert [op.name for op in fwd] == [op.name for op in bwd] == ["fsdp2 copy-out"]
    assert fwd[0].bytes == 2 * n * 2  # bf16 parameters, read and written
    fwd, bwd = copy_ops(plan, n, on_cpu=True)  # a CPU: every copy on the training thread
    assert [op.name for op in bwd] == ["fsdp2 copy-in", "fsdp2 copy-out", "fsdp2 grad copy-in"]
    assert fwd[0].bytes == pytest.approx(2 * n * 2 / plan.dp)  # the rank's shard


def test_copy_out_joins_the_compute_of_torchtitan_fsdp():
    def passes(framework):
        sc = llama(framework)
        timer = OpTimer(sc, CostModel(sc.cluster.gpu, sc.plan.precision), Network.of(sc.cluster))
        return timer.fsdp2_copies(layer_params_on_rank(sc.model, sc.plan, moe=False))

    fwd, bwd = passes("torchtitan")
    sc = llama("torchtitan")
    cost = CostModel(sc.cluster.gpu, sc.plan.precision)
    assert fwd.compute == pytest.approx(cost.time(copy_ops(sc.plan, layer_params_on_rank(
        sc.model, sc.plan, moe=False), on_cpu=False)[0][0]))
    assert 1e-4 < fwd.compute == bwd.compute < 1e-3  # 0.44 GB read and written at H100's HBM speed
    assert passes("pytorch")[0].compute == 0.0
    # the step's compute grows by two copy-outs per layer and micro-batch (and the root module's),
    # in both engines; ZeRO-2 gathers once per step after the optimizer, into the same buffers
    copy = fwd.compute + bwd.compute
    timer = OpTimer(sc, cost, Network.of(sc.cluster))
    assert sc.plan.pp == 1  # one chunk: its root module holds the embedding and the LM head,
    # gathered, and copied, once before the forward and once before the backward
    root = sum(p.compute for p in timer.fsdp2_copies(root_params_on_rank(sc.model, sc.plan)))
    for engine in ("analytic", "des"):
        without = predict(llama("torchtitan", zero_stage=2), engine=engine).breakdown_s["compute"]
        with_copies = predict(llama("torchtitan"), engine=engine).breakdown_s["compute"]
        expected = sc.plan.num_microbatches * (sc.model.num_layers * copy + root)
        assert with_copies - without == pytest.approx(expected, rel=1e-6), engine


def test_fsdp2_does_not_gather_again_for_the_recomputed_forward():
    plan = llama("torchtitan").plan
    assert plan.recompute == "full"
    assert param_gathers_per_microbatch(plan, runs_fsdp2(plan, None)) == 2
    assert param_gathers_per_microbatch(llama(None).plan, runs_fsdp2(llama(None).plan, None)) == 3
    offloaded = load_scenario(SCENARIOS / "llama2-70b-zero3-offload-2xa100.yaml")  # full recompute
    for framework, gathers in (("torchtitan", 2), (None, 3)):  # parameter offload fetches as often
        plan = replace(offloaded.plan, framework=framework)
        assert offload_traffic(offloaded.model, plan, offloaded.cluster, 0).gathers == gathers, framework
    sc = llama(None)
    once = dp_traffic(sc.model, sc.plan, 0, fsdp2=True).step_bytes(sc.plan.num_microbatches)
    twice = dp_traffic(sc.model, sc.plan, 0).step_bytes(sc.plan.num_microbatches)
    one_gather = params_per_rank(sc.model, sc.plan, 0) * sc.plan.element_bytes  # every layer's, once
    assert twice - once == pytest.approx(sc.plan.num_microbatches * one_gather)


def test_a_cpu_prices_fsdp2s_copies_as_copies_out_of_the_cache():
    """On a CPU the copies move data out of the cache (gathered by gloo's thread, or written a
    layer's backward ago): a profile with a cold-copy curve (executor.bench's ``memory_cold``)
    prices them at it, other memory passes at the in-cache curve; without one, both at the latter."""
    from test_calibration import synthetic_bench

    from simdist.calibrate.fit import fit_profile

    # this guest's cold copies, both ranks at once (2026-11-28): 11-18 GB/s from 2 to 128 MiB moved
    cold = [{"bytes": 2.0 * 2**p, "seconds": 2.0 * 2**p / r} for p, r in ((20, 11e9), (23, 12e9), (26, 18e9))]
    prof = fit_profile({**synthetic_bench(bw=150e9), "memory_cold": cold})
    plain = fit_profile(synthetic_bench(bw=150e9))
    assert prof.efficiency("memory.cold", 2.0 * 2**23) == pytest.approx(12 / 150)
    assert plain.efficiency("memory.cold", 2.0 * 2**23) is None
    sc = llama(None)
    n = layer_params_on_rank(sc.model, sc.plan, moe=False)
    fwd, bwd = copy_ops(sc.plan, n, on_cpu=True)
    assert {op.kind for op in fwd + bwd} == {"copy"}
    assert {op.kind for op in copy_ops(sc.plan, n, on_cpu=False)[0]} == {"memory"}  # a GPU's HBM
    out = fwd[1]
    cm, cm_plain = CostModel(sc.cluster.gpu, "fp32", prof), CostModel(sc.cluster.gpu, "fp32", plain)
    overhead = cm.kernel_overhead
    assert cm.time(out) - overhead == pytest.approx(out.bytes / (150e9 * prof.efficiency("memory.cold", out.bytes)))
    assert cm_plain.time(out) - overhead == pytest.approx(out.bytes / (150e9 * plain.efficiency("memory", out.bytes)))
    assert cm.time(out) > 5 * cm_plain.time(out)
    same = replace(out, kind="memory")  # any other memory pass keeps the in-cache curve
    assert cm.time(same) == pytest.approx(cm_plain.time(same))


@pytest.mark.parametrize("name,barriers_per_row,timed", [
    ("bench_cold_copy", 1, "seconds"),  # each size started together
    ("bench_cold_gemm", 6, "cold_s"),  # each timed GEMM of 3 (hot, cold) pairs (simdist.analytic.cache_residency)
])
def test_every_rank_times_its_cold_microbenchmarks_at_once(monkeypatch, name, barriers_per_row, timed):
    """A run's ranks copy and compute at the same moments of a step and share the memory
    bandwidth and the cache: the microbenchmarks' ranks time each cold measurement together
    (unsynchronised, the cold-copy curve moved 2x between two calibrations of one machine, and a
    2-rank cold-GEMM median of 9 by +-0.5 ms, with whatever the other rank ran then)."""
    pytest.importorskip("torch")
    from executor import bench

    calls: list[str] = []
    monkeypatch.setattr(bench.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(bench.dist, "barrier", lambda: calls.append("barrier"))
    monkeypatch.setattr(bench, "EVICT_BYTES", 1 << 20)
    rows = getattr(bench, name)(quick=True)
    assert len(rows) == 3 and len(calls) == 3 * barriers_per_row and all(r[timed] > 0 for r in rows)


def test_fsdp2s_zero2_gathers_for_the_forward_only():
    """The executor's ZeRO-2 (FSDP2, reshard_after_forward=False) gathers each module before every
    micro-batch's forward, keeps it through the backward and reshards after: one gather and one
    reduce-scatter per module and micro-batch, no gather after the optimizer, and only the
    gradients' copy-in beside the backward."""
    sc = llama(None, zero_stage=2)
    n = params_per_rank(sc.model, sc.plan, 0)
    tr = dp_traffic(sc.model, sc.plan, 0, fsdp2=True)
    assert not tr.bwd_gathers and not tr.post_step_gathers and not tr.step_grad_sync
    modules = sc.model.num_layers + 1  # and the root
    assert [(c.kind, c.calls) for c in tr.fwd_gathers + tr.microbatch_grad_sync] == [
        ("allgather", modules), ("reducescatter", modules)]
    assert tr.fwd_gathers[0].bytes * modules == pytest.approx(n * sc.plan.element_bytes)
    # fully_shard wraps whole modules whatever ZeRO-3's gather unit says (DeepSpeed's config sets it)
    for unit in ("module", "module_sync"):
        assert dp_traffic(sc.model, replace(sc.plan, zero3_fetch=unit), 0, fsdp2=True) == tr, unit
    gpu = dp_traffic(sc.model, sc.plan, 0)  # DeepSpeed's and Megatron's: whole weights, gathered after the step
    assert not gpu.fwd_gathers and gpu.post_step_gathers
    fwd, bwd = copy_ops(sc.plan, layer_params_on_rank(sc.model, sc.plan, moe=False), on_cpu=True)
    assert [op.name for op in fwd] == ["fsdp2 copy-in", "fsdp2 copy-out"]
    assert [op.name for op in bwd] == ["fsdp2 grad copy-in"]


@pytest.mark.parametrize("zero_stage", [2, 3])
def test_fsdp2_in_a_pipeline_gathers_and_reduces_once_a_step(zero_stage):
    """Under torch.distributed.pipelining a module is gathered once a step and reduced once, at
    the last micro-batch, for the executor's FSDP2 as for torchtitan's; its micro-batches pay no
    copies (tests/executor/test_executor_runs.py counts the executor's collectives)."""
    sc = load_scenario(SCENARIOS / "tiny-2d-pp-fsdp.yaml")
    sc = replace(sc, plan=replace(sc.plan, zero_stage=zero_stage))
    tr = dp_traffic(sc.model, sc.plan, 0, fsdp2=True)
    assert not tr.fwd_gathers + tr.bwd_gathers + tr.microbatch_grad_sync
    assert sum(c.total_bytes for c in tr.post_step_gathers) == pytest.approx(
        params_per_rank(sc.model, sc.plan, 0) * sc.plan.element_bytes)
    timer = OpTimer(sc, CostModel(sc.cluster.gpu, sc.plan.precision, gloo_profile()), Network.of(sc.cluster))
    assert timer.fsdp2 and timer.fsdp2_copies(10**6) == timer.fsdp2_copies(0)  # nothing per micro-batch


@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_on_a_cpu_the_backward_waits_for_each_reduction(engine):
    """gloo's reduce-scatter returns when it is done and FSDP2 calls it without async_op, so on a
    CPU each module's reduction holds the training thread (simdist.analytic.fsdp2.reduces_in_line):
    every micro-batch's reduce-scatters are exposed, where NCCL's hide behind the backward."""
    sc = load_scenario(SCENARIOS / "local-zero3-fit.yaml")
    gloo = gloo_profile()
    cost = CostModel(sc.cluster.gpu, sc.plan.precision, gloo)
    traffic, _ = stage_sync(sc, CommContext(sc.cluster, sc.plan, Network.of(sc.cluster, gloo)), cost, 0)
    assert traffic.in_line and reduces_in_line(sc.plan, gloo) and not reduces_in_line(sc.plan, None)
    reductions = sc.plan.num_microbatches * sum(c.total_seconds for c in traffic.microbatch_grad_sync)
    exposed = predict(sc, profile=gloo, engine=engine).breakdown_s["dp_comm"]
    assert reductions <= exposed <= reductions + 2 * sc.plan.num_microbatches * sum(
        c.total_seconds for c in traffic.fwd_gathers)  # and the gathers that do not hide
    # the executor's FSDP2 replicate (plain data parallelism under a split backward) reduces after
    # the stage's last backward, in line too; DDP's reducer all-reduces beside the backward
    zb = load_scenario(SCENARIOS / "tiny-2d-pp-dp-zb.yaml").plan
    assert reduces_in_line(zb, gloo) and not reduces_in_line(replace(zb, schedule="1f1b"), gloo)
    hidden = replace(traffic, in_line=False)
    t_bwd = 1.0  # a backward long enough to hide them
    assert dp_times(hidden, sc.plan, 1.0, t_bwd).bwd_exposed < dp_times(traffic, sc.plan, 1.0, t_bwd).bwd_exposed


def test_the_reduce_scatters_input_copy_is_backward_in_the_phases_a_fit_reads(monkeypatch):
    """gloo's reduce-scatter copies its input on the calling thread before reducing it, which
    the executor counts as backward: the predicted phases move that copy from the reductions'
    wait (the microbenchmark timed it with the collective) to the backward, the step unchanged."""
    from simdist.analytic import fsdp2
    from simdist.calibrate.compare import predicted_quantities

    sc = load_scenario(SCENARIOS / "local-zero3-fit.yaml")
    gloo = gloo_profile()
    cost = CostModel(sc.cluster.gpu, sc.plan.precision, gloo)
    traffic, _ = stage_sync(sc, CommContext(sc.cluster, sc.plan, Network.of(sc.cluster, gloo)), cost, 0)
    copies = sc.plan.num_microbatches * sum(c.calls * cost.time(Compute("input", "copy", bytes=2 * c.bytes))
                                            for c in traffic.microbatch_grad_sync)  # read and written
    moved = predicted_quantities(sc, gloo)
    monkeypatch.setattr(fsdp2, "input_copies_s", lambda traffic, cost: 0.0)  # as before
    kept = predicted_quantities(sc, gloo)
    assert copies > 0.01 * moved["step_time_s"]
    assert moved["backward_s"] - kept["backward_s"] == pytest.approx(copies)
    assert kept["comm_s"] - moved["comm_s"] == pytest.approx(copies)
    assert moved["step_time_s"] == kept["step_time_s"]
    gpu = llama("torchtitan")  # NCCL's reduce-scatter returns once queued: nothing in line
    assert fsdp2.input_copies_s(stage_sync(gpu, CommContext(gpu.cluster, gpu.plan, Network.of(gpu.cluster)),
                                           CostModel(gpu.cluster.gpu, gpu.plan.precision), 0)[0], cost) == 0.0
