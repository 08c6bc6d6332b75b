"""Plotly figure builders for the dashboard and the CLI's HTML output: pure functions of
predictions (and of the dashboard's rows and sweep points) -> plotly Figure.

Nothing here imports Streamlit or runs a prediction, so every builder is testable on its own.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from simdist.results import BREAKDOWN_KEYS, Prediction, Span
from simdist.units import fmt_seconds

if TYPE_CHECKING:
    from simdist.dashboard.sweep import SweepPoint

# --- colours and labels ---------------------------------------------------------------------

BREAKDOWN_LABELS = {
    "compute": "compute",
    "recompute": "recompute",
    "tp_comm": "exposed TP comm",
    "pp_comm": "exposed PP comm",
    "dp_comm": "exposed DP comm",
    "bubble": "pipeline bubble",
    "optimizer": "optimizer",
    "offload": "offload",
    "compression": "compression",
    "ep_comm": "exposed expert all-to-all",
    "cp_comm": "exposed CP comm",
}

COLORS = {
    "compute": "#4C78A8",
    "forward": "#4C78A8",
    "backward": "#F58518",
    "recompute": "#72B7B2",
    "tp_comm": "#E45756",
    "pp_comm": "#B279A2",
    "dp_comm": "#54A24B",
    "bubble": "#BAB0AC",
    "idle": "#D8D8D8",
    "optimizer": "#EECA3B",
    "offload": "#9D755D",
    "compression": "#FF9DA6",
    "ep_comm": "#F28E2B",
    "cp_comm": "#D67195",
    "params": "#4C78A8",
    "grads": "#F58518",
    "activations": "#54A24B",
    "other": "#BAB0AC",
}

MEMORY_PARTS = (("params_gib", "params"), ("grads_gib", "grads"), ("optimizer_gib", "optimizer"),
                ("activations_gib", "activations"), ("other_gib", "other"))

# order of the categories in the timeline legend (others follow alphabetically)
SPAN_ORDER = ("forward", "backward", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm",
              "optimizer", "idle")


def _layout(fig: go.Figure, title: str, height: int = 360, legend: str = "top") -> go.Figure:
    """Shared look: the title on top, the legend under it (or on the right)."""
    where = ({"orientation": "h", "yanchor": "bottom", "y": 1.0, "x": 0} if legend == "top"
             else {"orientation": "v", "yanchor": "top", "y": 1.0, "x": 1.02})
    # the title sits under the mode bar (zoom, download), which a long title would run into
    fig.update_layout(title={"text": title, "x": 0, "xanchor": "left", "yref": "container", "y": 1,
                             "yanchor": "top", "pad": {"t": 38}}, height=height,
                      margin={"l": 10, "r": 10, "t": 108 if legend == "top" else 88, "b": 10},
                      legend=where)
    return fig


def _breakdown_items(pred: Prediction, min_share: float = 0.0) -> list[tuple[str, float]]:
    """(key, seconds) of the breakdown in its usual order; parts below ``min_share`` of the step left out."""
    keys = [k for k in BREAKDOWN_KEYS if k in pred.breakdown_s]
    keys += [k for k in pred.breakdown_s if k not in keys]
    cut = min_share * (pred.step_time_s or 0.0)
    return [(k, float(pred.breakdown_s[k])) for k in keys if min_share == 0.0 or float(pred.breakdown_s[k]) > cut]


MIN_SHARE = 0.0005  # parts under 0.05% of the step are too thin to draw (named in the figure's note)


# --- one prediction ---------------------------------------------------------------------------


def breakdown_figure(pred: Prediction, kind: str = "bar") -> go.Figure:
    """Where the step time goes: compute, exposed TP/PP/DP communication, bubble, optimizer.

    Parts under MIN_SHARE of the step (a zero bubble, 1e-13 s of rounding) are left out and named
    under the chart; shares are rounded to 0.1%.
    """
    items = _breakdown_items(pred, MIN_SHARE)
    left_out = [BREAKDOWN_LABELS.get(k, k) for k, _ in _breakdown_items(pred) if k not in dict(items)]
    total = pred.step_time_s or 1.0
    labels = [BREAKDOWN_LABELS.get(k, k) for k, _ in items]
    values = [v for _, v in items]
    colors = [COLORS.get(k, "#888888") for k, _ in items]
    shares = [f"{v / total:.1%}" for v in values]
    if kind == "pie":
        fig = go.Figure(go.Pie(labels=labels, values=values, marker={"colors": colors}, sort=False, hole=0.4,
                               text=shares, textinfo="text", textposition="inside", insidetextorientation="horizontal",
                               customdata=[fmt_seconds(v) for v in values],
                               hovertemplate="%{label}: %{customdata} (%{text})<extra></extra>"))
        fig.update_traces(automargin=True)
    else:
        fig = go.Figure(go.Bar(
            x=values, y=labels, orientation="h", marker={"color": colors},
            text=[f"{fmt_seconds(v)} ({share})" for v, share in zip(values, shares, strict=True)],
            textposition="auto", cliponaxis=False, hovertemplate="%{y}: %{x:.4g} s<extra></extra>",
        ))
        fig.update_yaxes(autorange="reversed", automargin=True)
        fig.update_xaxes(title="seconds per step")
    if left_out:
        fig.add_annotation(text=f"not drawn (under {MIN_SHARE:.2%} of the step): {', '.join(left_out)}",
                           xref="paper", yref="paper", x=0, y=-0.02, yanchor="top", showarrow=False,
                           font={"size": 11, "color": "#666666"})
    fig = _layout(fig, f"Where the {fmt_seconds(pred.step_time_s)} step goes", legend="right" if kind == "pie" else "top")
    if left_out:
        fig.update_layout(margin={"b": 40})
    return fig


def memory_figure(pred: Prediction) -> go.Figure:
    """Memory per pipeline stage as stacked bars, against the GPU's capacity line."""
    stages = [f"stage {s.stage}" for s in pred.per_stage]
    fig = go.Figure()
    for attr, label in MEMORY_PARTS:
        fig.add_trace(go.Bar(
            name=label, x=stages, y=[getattr(s, attr) for s in pred.per_stage],
            marker={"color": COLORS[label]},
            hovertemplate=f"{label}: %{{y:.2f}} GiB<extra>%{{x}}</extra>",
        ))
    few = len(stages) <= 8  # peak labels on every bar only while they do not collide
    fig.add_trace(go.Scatter(
        name="peak", x=stages, y=[s.peak_gib for s in pred.per_stage],
        mode="markers+text" if few else "markers",
        marker={"symbol": "line-ew-open", "size": 18 if few else 10, "color": "black"},
        text=[f"{s.peak_gib:.1f}" for s in pred.per_stage], textposition="top center",
        hovertemplate="peak: %{y:.2f} GiB<extra>%{x}</extra>",
    ))
    # the capacity is named in the legend, not written over the bars (a stage over it would hide it)
    cap = {"color": "#E45756", "dash": "dash"}
    fig.add_hline(y=pred.capacity_gib, line=cap, layer="above")
    fig.add_trace(go.Scatter(name=f"GPU capacity {pred.capacity_gib:.0f} GiB", x=[None], y=[None], mode="lines",
                             line=cap, hoverinfo="skip"))
    top = max([pred.capacity_gib, *(s.peak_gib for s in pred.per_stage)]) * 1.15
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title="GiB per GPU", range=[0, top])
    verdict = "fits" if pred.fits else "OUT OF MEMORY"
    return _layout(fig, f"Memory per stage: peak {pred.peak_gib:.1f} GiB ({verdict})",
                   legend="right")


_MB = re.compile(r"\bmb ?(\d+)")


def microbatch_of(span: Span) -> int | None:
    """The micro-batch index in a span's name ("F mb3 chunk1" -> 3), or None."""
    m = _MB.search(span.name)
    return int(m.group(1)) if m else None


def _category(span: Span) -> str:
    if span.category:
        return span.category
    head = span.name[:1]
    if span.stream == "compute" and head in ("F", "B", "W"):
        return "forward" if head == "F" else "backward"
    return span.stream or "other"


def idle_gaps(spans: Sequence[Span], stream: str = "compute", min_gap: float = 0.0) -> list[Span]:
    """Idle spans between the busy spans of ``stream`` on each rank (from 0 to the last end)."""
    out: list[Span] = []
    by_rank: dict[int, list[Span]] = {}
    for s in spans:
        if s.stream == stream and s.category != "idle":
            by_rank.setdefault(s.rank, []).append(s)
    for rank, busy in by_rank.items():
        t = 0.0
        for s in sorted(busy, key=lambda s: s.start):
            if s.start - t > min_gap:
                out.append(Span(rank=rank, stream=stream, name="idle", start=t, end=s.start,
                                category="idle"))
            t = max(t, s.end)
    return out


def timeline_figure(
    spans: Sequence[Span],
    rank_labels: Mapping[int, str] | None = None,
    title: str = "Pipeline timeline",
    add_idle: bool = True,
    x_end: float | None = None,
) -> go.Figure:
    """Gantt chart of spans: one row per (rank, stream), one colour per category.

    Idle gaps on the compute stream are added unless the engine already emitted idle spans. With
    ``x_end`` the axis shows the whole step, 0 to x_end, with a range slider under it to zoom.
    """
    spans = list(spans)
    if add_idle and not any(s.category == "idle" for s in spans):
        spans += idle_gaps(spans)
    stream_order = {"compute": 0, "tp": 1, "pp": 2, "dp": 3}
    rows = sorted({(s.rank, s.stream) for s in spans},
                  key=lambda rs: (rs[0], stream_order.get(rs[1], 9), rs[1]))
    labels = rank_labels or {}

    def row(rank: int, stream: str) -> str:
        return f"{labels.get(rank, f'rank {rank}')} · {stream}"

    lane = {rs: i for i, rs in enumerate(rows)}
    by_cat: dict[str, list[Span]] = {}
    for s in spans:
        by_cat.setdefault(_category(s), []).append(s)
    order = [c for c in SPAN_ORDER if c in by_cat] + sorted(c for c in by_cat if c not in SPAN_ORDER)
    fig = go.Figure()
    for cat in order:
        group = by_cat[cat]  # one filled trace per category: every span a rectangle, one SVG path in all
        start = np.array([s.start for s in group])
        end = np.array([s.end for s in group])
        y = np.array([lane[(s.rank, s.stream)] for s in group], dtype=float)
        gap = np.full(len(group), np.nan)  # numpy arrays: plotly takes them without checking each number
        xs = np.column_stack([start, end, end, start, gap]).ravel()
        ys = np.column_stack([y - 0.4, y - 0.4, y + 0.4, y + 0.4, gap]).ravel()
        color = COLORS.get(cat, "#888888")
        fig.add_trace(go.Scatter(name=cat, legendgroup=cat, x=xs, y=ys, mode="none", fill="toself",
                                 fillcolor=color, hoverinfo="skip"))
        fig.add_trace(go.Scatter(  # the hover: an invisible point in the middle of each span
            name=cat, legendgroup=cat, showlegend=False, x=(start + end) / 2, y=y, mode="markers",
            marker={"color": color, "opacity": 0, "size": 6}, hoverinfo="text+name",
            hovertext=np.array([f"{s.name}<br>{fmt_seconds(s.start)} to {fmt_seconds(s.end)}" for s in group],
                               dtype=object)))
    fig.update_yaxes(tickvals=list(range(len(rows))), ticktext=[row(r, st) for r, st in rows],
                     range=[len(rows) - 0.5, -0.5], showgrid=False, zeroline=False)
    fig.update_xaxes(title="seconds from the start of the step")
    height = max(260, 60 + 26 * len(rows))
    if x_end is not None:
        fig.update_xaxes(range=[0.0, x_end], rangeslider={"visible": True, "thickness": 0.06, "range": [0.0, x_end]})
        height += 120
    return _layout(fig, title, height=height)


# --- comparisons and sweeps -------------------------------------------------------------------


def compare_figure(a: Prediction, b: Prediction, labels: Sequence[str] = ("pinned", "current")) -> go.Figure:
    """Two plans' step-time breakdowns as stacked bars, side by side."""
    keys = [k for k, _ in _breakdown_items(a)]
    keys += [k for k, _ in _breakdown_items(b) if k not in keys]
    fig = go.Figure()
    for k in keys:
        fig.add_trace(go.Bar(
            name=BREAKDOWN_LABELS.get(k, k), orientation="h", y=list(labels),
            x=[a.breakdown_s.get(k, 0.0), b.breakdown_s.get(k, 0.0)],
            marker={"color": COLORS.get(k, "#888888")},
            hovertemplate=f"{BREAKDOWN_LABELS.get(k, k)}: %{{x:.4g}} s<extra>%{{y}}</extra>",
        ))
    fig.update_layout(barmode="stack", legend_traceorder="normal")
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title="seconds per step")
    return _layout(fig, f"Step time: {fmt_seconds(a.step_time_s)} vs {fmt_seconds(b.step_time_s)}", 280)


def nice_step(span: float, ticks: int = 5) -> float:
    """A round tick step (1, 2, 2.5 or 5 times a power of ten) for about ``ticks`` ticks over ``span``."""
    raw = span / ticks if span > 0 else 1.0
    mag = 10.0 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * (1 - 1e-12))


def nice_range(top: float, ticks: int = 5) -> tuple[tuple[float, float], float]:
    """An axis from 0 to a round number at or above ``top``, and its round tick step."""
    step = nice_step(top, ticks)
    return (0.0, step * max(1, math.ceil(top / step - 1e-9))), step


def sweep_figure(points: Sequence[SweepPoint], x_title: str, log_x: bool = False) -> go.Figure:
    """Step time (left axis) and MFU (right axis) against one knob; OOM points marked x."""
    ok = [p for p in points if p.step_time_s is not None]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    xs = [p.x for p in ok]
    symbols = ["circle" if p.fits else "x" for p in ok]
    hover = [f"{p.label}<br>peak {p.peak_gib:.1f} GiB{'' if p.fits else ' (OOM)'}" for p in ok]
    fig.add_trace(go.Scatter(x=xs, y=[p.step_time_s for p in ok], name="step time (s)",
                             mode="lines+markers", marker={"symbol": symbols, "size": 10},
                             line={"color": COLORS["compute"]}, hovertext=hover,
                             hovertemplate="%{hovertext}<br>step %{y:.4g} s<extra></extra>"),
                  secondary_y=False)
    fig.add_trace(go.Scatter(x=xs, y=[100 * (p.mfu or 0.0) for p in ok], name="MFU (%)",
                             mode="lines+markers", marker={"symbol": symbols, "size": 10},
                             line={"color": COLORS["backward"], "dash": "dot"}, hovertext=hover,
                             hovertemplate="%{hovertext}<br>MFU %{y:.1f}%<extra></extra>"),
                  secondary_y=True)
    fig.update_xaxes(title=x_title, type="log" if log_x else "linear",
                     tickvals=xs, ticktext=[p.label for p in ok])
    (lo, hi), dtick = nice_range(max((p.step_time_s or 0.0 for p in ok), default=1.0))
    fig.update_yaxes(title="step time (s)", range=[lo, hi], dtick=dtick, secondary_y=False)
    (lo, hi), dtick = nice_range(max((100 * (p.mfu or 0.0) for p in ok), default=1.0))
    fig.update_yaxes(title="MFU (%)", range=[lo, hi], dtick=dtick, showgrid=False, secondary_y=True)
    skipped = len(points) - len(ok)
    title = f"Step time and MFU vs {x_title}" + (f" ({skipped} invalid point(s) skipped)" if skipped else "")
    return _layout(fig, title)


def search_figure(rows: Sequence[Mapping[str, Any]], capacity_gib: float | None = None,
                  baseline: Mapping[str, Any] | None = None) -> go.Figure:
    """Step time against peak memory for the ranked plans (and the scenario's own plan)."""
    fig = go.Figure()
    groups = (("fits", [r for r in rows if r.get("fits")], COLORS["dp_comm"], "circle"),
              ("out of memory", [r for r in rows if not r.get("fits")], COLORS["tp_comm"], "x"),
              ("current plan", [baseline] if baseline else [], "black", "star"))
    for name, group, color, symbol in groups:
        group = [r for r in group if r.get("step_time_s") is not None]
        if not group:
            continue
        fig.add_trace(go.Scatter(
            x=[r.get("peak_gib") for r in group], y=[r["step_time_s"] for r in group],
            mode="markers", name=name, marker={"color": color, "size": 11, "symbol": symbol},
            hovertext=[f"#{r.get('rank')} {r.get('label', '')}" if name != "current plan"
                       else f"current: {r.get('label', '')}" for r in group],
            hovertemplate="%{hovertext}<br>%{y:.4g} s, %{x:.1f} GiB<extra></extra>",
        ))
    if capacity_gib:
        fig.add_vline(x=capacity_gib, line={"color": "#E45756", "dash": "dash"},
                      annotation_text=f"capacity {capacity_gib:.0f} GiB")
    fig.update_xaxes(title="peak memory per GPU (GiB)")
    fig.update_yaxes(title="step time (s)")
    return _layout(fig, f"Top {len(rows)} plans: step time vs memory")


def calibration_figure(rows: Sequence[Mapping[str, Any]]) -> go.Figure:
    """Predicted against measured step time, with y = x, a ±20% band and each run's spread."""
    fig = go.Figure()
    if rows:
        lo = min(min(r["measured_s"], r["predicted_s"]) for r in rows) * 0.8
        hi = max(max(r["measured_s"], r["predicted_s"]) for r in rows) * 1.25
        for factor, dash, name in ((1.0, "solid", "predicted = measured"), (1.2, "dot", "±20%"),
                                   (0.8, "dot", None)):
            fig.add_trace(go.Scatter(x=[lo, hi], y=[lo * factor, hi * factor], mode="lines",
                                     name=name, showlegend=name is not None,
                                     line={"color": "#999999", "dash": dash}, hoverinfo="skip"))
        fig.add_trace(go.Scatter(
            x=[r["measured_s"] for r in rows], y=[r["predicted_s"] for r in rows], mode="markers",
            name="measured runs", marker={"size": 10, "color": COLORS["compute"]},
            error_x={"type": "data", "array": [r.get("spread", 0.0) * r["measured_s"] / 2 for r in rows]},
            hovertext=[f"{r['name']}: {r['error']:+.1%}" for r in rows],
            hovertemplate="%{hovertext}<br>measured %{x:.4g} s, predicted %{y:.4g} s<extra></extra>",
        ))
        fig.update_xaxes(type="log")
        fig.update_yaxes(type="log")
    fig.update_xaxes(title="measured step time (s)")
    fig.update_yaxes(title="predicted step time (s)")
    return _layout(fig, f"Predicted vs measured step time ({len(rows)} scenarios)")
