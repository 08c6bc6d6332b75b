"""A sweep's table (from `simdist sweep`: a CSV or Parquet file, or the run store's sweep id) as
figures, pure (no Streamlit): a heatmap of two swept fields against step time, MFU, cost or
goodput;
the Pareto front of step time against GPU-hours (or cost); the best plan at each point.

Swept fields are the table's columns with a dot in their name (``cluster.num_nodes``); the
results are the columns of :data:`simdist.sweep.points.RESULT_COLUMNS`. A heatmap cell over
points that differ in a third swept field shows the best of them (the least time or cost, the
most MFU).
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go

from simdist.sweep.table import axis_columns, normalized

if TYPE_CHECKING:
    import pandas as pd

# metric -> (column, title, lower is better)
METRICS: dict[str, tuple[str, str, bool]] = {
    "step time": ("step_time_s", "step time (s)", True),
    "MFU": ("mfu", "MFU", False),
    "cost per step": ("cost", "cost per step", True),
    "GPU-hours per step": ("gpu_hours", "GPU-hours per step", True),
    "goodput": ("goodput", "expected goodput", False),
}
BEST_PLAN_COLUMNS = ("status", "gpus", "step_time_s", "mfu", "peak_gib", "gpu_hours", "cost", "goodput", "plan",
                     "problem")


def read_upload(name: str, data: bytes) -> pd.DataFrame:
    """A sweep table uploaded as CSV or Parquet (by its name); ValueError if it is not one."""
    import pandas as pd

    try:
        if name.lower().endswith(".parquet"):
            frame = pd.read_parquet(io.BytesIO(data))
        else:
            frame = pd.read_csv(io.BytesIO(data))
    except Exception as exc:  # pandas raises many kinds for a file that is not a table
        raise ValueError(f"{name} is not a sweep table ({type(exc).__name__})") from None
    missing = {"status", "step_time_s"} - set(frame.columns)
    if missing:
        raise ValueError(f"{name} is not a sweep table from `simdist sweep` (no {', '.join(sorted(missing))} column)")
    return normalized(frame)


def metrics_of(frame: pd.DataFrame) -> list[str]:
    """The metrics this table can show (cost only where the sweep priced the GPU-hours)."""
    return [name for name, (col, _, _) in METRICS.items() if col in frame and frame[col].notna().any()]


def heatmap(frame: pd.DataFrame, x: str, y: str, metric: str) -> pd.DataFrame:
    """The ``metric`` over swept fields ``x`` (columns) and ``y`` (rows), the best point of each
    cell over the other swept fields; cells with no fitting point are NaN."""
    col, _, lower = METRICS[metric]
    ok = frame[frame["status"] == "ok"]
    grid = ok.pivot_table(index=y, columns=x, values=col, aggfunc="min" if lower else "max")
    return grid.reindex(index=_order(frame[y]), columns=_order(frame[x]))


def _order(values: pd.Series) -> list[Any]:
    """A swept field's values in the order the sweep ran them."""
    return list(dict.fromkeys(values.tolist()))


def heatmap_figure(grid: pd.DataFrame, x: str, y: str, metric: str) -> go.Figure:
    _, title, lower = METRICS[metric]
    text = [[_fmt(v, metric) for v in row] for row in grid.to_numpy().tolist()]
    fig = go.Figure(go.Heatmap(z=grid.to_numpy(), x=[str(v) for v in grid.columns], y=[str(v) for v in grid.index],
                               text=text, texttemplate="%{text}", colorscale="Viridis", reversescale=lower,
                               colorbar={"title": title}, hoverongaps=False))
    fig.update_layout(title=f"{metric} ({'best' if lower else 'highest'} over other swept fields)",
                      xaxis_title=x, yaxis_title=y, xaxis_type="category", yaxis_type="category",
                      height=420, margin={"l": 10, "r": 10, "t": 50, "b": 10})
    return fig


def _fmt(v: float, metric: str) -> str:
    if v != v:  # NaN: no point fits there
        return ""
    if metric in ("MFU", "goodput"):
        return f"{v:.1%}"
    return f"{v:.3g}"


def pareto_front(frame: pd.DataFrame, cost: str = "gpu_hours", time: str = "step_time_s") -> pd.DataFrame:
    """The fitting points no other point beats on both ``time`` and ``cost`` (at least as good
    on both and better on one), cheapest first; equal points are all on it."""
    ok = frame[(frame["status"] == "ok") & frame[cost].notna() & frame[time].notna()]
    ok = ok.sort_values([cost, time], kind="stable")
    keep, best_time, best_cost = [], float("inf"), None
    for index, c, t in zip(ok.index, ok[cost], ok[time], strict=True):
        if t < best_time or (t == best_time and c == best_cost):  # a tie with a front point is on it
            keep.append(index)
            best_time, best_cost = t, c
    return ok.loc[keep]


def pareto_figure(frame: pd.DataFrame, front: pd.DataFrame, cost: str = "gpu_hours") -> go.Figure:
    ok = frame[frame["status"] == "ok"]
    axes = axis_columns(frame.columns)

    def label(r: Any) -> str:
        return ", ".join(f"{a.split('.')[-1]}={r[a]}" for a in axes) + f"<br>{r.get('plan', '')}"

    cost_title = METRICS["cost per step"][1] if cost == "cost" else METRICS["GPU-hours per step"][1]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=ok[cost], y=ok["step_time_s"], mode="markers", name="points",
                             text=[label(r) for _, r in ok.iterrows()], hoverinfo="text+x+y",
                             marker={"color": "lightgray", "size": 8}))
    fig.add_trace(go.Scatter(x=front[cost], y=front["step_time_s"], mode="lines+markers", name="Pareto front",
                             text=[label(r) for _, r in front.iterrows()], hoverinfo="text+x+y",
                             line={"shape": "hv"}, marker={"size": 10}))
    fig.update_layout(title=f"step time against {cost_title}: the Pareto front", xaxis_title=cost_title,
                      yaxis_title="step time (s)", height=420, margin={"l": 10, "r": 10, "t": 50, "b": 10})
    return fig


def best_plans(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per point: its swept values, then the best plan (search) or the plan (predict)."""
    cols = [*axis_columns(frame.columns), *(c for c in BEST_PLAN_COLUMNS if c in frame)]
    return frame[cols].reset_index(drop=True)
