"""The fused attention kernel class (plan.attention_kernel): FlashAttention-2, Transformer Engine's
cuDNN fused attention and FlashAttention in Triton, their speeds relative to FlashAttention-2
(simdist.analytic.cost), the framework defaults, the assumption line and the MosaicML mapping."""

import pytest

from simdist.analytic.cost import TRITON_FA_SLOWDOWN, CostModel
from simdist.analytic.ops import Compute, layer_ops
from simdist.errors import ScenarioError
from simdist.predict import predict
from simdist.spec.frameworks import attention_kernel
from simdist.spec.scenario import scenario_from_dict
from simdist.validate.mapping import row_to_scenario_dict


def sc(cluster="dgx-h100", **plan):
    plan.setdefault("global_batch_size", 8)
    return scenario_from_dict({"name": "t", "model": {"preset": "llama3-8b"},
                               "cluster": {"preset": cluster, "num_nodes": 1}, "plan": plan})


def attention_ms(s) -> float:
    cost = CostModel(s.cluster.gpu, s.plan.precision)
    ops = [op for op in layer_ops(s.model, s.plan, "fwd") if isinstance(op, Compute) and op.kind == "attention"]
    assert len(ops) == 1
    return cost.time(ops[0]) * 1e3


def test_kernel_speeds_relative_to_flashattention_2():
    fa2, tri, cud = (attention_ms(sc(attention_kernel=k)) for k in ("flash2", "triton", "cudnn"))
    overhead = CostModel(sc().cluster.gpu, "bf16").kernel_overhead * 1e3
    assert (tri - overhead) / (fa2 - overhead) == pytest.approx(TRITON_FA_SLOWDOWN, rel=1e-6)
    h100 = sc().cluster.gpu
    assert (fa2 - overhead) / (cud - overhead) == pytest.approx(h100.fused_attention_speedup, rel=1e-6)
    # on Ampere cuDNN's fused attention is FlashAttention-2 class: no speed-up
    a = [attention_ms(sc("dgx-a100-80gb", attention_kernel=k)) for k in ("flash2", "cudnn")]
    assert a[0] == pytest.approx(a[1])


def test_framework_defaults_and_the_field_wins():
    assert attention_kernel(sc(framework="nemo").plan) == "cudnn"
    assert attention_kernel(sc(framework="megatron").plan) == "cudnn"
    assert attention_kernel(sc(framework="torchtitan", zero_stage=0).plan) == "flash2"
    assert attention_kernel(sc().plan) == "flash2"
    assert attention_kernel(sc(framework="nemo", attention_kernel="triton").plan) == "triton"
    slow, fast = predict(sc(attention_kernel="triton")), predict(sc(attention_kernel="cudnn"))
    assert slow.step_time_s > fast.step_time_s


def test_kernel_needs_fused_attention_and_a_known_name():
    with pytest.raises(ScenarioError, match=r"plan\.attention_kernel: only applies with flash_attention true"):
        sc(attention_kernel="cudnn", flash_attention=False)
    with pytest.raises(ScenarioError, match=r"plan\.attention_kernel: 'fa9' is not one of flash2, cudnn, triton"):
        sc(attention_kernel="fa9")


def test_predict_names_the_kernel_in_its_assumptions():
    lines = [a for a in predict(sc(framework="nemo")).assumptions if a.startswith("attention kernel")]
    assert lines and "cudnn" in lines[0] and "the framework's default" in lines[0]
    lines = [a for a in predict(sc(attention_kernel="triton")).assumptions if a.startswith("attention kernel")]
    assert lines and "triton" in lines[0] and "as set" in lines[0]


def test_mosaicml_rows_run_flashattention_in_triton():
    row = {k: "" for k in ("run_id", "model_name", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab",
                           "seq_len", "gpu_type", "num_gpus", "gpus_per_node", "inter_node_link", "tp", "pp",
                           "zero_stage_fsdp", "recompute", "micro_batch", "global_batch", "precision", "framework",
                           "measured_hfu", "notes")}
    row.update(run_id="X", model_name="MPT-7b", layers="32", hidden="4096", heads="32", vocab="50368",
               seq_len="2048", gpu_type="h100_80gb", num_gpus="8", zero_stage_fsdp="PyTorch FSDP FULL_SHARD",
               global_batch="48", micro_batch="6", precision="amp_bf16",
               framework="MosaicML Composer/llm-foundry (PyTorch FSDP, FlashAttention)")
    s = scenario_from_dict(row_to_scenario_dict(row))
    assert s.plan.attention_kernel == "triton" and s.plan.flash_attention


def test_catalog_attention_efficiency_is_on_the_causally_computed_flops():
    """A causal kernel computes the key tiles on or below the diagonal: (nb + 1) / 2nb of the
    square. The FLOPs stay on the full square, so the catalog's fraction (computed FLOPs) is
    divided by that share: a fast kernel's full-square efficiency may exceed 1, its computed one
    not."""
    from simdist.analytic.cost import causal_share

    assert causal_share(128) == 1.0
    assert causal_share(8192) == pytest.approx(65 / 128)
    s = sc("dgx-a100-80gb", attention_kernel="flash2")
    cost = CostModel(s.cluster.gpu, "bf16")
    op = next(op for op in layer_ops(s.model, s.plan, "fwd") if isinstance(op, Compute) and op.kind == "attention")
    computed = cost.attention_efficiency(op) * causal_share(op.n)
    assert computed <= 1.0
    assert cost.attention_efficiency(op) == pytest.approx(computed / causal_share(op.n))
    assert cost.attention_efficiency(op) > computed  # the full-square figure is about twice the computed one
