"""Hardware specs: GPU, links, host, and the cluster that puts them together."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

IntraKind = Literal["nvswitch", "nvlink", "pcie", "loopback"]
InterKind = Literal["infiniband", "roce", "ethernet", "omnipath", "none"]
PEAK_PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8")  # keys of GpuSpec.peak_flops (tf32: fp32 matmuls on tensor cores)


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    name: str
    memory_bytes: float
    memory_bandwidth_bytes_per_s: float
    peak_flops: dict[str, float]  # dense FLOP/s per precision
    sms: int = 108  # streaming multiprocessors: GEMM tiles are scheduled in waves over them
    # Achieved fractions of peak that the cost model starts from (a calibration profile overrides).
    efficiency: dict[str, float] = field(default_factory=dict, compare=False)
    source: str = field(default="", compare=False)

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


@dataclass(frozen=True, kw_only=True)
class LinkSpec:
    kind: str
    bandwidth_bytes_per_s: float  # per GPU (intra) or per NIC (inter), per direction
    latency_s: float


@dataclass(frozen=True, kw_only=True)
class HostSpec:
    """Per node: what ZeRO-Offload / ZeRO-Infinity lean on (CONTRACT v1.1)."""

    cpu_memory_bytes: float
    pcie_bandwidth_bytes_per_s: float  # per GPU, per direction
    nvme_bandwidth_bytes_per_s: float  # per node
    cpu_optimizer_params_per_s: float  # per node, CPU Adam


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    name: str
    num_nodes: int
    gpus_per_node: int
    gpu: GpuSpec
    intra_node: LinkSpec
    inter_node: LinkSpec
    nics_per_node: int
    in_switch_reduction: bool = False  # NVLink SHARP (NVLS) inside the node
    host: HostSpec | None = None
    nodes_per_leaf: int = 32  # leaf switch radix in nodes (rail-optimized fat tree, full bisection)
    spine_oversubscription: float = 1.0  # >1 means less spine bandwidth than leaf bandwidth

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def node_injection_bytes_per_s(self) -> float:
        return self.nics_per_node * self.inter_node.bandwidth_bytes_per_s

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node
