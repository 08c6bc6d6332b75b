"""Activation memory: what one layer saves for backward (tensor by tensor), what the LM head and
the loss keep, and how many micro-batches a pipeline stage holds at its peak.

Sources
- Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
  (arXiv:2205.05198) Table 2: per-layer activations sbh(34 + 5as/h) bytes, with tensor
  parallelism sbh(10 + 24/t + 5as/(ht)), with sequence parallelism sbh(34/t + 5as/(ht)),
  selective recompute drops the 5as/h term, full recompute keeps 2sbh; sec 4.2.3 for the
  micro-batches in flight under 1F1B and the interleaved schedule; sec 4.3 for the fp32 logits.
- torchtitan's per-op selective policy (torchtitan parallelize_llama, ``_save_list``): save the
  outputs of attention, of reduce-scatters and of every other matmul; recompute the rest.
- FP8 widths of saved GEMM inputs: simdist.analytic.fp8_memory.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import accumulate
from operator import sub

from simdist.analytic.eager import mlp_hidden_saved
from simdist.analytic.fp8_memory import (
    linear_weight_params,
    saved_fp8_weight_bytes,
    saved_input_bytes,
)
from simdist.analytic.memory_conventions import conventions
from simdist.analytic.variant_memory import (  # contract v1.2: experts, MLA, windows, cp
    largest_layer_activation_bytes,
    mtp_activation_bytes,
    stage_layer_activation_bytes,
)
from simdist.analytic.variants import plain
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan
from simdist.spec.stages import stage_layer_ranges

Tensors = list[tuple[str, float]]  # (name, bytes) of each tensor, per micro-batch, on one GPU


def _split(plan: ParallelPlan) -> int:
    """What tensor parallelism divides the replicated activations by (sequence parallelism)."""
    return plan.tp if (plan.sequence_parallel and plan.tp > 1) else 1


def layer_saved_tensors(m: ModelSpec, plan: ParallelPlan, recompute: str | None = None) -> Tensors:
    """The tensors one layer saves for backward, per micro-batch, on one GPU.

    Korthikanti Table 2 term by term, generalised to GQA, SwiGLU, no dropout and fused (Flash)
    attention: with ``e`` bytes per activation (2 in 16-bit training),
      norms' inputs 2·e·sbh, QKV and MLP GEMM inputs 2·e·sbh, dropout masks 2·sbh (replicated
      across TP unless sequence parallel), Q/K/V e·sb(h+2kv), attention output e·sbh,
      MLP hidden 2·e·sbf (GELU: its input and output) or 4·e·sbf (SwiGLU eager: gate, up,
      silu(gate), product; 3·e·sbf fused, simdist.analytic.eager.mlp_hidden_saved), and the
      attention core: 5as²b (softmax output, dropout mask and output) for
      explicit attention, or only the log-sum-exp (4·asb) for FlashAttention.
    In FP8 the GEMM inputs (QKV and MLP inputs, the projection's input, the last MLP GEMM's
    input) are saved at the recipe's width (FlashAttention still keeps its 16-bit output).
    """
    recompute = plan.recompute if recompute is None else recompute
    t, cp = plan.tp, plan.cp
    e = plan.element_bytes
    s, b = m.seq_length // cp, plan.micro_batch_size
    h, kv, a = m.hidden_size, m.kv_dim, m.num_attention_heads
    f = m.ffn_hidden_size * m.experts_per_token
    sbh = s * b * h
    split = _split(plan)
    if recompute == "full":
        return [("layer input", e * sbh / split)]  # only the layer's input is kept
    if recompute == "selective" and conventions(plan).selective == "every-other-matmul":
        return _every_other_matmul(m, plan)
    w = saved_input_bytes(plan)
    out: Tensors = [("norm input", e * sbh / split)] * 2
    out += [("QKV input", w * sbh / split), ("MLP input", w * sbh / split)]
    if m.dropout:
        out += [("dropout mask", sbh / split)] * 2
    out += [("Q", e * s * b * h / t), ("K", e * s * b * kv / t), ("V", e * s * b * kv / t)]
    if plan.flash_attention:
        out.append(("attention output", e * sbh / t))
        if w < e:
            out.append(("projection input", w * sbh / t))
    else:
        out.append(("attention output", w * sbh / t))
    sbf = s * b * f / t
    out += [(name, e * sbf) for name in mlp_hidden_saved(m.mlp, plan)] + [("last MLP GEMM input", w * sbf)]
    if plan.flash_attention:
        out.append(("log-sum-exp", 4 * a * s * b / t))  # fp32 per row
    elif recompute != "selective":  # selective: the s^2 attention core is recomputed in backward
        # softmax output e·as²b; with dropout also its 1-byte mask and its output
        out += [("softmax", e * a * s * s * b / t)]
        if m.dropout:
            out += [("attention dropout mask", a * s * s * b / t), ("attention dropout output", e * a * s * s * b / t)]
    return out


def _every_other_matmul(m: ModelSpec, plan: ParallelPlan) -> Tensors:
    """torchtitan's per-op policy on a Llama layer: the layer input, attention's output and
    log-sum-exp, and the outputs of the 1st, 3rd, 5th ... matmul (q, v, the first MLP matmul, and
    for SwiGLU the last), row-parallel matmuls' outputs before their reduce-scatter (whole h per
    rank) and the reduce-scatter's output. The rule is applied to the layer's linears whatever
    their precision: torchtitan measured the same memory for its Float8 runs (Tables 1 and 3)."""
    t, e = plan.tp, plan.element_bytes
    s, b = m.seq_length // plan.cp, plan.micro_batch_size
    sb, h, q = s * b, m.hidden_size, m.num_attention_heads * m.head_dim
    f = m.ffn_hidden_size * m.experts_per_token
    rs = [("reduce-scatter output", e * sb * h / t)] if t > 1 else []
    linears: list[Tensors] = [[("q", e * sb * q / t)], [("k", e * sb * m.kv_dim / t)], [("v", e * sb * m.kv_dim / t)],
                              [("o (partial)", e * sb * h), *rs]]
    linears += [[("gate", e * sb * f / t)], [("up", e * sb * f / t)]] if m.mlp == "swiglu" else [[("fc1", e * sb * f / t)]]
    linears += [[("down (partial)", e * sb * h), *rs]]
    out: Tensors = [("layer input", e * sb * h / _split(plan)), ("attention output", e * sb * q / t),
                    ("log-sum-exp", 4 * m.num_attention_heads * sb / t)]
    for i, tensors in enumerate(linears):
        if i % 2 == 0:  # the 1st, 3rd, ... matmul of the layer
            out += tensors
    return out


def layer_activation_bytes(m: ModelSpec, plan: ParallelPlan, recompute: str | None = None) -> float:
    """Activations one layer saves for backward, per micro-batch, on one GPU
    (:func:`layer_saved_tensors` summed)."""
    return sum(n for _, n in layer_saved_tensors(m, plan, recompute))


def logits_elements(m: ModelSpec, plan: ParallelPlan) -> float:
    """Logit entries per GPU and micro-batch: s·b·V over the vocabulary shards (Megatron's
    vocabulary-parallel cross entropy; torchtitan's loss_parallel with tensor parallelism)."""
    return m.seq_length // plan.cp * plan.micro_batch_size * m.vocab_size / plan.tp


def head_saved_tensors(m: ModelSpec, plan: ParallelPlan) -> Tensors:
    """Last stage: the final norm's and the LM head's inputs and what the loss keeps for backward:
    the fp32 logits (Korthikanti sec 4.3; Megatron's cross entropy keeps its fp32 softmax), or
    PyTorch's fp32 log-softmax output."""
    e = plan.element_bytes
    sbh = m.seq_length // plan.cp * plan.micro_batch_size * m.hidden_size
    split = _split(plan)
    if conventions(plan).loss == "torch":  # torchtitan's LM head all-gathers its input (ColwiseParallel)
        return [("final norm input", e * sbh / split), ("LM head input", e * sbh),
                ("log-softmax (fp32)", 4 * logits_elements(m, plan))]
    return [("final norm input", e * sbh / split), ("LM head input", e * sbh / split),
            ("logits (fp32)", 4 * logits_elements(m, plan))]


def head_activation_bytes(m: ModelSpec, plan: ParallelPlan) -> float:
    return sum(n for _, n in head_saved_tensors(m, plan))


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


def layers_held(m: ModelSpec, plan: ParallelPlan, stage: int) -> int:
    """Layer x micro-batch activation sets the stage holds at its peak: the micro-batches in
    flight times the stage's layers, or under the interleaved schedule the layers of the chunk
    forwards alive at once (:func:`interleaved_layers_held`)."""
    ranges = stage_layer_ranges(m.num_layers, plan.pp, plan.virtual_pipeline_stages, plan.pipeline_layout)[stage]
    if plan.virtual_pipeline_stages == 1:
        return in_flight(plan, stage) * sum(len(r) for r in ranges)
    if plan.interleaved:
        return interleaved_layers_held(plan, stage, tuple(len(r) for r in ranges))
    return in_flight(plan, stage) * max(len(r) for r in ranges)


def interleaved_layers_held(plan: ParallelPlan, stage: int, chunk_layers: tuple[int, ...]) -> int:
    """Peak of the layers whose activations the stage holds under Megatron's interleaved 1F1B.

    Forwards run in groups of p micro-batches through chunk 0, 1, ..., v-1 in turn, backwards in
    the reverse chunk order (Narayanan et al. SC'21 sec 2.2.2; Megatron-Core
    schedules.forward_backward_pipelining_with_interleaving, whose micro-batch group per chunk,
    ``microbatch_group_size_per_vp_stage``, defaults to the pipeline size); :func:`in_flight`
    chunk forwards warm up, then each forward follows a backward. Each live chunk forward holds
    its own chunk's layers, so chunks of unequal size (pp*v not dividing the layers, or the
    first and last chunks left without layers for the embedding and the LM head, Llama 3 sec
    3.3.2) count what they hold, not the largest chunk's. The live set repeats every p*v units
    of the steady state, so two such periods past the warm-up find the peak."""
    return _interleaved_peak(plan.pp, plan.num_microbatches, in_flight(plan, stage), chunk_layers)


@lru_cache(maxsize=8192)  # a search's plans that differ in ZeRO, recompute or SP share the walk
def _interleaved_peak(p: int, m: int, warm: int, chunk_layers: tuple[int, ...]) -> int:
    v = len(chunk_layers)
    n = min(m * v, warm + 2 * p * v)
    f = min(warm, n)
    # the k-th forward runs chunk (k // p) % v, the k-th backward the reverse: groups of p
    # micro-batches go through the chunks in turn
    fwd = [chunk_layers[(k // p) % v] for k in range(n)]
    bwd = [chunk_layers[v - 1 - (k // p) % v] for k in range(n - f)]
    # the layers held after the warm-up, then after each backward and the forward that follows it
    # (the backwards after the last forward only free layers)
    return max(accumulate(map(sub, fwd[f:], bwd), initial=sum(fwd[:f])))


def pipeline_outputs_bytes(m: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """torch.distributed.pipelining's last stage keeps each micro-batch's output (the 16-bit
    logits) in ``output_chunks`` until the step returns: all m of them at the last backward."""
    if plan.pp == 1 or stage != plan.pp - 1 or not conventions(plan).pipeline_keeps_outputs:
        return 0.0
    return plan.num_microbatches * plan.element_bytes * logits_elements(m, plan)


def activation_bytes(m: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    dense = plain(m, plan)  # contract v1.2 layers (experts, MLA, windows, cp) in variant_memory
    per_layer = layer_activation_bytes(m, plan) if dense else stage_layer_activation_bytes(m, plan, stage)
    total = layers_held(m, plan, stage) * (per_layer + saved_fp8_weight_bytes(m, plan))
    if plan.recompute == "full":
        # backward re-runs one layer's forward: its full activations live for that layer
        total += (layer_activation_bytes(m, plan, recompute="none") if dense
                  else largest_layer_activation_bytes(m, plan, "none"))
    if stage == plan.pp - 1:
        # the LM head's inputs and logits stay alive for every micro-batch the last stage holds
        # (one under 1F1B, where each forward is followed by its backward; all m under GPipe)
        held = in_flight(plan, stage) if plan.virtual_pipeline_stages == 1 else 1
        head = head_activation_bytes(m, plan)
        total += held * head + pipeline_outputs_bytes(m, plan, stage) + mtp_activation_bytes(m, plan, stage, head)
    return total


__all__ = [
    "activation_bytes",
    "head_activation_bytes",
    "head_saved_tensors",
    "in_flight",
    "interleaved_layers_held",
    "layer_activation_bytes",
    "layer_saved_tensors",
    "layers_held",
    "linear_weight_params",
    "logits_elements",
    "pipeline_outputs_bytes",
]
