"""Hardware specs: GPU, links, host, and the cluster that puts them together."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

from simdist import catalog
from simdist.errors import Collector, Problem
from simdist.frozen import frozen
from simdist.spec.fields import hash_once, spec_field, validate
from simdist.units import short_repr

# NCCL's algorithm and protocol names as NCCL_ALGO / NCCL_PROTO spell them (src/graph/tuning.cc),
# and the names simdist.analytic.nccl gives them
NCCL_ALGORITHMS = ("ring", "tree", "pat", "nvls", "nvls_tree", "collnet")
NCCL_PROTOCOLS = ("LL", "LL128", "Simple")
NCCL_ALGORITHM_NAMES = {"ring": "ring", "tree": "tree", "pat": "pat", "nvls": "nvls", "nvlstree": "nvls_tree",
                        "collnet": "collnet", "collnetdirect": "collnet", "collnetchain": "collnet"}
NCCL_PROTOCOL_NAMES = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}


def parse_nccl_list(text: str, names: Mapping[str, str], every: tuple[str, ...]) -> frozenset[str]:
    """NCCL_ALGO / NCCL_PROTO syntax: a comma list of names to enable, or "^" and the names to
    disable (case-insensitive). Raises ValueError naming an unknown name."""
    text = text.strip()
    negate = text.startswith("^")
    items = [t.strip().lower() for t in text.lstrip("^").split(",") if t.strip()]
    unknown = [t for t in items if t not in names]
    if unknown:
        shown = ", ".join(short_repr(t, 30) for t in unknown[:4]) + (", ..." if len(unknown) > 4 else "")
        raise ValueError(f"unknown {shown} (one of {', '.join(sorted(names))})")
    picked = {names[t] for t in items}
    return frozenset(set(every) - picked) if negate else frozenset(picked)


IntraKind = Literal["nvswitch", "nvlink", "pcie", "loopback"]
InterKind = Literal["infiniband", "roce", "ethernet", "omnipath", "none"]
LinkKind = Literal[IntraKind, InterKind]
PEAK_PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8")  # keys of GpuSpec.peak_flops (tf32: fp32 matmuls on tensor cores)
EFFICIENCY_KEYS = ("gemm", "fp8_gemm", "attention", "memory")
REQUIRED_EFFICIENCIES = ("gemm", "attention", "memory")


@frozen(kw_only=True)
class GpuSpec:
    name: str = spec_field(doc="GPU name")
    memory_bytes: float = spec_field(key="memory", unit="size", check="positive", doc="HBM capacity")
    memory_bandwidth_bytes_per_s: float = spec_field(key="memory_bandwidth", unit="bandwidth", check="positive",
                                                     doc="HBM bandwidth")
    # dense FLOP/s per precision
    peak_flops: dict[str, float] = spec_field(key="peak_tflops", scale=1e12, keys=PEAK_PRECISIONS, check="positive",
                                              doc="dense peak TFLOP/s per precision")
    # streaming multiprocessors: GEMM tiles are scheduled in waves over them
    sms: int = spec_field(108, check="positive", doc="streaming multiprocessors (GEMM wave quantization)")
    # Achieved fractions of peak that the cost model starts from (a calibration profile overrides).
    efficiency: dict[str, float] = spec_field(default_factory=dict, compare=False, keys=EFFICIENCY_KEYS,
                                              check="fraction", doc="achieved fractions of peak")
    source: str = spec_field("", compare=False, doc="where the figures come from")
    # v1.2: how much faster the frameworks' own fused attention kernels (cuDNN's, FlashAttention-3)
    # run than FlashAttention-2, whose speed `efficiency.attention` is (1.0: the same kernel class)
    fused_attention_speedup: float = spec_field(1.0, check="at_least_1", compare=False, since="1.2",
                                                doc="cuDNN / FlashAttention-3 attention over FlashAttention-2")
    # v1.2 extension, not simulated (prices the run): the datasheet's maximum board power (TDP)
    board_power_w: float | None = spec_field(None, check="positive", compare=False, since="1.2", hashed=False,
                                             doc="maximum board power in watts (the datasheet's TDP)")

    def __post_init__(self) -> None:
        validate(self)

    def __hash__(self) -> int:
        return hash((self.name, self.memory_bytes, self.memory_bandwidth_bytes_per_s,
                     tuple(sorted(self.peak_flops.items())), self.sms))

    def peak(self, precision: str) -> float:
        """Dense peak for the precision a plan trains in (fp32 training uses TF32 tensor cores
        when the GPU has them, as PyTorch and Megatron do by default for matmuls)."""
        if precision in self.peak_flops:
            return self.peak_flops[precision]
        if precision == "bf16" and "fp16" in self.peak_flops:
            return self.peak_flops["fp16"]
        if precision == "fp8":  # a GPU without FP8 runs the plan in 16-bit
            return self.peak("bf16")
        raise KeyError(precision)

    def problems(self) -> list[Problem]:
        out = []
        if not self.peak_flops:
            out.append(Problem("peak_tflops", "is required: a mapping such as {bf16: 312, fp32: 19.5}"))
        elif not any(p in self.peak_flops for p in ("bf16", "fp16", "fp32")):
            out.append(Problem("peak_tflops", "needs at least one of bf16, fp16, fp32"))
        missing = [k for k in REQUIRED_EFFICIENCIES if k not in self.efficiency]
        if missing:
            out.append(Problem("efficiency", f"needs {', '.join(missing)} (fractions of peak reached in "
                               "training), or give like: <catalog GPU> to take that GPU's"))
        return out


@frozen(kw_only=True)
class LinkSpec:
    kind: LinkKind = spec_field(doc="link technology (sets the achieved fraction of line rate)")
    # per GPU (intra) or per NIC (inter), per direction
    bandwidth_bytes_per_s: float = spec_field(key="bandwidth", unit="bandwidth", check="positive",
                                              doc="line rate per GPU (intra) or NIC (inter), per direction")
    latency_s: float = spec_field(key="latency", unit="duration", check="nonneg", doc="per-hop latency")

    def __post_init__(self) -> None:
        validate(self)


@frozen(kw_only=True)
class HostSpec:
    """Per node: what ZeRO-Offload / ZeRO-Infinity lean on (contract v1.1)."""

    cpu_memory_bytes: float = spec_field(key="cpu_memory", unit="size", check="positive", doc="host RAM per node")
    pcie_bandwidth_bytes_per_s: float = spec_field(key="pcie_bandwidth", unit="bandwidth", check="positive",
                                                   doc="GPU <-> host, per GPU, per direction")
    nvme_bandwidth_bytes_per_s: float = spec_field(key="nvme_bandwidth", unit="bandwidth", check="positive",
                                                   doc="per node, read or write")
    cpu_optimizer_params_per_s: float = spec_field(key="cpu_optimizer_throughput", unit="rate", check="positive",
                                                   doc="CPU Adam step per node")

    def __post_init__(self) -> None:
        validate(self)


def _prepare_gpu(raw: Any, c: Collector) -> Any:
    """A catalog name or a mapping -> the mapping of GpuSpec keys (None after a problem).

    A mapping with ``like: <catalog GPU>`` starts from that GPU (its figures and efficiencies)
    and overrides what it states (``efficiency`` key by key); one without ``like`` must state
    ``efficiency`` and ``sms`` itself, never a silent default."""
    gpus = catalog.gpus()
    if isinstance(raw, str):
        if raw not in gpus:
            c.add("", f"unknown GPU {short_repr(raw)}; see `simdist list gpus`")
            return None
        return {**gpus[raw], "name": raw}
    if not isinstance(raw, Mapping):
        c.add("", f"must be a catalog name such as a100-80gb or a mapping, got {short_repr(raw)}")
        return None
    like = raw.get("like")
    if like is None:
        missing = [k for k in ("efficiency", "sms") if k not in raw]
        if missing:
            c.add(missing[0], f"is required for a GPU given as a mapping ({' and '.join(missing)}), "
                  "or give like: <catalog GPU> to take that GPU's")
            return None
        return raw
    if not isinstance(like, str) or like not in gpus:
        c.add("like", f"unknown GPU {short_repr(like)}; see `simdist list gpus`")
        return None
    base = gpus[like]
    out = {**base, **{k: v for k, v in raw.items() if k != "like"}}
    if isinstance(raw.get("efficiency"), Mapping):
        out["efficiency"] = {**base.get("efficiency", {}), **raw["efficiency"]}
    if "source" not in raw:
        out["source"] = f"figures not stated taken from {like} ({base.get('source', 'catalog')})"
    return out


@hash_once
@frozen(kw_only=True)
class ClusterSpec:
    name: str = spec_field("custom", internal=True, doc="the preset's name, or custom")
    num_nodes: int = spec_field(check="positive", doc="nodes")
    gpus_per_node: int = spec_field(check="positive", doc="GPUs per node")
    gpu: GpuSpec = spec_field(prepare=_prepare_gpu, doc="a catalog GPU name or a mapping")
    intra_node: LinkSpec = spec_field(doc="the link inside a node")
    inter_node: LinkSpec = spec_field(doc="the network between nodes")
    nics_per_node: int = spec_field(1, key="inter_node.nics_per_node", check="positive", doc="NICs per node")
    in_switch_reduction: bool = spec_field(False, doc="NVLink SHARP (NVLS) inside the node")
    host: HostSpec | None = spec_field(None, since="1.1", doc="host memory, PCIe, NVMe and CPU optimizer speed")
    nodes_per_leaf: int = spec_field(32, check="positive", doc="leaf switch radix in nodes (fat tree)")
    spine_oversubscription: float = spec_field(1.0, check="at_least_1",
                                               doc=">1: less spine bandwidth than leaf bandwidth")
    # v1.2: what NCCL may run (simdist.analytic.nccl)
    in_network_reduction: bool = spec_field(False, since="1.2",
                                            doc="SHARP reduction in the network switches (NCCL CollNet)")
    # v1.2 extension, not simulated (prices the run): what one GPU-hour of this cluster costs
    usd_per_gpu_hour: float | None = spec_field(None, check="positive", compare=False, since="1.2", hashed=False,
                                                doc="price of one GPU-hour in US dollars (cost of a step and a run)")
    nccl_algorithms: str | None = spec_field(None, since="1.2",
                                             doc="NCCL_ALGO-style list of the algorithms NCCL may use "
                                                 "(ring, tree, pat, nvls, nvlstree, collnet; ^ excludes)")
    nccl_protocols: str | None = spec_field(None, since="1.2",
                                            doc="NCCL_PROTO-style list of the protocols (LL, LL128, Simple; ^ excludes)")

    def __post_init__(self) -> None:
        validate(self)

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def nccl_algorithm_set(self) -> frozenset[str]:
        """The NCCL algorithms collectives may use (every one the links support by default)."""
        if not self.nccl_algorithms:
            return frozenset(NCCL_ALGORITHMS)
        return parse_nccl_list(self.nccl_algorithms, NCCL_ALGORITHM_NAMES, NCCL_ALGORITHMS)

    @property
    def nccl_protocol_set(self) -> frozenset[str]:
        if not self.nccl_protocols:
            return frozenset(NCCL_PROTOCOLS)
        return parse_nccl_list(self.nccl_protocols, NCCL_PROTOCOL_NAMES, NCCL_PROTOCOLS)

    @property
    def node_injection_bytes_per_s(self) -> float:
        return self.nics_per_node * self.inter_node.bandwidth_bytes_per_s

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def problems(self) -> list[Problem]:
        out = [Problem(f"gpu.{p.field}", p.message) for p in self.gpu.problems()]
        for key, text, names, every in (("nccl_algorithms", self.nccl_algorithms, NCCL_ALGORITHM_NAMES, NCCL_ALGORITHMS),
                                        ("nccl_protocols", self.nccl_protocols, NCCL_PROTOCOL_NAMES, NCCL_PROTOCOLS)):
            if text is not None:
                try:
                    if not parse_nccl_list(text, names, every):
                        out.append(Problem(key, f"{short_repr(text)} leaves no {key[6:-1]} enabled"))
                except ValueError as exc:
                    out.append(Problem(key, str(exc)))
        for where, link, kinds in (("intra_node", self.intra_node, get_args(IntraKind)),
                                   ("inter_node", self.inter_node, get_args(InterKind))):
            if link.kind not in kinds:
                out.append(Problem(f"{where}.kind", f"{link.kind} is not a link of this kind ({', '.join(kinds)})"))
        return out
