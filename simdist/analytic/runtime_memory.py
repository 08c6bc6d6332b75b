"""What a GPU process holds beyond its tensors: the CUDA context, NCCL's communicator buffers
and the cuBLAS workspaces.

The first two live outside PyTorch's caching allocator (``torch.cuda.memory_reserved()`` does
not count them, ``nvidia-smi`` does); the cuBLAS workspaces are allocated through it. A CPU
process standing in for a GPU (the ``local`` cluster: gloo, no CUDA) holds none of them.

Sources
- CUDA context: 287,047,680 bytes per process with lazy module loading
  (``CUDA_MODULE_LOADING=LAZY``, PyTorch's default since 1.13) against 666,632,192 with eager
  loading, measured in pytorch/pytorch PR #86509 (the PR that made lazy loading the default).
  Kernels loaded later (cuBLAS, NCCL, attention) add to it; the figure is the floor.
- NCCL buffers per connection: NCCL's defaults (src/init.cc) are LL = 8 lines x 512 threads x
  8 steps x 16 B = 512 KiB, LL128 = 120 x 640 x 8 x 8 B = 4.6875 MiB and Simple =
  NCCL_BUFFSIZE = 4 MiB, 9.1875 MiB per connection and channel. Memory grows linearly with the
  channels and with the connections each algorithm opens (ring: its two neighbours; tree: parent
  and children), NCCL maintainer in NVIDIA/nccl#864/#986. On 4 A100 (NVLink) one communicator
  of more than two GPUs measured 688 MB per GPU (NVIDIA/nccl#964): 24 channels x 3 connection
  sets x 9.1875 MiB = 661 MiB = 693 MB. Hopper NVLink opens 32 channels per peer pair
  (NCCL INFO log in NVIDIA/nccl#1685), V100 NVLink half of Ampere's, PCIe-only nodes a few.
- Pipeline peers: point-to-point connections hold 2 MiB buffers per channel (the ALLOC log of
  NVIDIA/nccl#1685), one set per peer.
- cuBLAS: PyTorch binds a workspace to every (handle, stream) pair it uses
  (pytorch/pytorch#83461), ``CUBLAS_WORKSPACE_CONFIG`` default ``:4096:2:16:8`` = 8,519,680 B,
  and a cuBLASLt workspace of 32 MiB on Hopper and later, 4 MiB on Ampere (pytorch/pytorch
  #120925, after the cuBLAS reference's recommended sizes: 32 MiB on Hopper, 4 MiB before);
  on Hopper the cuBLAS handle's workspace is the same recommended 32 MiB.
"""

from __future__ import annotations

from simdist.frozen import frozen
from simdist.spec.cluster import ClusterSpec
from simdist.spec.plan import ParallelPlan
from simdist.units import GiB

MiB = 2**20
CUDA_CONTEXT_BYTES = 287_047_680.0
NCCL_CONNECTION_BYTES = 512 * 1024 + 4_915_200 + 4 * MiB  # LL + LL128 + Simple, per channel
NCCL_CONNECTION_SETS = 3  # ring neighbours + tree parent/children, per channel
NCCL_P2P_BUFFER_BYTES = 2 * MiB  # per channel and pipeline peer
CUBLAS_WORKSPACE_PRE_HOPPER = 8_519_680.0  # :4096:2:16:8
CUBLAS_WORKSPACE_HOPPER = 32 * MiB
CUBLASLT_WORKSPACE = {"hopper": 32 * MiB, "ampere": 4 * MiB, "volta": 1 * MiB}


@frozen(slots=True)
class RuntimeMemory:
    """Bytes per GPU that are not tensors of the model: ``outside`` the caching allocator
    (CUDA context, NCCL) and ``inside`` it (cuBLAS workspaces)."""

    cuda_context: float = 0.0
    nccl: float = 0.0
    cublas: float = 0.0
    communicators: int = 0
    channels: int = 0

    @property
    def outside_allocator(self) -> float:
        return self.cuda_context + self.nccl

    @property
    def total(self) -> float:
        return self.cuda_context + self.nccl + self.cublas

    def parts(self) -> dict[str, float]:
        return {"cuda_context": self.cuda_context, "nccl_buffers": self.nccl, "cublas_workspace": self.cublas}


def is_cuda(cluster: ClusterSpec) -> bool:
    """False for host processes standing in for GPUs (the ``local`` cluster's ``cpu`` device)."""
    return cluster.gpu.name != "cpu" and cluster.intra_node.kind != "loopback"


def gpu_generation(cluster: ClusterSpec) -> str:
    """volta | ampere | hopper, from what the GPU computes: FP8 tensor cores came with Hopper
    (and Blackwell keeps Hopper's workspace sizes), BF16 with Ampere."""
    peaks = cluster.gpu.peak_flops
    if "fp8" in peaks:
        return "hopper"
    if "bf16" in peaks:
        return "ampere"
    return "volta"


def nccl_channels(cluster: ClusterSpec) -> int:
    """Channels NCCL opens per communicator: by NVLink generation inside a node (Ampere 24,
    Hopper and later 32, Volta 12), a few over PCIe."""
    if cluster.intra_node.kind == "pcie":
        return 4
    return {"hopper": 32, "ampere": 24, "volta": 12}[gpu_generation(cluster)]


def communicator_count(plan: ParallelPlan, world_size: int) -> tuple[int, int]:
    """(collective communicators, pipeline peers) of one GPU: one NCCL communicator per process
    group that runs collectives (tensor, context, expert, data parallel: the shard and the
    replica groups under hybrid sharding, the hpZ secondary group; and the default group every
    job creates for barriers), and one p2p connection set per pipeline neighbour."""
    groups = [plan.tp, plan.cp, plan.ep]
    if not plan.uses_parameter_servers:
        groups += [plan.dp_shard, plan.dp_replicas]
        if plan.zero_hpz_partition_size > 1:
            groups.append(plan.zero_hpz_partition_size)
    count = sum(1 for g in groups if g > 1) + (1 if world_size > 1 else 0)
    peers = 0 if plan.pp == 1 else (1 if plan.pp == 2 and not plan.interleaved else 2)
    return count, peers


def runtime_memory(plan: ParallelPlan, cluster: ClusterSpec | None) -> RuntimeMemory:
    """The context, NCCL buffers and cuBLAS workspaces of one GPU running ``plan`` on
    ``cluster`` (zero without a cluster or on host processes)."""
    if cluster is None or not is_cuda(cluster):
        return RuntimeMemory()
    gen = gpu_generation(cluster)
    channels = nccl_channels(cluster)
    comms, peers = communicator_count(plan, cluster.world_size)
    nccl = comms * channels * NCCL_CONNECTION_SETS * NCCL_CONNECTION_BYTES
    nccl += peers * channels * NCCL_P2P_BUFFER_BYTES
    blas = CUBLAS_WORKSPACE_HOPPER if gen == "hopper" else CUBLAS_WORKSPACE_PRE_HOPPER
    return RuntimeMemory(cuda_context=CUDA_CONTEXT_BYTES, nccl=nccl, cublas=blas + CUBLASLT_WORKSPACE[gen],
                         communicators=comms, channels=channels)


def describe_runtime(rt: RuntimeMemory) -> str:
    """One clause for the assumptions: what the runtime part of other_gib holds."""
    if rt.total == 0:
        return "no CUDA context, NCCL buffers or cuBLAS workspaces (host processes)"
    return (f"CUDA context {rt.cuda_context / GiB:.2f} GiB (lazy loading), NCCL buffers "
            f"{rt.nccl / GiB:.2f} GiB ({rt.communicators} communicators x {rt.channels} channels x "
            f"{NCCL_CONNECTION_SETS} connections x {NCCL_CONNECTION_BYTES / MiB:.2f} MiB, plus pipeline "
            f"peers), cuBLAS workspaces {rt.cublas / MiB:.0f} MiB")
