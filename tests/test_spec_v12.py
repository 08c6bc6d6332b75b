"""Format 1.2 fields: experts, latent attention, windows, context-parallel methods, FP8 recipes,
framework defaults, ZeRO++ hpZ; their defaults, their checks (field named) and the list of
what the simulator does not use yet."""

from __future__ import annotations

import pytest
from conftest import DATA, base_scenario
from param_count import total_params

from simdist.errors import ScenarioError
from simdist.spec.scenario import scenario_from_dict
from simdist.spec.unsimulated import NOT_SIMULATED_YET, not_simulated


def moe(model: dict | None = None, nodes: int = 2, **plan) -> dict:
    """Mixtral 8x7B on two DGX H100 (16 GPUs)."""
    return {"name": "t", "model": {"preset": "mixtral-8x7b", "seq_length": 4096, **(model or {})},
            "cluster": {"preset": "dgx-h100", "num_nodes": nodes}, "plan": {"global_batch_size": 64, **plan}}


def problems(d, base_dir=".") -> list[str]:
    with pytest.raises(ScenarioError) as exc:
        scenario_from_dict(d, base_dir)
    return [str(p) for p in exc.value.problems]


def test_defaults_of_a_file_without_v12_fields():
    sc = scenario_from_dict(base_scenario())
    m, p = sc.model, sc.plan
    assert (m.head_dim, m.attention, m.num_experts, m.moe_ffn_hidden_size, m.sliding_window) == (128, "mha", 1, 8192, None)
    assert (p.ep, p.etp, p.moe_dispatcher, p.cp_method, p.fp8_recipe, p.framework) == (1, 1, "alltoall", "ring", None, None)
    assert not_simulated(sc) == []


def test_num_experts_zero_or_absent_is_dense():
    zero = scenario_from_dict({**base_scenario(), "model": {"preset": "gpt3-1.3b", "num_experts": 0}})
    assert zero.model.num_experts == 1 and not zero.model.is_moe
    assert zero.model == scenario_from_dict(base_scenario()).model


def test_explicit_head_dim_need_not_be_hidden_over_heads():
    sc = scenario_from_dict({**base_scenario(), "model": {"preset": "qwen3-30b-a3b"}})
    assert sc.model.head_dim == 128 and sc.model.hidden_size // sc.model.num_attention_heads == 64
    assert sc.model.kv_dim == 4 * 128
    d = {**base_scenario(), "model": {"preset": "gpt3-1.3b", "hidden_size": 2050}}
    assert "model.hidden_size: 2050 is not divisible by num_attention_heads (16); give head_dim" in problems(d)


def test_expert_parallel_layout():
    """Megatron-Core: ep splits the experts and is carved out of dp*cp; etp*ep divides tp*cp*dp."""
    p = scenario_from_dict(moe(tp=2, ep=8)).plan
    assert (p.dp, p.ep, p.expert_dp) == (8, 8, 2)  # tp*cp*dp / (etp*ep) = 16 / 8
    assert scenario_from_dict(moe(tp=2, ep=4, etp=2)).plan.expert_dp == 2


@pytest.mark.parametrize(("model", "plan", "expected"), [
    ({}, {"ep": 3}, "plan.ep: etp*ep = 1*3 does not divide the tp*cp*dp = 16 ranks"),
    ({}, {"ep": 16}, "plan.ep: 16 does not divide model.num_experts (8)"),
    ({}, {"tp": 4, "ep": 4, "etp": 8}, "plan.etp: etp*ep = 8*4 does not divide the tp*cp*dp = 16 ranks"),
    ({"moe_ffn_hidden_size": 1000}, {"etp": 16}, "plan.etp: 16 does not divide model.moe_ffn_hidden_size (1000)"),
    ({"experts_per_token": 9}, {}, "model.experts_per_token: 9 is more than num_experts (8)"),
    ({"first_dense_layers": 32}, {}, "model.first_dense_layers: 32 leaves no MoE layer of 32"),
    ({"moe_load_imbalance": 0.9}, {}, "model.moe_load_imbalance: must be a number >= 1, got 0.9"),
    ({"moe_capacity_factor": 0}, {}, "model.moe_capacity_factor: must be a positive number, got 0"),
    ({"moe_router_groups": 3}, {}, "model.moe_router_groups: 3 does not divide num_experts"),
    ({"moe_router_groups": 4, "moe_router_group_topk": 5}, {}, "model.moe_router_group_topk: 5 is more than"),
    ({"router": "relu"}, {}, "model.router: 'relu' is not one of softmax, sigmoid"),
])
def test_moe_checks_name_the_field(model, plan, expected):
    assert any(m.startswith(expected) for m in problems(moe(model, **plan))), problems(moe(model, **plan))


@pytest.mark.parametrize(("model", "expected"), [
    ({"num_shared_experts": 1}, "model.num_shared_experts: only applies to a mixture-of-experts model"),
    ({"experts_per_token": 2}, "model.experts_per_token: only applies to a mixture-of-experts model"),
    ({"kv_lora_rank": 512}, "model.kv_lora_rank: only applies to attention: mla"),
    ({"attention": "mla"}, "model.kv_lora_rank: is required with attention: mla"),
    ({"sliding_window_layers": 3}, "model.sliding_window_layers: needs sliding_window"),
    ({"sliding_window": 128, "sliding_window_layers": 30}, "model.sliding_window_layers: 30 is more than num_layers (24)"),
])
def test_fields_of_another_architecture_are_refused_not_ignored(model, expected):
    d = {**base_scenario(), "model": {"preset": "gpt3-1.3b", **model}}
    assert any(m.startswith(expected) for m in problems(d)), problems(d)


@pytest.mark.parametrize(("plan", "expected"), [
    ({"ep": 2}, "plan.ep: needs a mixture-of-experts model (model.num_experts > 1)"),
    ({"fp8_recipe": "delayed"}, "plan.fp8_recipe: only applies with precision fp8, not bf16"),
    ({"fp8_recipe": "bogus"}, "plan.fp8_recipe: 'bogus' is not one of delayed, tensorwise, rowwise, blockwise, mxfp8"),
    ({"framework": "jax"}, "plan.framework: 'jax' is not one of megatron, pytorch, deepspeed, torchtitan, nemo"),
    ({"zero_hpz_partition_size": 4}, "plan.zero_hpz_partition_size: the secondary weight partition (ZeRO++ hpZ) needs zero_stage 3"),
    ({"zero_hpz_partition_size": 3, "zero_stage": 3}, "plan.zero_hpz_partition_size: 3 does not divide dp (8)"),
    ({"zero_hpz_partition_size": 2, "zero_stage": 3, "dp_shard": 4}, "plan.zero_hpz_partition_size: combines with dp_shard < dp"),
    ({"cp": 8, "cp_method": "ulysses", "global_batch_size": 8}, "plan.cp: ulysses splits the attention heads: 8 does not divide the 12 heads"),
    ({"pp": 3, "schedule": "dualpipe"}, "plan.pp: dualpipe needs an even number of pipeline stages, got 3"),
    ({"pp": 4, "schedule": "dualpipe", "global_batch_size": 14}, "plan.global_batch_size: dualpipe needs an even number of at least 2*pp = 8 micro-batches per pipeline, got 7"),
    ({"pp": 4, "schedule": "dualpipev", "global_batch_size": 4}, "plan.global_batch_size: dualpipev needs at least 2*pp = 8 micro-batches"),
    ({"pp": 8, "schedule": "dualpipev", "virtual_pipeline_stages": 2}, "plan.virtual_pipeline_stages: 2 chunks per stage needs schedule interleaved-1f1b, not dualpipev"),
])
def test_plan_checks_name_the_field(plan, expected):
    d = base_scenario(**plan)
    if plan.get("pp") == 3:
        d["cluster"]["num_nodes"] = 3
    if plan.get("cp_method"):
        d["model"]["preset"] = "gpt3-125m"  # 12 heads
    assert any(m.startswith(expected) for m in problems(d)), problems(d)


def test_dualpipev_holds_two_stages_per_rank():
    d = {**base_scenario(pp=8, schedule="dualpipev", global_batch_size=16), "model": {"preset": "tiny"}}
    assert "plan.pp: 2*pp (dualpipev: two stages per rank) = 16 is more than model.num_layers (4)" in problems(d)
    ok = scenario_from_dict(base_scenario(pp=4, schedule="dualpipev", global_batch_size=16))
    assert ok.plan.dualpipe and ok.plan.num_microbatches == 8


def test_deepseek_v3_on_1024_h100_the_public_megatron_bridge_plan():
    """TP2 PP8 VPP4 EP64 on 128 DGX H100 (issue 16): dp = 1024 / 16 = 64, expert dp = 2."""
    d = {"name": "dsv3", "model": {"preset": "deepseek-v3"}, "cluster": {"preset": "dgx-h100", "num_nodes": 128},
         "plan": {"tp": 2, "pp": 8, "virtual_pipeline_stages": 4, "ep": 64, "sequence_parallel": True,
                  "global_batch_size": 8192, "precision": "fp8", "fp8_recipe": "blockwise", "framework": "megatron"}}
    sc = scenario_from_dict(d)
    assert (sc.plan.dp, sc.plan.expert_dp, sc.model.moe_layers) == (64, 2, 58)
    # experts, MLA, MTP, the FP8 recipe and the framework's defaults are simulated (issues 15, 16)
    assert not_simulated(sc) == []
    assert not any(n.blocking for n in not_simulated(sc))


def test_not_simulated_names_real_fields_and_dualpipe_is_simulated():
    from simdist.spec.fields import yaml_keys
    from simdist.spec.model import ModelSpec
    from simdist.spec.plan import ParallelPlan

    keys = {f"model.{k}" for k in yaml_keys(ModelSpec)} | {f"plan.{k}" for k in yaml_keys(ParallelPlan)}
    assert {n.field for n in NOT_SIMULATED_YET} <= keys
    sc = scenario_from_dict(base_scenario(pp=2, schedule="dualpipev", global_batch_size=32))
    assert not_simulated(sc) == []
    assert not_simulated(scenario_from_dict(base_scenario(pp=2, global_batch_size=32))) == []


# --- Hugging Face config.json of the new families ----------------------------------------------


@pytest.mark.parametrize(("config", "published", "expect"), [
    # published totals: DeepSeek-V3 report (671B without MTP), Qwen3 model card (30.5B),
    # Qwen1.5-MoE-A2.7B model card (14.3B), gpt-oss model card (20.91B), Qwen3-8B model card (8.2B)
    ("deepseek-v3.json", 671e9, {"attention": "mla", "kv_lora_rank": 512, "q_lora_rank": 1536, "head_dim": 128,
                                 "qk_rope_head_dim": 64, "v_head_dim": 128, "num_experts": 256,
                                 "num_shared_experts": 1, "first_dense_layers": 3, "router": "sigmoid",
                                 "mtp_layers": 1, "moe_ffn_hidden_size": 2048, "moe_router_groups": 8,
                                 "moe_router_group_topk": 4}),
    ("qwen3-30b-a3b.json", 30.5e9, {"head_dim": 128, "num_experts": 128, "experts_per_token": 8,
                                    "moe_ffn_hidden_size": 768, "num_kv_heads": 4}),
    ("qwen1.5-moe-a2.7b.json", 14.3e9, {"num_experts": 60, "experts_per_token": 4, "num_shared_experts": 4,
                                        "sliding_window": None}),
    ("gpt-oss-20b.json", 20.91e9, {"num_experts": 32, "experts_per_token": 4, "head_dim": 64, "bias": True,
                                   "sliding_window": 128, "sliding_window_layers": 12, "seq_length": 4096}),
    ("qwen3-8b.json", 8.19e9, {"head_dim": 128, "num_experts": 1}),
])
def test_hf_import_of_moe_and_explicit_head_dim_families(tmp_path, config, published, expect):
    (tmp_path / "c.json").write_text((DATA / "hf" / config).read_text())
    d = base_scenario()
    d["model"] = {"hf_config": "c.json"}
    d["cluster"] = {"preset": "dgx-h100", "num_nodes": 1}
    m = scenario_from_dict(d, tmp_path).model
    for k, v in expect.items():
        assert getattr(m, k) == v, k
    assert total_params(m) == pytest.approx(published, rel=0.01)


@pytest.mark.parametrize(("patch", "field"), [
    ({"architectures": 5, "model_type": None}, "model.hf_config.architectures"),
    ({"num_hidden_layers": "61"}, "model.hf_config.num_hidden_layers"),
    ({"n_routed_experts": float("nan")}, "model.hf_config.n_routed_experts"),
    ({"moe_layer_freq": 2}, "model.hf_config.moe_layer_freq"),
    ({"scoring_func": "relu"}, "model.hf_config.scoring_func"),
    ({"tie_word_embeddings": "no"}, "model.hf_config.tie_word_embeddings"),
])
def test_hf_config_values_of_the_wrong_type_are_named_by_their_key(tmp_path, patch, field):
    import json

    cfg = {**json.loads((DATA / "hf" / "deepseek-v3.json").read_text()), **patch}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    d = {**base_scenario(), "model": {"hf_config": "c.json"}}
    assert any(m.startswith(field + ":") for m in problems(d, tmp_path)), problems(d, tmp_path)


def test_qwen_moe_layouts_that_cannot_be_expressed_are_refused(tmp_path):
    import json

    cfg = json.loads((DATA / "hf" / "qwen3-30b-a3b.json").read_text())
    for patch, field in (({"decoder_sparse_step": 2}, "decoder_sparse_step"), ({"mlp_only_layers": [1, 5]}, "mlp_only_layers")):
        (tmp_path / "c.json").write_text(json.dumps({**cfg, **patch}))
        msgs = problems({**base_scenario(), "model": {"hf_config": "c.json"}}, tmp_path)
        assert any(m.startswith(f"model.hf_config.{field}:") for m in msgs), msgs
    (tmp_path / "c.json").write_text(json.dumps({**cfg, "mlp_only_layers": [0, 1]}))
    d = {**base_scenario(), "model": {"hf_config": "c.json"}, "cluster": {"preset": "dgx-h100", "num_nodes": 1}}
    assert scenario_from_dict(d, tmp_path).model.first_dense_layers == 2
