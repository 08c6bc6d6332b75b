"""The whole step as a Gantt chart the browser can draw: which spans, merged how, and a caption
that says what is not drawn. Pure functions of spans, no Streamlit (figures: simdist.viz).

The event engine emits tens of thousands of spans per step (GPT-3 175B on 1024 GPUs: 48,000 for
its 16 simulated ranks). The chart keeps every micro-batch, so the step is shown from its start
to its end and nothing that ran is cut away (a cut would leave a gap that looks like idle time);
it stays drawable by

1. merging spans of one lane (rank and stream) that follow each other in the same category with
   a gap under ``merge_gap`` (a fraction of a pixel at the full-step zoom) into one block, and
2. drawing the pipeline stages that fit under ``max_drawn`` blocks, spread from the first to the
   last stage; the caption names the stages left out and the page lets the user pick others.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from simdist.frozen import frozen
from simdist.results import Span
from simdist.units import fmt_seconds

MAX_DRAWN = 12_000  # bars one chart draws (SVG; the range slider draws them again)
MERGE_FRACTION = 1 / 5000  # gaps under this fraction of the step merge (0.2 px at 1000 px)


def merge_touching(spans: Sequence[Span], merge_gap: float) -> list[Span]:
    """Consecutive spans of one lane and one category, apart by at most ``merge_gap`` seconds,
    as one span named after its first and last (a span of another category between them, on
    the same lane, keeps them apart)."""
    lanes: dict[tuple[int, str], list[Span]] = {}
    for s in spans:
        lanes.setdefault((s.rank, s.stream), []).append(s)
    out: list[Span] = []
    for lane in lanes.values():
        lane.sort(key=lambda s: (s.start, s.end))
        run: list[Span] = []
        for s in lane:
            if run and s.category == run[-1].category and s.start - max(r.end for r in run) <= merge_gap:
                run.append(s)
                continue
            if run:
                out.append(_block(run))
            run = [s]
        if run:
            out.append(_block(run))
    return out


def _block(run: list[Span]) -> Span:
    if len(run) == 1:
        return run[0]
    first, last = run[0], run[-1]
    return Span(rank=first.rank, stream=first.stream, name=f"{first.name} … {last.name} ({len(run)} spans)",
                start=first.start, end=max(s.end for s in run), category=first.category)


def spread(items: Sequence[int], n: int) -> list[int]:
    """``n`` of ``items``, evenly spread, always with the first and the last."""
    if n >= len(items):
        return list(items)
    if n <= 1:
        return list(items[:1])
    picks = {round(i * (len(items) - 1) / (n - 1)) for i in range(n)}
    return [items[i] for i in sorted(picks)]


@frozen
class StepGantt:
    """What the timeline draws and what it leaves out."""

    spans: list[Span]  # merged, of the ranks drawn
    ranks: list[int]  # drawn
    all_ranks: list[int]  # one per pipeline stage, in stage order
    spans_in: int  # spans of the drawn ranks before merging
    merge_gap: float
    end: float  # the last span's end: the whole step

    def caption(self, labels: Mapping[int, str], simulated: int, world_size: int) -> str:
        left_out = [labels.get(r, f"rank {r}") for r in self.all_ranks if r not in set(self.ranks)]
        parts = [f"The whole step, 0 to {fmt_seconds(self.end)}: drag the slider under the chart (or "
                 "the chart itself) to zoom, double-click to zoom out."]
        parts.append(f"Drawn: {len(self.ranks)} of {len(self.all_ranks)} pipeline stages (one rank each; "
                     f"{simulated:,} ranks simulated of {world_size:,} GPUs, the others repeat them).")
        if left_out:
            parts.append(f"Not drawn, to keep the chart under {MAX_DRAWN:,} bars: {', '.join(left_out)} "
                         "(pick them above).")
        if len(self.spans) < self.spans_in:
            parts.append(f"{self.spans_in:,} spans drawn as {len(self.spans):,} bars: spans of one lane and "
                         f"kind less than {fmt_seconds(self.merge_gap)} apart are one bar (hover to see how many).")
        return " ".join(parts)


def step_gantt(spans: Sequence[Span], stage_ranks: Sequence[int], chosen: Sequence[int] | None = None,
               max_drawn: int = MAX_DRAWN) -> StepGantt:
    """The spans of ``chosen`` ranks (default: as many of ``stage_ranks`` as fit, spread out),
    merged so that the chart draws at most about ``max_drawn`` bars."""
    present = {s.rank for s in spans}
    all_ranks = [r for r in stage_ranks if r in present] or sorted(present)
    end = max((s.end for s in spans), default=0.0)
    gap = end * MERGE_FRACTION
    per_rank: dict[int, list[Span]] = {r: [] for r in all_ranks}
    for s in spans:
        if s.rank in per_rank:
            per_rank[s.rank].append(s)
    merged = {r: merge_touching(v, gap) for r, v in per_rank.items()}
    if chosen:
        ranks = [r for r in all_ranks if r in set(chosen)]
    else:
        ranks = all_ranks
        n = len(all_ranks)
        while n > 1 and sum(len(merged[r]) for r in spread(all_ranks, n)) > max_drawn:
            n -= 1
        ranks = spread(all_ranks, n)
    return StepGantt(spans=[s for r in ranks for s in merged[r]], ranks=ranks, all_ranks=all_ranks,
                     spans_in=sum(len(per_rank[r]) for r in ranks), merge_gap=gap, end=end)


def _numbers(values: object) -> list[float]:
    """A plotly data array as floats: a list, a numpy array, or the typed-array form plotly's JSON
    uses for numpy arrays ({"dtype": "f8", "bdata": base64})."""
    if isinstance(values, dict) and "bdata" in values:
        import base64

        import numpy as np

        return np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"]).tolist()
    return [float("nan") if v is None else float(v) for v in values]  # type: ignore[union-attr]


def drawn_spans(fig: object) -> list[tuple[str, str, float, float]]:
    """(category, lane label, start, end) of every span a :func:`simdist.viz.timeline_figure`
    draws (its rectangles read back from the figure or its JSON: for tests and checks)."""
    layout = fig.layout.yaxis  # type: ignore[attr-defined]
    lanes = dict(zip(_numbers(layout.tickvals or ()), layout.ticktext or (), strict=True))
    out = []
    for trace in fig.data:  # type: ignore[attr-defined]
        if trace.fill != "toself":
            continue
        xs, ys = _numbers(trace.x), _numbers(trace.y)
        for i in range(0, len(xs), 5):  # four corners and a gap
            out.append((trace.name, lanes[round((ys[i] + ys[i + 2]) / 2)], xs[i], xs[i + 1]))
    return out
