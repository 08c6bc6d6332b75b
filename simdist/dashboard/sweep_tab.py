"""The dashboard's Sweeps tab: a sweep's table from the server's run store (by sweep id) or an
uploaded CSV/Parquet from `simdist sweep --out`, drawn by :mod:`simdist.dashboard.sweep_results`:
a heatmap of two swept fields, the Pareto front of step time against GPU-hours (or cost), and
the best plan at each point."""

from __future__ import annotations

from typing import TYPE_CHECKING

import streamlit as st

from simdist.dashboard import sweep_results as sr
from simdist.errors import ScenarioError
from simdist.sweep.table import axis_columns, to_frame

if TYPE_CHECKING:
    import pandas as pd

SOURCES = ("run store", "uploaded table (CSV or Parquet)")
FORMATS = {
    "step_time_s": st.column_config.NumberColumn("step time (s)", format="%.3f"),
    "mfu": st.column_config.NumberColumn("MFU", format="percent"),
    "peak_gib": st.column_config.NumberColumn("peak GiB", format="%.1f"),
    "gpu_hours": st.column_config.NumberColumn("GPU-h/step", format="%.3f"),
    "cost": st.column_config.NumberColumn("cost/step", format="%.2f"),
}


def load_table() -> pd.DataFrame | None:
    """The sweep table the user picks, or None (with a message saying why)."""
    kind = st.radio("Sweep from", SOURCES, key="sw_source", horizontal=True)
    if kind == SOURCES[1]:
        upload = st.file_uploader("sweep table", type=["csv", "parquet"], key="sw_upload")
        if upload is None:
            st.caption("Upload the table `simdist sweep SWEEP.yaml --out FILE.csv` wrote.")
            return None
        try:
            return sr.read_upload(upload.name, upload.getvalue())
        except ValueError as exc:
            st.error(str(exc))
            return None
    from simdist.calibrate.store import default_db_path
    from simdist.sweep.store import SweepStore

    path = default_db_path()  # the server's own store, never created from here
    if not path.exists():
        st.caption("No run store on this server yet: `simdist sweep SWEEP.yaml` stores a sweep "
                   "(docs/sweeps.md), or upload a table.")
        return None
    try:
        store = SweepStore(path, create=False)
        ids = [s.sweep_id for s in store.sweeps()]
        if not ids:
            st.caption("No sweeps in the run store yet: `simdist sweep SWEEP.yaml` stores one "
                       "(docs/sweeps.md), or upload a table.")
            return None
        sweep_id = st.selectbox("sweep id", ids, key="sw_id")
        columns, rows = store.rows(sweep_id)
    except ScenarioError as exc:  # the store cannot be used: said, not raised
        st.error(f"The run store cannot be read ({exc.problems[0].message}).")
        return None
    return to_frame(columns, rows)


def sweep_tab() -> None:
    frame = load_table()
    if frame is None:
        return
    ok = int((frame["status"] == "ok").sum())
    st.caption(f"{len(frame):,} points, {ok:,} fit; swept: {', '.join(axis_columns(frame.columns)) or 'nothing'}")
    if ok == 0:
        st.warning("No point of this sweep fits: nothing to plot.")
    else:
        _heatmap(frame)
        _pareto(frame)
    st.subheader("The plan at each point")
    st.dataframe(sr.best_plans(frame), hide_index=True, key="sw_table", column_config=FORMATS)


def _heatmap(frame: pd.DataFrame) -> None:
    axes = axis_columns(frame.columns)
    if len(axes) < 2:
        st.caption("A heatmap needs two swept fields; this sweep has one.")
        return
    c1, c2, c3 = st.columns(3)
    metric = c1.selectbox("colour by", sr.metrics_of(frame), key="sw_metric")
    x = c2.selectbox("across", axes, index=0, key="sw_x")
    y = c3.selectbox("down", [a for a in axes if a != x], index=0, key="sw_y")
    grid = sr.heatmap(frame, x, y, metric)
    st.plotly_chart(sr.heatmap_figure(grid, x, y, metric), key="sw_fig_heatmap")


def _pareto(frame: pd.DataFrame) -> None:
    cost = "cost" if "cost" in sr.metrics_of(frame) and frame["cost"].notna().any() else "gpu_hours"
    front = sr.pareto_front(frame, cost=cost)
    st.plotly_chart(sr.pareto_figure(frame, front, cost=cost), key="sw_fig_pareto")
    st.caption(f"{len(front)} point(s) on the front: no other point is both faster and cheaper.")
