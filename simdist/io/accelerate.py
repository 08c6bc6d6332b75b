"""An Accelerate config (``accelerate config``'s default_config.yaml) -> cluster and plan fields.

distributed_type FSDP with fsdp_config.fsdp_sharding_strategy (FULL_SHARD -> ZeRO-3,
SHARD_GRAD_OP -> ZeRO-2, HYBRID_SHARD -> ZeRO-3 sharded inside each node and replicated across
nodes, HYBRID_SHARD_ZERO2 -> ZeRO-2 likewise, NO_SHARD -> DDP; the numeric 1-5 of older
versions too), fsdp_reshard_after_forward (FSDP2: false keeps the parameters, ZeRO-2),
fsdp_offload_params (FSDP CPUOffload: parameters, gradients and the optimizer step on the CPU),
fsdp_activation_checkpointing; DEEPSPEED with its deepspeed_config (zero_stage,
offload_*_device, gradient_accumulation_steps) or deepspeed_config_file (read later, as
``plan.deepspeed_config``); MULTI_GPU / NO / MULTI_CPU as plain DDP; num_processes,
num_machines and mixed_precision throughout.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from simdist.errors import Collector
from simdist.io.values import flag, section, text, whole

SHARDING = {
    "FULL_SHARD": (3, False), "SHARD_GRAD_OP": (2, False), "NO_SHARD": (0, False),
    "HYBRID_SHARD": (3, True), "HYBRID_SHARD_ZERO2": (2, True),
    "1": (3, False), "2": (2, False), "3": (0, False), "4": (3, True), "5": (2, True),
}
PRECISION = {"no": "fp32", "fp16": "fp16", "bf16": "bf16", "fp8": "fp8"}


def scenario_fields(raw: Mapping[str, Any], plan: dict[str, Any], cl: dict[str, Any], *, nodes: int | None,
                    preset_gpus_per_node: int, config_dir: str, notes: list[str], c: Collector) -> None:
    """Fill ``plan`` and ``cl`` (scenario-file spelling) from the Accelerate config ``raw``;
    ``nodes``: given on the command line (wins over num_machines); notes say where a value came
    from; problems name the config's keys."""
    kind = (text(raw, "distributed_type", c) or "NO").upper()
    machines = whole(raw, "num_machines", c)
    procs = whole(raw, "num_processes", c)
    if nodes is None and machines is not None:
        cl["num_nodes"] = machines
    if procs is not None:
        if "gpus_per_node" not in cl and procs % cl["num_nodes"] == 0:
            cl["gpus_per_node"] = procs // cl["num_nodes"]
        notes.append(f"num_processes {procs} = {cl['num_nodes']} nodes x {procs // cl['num_nodes']} GPUs")
    gpus_per_node = cl.get("gpus_per_node", preset_gpus_per_node)
    mp = raw.get("mixed_precision")
    if mp is not None:
        if not isinstance(mp, str) or mp not in PRECISION:
            c.add("mixed_precision", f"{str(mp)[:40]!r} is not one of {', '.join(PRECISION)}")
        else:
            plan["precision"] = PRECISION[mp]
    if kind == "FSDP":
        _fsdp(section(raw, "fsdp_config", c), plan, gpus_per_node, notes, c)
    elif kind == "DEEPSPEED":
        _deepspeed(section(raw, "deepspeed_config", c), plan, procs, config_dir, notes, c)
    elif kind in ("MULTI_GPU", "NO", "MULTI_CPU"):
        plan.setdefault("zero_stage", 0)
    else:
        c.add("distributed_type", f"{kind[:40]!r} is not modelled (FSDP, DEEPSPEED, MULTI_GPU, NO)")
    if "global_batch_size" not in plan and "deepspeed_config" not in plan:
        mb = plan.setdefault("micro_batch_size", 1)
        world = cl["num_nodes"] * gpus_per_node
        plan["global_batch_size"] = mb * world
        notes.append(f"global batch not in the config: micro {mb} x {world} GPUs, no accumulation "
                     "(pass --global-batch-size)")


def _fsdp(fc: Mapping[str, Any], plan: dict[str, Any], gpus_per_node: int, notes: list[str], c: Collector) -> None:
    where = "fsdp_config.fsdp_sharding_strategy"
    strategy = str(fc.get("fsdp_sharding_strategy", "FULL_SHARD")).upper()[:40]
    if strategy not in SHARDING:
        c.add(where, f"{strategy!r} is not one of FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD, "
              "HYBRID_SHARD_ZERO2, NO_SHARD")
    else:
        zero, hybrid = SHARDING[strategy]
        plan["zero_stage"] = zero
        if hybrid:
            plan["dp_shard"] = gpus_per_node
            notes.append(f"{strategy}: sharded inside each node ({gpus_per_node} GPUs), replicated across nodes")
        reshard = flag(fc, "fsdp_reshard_after_forward", c, where="fsdp_config.fsdp_reshard_after_forward")
        if reshard is False and zero == 3:
            plan["zero_stage"] = 2  # FSDP2 without resharding keeps the parameters: ZeRO-2
    if flag(fc, "fsdp_offload_params", c, where="fsdp_config.fsdp_offload_params"):
        if plan.get("zero_stage") == 3:
            plan["offload"] = {"optimizer": "cpu", "params": "cpu"}
        else:
            c.add("fsdp_config.fsdp_offload_params", "parameter offload needs FULL_SHARD or HYBRID_SHARD")
    if flag(fc, "fsdp_activation_checkpointing", c, where="fsdp_config.fsdp_activation_checkpointing"):
        plan["recompute"] = "full"


def _deepspeed(dc: Mapping[str, Any], plan: dict[str, Any], procs: int | None, config_dir: str,
               notes: list[str], c: Collector) -> None:
    cfg_file = text(dc, "deepspeed_config_file", c, where="deepspeed_config.deepspeed_config_file")
    if cfg_file:
        plan["deepspeed_config"] = os.path.normpath(os.path.join(config_dir, cfg_file))
        return
    zero = dc.get("zero_stage")
    if zero is not None:
        if zero not in (0, 1, 2, 3) or isinstance(zero, bool) or not isinstance(zero, int):
            c.add("deepspeed_config.zero_stage", f"must be 0, 1, 2 or 3, got {str(zero)[:40]}")
            zero = None
        else:
            plan["zero_stage"] = zero
    off = {}
    for key, field in (("offload_optimizer_device", "optimizer"), ("offload_param_device", "params")):
        v = text(dc, key, c, where=f"deepspeed_config.{key}")
        if v is not None and v != "none":
            off[field] = v
    if off:
        plan["offload"] = off
    gas = whole(dc, "gradient_accumulation_steps", c, where="deepspeed_config.gradient_accumulation_steps")
    mb = plan.get("micro_batch_size", 1)
    if gas is not None and "global_batch_size" not in plan and procs:
        plan.setdefault("micro_batch_size", mb)
        plan["global_batch_size"] = mb * gas * procs
        notes.append(f"global batch = micro {mb} x accumulation {gas} x {procs} processes")
    if zero == 3:
        plan["zero3_fetch"] = "module"
    elif zero in (1, 2):
        plan["overlap_param_gather"] = False  # as simdist.io.deepspeed, for the same reason
