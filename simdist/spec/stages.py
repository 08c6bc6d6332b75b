"""Which layers each pipeline stage holds: the split the simulator and the executor share."""

from __future__ import annotations

from functools import cache, lru_cache
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


@lru_cache(maxsize=256)  # pure; asked once per stage by every per-stage count
def stage_chunks(num_layers: int, pp: int, v: int = 1, schedule: str = "1f1b"
                 ) -> tuple[tuple[tuple[int, range], ...], ...]:
    """Per pipeline rank, its model chunks as (virtual stage, layers), in chunk order.

    Interleaved (and every one-chunk schedule): chunk c of rank s is virtual stage c*pp + s
    (:func:`stage_layer_ranges`). DualPipe (DeepSeek-V3 sec 3.2.1): the model in pp stages,
    rank s holding stage s for the micro-batches fed from rank 0 and stage pp-1-s for those fed
    from rank pp-1 (two copies' worth). DualPipeV: the model in 2*pp stages, rank s holding
    stage s and stage 2pp-1-s (a V)."""
    if schedule == "dualpipe":
        r = stage_layer_ranges(num_layers, pp, 1)
        return tuple(((s, r[s][0]), (pp - 1 - s, r[pp - 1 - s][0])) for s in range(pp))
    if schedule == "dualpipev":
        r = stage_layer_ranges(num_layers, 2 * pp, 1)
        return tuple(((s, r[s][0]), (2 * pp - 1 - s, r[2 * pp - 1 - s][0])) for s in range(pp))
    r = stage_layer_ranges(num_layers, pp, v)
    return tuple(tuple((c * pp + s, layers) for c, layers in enumerate(r[s])) for s in range(pp))


def virtual_stages(pp: int, v: int = 1, schedule: str = "1f1b") -> int:
    """Model stages a micro-batch passes through."""
    return 2 * pp if schedule == "dualpipev" else pp if schedule == "dualpipe" else pp * v
