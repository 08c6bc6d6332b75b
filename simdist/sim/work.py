"""The lowered work of one step: what each pipeline stage runs on its compute stream and what it
hands to the network, host and parameter-server streams. Plain data, built by
:mod:`simdist.sim.lowering` and run by :mod:`simdist.sim.engine`."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from simdist.sim.actions import StageActions

MiB = 2**20


@dataclass(frozen=True, slots=True)
class Work:
    """Compute-stream time of one piece of a task."""

    compute: float = 0.0
    recompute: float = 0.0
    tp: float = 0.0  # exposed TP communication inside the task
    compression: float = 0.0  # gradient compression kernels (memory-bound GPU work)
    sync: float = 0.0  # waits at per-layer sync points (PassTime.sync_wait): already the slowest rank's
    cp: float = 0.0  # exposed context-parallel communication inside the task

    def total(self, factor: float = 1.0) -> float:
        """Length on a GPU whose compute is ``factor`` times slower."""
        return (self.compute + self.recompute + self.compression) * factor + self.tp + self.sync + self.cp

    def __add__(self, o: Work) -> Work:
        return Work(self.compute + o.compute, self.recompute + o.recompute, self.tp + o.tp,
                    self.compression + o.compression, self.sync + o.sync, self.cp + o.cp)


@dataclass(frozen=True, slots=True)
class CommSpec:
    """One transfer the engine times on the network."""

    name: str  # "allreduce dp 25 MiB", "sendrecv pp 6 MiB"
    collective: str
    axis: str  # dp | dp_shard | dp_replica (collectives), pp (point-to-point)
    nbytes: float
    extra_s: float = 0.0  # fixed time after it (Megatron's TP all-gather after a scattered send)


HOST_RESOURCES = ("pcie_down", "pcie_up", "nvme", "cpu")


@dataclass(frozen=True, slots=True)
class HostXfer:
    """Host-side work of one GPU: ``parts`` are (resource, solo seconds) pairs that run at the
    same time, each on its own resource (see HOST_RESOURCES): the GPU's PCIe link down (GPU to
    host) or up, and this GPU's share of the node's NVMe traffic and of the node's CPU optimizer
    step, timed as if it had the resource alone; the engine shares the node's NVMe and CPU
    among the GPUs that use them at once (:meth:`simdist.sim.network.LinkModel.host`)."""

    name: str
    parts: tuple[tuple[str, float], ...]

    def seconds(self, resource: str) -> float:
        return sum(t for r, t in self.parts if r == resource)

    def scaled(self, k: float, name: str | None = None) -> HostXfer:
        return HostXfer(name or self.name, tuple((r, t * k) for r, t in self.parts))


@dataclass(frozen=True, slots=True)
class PsSpec:
    """One gradient bucket of the parameter-server modes: pushed to the servers (``nbytes`` per
    worker rank, split evenly over them), applied by the servers' CPUs (``update_s`` on the
    busiest server node, alone) and pulled back."""

    name: str
    key: tuple[int, int]  # (chunk, bucket): the servers' key range, met by every replica (sync)
    nbytes: float
    update_s: float


@dataclass(frozen=True, slots=True)
class GradPiece:
    """Gradients ready ``at`` (a fraction) through segment ``segment`` of a task, then reduced
    (``comms``: collectives, or the parameter-server push/pull) and copied to the host (``down``,
    optimizer offload), in that order."""

    segment: int
    at: float
    comms: tuple[CommSpec | PsSpec, ...]
    down: HostXfer | None = None


@dataclass(frozen=True)
class Task:
    """One action's work: segments run back to back on the compute stream."""

    segments: tuple[Work, ...]
    gathers: tuple[tuple[CommSpec, ...], ...] = ()  # ZeRO-3: per segment, prefetched one ahead
    pieces: tuple[GradPiece, ...] = ()  # gradient reductions it starts, ordered by segment
    tp_name: str = ""
    # ZeRO-2/3: the backward returns only when its reductions (and, with optimizer offload, the
    # copies to the host) are done (DeepSpeed's overlapping_partition_gradients_reduce_epilogue;
    # FSDP's post-backward final callback)
    drain: bool = False
    # parameter offload: per segment, the shard fetched from the host (and NVMe) before its gather
    uploads: tuple[HostXfer | None, ...] = ()
    # ZeRO-3 without overlap_param_gather: each segment's gather is issued when the segment
    # starts, not one ahead
    overlapped: bool = True
    # each segment's reductions waited for before the next: ZeRO-3 without overlap_param_gather,
    # and FSDP2 on a CPU (simdist.analytic.fsdp2.reduces_in_line)
    in_line: bool = False
    # expert all-to-all of every layer of the task (dispatch and combine), one transfer on the
    # network: before the compute, or beside it when another micro-batch hides it (ep_overlap)
    ep: CommSpec | None = None
    ep_overlap: bool = False

    @cached_property
    def plain(self) -> bool:
        """One segment of compute and nothing else: no gathers, uploads, gradient pieces,
        drain or expert all-to-all (the engine runs it without its general steps)."""
        return (len(self.segments) == 1 and not self.gathers and not self.pieces and not self.drain
                and not self.uploads and self.ep is None)

    @property
    def work(self) -> Work:
        out = Work()
        for w in self.segments:
            out = out + w
        return out


@dataclass(frozen=True)
class ChunkWork:
    """One model chunk of a stage: its tasks per action kind and its pipeline sends."""

    tasks: dict[tuple[str, bool], Task]  # (kind F/B/W, last micro-batch?) -> task
    send_fwd: CommSpec | None  # activation to the next virtual stage
    send_bwd: CommSpec | None  # input gradient to the previous virtual stage
    layers: int
    # sends do not block the sender: Megatron's overlap_p2p_comm, and torch's isends on a CPU
    # whose cores all compute (StageWork.wake_tick_s)
    send_async: bool = False

    def task(self, kind: str, last: bool) -> Task:
        return self.tasks.get((kind, last)) or self.tasks[(kind, False)]


@dataclass(frozen=True)
class StageWork:
    stage: int
    chunks: tuple[ChunkWork, ...]
    schedule: StageActions  # its actions in order, each with its task index, code and input
    flush: tuple[GradPiece, ...]  # gradient sync after the pipeline flush (no overlap)
    optimizer: float
    post_optimizer: tuple[CommSpec, ...]  # ZeRO-1/2 parameter all-gather
    post_hides_in_forward: bool = False  # Megatron --overlap-param-gather: behind the next
    first_forward: float = 0.0  # step's first forward, which takes this long on the stage
    flush_compression: float = 0.0  # compression kernels before a sync after the flush
    host_step: HostXfer | None = None  # ZeRO-Offload: CPU step + parameter upload + NVMe swap
    host_after_optimizer: HostXfer | None = None  # parameter offload: updated shard back to host
    forward_stretch: float = 0.0  # first_forward's extra beside the gathers (overlap.contended_prefetch)
    # on a CPU whose cores all compute, the scheduler tick that delays the step's first send to
    # each neighbour until the stage blocks (simdist.analytic.transport_wake); 0 = no such delay
    wake_tick_s: float = 0.0


@dataclass(frozen=True)
class Lowered:
    stages: tuple[StageWork, ...]
    split_backward: bool
    notes: tuple[str, ...]


def size_label(nbytes: float) -> str:
    if nbytes >= 10 * MiB:
        return f"{nbytes / MiB:.0f} MiB"
    if nbytes >= MiB:
        return f"{nbytes / MiB:.1f} MiB"
    return f"{nbytes / 1024:.0f} KiB"


def comm(collective: str, axis: str, nbytes: float, extra_s: float = 0.0) -> CommSpec:
    label = "dp" if axis.startswith("dp") else axis
    return CommSpec(f"{collective} {label} {size_label(nbytes)}", collective, axis, nbytes, extra_s)

