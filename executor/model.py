"""A GPT/Llama-style decoder in plain torch, built from a scenario's ModelSpec.

Module names follow one fixed layout that :mod:`executor.parallelize` addresses by name:

    embed.tok, embed.pos           token embedding, learned positions (absent with RoPE)
    layers.<i>.attn_norm           LayerNorm or RMSNorm (``model.norm``)
    layers.<i>.attn.{q,k,v,o}      separate projections; k/v have num_kv_heads heads (GQA)
    layers.<i>.mlp_norm
    layers.<i>.mlp.{fc1,fc2}       GELU MLP, or {gate,up,down} for SwiGLU (``model.mlp``)
    final_norm, lm_head            LM head tied to embed.tok when ``model.tie_embeddings``

Layers live in an ``nn.ModuleDict`` keyed by their global index, so a pipeline chunk built by
:func:`stage_module` keeps the full model's parameter names (torchtitan does the same).

Initialisation follows GPT-2 / Megatron-LM: normal(0, 0.02) weights, zero biases, unit norm
weights, and output projections (attn.o, mlp.fc2/down) scaled by 1/sqrt(2 * num_layers)
(Radford et al. 2019, "Language Models are Unsupervised Multitask Learners", sec 2.3). It is
drawn from one torch.Generator walking the parameters in a fixed order, so every rank builds
the same full model before it keeps its part.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from executor.moe import build_ffn
from simdist.spec.model import ModelSpec

RECOMPUTE_MODES = ("none", "selective", "full")


class _KeepForBackward(torch.autograd.Function):
    """Identity that saves its input for backward.

    torch.utils.checkpoint keeps the inputs of a checkpointed region alive until its backward
    without going through ``saved_tensors_hooks``; routing them through this identity makes the
    activation counter in :mod:`executor.measure` see them. It costs no memory (the saved
    tensor is the same storage the checkpoint already holds) and does not change any value.
    """

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x.view_as(x)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        return grad


def keep_for_backward(x: torch.Tensor) -> torch.Tensor:
    if not x.requires_grad:
        return x
    return _KeepForBackward.apply(x)


def build_norm(m: ModelSpec) -> nn.Module:
    """LayerNorm (weight and bias, 2h parameters, as simdist.analytic.params counts) or RMSNorm."""
    if m.norm == "rmsnorm":
        return nn.RMSNorm(m.hidden_size, eps=1e-5)
    return nn.LayerNorm(m.hidden_size, eps=1e-5)


def rope_cos_sin(seq_len: int, head_dim: int, device: torch.device, base: float = 10000.0
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of rotary embeddings, shape (seq_len, head_dim), in the "rotate half"
    layout of GPT-NeoX / Hugging Face Llama (Su et al. 2021, arXiv:2104.09864, eq. 34)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (batch, heads, seq, head_dim) queries or keys by their position."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class Attention(nn.Module):
    """Multi-head or grouped-query causal self-attention with separate q, k, v, o projections.

    Head counts are read from the local projection widths, so the same code runs whole or
    column-parallel (each TP rank holds heads/tp query heads and kv_heads/tp key/value heads).
    """

    def __init__(self, m: ModelSpec, recompute_core: bool = False):
        super().__init__()
        self.head_dim = m.head_dim
        self.rope = m.position_embedding == "rope"
        self.recompute_core = recompute_core
        self.q = nn.Linear(m.hidden_size, m.hidden_size, bias=m.bias)
        self.k = nn.Linear(m.hidden_size, m.kv_dim, bias=m.bias)
        self.v = nn.Linear(m.hidden_size, m.kv_dim, bias=m.bias)
        self.o = nn.Linear(m.hidden_size, m.hidden_size, bias=m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[0], x.shape[1]
        q = self.q(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        if self.rope:
            cos, sin = rope_cos_sin(s, self.head_dim, q.device)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        group = q.shape[1] // k.shape[1]
        if group > 1:  # GQA: query head j uses key/value head j // group
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        if self.recompute_core:  # selective recompute (Korthikanti et al. 2022): attention core only
            q, k, v = keep_for_backward(q), keep_for_backward(k), keep_for_backward(v)
            out = checkpoint(_causal_attention, q, k, v, use_reentrant=False)
        else:
            out = _causal_attention(q, k, v)
        return self.o(out.transpose(1, 2).reshape(b, s, -1))


def _causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Mlp(nn.Module):
    """GELU MLP (fc1, fc2) or SwiGLU (gate, up, down; Shazeer 2020, arXiv:2002.05202)."""

    def __init__(self, m: ModelSpec):
        super().__init__()
        self.swiglu = m.mlp == "swiglu"
        h, f = m.hidden_size, m.ffn_hidden_size
        if self.swiglu:
            self.gate = nn.Linear(h, f, bias=m.bias)
            self.up = nn.Linear(h, f, bias=m.bias)
            self.down = nn.Linear(f, h, bias=m.bias)
        else:
            self.fc1 = nn.Linear(h, f, bias=m.bias)
            self.fc2 = nn.Linear(f, h, bias=m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm transformer layer. ``recompute="full"`` checkpoints the whole layer; with
    ``early_stop`` (plan.recompute_early_stop) PyTorch's non-reentrant checkpoint stops the
    recompute once backward's saved tensors are back, else it re-runs the whole layer."""

    def __init__(self, m: ModelSpec, recompute: str = "none", index: int = 0, early_stop: bool = True):
        super().__init__()
        if recompute not in RECOMPUTE_MODES:
            raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}")
        self.recompute_full = recompute == "full"
        self.early_stop = early_stop
        self.attn_norm = build_norm(m)
        self.attn = Attention(m, recompute_core=recompute == "selective")
        self.mlp_norm = build_norm(m)
        self.mlp = build_ffn(m, index) or Mlp(m)  # a mixture of experts in MoE layers (executor.moe)

    def _layer(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute_full:
            with set_checkpoint_early_stop(self.early_stop):
                return checkpoint(self._layer, keep_for_backward(x), use_reentrant=False)
        return self._layer(x)


class Embedding(nn.Module):
    """Token embedding plus learned absolute positions (absent with RoPE)."""

    def __init__(self, m: ModelSpec):
        super().__init__()
        self.tok = nn.Embedding(m.vocab_size, m.hidden_size)
        self.pos = nn.Embedding(m.seq_length, m.hidden_size) if m.position_embedding == "learned" else None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens)
        if self.pos is not None:
            positions = torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0)
            x = x + self.pos(positions)  # (1, s, h); sequence-sharded under sequence parallel
        return x


class Transformer(nn.Module):
    """The whole decoder, or one pipeline chunk of it (parts it does not hold are None).

    Input: token ids (batch, seq) when it holds the embedding, else hidden states
    (batch, seq, hidden). Output: logits (batch, seq, vocab) when it holds the LM head, else
    hidden states.
    """

    def __init__(self, m: ModelSpec, recompute: str = "none", layer_ids: Iterable[int] | None = None,
                 embed: bool = True, head: bool = True, early_stop: bool = True):
        super().__init__()
        self.spec = m
        ids = range(m.num_layers) if layer_ids is None else layer_ids
        self.embed = Embedding(m) if embed else None
        self.layers = nn.ModuleDict({str(i): Block(m, recompute, i, early_stop) for i in ids})
        self.final_norm = build_norm(m) if head else None
        self.lm_head = nn.Linear(m.hidden_size, m.vocab_size, bias=False) if head else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for layer in self.layers.values():
            x = layer(x)
        if self.final_norm is not None and self.lm_head is not None:
            x = self.lm_head(self.final_norm(x))
        return x

    def tie_weights(self) -> None:
        """Share the LM head with the token embedding (``model.tie_embeddings``)."""
        if self.spec.tie_embeddings and self.embed is not None and self.lm_head is not None:
            self.lm_head.weight = self.embed.tok.weight


def init_weights(model: Transformer, seed: int) -> None:
    """Deterministic GPT-2 style initialisation from one seed (see the module docstring)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    scaled_std = 0.02 / math.sqrt(2 * model.spec.num_layers)
    with torch.no_grad():
        seen: set[int] = set()
        for name, p in model.named_parameters():
            if id(p) in seen:  # a tied weight is drawn once
                continue
            seen.add(id(p))
            leaf = name.rsplit(".", 1)[-1]
            is_norm = "norm" in name
            if is_norm and leaf == "weight":
                p.fill_(1.0)
            elif leaf == "bias" or leaf.startswith("experts_b"):
                p.zero_()
            else:
                std = scaled_std if name.endswith(("attn.o.weight", "mlp.fc2.weight", "mlp.down.weight",
                                                   "mlp.experts_w2")) else 0.02
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * std)


def build_model(m: ModelSpec, seed: int, recompute: str = "none", early_stop: bool = True) -> Transformer:
    """The full model, initialised from ``seed`` on the CPU (every rank builds the same one)."""
    model = Transformer(m, recompute=recompute, early_stop=early_stop)
    model.tie_weights()
    init_weights(model, seed)
    return model


def stage_module(full: Transformer, layer_ids: Sequence[int], first: bool, last: bool) -> Transformer:
    """A pipeline chunk sharing ``full``'s modules: embedding only when ``first``, final norm and
    LM head only when ``last``, and the given layers under their global indices."""
    m = full.spec
    chunk = Transformer(m, layer_ids=(), embed=False, head=False)
    chunk.embed = full.embed if first else None
    for i in layer_ids:
        chunk.layers[str(i)] = full.layers[str(i)]
    if last:
        chunk.final_norm = full.final_norm
        chunk.lm_head = full.lm_head
    return chunk


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy over every token of the (micro-)batch, computed in fp32."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
