"""Which transformer layers are what: a mixture-of-experts FFN or a dense one, windowed or full
attention. The simulator prices each kind once; the executor builds each layer by its kind.

- MoE: every layer from ``first_dense_layers`` on, when the model has experts (DeepSeek-V3's
  ``first_k_dense_replace``; Megatron-Core's ``--moe-layer-freq`` with leading dense layers).
- Windowed: ``sliding_window_layers`` layers (all when unset) spread evenly from layer 0, so
  half of them alternate window, full, window, ... (GPT-OSS's ``layer_types``, which starts
  with a sliding-attention layer).
- The multi-token-prediction modules (DeepSeek-V3 sec 2.2) each hold one layer of the kind of
  the model's last layer (Megatron-Core's MTP block builds it from the last layer's spec).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import lru_cache
from typing import NamedTuple

from simdist.spec.model import ModelSpec


class LayerKind(NamedTuple):
    moe: bool  # mixture-of-experts FFN (else the dense FFN of ffn_hidden_size)
    window: bool  # sliding-window attention (else full causal attention)


DENSE = LayerKind(False, False)


def windowed(m: ModelSpec, index: int) -> bool:
    if m.sliding_window is None or m.sliding_window >= m.seq_length:
        return False
    w = m.num_layers if m.sliding_window_layers is None else m.sliding_window_layers
    n = m.num_layers
    return math.ceil((index + 1) * w / n) > math.ceil(index * w / n)


def layer_kind(m: ModelSpec, index: int) -> LayerKind:
    """The kind of layer ``index`` (0-based); ``index`` = num_layers + j is MTP module j's layer."""
    if index >= m.num_layers:
        index = m.num_layers - 1
    return LayerKind(m.is_moe and index >= m.first_dense_layers, windowed(m, index))


def kind_counts(m: ModelSpec, indices: Iterable[int]) -> tuple[tuple[LayerKind, int], ...]:
    """(kind, layers) of the given layers, kinds in the order they first appear (a range of the
    model's layers is counted in closed form)."""
    counts: dict[LayerKind, int] = {}
    if isinstance(indices, range) and indices.step == 1 and indices.start >= 0 and indices.stop <= m.num_layers:
        first_moe = m.first_dense_layers if m.is_moe else indices.stop
        a, b = indices.start, indices.stop
        for lo, hi, moe in ((a, min(b, first_moe), False), (max(a, first_moe), b, True)):
            if lo >= hi:
                continue
            windowed_here = _windowed_before(m, hi) - _windowed_before(m, lo)
            lead = windowed(m, lo)
            for window, n in ((lead, windowed_here if lead else hi - lo - windowed_here),
                              (not lead, hi - lo - windowed_here if lead else windowed_here)):
                if n:
                    counts[LayerKind(moe, window)] = counts.get(LayerKind(moe, window), 0) + n
        return tuple(counts.items())
    for i in indices:
        k = layer_kind(m, i)
        counts[k] = counts.get(k, 0) + 1
    return tuple(counts.items())


def _windowed_before(m: ModelSpec, stop: int) -> int:
    """How many of layers 0..stop-1 have windowed attention (``windowed`` summed in closed form:
    layer i is windowed when ceil((i+1)w/n) > ceil(iw/n), so the count telescopes)."""
    if m.sliding_window is None or m.sliding_window >= m.seq_length:
        return 0
    w = m.num_layers if m.sliding_window_layers is None else m.sliding_window_layers
    return math.ceil(stop * w / m.num_layers)


@lru_cache(maxsize=64)  # a search asks it per plan, of one model
def model_kind_counts(m: ModelSpec) -> tuple[tuple[LayerKind, int], ...]:
    """Every layer of the model (MTP modules not included)."""
    return kind_counts(m, range(m.num_layers))


@lru_cache(maxsize=64)
def layer_kinds(m: ModelSpec) -> tuple[LayerKind, ...]:
    """The kind of every layer of the model, by index (MTP modules not included)."""
    return tuple(layer_kind(m, i) for i in range(m.num_layers))


def kinds_of(m: ModelSpec, layers: range | tuple[int, ...]) -> tuple[LayerKind, ...]:
    """``layer_kind`` of each of ``layers``, in order (a slice of :func:`layer_kinds` for a range
    of the model's layers)."""
    if isinstance(layers, range) and layers.step == 1 and layers.start >= 0 and layers.stop <= m.num_layers:
        return layer_kinds(m)[layers.start:layers.stop]
    return tuple(layer_kind(m, i) for i in layers)


def moe_count(m: ModelSpec, layers: range | tuple[int, ...]) -> int:
    """How many of ``layers`` have a mixture-of-experts FFN (as :func:`layer_kind` says; an index
    past the last layer is an MTP module's layer, of the last layer's kind)."""
    if not m.is_moe:
        return 0
    first, last = m.first_dense_layers, m.num_layers - 1
    if last < first:
        return 0
    if isinstance(layers, range) and layers.step == 1:
        return max(0, layers.stop - max(layers.start, first))
    return sum(1 for i in layers if min(i, last) >= first)
