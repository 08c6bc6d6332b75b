"""DeepSpeed ZeRO-3 as it ran up to release 0.4.0 (``zero3_fetch: module_sync``): each
submodule's parameters are fetched with the device synchronised, and only the next submodule's
parameters are in flight while a submodule computes.

What that code did (DeepSpeed v0.3.13, March 2021, through v0.4.0, June 2021;
``deepspeed/runtime/zero/stage3.py`` and ``partition_parameters.py``):

- the pre-forward hook of every submodule calls ``fetch_sub_module``, which waits for the
  parameters in flight and then ``_synchronize_communication`` ends with
  ``torch.cuda.synchronize()``: the host waits until the GPU has run everything queued, the
  previous submodule's compute included;
- ``prefetch_next_sub_modules`` then issues the next parameters of the traced order only when
  nothing is in flight, until ``stage3_prefetch_bucket_size`` elements (default 5e7, smaller than
  one weight matrix of a 175B model: the next submodule's weight alone), and every per-parameter
  all-gather (``_allgather_param``) starts with another ``torch.cuda.synchronize()``;
- so the gather of submodule i+1 runs beside the compute of submodule i and nothing else: a
  submodule takes max(its compute, the next one's gather), not the layer's totals. DeepSpeed
  PR #1188 (June 2021, "the async version is not async at all, because each all_gather calls
  torch.cuda.synchronize()") and issue #1069 describe the same serialisation.

The submodules fetched are a layer's linears in forward order: QKV, the output projection, the
MLP linears. The norms' weights and the biases stay whole on every rank (fewer elements than
``stage3_param_persistence_threshold``, default 1e5 in v0.3.13: ``ds_persist``), so their hooks
neither wait nor prefetch; the rank's other parameters (embeddings) are spread over the linears.
Their gathers are their weights' bytes; their compute is the layer's split in the same
proportions (the linear GEMMs are 2 x tokens x weights FLOPs; the attention core and the
element-wise work, a few per cent of a large layer, are spread the same way). Backward visits
them in reverse order.
"""

from __future__ import annotations

from simdist.spec.model import ModelSpec


def submodule_weights(m: ModelSpec) -> tuple[tuple[str, float], ...]:
    """(name, weight elements) of one dense layer's fetched submodules, in forward order."""
    h, q = m.hidden_size, m.num_attention_heads * m.head_dim
    mlp = (("mlp gate", h * m.ffn_hidden_size), ("mlp up", h * m.ffn_hidden_size)) if m.mlp == "swiglu" \
        else (("mlp fc1", h * m.ffn_hidden_size),)
    return (("qkv", h * (q + 2 * m.kv_dim)), ("attention out", q * h), *mlp, ("mlp fc2", m.ffn_hidden_size * h))


def submodule_shares(m: ModelSpec) -> tuple[tuple[str, float], ...]:
    """(name, share of the layer's parameters) in forward order; the shares add up to 1."""
    w = submodule_weights(m)
    total = sum(n for _, n in w)
    return tuple((name, n / total) for name, n in w)


def one_ahead_seconds(compute: list[float], gathers: list[float], reductions: list[float] | None = None) -> float:
    """Length of a pass whose segment i waits for its gather, then computes while gather i+1
    (issued as segment i starts, after gather i on the same stream) runs: gather 0 plus, per
    segment, max(compute i, gather i+1). The gradient reduction of segment i (``reductions``,
    backward) is issued as it ends and shares the links with gather i+2 beside segment i+1 (the
    next fetch's ``torch.cuda.synchronize()`` waits for it); the last one is waited for at the end."""
    if not compute:
        return 0.0
    red = reductions or [0.0] * len(compute)
    nxt = [*gathers[1:], 0.0]
    prev = [0.0, *red[:-1]]
    return gathers[0] + sum(max(c, g + r) for c, g, r in zip(compute, nxt, prev, strict=True)) + red[-1]


def synced_exposed(shares: tuple[float, ...], layers: int, t_compute: float, layer_gathers: tuple[float, ...],
                   layer_reductions: tuple[float, ...] = (), reverse: bool = False) -> float:
    """Seconds of a pass over ``layers`` layers (compute ``t_compute`` in all) that its one-ahead
    submodule gathers (and, in backward, gradient reductions) add: ``layer_gathers`` and
    ``layer_reductions`` are one layer's seconds per submodule, in forward order, with ``shares``
    the layer's compute split the same way; backward runs the submodules in ``reverse``."""
    if layers <= 0 or t_compute < 0:
        return 0.0
    per = t_compute / layers
    c = [per * s for s in shares]
    g = list(layer_gathers)
    r = list(layer_reductions) or [0.0] * len(g)
    if reverse:
        c, g, r = c[::-1], g[::-1], r[::-1]
    return max(0.0, one_ahead_seconds(c * layers, g * layers, r * layers) - t_compute)
