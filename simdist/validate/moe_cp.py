"""Validation rows with experts or a split sequence: the mixture-of-experts runs of the
Megatron-Bridge performance summaries, the context-parallel runs of NeMo's long-sequence table
and torchtitan's Llama 3.1 benchmarks, and Llama 3 405B's long-context stage. The training
report (:mod:`simdist.validate.training`) hands these rows here.

MoE rows name the model only; its dimensions come from the catalog preset of the same model,
each figure next to its published config.json (simdist/catalog/models.yaml). The plans are the
Megatron-Bridge H100 recipes' (scripts/performance/configs/*/*_workload_base_configs.py),
under ``framework: nemo`` (Transformer Engine's fused attention, its FP8 recipe, Megatron's bucket
rule; the NeMo long-sequence rows too; the torchtitan rows under ``framework: torchtitan`` on
the benchmark's 96 GiB H100s, as the dense torchtitan rows): distributed optimizer, sequence
parallelism with tp > 1, expert tensor parallelism 1, and per model the token dispatcher and
all-to-all overlap (:data:`MOE_MODELS`; a row of an older release with what its own release's
recipe set instead, :mod:`simdist.validate.moe_releases`). The benchmarks route
tokens force-balanced (the summary's note), so ``moe_load_imbalance`` stays 1.0.

Step times: ``derived_step_s`` where the row has it (global batch x sequence / tokens per second
per GPU / GPUs), the same arithmetic from torchtitan's tokens per second per GPU (local batch 1
per data-parallel rank: global batch = dp), else the reported TFLOP/s with simdist's FLOP count,
which equals NeMo's Llama 2 formula (attention over the whole s x s square).
"""

from __future__ import annotations

from typing import Any

from simdist.analytic.flops import model_flops_per_step
from simdist.errors import ScenarioError
from simdist.spec.scenario import Scenario, scenario_from_dict
from simdist.validate.mapping import TORCHTITAN_GPU
from simdist.validate.moe_releases import release_plan
from simdist.validate.rows import cell_float, cell_int

# model name (lower case, as the rows spell it) -> (preset, plan fields of its H100 recipe)
MOE_MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    # QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_*: moe_flex_dispatcher_backend hybridep, no a2a overlap;
    # set_qwen3_common_configs (scripts/performance/configs/qwen/qwen3_llm_pretrain.py):
    # grad_reduce_in_fp32 = False (gradients accumulate and reduce in bf16)
    "qwen3_30b_a3b": ("qwen3-30b-a3b", {"moe_dispatcher": "flex", "fp32_grad_accumulation": False}),
    # QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_*: alltoall dispatcher, moe_a2a_overlap;
    # qwen3_235b_a22b_pretrain_config_h100: CommOverlapConfig(tp_comm_overlap=False); the same
    # common configs (bf16 gradient reduction)
    "qwen3_235b_a22b": ("qwen3-235b-a22b", {"moe_dispatcher": "alltoall", "ep_comm_overlap": True,
                                            "tp_comm_overlap": False, "fp32_grad_accumulation": False}),
    # DEEPSEEK_V3_PRETRAIN_CONFIG_H100_V1: hybridep, no a2a overlap, recompute_modules
    # [mla_up_proj, mlp] (selective: simdist.analytic.variants.recompute_ops);
    # deepseek_v3_pretrain_config_h100 turns overlap_grad_reduce off on H100 ("to avoid functional
    # errors") and set_deepseek_v3_common_configs reduces gradients in bf16
    "deepseekv3": ("deepseek-v3", {"moe_dispatcher": "flex", "recompute": "selective",
                                   "overlap_grad_reduce": False, "fp32_grad_accumulation": False}),
    # GPT_OSS_120B_PRETRAIN_CONFIG_H100_*: the alltoall dispatcher, recompute_modules
    # [layernorm, moe_act]; set_gpt_oss_common_configs (scripts/performance/configs/gpt_oss/
    # gpt_oss_llm_pretrain.py): grad_reduce_in_fp32 = False (bf16 gradient reduction)
    "gpt oss 120b": ("gpt-oss-120b", {"moe_dispatcher": "alltoall", "recompute": "selective",
                                      "fp32_grad_accumulation": False}),
}
# model -> {(pp, vpp): the recipe's pipeline_model_parallel_layout} (plan.pipeline_layout):
# DEEPSEEK_V3_PRETRAIN_CONFIG_H100_V1's pp_layout (Megatron-Bridge
# scripts/performance/configs/deepseek/deepseek_workload_base_configs.py): the embedding and one
# layer first, two layers in each of the 30 middle virtual stages, the MTP layer and the loss last
PIPELINE_LAYOUTS: dict[str, dict[tuple[int, int], str]] = {"deepseekv3": {(8, 4): "Et|(tt|)*30mL"}}
NOT_EXPRESSIBLE = {"nemotron_3_nano": "Nemotron 3 Nano interleaves Mamba-2 layers with its attention and MoE "
                                      "layers; a scenario cannot express state-space layers"}
NEMO_CP = tuple(f"R{i:04d}" for i in range(80, 98))
TORCHTITAN_CP = ("R0148", "R0149", "R0150", "R0151", "R0159", "R0160", "R0161", "R0162")
LLAMA3_CP = ("R0061",)
# The NeMo 24.03.01 container's attention: Transformer Engine 1.4 picks cuDNN's fused attention on
# H100 (transformer_engine/pytorch/attention.py @v1.4: "Select FusedAttention on sm90"), and the
# cuDNN of that container is 9.0 at the newest (9.1 came out in April 2024). Transformer Engine's
# own benchmark of cuDNN 9.0 against flash-attn 2.4.2 on H100 (docs/examples/attention/
# attention.ipynb @v1.8, "As of Transformer Engine 1.7, cuDNN 9.0 and flash-attn 2.4.2";
# benchmarks/attention/benchmark_attention.py) times the causal multi-head shape of head dim 128
# (test_1: 16 heads, 2K tokens) 1.38x faster fwd+bwd; Llama 2 7B is multi-head with head dim 128.
# The catalog's 1.66x is the FlashAttention-3-class speed cuDNN reached later (cuDNN 9.4's notes:
# "Improved performance for scaled dot product attention on Hopper ... 5% to 30%").
NEMO_2403_GPU = {"like": "h100-sxm", "name": "h100-sxm-cudnn9.0", "fused_attention_speedup": 1.38}
GROUP_MOE = "MoE: Megatron-Bridge (H100)"
GROUP_CP = {"NeMo": "CP: NeMo long-sequence (H100)", "torchtitan": "CP: torchtitan Llama 3.1 (H100)",
            "Llama 3": "CP: Llama 3 405B pre-training"}


def _model_key(row: dict[str, str]) -> str:
    return row["model_name"].split("(")[0].strip().lower()


def handles(row: dict[str, str]) -> bool:
    """Rows this module predicts (or skips with its own reason)."""
    if row["run_id"] in NEMO_CP + TORCHTITAN_CP + LLAMA3_CP:
        return True
    key = _model_key(row)
    return key in MOE_MODELS or key in NOT_EXPRESSIBLE


def fitted(row: dict[str, str]) -> bool:
    """Whether the row informs the fitted GEMM and attention efficiencies
    (:mod:`simdist.validate.fit`). The mixture-of-experts rows are scored but not fitted on:
    their steps hold what the model prices only in part (the host-side overhead of the MoE
    layer's many small kernels and its dispatcher's synchronisation, the "compute wall" of
    Megatron-Core MoE, arXiv:2603.07685 sec 1: the dropless dispatcher's measured GPU idle,
    simdist.analytic.host.DISPATCHER_GAP_S, is priced; the FP8 recipes' own host work is not),
    which a fit would fold into the FP8 GEMM efficiency every dense FP8 run shares. Two signs of it in the rows: FP8 brings these MoE
    steps little (Qwen3-235B at this plan in FP8, 20.8 s, against 19.7 s in BF16 with DeepEP in
    the Megatron-MoE-ModelZoo's H100 table, which the model predicts within 3% in BF16), and the
    Qwen3-30B FP8 recipe with 16 local experts per GPU took 51 s (R0122, EP8) where the one with 8
    took 29 s (R0116, EP16) at the same modelled GPU time (docs/moe-accuracy.md, issue #1998).
    The context-parallel rows are fitted like the dense ones: every term of their steps is priced."""
    return _model_key(row) not in MOE_MODELS


def group(row: dict[str, str]) -> str:
    rid = row["run_id"]
    if rid in NEMO_CP:
        return GROUP_CP["NeMo"]
    if rid in TORCHTITAN_CP:
        return GROUP_CP["torchtitan"]
    if rid in LLAMA3_CP:
        return GROUP_CP["Llama 3"]
    return GROUP_MOE


def _megatron_plan(row: dict[str, str], tp: int, pp: int) -> dict[str, Any]:
    """Megatron-Core's defaults in the vendors' recipes: distributed optimizer, overlapped grad
    reduce and param gather, sequence parallelism and TP overlap with tp > 1, flash attention,
    fp32 main grads, the default DDP bucket."""
    gpus = int(row["num_gpus"])
    plan: dict[str, Any] = {
        "framework": "nemo", "tp": tp, "pp": pp, "zero_stage": 1, "sequence_parallel": tp > 1, "tp_comm_overlap": tp > 1,
        "flash_attention": True, "fp32_grad_accumulation": True, "overlap_grad_reduce": True,
        "overlap_param_gather": True, "global_batch_size": int(row["global_batch"]),
        "micro_batch_size": cell_int(row["micro_batch"]) or 1,
        "ddp_bucket_size": f"{4 * max(40_000_000, 1_000_000 * (gpus // (tp * pp)))} B",
    }
    vpp = cell_int(row.get("vpp")) or 1
    if vpp > 1:
        plan.update(virtual_pipeline_stages=vpp, schedule="interleaved-1f1b")
    return plan


def _cluster(gpus: int, gpn: int = 8) -> dict[str, Any]:
    gpn = min(gpus, gpn)
    return {"preset": "dgx-h100", "num_nodes": max(1, gpus // gpn), "gpus_per_node": gpn}


def moe_scenario(row: dict[str, str]) -> dict[str, Any]:
    preset, extra = MOE_MODELS[_model_key(row)]
    tp, pp = cell_int(row["tp"]) or 1, cell_int(row["pp"]) or 1
    plan = _megatron_plan(row, tp, pp)
    plan.update(ep=cell_int(row["ep"]) or 1, cp=cell_int(row["cp"]) or 1, **extra)
    plan.update(release_plan(_model_key(row), row))  # what the row's own release's recipe set
    layout = PIPELINE_LAYOUTS.get(_model_key(row), {}).get((pp, plan.get("virtual_pipeline_stages", 1)))
    if layout is not None:
        plan["pipeline_layout"] = layout
    precision = row["precision"].lower()
    # the 25.09 section has no precision column; its TFLOP/s come in pairs for two FP8 scaling
    # granularities (the data README), so its runs are FP8, and current scaling: the release's
    # H100 perf matrices (scripts/performance/configs/qwen3/qwen3_*_llm_pretrain.yaml @v0.1.0rc4)
    # hold bf16 and fp8_cs presets only, and the Qwen3-30B row's micro-batch 2 is fp8_cs's (bf16's: 1)
    plan["precision"] = "fp8" if ("fp8" in precision or not precision) else "bf16"
    if plan["precision"] == "fp8":
        # Transformer Engine's Float8CurrentScaling: the H100 presets of these models are the
        # *_H100_FP8_CS_* workload configs (the rows' "FP8-CS"; DeepSeek-V3's pair adds FP8_SC)
        plan["fp8_recipe"] = "tensorwise"
    model = {"preset": preset, "seq_length": int(row["seq_len"])}
    if "tokendrop" in row["model_name"].lower():
        model["moe_capacity_factor"] = 1.0  # Megatron-Bridge's token-drop variant
    return {"name": f"{row['run_id']} {row['model_name']}", "model": model,
            "cluster": _cluster(int(row["num_gpus"])), "plan": plan}


def cp_scenario(row: dict[str, str], recompute: str, vpp: int = 2) -> dict[str, Any]:
    rid = row["run_id"]
    tp, pp, cp = cell_int(row["tp"]) or 1, cell_int(row["pp"]) or 1, cell_int(row["cp"]) or 1
    gpus = int(row["num_gpus"])
    seq = int(row["seq_len"])
    if rid in NEMO_CP:  # Llama 2 7B in FP8 on NeMo 24.03 (Megatron-Core, ring attention)
        model: dict[str, Any] = {"preset": "llama2-7b", "seq_length": seq}
        plan = _megatron_plan(row, tp, pp)
        plan.update(cp=cp, cp_method="ring", precision="fp8", recompute=recompute)
        cluster = _cluster(gpus)
        cluster["gpu"] = NEMO_2403_GPU
        return {"name": f"{rid} {row['model_name']}", "model": model, "cluster": cluster, "plan": plan}
    if rid in TORCHTITAN_CP:  # FSDP2 (+TP, 1F1B PP), Float8 linears, full AC, all-gather CP
        dp = cell_int(row["dp"]) or 1
        preset = "llama3.1-405b" if "405" in row["model_name"] else "llama3.1-8b"
        local = 8 if pp > 1 else 1  # Table 6's local batch of 8 under PP, else 1
        plan = {"framework": "torchtitan", "tp": tp, "pp": pp, "dp": dp, "cp": cp, "cp_method": "allgather",
                "precision": "fp8",
                "zero_stage": 2 if pp > 1 else 3, "recompute": "full", "micro_batch_size": 1,
                "global_batch_size": local * dp, "sequence_parallel": tp > 1, "tp_comm_overlap": tp > 1,
                "flash_attention": True}
        cluster = _cluster(gpus)
        cluster["gpu"] = TORCHTITAN_GPU  # the benchmark cluster's 96 GiB H100s, as its dense rows
        cluster["inter_node"] = {"kind": "roce", "nics_per_node": 8, "bandwidth": "400 Gb/s"}
        return {"name": f"{rid} {row['model_name']}", "model": {"preset": preset, "seq_length": seq},
                "cluster": cluster, "plan": plan}
    # Llama 3 405B long-context stage (Table 4): 16 sequences of 128K per DP rank, 16M tokens;
    # FSDP sharding the optimizer states and gradients, not the weights (sec 3.3.1), as the 8K rows
    plan = {"tp": tp, "pp": pp, "cp": cp, "dp": gpus // (tp * pp * cp), "cp_method": "allgather",
            "virtual_pipeline_stages": vpp, "schedule": "interleaved-1f1b" if vpp > 1 else "1f1b", "zero_stage": 2,
            "sequence_parallel": True, "tp_comm_overlap": True, "recompute": recompute, "micro_batch_size": 1,
            "global_batch_size": 16 * (gpus // (tp * pp * cp)), "precision": "bf16", "flash_attention": True}
    cluster = _cluster(gpus)
    cluster["inter_node"] = {"kind": "roce", "nics_per_node": 8, "bandwidth": "400 Gb/s", "latency": "5 us"}
    return {"name": f"{rid} {row['model_name']}", "model": {"preset": "llama3.1-405b", "seq_length": seq},
            "cluster": cluster, "plan": plan}


def unsupported(row: dict[str, str]) -> list[str]:
    key = _model_key(row)
    if key in NOT_EXPRESSIBLE:
        return [f"model not expressible: {NOT_EXPRESSIBLE[key]}"]
    if row["run_id"] in NEMO_CP and not row["tp"].strip():
        return ["plan (tp/pp) not stated: the row is the best configuration without CP, not given"]
    return []


def measured_step(row: dict[str, str], sc: Scenario) -> tuple[float, str] | None:
    step = cell_float(row["measured_step_s"]) or cell_float(row["derived_step_s"])
    if step:
        return step, "step time"
    tokens = cell_float(row["measured_tokens_per_s_per_gpu"])
    if tokens:
        return sc.plan.global_batch_size * sc.model.seq_length / (tokens * sc.world_size), "tokens/s"
    tflops = cell_float(row["measured_tflops_per_gpu"])
    if tflops:
        return model_flops_per_step(sc.model, sc.plan) / (tflops * 1e12 * sc.world_size), "TFLOP/s (model FLOPs)"
    return None


def candidates(row: dict[str, str]) -> list[tuple[dict[str, Any], list[str]]]:
    """Scenario dicts to try (the fastest that fits is kept) and what each tuned."""
    if _model_key(row) in MOE_MODELS:
        return [(moe_scenario(row), [])]
    if row["run_id"] in TORCHTITAN_CP:
        return [(cp_scenario(row, "full"), [])]
    if row["run_id"] in LLAMA3_CP:  # the paper's interleaved schedule: chunks per stage unstated
        return [(cp_scenario(row, r, v), [f"recompute={r}", f"virtual_pipeline_stages={v}"])
                for r in ("none", "selective", "full") for v in range(1, 8)]
    # NeMo: no activation recompute, as the Llama 2 recipes of the table's release say
    # (NeMo-Framework-Launcher @24.03.01, launcher_scripts/conf/training/llama/llama2_7b.yaml,
    # llama2_13b.yaml and llama2_70b.yaml: activations_checkpoint_granularity null) and as the
    # table's own figures suggest (R0080's 768 TFLOP/s at 4K on 4 GPUs is NeMo's performance
    # summary's 767 for the same model and plan on 8 GPUs, docs/source/performance/performance_summary.md)
    return [(cp_scenario(row, "none"), [])]


def build(row: dict[str, str]) -> tuple[Scenario, list[str], tuple[float, str]] | str:
    """(scenario, tuned fields, (measured step s, how)) of a handled row, or why it is skipped."""
    from simdist.predict import predict

    why = unsupported(row)
    if why:
        return "; ".join(why)
    best: tuple[tuple[bool, float], Scenario, list[str]] | None = None
    problems: list[str] = []
    for d, tuned in candidates(row):
        try:
            sc = scenario_from_dict(d)
        except ScenarioError as e:
            problems += [str(p) for p in e.problems]
            continue
        p = predict(sc, engine="analytic", keep_spans=False)
        key = (not p.fits, p.step_time_s)
        if best is None or key < best[0]:
            best = (key, sc, tuned)
    if best is None:
        return "no valid plan: " + "; ".join(problems[:3])
    _, sc, tuned = best
    meas = measured_step(row, sc)
    if meas is None:
        return "no step time, tokens/s or TFLOP/s"
    return sc, tuned if len(candidates(row)) > 1 else [], meas
