"""Ring attention as Transformer Engine runs it (AttnFuncWithCP, the causal 2-chunk split):
forward sends cp - 1 K/V blocks, backward cp transfers of 1, 2, ..., 2, 1 blocks (K/V and the
K/V gradient travel together), every transfer beside a kernel; the copies and accumulations of
the split are HBM passes of counted bytes. Each against an independent count."""

from __future__ import annotations

import pytest

from simdist.analytic.collectives import Network
from simdist.analytic.context import (
    TE_ACCUMULATE_BYTES,
    TE_SIDE_SHARE,
    kv_block_bytes,
)
from simdist.analytic.cost import CostModel
from simdist.analytic.ops import Comm, Compute
from simdist.analytic.passes import OpTimer
from simdist.analytic.variants import layer_ops
from simdist.predict import predict
from simdist.spec.scenario import scenario_from_dict


def make(seq: int, cp: int, tp: int = 1, nodes: int = 1) -> object:
    plan = {"tp": tp, "cp": cp, "cp_method": "ring", "framework": "nemo", "global_batch_size": 8 * nodes // (tp * cp),
            "recompute": "full"}
    return scenario_from_dict({"name": "t", "model": {"preset": "llama2-7b", "seq_length": seq},
                               "cluster": {"preset": "dgx-h100", "num_nodes": nodes}, "plan": plan})


def core(sc, phase: str) -> list:
    """The attention core of one layer, in the order it runs."""
    return [op for op in layer_ops(sc.model, sc.plan, phase)
            if (isinstance(op, Comm) and op.axis == "cp") or (isinstance(op, Compute) and op.name.startswith(
                ("flash attention", "cp ")))]


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_forward_sends_cp_minus_one_blocks_each_before_a_kernel(cp):
    sc = make(65536, cp)
    kv = kv_block_bytes(sc.model, sc.plan)
    fwd = core(sc, "fwd")
    sends = [i for i, op in enumerate(fwd) if isinstance(op, Comm)]
    kernels = [op for op in fwd if isinstance(op, Compute) and op.kind == "attention"]
    assert len(kernels) == cp and len(sends) == cp - 1
    assert all(fwd[i].collective == "sendrecv" and fwd[i].bytes == kv for i in sends)
    assert all(fwd[i + 1].kind == "attention" for i in sends)  # the kernel it overlaps
    # the output corrections: the whole output after the diagonal step, 3/4 of it (the mean over
    # ranks of the full- and half-query branches) after each other step, 6 B per element
    out = 65536 // cp * 32 * 128
    corrections = [op for op in fwd if op.name == "cp out correction"]
    assert len(corrections) == 1
    assert corrections[0].bytes == pytest.approx(TE_ACCUMULATE_BYTES * out * (1 + 0.75 * (cp - 1)), rel=1e-12)
    assert TE_SIDE_SHARE == (1 + 0.5) / 2
    # the balanced causal work: together 1/cp of the un-split layer's kernel
    single = make(65536, 1)
    whole = next(op for op in layer_ops(single.model, single.plan, "fwd") if op.kind == "attention")
    assert sum(k.flops for k in kernels) == pytest.approx(whole.flops / cp, rel=1e-12)


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_backward_sends_kv_and_grads_together_beside_each_steps_kernel(cp):
    """Step i sends K/V and the gradient accumulated so far: only K/V first, only the gradient
    last (cp = 2: one block each way), and awaits it after its own kernel."""
    sc = make(65536, cp)
    kv = kv_block_bytes(sc.model, sc.plan)
    bwd = core(sc, "bwd")
    sends = [i for i, op in enumerate(bwd) if isinstance(op, Comm)]
    assert [bwd[i].bytes / kv for i in sends] == [1.0] + [2.0] * (cp - 2) + [1.0]
    assert all(bwd[i].collective == "sendrecv" and bwd[i + 1].kind == "attention" for i in sends)
    # K/V travel cp - 1 hops and their gradients cp - 1 hops
    assert sum(bwd[i].bytes for i in sends) == pytest.approx(2 * (cp - 1) * kv, rel=1e-12)
    assert len([op for op in bwd if op.name == "cp grad accumulate"]) == cp
    assert bwd[0].name == "cp kv copy" and bwd[0].bytes == 4 * kv / 2  # 16-bit: read + write


def test_every_transfer_hides_behind_a_long_kernel_and_engines_agree():
    """At 64K tokens on 4 ranks each kernel is far longer than its transfer: nothing is exposed,
    and the kernels beside the transfers run slower by NCCL's share; the engines agree."""
    sc = make(65536, 4)
    cost, net = CostModel(sc.cluster.gpu, sc.plan.precision), Network.of(sc.cluster)
    timer = OpTimer(sc, cost, net)
    for phase in ("fwd", "bwd"):
        ops = layer_ops(sc.model, sc.plan, phase)
        got = timer.passes(ops)
        assert got.cp_exposed == 0.0
        assert all(op.axis == "cp" for op in ops if isinstance(op, Comm))  # tp 1: no other collective
        plain = sum(cost.time(op) + timer.op_extra[0] for op in ops if isinstance(op, Compute))
        hidden = sum(timer.comm(op) for op in ops if isinstance(op, Comm))
        assert got.compute == pytest.approx(plain + timer.contention * hidden, rel=1e-9)
    p = predict(sc, engine="analytic", keep_spans=False)
    des = predict(sc, engine="des", keep_spans=False)
    assert des.step_time_s == pytest.approx(p.step_time_s, rel=0.02)


def test_a_short_block_exposes_what_its_kernel_cannot_hide():
    """At 4K tokens over 8 ranks on two nodes the blocks cross the NICs and each step's kernel is
    short: the exposed time is the sum over transfers of (transfer - its kernel), floored at 0."""
    sc = make(4096, 8, nodes=2)
    cost, net = CostModel(sc.cluster.gpu, sc.plan.precision), Network.of(sc.cluster)
    timer = OpTimer(sc, cost, net)
    for phase in ("fwd", "bwd"):
        ops = layer_ops(sc.model, sc.plan, phase)
        expect = sum(max(0.0, timer.comm(op) - cost.time(ops[i + 1])) for i, op in enumerate(ops)
                     if isinstance(op, Comm) and op.axis == "cp")
        assert timer.passes(ops).cp_exposed == pytest.approx(expect, rel=1e-12)
        assert expect > 0.0


def test_nemo_long_sequence_rows_run_their_recipe_without_recompute():
    """The NeMo long-sequence rows take the recipe's plan (no activation recompute), even where
    the memory model finds the plan tight (R0080: 4K tokens, TP1 on 4 GPUs): it is stated, not
    tuned, so the search cannot pick full recompute for them."""
    from simdist.validate import moe_cp
    from simdist.validate.rows import packaged_data_dir, read_csv

    rows = {r["run_id"]: r for r in read_csv(packaged_data_dir() / "training_runs.csv")}
    for rid in ("R0080", "R0092", "R0096"):
        sc, tuned, _ = moe_cp.build(rows[rid])
        assert sc.plan.recompute == "none" and tuned == [] and sc.plan.cp_method == "ring"


def test_nemo_2403_rows_run_cudnn_9_attention_on_an_h100():
    """NeMo 24.03's cuDNN 9.0 fused attention: 1.38x FlashAttention-2 (Transformer Engine's benchmark
    of cuDNN 9.0 against flash-attn 2.4.2, causal, head dim 128), not the catalog's later 1.66x;
    the GPU is otherwise the H100 SXM and its rows inform the H100's fitted constants."""
    from simdist.validate import moe_cp
    from simdist.validate.rows import packaged_data_dir, read_csv
    from simdist.validate.training import generation

    rows = {r["run_id"]: r for r in read_csv(packaged_data_dir() / "training_runs.csv")}
    sc, _, _ = moe_cp.build(rows["R0092"])
    h100 = scenario_from_dict({"name": "t", "model": {"preset": "llama2-7b"}, "cluster": {"preset": "dgx-h100",
                               "num_nodes": 1}, "plan": {"global_batch_size": 8}}).cluster.gpu
    gpu = sc.cluster.gpu
    assert gpu.fused_attention_speedup == 1.38 and h100.fused_attention_speedup == 1.66
    assert (gpu.peak("bf16"), gpu.efficiency, gpu.sms) == (h100.peak("bf16"), h100.efficiency, h100.sms)
    assert generation(gpu.name) == generation(h100.name) == "h100"
    # the attention kernels run 1.66 / 1.38 times longer than on the catalog's H100
    cm, ch = CostModel(gpu, sc.plan.precision), CostModel(h100, sc.plan.precision)
    kernel = next(op for op in layer_ops(sc.model, sc.plan, "fwd") if isinstance(op, Compute) and op.kind == "attention")
    assert (cm.time(kernel) - cm.kernel_overhead) / (ch.time(kernel) - ch.kernel_overhead) == pytest.approx(
        1.66 / 1.38, rel=0.02)


@pytest.mark.parametrize("framework", ["pytorch", "deepspeed", None])
def test_frameworks_without_transformer_engine_run_a_plain_ring(framework):
    """Outside Megatron-Core and NeMo the ring is a plain one: cp kernels, cp - 1 transfers each
    way (K/V in forward, K/V with their gradients in backward), no split copies or corrections."""
    plan = {"tp": 1, "cp": 4, "cp_method": "ring", "global_batch_size": 2, "recompute": "full"}
    if framework:
        plan["framework"] = framework
    sc = scenario_from_dict({"name": "t", "model": {"preset": "llama2-7b", "seq_length": 65536},
                             "cluster": {"preset": "dgx-h100", "num_nodes": 1}, "plan": plan})
    kv = kv_block_bytes(sc.model, sc.plan)
    for phase, blocks in (("fwd", 1.0), ("bwd", 2.0)):
        ops = core(sc, phase)
        assert not any(op.name.startswith("cp ") for op in ops)
        assert [op.bytes / kv for op in ops if isinstance(op, Comm)] == [blocks] * 3
        assert len([op for op in ops if isinstance(op, Compute)]) == 4
