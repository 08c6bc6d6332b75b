"""Memory per GPU: model states (ZeRO paper accounting), activations (Korthikanti et al. 2022),
the micro-batches each pipeline schedule keeps in flight, and transient buffers.

Sources
- Rajbhandari et al., "ZeRO" (SC'20, arXiv:1910.02054) sec 3 and Fig. 1: mixed-precision Adam
  holds 2 B (16-bit params) + 2 B (16-bit grads) + K=12 B (fp32 master, momentum, variance)
  per parameter; ZeRO-1/2/3 shard the optimizer states / + gradients / + parameters over N_d.
- Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
  (arXiv:2205.05198) Table 2: per-layer activations sbh(34 + 5as/h) bytes, with tensor
  parallelism sbh(10 + 24/t + 5as/(ht)), with sequence parallelism sbh(34/t + 5as/(ht)),
  selective recompute drops the 5as/h term, full recompute keeps 2sbh; sec 4.2.3 for the
  micro-batches in flight under 1F1B and the interleaved schedule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simdist.analytic.collectives import node_gpus
from simdist.analytic.compression import error_feedback_bytes
from simdist.analytic.param_server import ps_server_count
from simdist.analytic.params import (
    matrix_shapes,
    total_params,
)
from simdist.analytic.variant_memory import (  # contract v1.2: experts, MLA, windows, cp
    buffer_bytes,
    largest_layer_activation_bytes,
    layer_state_params,
    mtp_activation_bytes,
    stage_layer_activation_bytes,
    state_params,
)
from simdist.analytic.variants import plain
from simdist.spec.cluster import ClusterSpec
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan
from simdist.spec.stages import stage_layer_ranges


@dataclass(frozen=True, slots=True)
class StateBytes:
    """Bytes per parameter for each model state (before any ZeRO sharding)."""

    params: float
    grads: float
    optimizer: float  # optimizer states incl. the fp32 master copy in mixed precision


def optimizer_state_bytes_per_param(m: ModelSpec, optimizer: str) -> float:
    """fp32 optimizer states per parameter (without the master copy).

    adam/adamw/lamb: momentum + variance, 8 B (Kingma & Ba 2015; You et al. 2020 for LAMB);
    sgd (with momentum) and lars: momentum, 4 B (You et al. 2017 for LARS);
    adafactor with momentum: 4 B + factored second moments, 4(r+c) B per r x c matrix
    (Shazeer & Stern 2018), i.e. "slightly more than 4" as the Hugging Face docs say.
    """
    if optimizer in ("adam", "adamw", "lamb"):
        return 8.0
    if optimizer in ("sgd", "lars"):
        return 4.0
    if optimizer == "adafactor":
        entries = sum(r * c * n for r, c, n in matrix_shapes(m))
        factored = sum(4 * (r + c) * n for r, c, n in matrix_shapes(m))
        return 4.0 + factored / entries
    raise ValueError(optimizer)


def state_bytes(m: ModelSpec, plan: ParallelPlan) -> StateBytes:
    """The working weights (fp32, or 16-bit: FP8 weights are transient casts of 16-bit
    parameters), the gradient buffer, and the optimizer states with the fp32 master copy that
    mixed-precision training keeps (none in fp32 training)."""
    master = 4.0 if plan.mixed_precision else 0.0
    return StateBytes(float(plan.element_bytes), float(plan.grad_buffer_bytes),
                      master + optimizer_state_bytes_per_param(m, plan.optimizer))


def optimizer_shard_params(m: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """Parameters whose optimizer states one GPU of ``stage`` owns (its ZeRO partition)."""
    return state_params(m, plan, stage, plan.shards_optimizer)


def model_state_bytes(m: ModelSpec, plan: ParallelPlan, stage: int = 0,
                      cluster: ClusterSpec | None = None) -> dict[str, float]:
    """Bytes of params, grads and optimizer states on one GPU of ``stage``, and what the plan
    keeps off the GPU: ``host_params`` / ``host_optimizer`` (host memory, per GPU) and
    ``nvme`` (NVMe, per GPU).

    ZeRO stage z shards, over the shard group (``dp_shard``, all of dp by default; FSDP
    HYBRID_SHARD / HSDP replicate across dp/dp_shard groups, Zhao et al. VLDB 2023 sec 3.2.2):
    z>=1 the optimizer states, z>=2 the gradients, z=3 the parameters, so the model states of
    mixed-precision Adam take 16P/dp_shard per GPU under ZeRO-3.
    Offload (plan.offload):
    - optimizer on cpu (ZeRO-Offload, Ren et al. USENIX ATC'21 sec 4.1): the fp32 master weights
      and optimizer states of the GPU's partition move to host memory with an fp32 gradient
      buffer for the CPU step (16 B per parameter for Adam, DeepSpeed's
      estimate_zero2_model_states_mem_needs); the GPU keeps its 16-bit parameters and, for the
      gradients, only the buckets in flight to the host;
    - optimizer on nvme (ZeRO-Infinity, Rajbhandari et al. SC'21): the same states on NVMe;
    - params on cpu/nvme (ZeRO-Infinity; FSDP CPUOffload): the 16-bit parameter shard leaves the
      GPU; the gathered layers in use stay in ``transient_bytes``.
    Parameter servers (plan.gradient_sync) keep the fp32 parameters, the optimizer states and an
    fp32 gradient sum on the servers' hosts (Li et al. OSDI'14); the workers hold no optimizer
    states. Their host share is reported per GPU when ``cluster`` is given.
    """
    b = state_bytes(m, plan)
    out = {  # dense states sharded over dp_shard (*cp), experts over their own group (v1.2)
        "params": state_params(m, plan, stage, plan.shards_params) * b.params,
        "grads": state_params(m, plan, stage, plan.shards_gradients) * b.grads,
        "optimizer": state_params(m, plan, stage, plan.shards_optimizer) * b.optimizer,
        "host_params": 0.0,
        "host_optimizer": 0.0,
        "nvme": 0.0,
    }
    if plan.offload.optimizer != "none":
        offloaded = out["optimizer"] + 4.0 * optimizer_shard_params(m, plan, stage)  # + fp32 gradients
        out["host_optimizer" if plan.offload.optimizer == "cpu" else "nvme"] = offloaded
        out["optimizer"] = 0.0
        out["grads"] = min(out["grads"], 2 * plan.ddp_bucket_size_bytes)
    if plan.offload.params != "none":
        out["host_params" if plan.offload.params == "cpu" else "nvme"] += out["params"]
        out["params"] = 0.0
    if plan.uses_parameter_servers:
        out["optimizer"] = 0.0
        if cluster is not None:
            servers = ps_server_count(plan, cluster)
            per_node = math.ceil(servers / cluster.num_nodes)
            per_server = total_params(m) * (b.optimizer + 4.0) / servers
            out["host_optimizer"] = per_server * per_node / node_gpus(cluster)
    return out


# --- activations ----------------------------------------------------------------------------


def layer_activation_bytes(m: ModelSpec, plan: ParallelPlan, recompute: str | None = None) -> float:
    """Activations one layer saves for backward, per micro-batch, on one GPU.

    Korthikanti Table 2 term by term, generalised to GQA, SwiGLU, no dropout and fused
    (Flash) attention: with ``e`` bytes per activation (2 in 16-bit training),
      norms' inputs 2·e·sbh, QKV and MLP GEMM inputs 2·e·sbh, dropout masks 2·sbh  (replicated
      across TP unless sequence parallel), Q/K/V e·sb(h+2kv), attention output e·sbh,
      MLP hidden 2·e·sbf (GELU: its input and output) or 4·e·sbf (SwiGLU: gate, up, silu(gate),
      product), and the attention core: 5as²b (softmax output, dropout mask and output) for
      explicit attention, or only the log-sum-exp (4·asb) for FlashAttention.
    """
    recompute = plan.recompute if recompute is None else recompute
    t, cp = plan.tp, plan.cp
    e = plan.element_bytes
    s, b = m.seq_length // cp, plan.micro_batch_size
    h, kv, a = m.hidden_size, m.kv_dim, m.num_attention_heads
    f = m.ffn_hidden_size * m.experts_per_token
    sbh = s * b * h
    split_replicated = t if (plan.sequence_parallel and t > 1) else 1
    if recompute == "full":
        return e * sbh / split_replicated  # only the layer's input is kept
    drop = 2 * sbh if m.dropout else 0
    replicated = 2 * e * sbh + 2 * e * sbh + drop
    mlp_hidden = (4 if m.mlp == "swiglu" else 2) * e * s * b * f
    sharded = e * s * b * (h + 2 * kv) + e * sbh + mlp_hidden
    if plan.flash_attention:
        core = 4 * a * s * b  # fp32 log-sum-exp per row
    elif recompute == "selective":
        core = 0  # the s^2 attention core is recomputed in backward
    else:
        # softmax output e·as²b; with dropout also its 1-byte mask and its output
        core = (e + (1 + e if m.dropout else 0)) * a * s * s * b
    return replicated / split_replicated + (sharded + core) / t


def head_activation_bytes(m: ModelSpec, plan: ParallelPlan) -> float:
    """Last stage: final-norm input, LM-head input and fp32 logits 4·sbV/t (Korthikanti sec 4.3)."""
    e, t = plan.element_bytes, plan.tp
    s, b = m.seq_length // plan.cp, plan.micro_batch_size
    split = t if (plan.sequence_parallel and t > 1) else 1
    return 2 * e * s * b * m.hidden_size / split + 4 * s * b * m.vocab_size / t


def in_flight(plan: ParallelPlan, stage: int) -> int:
    """Micro-batch x chunk forwards whose activations a stage holds at its peak.

    GPipe keeps all m; 1F1B and ZB-H1 keep p - stage (Narayanan et al. 2021 sec 2.2;
    Qi et al. 2024); Megatron's interleaved schedule warms up (p - stage - 1)*2 + (v-1)*p
    chunk forwards and holds one more before its first backward.
    """
    p, m, v = plan.pp, plan.num_microbatches, plan.virtual_pipeline_stages
    if p == 1:
        return 1
    if plan.dualpipe:  # DualPipe README: pp + 1 micro-batches of a rank's stage (v1.2)
        return min(p + 1, m)
    if plan.schedule == "gpipe":
        return m
    if plan.interleaved:
        return min(m * v, (p - stage - 1) * 2 + (v - 1) * p + 1)
    return min(p - stage, m)


@dataclass(frozen=True, slots=True)
class StageMemory:
    stage: int
    params: float
    grads: float
    optimizer: float
    activations: float
    other: float
    host: float = 0.0  # offloaded states on the host (per GPU)
    nvme: float = 0.0  # offloaded states on NVMe (per GPU)

    @property
    def peak(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.other


def activation_bytes(m: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    ranges = stage_layer_ranges(m.num_layers, plan.pp, plan.virtual_pipeline_stages)[stage]
    layers_per_chunk = max(len(r) for r in ranges)
    per_layer = layer_activation_bytes(m, plan) if plain(m, plan) else stage_layer_activation_bytes(m, plan, stage)
    chunks_in_flight = in_flight(plan, stage)
    if plan.virtual_pipeline_stages == 1:
        total = chunks_in_flight * sum(len(r) for r in ranges) * per_layer
    else:
        total = chunks_in_flight * layers_per_chunk * per_layer
    if plan.recompute == "full":
        # backward re-runs one layer's forward: its full activations live for that layer
        total += (layer_activation_bytes(m, plan, recompute="none") if plain(m, plan)
                  else largest_layer_activation_bytes(m, plan, "none"))
    if stage == plan.pp - 1:
        # the LM head's inputs and logits stay alive for every micro-batch the last stage holds
        # (one under 1F1B, where each forward is followed by its backward; all m under GPipe)
        held = in_flight(plan, stage) if plan.virtual_pipeline_stages == 1 else 1
        total += held * head_activation_bytes(m, plan)
        total += mtp_activation_bytes(m, plan, stage, head_activation_bytes(m, plan))
    return total


def transient_bytes(m: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """Working buffers beyond saved activations and states, and the gradient compressor's
    error-feedback residuals and factors (compression.error_feedback_bytes)."""
    b = state_bytes(m, plan)
    out = error_feedback_bytes(m, plan, stage) if plan.dp > 1 or plan.uses_parameter_servers else 0.0
    if plan.shards_params:
        # the current and the prefetched layer's gathered parameters, and one layer's
        # unsharded gradients before their reduce-scatter
        layer = layer_state_params(m, plan)
        out += layer * (2 * b.params + b.grads)
    if stage == plan.pp - 1:
        # gradient of the fp32 logits during the LM head's backward
        s, mb = m.seq_length // plan.cp, plan.micro_batch_size
        out += 4 * s * mb * m.vocab_size / plan.tp
    if not plain(m, plan):
        out += buffer_bytes(m, plan)
    return out


def stage_memory(m: ModelSpec, plan: ParallelPlan, stage: int, cluster: ClusterSpec | None = None) -> StageMemory:
    states = model_state_bytes(m, plan, stage, cluster)
    return StageMemory(
        stage=stage,
        params=states["params"],
        grads=states["grads"],
        optimizer=states["optimizer"],
        activations=activation_bytes(m, plan, stage),
        other=transient_bytes(m, plan, stage),
        host=states["host_params"] + states["host_optimizer"],
        nvme=states["nvme"],
    )


def memory_per_stage(m: ModelSpec, plan: ParallelPlan, cluster: ClusterSpec | None = None) -> list[StageMemory]:
    return [stage_memory(m, plan, s, cluster) for s in range(plan.pp)]
