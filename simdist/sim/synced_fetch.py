"""The event engine's segments for DeepSpeed <= 0.4.0's ZeRO-3 (``zero3_fetch: module_sync``,
:mod:`simdist.analytic.zero3_sync`): each layer's work is split into one segment per fetched
submodule, each waiting for that submodule's gather, with the next submodule's gather in flight
beside it (the engine's one-ahead prefetch), so a submodule takes max(its compute, the next
gather) as the closed form prices it."""

from __future__ import annotations

from simdist.sim.work import CommSpec, GradPiece, HostXfer, Work


def scaled(w: Work, s: float) -> Work:
    """``w`` with every part times ``s``."""
    return Work(w.compute * s, w.recompute * s, w.tp * s, w.compression * s, w.sync * s, w.cp * s)


def synced_segments(layer_work: list[Work], gathers: tuple[tuple[CommSpec, ...], ...], reverse: bool
                    ) -> tuple[tuple[Work, ...], tuple[tuple[CommSpec, ...], ...], tuple[int, ...]]:
    """Per-submodule (segments, gathers) of a pass over ``layer_work`` (one Work per layer):
    ``gathers`` are one layer's gathers per submodule in forward order; backward (``reverse``)
    runs the submodules last first. Also the index of each layer's last segment."""
    total = [sum(c.nbytes for c in g) for g in gathers]
    shares = [t / sum(total) for t in total] if sum(total) > 0 else [1 / len(gathers)] * len(gathers)
    order = list(range(len(gathers)))[::-1] if reverse else list(range(len(gathers)))
    segs: list[Work] = []
    comms: list[tuple[CommSpec, ...]] = []
    last: list[int] = []
    for w in layer_work:
        for j in order:
            segs.append(scaled(w, shares[j]))
            comms.append(gathers[j])
        last.append(len(segs) - 1)
    return tuple(segs), tuple(comms), tuple(last)


def first_of_layers(per_layer: tuple, last: tuple[int, ...], n: int) -> tuple:
    """Per-layer entries (host uploads) on each layer's first of ``n`` segments, given each
    layer's ``last`` segment; None elsewhere."""
    if not per_layer:
        return ()
    out: list = [None] * n
    for k, x in enumerate(per_layer):
        out[last[k - 1] + 1 if k else 0] = x
    return tuple(out)


def synced_pieces(parts: tuple[tuple[CommSpec, ...], ...], down: HostXfer | None, last: tuple[int, ...]
                  ) -> tuple[GradPiece, ...]:
    """Backward's gradient pieces: each submodule's reduce-scatter (``parts``, one layer's per
    submodule in forward order) as its segment ends, the layer's host copy after its last."""
    k = len(parts)
    out: list[GradPiece] = []
    for end in last:
        for i, j in enumerate(range(k - 1, -1, -1)):
            seg = end - (k - 1) + i
            out.append(GradPiece(seg, 1.0, parts[j], down if seg == end else None))
    return tuple(out)
