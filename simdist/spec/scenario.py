"""Scenario: model + cluster + plan (+ reliability), loaded from YAML and validated as a whole.

``scenario_from_dict`` resolves presets, the Hugging Face config and explicit fields (explicit
fields win), parses every unit, and reports every problem at once, each naming its field
(``plan.tp: 12 does not divide model.num_attention_heads (96)``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from simdist import catalog
from simdist.errors import Collector, Problem, ScenarioError
from simdist.spec.cluster import ClusterSpec, GpuSpec, HostSpec, LinkSpec
from simdist.spec.model import MODEL_FIELDS, ModelSpec, fields_from_hf_config
from simdist.spec.plan import (
    COMPRESSION_METHODS,
    GRADIENT_SYNC,
    OFFLOAD_DEVICES,
    OPTIMIZERS,
    PRECISIONS,
    RECOMPUTE,
    SCHEDULES,
    GradCompression,
    Offload,
    ParallelPlan,
)
from simdist.units import UnitError, parse_bandwidth, parse_duration, parse_rate, parse_size

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True, kw_only=True)
class Reliability:
    """Failures and checkpoints (CONTRACT v1.1 `reliability`)."""

    gpu_mtbf_s: float
    checkpoint_bandwidth_bytes_per_s: float
    checkpoint_interval_s: float | None = None  # None = auto (optimal for this MTBF)
    async_checkpoint: bool = False
    restart_time_s: float = 600.0
    train_tokens: float | None = None


@dataclass(frozen=True, kw_only=True)
class Scenario:
    name: str
    model: ModelSpec
    cluster: ClusterSpec
    plan: ParallelPlan
    reliability: Reliability | None = None
    requires_profile: bool = False  # the `local` cluster: speed only from a calibration profile
    source_path: str | None = field(default=None, compare=False)

    @property
    def world_size(self) -> int:
        return self.cluster.world_size

    def to_dict(self) -> dict[str, Any]:
        """Resolved, SI-unit view of the scenario (for hashing, caching and reports)."""
        d = asdict(self)
        d.pop("source_path", None)
        d["model"].pop("source", None)
        d["cluster"]["gpu"].pop("source", None)
        return d

    def hash(self) -> str:
        """Stable content hash of what is simulated (the name is not part of it)."""
        d = self.to_dict()
        d.pop("name")
        blob = json.dumps(d, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def with_plan(self, **changes: Any) -> Scenario:
        """A copy with some plan fields changed (validated again)."""
        plan = replace(self.plan, **changes)
        if "dp" in changes and "dp_shard" not in changes and self.plan.dp_shard == self.plan.dp:
            plan = replace(plan, dp_shard=plan.dp)
        problems = check_consistency(self.model, self.cluster, plan)
        if problems:
            raise ScenarioError(problems)
        return replace(self, plan=plan)


# --- loading ------------------------------------------------------------------------------


def load_scenario(path: str | Path) -> Scenario:
    """Load and validate a scenario file; raises ScenarioError listing every problem."""
    p = Path(path)
    if not p.is_file():
        raise ScenarioError(Problem("file", f"{p} does not exist"))
    try:
        data = yaml.load(p.read_text(encoding="utf-8"), Loader=_Loader)
    except yaml.YAMLError as exc:
        raise ScenarioError(Problem("file", f"{p} is not valid YAML: {exc}")) from None
    if not isinstance(data, dict):
        raise ScenarioError(Problem("file", f"{p} must hold a mapping with name, model, cluster, plan"))
    scenario = scenario_from_dict(data, base_dir=p.parent)
    return replace(scenario, source_path=str(p))


_TOP = {"name", "description", "model", "cluster", "plan", "reliability"}


def scenario_from_dict(data: dict[str, Any], base_dir: str | Path = ".") -> Scenario:
    c = Collector()
    base = Path(base_dir)
    for key in data:
        if key not in _TOP:
            c.add(str(key), f"unknown field (expected one of {', '.join(sorted(_TOP))})")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        c.add("name", "is required (free text)")
    for section in ("model", "cluster", "plan"):
        if not isinstance(data.get(section), dict):
            c.add(section, "is required and must be a mapping")
    c.raise_if_any()

    model = _build_model(data["model"], base, Collector("model"), c)
    cluster, requires_profile = _build_cluster(data["cluster"], Collector("cluster"), c)
    plan_data = dict(data["plan"])
    ds = plan_data.pop("deepspeed_config", None)
    if ds is not None:
        from simdist.spec.deepspeed import plan_fields_from_deepspeed

        dc = Collector("plan.deepspeed_config")
        plan_data = {**plan_fields_from_deepspeed(base / str(ds), plan_data, cluster, dc), **plan_data}
        c.problems.extend(dc.problems)
    plan = _build_plan(plan_data, model, cluster, Collector("plan"), c)
    reliability = None
    if data.get("reliability") is not None:
        reliability = _build_reliability(data["reliability"], Collector("reliability"), c)
    if model and cluster and plan:
        c.problems.extend(check_consistency(model, cluster, plan, dp_given="dp" in plan_data))
    c.raise_if_any()
    assert model and cluster and plan
    return Scenario(
        name=str(name),
        model=model,
        cluster=cluster,
        plan=plan,
        reliability=reliability,
        requires_profile=requires_profile,
    )


def _merge_into(outer: Collector, inner: Collector) -> None:
    outer.problems.extend(inner.problems)


# --- model --------------------------------------------------------------------------------


def _build_model(raw: dict[str, Any], base: Path, c: Collector, outer: Collector) -> ModelSpec | None:
    values: dict[str, Any] = {}
    preset = raw.get("preset")
    if preset is not None:
        presets = catalog.models()
        if preset not in presets:
            c.add("preset", f"unknown model preset {preset!r}; see `simdist list models`")
        else:
            values.update({k: v for k, v in presets[preset].items() if k != "published_params"})
            values["name"] = preset
    hf = raw.get("hf_config")
    if hf is not None:
        path = base / str(hf)
        try:
            cfg = json.loads(path.read_text(encoding="utf-8"))
            hc = Collector(f"{c.prefix}.hf_config")
            values.update(fields_from_hf_config(cfg, hc))
            c.problems.extend(hc.problems)
        except FileNotFoundError:
            c.add("hf_config", f"{path} does not exist")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            c.add("hf_config", f"{path} is not valid JSON: {exc}")
    for key, value in raw.items():
        if key in ("preset", "hf_config"):
            continue
        if key not in MODEL_FIELDS or key == "source":
            c.add(key, "unknown field")
            continue
        values[key] = value
    ModelSpec.check(values, c)
    _merge_into(outer, c)
    if c.problems:
        return None
    return ModelSpec(**values)


# --- cluster ------------------------------------------------------------------------------

_CLUSTER_KEYS = {
    "preset", "num_nodes", "gpus_per_node", "gpu", "intra_node", "inter_node",
    "in_switch_reduction", "host", "nodes_per_leaf", "spine_oversubscription",
}


def _build_cluster(raw: dict[str, Any], c: Collector, outer: Collector) -> tuple[ClusterSpec | None, bool]:
    values: dict[str, Any] = {}
    name = "custom"
    preset = raw.get("preset")
    if preset is not None:
        presets = catalog.clusters()
        if preset not in presets:
            c.add("preset", f"unknown cluster preset {preset!r}; see `simdist list clusters`")
        else:
            values = json.loads(json.dumps(presets[preset]))  # deep copy
            name = preset
    for key, value in raw.items():
        if key not in _CLUSTER_KEYS:
            c.add(key, "unknown field")
        elif key in ("intra_node", "inter_node", "host") and isinstance(value, dict):
            values[key] = {**(values.get(key) or {}), **value}
        elif key != "preset":
            values[key] = value
    requires_profile = bool(values.pop("requires_profile", False))
    values.pop("source", None)

    num_nodes = values.get("num_nodes")
    if num_nodes is None:
        c.add("num_nodes", "is required")
    gpus_per_node = values.get("gpus_per_node")
    if gpus_per_node is None:
        c.add("gpus_per_node", "is required (or give a preset)")
    for key in ("num_nodes", "gpus_per_node", "nodes_per_leaf"):
        v = values.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
            c.add(key, f"must be a positive whole number, got {v!r}")
    gpu = _build_gpu(values.get("gpu"), c)
    intra = _build_link(values.get("intra_node"), "intra_node", c)
    inter = _build_link(values.get("inter_node"), "inter_node", c)
    nics = (values.get("inter_node") or {}).get("nics_per_node", 1)
    if isinstance(nics, bool) or not isinstance(nics, int) or nics <= 0:
        c.add("inter_node.nics_per_node", f"must be a positive whole number, got {nics!r}")
    host = _build_host(values.get("host"), c) if values.get("host") is not None else None
    isr = values.get("in_switch_reduction", False)
    if not isinstance(isr, bool):
        c.add("in_switch_reduction", f"must be true or false, got {isr!r}")
    over = values.get("spine_oversubscription", 1.0)
    if isinstance(over, bool) or not isinstance(over, int | float) or over < 1:
        c.add("spine_oversubscription", f"must be a number >= 1, got {over!r}")
    _merge_into(outer, c)
    if c.problems or gpu is None or intra is None or inter is None:
        return None, requires_profile
    return (
        ClusterSpec(
            name=name,
            num_nodes=num_nodes,
            gpus_per_node=gpus_per_node,
            gpu=gpu,
            intra_node=intra,
            inter_node=inter,
            nics_per_node=nics,
            in_switch_reduction=isr,
            host=host,
            nodes_per_leaf=values.get("nodes_per_leaf", 32),
            spine_oversubscription=float(over),
        ),
        requires_profile,
    )


_DEFAULT_EFFICIENCY = {"gemm": 0.75, "attention": 0.45, "memory": 0.80}


def _build_gpu(raw: Any, c: Collector) -> GpuSpec | None:
    if raw is None:
        c.add("gpu", "is required (a catalog name such as a100-80gb, or a mapping)")
        return None
    if isinstance(raw, str):
        gpus = catalog.gpus()
        if raw not in gpus:
            c.add("gpu", f"unknown GPU {raw!r}; see `simdist list gpus`")
            return None
        entry, name = gpus[raw], raw
    elif isinstance(raw, dict):
        entry, name = raw, str(raw.get("name", ""))
        if not name:
            c.add("gpu.name", "is required")
        for key in raw:
            if key not in ("name", "memory", "peak_tflops", "memory_bandwidth", "efficiency", "sms", "source"):
                c.add(f"gpu.{key}", "unknown field")
    else:
        c.add("gpu", f"must be a catalog name or a mapping, got {raw!r}")
        return None
    n0 = len(c.problems)
    memory = _unit(entry.get("memory"), parse_size, "gpu.memory", c)
    bw = _unit(entry.get("memory_bandwidth"), parse_bandwidth, "gpu.memory_bandwidth", c)
    peaks = entry.get("peak_tflops")
    if not isinstance(peaks, dict) or not peaks:
        c.add("gpu.peak_tflops", "is required: a mapping such as {bf16: 312, fp32: 19.5}")
        peaks = {}
    peak_flops: dict[str, float] = {}
    for prec, tf in peaks.items():
        if isinstance(tf, bool) or not isinstance(tf, int | float) or tf <= 0:
            c.add(f"gpu.peak_tflops.{prec}", f"must be a positive number of TFLOP/s, got {tf!r}")
        else:
            peak_flops[str(prec)] = float(tf) * 1e12
    eff = {**_DEFAULT_EFFICIENCY, **(entry.get("efficiency") or {})}
    if len(c.problems) > n0 or memory is None or bw is None:
        return None
    return GpuSpec(
        name=name,
        memory_bytes=memory,
        memory_bandwidth_bytes_per_s=bw,
        peak_flops=peak_flops,
        efficiency={k: float(v) for k, v in eff.items()},
        sms=int(entry.get("sms", 108)),
        source=str(entry.get("source", "")),
    )


def _build_link(raw: Any, where: str, c: Collector) -> LinkSpec | None:
    if not isinstance(raw, dict):
        c.add(where, "is required: a mapping with kind, bandwidth and latency (or give a preset)")
        return None
    allowed = {"kind", "bandwidth", "latency"} | ({"nics_per_node"} if where == "inter_node" else set())
    for key in raw:
        if key not in allowed:
            c.add(f"{where}.{key}", "unknown field")
    bw = _unit(raw.get("bandwidth"), parse_bandwidth, f"{where}.bandwidth", c)
    lat = _unit(raw.get("latency"), parse_duration, f"{where}.latency", c)
    if bw is None or lat is None:
        return None
    return LinkSpec(kind=str(raw.get("kind", "custom")), bandwidth_bytes_per_s=bw, latency_s=lat)


def _build_host(raw: Any, c: Collector) -> HostSpec | None:
    if not isinstance(raw, dict):
        c.add("host", "must be a mapping")
        return None
    for key in raw:
        if key not in ("cpu_memory", "pcie_bandwidth", "nvme_bandwidth", "cpu_optimizer_throughput"):
            c.add(f"host.{key}", "unknown field")
    mem = _unit(raw.get("cpu_memory"), parse_size, "host.cpu_memory", c)
    pcie = _unit(raw.get("pcie_bandwidth"), parse_bandwidth, "host.pcie_bandwidth", c)
    nvme = _unit(raw.get("nvme_bandwidth"), parse_bandwidth, "host.nvme_bandwidth", c)
    opt = _unit(raw.get("cpu_optimizer_throughput"), parse_rate, "host.cpu_optimizer_throughput", c)
    if None in (mem, pcie, nvme, opt):
        return None
    return HostSpec(
        cpu_memory_bytes=mem, pcie_bandwidth_bytes_per_s=pcie,  # type: ignore[arg-type]
        nvme_bandwidth_bytes_per_s=nvme, cpu_optimizer_params_per_s=opt,  # type: ignore[arg-type]
    )


def _unit(raw: Any, parse: Any, where: str, c: Collector) -> float | None:
    if raw is None:
        c.add(where, "is required")
        return None
    try:
        return parse(raw)
    except UnitError as exc:
        c.add(where, str(exc))
        return None


# --- plan ---------------------------------------------------------------------------------

_PLAN_INTS = ("tp", "pp", "dp", "cp", "virtual_pipeline_stages", "micro_batch_size",
              "global_batch_size", "dp_shard", "parameter_servers")
_PLAN_BOOLS = ("sequence_parallel", "fp32_grad_accumulation", "flash_attention",
               "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap",
               "zero_quantized_weights")
_PLAN_CHOICES = {
    "schedule": SCHEDULES, "recompute": RECOMPUTE, "precision": PRECISIONS,
    "optimizer": OPTIMIZERS, "gradient_sync": GRADIENT_SYNC, "zero3_fetch": ("layer", "module"),
}
_PLAN_KEYS = set(_PLAN_INTS) | set(_PLAN_BOOLS) | set(_PLAN_CHOICES) | {
    "zero_stage", "offload", "grad_compression", "ddp_bucket_size"}


def _build_plan(raw: dict[str, Any], model: ModelSpec | None, cluster: ClusterSpec | None,
                c: Collector, outer: Collector) -> ParallelPlan | None:
    values: dict[str, Any] = {}
    for key, v in raw.items():
        if key not in _PLAN_KEYS:
            c.add(key, "unknown field")
        elif key in _PLAN_INTS:
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                c.add(key, f"must be a positive whole number, got {v!r}")
            else:
                values[key] = v
        elif key in _PLAN_BOOLS:
            if not isinstance(v, bool):
                c.add(key, f"must be true or false, got {v!r}")
            else:
                values[key] = v
        elif key in _PLAN_CHOICES:
            if v not in _PLAN_CHOICES[key]:
                c.add(key, f"{v!r} is not one of {', '.join(_PLAN_CHOICES[key])}")
            else:
                values[key] = v
        elif key == "zero_stage":
            if v not in (0, 1, 2, 3) or isinstance(v, bool):
                c.add(key, f"must be 0, 1, 2 or 3, got {v!r}")
            else:
                values[key] = v
        elif key == "ddp_bucket_size":
            size = _unit(v, parse_size, "ddp_bucket_size", c)
            if size is not None:
                values["ddp_bucket_size_bytes"] = size
        elif key == "offload":
            values["offload"] = _build_offload(v, c)
        elif key == "grad_compression":
            values["grad_compression"] = _build_compression(v, c)
    if "global_batch_size" not in raw:
        c.add("global_batch_size", "is required")

    # virtual stages imply the interleaved schedule (CONTRACT: ">1 means interleaved 1F1B")
    v = values.get("virtual_pipeline_stages", 1)
    sched = values.get("schedule")
    if v > 1 and sched is None:
        values["schedule"] = "interleaved-1f1b"
    elif v > 1 and sched not in ("interleaved-1f1b", None):
        c.add("virtual_pipeline_stages", f"{v} chunks per stage needs schedule interleaved-1f1b, not {sched}")
    elif sched == "interleaved-1f1b" and v == 1:
        c.add("schedule", "interleaved-1f1b needs virtual_pipeline_stages >= 2")

    # dp derived from the world size when absent (check_consistency reports a mismatch)
    if cluster is not None and "dp" not in values:
        mp = values.get("tp", 1) * values.get("pp", 1) * values.get("cp", 1)
        values["dp"] = max(1, cluster.world_size // mp)
    _merge_into(outer, c)
    if c.problems or cluster is None:
        return None
    return ParallelPlan(**values)


def _build_offload(raw: Any, c: Collector) -> Offload:
    if raw in (None, "none"):
        return Offload()
    if not isinstance(raw, dict):
        c.add("offload", "must be a mapping such as {optimizer: cpu, params: none}")
        return Offload()
    out: dict[str, str] = {}
    for key, v in raw.items():
        if key not in ("optimizer", "params"):
            c.add(f"offload.{key}", "unknown field (optimizer, params)")
        elif v not in OFFLOAD_DEVICES:
            c.add(f"offload.{key}", f"{v!r} is not one of {', '.join(OFFLOAD_DEVICES)}")
        else:
            out[key] = v
    return Offload(**out)  # type: ignore[arg-type]


def _build_compression(raw: Any, c: Collector) -> GradCompression:
    if raw in (None, "none"):
        return GradCompression()
    if isinstance(raw, str):
        raw = {"method": raw}
    if not isinstance(raw, dict):
        c.add("grad_compression", "must be a mapping such as {method: powersgd, rank: 4}")
        return GradCompression()
    out: dict[str, Any] = {}
    for key, v in raw.items():
        if key == "method":
            if v not in COMPRESSION_METHODS:
                c.add("grad_compression.method", f"{v!r} is not one of {', '.join(COMPRESSION_METHODS)}")
            else:
                out["method"] = v
        elif key == "ratio":
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= 1:
                c.add("grad_compression.ratio", f"must be a fraction in (0, 1], got {v!r}")
            else:
                out["ratio"] = float(v)
        elif key == "rank":
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                c.add("grad_compression.rank", f"must be a positive whole number, got {v!r}")
            else:
                out["rank"] = v
        elif key == "error_feedback":
            if not isinstance(v, bool):
                c.add("grad_compression.error_feedback", f"must be true or false, got {v!r}")
            else:
                out["error_feedback"] = v
        else:
            c.add(f"grad_compression.{key}", "unknown field (method, ratio, rank, error_feedback)")
    if "method" not in raw:
        c.add("grad_compression.method", "is required")
    return GradCompression(**out)


# --- reliability --------------------------------------------------------------------------


def _build_reliability(raw: Any, c: Collector, outer: Collector) -> Reliability | None:
    if not isinstance(raw, dict):
        c.add("", "must be a mapping")
        _merge_into(outer, c)
        return None
    keys = {"gpu_mtbf", "checkpoint_bandwidth", "checkpoint_interval", "async_checkpoint",
            "restart_time", "train_tokens"}
    for key in raw:
        if key not in keys:
            c.add(key, "unknown field")
    mtbf = _unit(raw.get("gpu_mtbf"), parse_duration, "gpu_mtbf", c)
    bw = _unit(raw.get("checkpoint_bandwidth"), parse_bandwidth, "checkpoint_bandwidth", c)
    interval: float | None = None
    ci = raw.get("checkpoint_interval", "auto")
    if ci != "auto":
        interval = _unit(ci, parse_duration, "checkpoint_interval", c)
        if interval == 0:
            c.add("checkpoint_interval", "must be positive (or auto)")
    restart = _unit(raw.get("restart_time", "10 min"), parse_duration, "restart_time", c)
    asyn = raw.get("async_checkpoint", False)
    if not isinstance(asyn, bool):
        c.add("async_checkpoint", f"must be true or false, got {asyn!r}")
    tokens = raw.get("train_tokens")
    if isinstance(tokens, str):
        try:
            tokens = float(tokens)
        except ValueError:
            c.add("train_tokens", f"must be a number of tokens, got {tokens!r}")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int | float) or tokens <= 0):
        c.add("train_tokens", f"must be a positive number of tokens, got {tokens!r}")
        tokens = None
    if mtbf == 0:
        c.add("gpu_mtbf", "must be positive")
    _merge_into(outer, c)
    if c.problems:
        return None
    return Reliability(
        gpu_mtbf_s=mtbf, checkpoint_bandwidth_bytes_per_s=bw,  # type: ignore[arg-type]
        checkpoint_interval_s=interval, async_checkpoint=asyn,
        restart_time_s=restart, train_tokens=float(tokens) if tokens else None,  # type: ignore[arg-type]
    )


# --- cross-object checks ------------------------------------------------------------------


def check_consistency(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan,
                      dp_given: bool = True) -> list[Problem]:
    """Every problem that needs model, cluster and plan together, each naming its field.
    ``dp_given``: the file wrote plan.dp (else it was derived from the world size)."""
    out: list[Problem] = []

    def add(f: str, msg: str) -> None:
        out.append(Problem(f, msg))

    if model.num_attention_heads % plan.tp:
        add("plan.tp", f"{plan.tp} does not divide model.num_attention_heads ({model.num_attention_heads})")
    elif model.num_kv_heads % plan.tp:
        add("plan.tp", f"{plan.tp} does not divide model.num_kv_heads ({model.num_kv_heads})")
    if model.ffn_hidden_size % plan.tp:
        add("plan.tp", f"{plan.tp} does not divide model.ffn_hidden_size ({model.ffn_hidden_size})")
    chunks = plan.pp * plan.virtual_pipeline_stages
    if chunks > model.num_layers:
        add("plan.pp", f"pp*virtual_pipeline_stages = {chunks} is more than model.num_layers ({model.num_layers})")
    if plan.virtual_pipeline_stages > 1 and plan.pp == 1:
        add("plan.virtual_pipeline_stages", "needs pp > 1")
    if model.seq_length % plan.cp:
        add("plan.cp", f"{plan.cp} does not divide model.seq_length ({model.seq_length})")
    world = cluster.world_size
    if plan.world_size != world:
        if dp_given:
            add("plan.dp", f"tp*pp*cp*dp = {plan.world_size} but the cluster has {world} GPUs")
        else:
            add("plan.tp", f"tp*pp*cp = {plan.model_parallel_size} does not divide the cluster's {world} GPUs")
    per_step = plan.micro_batch_size * plan.dp
    if plan.global_batch_size % per_step:
        add("plan.global_batch_size", f"{plan.global_batch_size} is not a multiple of micro_batch_size*dp "
            f"= {plan.micro_batch_size}*{plan.dp} = {per_step}")
    elif plan.schedule == "interleaved-1f1b" and plan.num_microbatches % plan.pp:
        add("plan.global_batch_size", f"interleaved-1f1b needs the micro-batches per pipeline "
            f"({plan.num_microbatches}) to be a multiple of pp ({plan.pp})")
    if plan.dp % plan.dp_shard:
        add("plan.dp_shard", f"{plan.dp_shard} does not divide dp ({plan.dp})")
    if plan.precision == "fp8" and "fp8" not in cluster.gpu.peak_flops:
        add("plan.precision", f"fp8 needs FP8 tensor cores, which {cluster.gpu.name} does not have")
    if plan.gradient_sync != "allreduce" and plan.zero_stage:
        add("plan.gradient_sync", f"{plan.gradient_sync} keeps whole parameters on the servers; "
            "use zero_stage 0 with it")
    if plan.offload.params != "none" and plan.zero_stage != 3:
        add("plan.offload.params", "parameter offload needs zero_stage 3 (ZeRO-Infinity / FSDP offload)")
    if plan.offload.optimizer != "none" and plan.zero_stage == 0 and plan.dp > 1:
        add("plan.offload.optimizer", "optimizer offload needs zero_stage >= 1 (ZeRO-Offload partitions "
            "the optimizer across DP ranks)")
    if plan.zero_quantized_weights and plan.zero_stage != 3:
        add("plan.zero_quantized_weights", "quantized weight all-gather (ZeRO++ qwZ) needs zero_stage 3")
    if plan.grad_compression.enabled and plan.zero_stage >= 2 and plan.grad_compression.method in ("topk", "powersgd"):
        add("plan.grad_compression.method", f"{plan.grad_compression.method} compresses a replicated "
            "gradient all-reduce; it does not combine with zero_stage >= 2 (sharded gradients)")
    if plan.schedule == "zero-bubble" and plan.virtual_pipeline_stages > 1:
        add("plan.schedule", "zero-bubble runs one chunk per stage (virtual_pipeline_stages 1)")
    if plan.gradient_sync != "allreduce" and (plan.parameter_servers or 0) > world:
        add("plan.parameter_servers", f"{plan.parameter_servers} servers is more than the {world} GPUs")
    return out
