"""ModelSpec: the architecture of a GPT/Llama-style decoder, independent of hardware and plan."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

from simdist.errors import Collector

Mlp = Literal["gelu", "swiglu"]
Norm = Literal["layernorm", "rmsnorm"]
PositionEmbedding = Literal["learned", "rope", "alibi"]


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer.

    Defaults follow the contract: ``num_kv_heads`` = heads, ``ffn_hidden_size`` = 4 * hidden.
    """

    name: str = "custom"
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int = 0  # 0 -> num_attention_heads (set in __post_init__)
    ffn_hidden_size: int = 0  # 0 -> 4 * hidden_size
    mlp: Mlp = "gelu"
    vocab_size: int
    seq_length: int
    tie_embeddings: bool = False
    norm: Norm = "layernorm"
    bias: bool = True  # biases in the linear layers (GPT-2/3 yes, Llama no)
    position_embedding: PositionEmbedding = "learned"
    dropout: bool = False  # dropout layers (and their 1-byte masks) in attention and MLP
    num_experts: int = 1  # Mixtral-style MoE: experts per MLP layer (1 = dense)
    experts_per_token: int = 1  # top-k routing
    source: str = field(default="", compare=False)  # where the figures come from

    def __post_init__(self) -> None:
        if self.num_kv_heads == 0:
            object.__setattr__(self, "num_kv_heads", self.num_attention_heads)
        if self.ffn_hidden_size == 0:
            object.__setattr__(self, "ffn_hidden_size", 4 * self.hidden_size)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @staticmethod
    def check(values: dict[str, Any], c: Collector) -> None:
        """Report every problem in ``values`` (a dict of fields) into ``c``."""
        for name in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size", "seq_length"):
            if name not in values:
                c.add(name, "is required (give it, a preset, or an hf_config)")
        for f in fields(ModelSpec):
            if f.name not in values or f.type not in ("int",):
                continue
            v = values[f.name]
            zero_ok = f.name in ("num_kv_heads", "ffn_hidden_size")
            if isinstance(v, bool) or not isinstance(v, int):
                c.add(f.name, f"must be a whole number, got {v!r}")
            elif v < 0 or (v == 0 and not zero_ok):
                c.add(f.name, f"must be positive, got {v}")
        h, a = values.get("hidden_size"), values.get("num_attention_heads")
        kv = values.get("num_kv_heads") or a
        if _pos(h) and _pos(a) and h % a:
            c.add("hidden_size", f"{h} is not divisible by num_attention_heads ({a})")
        if _pos(a) and _pos(kv) and a % kv:
            c.add("num_kv_heads", f"{kv} does not divide num_attention_heads ({a})")
        for name, allowed in (
            ("mlp", ("gelu", "swiglu")),
            ("norm", ("layernorm", "rmsnorm")),
            ("position_embedding", ("learned", "rope", "alibi")),
        ):
            if name in values and values[name] not in allowed:
                c.add(name, f"{values[name]!r} is not one of {', '.join(allowed)}")
        for name in ("tie_embeddings", "bias", "dropout"):
            if name in values and not isinstance(values[name], bool):
                c.add(name, f"must be true or false, got {values[name]!r}")
        e, k = values.get("num_experts", 1), values.get("experts_per_token", 1)
        if _pos(e) and _pos(k) and k > e:
            c.add("experts_per_token", f"{k} is more than num_experts ({e})")


def _pos(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


MODEL_FIELDS = frozenset(f.name for f in fields(ModelSpec))


# --- Hugging Face config.json import ----------------------------------------------------------

# HF field name -> ModelSpec field, per architecture family. Llama/Mistral/Mixtral share names.
_HF_COMMON = {
    "num_hidden_layers": "num_layers",
    "hidden_size": "hidden_size",
    "num_attention_heads": "num_attention_heads",
    "num_key_value_heads": "num_kv_heads",
    "intermediate_size": "ffn_hidden_size",
    "vocab_size": "vocab_size",
    "max_position_embeddings": "seq_length",
    "tie_word_embeddings": "tie_embeddings",
    "num_local_experts": "num_experts",
    "num_experts_per_tok": "experts_per_token",
}
_HF_GPT2 = {
    "n_layer": "num_layers",
    "n_embd": "hidden_size",
    "n_head": "num_attention_heads",
    "n_inner": "ffn_hidden_size",
    "vocab_size": "vocab_size",
    "n_positions": "seq_length",
    "n_ctx": "seq_length",
    "tie_word_embeddings": "tie_embeddings",
}
_HF_NEOX = {
    "num_hidden_layers": "num_layers",
    "hidden_size": "hidden_size",
    "num_attention_heads": "num_attention_heads",
    "intermediate_size": "ffn_hidden_size",
    "vocab_size": "vocab_size",
    "max_position_embeddings": "seq_length",
    "tie_word_embeddings": "tie_embeddings",
}


def fields_from_hf_config(cfg: dict[str, Any], c: Collector) -> dict[str, Any]:
    """ModelSpec fields from a Hugging Face ``config.json`` (Llama, Mistral, Mixtral, GPT-2, GPT-NeoX)."""
    model_type = str(cfg.get("model_type", "")).lower()
    archs = " ".join(cfg.get("architectures") or []).lower()
    if model_type == "gpt2" or "gpt2" in archs:
        mapping, extra = _HF_GPT2, {"mlp": "gelu", "norm": "layernorm", "bias": True,
                                    "position_embedding": "learned", "tie_embeddings": True}
    elif model_type == "gpt_neox" or "gptneox" in archs:
        mapping, extra = _HF_NEOX, {"mlp": "gelu", "norm": "layernorm", "bias": True,
                                    "position_embedding": "rope", "tie_embeddings": False}
    elif model_type in ("llama", "mistral", "mixtral", "qwen2") or any(
        k in archs for k in ("llama", "mistral", "mixtral", "qwen2")
    ):
        mapping, extra = _HF_COMMON, {"mlp": "swiglu", "norm": "rmsnorm", "bias": False,
                                      "position_embedding": "rope", "tie_embeddings": False}
    else:
        c.add("model_type", f"{model_type or '(missing)'} is not a supported architecture "
              "(llama, mistral, mixtral, gpt2, gpt_neox)")
        return {}
    out: dict[str, Any] = dict(extra)
    for hf_name, ours in mapping.items():
        if cfg.get(hf_name) is not None:
            out[ours] = cfg[hf_name]
    if model_type == "mixtral" or "mixtral" in archs:
        out.setdefault("num_experts", 8)
        out.setdefault("experts_per_token", 2)
    if "hidden_act" in cfg and str(cfg["hidden_act"]).startswith("gelu") and mapping is _HF_COMMON:
        out["mlp"] = "gelu"
    # Llama 3 uses 8192-token pre-training sequences although max_position_embeddings is larger;
    # the scenario's own seq_length should override this field when it matters.
    name = cfg.get("_name_or_path") or model_type
    out["name"] = str(name)
    out["source"] = "Hugging Face config.json"
    return out
