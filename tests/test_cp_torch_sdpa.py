"""Context parallelism as PyTorch's context_parallel runs it under torchtitan: K/V repeated to
every query head (torchtitan's Llama calls SDPA after repeat_kv), one all-gather hidden behind
the first step's kernel, cp kernels per layer with fp32 merges, and the fp32 K/V gradient
passed on after each backward step. Each against an independent count."""

from __future__ import annotations

import pytest

from simdist.analytic.collectives import Network
from simdist.analytic.context import SDPA_GRAD_ACCUM_BYTES, SDPA_MERGE_BYTES, kv_block_bytes
from simdist.analytic.cost import CostModel
from simdist.analytic.ops import Comm, Compute
from simdist.analytic.passes import OpTimer
from simdist.analytic.variants import layer_ops
from simdist.predict import predict
from simdist.spec.scenario import scenario_from_dict

SEQ = 65536


def make(framework: str, cp: int = 4, tp: int = 1, **plan) -> object:
    plan = {"tp": tp, "cp": cp, "cp_method": "allgather", "framework": framework, "global_batch_size": 8 // tp,
            "recompute": "full", **plan}
    return scenario_from_dict({"name": "t", "model": {"preset": "llama3-8b", "seq_length": SEQ},
                               "cluster": {"preset": "dgx-h100", "num_nodes": 1}, "plan": plan})


@pytest.mark.parametrize("tp", [1, 2])
def test_kv_is_repeated_to_every_query_head_under_torchtitan_only(tp):
    """Llama 3 8B: 32 query heads, 8 KV heads of 128. torchtitan all-gathers the repeated K/V
    (32 heads), Megatron's and the Llama 3 paper's all-gather the 8 KV heads."""
    s_local, heads, kv_heads, hd = SEQ // 4, 32, 8, 128
    titan, nemo = make("torchtitan", tp=tp), make("nemo", tp=tp)
    assert kv_block_bytes(titan.model, titan.plan) == s_local * 2 * heads * hd * 2 / tp
    assert kv_block_bytes(nemo.model, nemo.plan) == s_local * 2 * kv_heads * hd * 2 / tp


def core(sc, phase: str) -> list:
    return [op for op in layer_ops(sc.model, sc.plan, phase)
            if (isinstance(op, Comm) and op.axis == "cp") or (isinstance(op, Compute) and op.name.startswith(
                ("flash attention", "cp ")))]


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_op_list_follows_pytorchs_ring_loop(cp):
    sc = make("torchtitan", cp=cp)
    kv = kv_block_bytes(sc.model, sc.plan)
    fwd, bwd = core(sc, "fwd"), core(sc, "bwd")  # each in the order it runs
    # forward: one all-gather of every rank's block, hidden by the first kernel; cp kernels; cp - 1 merges
    assert isinstance(fwd[0], Comm) and fwd[0].collective == "allgather" and fwd[0].overlaps_next
    assert fwd[0].bytes == cp * kv and isinstance(fwd[1], Compute) and fwd[1].kind == "attention"
    kernels = [op for op in fwd if isinstance(op, Compute) and op.kind == "attention"]
    merges = [op for op in fwd if isinstance(op, Compute) and op.name == "cp merge"]
    assert len(kernels) == cp and len(merges) == cp - 1
    out_elements = SEQ // cp * 32 * 128  # the rank's attention output
    assert merges[0].bytes == SDPA_MERGE_BYTES * out_elements
    # the balanced causal work: cp kernels of 1/cp^2 of the layer's full-square FLOPs each, so
    # together 1/cp of the un-split layer's kernel
    single = [op for op in layer_ops(make("torchtitan", cp=1).model, make("torchtitan", cp=1).plan, "fwd")
              if isinstance(op, Compute) and op.kind == "attention"]
    assert sum(k.flops for k in kernels) == pytest.approx(single[0].flops / cp, rel=1e-12)
    # backward: the all-gather again (first, hidden), cp kernels with their fp32 accumulation, and
    # a send of the fp32 K/V gradient (twice the 16-bit bytes) after each, every one but the last
    # followed by the next kernel (which hides it), the last only by the query gradient's cast
    assert bwd[0].collective == "allgather" and bwd[0].overlaps_next
    sends = [i for i, op in enumerate(bwd) if isinstance(op, Comm) and op.collective == "sendrecv"]
    assert len(sends) == cp and all(bwd[i].bytes == 2 * kv for i in sends)
    assert all(bwd[i + 1].kind == "attention" for i in sends[:-1]) and bwd[sends[-1] + 1].name == "cp grad cast"
    accum = [op for op in bwd if isinstance(op, Compute) and op.name == "cp grad accumulate"]
    assert len(accum) == cp and accum[0].bytes == SDPA_GRAD_ACCUM_BYTES * out_elements
    assert sum(op.flops for op in bwd if isinstance(op, Compute) and op.kind == "attention") == pytest.approx(
        2.5 * sum(k.flops for k in kernels), rel=1e-12)


def test_the_gather_hides_behind_the_first_kernel_and_engines_agree():
    """The forward's exposed CP time is the all-gather minus the first kernel (none when the kernel
    is longer); the closed form and the event engine agree."""
    sc = make("torchtitan", cp=4)
    cost, net = CostModel(sc.cluster.gpu, sc.plan.precision), Network.of(sc.cluster)
    timer = OpTimer(sc, cost, net)
    fwd = layer_ops(sc.model, sc.plan, "fwd")
    gather = next(op for op in fwd if isinstance(op, Comm) and op.axis == "cp")
    first = next(op for op in fwd if isinstance(op, Compute) and op.kind == "attention")
    assert timer.passes(fwd).cp_exposed == pytest.approx(max(0.0, timer.comm(gather) - cost.time(first)), abs=1e-12)
    p = predict(sc, engine="analytic", keep_spans=False)
    des = predict(sc, engine="des", keep_spans=False)
    assert des.step_time_s == pytest.approx(p.step_time_s, rel=0.02)


def test_other_frameworks_keep_the_exposed_gather_and_one_kernel():
    """Llama 3's all-gather (arXiv:2407.21783 sec 3.3.2): gather, one kernel, exposed."""
    sc = make("pytorch", cp=4)
    fwd = core(sc, "fwd")
    assert [type(op) for op in fwd] == [Comm, Compute] and not fwd[0].overlaps_next
