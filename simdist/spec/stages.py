"""Which layers each pipeline stage holds: the split the simulator and the executor share."""

from __future__ import annotations

from functools import cache
from itertools import accumulate


@cache
def stage_layer_ranges(num_layers: int, pp: int, v: int = 1) -> tuple[tuple[range, ...], ...]:
    """Layer indices of each (stage, chunk). Virtual stage k = chunk*pp + stage holds the k-th
    contiguous slice of layers (Megatron-LM's interleaved assignment, Narayanan et al. SC'21
    sec 2.2). When pp*v does not divide the layers, the middle virtual stages take one extra
    layer each (the first and last already carry the embedding and the LM head)."""
    n = pp * v
    base, extra = divmod(num_layers, n)
    order = [*range(1, n - 1), 0, n - 1] if n > 2 else list(range(n))
    gets_extra = set(order[:extra])
    sizes = [base + (1 if k in gets_extra else 0) for k in range(n)]
    starts = [0, *accumulate(sizes)]  # linear, not quadratic, in pp * v
    return tuple(
        tuple(range(starts[c * pp + s], starts[c * pp + s] + sizes[c * pp + s]) for c in range(v))
        for s in range(pp)
    )
