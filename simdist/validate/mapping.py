"""Mapping a published dense training run (a row of training_runs.csv) to a scenario.

Each source family states a different part of its plan; what a row leaves unstated takes the
framework's documented default (``plan.framework``, simdist/spec/frameworks.py), never a value
tuned to the row, and the row's note says which. The exceptions are the older rows of papers that
leave the micro-batch size or the interleaving unstated (Megatron-LM SC'21 and 2020, Megatron-Core
weak scaling, Llama 3 405B): those take the fastest setting that fits among the usual choices
(:func:`candidates`), as their authors tuned their runs, and the report says so per row.

Families (by the row's framework):

- MosaicML llm-foundry: PyTorch FSDP, MPT models (ALiBi, no biases, tied embeddings), attention
  by FlashAttention in Triton (the benchmark script's ``--attn_impl triton``), blocks checkpointed
  with PyTorch's non-reentrant checkpoint (the script's ``activation_checkpointing_reentrant:
  False``), whose full recompute stops early (``plan.recompute_early_stop``);
- Megatron-LM (2020, SC'21, DeepSpeed ZeRO-3 comparison) and Megatron-Core r0.8 (weak scaling):
  GPT models with Megatron's flags as each source states them;
- NeMo / Megatron-Bridge performance summaries (``framework: nemo``): Llama models, dimensions
  from the row or the model's published config (catalog preset), micro-batch 1 where unstated
  (the NeMo Llama recipes'), no recompute, Transformer Engine's FP8 recipe unless the row names
  current scaling (FP8-CS);
- torchtitan Llama 3.1 benchmarks (``framework: torchtitan``): sequence length 8,192 where unstated
  (torchtitan's llama3 train configs), local batch = the per-rank batch (no gradient accumulation
  in that version), split into pp micro-batches under pipeline parallelism (torchtitan's
  default), two stages per rank for interleaved schedules (its default split), float8 linears with
  tensorwise dynamic scaling;
- Llama 3 405B pre-training (Meta): FSDP with the optimizer states and gradients sharded (ZeRO-2
  style), an interleaved pipeline (the paper says so; its chunks per stage are not stated, so
  they are among the candidates), RoCE with 1:7 oversubscription above each 3,072-GPU pod.

Rows whose family is another (the context-parallel and mixture-of-experts rows, mapped by
:mod:`simdist.validate.moe_cp`) or that state too little are left to :func:`unsupported`, with
the reason.
"""

from __future__ import annotations

import re
from typing import Any

from simdist.validate.rows import cell_float, cell_int

_GPU_CLUSTER = {
    "a100-sxm4-80gb": "dgx-a100-80gb", "a100": "dgx-a100-80gb", "a100_80gb": "dgx-a100-80gb",
    "a100 (dgx-a100)": "dgx-a100-40gb",  # 2020: only the 40 GB A100 existed
    "a100_40gb": "dgx-a100-40gb", "h100": "dgx-h100", "h100_80gb": "dgx-h100",
    "v100 (dgx-2h)": "dgx-2",
    "h100 (dgx-h100)": "dgx-h100",
    "h100-80gb hbm3 (700w)": "dgx-h100",  # Llama 3: Grand Teton H100 SXM, NVSwitch
    "h100 sxm 96gb hbm2e (500w power limit)": "dgx-h100",  # torchtitan: its GPU replaced below
}
TORCHTITAN_GPU = "h100-sxm-96gb"  # the catalog GPU of torchtitan's 2024-12 benchmark cluster

# model presets by the names the rows give (dimensions the row does not state come from them)
_MODEL_PRESETS = {"llama2-7b": "llama2-7b"}

# frameworks whose defaults the mapping knows (by the start of the row's framework)
MAPPED_FRAMEWORKS = ("MosaicML", "Megatron-LM", "Megatron-Core", "Megatron-Bridge", "NeMo", "torchtitan",
                     "Meta internal")


def family(row: dict[str, str]) -> str:
    fw = row["framework"]
    for prefix, name in (("MosaicML", "mosaic"), ("Megatron-LM", "megatron-lm"), ("Megatron-Core", "megatron-core"),
                         ("Megatron-Bridge", "nemo"), ("NeMo", "nemo"), ("torchtitan", "torchtitan"),
                         ("Meta internal", "llama3")):
        if fw.startswith(prefix):
            return name
    return "other"


def model_preset(row: dict[str, str]) -> str | None:
    """The catalog preset a row's model name refers to, for the dimensions it does not state."""
    name = re.sub(r"\s*\(.*\)", "", row["model_name"]).strip().lower().replace("_", "-")
    return _MODEL_PRESETS.get(name)


def unsupported(row: dict[str, str]) -> list[str]:
    """Why a row cannot be predicted yet (empty: it can), one "kind: detail" reason each."""
    why = []
    fam = family(row)
    if not all(row[k].strip() for k in ("layers", "hidden", "heads")) and model_preset(row) is None:
        why.append("model dimensions not stated: the row names the model only")
    ep, cp = cell_int(row.get("ep")) or 1, cell_int(row.get("cp")) or 1
    if ep > 1:
        why.append(f"mixture of experts: ep={ep}, experts are not in the simulator yet")
    if cp > 1:
        why.append(f"context parallel: cp={cp}, the context-parallel rows are mapped by their own module")
    precision = row["precision"].strip()
    if fam == "nemo" and not precision:
        why.append("precision not stated: the row's table gives no precision column")
    if "LoRA" in row["source"]:
        why.append("LoRA fine-tuning: the simulator trains every weight (no frozen base)")
    gpus = cell_int(row["num_gpus"]) or 0
    if not row["tp"].strip() and not row["dp"].strip() and (gpus > 8 or fam == "nemo"):
        why.append("plan (tp/pp) not stated")
    unstated = [k for k in ("num_gpus", "seq_len", "global_batch") if not row[k].strip()
                and not (fam == "torchtitan" and k != "num_gpus")]
    if unstated:
        why.append(f"cells not stated: {', '.join(unstated)}")
    if row["gpu_type"].strip().lower() not in _GPU_CLUSTER:
        why.append(f"GPU not mapped: {row['gpu_type']!r} is not in the row mapping's GPU table")
    if fam == "other":
        why.append(f"framework not mapped: {row['framework']!r} (only the defaults of "
                   f"{', '.join(MAPPED_FRAMEWORKS)} are)")
    return why


def row_to_scenario_dict(row: dict[str, str], plan_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    fam = family(row)
    if fam == "nemo":
        out = _nemo(row)
    elif fam == "torchtitan":
        out = _torchtitan(row)
    elif fam == "llama3":
        out = _llama3(row)
    else:
        out = _legacy(row)
    out["plan"].update(plan_overrides or {})
    return {"name": f"{row['run_id']} {row['model_name']}", **out}


def row_defaults(row: dict[str, str]) -> list[str]:
    """The unstated values a row takes from its framework's documented defaults (the report's
    note on the row); unstated values chosen as the fastest are :func:`candidates`'."""
    fam, out = family(row), []
    precision = row["precision"].lower()
    if fam == "nemo":
        out.append("framework nemo: distributed optimizer, overlaps, sequence parallel / TP overlap with tp > 1")
        if not row["micro_batch"].strip():
            out.append("micro_batch_size=1 (NeMo Llama recipes)")
        out.append("recompute=none (NeMo performance recipes)")
        if model_preset(row):
            out.append(f"dimensions of the {model_preset(row)} preset (its config.json)")
        if "fp8" in precision and "cs" not in precision:
            out.append("fp8_recipe: Transformer Engine's default (delayed scaling on H100)")
    elif fam == "torchtitan":
        out.append("framework torchtitan: FSDP2, per-op selective AC, sequence parallel with TP")
        if not row["seq_len"].strip():
            out.append("seq_length=8192 (torchtitan llama3 train configs)")
        if not row["global_batch"].strip():
            out.append("global_batch_size = local batch x dp (no gradient accumulation)")
        if (cell_int(row["pp"]) or 1) > 1 and not row["micro_batch"].strip():
            out.append("pp micro-batches per local batch (torchtitan default)")
        if "Interleaved" in row["notes"]:
            out.append("2 stages per rank (torchtitan's default split)")
        if "fp8" in precision:
            out.append("fp8_recipe: torchao tensorwise (torchtitan's float8 default)")
        out.append("GPU h100-sxm-96gb: HBM2e at 2.4 TB/s, compute peaks at the 500 W power limit; "
                   "fused_elementwise = torch.compile as the row states it (eager otherwise)")
    elif fam == "mosaic":
        out.append("attention_kernel=triton (llm-foundry benchmarks: --attn_impl triton, ALiBi)")
        if row["recompute"].startswith("full"):
            out.append("recompute_early_stop (activation_checkpointing_reentrant: False, PyTorch's non-reentrant "
                       "checkpoint)")
    elif fam == "llama3":
        out.append("framework pytorch: FSDP with optimizer and gradients sharded (zero_stage 2)")
        out.append("global batch = 16M tokens / seq_len; no recompute (paper)")
    return out


def candidates(row: dict[str, str], base: dict[str, Any]) -> list[dict[str, Any]]:
    """Unstated micro-batch size and interleaving of the older rows: the usual choices. The
    rows of frameworks with documented defaults (NeMo, torchtitan) have none."""
    if family(row) in ("nemo", "torchtitan"):
        return [{}]
    mbs = [None] if row["micro_batch"].strip() else [1, 2, 4, 8]
    pp, layers = base["plan"]["pp"], base["model"]["num_layers"]
    if family(row) == "llama3":  # interleaved (stated), chunks not stated; Meta's schedule needs no even split
        vs = [v for v in range(2, 9) if pp > 1 and pp * v <= layers] or [1]
    else:
        # Megatron-LM's interleaved schedule needs the layers to split evenly into pp*v chunks
        # (chunks per stage: the divisors of the layers per stage, up to 24)
        vs = [1] if pp == 1 or layers % pp else [v for v in range(1, 25) if (layers // pp) % v == 0]
    out = []
    for mb in mbs:
        for v in vs:
            ov: dict[str, Any] = {}
            if mb is not None:
                ov["micro_batch_size"] = mb
            if v > 1:
                ov["virtual_pipeline_stages"] = v
            out.append(ov)
    return out


# --- Llama-family rows ------------------------------------------------------------------------


def _llama_model(row: dict[str, str], seq: int | None = None) -> dict[str, Any]:
    """Llama architecture (SwiGLU, RMSNorm, RoPE, no biases, untied embeddings), dimensions from
    the row where it states them, else from the model's catalog preset (its config.json)."""
    preset = model_preset(row)
    model: dict[str, Any] = {"preset": preset} if preset else {
        "mlp": "swiglu", "norm": "rmsnorm", "bias": False, "position_embedding": "rope", "tie_embeddings": False}
    for key, col in (("num_layers", "layers"), ("hidden_size", "hidden"), ("num_attention_heads", "heads"),
                     ("num_kv_heads", "kv_heads"), ("ffn_hidden_size", "ffn_hidden"), ("vocab_size", "vocab")):
        if (v := cell_int(row[col])) is not None:
            model[key] = v
    model["seq_length"] = seq or int(row["seq_len"])
    if preset is None:
        model.setdefault("num_kv_heads", model["num_attention_heads"])
    model["dropout"] = False
    return model


def _nodes(row: dict[str, str]) -> tuple[int, int]:
    gpus = int(row["num_gpus"])
    gpn = min(gpus, cell_int(row["gpus_per_node"]) or 8)
    return max(1, gpus // gpn), gpn


def _fp8(row: dict[str, str], plan: dict[str, Any]) -> None:
    p = row["precision"].lower()
    if "fp8" not in p:
        plan["precision"] = "bf16"
        return
    plan["precision"] = "fp8"
    if "fp8-cs" in p:  # Transformer Engine Float8CurrentScaling: per-tensor current scaling
        plan["fp8_recipe"] = "tensorwise"


def _nemo(row: dict[str, str]) -> dict[str, Any]:
    nodes, gpn = _nodes(row)
    tp, pp = cell_int(row["tp"]) or 1, cell_int(row["pp"]) or 1
    plan: dict[str, Any] = {"framework": "nemo", "tp": tp, "pp": pp, "recompute": "none",
                            "micro_batch_size": cell_int(row["micro_batch"]) or 1,
                            "global_batch_size": int(row["global_batch"])}
    if (v := cell_int(row["vpp"]) or 1) > 1:
        plan["virtual_pipeline_stages"] = v
    if "FSDP" in row["zero_stage_fsdp"] and "FSDP=0" not in row["zero_stage_fsdp"]:
        plan["zero_stage"] = 3  # Megatron-FSDP: parameters, gradients and optimizer states sharded
    _fp8(row, plan)
    cluster = {"preset": "dgx-h100", "num_nodes": nodes, "gpus_per_node": gpn}
    return {"model": _llama_model(row), "cluster": cluster, "plan": plan}


def _torchtitan(row: dict[str, str]) -> dict[str, Any]:
    nodes, gpn = _nodes(row)
    tp, pp = cell_int(row["tp"]) or 1, cell_int(row["pp"]) or 1
    dp = cell_int(row["dp"]) or int(row["num_gpus"]) // (tp * pp)
    local = re.search(r"local batch(?: size)? '?(\d+)", row["notes"])
    local_batch = int(local.group(1)) if local else (cell_int(row["micro_batch"]) or 1)
    micro = cell_int(row["micro_batch"]) or max(1, local_batch // pp)  # pp micro-batches by default
    recompute = "full" if row["recompute"].startswith("full") else "selective" if "selective" in row["recompute"] \
        else "none"
    plan: dict[str, Any] = {"framework": "torchtitan", "tp": tp, "pp": pp, "dp": dp, "recompute": recompute,
                            "micro_batch_size": micro,
                            "global_batch_size": cell_int(row["global_batch"]) or local_batch * dp,
                            "tp_comm_overlap": "AsyncTP" in row["notes"],
                            # the table names torch.compile per run; torchtitan's default is eager
                            "fused_elementwise": "torch.compile" in row["notes"]}
    if "Interleaved" in row["notes"]:
        plan["virtual_pipeline_stages"] = 2  # torchtitan's default split for multi-stage schedules
    _fp8(row, plan)
    cluster: dict[str, Any] = {"preset": "dgx-h100", "num_nodes": nodes, "gpus_per_node": gpn, "gpu": TORCHTITAN_GPU,
                               "inter_node": {"kind": "roce", "nics_per_node": gpn, "bandwidth": "400 Gb/s"}}
    return {"model": _llama_model(row, seq=cell_int(row["seq_len"]) or 8192), "cluster": cluster, "plan": plan}


def _llama3(row: dict[str, str]) -> dict[str, Any]:
    nodes, gpn = _nodes(row)
    seq = int(row["seq_len"])
    tokens = re.search(r"\((\d+)M tokens\)", row["global_batch"])
    gbs = int(tokens.group(1)) * 2**20 // seq if tokens else int(row["global_batch"])
    plan: dict[str, Any] = {"framework": "pytorch", "tp": cell_int(row["tp"]) or 1, "pp": cell_int(row["pp"]) or 1,
                            "zero_stage": 2, "recompute": "none", "precision": "bf16", "sequence_parallel": True,
                            "global_batch_size": gbs, "micro_batch_size": 1}
    cluster = {"preset": "dgx-h100", "num_nodes": nodes, "gpus_per_node": gpn,
               "inter_node": {"kind": "roce", "nics_per_node": gpn, "bandwidth": "400 Gb/s"},
               # Llama 3 sec 3.3.1: 3,072-GPU pods, 1:7 oversubscription between pods
               "nodes_per_leaf": 3072 // gpn, "spine_oversubscription": 7.0}
    return {"model": _llama_model(row), "cluster": cluster, "plan": plan}


# --- the older rows (MosaicML, Megatron-LM, Megatron-Core) ------------------------------------


def _untied_by_count(model: dict[str, Any], params_b: float | None) -> bool:
    """Whether a row's stated parameter count is that of the model with its LM head apart from
    the input embedding (Megatron's ``--untie-embeddings-and-output-weights``) rather than tied:
    the nearer of the two counts. Megatron-Core's weak-scaling table (README @f2e5db40) lists
    1.7B, 7.1B, 16B, ..., 462B for models whose tied counts are 1.48B, 6.58B, 15.3B, ..., 459B
    and untied 1.75B, 7.12B, 16.1B, ..., 461.5B (12 l h^2 + 13 l h + V h (+ V h) + s h), so
    those runs kept a separate output layer: one more V x h weight to reduce, update and hold."""
    if not params_b:
        return False
    h, layers, v = model["hidden_size"], model["num_layers"], model["vocab_size"]
    tied = layers * (12 * h * h + 13 * h) + v * h + model["seq_length"] * h
    return abs(tied + v * h - params_b * 1e9) < abs(tied - params_b * 1e9)


def _legacy(row: dict[str, str]) -> dict[str, Any]:
    framework = row["framework"]
    mosaic = framework.startswith("MosaicML")
    megatron_2021 = framework.startswith("Megatron-LM") and "2020" not in framework
    mcore = framework.startswith("Megatron-Core")
    h = int(row["hidden"])
    model: dict[str, Any] = {
        "num_layers": int(row["layers"]), "hidden_size": h, "num_attention_heads": int(row["heads"]),
        "num_kv_heads": cell_int(row["kv_heads"]) or int(row["heads"]),
        "ffn_hidden_size": cell_int(row["ffn_hidden"]) or 4 * h,
        "vocab_size": cell_int(row["vocab"]) or 51200, "seq_length": int(row["seq_len"]),
        "mlp": "gelu",
    }
    if mosaic:  # MPT: no biases, ALiBi, tied embeddings, no dropout (llm-foundry yamls)
        model.update(bias=False, position_embedding="alibi", tie_embeddings=True, dropout=False)
    else:  # Megatron GPT: biases, learned positions, tied embeddings, dropout 0.1
        model.update(bias=True, position_embedding="learned", tie_embeddings=True,
                     dropout=not mcore)
    if mcore:  # the table's parameter counts are those of untied embeddings (_untied_by_count)
        model["tie_embeddings"] = not _untied_by_count(model, cell_float(row["params_b"]))
    gpus = int(row["num_gpus"])
    gpn = min(gpus, cell_int(row["gpus_per_node"]) or 8)
    preset = _GPU_CLUSTER[row["gpu_type"].strip().lower()]
    if preset == "dgx-2":
        gpn = min(gpus, 16)
    cluster: dict[str, Any] = {"preset": preset, "num_nodes": max(1, gpus // gpn), "gpus_per_node": gpn}
    link = row["inter_node_link"]
    if "RoCE" in link and (gbps := cell_float(link)):
        cluster["inter_node"] = {"kind": "roce", "nics_per_node": 8, "bandwidth": f"{gbps / 8:g} Gb/s"}
    zero_text = row["zero_stage_fsdp"]
    zero = 3 if ("ZeRO-3" in zero_text or "FULL_SHARD" in zero_text) else 2 if "SHARD_GRAD_OP" in zero_text else 0
    prec = row["precision"].lower()
    precision = "fp8" if "fp8" in prec else ("fp16" if (megatron_2021 or "2020" in framework) else "bf16")
    if "V100" in row["gpu_type"]:
        precision = "fp16"
    tp, pp = cell_int(row["tp"]) or 1, cell_int(row["pp"]) or 1
    recompute = "full" if row["recompute"].startswith("full") else "none"
    if "includes recompute" in row["measured_hfu"]:  # the FLOP count the source reports says so
        recompute = "full"
    if "2020" in framework:  # Megatron-LM v1's GPT-2 scripts ran with --checkpoint-activations
        recompute = "full"
    if "ZeRO-3" in zero_text and not row["recompute"]:
        recompute = "full"  # 175B/530B without model parallelism cannot fit without it
    plan: dict[str, Any] = {
        "tp": tp, "pp": pp, "zero_stage": zero, "recompute": recompute,
        "global_batch_size": int(row["global_batch"]), "precision": precision,
        "micro_batch_size": cell_int(row["micro_batch"]) or 1,
        "flash_attention": mosaic or mcore,
        "sequence_parallel": mcore and tp > 1,
        "overlap_grad_reduce": not megatron_2021 and "2020" not in framework,
        "fp32_grad_accumulation": megatron_2021 or mcore,
    }
    if mosaic:  # llm-foundry's benchmark runs (scripts/train/benchmarking/submit_benchmarks.py
        # --attn_impl, default 'triton'; the MPT yamls' attn_config.attn_impl: triton): ALiBi needs
        # the attention-bias input of FlashAttention in Triton
        plan["attention_kernel"] = "triton"
        # the same script sets fsdp_config.activation_checkpointing_reentrant: False, so Composer
        # wraps each block in PyTorch's non-reentrant checkpoint, whose recompute stops early
        plan["recompute_early_stop"] = True
    if "DeepSpeed" in framework and zero == 3:
        # DeepSpeed gathers each submodule's parameters on its own; these runs (Narayanan et al.,
        # arXiv:2104.04473 v1, April 2021) used its 2021 ZeRO-3 (0.3.x), which synchronised the
        # device at every fetch and kept one submodule in flight (simdist.analytic.zero3_sync)
        plan["zero3_fetch"] = "module_sync"
    if mcore:  # --overlap-grad-reduce --overlap-param-gather --tp-comm-overlap, distributed optimizer;
        # Megatron-Core's own DDP bucket rule (framework megatron)
        plan.update(framework="megatron", zero_stage=1, tp_comm_overlap=True, overlap_param_gather=True)
    return {"model": model, "cluster": cluster, "plan": plan}
