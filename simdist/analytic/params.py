"""Parameter counts: per layer, per pipeline stage, and per rank under tensor parallelism.

Counts are split into the part that tensor parallelism shards (column- and row-parallel
weights, column-parallel biases, the vocabulary-parallel embedding and LM head) and the part
every TP rank replicates (norms, row-parallel biases, learned position embeddings), the
Megatron-LM layout (Shoeybi et al. 2019, sec 3) that the executor's DTensor plan reproduces.
"""

from __future__ import annotations

from functools import cache, lru_cache

from simdist.frozen import frozen
from simdist.spec.layers import moe_count
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan
from simdist.spec.stages import stage_chunks, stage_layer_ranges, virtual_stages  # noqa: F401 (re-exported)


@frozen(slots=True)
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
    """Wq, Wk, Wv (column-parallel) and Wo (row-parallel) with heads of head_dim; multi-head
    latent attention's projections in :func:`mla_params`."""
    if m.attention == "mla":
        return mla_params(m)
    h, kv, q = m.hidden_size, m.kv_dim, m.num_attention_heads * m.head_dim
    weights = h * q + 2 * h * kv + q * h
    col_bias = (q + 2 * kv) if m.bias else 0
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


# --- contract v1.2: multi-head latent attention and experts ---------------------------------


def mla_params(m: ModelSpec) -> ParamCount:
    """One MLA block's weights (no biases): TP-sharded up/output projections, replicated down
    projections and their RMSNorms (Megatron-Core's layout)."""
    h, a, d, r = m.hidden_size, m.num_attention_heads, m.head_dim, m.qk_rope_head_dim
    v, kvr, qr = m.v_head_dim, m.kv_lora_rank, m.q_lora_rank
    q_up = (qr if qr else h) * a * (d + r)
    sharded = q_up + kvr * a * (d + v) + a * v * h
    replicated = (h * qr + qr if qr else 0) + h * (kvr + r) + kvr
    return ParamCount(sharded, replicated)


def expert_mlp_params(m: ModelSpec) -> ParamCount:
    """One expert's FFN (moe_ffn_hidden_size wide): gate/up (SwiGLU) or fc1, and down."""
    h, f = m.hidden_size, m.moe_ffn_hidden_size
    n_in = 2 if m.mlp == "swiglu" else 1
    return ParamCount(n_in * h * f + f * h + (n_in * f if m.bias else 0), h if m.bias else 0)


def router_params(m: ModelSpec) -> ParamCount:
    """The router's (hidden x experts) weight, replicated over tensor parallelism (+ a bias per
    expert where the model has biases, GPT-OSS)."""
    return ParamCount(0, m.hidden_size * m.num_experts + (m.num_experts if m.bias else 0))


def routed_params(m: ModelSpec) -> ParamCount:
    """Every routed expert of one MoE layer (what expert parallelism splits)."""
    return expert_mlp_params(m) * m.num_experts


def moe_dense_params(m: ModelSpec) -> ParamCount:
    """The parts of an MoE FFN block that are not routed experts: shared experts and router."""
    return expert_mlp_params(m) * m.num_shared_experts + router_params(m)


@cache
def layer_params(m: ModelSpec, moe: bool = False) -> ParamCount:
    """One transformer layer: attention, two norms and the FFN: the dense MLP, or with ``moe``
    every routed expert, the shared experts and the router (simdist.analytic.moe)."""
    ffn = routed_params(m) + moe_dense_params(m) if moe else mlp_params(m)
    return attention_params(m) + ffn + ParamCount(0, 2 * _norm(m))


def layers_params(m: ModelSpec, layers: range | tuple[int, ...]) -> ParamCount:
    """The given layers (by index: the first_dense_layers are dense, the rest MoE)."""
    moe = moe_count(m, layers)
    return layer_params(m, True) * moe + layer_params(m) * (len(layers) - moe)


def expert_params(m: ModelSpec, layers: range | tuple[int, ...]) -> ParamCount:
    """The routed experts of the given layers (what expert parallelism splits)."""
    return routed_params(m) * moe_count(m, layers)


def mtp_params(m: ModelSpec, separate_embedding: bool) -> ParamCount:
    """DeepSeek-V3's multi-token-prediction modules (sec 2.2), on the last pipeline stage: per
    module two RMSNorms, the (2h x h) projection, one layer of the last layer's kind and a final
    norm; the LM head is shared, the embedding too unless it lives on another stage, where a
    copy is kept (Megatron-Core, as for a tied LM head)."""
    if not m.mtp_layers:
        return ZERO
    one = ParamCount(2 * m.hidden_size * m.hidden_size, 3 * _norm(m))
    one = one + layers_params(m, (m.num_layers,))
    emb = ParamCount(m.vocab_size * m.hidden_size, 0) if separate_embedding else ZERO
    return one * m.mtp_layers + emb


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
    """Every parameter (multi-token-prediction modules left out, as DeepSeek-V3's 671B does)."""
    return (layers_params(m, range(m.num_layers)) + embedding_params(m) + head_params(m, False)).total


def stage_num_layers(m: ModelSpec, plan: ParallelPlan, stage: int) -> int:
    return len(stage_layers(m, plan, stage))


# The per-stage counts below read only the pipeline layout (pp, chunks, schedule) and the
# tensor/expert split of the plan: they are memoised on those, so that the plans of a search
# that differ in anything else (ZeRO stage, micro-batch size, recomputation, dp) share them.


def stage_layers(m: ModelSpec, plan: ParallelPlan, stage: int) -> tuple[int, ...]:
    """The layers every chunk of ``stage`` holds (both copies' under DualPipe)."""
    return _stage_layers(m, plan.pp, plan.virtual_pipeline_stages, plan.schedule, stage, plan.pipeline_layout)


@lru_cache(maxsize=4096)
def _stage_layers(m: ModelSpec, pp: int, v: int, schedule: str, stage: int, layout: str | None = None
                  ) -> tuple[int, ...]:
    chunks = stage_chunks(m.num_layers, pp, v, schedule, layout)[stage]
    return tuple(i for _, r in chunks for i in r)


def stage_params(m: ModelSpec, plan: ParallelPlan, stage: int) -> ParamCount:
    """All parameters of one pipeline stage (every chunk it holds), before TP sharding: the
    embedding with virtual stage 0, the LM head (and MTP modules) with the last one."""
    return _stage_params(m, plan.pp, plan.virtual_pipeline_stages, plan.schedule, stage, plan.pipeline_layout)


@lru_cache(maxsize=4096)
def _stage_params(m: ModelSpec, pp: int, v: int, schedule: str, stage: int, layout: str | None = None) -> ParamCount:
    count = layers_params(m, _stage_layers(m, pp, v, schedule, stage, layout))
    chunks = stage_chunks(m.num_layers, pp, v, schedule, layout)[stage]
    n = virtual_stages(pp, v, schedule)
    if any(vs == 0 for vs, _ in chunks):
        count = count + embedding_params(m)
    if any(vs == n - 1 for vs, _ in chunks):
        count = count + head_params(m, separate_copy=pp > 1) + mtp_params(m, pp > 1)
    return count


def stage_expert_params(m: ModelSpec, plan: ParallelPlan, stage: int) -> ParamCount:
    """The routed experts of one stage (MTP modules included), before expert parallelism."""
    return _stage_expert_params(m, plan.pp, plan.virtual_pipeline_stages, plan.schedule, stage, plan.pipeline_layout)


@lru_cache(maxsize=4096)
def _stage_expert_params(m: ModelSpec, pp: int, v: int, schedule: str, stage: int, layout: str | None = None
                         ) -> ParamCount:
    count = expert_params(m, _stage_layers(m, pp, v, schedule, stage, layout))
    chunks = stage_chunks(m.num_layers, pp, v, schedule, layout)[stage]
    last = virtual_stages(pp, v, schedule) - 1
    if any(vs == last for vs, _ in chunks) and m.mtp_layers:
        count = count + expert_params(m, (m.num_layers,)) * m.mtp_layers
    return count


def expert_params_per_rank(m: ModelSpec, plan: ParallelPlan, stage: int) -> int:
    """Routed-expert parameters one GPU of ``stage`` holds: num_experts / ep experts of each MoE
    layer, each FFN split over etp (Megatron-Core's expert layout, simdist.spec.groups)."""
    return stage_expert_params(m, plan, stage).per_tp_rank(plan.etp) // plan.ep


def params_per_rank(m: ModelSpec, plan: ParallelPlan, stage: int) -> int:
    """Parameters held by one GPU of ``stage`` before any ZeRO/FSDP sharding: the dense ones
    split over tp, the routed experts over ep and etp."""
    return _params_per_rank(m, plan.pp, plan.virtual_pipeline_stages, plan.schedule, plan.tp, plan.ep,
                            plan.etp, stage, plan.pipeline_layout)


@lru_cache(maxsize=4096)
def _params_per_rank(m: ModelSpec, pp: int, v: int, schedule: str, tp: int, ep: int, etp: int, stage: int,
                     layout: str | None = None) -> int:
    experts = _stage_expert_params(m, pp, v, schedule, stage, layout)
    params = _stage_params(m, pp, v, schedule, stage, layout)
    dense = ParamCount(params.sharded - experts.sharded, params.replicated - experts.replicated)
    return dense.per_tp_rank(tp) + experts.per_tp_rank(etp) // ep


def matrix_shapes(m: ModelSpec) -> list[tuple[int, int, int]]:
    """(rows, cols, count per layer) of every weight matrix of a layer (for Adafactor/PowerSGD);
    MoE models: an MoE layer's experts (routed and shared)."""
    h, kv, f = m.hidden_size, m.kv_dim, m.ffn_hidden_size
    q = m.num_attention_heads * m.head_dim
    n_in = 2 if m.mlp == "swiglu" else 1
    if m.is_moe:
        f, experts = m.moe_ffn_hidden_size, m.num_experts + m.num_shared_experts
    else:
        experts = 1
    shapes = [(q, h, 1), (h, q, 1), (kv, h, 2), (f, h, n_in * experts), (h, f, experts)]
    return shapes
