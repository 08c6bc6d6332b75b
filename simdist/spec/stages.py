"""Which layers each pipeline stage holds: the split the simulator and the executor share.

Without a layout the layers are split evenly over the virtual stages. ``plan.pipeline_layout``
names the split instead, in Megatron-Core's ``--pipeline-model-parallel-layout`` grammar
(megatron/core/transformer/pipeline_parallel_layer_layout.py, ``parse_str_to_list`` and
``validate_layer_layout``): virtual stages in order separated by ``|``; ``E`` the embedding,
``t`` one transformer (decoder) layer, ``m`` one multi-token-prediction layer, ``L`` the loss
(LM head); ``(...)*N`` repeats a group and ``x*N`` one letter N times; commas are cosmetic.
DeepSeek-V3 on PP8 VPP4 (Megatron-Bridge): ``Et|(tt|)*30mL``, 32 virtual stages holding
1, 2 x 30 and 0 layers.
"""

from __future__ import annotations

import re
from functools import cache, lru_cache
from itertools import accumulate

LAYOUT_LETTERS = "ELtm"
MAX_LAYOUT_LETTERS = 2**20  # a layout expanding past this is refused, not built
_GROUP = re.compile(r"\(([^()]*)\)\*(\d+)")  # (...)*N, innermost first
_LETTER = re.compile(r"(.)\*(\d+)")  # x*N


@cache
def parse_layout(text: str) -> tuple[str, ...]:
    """The letters of each virtual stage of a layout string, repetitions expanded. Raises
    ValueError naming the first thing it cannot read."""
    s = text.replace(",", "").replace(" ", "")

    def repeat(g: re.Match[str]) -> str:
        if len(g.group(1)) * int(g.group(2)) > MAX_LAYOUT_LETTERS:
            raise ValueError(f"{g.group(0)!r} expands past {MAX_LAYOUT_LETTERS} letters")
        return g.group(1) * int(g.group(2))

    while True:  # nested groups expand from the inside out
        expanded = _GROUP.sub(repeat, s)
        if len(expanded) > MAX_LAYOUT_LETTERS:
            raise ValueError(f"expands past {MAX_LAYOUT_LETTERS} letters")
        if expanded == s:
            break
        s = expanded
    s = _LETTER.sub(repeat, s)
    bad = sorted({c for c in s if c not in LAYOUT_LETTERS + "|"})
    if bad:
        raise ValueError(f"cannot read {''.join(bad)!r}: a layout has the letters E, t, m, L, "
                         "'|' between virtual stages and repetitions (...)*N or x*N")
    return tuple(s.split("|"))


def layout_problems(text: str, stages: int) -> list[str]:
    """What is wrong with a layout for ``stages`` virtual stages (pp * virtual_pipeline_stages),
    by Megatron-Core's validate_layer_layout rules that need no model."""
    try:
        parts = parse_layout(text)
    except ValueError as e:
        return [str(e)]
    out = []
    if len(parts) != stages:
        out.append(f"{len(parts)} virtual stages, but pp * virtual_pipeline_stages = {stages}")
    flat = "".join(parts)
    if flat.count("E") != 1 or not flat.startswith("E"):
        out.append("the embedding E must appear exactly once, first")
    if flat.count("L") != 1 or not flat.endswith("L"):
        out.append("the loss L must appear exactly once, last")
    return out


def layout_model_problems(text: str, num_layers: int, mtp_layers: int) -> list[str]:
    """What a (readable) layout contradicts in the model: one t per transformer layer, one m per
    MTP layer, the MTP layers after every t (Megatron-Core) and with the loss in the last virtual
    stage (simdist places them there; Megatron-Bridge's recipes do too)."""
    try:
        parts = parse_layout(text)
    except ValueError:
        return []  # reported by layout_problems
    flat = "".join(parts)
    t, m = flat.count("t"), flat.count("m")
    out = []
    if t != num_layers:
        out.append(f"{t} transformer layers t, but model.num_layers = {num_layers}")
    if m != mtp_layers:
        out.append(f"{m} MTP layers m, but model.mtp_layers = {mtp_layers}")
    elif m and ("t" in flat[flat.index("m"):] or parts[-1].count("m") != m):
        out.append("the MTP layers m must follow every t and sit with the loss L in the last virtual stage "
                   "(a standalone MTP stage is not simulated)")
    return out


def layout_sizes(text: str) -> tuple[int, ...]:
    """Transformer layers of each virtual stage of a layout."""
    return tuple(part.count("t") for part in parse_layout(text))


@cache
def stage_layer_ranges(num_layers: int, pp: int, v: int = 1, layout: str | None = None
                       ) -> tuple[tuple[range, ...], ...]:
    """Layer indices of each (stage, chunk). Virtual stage k = chunk*pp + stage holds the k-th
    contiguous slice of layers (Megatron-LM's interleaved assignment, Narayanan et al. SC'21
    sec 2.2): as many as ``layout`` gives it (module docstring), else an even split. When pp*v
    does not divide the layers, the middle virtual stages take one extra layer each (the first
    and last already carry the embedding and the LM head)."""
    n = pp * v
    if layout is not None:
        sizes = list(layout_sizes(layout))
    else:
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
def stage_chunks(num_layers: int, pp: int, v: int = 1, schedule: str = "1f1b", layout: str | None = None
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
    r = stage_layer_ranges(num_layers, pp, v, layout)
    return tuple(tuple((c * pp + s, layers) for c, layers in enumerate(r[s])) for s in range(pp))


def virtual_stages(pp: int, v: int = 1, schedule: str = "1f1b") -> int:
    """Model stages a micro-batch passes through."""
    return 2 * pp if schedule == "dualpipev" else pp if schedule == "dualpipe" else pp * v
