"""What a calibration profile adds to an op list's time: framework seconds per op of the
software layers a plan runs through (DTensor's once per DTensor op the executor runs, the split
backward's in the weight pass), and waits at the layers' sync points (per second of compute, per
collective call, per pipeline transfer, per FSDP2 collective). Without a profile all are 0.
:mod:`simdist.analytic.passes` adds them to the ops it times.
"""

from __future__ import annotations

from simdist.analytic.cost import CostModel
from simdist.analytic.ops import Compute
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan
from simdist.spec.scenario import Scenario
from simdist.spec.software_layers import HOOK_LAYERS, profile_layers, sync_points, wait_keys


def framework_overhead(sc: Scenario, cost: CostModel, recompute: bool = False, dtensor: bool = False) -> float:
    """Extra framework seconds per compute op that a calibration profile measured for the
    software layers this plan runs through (:func:`simdist.spec.software_layers.profile_layers`);
    0 otherwise. ``recompute``: per op of the forward that backward runs again, which does not
    pay the layers whose cost is in hooks around a module's forward
    (:data:`simdist.spec.profile.HOOK_LAYERS`). Tensor parallelism's term
    (:data:`DTENSOR_LAYER`) is paid only by ops on DTensors (``dtensor``), once for each DTensor op
    the executor runs for them (:func:`dtensor_ops`)."""
    over = cost.profile.framework_overheads_s if cost.profile else {}
    extra = sum(over.get(k, 0.0) for k in profile_layers(sc.plan) if k != SPLIT_LAYER
                and not (recompute and k in HOOK_LAYERS) and (dtensor or k != DTENSOR_LAYER))
    return max(extra, -cost.kernel_overhead)  # a layer cheaper per op than plain DDP, an op never below zero


def extras(sc: Scenario, cost: CostModel, recompute: bool = False) -> tuple[float, float]:
    """:func:`framework_overhead` per op, and what each DTensor op adds to it (:func:`dtensor_ops`)."""
    plain = framework_overhead(sc, cost, recompute)
    return plain, framework_overhead(sc, cost, recompute, dtensor=True) - plain


# The layer whose per-op cost is DTensor's dispatch (torch.distributed.tensor: sharding propagation,
# and the redistributes a split linear's hooks make, in Python and C++ around each op on DTensors:
# hundreds of microseconds on a CPU). The ops the executor's layout (executor.parallelize.
# tensor_parallel_plan, Megatron's split as DTensor styles) runs on DTensors pay it, once per
# DTensor op (:func:`dtensor_ops`); the attention, the activations and the residual adds run on
# each rank's local tensors and do not. Priced per op of every kind, the GPT's layer came out as
# dear with sequence parallelism as without and the plain GPT's TP plans 11-21% slow in five of six
# calibrations; priced per op on DTensors, -16 to +8% (benchmarks/README.md, 2026-11-29).
#
# The executor's model (executor/model.py, executor/moe.py) runs what the op lists fuse as separate
# linears, each its own DTensor op: "qkv" as the q, k and v projections, SwiGLU's "fc1" as its gate
# and up projections. Counted so, DTensor's cost per op is one figure for both models: measured on
# this project's 2-core Intel guest (benchmarks/dtensor_layer.py, 2026-12-07, torch 2.13, 2 ranks;
# training-thread CPU per layer and micro-batch, forward and backward, less its ops at a calibrated
# profile's prices), at one and four sequences, with and without sequence parallelism, the tiny
# GPT's layer (6 linears) cost 213-245 us per DTensor op and the tiny Llama's (7) 211-239 us; per
# fused GEMM they were 307-341 and 365-411 us, so one term fitted on a GPT and a Llama plan priced
# every GPT layer dear and every Llama layer cheap. The larger GPT of local-tp-fit (4x the hidden
# size, 4-16x the tokens) costs 254-370 us per DTensor op: the per-op term is not all fixed.
DTENSOR_LAYER = "tp"


def dtensor_ops(op: Compute, m: ModelSpec, plan: ParallelPlan) -> int:
    """How many ops a tensor-parallel plan's executor runs on DTensors for ``op``: one per split
    linear its GEMM stands for (q, k, v, attention out, fc1/fc2 or gate/up/down, the LM head;
    forward and both gradients), one for the vocabulary-parallel embedding, with sequence
    parallelism one per norm on sequence shards, and without a pipeline two for each pass of the
    loss: the executor computes it vocabulary-parallel there (executor/train.py, DTensor's
    ``loss_parallel``: its log-softmax and NLL handlers, the forward's with three all-reduces on
    the training thread), where a pipeline's last stage gathers the logits and computes it on
    local tensors. 0 for the rest (the attention, the activations and the residual adds run on
    each rank's local tensors, the router on replicated weights).

    The loss on DTensors costs the training thread 1.2-1.9 ms more per micro-batch than on the
    gathered logits (this project's 2-core Intel guest, 2026-12-07, 2 ranks: the tiny GPT, the
    tiny Llama, local-tp-fit's GPT), about four DTensor ops' worth."""
    if plan.tp == 1:
        return 0
    if op.kind == "gemm":
        if op.name.startswith("router"):
            return 0
        if op.name in ("qkv (k part)", "fc1 (w3 part)"):  # one linear of a fused op (ops._unsaved_matmuls)
            return 1
        linear = op.name.split(" ", 1)[0]  # "qkv wgrad" -> "qkv"
        return 3 if linear == "qkv" else 2 if linear == "fc1" and m.mlp == "swiglu" else 1
    if op.name.startswith("cross entropy"):
        return 2 if plan.pp == 1 else 0
    return int(op.name.startswith("embedding") or (plan.sequence_parallel and op.name.startswith(("norm", "final norm"))))


SPLIT_LAYER = "split_backward"  # its per-op term is paid in the weight pass only: split_weight_pass_s


def split_weight_pass_s(sc: Scenario, cost: CostModel) -> float:
    """Host seconds that zero-bubble's split backward adds per backward compute op of a chunk
    past virtual stage 0, in its weight pass (a profile's ``framework_overheads_s
    ["split_backward"]``, at least 0; 0 without a profile or a split backward).

    torch.distributed.pipelining splits a chunk's backward in Python (torch 2.13,
    distributed/pipelining/_backward.py): the input pass walks the chunk's autograd graph to
    group its weights by the intermediate nodes they hang from (``construct_reverse_graph``,
    ``get_param_groups``) and hooks those nodes; the weight pass runs one autograd traversal per
    group (``stage_backward_weight``). Virtual stage 0 has no input gradient: its backward runs
    whole in the weight pass (``_PipelineStageBase.backward_one_chunk``), at no extra cost. So
    the cost follows the chunk's graph, not the micro-batch: on this project's 2-core guest the
    tiny GPT's last stage (35 weights in 18 groups) took 0.6 ms for a plain backward of one
    micro-batch and 1.6 ms split, 0.8 and 2.0 ms at twice the micro-batch."""
    if not sc.plan.split_backward or cost.profile is None:
        return 0.0
    return max(0.0, cost.profile.framework_overheads_s.get(SPLIT_LAYER, 0.0))


def sync_wait_part(plan: ParallelPlan) -> str:
    """The breakdown part the sync-point waits belong to: the TP/CP collectives that are the
    sync points, or (ZeRO-3 without them) the parameter gathers."""
    return "tp_comm" if plan.tp * plan.cp > 1 else "dp_comm"


def sync_wait_fraction(sc: Scenario, cost: CostModel) -> float:
    """Wait at the per-layer sync points of this plan per second of compute (profile's
    ``sync_wait_fractions`` of its software layers); 0 otherwise."""
    fr = cost.profile.sync_wait_fractions if cost.profile else {}
    return sum(fr.get(k, 0.0) for k in wait_keys(sc.plan))


def sync_call_wait(sc: Scenario, cost: CostModel) -> float:
    """Fixed wait per collective call of a layer's op lists (TP, CP and expert-parallel; a ring's
    send/receive counts twice, as simdist.analytic.cpu_syncs counts sync points) that a
    calibration profile measured for this plan's software layers (``sync_point_waits_s``; the
    pipeline's layers' are per pipeline transfer, :func:`transfer_wait`, FSDP2's per collective
    of its own, :func:`gather_wait`); 0 otherwise."""
    return _point_waits(sc, cost, "call")


def transfer_wait(sc: Scenario, cost: CostModel) -> float:
    """Fixed wait per pipeline transfer (activation or gradient between stages) that a
    calibration profile measured for this plan's pipeline layers (``sync_point_waits_s`` of
    :data:`simdist.spec.profile.TRANSFER_TERMS`: the pipeline's, and the multi-chunk schedules'
    on top): on gloo the receiving rank sleeps in the transfer and is woken when it completes, a
    cost of each transfer whatever the micro-batch's compute, which a share of compute would
    price wrongly at other sizes; 0 without a profile."""
    return _point_waits(sc, cost, "transfer")


def gather_wait(sc: Scenario, cost: CostModel) -> float:
    """Fixed wait per FSDP2 collective (a module's all-gather before its forward and before its
    backward, its gradients' reduce-scatter after it) that a calibration profile measured for
    the plan's FSDP2 layers (``sync_point_waits_s`` of :data:`HOOK_LAYERS`): on gloo the rank
    sleeps in each until gloo's thread wakes it, whatever the module's compute, which a share of
    compute priced wrongly at other sizes (a tiny ZeRO-3 plan's waits 27% of its compute, and
    the large one's far less); 0 without a profile."""
    return _point_waits(sc, cost, "gather")


def _point_waits(sc: Scenario, cost: CostModel, where: str) -> float:
    """The profile's ``sync_point_waits_s`` of this plan's layers whose sync points are ``where``:
    pipeline transfers ("transfer"), FSDP2's collectives ("gather") or the collective calls of
    the layers' op lists ("call")."""
    per_point = cost.profile.sync_point_waits_s if cost.profile else {}
    return sum(per_point.get(k, 0.0) for k in wait_keys(sc.plan) if sync_points(k) == where)
