"""Plan fields from a DeepSpeed config (ds_config.json), for ``plan.deepspeed_config``.

What is read (DeepSpeed docs, "DeepSpeed Configuration JSON"):
- train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps, related by
  train_batch_size = micro * accumulation * data-parallel size; DeepSpeed derives the missing one
  when two are given, and sets accumulation to 1 when only one is given;
- bf16.enabled / fp16.enabled -> precision;
- zero_optimization: stage, offload_optimizer.device, offload_param.device, overlap_comm,
  reduce_bucket_size (elements), zero_hpz_partition_size (ZeRO++ hpZ: a secondary weight copy
  sharded within groups of that size -> ``zero_hpz_partition_size``), zero_quantized_weights
  (qwZ), zero_quantized_gradients (qgZ -> int8 gradient compression);
- optimizer.type -> optimizer;
- activation_checkpointing: the section configures DeepSpeed's activation checkpointing
  (``deepspeed.checkpointing``), which a model that writes it trains with: each layer keeps only
  its input and recomputes the rest in backward -> ``recompute: full``. Its options are not
  simulated and are listed as ignored: ``partition_activations`` (the kept inputs split over the
  model-parallel ranks), ``cpu_checkpointing`` (kept inputs moved to host memory),
  ``contiguous_memory_optimization``, ``number_checkpoints``,
  ``synchronize_checkpoint_boundary``, ``profile``.

Every key present that no plan field comes from is listed by :func:`ignored_keys` (dotted, e.g.
``scheduler``, ``gradient_clipping``, ``zero_optimization.stage3_max_live_parameters``): the
loader passes the list on as a note, ``simdist import`` writes it into the scenario.

``"auto"`` values are the Hugging Face Trainer convention: the value comes from the rest of the
scenario, so "auto" reads as "not given here" and the plan's own field (or DeepSpeed's derivation
from the other batch fields) fills it in. ZeRO-3 gathers each submodule's parameters with its
own collective, so stage 3 sets ``zero3_fetch: module``; ZeRO-1/2 all-gather the updated
parameters right after the optimizer step (no overlap with the next forward), so they set
``overlap_param_gather: false``.

Explicit plan fields win over the config (the caller merges them over the result). Unknown
keys, values of the wrong type, non-finite numbers (``Infinity``, ``NaN``) and contradictions
inside the config are reported by key (``plan.deepspeed_config.train_batch_size: 512 != micro 4 *
accumulation 8 * dp 8``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from simdist.errors import Collector
from simdist.io.values import MAX_INT, flag, is_auto, number, section, text, whole

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


def plan_fields(data: Mapping[str, Any], plan_data: Mapping[str, Any], world_size: int | None,
                c: Collector) -> dict[str, Any]:
    """Plan fields (scenario-file spelling, e.g. ``ddp_bucket_size: "1000000000 B"``) that the
    DeepSpeed config ``data`` implies, given the plan's own fields ``plan_data`` (unvalidated:
    read defensively) and the cluster's GPU count (for the data-parallel size)."""
    out: dict[str, Any] = {}
    for key in data:
        if key not in TOP_KEYS:
            c.add(str(key)[:60], "unknown DeepSpeed config key")
    _precision(data, out, c)
    _optimizer(data, out, c)
    _zero(data, plan_data, out, c)
    _batch(data, plan_data, world_size, out, c)
    _activation_checkpointing(data, out, c)
    return out


# keys whose value some plan field comes from (the rest of a present section is ignored)
READ = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
        "bf16.enabled", "fp16.enabled", "optimizer.type", "zero_optimization.stage",
        "zero_optimization.offload_optimizer.device", "zero_optimization.offload_param.device",
        "zero_optimization.cpu_offload", "zero_optimization.overlap_comm",
        "zero_optimization.reduce_bucket_size", "zero_optimization.zero_hpz_partition_size",
        "zero_optimization.zero_quantized_weights", "zero_optimization.zero_quantized_gradients",
        "activation_checkpointing"}
_NESTED = ("bf16", "fp16", "optimizer", "zero_optimization", "zero_optimization.offload_optimizer",
           "zero_optimization.offload_param", "activation_checkpointing")
ACTIVATION_CHECKPOINTING_KEYS = {"partition_activations", "cpu_checkpointing", "contiguous_memory_optimization",
                                 "number_checkpoints", "synchronize_checkpoint_boundary", "profile"}


def ignored_keys(data: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Every key of the config that no plan field is read from, dotted, in the file's order."""
    out = []
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if dotted in _NESTED and isinstance(value, Mapping):
            out += ignored_keys(value, dotted + ".")
        elif dotted not in READ:
            out.append(dotted)
    return out


def _activation_checkpointing(data: Mapping[str, Any], out: dict[str, Any], c: Collector) -> None:
    if "activation_checkpointing" not in data:
        return
    ac = section(data, "activation_checkpointing", c)
    for key in ac:
        if key not in ACTIVATION_CHECKPOINTING_KEYS:
            c.add(f"activation_checkpointing.{str(key)[:60]}", "unknown DeepSpeed config key")
    if isinstance(data.get("activation_checkpointing"), Mapping):
        out["recompute"] = "full"  # each layer keeps its input, recomputes the rest in backward


def _precision(data: Mapping[str, Any], out: dict[str, Any], c: Collector) -> None:
    bf16 = flag(section(data, "bf16", c), "enabled", c, auto=True, where="bf16.enabled")
    fp16 = flag(section(data, "fp16", c), "enabled", c, auto=True, where="fp16.enabled")
    if bf16 and fp16:
        c.add("fp16.enabled", "true together with bf16.enabled: choose one precision")
    elif bf16:
        out["precision"] = "bf16"
    elif fp16:
        out["precision"] = "fp16"
    elif bf16 is False and fp16 is False and "amp" not in data:
        out["precision"] = "fp32"


def _optimizer(data: Mapping[str, Any], out: dict[str, Any], c: Collector) -> None:
    kind = text(section(data, "optimizer", c), "type", c, where="optimizer.type")
    if kind is None:
        return
    name = kind.replace("_", "").lower()
    if name not in OPTIMIZERS:
        c.add("optimizer.type", f"unknown optimizer {kind[:40]!r}")
    elif OPTIMIZERS[name] is None:
        c.add("optimizer.type", f"{kind} is not modelled (adam, adamw, lamb, sgd are)")
    else:
        out["optimizer"] = OPTIMIZERS[name]


def _zero(data: Mapping[str, Any], plan_data: Mapping[str, Any], out: dict[str, Any], c: Collector) -> None:
    zero = section(data, "zero_optimization", c)
    for key in zero:
        if key not in ZERO_KEYS:
            c.add(f"zero_optimization.{str(key)[:60]}", "unknown DeepSpeed config key")
    stage: Any = zero.get("stage")
    if stage is not None and not is_auto(stage):
        if stage not in (0, 1, 2, 3) or isinstance(stage, bool) or not isinstance(stage, int):
            c.add("zero_optimization.stage", f"must be 0, 1, 2 or 3, got {str(stage)[:40]}")
            stage = None
        else:
            out["zero_stage"] = stage
    else:
        stage = plan_data.get("zero_stage")
    offload = _offload(zero, c)
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
    overlap = flag(zero, "overlap_comm", c, auto=True, where="zero_optimization.overlap_comm")
    if overlap is not None:
        out["overlap_grad_reduce"] = overlap
    bucket = number(zero, "reduce_bucket_size", c, auto=True, where="zero_optimization.reduce_bucket_size")
    if bucket is not None:
        if bucket > MAX_INT:
            c.add("zero_optimization.reduce_bucket_size", f"{bucket:.3g} elements is too large")
        else:
            grad_bytes = 4 if out.get("precision", plan_data.get("precision")) == "fp32" else 2
            out["ddp_bucket_size"] = f"{int(bucket) * grad_bytes} B"  # elements -> bytes
    hpz = whole(zero, "zero_hpz_partition_size", c, auto=True, where="zero_optimization.zero_hpz_partition_size")
    if hpz is not None and hpz > 1:
        out["zero_hpz_partition_size"] = hpz
    if flag(zero, "zero_quantized_weights", c, auto=True, where="zero_optimization.zero_quantized_weights"):
        out["zero_quantized_weights"] = True
    if flag(zero, "zero_quantized_gradients", c, auto=True, where="zero_optimization.zero_quantized_gradients"):
        out["grad_compression"] = {"method": "int8", "error_feedback": False}


def _offload(zero: Mapping[str, Any], c: Collector) -> dict[str, str]:
    offload: dict[str, str] = {}
    for ds_key, plan_key in (("offload_optimizer", "optimizer"), ("offload_param", "params")):
        if zero.get(ds_key) is None:
            continue
        if not isinstance(zero.get(ds_key), Mapping):
            c.add(f"zero_optimization.{ds_key}", 'must be an object such as {"device": "cpu"}')
            continue
        sub = zero[ds_key]
        for key in sub:
            if key not in OFFLOAD_KEYS:
                c.add(f"zero_optimization.{ds_key}.{str(key)[:60]}", "unknown DeepSpeed config key")
        dev = sub.get("device", "none")
        if is_auto(dev):
            continue
        if dev not in ("none", "cpu", "nvme") or not isinstance(dev, str):
            c.add(f"zero_optimization.{ds_key}.device", f"{str(dev)[:40]!r} is not one of none, cpu, nvme")
        else:
            offload[plan_key] = dev
    return offload


def _batch(data: Mapping[str, Any], plan_data: Mapping[str, Any], world_size: int | None,
           out: dict[str, Any], c: Collector) -> None:
    """train_batch_size = micro * accumulation * dp (DeepSpeed's _configure_train_batch_size)."""
    tbs = whole(data, "train_batch_size", c, auto=True)
    micro = whole(data, "train_micro_batch_size_per_gpu", c, auto=True)
    gas = whole(data, "gradient_accumulation_steps", c, auto=True)
    dp = _dp(plan_data, world_size)
    if tbs is not None and micro is not None and gas is not None and dp is not None and tbs != micro * gas * dp:
        c.add("train_batch_size", f"{tbs} != micro {micro} * accumulation {gas} * dp {dp}")
        out.update(global_batch_size=tbs, micro_batch_size=micro)  # reported once, not again as missing
        return
    # explicit plan fields win; "auto" or absent fields are derived as DeepSpeed does
    tbs_eff = _plan_int(plan_data, "global_batch_size") or tbs
    micro_eff = _plan_int(plan_data, "micro_batch_size") or micro
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


def _plan_int(plan_data: Mapping[str, Any], key: str) -> int | None:
    v = plan_data.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_INT else None


def _dp(plan_data: Mapping[str, Any], world_size: int | None) -> int | None:
    given = _plan_int(plan_data, "dp")
    if given is not None:
        return given
    if world_size is None:
        return None
    mp = 1
    for key in ("tp", "pp", "cp"):
        mp *= _plan_int(plan_data, key) or 1
    return max(1, world_size // mp)
