"""Parameter counts: per layer, per pipeline stage, and per rank under tensor parallelism.

Counts are split into the part that tensor parallelism shards (column- and row-parallel
weights, column-parallel biases, the vocabulary-parallel embedding and LM head) and the part
every TP rank replicates (norms, row-parallel biases, learned position embeddings), the
Megatron-LM layout (Shoeybi et al. 2019, sec 3) that the executor's DTensor plan reproduces.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan
from simdist.spec.stages import stage_layer_ranges


@dataclass(frozen=True, slots=True)
class ParamCount:
    sharded: int  # split across the TP group
    replicated: int  # held whole by every TP rank

    @property
    def total(self) -> int:
        return self.sharded + self.replicated

    def per_tp_rank(self, tp: int) -> int:
        return self.sharded // tp + self.replicated

    def __add__(self, other: ParamCount) -> ParamCount:
        return ParamCount(self.sharded + other.sharded, self.replicated + other.replicated)

    def __mul__(self, k: int) -> ParamCount:
        return ParamCount(self.sharded * k, self.replicated * k)


ZERO = ParamCount(0, 0)


def _norm(m: ModelSpec) -> int:
    return 2 * m.hidden_size if m.norm == "layernorm" else m.hidden_size


def attention_params(m: ModelSpec) -> ParamCount:
    h, kv = m.hidden_size, m.kv_dim
    weights = h * h + 2 * h * kv + h * h  # Wq, Wk, Wv (column-parallel), Wo (row-parallel)
    col_bias = (h + 2 * kv) if m.bias else 0
    row_bias = h if m.bias else 0
    return ParamCount(weights + col_bias, row_bias)


def mlp_params(m: ModelSpec) -> ParamCount:
    """One expert's MLP. GELU: fc1 (h->f) + fc2 (f->h); SwiGLU: gate + up (h->f) + down (f->h)."""
    h, f = m.hidden_size, m.ffn_hidden_size
    n_in = 2 if m.mlp == "swiglu" else 1
    weights = n_in * h * f + f * h
    col_bias = n_in * f if m.bias else 0
    row_bias = h if m.bias else 0
    return ParamCount(weights + col_bias, row_bias)


@cache
def layer_params(m: ModelSpec) -> ParamCount:
    """One transformer layer: attention, MLP (x experts for MoE, plus the router), two norms."""
    mlp = mlp_params(m) * m.num_experts
    router = ParamCount(0, m.hidden_size * m.num_experts) if m.num_experts > 1 else ZERO
    return attention_params(m) + mlp + router + ParamCount(0, 2 * _norm(m))


def embedding_params(m: ModelSpec) -> ParamCount:
    """Token embedding (vocabulary-parallel) and learned positions (replicated)."""
    pos = m.seq_length * m.hidden_size if m.position_embedding == "learned" else 0
    return ParamCount(m.vocab_size * m.hidden_size, pos)


def head_params(m: ModelSpec, separate_copy: bool) -> ParamCount:
    """Final norm and LM head. A tied head adds no parameters unless it lives on another
    pipeline stage than the embedding, where Megatron keeps a synchronised copy."""
    head = m.vocab_size * m.hidden_size if (not m.tie_embeddings or separate_copy) else 0
    return ParamCount(head, _norm(m))


def total_params(m: ModelSpec) -> int:
    return (layer_params(m) * m.num_layers + embedding_params(m) + head_params(m, False)).total


def stage_num_layers(m: ModelSpec, plan: ParallelPlan, stage: int) -> int:
    ranges = stage_layer_ranges(m.num_layers, plan.pp, plan.virtual_pipeline_stages)
    return sum(len(r) for r in ranges[stage])


def stage_params(m: ModelSpec, plan: ParallelPlan, stage: int) -> ParamCount:
    """All parameters of one pipeline stage (every chunk it holds), before TP sharding."""
    count = layer_params(m) * stage_num_layers(m, plan, stage)
    if stage == 0:
        count = count + embedding_params(m)
    if stage == plan.pp - 1:  # the last virtual stage lives on the last physical stage
        count = count + head_params(m, separate_copy=plan.pp > 1)
    return count


def params_per_rank(m: ModelSpec, plan: ParallelPlan, stage: int) -> int:
    """Parameters held by one GPU of ``stage`` before any ZeRO/FSDP sharding."""
    return stage_params(m, plan, stage).per_tp_rank(plan.tp)


def matrix_shapes(m: ModelSpec) -> list[tuple[int, int, int]]:
    """(rows, cols, count per layer) of every weight matrix of a layer (for Adafactor/PowerSGD)."""
    h, kv, f = m.hidden_size, m.kv_dim, m.ffn_hidden_size
    n_in = 2 if m.mlp == "swiglu" else 1
    shapes = [(h, h, 2), (kv, h, 2), (f, h, n_in * m.num_experts), (h, f, m.num_experts)]
    return shapes
