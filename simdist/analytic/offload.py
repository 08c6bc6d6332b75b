"""Offload (ZeRO-Offload, ZeRO-Infinity, FSDP CPU offload): the bytes each GPU moves over PCIe,
the node's NVMe traffic and CPU work (:func:`offload_traffic`), and each transfer's seconds
alone on its resource (:func:`offload_times`). The closed form overlaps them with compute in
:mod:`simdist.analytic.steptime`; the event engine puts them on its host resources.
"""

from __future__ import annotations

from simdist.analytic.collectives import LINK_EFFICIENCY, node_gpus
from simdist.analytic.cost import cpu_optimizer_time
from simdist.analytic.data_parallel import param_gathers_per_microbatch
from simdist.analytic.fsdp2 import runs_fsdp2
from simdist.analytic.memory import optimizer_shard_params, state_bytes
from simdist.analytic.overlap import grad_buckets
from simdist.analytic.params import params_per_rank, stage_num_layers
from simdist.frozen import frozen
from simdist.spec.cluster import ClusterSpec
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan

PCIE_EFFICIENCY = LINK_EFFICIENCY["pcie"]  # achieved fraction of the PCIe line rate


@frozen(slots=True)
class OffloadTraffic:
    """Host traffic of one GPU of one stage in one step (bytes), and the node's CPU work.

    ZeRO-Offload (Ren et al. USENIX ATC'21 sec 4): the fp32 master weights, the optimizer states
    and the optimizer step live on the CPU; each GPU sends its gradient partition down over PCIe
    (every micro-batch under ZeRO-2/3, where DeepSpeed accumulates on the host) and receives its
    updated 16-bit parameter partition after the CPU step. ZeRO-Infinity (Rajbhandari et al.
    SC'21 sec 5-6) moves the same states to NVMe and, with parameter offload, fetches each
    layer's parameter shard from host (or NVMe) before its all-gather, in forward and backward.
    FSDP's CPUOffload(offload_params=True) (Zhao et al. VLDB 2023 sec 3.3.3) does the latter from
    host memory.
    """

    pcie_down_per_microbatch: float = 0.0  # GPU -> host gradients, during backward
    pcie_down_per_step: float = 0.0  # GPU -> host, once (ZeRO-0/1 gradients, or updated params)
    pcie_up_per_microbatch: float = 0.0  # host -> GPU parameter shards before the gathers
    pcie_up_per_step: float = 0.0  # host -> GPU updated 16-bit parameters after the CPU step
    nvme_per_microbatch_node: float = 0.0  # NVMe bytes of the node per micro-batch (params)
    nvme_per_step_node: float = 0.0  # NVMe bytes of the node per step (optimizer states in and out)
    cpu_params_node: float = 0.0  # parameters the node's CPU updates per step
    gather_chunks: int = 1  # parameter fetches are prefetched layer by layer
    down_buckets: int = 1  # pcie_down_per_step goes down in the gradient buckets (overlap.grad_buckets)
    gathers: int = 2  # parameter fetches per micro-batch: forward, backward (and a recomputed forward)

    @property
    def used(self) -> bool:
        return any((self.pcie_down_per_microbatch, self.pcie_down_per_step, self.pcie_up_per_microbatch,
                    self.pcie_up_per_step, self.nvme_per_microbatch_node, self.nvme_per_step_node,
                    self.cpu_params_node))


def offload_traffic(m: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec, stage: int) -> OffloadTraffic:
    """PCIe and NVMe bytes and CPU work of ``plan.offload`` for one GPU of ``stage`` (see
    OffloadTraffic for the mechanisms and sources)."""
    off = plan.offload
    if not off.any:
        return OffloadTraffic()
    b = state_bytes(m, plan)
    n = params_per_rank(m, plan, stage)
    shard = optimizer_shard_params(m, plan, stage)
    pshard = n / plan.dp_shard if plan.shards_params else n
    gpn = node_gpus(cluster)
    pb = float(plan.element_bytes)
    gb16 = min(b.grads, float(plan.element_bytes))
    layers = max(1, stage_num_layers(m, plan, stage))
    down_mb = down_step = up_mb = up_step = nvme_mb = nvme_step = cpu = 0.0
    if off.optimizer != "none":
        if plan.shards_gradients:
            down_mb = shard * gb16  # each micro-batch's reduced partition (accumulated on the host)
        else:
            down_step = shard * b.grads
        cpu = shard * gpn
        if off.params == "none":
            up_step = shard * pb  # updated 16-bit partition back to the GPU
        if off.optimizer == "nvme":
            # fp32 master + optimizer states + fp32 gradient read in and written back per step
            nvme_step = 2 * shard * gpn * (b.optimizer + 4.0)
    # the executor refuses offload, so only a framework runs it as FSDP2 (FSDP2's CPUOffloadPolicy)
    gathers = param_gathers_per_microbatch(plan, runs_fsdp2(plan, None))
    if off.params != "none":
        up_mb = gathers * pshard * pb
        if off.optimizer == "none":
            down_step += pshard * pb  # the GPU optimizer's updated 16-bit shard goes back
        if off.params == "nvme":
            nvme_mb = gathers * pshard * pb * gpn
            nvme_step += pshard * pb * gpn  # updated parameters written once
    return OffloadTraffic(down_mb, down_step, up_mb, up_step, nvme_mb, nvme_step, cpu, layers,
                          grad_buckets(down_step, plan), gathers)


@frozen(slots=True)
class OffloadTimes:
    """Seconds of each kind of offload traffic alone on its resource: the GPU's PCIe link per
    direction, the node's NVMe and the node's CPU (for the node's GPUs together)."""

    pcie_down_per_microbatch: float = 0.0
    pcie_up_per_microbatch: float = 0.0
    nvme_per_microbatch: float = 0.0  # the node's NVMe reads that feed the parameter uploads
    pcie_down_per_step: float = 0.0  # ZeRO-0/1 gradients (or updated parameters) to the host
    pcie_up_per_step: float = 0.0  # updated parameters back to the GPU
    nvme_per_step: float = 0.0  # the node's NVMe swap of the states
    cpu_step: float = 0.0  # the node's CPU optimizer step

    @property
    def up_per_microbatch(self) -> float:
        """Parameter uploads and the NVMe reads that feed them, pipelined: the slower."""
        return max(self.pcie_up_per_microbatch, self.nvme_per_microbatch)

    @property
    def after_step(self) -> float:
        """The CPU step, the upload of the updated parameters and the NVMe swap of the states run
        tile by tile in a pipeline (DeepSpeed CPU-Adam copies each updated tile while the next
        one is computed; ZeRO-Infinity overlaps NVMe swaps with the optimizer, Rajbhandari et al.
        SC'21 sec 6.2), so together they cost the slowest."""
        return max(self.cpu_step, self.pcie_up_per_step, self.nvme_per_step)

    @property
    def before_step(self) -> float:
        """ZeRO-0/1 gradient download after the last backward."""
        return self.pcie_down_per_step


def offload_times(tr: OffloadTraffic, cluster: ClusterSpec, plan: ParallelPlan) -> OffloadTimes:
    """Seconds of each offload transfer alone. PCIe is per GPU per direction at PCIE_EFFICIENCY
    of the line rate; NVMe is the node's bandwidth shared by its GPUs; the CPU step is the
    node's (cost.cpu_optimizer_time). Zero without a host spec."""
    host = cluster.host
    if host is None or not tr.used:
        return OffloadTimes()
    pcie = host.pcie_bandwidth_bytes_per_s * PCIE_EFFICIENCY
    nvme = host.nvme_bandwidth_bytes_per_s
    return OffloadTimes(
        pcie_down_per_microbatch=tr.pcie_down_per_microbatch / pcie,
        pcie_up_per_microbatch=tr.pcie_up_per_microbatch / pcie,
        nvme_per_microbatch=tr.nvme_per_microbatch_node / nvme,
        pcie_down_per_step=tr.pcie_down_per_step / pcie,
        pcie_up_per_step=tr.pcie_up_per_step / pcie,
        nvme_per_step=tr.nvme_per_step_node / nvme,
        cpu_step=cpu_optimizer_time(tr.cpu_params_node, plan, host),
    )
