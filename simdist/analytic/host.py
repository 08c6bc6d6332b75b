"""Host-side stalls: a device-to-host read that drains the GPU's queue, and the ops after it
that the GPU then runs as fast as one host thread issues them.

One host thread issues a training step's kernels. Normally it runs ahead of the GPU, so the
queue is never empty and its issue cost hides behind the kernels already queued. A read of a
GPU value on the host (``tensor.cpu()``, ``.tolist()``, ``.item()``) ends that lead: the host
blocks until every queued kernel has finished, copies the value back, and only then issues the
next kernel. The GPU idles for that round trip, and afterwards wherever the host takes longer
to issue a kernel than the GPU takes to run the ones queued before it, until the host has built
a lead again (:func:`refill_idle`, a queue of one producer and one consumer).

Where it happens (:func:`syncs_per_forward`): a mixture-of-experts layer with dropless routing
reads its tokens per expert on the host once per forward. Megatron-Core's alltoall dispatcher
needs them as the all-to-all's split sizes and as the ``m_splits`` (host integers) of Transformer
Engine's GroupedLinear, which issues one cuBLAS GEMM per local expert; DeepEP's normal dispatch
and HybridEP's blocking dispatch wait for the received-token count (HybridEP's drain of the
compute stream after its metadata preprocessing, on every MoE layer, forward and recompute:
NVIDIA-NeMo/Automodel#3931). Padding every expert's input to its capacity (Megatron-Core
``moe_pad_expert_input_to_capacity``, what Megatron-Bridge's token-drop recipes run) fixes the
shapes and removes the read; the backward reuses the forward's split sizes. NVIDIA names these
syncs and the host-boundedness they cause among the MoE "compute wall" (arXiv:2603.07685 sec 1;
the sync-free MoE kernels of Transformer Engine remove them for full-iteration CUDA graphs).

The two host costs are typical figures of the mechanism, not fitted to any run:

- :data:`SYNC_ROUND_TRIP_S`: the drain's fixed part, a device-to-host copy of a few bytes plus
  the stream synchronisation and the host's wake-up: about 10 us on PCIe-attached GPUs (CUDA's
  small-copy latency is a few microseconds; a blocking synchronisation adds the wake-up);
- :data:`HOST_ISSUE_S`: host time to issue one kernel from PyTorch eager code: Python, the
  pybind11 boundary, autograd, the ATen dispatcher and cudaLaunchKernel, about 5-25 us of CPU
  work per op; the geometric middle, 11 us.

The third is measured, and it is most of the stall: :data:`DISPATCHER_GAP_S`, the host's work
between the read and its next kernel launch (the split sizes turned into lists, buffers sized to
the received tokens, the dispatch kernel's and the grouped GEMMs' launch set-up), while the GPU,
drained, idles. Megatron-Bridge profiled Qwen3-30B-A3B pre-training on 16 H100 with Nsight
Systems (skills/nemo-mbridge-perf-expert-parallel-overlap/SKILL.md, "HybridEP
Production-Shape Benchmark", 2026-07-25: BF16, TP1 PP1 EP16, micro-batch 1, global batch 1024,
sequence 4096, the flex dispatcher with HybridEP, force-balanced routing, the router and the
dispatcher's preprocessing in CUDA graphs): a 24.714 s step held 22.821 s of GPU activity (the
union of its kernels' intervals), so the GPU idled 1.893 s over 64 micro-batches x 48 MoE
layers, 616 us per MoE forward: the round trip, the refill (a few us there) and this gap. That
idle is an upper bound of the gap (the step's other host work, the optimizer's launches and
the loss read, is in it too, a small share at 3,072 MoE forwards per step). With the
all-to-all overlapped (``ep_comm_overlap``: combined 1F1B) the same run kept the GPU busy
through it (21.221 s active in a 21.07 s step): the paired micro-batch's kernels are already
queued when the host stalls, so the gap costs nothing there (:func:`drain_gap`).
"""

from __future__ import annotations

from collections.abc import Iterable

from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan
from simdist.spec.profile import CalibrationProfile, on_cpu

SYNC_ROUND_TRIP_S = 10e-6
HOST_ISSUE_S = 11e-6
# the Nsight measurement quoted in the module docstring: step, GPU-active time, MoE forwards per step
GAP_STEP_S, GAP_ACTIVE_S, GAP_SYNCS = 24.7138, 22.821, 64 * 48
DISPATCHER_GAP_S = (GAP_STEP_S - GAP_ACTIVE_S) / GAP_SYNCS - SYNC_ROUND_TRIP_S  # 606 us


def syncs_per_forward(m: ModelSpec, plan: ParallelPlan) -> int:
    """Host reads of the tokens per expert in one MoE layer's forward: one with dropless routing
    (no capacity factor), none when every expert's input is padded to its capacity."""
    if not m.is_moe or m.moe_capacity_factor is not None:
        return 0
    return 1


def refill_idle(kernels: Iterable[float], issue_s: float = HOST_ISSUE_S) -> float:
    """GPU idle time after a drain while the host issues ``kernels`` (their GPU durations, in
    issue order): the host issues one every ``issue_s``, the GPU runs each when it is issued and
    the previous one is done; the idle time is what the GPU waits for the host."""
    host = gpu = idle = 0.0
    for g in kernels:
        host += issue_s
        if host > gpu:
            idle += host - gpu
            gpu = host
        gpu += g
    return idle


def drain_gap(overlapped: bool, profile: CalibrationProfile | None = None) -> float:
    """GPU idle time at a read beyond its round trip and refill (:data:`DISPATCHER_GAP_S`):
    none when another micro-batch's kernels are queued beside it (``overlapped``: the dispatch
    paired with another micro-batch's pass) or on CPUs under a gloo profile (the host runs the
    ops itself: there is no queue to drain)."""
    if overlapped or on_cpu(profile):
        return 0.0
    return DISPATCHER_GAP_S
