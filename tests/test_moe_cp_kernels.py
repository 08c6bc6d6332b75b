"""What the MoE and context-parallel layers run on the GPU: the framework's attention kernel under
context parallelism, FP8 for the experts' and MLA's linears, and the FP8 weight caches of the
experts a GPU actually holds. Each against an independent count of the op list or the weights."""

from __future__ import annotations

import pytest

from simdist.analytic.fp8_memory import linear_weight_params
from simdist.analytic.ops import Compute
from simdist.analytic.variants import layer_ops
from simdist.predict import predict
from simdist.spec.layers import layer_kind
from simdist.spec.scenario import scenario_from_dict


def make(model: dict, nodes: int = 1, **plan) -> object:
    plan.setdefault("global_batch_size", 64)
    return scenario_from_dict({"name": "t", "model": model, "cluster": {"preset": "dgx-h100", "num_nodes": nodes},
                               "plan": plan})


def computes(sc, phase: str = "fwd") -> list[Compute]:
    kind = layer_kind(sc.model, sc.model.num_layers - 1)
    return [op for op in layer_ops(sc.model, sc.plan, phase, kind) if isinstance(op, Compute)]


@pytest.mark.parametrize("method", ["ring", "allgather", "ulysses"])
@pytest.mark.parametrize("framework,kernel", [("nemo", "cudnn"), ("megatron", "cudnn"), ("pytorch", "flash2")])
def test_context_parallel_attention_is_the_frameworks_kernel(method, framework, kernel):
    """Split over cp ranks, every attention kernel is the one the framework runs without CP
    (Transformer Engine's fused attention for Megatron/NeMo, FlashAttention-2 for PyTorch)."""
    model = {"preset": "llama2-7b", "seq_length": 32768}
    for cp in (1, 2):
        sc = make(model, nodes=2, cp=cp, cp_method=method, framework=framework)
        kernels = [op for op in computes(sc) + computes(sc, "bwd") if op.kind == "attention"]
        assert kernels and all(op.kernel == kernel for op in kernels)


def test_fused_attention_makes_long_context_faster_by_the_kernel_speedup():
    """At 128K tokens the attention core dominates: the same CP plan under NeMo runs its
    attention kernels fused_attention_speedup times faster than under plain PyTorch."""
    model = {"preset": "llama2-7b", "seq_length": 131072}
    plans = {fw: make(model, nodes=16, tp=4, cp=4, framework=fw, global_batch_size=32) for fw in ("nemo", "pytorch")}
    from simdist.analytic.cost import CostModel
    times = {}
    for fw, sc in plans.items():
        cm = CostModel(sc.cluster.gpu, sc.plan.precision)
        times[fw] = sum(cm.time(op) for op in computes(sc) if op.kind == "attention")
    speedup = plans["nemo"].cluster.gpu.fused_attention_speedup
    assert times["pytorch"] / times["nemo"] == pytest.approx(speedup, rel=0.02)


def test_experts_and_mla_linears_run_in_fp8_router_and_attention_core_do_not():
    sc = make({"preset": "deepseek-v3"}, nodes=128, tp=2, pp=8, ep=64, sequence_parallel=True, precision="fp8",
              global_batch_size=8192)
    ops = {op.name: op for op in computes(sc) + computes(sc, "bwd")}
    for name in ("experts fc1", "experts fc2 dgrad", "experts fc1 wgrad", "q down", "q up", "kv down", "kv up",
                 "attn out", "shared fc1"):
        assert ops[name].fp8, name
    assert not ops["router"].fp8 and not ops["flash attention"].fp8
    for name in ("fp8 cast experts fc1 input", "fp8 cast experts fc2 grad", "fp8 cast q up input"):
        assert ops[name].kind == "memory" and ops[name].bytes > 0
    bf16 = make({"preset": "deepseek-v3"}, nodes=128, tp=2, pp=8, ep=64, sequence_parallel=True,
                global_batch_size=8192)
    assert not any(op.fp8 for op in computes(bf16) + computes(bf16, "bwd"))


def test_fp8_weight_cache_holds_the_local_experts_only():
    """Qwen3-30B-A3B (hidden 2048, 32 query heads and 4 KV heads of 128, 128 experts of 768,
    SwiGLU): one GPU with ep 16 holds 8 experts per layer; a dense model is unchanged."""
    h, q, kv, f = 2048, 32 * 128, 4 * 128, 768
    attention = h * q + 2 * h * kv + q * h
    for ep in (1, 16):
        sc = make({"preset": "qwen3-30b-a3b", "seq_length": 4096}, nodes=2, ep=ep, precision="fp8")
        assert linear_weight_params(sc.model, sc.plan) == attention + (128 // ep) * 3 * h * f
    dense = make({"preset": "llama2-7b"}, tp=2, precision="fp8")
    assert linear_weight_params(dense.model, dense.plan) == (4 * 4096 * 4096 + 3 * 4096 * 11008) // 2
    p = predict(make({"preset": "qwen3-30b-a3b", "seq_length": 4096}, nodes=2, ep=16, precision="fp8",
                     global_batch_size=1024, zero_stage=1), engine="analytic", keep_spans=False)
    assert p.fits and p.per_stage[0].params_gib < 16


def test_moe_rows_are_scored_but_not_fitted():
    """The MoE rows carry host overhead the model does not price yet: they must not move the
    shared efficiencies (simdist.validate.moe_cp.fitted); the context-parallel rows do."""
    from simdist.validate import moe_cp
    from simdist.validate.fit import fit
    from simdist.validate.rows import data_dir, read_csv
    from simdist.validate.training import Case

    rows = {r["run_id"]: r for r in read_csv(data_dir(None) / "training_runs.csv")}
    assert not moe_cp.fitted(rows["R0099"]) and moe_cp.fitted(rows["R0090"]) and moe_cp.fitted(rows["R0150"])
    sc = make({"preset": "llama2-7b", "seq_length": 2048}, global_batch_size=8)
    assert fit([Case("X", "g", "l", 1.0, "step time", sc, [], fitted=False)]).per_generation == {}
