"""Memory layouts that depend on the plan's framework, FP8 recipe and ZeRO++ hpZ."""

from __future__ import annotations

import pytest
from conftest import base_scenario

from simdist.analytic.activations import layer_activation_bytes, layer_saved_tensors
from simdist.analytic.fp8_memory import linear_weight_params
from simdist.analytic.memory import model_state_bytes, stage_memory
from simdist.analytic.params import params_per_rank, total_params
from simdist.analytic.transients import loss_parts
from simdist.spec.scenario import scenario_from_dict
from simdist.units import GiB


def sc_of(model: str = "llama3-8b", cluster: dict | None = None, **plan):
    d = base_scenario(**plan)
    d["model"] = {"preset": model}
    d["cluster"] = {"preset": "dgx-h100", "num_nodes": 1, **(cluster or {})}
    return scenario_from_dict(d)


def states(sc, stage: int = 0) -> dict[str, float]:
    return model_state_bytes(sc.model, sc.plan, stage)


# --- ZeRO++ hpZ -------------------------------------------------------------------------------

def test_hpz_adds_one_secondary_weight_partition():
    """Wang et al. 2023 sec 4.2: ZeRO-3's 16 B / N per parameter plus 2 B / group."""
    plain = sc_of(zero_stage=3, global_batch_size=8)
    hpz = sc_of(zero_stage=3, zero_hpz_partition_size=4, global_batch_size=8)
    n = params_per_rank(hpz.model, hpz.plan, 0)
    extra = sum(states(hpz).values()) - sum(states(plain).values())
    assert extra == pytest.approx(2 * n / 4)
    assert states(hpz)["optimizer"] == states(plain)["optimizer"]  # still sharded over all 8


def test_hpz_llama3_70b_on_256_h100_is_near_the_real_22_gib():
    """Issue 15: hpZ (groups of 8) for Llama 3 70B on 256 H100 holds about 22 GiB of model
    states per GPU (not the 288 GiB of hybrid sharding over 8)."""
    sc = sc_of("llama3-70b", {"num_nodes": 32}, zero_stage=3, zero_hpz_partition_size=8, global_batch_size=256)
    assert sum(states(sc).values()) / GiB == pytest.approx(22, rel=0.10)


# --- FP8 --------------------------------------------------------------------------------------

def test_transformer_engine_caches_fp8_weights_and_transposes():
    """TE keeps each weight in FP8 and its FP8 transpose across micro-batches (2 B per weight),
    plus delayed scaling's amax histories."""
    bf16 = sc_of(global_batch_size=8)
    fp8 = sc_of(precision="fp8", global_batch_size=8)
    extra = states(fp8)["params"] - states(bf16)["params"]
    weights = fp8.model.num_layers * linear_weight_params(fp8.model, fp8.plan)
    assert extra == pytest.approx(2 * weights, rel=1e-3)
    mx = sc_of(precision="fp8", fp8_recipe="mxfp8", global_batch_size=8)
    assert states(mx)["params"] - states(bf16)["params"] == pytest.approx(2 * (1 + 1 / 32) * weights, rel=1e-6)


def test_fp8_saves_gemm_inputs_at_one_byte():
    bf16 = sc_of(global_batch_size=8)
    fp8 = sc_of(precision="fp8", global_batch_size=8)
    b, f = dict(layer_saved_tensors(bf16.model, bf16.plan)), dict(layer_saved_tensors(fp8.model, fp8.plan))
    assert f["QKV input"] == b["QKV input"] / 2 and f["last MLP GEMM input"] == b["last MLP GEMM input"] / 2
    assert f["attention output"] == b["attention output"] and "projection input" in f  # FlashAttention keeps O
    assert layer_activation_bytes(fp8.model, fp8.plan) < layer_activation_bytes(bf16.model, bf16.plan)


def test_torchao_float8_gathers_fsdp_weights_in_fp8_and_caches_nothing():
    bf16 = sc_of(framework="torchtitan", zero_stage=3, global_batch_size=8)
    fp8 = sc_of(framework="torchtitan", zero_stage=3, precision="fp8", global_batch_size=8)
    assert states(fp8) == states(bf16)
    gathered = dict(stage_memory(fp8.model, fp8.plan, 0).other_parts)["gathered_weights"]
    assert gathered == pytest.approx(dict(stage_memory(bf16.model, bf16.plan, 0).other_parts)["gathered_weights"] / 2)


# --- framework layouts ------------------------------------------------------------------------

def test_fsdp2_keeps_fp32_shards():
    """FSDP2 mixed precision: fp32 sharded parameters (the master weights) and fp32 gradients
    (reduce_dtype float32): 4 + 4 + 8 B per parameter over the shard group."""
    sc = sc_of(framework="torchtitan", zero_stage=3, global_batch_size=8)
    n = params_per_rank(sc.model, sc.plan, 0)
    s = states(sc)
    assert (s["params"], s["grads"], s["optimizer"]) == pytest.approx((4 * n / 8, 4 * n / 8, 8 * n / 8))


def test_pipeline_with_fsdp2_keeps_layers_gathered_and_accumulates_fp32_gradients():
    sc = sc_of(framework="torchtitan", zero_stage=3, pp=2, global_batch_size=16)
    n = params_per_rank(sc.model, sc.plan, 0)
    s = states(sc)
    assert s["params"] == pytest.approx(4 * n / 4 + 2 * n)  # fp32 shard + gathered bf16
    assert s["grads"] == pytest.approx(4 * n / 4 + 4 * n)  # fp32 shard + unsharded fp32 accumulation


def test_torchtitan_selective_saves_every_other_matmul():
    """The per-op policy on a Llama layer: layer input, q, v, w1, w2's output, attention's output
    and log-sum-exp."""
    sc = sc_of(framework="torchtitan", recompute="selective", global_batch_size=8)
    m, e = sc.model, 2
    sb = m.seq_length * sc.plan.micro_batch_size
    want = e * sb * (m.hidden_size + m.hidden_size + m.kv_dim + m.ffn_hidden_size + m.hidden_size
                     + m.hidden_size) + 4 * m.num_attention_heads * sb
    assert layer_activation_bytes(m, sc.plan) == pytest.approx(want)
    megatron = sc_of(recompute="selective", global_batch_size=8)
    assert layer_activation_bytes(m, sc.plan) < layer_activation_bytes(megatron.model, megatron.plan)


@pytest.mark.parametrize(("tp", "per_logit"), [(1, 8), (2, 12)])
def test_torch_cross_entropy_buffers(tp, per_logit):
    """PyTorch's cross_entropy(pred.float()): nll_loss's and log_softmax's fp32 gradients beside
    the saved log-softmax; torchtitan's loss_parallel adds the shifted logits' exponential."""
    sc = sc_of(framework="torchtitan", tp=tp, global_batch_size=8 // tp)
    (name, nbytes), = loss_parts(sc.model, sc.plan, 0)
    logits = sc.model.seq_length * sc.model.vocab_size / tp
    assert name == "logit_buffers" and nbytes == pytest.approx(per_logit * logits)


def test_ddp_buckets_copy_the_gradients():
    """DDP docs: gradient_as_bucket_view=False costs one more copy of the gradients."""
    ddp = sc_of(framework="pytorch", global_batch_size=8)
    n = params_per_rank(ddp.model, ddp.plan, 0)
    assert states(ddp)["grads"] == pytest.approx(2 * 4 * n)


def test_deepspeed_zero2_matches_its_estimator_formula():
    """estimate_zero2_model_states_mem_needs: 4 B x params + 16 B x params / GPUs."""
    sc = sc_of(framework="deepspeed", zero_stage=2, global_batch_size=8)
    n = params_per_rank(sc.model, sc.plan, 0)
    assert sum(states(sc).values()) == pytest.approx(4 * n + 16 * n / 8)


def test_zero_shards_over_context_parallel_ranks_too():
    sc = sc_of(zero_stage=1, cp=2, global_batch_size=4)
    n = params_per_rank(sc.model, sc.plan, 0)
    assert states(sc)["optimizer"] == pytest.approx(12 * n / 8)  # dp 4 x cp 2


def test_the_optimizer_step_can_be_the_peak():
    """A 70B model without sharding on one node, tiny activations: PyTorch's foreach Adam needs
    one more fp32 copy of the parameters after backward has freed the activations."""
    sc = sc_of("llama3-70b", framework="pytorch", global_batch_size=8, recompute="full")
    s = stage_memory(sc.model, sc.plan, 0)
    assert s.step_peak and s.activations == 0
    assert dict(s.other_parts)["optimizer_step_temporaries"] == pytest.approx(4 * total_params(sc.model))
