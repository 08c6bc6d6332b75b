"""ModelSpec: the architecture of a decoder-only transformer, independent of hardware and plan.

Dense GPT/Llama-style models, and (contract v1.2) what newer models add: an explicit head
dimension (Qwen3, GPT-OSS), sliding-window attention (Mistral, GPT-OSS), multi-head latent
attention (DeepSeek-V2/V3), mixture-of-experts layers (Mixtral, Qwen-MoE, DeepSeek-V3, GPT-OSS)
and multi-token prediction (DeepSeek-V3). ``docs/scenario-format.md`` is the field reference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Literal

from simdist.errors import Problem
from simdist.frozen import frozen
from simdist.spec.fields import hash_once, spec_field, validate

Mlp = Literal["gelu", "swiglu"]
Norm = Literal["layernorm", "rmsnorm"]
PositionEmbedding = Literal["learned", "rope", "alibi"]
Attention = Literal["mha", "mla"]
Router = Literal["softmax", "sigmoid"]

MAX_LAYERS = 1_000_000  # a bound on the work per layer (the simulator walks layers one by one)
_MLA_FIELDS = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "v_head_dim")
_MOE_FIELDS = ("moe_ffn_hidden_size", "num_shared_experts", "first_dense_layers", "moe_load_imbalance",
               "router", "moe_capacity_factor", "moe_router_groups", "moe_router_group_topk")


@hash_once
@frozen(kw_only=True)
class ModelSpec:
    """A decoder-only transformer. Defaults follow the contract: ``num_kv_heads`` = heads,
    ``ffn_hidden_size`` = 4 * hidden, ``head_dim`` = hidden / heads; 0 means "derive it"."""

    name: str = spec_field("custom", doc="label in reports (a preset's or config's name by default)")
    num_layers: int = spec_field(check="positive", doc="transformer blocks")
    hidden_size: int = spec_field(check="positive", doc="model width d")
    num_attention_heads: int = spec_field(check="positive", doc="query heads")
    num_kv_heads: int = spec_field(0, check="positive", doc="key/value heads (fewer = GQA/MQA); default heads")
    ffn_hidden_size: int = spec_field(0, check="positive", doc="MLP width (dense layers); default 4*hidden")
    mlp: Mlp = spec_field("gelu", doc="gelu: two projections; swiglu: three")
    vocab_size: int = spec_field(check="positive", doc="vocabulary (embedding and LM head rows)")
    seq_length: int = spec_field(check="positive", doc="tokens per training sequence")
    tie_embeddings: bool = spec_field(False, doc="LM head shares the input embedding")
    norm: Norm = spec_field("layernorm", doc="layernorm or rmsnorm")
    bias: bool = spec_field(True, doc="biases in the linear layers (GPT-2/3 yes, Llama no)")
    position_embedding: PositionEmbedding = spec_field("learned", doc="learned, rope or alibi")
    dropout: bool = spec_field(False, doc="dropout layers (and their 1-byte masks)")
    num_experts: int = spec_field(1, check="nonneg", doc="routed experts per MoE layer; 0 or 1 = dense")
    experts_per_token: int = spec_field(1, check="positive", doc="top-k routing")
    source: str = spec_field("", compare=False, internal=True, doc="where the figures come from")
    # --- contract v1.2 -------------------------------------------------------------------------
    head_dim: int = spec_field(0, check="positive", since="1.2",
                               doc="per-head dimension (MLA: the non-rotary query/key part); default hidden/heads")
    sliding_window: int | None = spec_field(None, check="positive", since="1.2",
                                            doc="tokens each query attends to in windowed layers")
    sliding_window_layers: int | None = spec_field(None, check="nonneg", since="1.2",
                                                   doc="layers with the window; default all (GPT-OSS: half)")
    attention: Attention = spec_field("mha", since="1.2", doc="mha (with num_kv_heads: GQA/MQA) or mla")
    kv_lora_rank: int = spec_field(0, check="positive", since="1.2", doc="MLA: compressed KV dimension")
    q_lora_rank: int = spec_field(0, check="positive", since="1.2", doc="MLA: compressed query dimension (0: none)")
    qk_rope_head_dim: int = spec_field(0, check="positive", since="1.2", doc="MLA: rotary part of each query/key head")
    v_head_dim: int = spec_field(0, check="positive", since="1.2", doc="MLA: value head dimension; default head_dim")
    moe_ffn_hidden_size: int = spec_field(0, check="positive", since="1.2",
                                          doc="FFN width of one expert; default ffn_hidden_size")
    num_shared_experts: int = spec_field(0, check="nonneg", since="1.2",
                                         doc="always-active experts of moe_ffn_hidden_size each")
    first_dense_layers: int = spec_field(0, check="nonneg", since="1.2",
                                         doc="the first k layers keep a dense FFN of ffn_hidden_size")
    moe_load_imbalance: float = spec_field(1.0, check="at_least_1", since="1.2",
                                           doc="tokens on the busiest expert / mean (1.0 = balanced)")
    router: Router = spec_field("softmax", since="1.2", doc="softmax or sigmoid top-k gate")
    moe_capacity_factor: float | None = spec_field(None, check="positive", since="1.2",
                                                   doc="expert capacity / mean tokens; absent = dropless")
    mtp_layers: int = spec_field(0, check="nonneg", since="1.2", doc="multi-token prediction modules (DeepSeek-V3: 1)")
    moe_router_groups: int = spec_field(1, check="positive", since="1.2",
                                        doc="expert groups of group-limited routing (DeepSeek-V3 n_group: 8)")
    moe_router_group_topk: int = spec_field(0, check="positive", since="1.2",
                                            doc="groups a token's experts come from (topk_group: 4); "
                                                "default moe_router_groups")

    def __post_init__(self) -> None:
        validate(self)
        a = self.num_attention_heads
        derived = {"num_kv_heads": a, "ffn_hidden_size": 4 * self.hidden_size, "head_dim": self.hidden_size // a}
        for name, value in derived.items():
            if getattr(self, name) == 0:
                object.__setattr__(self, name, value)
        if self.num_experts == 0:  # the contract's "0 = dense" is stored as one expert
            object.__setattr__(self, "num_experts", 1)
        if self.moe_ffn_hidden_size == 0:
            object.__setattr__(self, "moe_ffn_hidden_size", self.ffn_hidden_size)
        if self.moe_router_group_topk == 0:
            object.__setattr__(self, "moe_router_group_topk", self.moe_router_groups)
        if self.attention == "mla" and self.v_head_dim == 0:
            object.__setattr__(self, "v_head_dim", self.head_dim)
        validate(self)  # the derived values too (4 * a huge hidden_size is out of range)

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def moe_layers(self) -> int:
        """Layers whose FFN is a mixture of experts."""
        return self.num_layers - self.first_dense_layers if self.is_moe else 0

    def problems(self) -> list[Problem]:
        """What the fields of this model contradict among themselves (names relative to ``model``)."""
        out: list[Problem] = []

        def add(f: str, msg: str) -> None:
            out.append(Problem(f, msg))

        h, a, kv = self.hidden_size, self.num_attention_heads, self.num_kv_heads
        if self.num_layers > MAX_LAYERS:
            add("num_layers", f"{self.num_layers:,} is more than simdist models ({MAX_LAYERS:,}); "
                "the deepest transformers trained have about 1,000 layers (DeepNet, Wang et al. 2022)")
        if self.head_dim * a != h and h % a:  # only when head_dim was derived
            add("hidden_size", f"{h} is not divisible by num_attention_heads ({a}); give head_dim")
        if a % kv:
            add("num_kv_heads", f"{kv} does not divide num_attention_heads ({a})")
        self._mla_problems(add)
        self._moe_problems(add)
        if self.sliding_window_layers is not None:
            if self.sliding_window is None:
                add("sliding_window_layers", "needs sliding_window")
            elif self.sliding_window_layers > self.num_layers:
                add("sliding_window_layers", f"{self.sliding_window_layers} is more than num_layers ({self.num_layers})")
        return out

    def _mla_problems(self, add: Callable[[str, str], None]) -> None:
        if self.attention == "mla":
            for name in ("kv_lora_rank", "qk_rope_head_dim"):
                if not getattr(self, name):
                    add(name, "is required with attention: mla")
            if self.num_kv_heads != self.num_attention_heads:
                add("num_kv_heads", "attention mla has one key/value per query head; leave num_kv_heads out")
        else:
            for name in _MLA_FIELDS:
                if getattr(self, name):
                    add(name, "only applies to attention: mla")

    def _moe_problems(self, add: Callable[[str, str], None]) -> None:
        e, k = self.num_experts, self.experts_per_token
        if k > e and e > 1:
            add("experts_per_token", f"{k} is more than num_experts ({e})")
        if not self.is_moe:
            if k > 1:
                add("experts_per_token", "only applies to a mixture-of-experts model (num_experts > 1)")
            defaults = ModelSpec.moe_defaults(self)
            for name in _MOE_FIELDS:
                if getattr(self, name) != defaults[name]:
                    add(name, "only applies to a mixture-of-experts model (num_experts > 1)")
        elif self.first_dense_layers >= self.num_layers:
            add("first_dense_layers", f"{self.first_dense_layers} leaves no MoE layer of {self.num_layers}")
        if self.is_moe:
            self._router_group_problems(add)

    def _router_group_problems(self, add: Callable[[str, str], None]) -> None:
        g, top, e, k = self.moe_router_groups, self.moe_router_group_topk, self.num_experts, self.experts_per_token
        if e % g:
            add("moe_router_groups", f"{g} does not divide num_experts ({e})")
        elif top > g:
            add("moe_router_group_topk", f"{top} is more than moe_router_groups ({g})")
        elif k > top * (e // g):
            add("moe_router_group_topk", f"{top} groups of {e // g} experts hold fewer than experts_per_token ({k})")

    @staticmethod
    def moe_defaults(m: ModelSpec) -> dict[str, object]:
        return {"moe_ffn_hidden_size": m.ffn_hidden_size, "num_shared_experts": 0, "first_dense_layers": 0,
                "moe_load_imbalance": 1.0, "router": "softmax", "moe_capacity_factor": None,
                "moe_router_groups": 1, "moe_router_group_topk": m.moe_router_groups}


MODEL_FIELDS = frozenset(f.name for f in fields(ModelSpec))

__all__ = ["MODEL_FIELDS", "ModelSpec"]
