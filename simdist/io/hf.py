"""A Hugging Face ``config.json`` -> model fields (the scenario file's ``model:`` keys).

Families and the config keys read (the names of each family's ``configuration_*.py`` in
Hugging Face transformers, and of the published config.json files):

- ``gpt2``: n_layer, n_embd, n_head, n_inner, n_positions / n_ctx; GELU, LayerNorm, biases,
  learned positions, tied embeddings.
- ``gpt_neox``: GPT-2's keys under Llama's names; rotary positions, untied embeddings.
- ``llama``, ``mistral``, ``mixtral``, ``qwen2``, ``qwen3``: num_hidden_layers, hidden_size,
  num_attention_heads, num_key_value_heads, intermediate_size, head_dim (Qwen3, Llama 3),
  sliding_window (Mistral/Mixtral; Qwen2 only with use_sliding_window), Mixtral's
  num_local_experts / num_experts_per_tok; SwiGLU, RMSNorm, rotary, no biases.
- ``qwen2_moe``, ``qwen3_moe``: num_experts, num_experts_per_tok, moe_intermediate_size
  (per expert), shared_expert_intermediate_size (Qwen2-MoE: one shared FFN that many experts
  wide), decoder_sparse_step and mlp_only_layers (which layers stay dense: only "the first k"
  is expressible).
- ``deepseek_v3`` (and ``deepseek_v2``): multi-head latent attention (kv_lora_rank,
  q_lora_rank, qk_nope_head_dim -> head_dim, qk_rope_head_dim, v_head_dim), n_routed_experts,
  n_shared_experts, moe_intermediate_size, first_k_dense_replace, moe_layer_freq (must be 1),
  scoring_func (router), num_nextn_predict_layers (multi-token prediction), n_group and
  topk_group (group-limited routing).
- ``gpt_oss``: num_local_experts, num_experts_per_tok (or experts_per_token), head_dim,
  sliding_window with layer_types (alternating windowed and full layers), attention_bias,
  initial_context_length (the pre-training length; max_position_embeddings is the extended one).

``max_position_embeddings`` becomes ``seq_length`` elsewhere; the scenario's own ``seq_length``
should override it when training uses shorter sequences.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from simdist.errors import Collector
from simdist.io.values import flag, text, texts, whole

_LLAMA_KEYS = {
    "num_hidden_layers": "num_layers", "hidden_size": "hidden_size",
    "num_attention_heads": "num_attention_heads", "num_key_value_heads": "num_kv_heads",
    "intermediate_size": "ffn_hidden_size", "vocab_size": "vocab_size",
    "max_position_embeddings": "seq_length", "head_dim": "head_dim",
}
_GPT2_KEYS = {"n_layer": "num_layers", "n_embd": "hidden_size", "n_head": "num_attention_heads",
              "n_inner": "ffn_hidden_size", "vocab_size": "vocab_size", "n_positions": "seq_length",
              "n_ctx": "seq_length"}
_NEOX_KEYS = {k: v for k, v in _LLAMA_KEYS.items() if k not in ("num_key_value_heads", "head_dim")}

_GPT_STYLE = {"mlp": "gelu", "norm": "layernorm", "bias": True}
_LLAMA_STYLE = {"mlp": "swiglu", "norm": "rmsnorm", "bias": False, "position_embedding": "rope",
                "tie_embeddings": False}

# family -> (keys, fixed fields); the first family whose name appears wins
FAMILIES: dict[str, tuple[dict[str, str], dict[str, Any]]] = {
    "gpt2": (_GPT2_KEYS, {**_GPT_STYLE, "position_embedding": "learned", "tie_embeddings": True}),
    "gpt_neox": (_NEOX_KEYS, {**_GPT_STYLE, "position_embedding": "rope", "tie_embeddings": False}),
    "llama": (_LLAMA_KEYS, _LLAMA_STYLE),
    "mistral": (_LLAMA_KEYS, _LLAMA_STYLE),
    "mixtral": (_LLAMA_KEYS, _LLAMA_STYLE),
    "qwen2": (_LLAMA_KEYS, _LLAMA_STYLE),
    "qwen2_moe": (_LLAMA_KEYS, _LLAMA_STYLE),
    "qwen3": (_LLAMA_KEYS, _LLAMA_STYLE),
    "qwen3_moe": (_LLAMA_KEYS, _LLAMA_STYLE),
    "deepseek_v2": (_LLAMA_KEYS, {**_LLAMA_STYLE, "attention": "mla"}),
    "deepseek_v3": (_LLAMA_KEYS, {**_LLAMA_STYLE, "attention": "mla"}),
    "gpt_oss": (_LLAMA_KEYS, {**_LLAMA_STYLE, "bias": True}),
}
# class-name spellings in "architectures" (GPT2LMHeadModel, Qwen3MoeForCausalLM, ...)
_ARCH_NAMES = {"gpt2": "gpt2", "gptneox": "gpt_neox", "llama": "llama", "mistral": "mistral",
               "mixtral": "mixtral", "qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "qwen2": "qwen2",
               "qwen3": "qwen3", "deepseekv2": "deepseek_v2", "deepseekv3": "deepseek_v3", "gptoss": "gpt_oss"}


def family_of(cfg: Mapping[str, Any], c: Collector) -> str | None:
    """The config's family from ``model_type``, else from ``architectures``."""
    model_type = (text(cfg, "model_type", c) or "").lower()
    if model_type in FAMILIES:
        return model_type
    archs = " ".join(texts(cfg, "architectures", c)).lower()
    for spelled, family in _ARCH_NAMES.items():  # longer names (qwen3moe) before their prefixes
        if spelled in archs:
            return family
    c.add("model_type", f"{model_type or '(missing)'} is not a supported architecture "
          f"({', '.join(FAMILIES)})")
    return None


def fields_from_hf_config(cfg: Mapping[str, Any], c: Collector) -> dict[str, Any]:
    """Model fields from a Hugging Face ``config.json`` (already parsed); problems name the
    config's own keys (``model.hf_config.num_hidden_layers``)."""
    if not isinstance(cfg, Mapping):
        c.add("", "must hold a JSON object")
        return {}
    family = family_of(cfg, c)
    if family is None:
        return {}
    keys, fixed = FAMILIES[family]
    out: dict[str, Any] = dict(fixed)
    for hf_key, ours in keys.items():
        v = whole(cfg, hf_key, c)
        if v is not None:
            out[ours] = v
    tie = flag(cfg, "tie_word_embeddings", c)
    if tie is not None:
        out["tie_embeddings"] = tie
    act = text(cfg, "hidden_act", c) or text(cfg, "activation_function", c)
    if act and act.startswith("gelu") and keys is _LLAMA_KEYS:
        out["mlp"] = "gelu"
    _EXTRA.get(family, _none)(cfg, out, c)
    name = cfg.get("_name_or_path")
    out["name"] = name if isinstance(name, str) and name else family
    out["source"] = "Hugging Face config.json"
    return out


def _none(cfg: Mapping[str, Any], out: dict[str, Any], c: Collector) -> None:
    return None


def _window(cfg: Mapping[str, Any], out: dict[str, Any], c: Collector) -> None:
    window = whole(cfg, "sliding_window", c)
    if window is not None and window < out.get("seq_length", window + 1):
        out["sliding_window"] = window


def _mixtral(cfg: Mapping[str, Any], out: dict[str, Any], c: Collector) -> None:
    _window(cfg, out, c)
    out["num_experts"] = whole(cfg, "num_local_experts", c) or 8  # Mixtral 8x7B's, when unstated
    out["experts_per_token"] = whole(cfg, "num_experts_per_tok", c) or 2


def _qwen2(cfg: Mapping[str, Any], out: dict[str, Any], c: Collector) -> None:
    if flag(cfg, "use_sliding_window", c):
        _window(cfg, out, c)


def _qwen_moe(cfg: Mapping[str, Any], out: dict[str, Any], c: Collector) -> None:
    _qwen2(cfg, out, c)
    for hf_key, ours in (("num_experts", "num_experts"), ("num_experts_per_tok", "experts_per_token"),
                         ("moe_intermediate_size", "moe_ffn_hidden_size")):
        v = whole(cfg, hf_key, c)
        if v is not None:
            out[ours] = v
    shared = whole(cfg, "shared_expert_intermediate_size", c, minimum=0)
    expert = out.get("moe_ffn_hidden_size")
    if shared and expert:
        if shared % expert:
            c.add("shared_expert_intermediate_size", f"{shared} is not a whole number of experts of "
                  f"moe_intermediate_size {expert}; not expressible as num_shared_experts")
        else:
            out["num_shared_experts"] = shared // expert
    step = whole(cfg, "decoder_sparse_step", c)
    dense = cfg.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in dense):
        c.add("mlp_only_layers", "must be a list of layer numbers")
        return
    if step not in (None, 1):
        c.add("decoder_sparse_step", f"{step}: MoE every {step} layers is not expressible "
              "(first_dense_layers keeps the first k layers dense)")
    elif sorted(dense) != list(range(len(dense))):
        c.add("mlp_only_layers", f"{dense}: only the first k layers can stay dense (first_dense_layers)")
    elif dense:
        out["first_dense_layers"] = len(dense)


def _deepseek(cfg: Mapping[str, Any], out: dict[str, Any], c: Collector) -> None:
    out.pop("head_dim", None)
    for hf_key, ours, minimum in (("n_routed_experts", "num_experts", 1), ("num_experts_per_tok", "experts_per_token", 1),
                                  ("moe_intermediate_size", "moe_ffn_hidden_size", 1),
                                  ("n_shared_experts", "num_shared_experts", 0),
                                  ("first_k_dense_replace", "first_dense_layers", 0),
                                  ("kv_lora_rank", "kv_lora_rank", 1), ("q_lora_rank", "q_lora_rank", 1),
                                  ("qk_nope_head_dim", "head_dim", 1), ("qk_rope_head_dim", "qk_rope_head_dim", 1),
                                  ("v_head_dim", "v_head_dim", 1),
                                  ("num_nextn_predict_layers", "mtp_layers", 0),
                                  ("n_group", "moe_router_groups", 1), ("topk_group", "moe_router_group_topk", 1)):
        v = whole(cfg, hf_key, c, minimum=minimum)
        if v is not None:
            out[ours] = v
    freq = whole(cfg, "moe_layer_freq", c)
    if freq not in (None, 1):
        c.add("moe_layer_freq", f"{freq}: MoE every {freq} layers is not expressible")
    scoring = text(cfg, "scoring_func", c)
    if scoring is not None:
        if scoring not in ("softmax", "sigmoid"):
            c.add("scoring_func", f"{scoring!r} is not one of softmax, sigmoid")
        else:
            out["router"] = scoring


def _gpt_oss(cfg: Mapping[str, Any], out: dict[str, Any], c: Collector) -> None:
    out["num_experts"] = whole(cfg, "num_local_experts", c) or whole(cfg, "num_experts", c) or 1
    k = whole(cfg, "num_experts_per_tok", c) or whole(cfg, "experts_per_token", c)
    if k is not None:
        out["experts_per_token"] = k
    bias = flag(cfg, "attention_bias", c)
    if bias is not None:
        out["bias"] = bias
    pretrain = whole(cfg, "initial_context_length", c)
    if pretrain is not None:
        out["seq_length"] = pretrain
    window = whole(cfg, "sliding_window", c)
    kinds = texts(cfg, "layer_types", c)
    if window is not None:
        out["sliding_window"] = window
        # transformers' GptOssConfig alternates sliding and full layers, starting with sliding,
        # when layer_types is not written out
        layers = out.get("num_layers", 0)
        out["sliding_window_layers"] = (sum(1 for k in kinds if k == "sliding_attention") if kinds
                                        else (layers + 1) // 2)


_EXTRA = {"mistral": _window, "mixtral": _mixtral, "qwen2": _qwen2, "qwen2_moe": _qwen_moe,
          "qwen3": _qwen2, "qwen3_moe": _qwen_moe, "deepseek_v2": _deepseek, "deepseek_v3": _deepseek,
          "gpt_oss": _gpt_oss}
