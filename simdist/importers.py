"""`simdist import`: a DeepSpeed config (ds_config.json) or an Accelerate config (YAML) plus a
model and a cluster preset -> a scenario file that `simdist predict` loads.

DeepSpeed: read by simdist.spec.deepspeed (ZeRO stage, offload, batch sizes with "auto"
resolved from the command line, precision, bucket sizes). Accelerate (``accelerate config``'s
default_config.yaml): distributed_type FSDP with fsdp_config.fsdp_sharding_strategy
(FULL_SHARD -> ZeRO-3, SHARD_GRAD_OP -> ZeRO-2, HYBRID_SHARD -> ZeRO-3 sharded inside each node
and replicated across nodes, HYBRID_SHARD_ZERO2 -> ZeRO-2 likewise, NO_SHARD -> DDP; the
numeric 1-5 of older versions too), fsdp_offload_params (FSDP CPUOffload: parameters, gradients
and the optimizer step on the CPU), fsdp_activation_checkpointing; DEEPSPEED with its
deepspeed_config (zero_stage, offload_*_device, gradient_accumulation_steps) or
deepspeed_config_file; MULTI_GPU / NO as plain DDP; num_processes, num_machines and
mixed_precision throughout. The scenario is written atomically, and only once it loads.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from simdist.errors import Collector, Problem, ScenarioError
from simdist.spec.plan import ParallelPlan

SHARDING = {
    "FULL_SHARD": (3, False), "SHARD_GRAD_OP": (2, False), "NO_SHARD": (0, False),
    "HYBRID_SHARD": (3, True), "HYBRID_SHARD_ZERO2": (2, True),
    "1": (3, False), "2": (2, False), "3": (0, False), "4": (3, True), "5": (2, True),
}
PRECISION = {"no": "fp32", "fp16": "fp16", "bf16": "bf16", "fp8": "fp8"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="ds_config.json (DeepSpeed) or an Accelerate config YAML")
    p.add_argument("--model", required=True, help="model preset (see `simdist list models`)")
    p.add_argument("--cluster", required=True, help="cluster preset (see `simdist list clusters`)")
    p.add_argument("--nodes", type=int, help="nodes (default: from the Accelerate config, else 1)")
    p.add_argument("--gpus-per-node", type=int, help="GPUs per node (default: the preset's)")
    p.add_argument("--global-batch-size", type=int, help="sequences per step, where the config says auto "
                   "or nothing (Accelerate configs never say)")
    p.add_argument("--micro-batch-size", type=int, help="sequences per GPU per micro-batch")
    p.add_argument("--name", help="scenario name (default: from the config's file name)")
    p.add_argument("--out", help="scenario YAML to write (default: print it)")


def main(args: argparse.Namespace) -> int:
    path = Path(args.config)
    if not path.is_file():
        raise ScenarioError(Problem("config", f"{path} does not exist"))
    d, notes = import_config(path, args.model, args.cluster, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                             global_batch_size=args.global_batch_size, micro_batch_size=args.micro_batch_size,
                             name=args.name)
    text = render(d, notes, path)
    from simdist.spec.scenario import scenario_from_dict

    scenario_from_dict(yaml.safe_load(text))  # what is written must load as it stands
    if args.out:
        from simdist.spec.files import write_text_atomic

        write_text_atomic(args.out, text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(text, end="")
    return 0


def import_config(path: Path, model: str, cluster: str, *, nodes: int | None = None,
                  gpus_per_node: int | None = None, global_batch_size: int | None = None,
                  micro_batch_size: int | None = None, name: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """The scenario dict for ``path`` (validated: it loads), and notes on where each plan field
    came from. Raises ScenarioError naming every problem."""
    notes: list[str] = []
    cl: dict[str, Any] = {"preset": cluster, "num_nodes": nodes or 1}
    if gpus_per_node:
        cl["gpus_per_node"] = gpus_per_node
    plan: dict[str, Any] = {}
    if global_batch_size:
        plan["global_batch_size"] = global_batch_size
    if micro_batch_size:
        plan["micro_batch_size"] = micro_batch_size
    if path.suffix.lower() == ".json":
        plan["deepspeed_config"] = str(path.resolve())
        notes.append(f"plan read from the DeepSpeed config {path.name}")
    else:
        plan, cl = _accelerate(path, plan, cl, nodes, notes)
    d = {"name": name or path.stem, "model": {"preset": model}, "cluster": cl, "plan": plan}
    from simdist.spec.scenario import scenario_from_dict

    sc = scenario_from_dict(d)  # validates everything, resolves the DeepSpeed config
    d["plan"] = plan_to_yaml(sc.plan)
    d["cluster"] = dict(cl)
    return d, notes


def _accelerate(path: Path, plan: dict[str, Any], cl: dict[str, Any], nodes: int | None,
                notes: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    c = Collector("config")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ScenarioError(Problem("config", f"{path} is not valid YAML: {exc}")) from None
    if not isinstance(raw, dict):
        raise ScenarioError(Problem("config", f"{path} must hold a mapping (an Accelerate config)"))
    kind = str(raw.get("distributed_type", "NO")).upper()
    machines = raw.get("num_machines")
    procs = raw.get("num_processes")
    if nodes is None and isinstance(machines, int) and machines > 0:
        cl["num_nodes"] = machines
    if isinstance(procs, int) and procs > 0:
        if "gpus_per_node" not in cl and procs % cl["num_nodes"] == 0:
            cl["gpus_per_node"] = procs // cl["num_nodes"]
        notes.append(f"num_processes {procs} = {cl['num_nodes']} nodes x {procs // max(1, cl['num_nodes'])} GPUs")
    mp = raw.get("mixed_precision")
    if mp is not None:
        if str(mp) not in PRECISION:
            c.add("mixed_precision", f"{mp!r} is not one of {', '.join(PRECISION)}")
        else:
            plan["precision"] = PRECISION[str(mp)]
    if kind == "FSDP":
        fc = raw.get("fsdp_config") or {}
        strategy = str(fc.get("fsdp_sharding_strategy", "FULL_SHARD")).upper()
        if strategy not in SHARDING:
            c.add("fsdp_config.fsdp_sharding_strategy", f"{strategy!r} is not one of FULL_SHARD, "
                  "SHARD_GRAD_OP, HYBRID_SHARD, HYBRID_SHARD_ZERO2, NO_SHARD")
        else:
            zero, hybrid = SHARDING[strategy]
            plan["zero_stage"] = zero
            if hybrid:
                plan["dp_shard"] = _gpus_per_node(cl)
                notes.append(f"{strategy}: sharded inside each node ({plan['dp_shard']} GPUs), replicated across nodes")
            if fc.get("fsdp_reshard_after_forward") is False and zero == 3:
                plan["zero_stage"] = 2  # FSDP2 without resharding keeps the parameters: ZeRO-2
        if fc.get("fsdp_offload_params") is True:
            if plan.get("zero_stage") == 3:
                plan["offload"] = {"optimizer": "cpu", "params": "cpu"}
            else:
                c.add("fsdp_config.fsdp_offload_params", "parameter offload needs FULL_SHARD or HYBRID_SHARD")
        if fc.get("fsdp_activation_checkpointing") is True:
            plan["recompute"] = "full"
    elif kind == "DEEPSPEED":
        dc = raw.get("deepspeed_config") or {}
        cfg_file = dc.get("deepspeed_config_file")
        if cfg_file:
            p = Path(cfg_file)
            plan["deepspeed_config"] = str((p if p.is_absolute() else path.parent / p).resolve())
        else:
            zero = dc.get("zero_stage")
            if zero is not None:
                plan["zero_stage"] = zero
            off = {}
            for key, field in (("offload_optimizer_device", "optimizer"), ("offload_param_device", "params")):
                v = dc.get(key)
                if v is not None and v != "none":
                    off[field] = v
            if off:
                plan["offload"] = off
            gas = dc.get("gradient_accumulation_steps")
            mb = plan.get("micro_batch_size", 1)
            if isinstance(gas, int) and gas > 0 and "global_batch_size" not in plan:
                world = int(procs) if isinstance(procs, int) else None
                if world:
                    plan.setdefault("micro_batch_size", mb)
                    plan["global_batch_size"] = mb * gas * world
                    notes.append(f"global batch = micro {mb} x accumulation {gas} x {world} processes")
            if zero == 3:
                plan["zero3_fetch"] = "module"
            elif zero in (1, 2):
                plan["overlap_param_gather"] = False  # as simdist.spec.deepspeed, for the same reason
    elif kind in ("MULTI_GPU", "NO", "MULTI_CPU"):
        plan.setdefault("zero_stage", 0)
    else:
        c.add("distributed_type", f"{kind!r} is not modelled (FSDP, DEEPSPEED, MULTI_GPU, NO)")
    c.raise_if_any()
    if "global_batch_size" not in plan and "deepspeed_config" not in plan:
        mb = plan.setdefault("micro_batch_size", 1)
        world = cl["num_nodes"] * _gpus_per_node(cl)
        plan["global_batch_size"] = mb * world
        notes.append(f"global batch not in the config: micro {mb} x {world} GPUs, no accumulation "
                     "(pass --global-batch-size)")
    return plan, cl


def _gpus_per_node(cl: dict[str, Any]) -> int:
    if "gpus_per_node" in cl:
        return int(cl["gpus_per_node"])
    from simdist import catalog

    return int(catalog.clusters().get(cl["preset"], {}).get("gpus_per_node", 8))


def plan_to_yaml(plan: ParallelPlan) -> dict[str, Any]:
    """A resolved plan in the scenario file's spelling, fields that differ from the defaults
    plus the ones every reader wants to see."""
    default = ParallelPlan(global_batch_size=plan.global_batch_size, dp=plan.dp)
    always = ("tp", "pp", "dp", "zero_stage", "micro_batch_size", "global_batch_size", "precision", "optimizer")
    out: dict[str, Any] = {}
    for key in always:
        out[key] = getattr(plan, key)
    for key in ("cp", "virtual_pipeline_stages", "schedule", "sequence_parallel", "recompute",
                "fp32_grad_accumulation", "flash_attention", "overlap_grad_reduce", "overlap_param_gather",
                "tp_comm_overlap", "zero3_fetch", "dp_shard", "zero_quantized_weights", "gradient_sync",
                "parameter_servers"):
        if getattr(plan, key) != getattr(default, key):
            out[key] = getattr(plan, key)
    if plan.offload.any:
        out["offload"] = {"optimizer": plan.offload.optimizer, "params": plan.offload.params}
    if plan.grad_compression.enabled:
        gc = plan.grad_compression
        out["grad_compression"] = {"method": gc.method, "error_feedback": gc.error_feedback,
                                   **({"ratio": gc.ratio} if gc.method == "topk" else {}),
                                   **({"rank": gc.rank} if gc.method == "powersgd" else {})}
    if plan.ddp_bucket_size_bytes != default.ddp_bucket_size_bytes:
        mib = plan.ddp_bucket_size_bytes / 2**20
        out["ddp_bucket_size"] = f"{mib:g} MiB" if mib == int(mib) else f"{plan.ddp_bucket_size_bytes:.0f} B"
    return out


def render(d: dict[str, Any], notes: list[str], source: Path) -> str:
    """The scenario as commented YAML (the batch arithmetic in a comment)."""
    p = d["plan"]
    steps = p["global_batch_size"] // (p["micro_batch_size"] * p["dp"])
    lines = [f"# Imported by `simdist import` from {source.name}."]
    lines += [f"# {n}" for n in notes]
    lines.append(f"# batch: {p['global_batch_size']} sequences = micro {p['micro_batch_size']} x dp {p['dp']} "
                 f"x {steps} micro-batches per step")
    body = yaml.safe_dump({k: d[k] for k in ("name", "model", "cluster", "plan")}, sort_keys=False,
                          default_flow_style=False)
    return "\n".join(lines) + "\n" + body
