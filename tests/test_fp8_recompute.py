"""FP8 as it runs (simdist.analytic.fp8, ops), recompute policies by framework, head_dim, GQA
replication, sliding-window attention, the attention kernel and pipeline sends (simdist.analytic
.ops / stage)."""

import pytest

from simdist.analytic import fp8
from simdist.analytic.collectives import Network
from simdist.analytic.cost import CostModel
from simdist.analytic.data_parallel import dp_traffic
from simdist.analytic.flops import model_flops_per_step
from simdist.analytic.ops import Compute, layer_ops, recompute_ops
from simdist.analytic.stage import describe
from simdist.errors import ScenarioError
from simdist.predict import predict
from simdist.spec.scenario import scenario_from_dict
from simdist.spec.unsimulated import not_simulated


def sc(model="llama3-8b", cluster="dgx-h100", nodes=1, **plan):
    plan.setdefault("global_batch_size", 8 * nodes)
    m = model if isinstance(model, dict) else {"preset": model}
    return scenario_from_dict({"name": "t", "model": m, "cluster": {"preset": cluster, "num_nodes": nodes},
                               "plan": plan})


def computes(s, phase="fwd"):
    return [op for op in layer_ops(s.model, s.plan, phase) if isinstance(op, Compute)]


def time(s):
    return predict(s, engine="analytic", keep_spans=False)


def test_fp8_runs_the_linears_in_fp8_and_the_rest_in_bf16():
    s = sc(precision="fp8")
    ops = computes(s) + computes(s, "bwd")
    linears = [op for op in ops if op.kind == "gemm"]
    assert linears and all(op.fp8 for op in linears)  # fprop, dgrad and wgrad of every linear
    assert {op.name for op in linears} >= {"qkv", "fc2 wgrad", "attn out dgrad"}
    assert not any(op.fp8 for op in ops if op.kind == "attention")
    assert any(op.name.startswith("fp8 cast") for op in ops)
    assert not any(op.name.startswith("fp8 cast") for op in computes(sc()))


def test_fp8_is_faster_than_bf16_but_not_twice():
    bf16, f8 = time(sc()), time(sc(precision="fp8"))
    assert 1.1 < bf16.step_time_s / f8.step_time_s < 2.0  # casts and BF16 attention keep it under 2x


def test_current_scaling_costs_an_amax_pass_more_than_delayed():
    def casts(**kw):
        return sum(op.bytes for op in computes(sc(precision="fp8", **kw)) if op.name.startswith("fp8 cast"))
    assert casts(fp8_recipe="tensorwise") == pytest.approx(1.5 * casts(fp8_recipe="delayed"), rel=0.02)
    assert time(sc(precision="fp8", fp8_recipe="tensorwise")).step_time_s > time(sc(precision="fp8")).step_time_s


def test_torchao_quantizes_weights_every_micro_batch_te_once_per_step():
    te = sc(precision="fp8", framework="nemo", global_batch_size=64)  # 8 micro-batches per GPU
    ao = sc(precision="fp8", framework="torchtitan", zero_stage=0, global_batch_size=64)
    assert fp8.weight_casts_per_microbatch(te.plan) == pytest.approx(1 / 8)
    assert fp8.weight_casts_per_microbatch(ao.plan) == 2


@pytest.mark.parametrize(("framework", "gpu", "recipe"), [
    ("nemo", "dgx-h100", "delayed"), ("nemo", "dgx-b200", "mxfp8"), ("torchtitan", "dgx-h100", "tensorwise"),
    (None, "dgx-h100", "delayed")])
def test_the_default_recipe_is_the_frameworks(framework, gpu, recipe):
    kw = {"framework": framework} if framework else {}
    s = sc(cluster=gpu, precision="fp8", **kw)
    assert fp8.recipe(s.plan, s.cluster.gpu.name) == recipe
    assert f"FP8 recipe {recipe}" in "\n".join(time(s).assumptions)
    assert "plan.fp8_recipe" not in {n.field for n in not_simulated(s)}


def test_selective_recompute_is_the_frameworks_policy():
    megatron = time(sc(recompute="selective", framework="megatron")).breakdown_s["recompute"]
    assert megatron == 0  # the attention core, which FlashAttention recomputes already
    titan = sc(recompute="selective", framework="torchtitan", zero_stage=0)
    full = time(sc(recompute="full", framework="torchtitan", zero_stage=0)).breakdown_s["recompute"]
    op_level = time(titan).breakdown_s["recompute"]
    assert 0.15 * full < op_level < 0.6 * full  # k, o, w3 and the elementwise ops
    names = {op.name for op in recompute_ops(titan.model, titan.plan)}
    assert {"qkv (k part)", "attn out", "fc1 (w3 part)", "norm1", "swiglu"} <= names
    assert not names & {"fc2", "flash attention"}
    f8 = sc(recompute="selective", framework="torchtitan", zero_stage=0, precision="fp8")
    gemms = {op.name for op in recompute_ops(f8.model, f8.plan) if isinstance(op, Compute) and op.kind == "gemm"}
    assert gemms == {"qkv", "attn out", "fc1"}  # _scaled_mm is not in torchtitan's save list


def test_head_dim_apart_from_hidden_over_heads_sets_the_projections():
    base = {"num_layers": 4, "hidden_size": 2048, "num_attention_heads": 32, "num_kv_heads": 4,
            "vocab_size": 32000, "seq_length": 4096, "mlp": "swiglu", "ffn_hidden_size": 6144}
    wide = sc({**base, "head_dim": 128})  # queries 4096 wide (Qwen3-style)
    narrow = sc(base)  # head_dim 64
    qkv = {s: next(op for op in computes(s) if op.name == "qkv") for s in (wide, narrow)}
    assert qkv[wide].n == 32 * 128 + 2 * 4 * 128 and qkv[narrow].n == 32 * 64 + 2 * 4 * 64
    assert model_flops_per_step(wide.model, wide.plan) > model_flops_per_step(narrow.model, narrow.plan)
    assert "model.head_dim" not in {n.field for n in not_simulated(wide)}


def test_more_tp_ranks_than_kv_heads_replicate_them():
    s = sc("llama3-70b", nodes=2, tp=16, global_batch_size=16)  # 8 KV heads
    qkv = next(op for op in computes(s) if op.name == "qkv")
    assert qkv.n == 64 * 128 // 16 + 2 * 128  # one replicated KV head per rank
    odd = {"num_layers": 2, "hidden_size": 1536, "num_attention_heads": 24, "num_kv_heads": 8,
           "ffn_hidden_size": 6144, "vocab_size": 32000, "seq_length": 2048}
    with pytest.raises(ScenarioError) as e:  # 12 ranks, 8 KV heads: neither divides the other
        sc(odd, nodes=2, tp=12, global_batch_size=16)
    assert "model.num_kv_heads (8): neither divides the other" in str(e.value)


def test_sliding_window_attention_does_the_band_s_work():
    full = sc("llama3-8b")
    windowed = sc({"preset": "llama3-8b", "sliding_window": 1024})
    att = {s: next(op for op in computes(s) if op.kind == "attention").flops for s in (full, windowed)}
    w, s_ = 1024, 8192
    assert att[windowed] / att[full] == pytest.approx((2 * w - w * w / s_) / s_)
    half = sc({"preset": "llama3-8b", "sliding_window": 1024, "sliding_window_layers": 16})
    a_half = next(op for op in computes(half) if op.kind == "attention").flops
    assert a_half == pytest.approx((att[full] + att[windowed]) / 2)


def test_te_attention_is_hopper_native_sdpa_is_flashattention_2():
    nemo, titan = sc(framework="nemo"), sc(framework="torchtitan", zero_stage=0, fused_elementwise=True)
    t = {s: describe(s, CostModel(s.cluster.gpu, "bf16"), Network.of(s.cluster)).layer.fwd.compute for s in (nemo, titan)}
    assert t[nemo] < 0.95 * t[titan]
    a100 = sc(cluster="dgx-a100-80gb", framework="nemo"), sc(cluster="dgx-a100-80gb", framework="torchtitan",
                                                             zero_stage=0, fused_elementwise=True)
    ta = [describe(s, CostModel(s.cluster.gpu, "bf16"), Network.of(s.cluster)).layer.fwd.compute for s in a100]
    assert ta[0] == pytest.approx(ta[1])  # FlashAttention-2 is Ampere's native kernel


def test_sequence_parallel_pipeline_sends_gather_nothing_and_megatron_overlaps_them():
    plan = {"tp": 4, "pp": 2, "global_batch_size": 16, "framework": "nemo"}
    d = describe(s := sc(nodes=1, **plan), CostModel(s.cluster.gpu, "bf16"), Network.of(s.cluster))
    assert d.send.gather_s == 0 and not d.send.overlapped  # sequence parallel (nemo's default with tp)
    inter = sc(nodes=1, virtual_pipeline_stages=2, **plan)
    di = describe(inter, CostModel(inter.cluster.gpu, "bf16"), Network.of(inter.cluster))
    assert di.send.overlapped
    a, e = (predict(inter, engine=x, keep_spans=False) for x in ("analytic", "des"))
    assert e.step_time_s == pytest.approx(a.step_time_s, rel=0.03)


def test_fsdp_inside_pipelining_gathers_once_per_step():
    titan = sc("llama3-70b", nodes=4, tp=8, pp=2, framework="torchtitan", global_batch_size=16)
    plain = sc("llama3-70b", nodes=4, tp=8, pp=2, framework="pytorch", zero_stage=3, global_batch_size=16)
    t, p = dp_traffic(titan.model, titan.plan, 0), dp_traffic(plain.model, plain.plan, 0)
    assert not t.fwd_gathers and t.post_step_gathers and t.step_grad_sync
    assert p.fwd_gathers and p.microbatch_grad_sync
    m = titan.plan.num_microbatches
    assert t.step_bytes(m) < p.step_bytes(m) / 2
