"""Plan fields from a DeepSpeed config (ds_config.json), for ``plan.deepspeed_config``.

What is read (DeepSpeed docs, "DeepSpeed Configuration JSON"):
- train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps, related by
  train_batch_size = micro * accumulation * data-parallel size; DeepSpeed derives the missing one
  when two are given, and sets accumulation to 1 when only one is given;
- bf16.enabled / fp16.enabled -> precision;
- zero_optimization: stage, offload_optimizer.device, offload_param.device, overlap_comm,
  reduce_bucket_size (elements), zero_hpz_partition_size (ZeRO++ hpZ -> dp_shard),
  zero_quantized_weights (qwZ), zero_quantized_gradients (qgZ -> int8 gradient compression);
- optimizer.type -> optimizer.

``"auto"`` values are the Hugging Face Trainer convention: the value comes from the rest of the
scenario, so "auto" reads as "not given here" and the plan's own field (or DeepSpeed's derivation
from the other batch fields) fills it in. ZeRO-3 gathers each submodule's parameters with its
own collective, so stage 3 sets ``zero3_fetch: module``; ZeRO-1/2 all-gather the updated
parameters right after the optimizer step (no overlap with the next forward), so they set
``overlap_param_gather: false``.

Explicit plan fields win over the config. Unknown keys and contradictions inside the config are
reported by name (``plan.deepspeed_config.train_batch_size: 512 != micro 4 * accumulation 8 *
dp 8``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from simdist.errors import Collector
from simdist.spec.cluster import ClusterSpec

TOP_KEYS = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
    "optimizer", "scheduler", "fp16", "bf16", "amp", "torch_autocast", "gradient_clipping",
    "prescale_gradients", "gradient_predivide_factor", "sparse_gradients", "zero_optimization",
    "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "steps_per_print",
    "wall_clock_breakdown", "dump_state", "flops_profiler", "activation_checkpointing", "aio",
    "tensorboard", "wandb", "csv_monitor", "comet", "monitor_config", "comms_logger",
    "communication_data_type", "seq_parallel_communication_data_type", "data_types",
    "elasticity", "pipeline", "checkpoint", "data_efficiency", "curriculum_learning",
    "compression_training", "autotuning", "memory_breakdown", "sparse_attention", "compile",
    "nebula", "weight_quantization", "hybrid_engine", "eigenvalue", "progressive_layer_drop",
    "quantize_training", "load_universal_checkpoint", "use_node_local_storage",
    "gradient_accumulation_dtype", "dataloader_drop_last", "disable_allgather",
    "fp32_allreduce", "zero_quantized_nontrainable_weights", "graph_harvesting",
    "use_data_before_expert_parallelism", "timers", "mics_shard_size",
}
ZERO_KEYS = {
    "stage", "allgather_partitions", "allgather_bucket_size", "overlap_comm", "reduce_scatter",
    "reduce_bucket_size", "contiguous_gradients", "offload_param", "offload_optimizer",
    "stage3_max_live_parameters", "stage3_max_reuse_distance", "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold", "stage3_gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save", "stage3_model_persistence_threshold",
    "sub_group_size", "round_robin_gradients", "zero_hpz_partition_size",
    "zero_quantized_weights", "zero_quantized_gradients", "zero_quantized_nontrainable_weights",
    "mics_shard_size", "mics_hierarchical_params_gather", "elastic_checkpoint",
    "ignore_unused_parameters", "legacy_stage1", "memory_efficient_linear", "cpu_offload",
    "cpu_offload_params", "cpu_offload_use_pin_memory", "load_from_fp32_weights",
    "use_multi_rank_bucket_allreduce", "pipeline_loading_checkpoint", "override_module_apply",
    "log_trace_cache_warnings", "module_granularity_threshold", "use_all_reduce_for_fetch_params",
}
OFFLOAD_KEYS = {"device", "nvme_path", "pin_memory", "buffer_count", "buffer_size", "max_in_cpu",
                "pipeline_read", "pipeline_write", "fast_init", "ratio"}
OPTIMIZERS = {"adam": "adam", "adamw": "adamw", "fusedadam": "adam", "cpuadam": "adam",
              "deepspeedcpuadam": "adam", "lamb": "lamb", "fusedlamb": "lamb", "sgd": "sgd",
              "adagrad": None, "onebitadam": None, "zerooneadam": None, "onebitlamb": None,
              "lion": None, "muadam": None}


def _is_auto(v: Any) -> bool:
    return isinstance(v, str) and v.strip().lower() == "auto"


def _pos_int(v: Any, key: str, c: Collector) -> int | None:
    if v is None or _is_auto(v):
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0 or int(v) != v:
        c.add(key, f"must be a positive whole number or \"auto\", got {v!r}")
        return None
    return int(v)


def _bool(v: Any, key: str, c: Collector) -> bool | None:
    if v is None or _is_auto(v):
        return None
    if not isinstance(v, bool):
        c.add(key, f"must be true, false or \"auto\", got {v!r}")
        return None
    return v


def read_config(path: Path, c: Collector) -> dict[str, Any] | None:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        c.add("", f"{path} does not exist")
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        c.add("", f"{path} is not valid JSON: {exc}")
        return None
    if not isinstance(data, dict):
        c.add("", f"{path} must hold a JSON object")
        return None
    return data


def plan_fields_from_deepspeed(path: str | Path, plan_data: dict[str, Any], cluster: ClusterSpec | None,
                               collector: Collector) -> dict[str, Any]:
    """Plan fields (scenario-file spelling, e.g. ``ddp_bucket_size: "1000000000 B"``) that the
    DeepSpeed config at ``path`` implies, given the plan's own fields ``plan_data`` (which win:
    the caller merges them over the result) and the cluster (for the data-parallel size).
    Problems go to ``collector`` (prefix ``plan.deepspeed_config``)."""
    data = read_config(Path(path), collector)
    if data is None:
        return {}
    return fields_from_ds_dict(data, plan_data, cluster, collector)


def fields_from_ds_dict(data: dict[str, Any], plan_data: dict[str, Any], cluster: ClusterSpec | None,
                        c: Collector) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in data:
        if key not in TOP_KEYS:
            c.add(str(key), "unknown DeepSpeed config key")

    # --- precision
    bf16 = _bool((data.get("bf16") or {}).get("enabled") if isinstance(data.get("bf16"), dict) else None,
                 "bf16.enabled", c)
    fp16 = _bool((data.get("fp16") or {}).get("enabled") if isinstance(data.get("fp16"), dict) else None,
                 "fp16.enabled", c)
    if bf16 and fp16:
        c.add("fp16.enabled", "true together with bf16.enabled: choose one precision")
    elif bf16:
        out["precision"] = "bf16"
    elif fp16:
        out["precision"] = "fp16"
    elif bf16 is False and fp16 is False and "amp" not in data:
        out["precision"] = "fp32"

    # --- optimizer
    opt = data.get("optimizer")
    if isinstance(opt, dict) and opt.get("type") is not None:
        name = str(opt["type"]).replace("_", "").lower()
        if name not in OPTIMIZERS:
            c.add("optimizer.type", f"unknown optimizer {opt['type']!r}")
        elif OPTIMIZERS[name] is None:
            c.add("optimizer.type", f"{opt['type']} is not modelled (adam, adamw, lamb, sgd are)")
        else:
            out["optimizer"] = OPTIMIZERS[name]

    # --- ZeRO
    zero = data.get("zero_optimization")
    if zero is not None and not isinstance(zero, dict):
        c.add("zero_optimization", "must be an object")
        zero = None
    zero = zero or {}
    for key in zero:
        if key not in ZERO_KEYS:
            c.add(f"zero_optimization.{key}", "unknown DeepSpeed config key")
    stage = zero.get("stage")
    if stage is not None and not _is_auto(stage):
        if stage not in (0, 1, 2, 3) or isinstance(stage, bool):
            c.add("zero_optimization.stage", f"must be 0, 1, 2 or 3, got {stage!r}")
            stage = None
        else:
            out["zero_stage"] = stage
    else:
        stage = plan_data.get("zero_stage")
    offload: dict[str, str] = {}
    for ds_key, plan_key in (("offload_optimizer", "optimizer"), ("offload_param", "params")):
        sub = zero.get(ds_key)
        if sub is None:
            continue
        if not isinstance(sub, dict):
            c.add(f"zero_optimization.{ds_key}", "must be an object such as {\"device\": \"cpu\"}")
            continue
        for key in sub:
            if key not in OFFLOAD_KEYS:
                c.add(f"zero_optimization.{ds_key}.{key}", "unknown DeepSpeed config key")
        dev = sub.get("device", "none")
        if _is_auto(dev):
            continue
        if dev not in ("none", "cpu", "nvme"):
            c.add(f"zero_optimization.{ds_key}.device", f"{dev!r} is not one of none, cpu, nvme")
        else:
            offload[plan_key] = dev
    if zero.get("cpu_offload") is True:  # the pre-0.3.16 spelling of offload_optimizer: cpu
        offload.setdefault("optimizer", "cpu")
    if offload:
        out["offload"] = offload
    if offload.get("params", "none") != "none" and stage not in (3, None):
        c.add("zero_optimization.offload_param", f"parameter offload needs stage 3, not {stage}")
    if stage == 3:
        out["zero3_fetch"] = "module"  # DeepSpeed fetches each submodule's parameters
    elif stage in (1, 2):
        out["overlap_param_gather"] = False  # updated partitions all-gathered right after the step
    overlap = _bool(zero.get("overlap_comm"), "zero_optimization.overlap_comm", c)
    if overlap is not None:
        out["overlap_grad_reduce"] = overlap
    bucket = zero.get("reduce_bucket_size")
    if bucket is not None and not _is_auto(bucket):
        if isinstance(bucket, bool) or not isinstance(bucket, int | float) or bucket <= 0:
            c.add("zero_optimization.reduce_bucket_size", f"must be a positive number of elements, got {bucket!r}")
        else:
            grad_bytes = 4 if out.get("precision", plan_data.get("precision")) == "fp32" else 2
            out["ddp_bucket_size"] = f"{int(bucket) * grad_bytes} B"  # elements -> bytes
    hpz = _pos_int(zero.get("zero_hpz_partition_size"), "zero_optimization.zero_hpz_partition_size", c)
    if hpz is not None and hpz > 1:
        out["dp_shard"] = hpz
    qw = _bool(zero.get("zero_quantized_weights"), "zero_optimization.zero_quantized_weights", c)
    if qw:
        out["zero_quantized_weights"] = True
    qg = _bool(zero.get("zero_quantized_gradients"), "zero_optimization.zero_quantized_gradients", c)
    if qg:
        out["grad_compression"] = {"method": "int8", "error_feedback": False}

    # --- batch: train_batch_size = micro * accumulation * dp (DeepSpeed's _configure_train_batch_size)
    tbs = _pos_int(data.get("train_batch_size"), "train_batch_size", c)
    micro = _pos_int(data.get("train_micro_batch_size_per_gpu"), "train_micro_batch_size_per_gpu", c)
    gas = _pos_int(data.get("gradient_accumulation_steps"), "gradient_accumulation_steps", c)
    dp = _dp(plan_data, cluster)
    if tbs is not None and micro is not None and gas is not None and dp is not None and tbs != micro * gas * dp:
        c.add("train_batch_size", f"{tbs} != micro {micro} * accumulation {gas} * dp {dp}")
        out.update(global_batch_size=tbs, micro_batch_size=micro)  # reported once, not again as missing
        return out
    # explicit plan fields win; "auto" or absent fields are derived as DeepSpeed does
    explicit_gbs, explicit_mb = plan_data.get("global_batch_size"), plan_data.get("micro_batch_size")
    tbs_eff = explicit_gbs if isinstance(explicit_gbs, int) and not isinstance(explicit_gbs, bool) else tbs
    micro_eff = explicit_mb if isinstance(explicit_mb, int) and not isinstance(explicit_mb, bool) else micro
    if dp is not None:
        if tbs_eff is None and micro_eff is not None:
            tbs_eff = micro_eff * (gas or 1) * dp
        elif tbs_eff is not None and micro_eff is None:
            g = gas or 1
            if tbs_eff % (g * dp):
                c.add("train_batch_size", f"{tbs_eff} is not divisible by accumulation {g} * dp {dp}")
            else:
                micro_eff = tbs_eff // (g * dp)
    if tbs_eff is not None:
        out["global_batch_size"] = tbs_eff
    if micro_eff is not None:
        out["micro_batch_size"] = micro_eff
    return out


def _dp(plan_data: dict[str, Any], cluster: ClusterSpec | None) -> int | None:
    given = plan_data.get("dp")
    if isinstance(given, int) and not isinstance(given, bool) and given > 0:
        return given
    if cluster is None:
        return None
    mp = 1
    for key in ("tp", "pp", "cp"):
        v = plan_data.get(key, 1)
        mp *= v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 1
    return max(1, cluster.world_size // mp)
