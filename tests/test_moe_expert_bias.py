"""The experts' output bias added expert by expert (simdist.analytic.moe.expert_bias_ops):
Megatron-Core's TEGroupedMLP._apply_bias, what GPT-OSS runs under Megatron-Bridge."""

from __future__ import annotations

from typing import Any

import pytest

from simdist.analytic import moe
from simdist.errors import ScenarioError
from simdist.predict import predict
from simdist.spec.scenario import scenario_from_dict

# GPT_OSS_120B_PRETRAIN_CONFIG_H100_BF16 (Megatron-Bridge scripts/performance, the recipe of the
# performance summary's GPT-OSS rows): 64 H100, TP1 PP4 EP8, alltoall dispatcher, selective
# recompute of [layernorm, moe_act], bf16 gradient reduction, global batch 1280, sequence 4096
# (simdist.validate.moe_cp)
RECIPE: dict[str, Any] = {"framework": "nemo", "tp": 1, "pp": 4, "ep": 8, "zero_stage": 1, "precision": "bf16",
                          "moe_dispatcher": "alltoall", "recompute": "selective", "micro_batch_size": 1,
                          "global_batch_size": 1280, "ddp_bucket_size": "160000000 B",
                          "fp32_grad_accumulation": False}


def _scenario(preset: str = "gpt-oss-120b", **plan: Any) -> Any:
    return scenario_from_dict({"name": "expert bias", "model": {"preset": preset, "seq_length": 4096},
                               "cluster": {"preset": "dgx-h100", "num_nodes": 8, "gpus_per_node": 8},
                               "plan": {**RECIPE, **plan}})


def _bias_ops(sc: Any, bwd: bool) -> list[Any]:
    return [op for op in moe.routed_ops(sc.model, sc.plan, bwd) if op.name.startswith("experts fc2 bias")]


def test_megatron_adds_the_bias_expert_by_expert() -> None:
    sc = _scenario()
    m, plan = sc.model, sc.plan
    n = moe.local_experts(m, plan)
    assert n == 16  # 128 experts over EP8
    rows = 4096 * 4  # balanced: each rank receives its own tokens' k copies
    (fwd,) = _bias_ops(sc, bwd=False)
    (bwd,) = _bias_ops(sc, bwd=True)
    # forward: a multiply and an add per expert, one concatenation; 6 passes of rows x hidden bf16
    assert fwd.batch == 2 * n + 1
    assert fwd.bytes == pytest.approx(6 * rows * 2880 * 2)
    # backward: two products, two reductions and the main_grad add per expert; two concatenations
    assert bwd.batch == 5 * n + 2
    assert bwd.bytes == pytest.approx(8 * rows * 2880 * 2)
    names = [op.name for op in moe.routed_ops(m, plan, bwd=False)]
    assert names.index("experts fc2 bias") == max(i for i, x in enumerate(names) if x == "experts fc2") + 1


def test_fused_bias_or_no_bias_adds_nothing() -> None:
    assert _bias_ops(_scenario(moe_expert_bias="fused"), bwd=False) == []
    assert _bias_ops(_scenario(framework="torchtitan", zero_stage=3), bwd=True) == []
    assert _bias_ops(_scenario("qwen3-30b-a3b"), bwd=False) == []  # no biases
    # the field wins over the framework's default
    assert _bias_ops(_scenario(framework="pytorch", moe_expert_bias="per_expert"), bwd=False)


def test_bad_value_names_the_field() -> None:
    with pytest.raises(ScenarioError) as e:
        _scenario(moe_expert_bias="sometimes")
    assert any(p.field == "plan.moe_expert_bias" for p in e.value.problems)


# Published steps: Megatron-Bridge docs/performance-summary-archive.md (@067f987), GPT-OSS 120B
# BF16 pre-training on 64 DGX-H100 GPUs, tokens/s per GPU -> step = GBS x 4096 / (tokens/s x 64).
# Sections 26.04.01, 26.04, 26.02.01, 26.02 (micro-batch 1, GBS 1280) and 25.11 (micro-batch 4,
# GBS 512); validation rows R0105, R0110, R0115, R0121, R0127.
PUBLISHED = [(1, 1280, 5824), (1, 1280, 5810), (1, 1280, 5984), (1, 1280, 5993), (4, 512, 5630)]


@pytest.mark.parametrize(("mbs", "gbs", "tokens_per_gpu"), PUBLISHED)
def test_gpt_oss_rows_within_tolerance_with_the_per_expert_bias(mbs: int, gbs: int, tokens_per_gpu: int) -> None:
    """The per-expert bias is 0.7 s of the 14 s micro-batch-1 step (5% of it). What is still
    missing (docs/moe-accuracy.md: a cost per micro-batch of about 3 ms per layer) sets the
    tolerance: 22% at micro-batch 1 and 13% at micro-batch 4, both exceeded without the bias
    (23.0-25.3% and 15.2%)."""
    measured = gbs * 4096 / (tokens_per_gpu * 64)
    step = predict(_scenario(micro_batch_size=mbs, global_batch_size=gbs), engine="analytic",
                   keep_spans=False).step_time_s
    tolerance = 0.22 if mbs == 1 else 0.13
    assert abs(step / measured - 1) <= tolerance
    fused = predict(_scenario(micro_batch_size=mbs, global_batch_size=gbs, moe_expert_bias="fused"),
                    engine="analytic", keep_spans=False).step_time_s
    assert fused < step  # the mechanism is what brings the row inside
