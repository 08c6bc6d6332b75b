"""The dashboard's tabs: results (metrics, breakdown, memory, timeline), what-if (pin and
compare, one-knob sweeps), calibration (stored runs, predicted vs measured) and plan search."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import streamlit as st

from simdist import viz
from simdist.calibrate.compare import compare_stored
from simdist.calibrate.store import RunStore, default_db_path
from simdist.dashboard.cache import cached_sweep
from simdist.dashboard.diff import diff_fields, metric_deltas
from simdist.dashboard.knobs import PLAN_KNOBS, knob_view
from simdist.dashboard.sweep import SWEEPS, parse_values
from simdist.dashboard.sweep_defaults import valid_default_values
from simdist.dashboard.tables import calibration_rows, search_rows, store_summary
from simdist.dashboard.text import md_escape
from simdist.dashboard.timelines import timelines_section
from simdist.dashboard.uploads import shown
from simdist.errors import ScenarioError
from simdist.results import Prediction
from simdist.search import Constraints, search
from simdist.spec.profile import CalibrationProfile
from simdist.spec.scenario import Scenario
from simdist.units import fmt_seconds

ss = st.session_state
ENGINE_NAMES = {"des": "discrete-event", "analytic": "closed form"}
NUMBER_FORMATS = {  # table columns: seconds, fractions and GiB, readable
    "step_time_s": st.column_config.NumberColumn("step time (s)", format="%.3f"),
    "mfu": st.column_config.NumberColumn("MFU", format="percent"),
    "peak_gib": st.column_config.NumberColumn("peak GiB", format="%.1f"),
    "measured_s": st.column_config.NumberColumn("measured (s)", format="%.4g"),
    "predicted_s": st.column_config.NumberColumn("predicted (s)", format="%.4g"),
    "error": st.column_config.NumberColumn("error", format="percent"),
    "spread": st.column_config.NumberColumn("run spread", format="percent"),
}


SEARCH_COLUMNS = {**{c: st.column_config.Column(c, width="small") for c in (
    "rank", "tp", "pp", "dp", "cp", "ep", "vpp", "zero", "sp", "mbs", "fits")},
    "schedule": st.column_config.TextColumn("schedule", width="small"),
    "recompute": st.column_config.TextColumn("recompute", width="small"),
    **{k: NUMBER_FORMATS[k] for k in ("step_time_s", "mfu", "peak_gib")}}


def show_problems(exc: ScenarioError, base_dir: Path | None = None) -> None:
    """One error per problem, naming its field (an upload's private folder left out)."""
    for problem in exc.problems:
        st.error(md_escape(shown(str(problem), base_dir)))


# --- results ------------------------------------------------------------------------------------


def results_tab(scenario: Scenario, pred: Prediction, note: str, pending: bool = False) -> None:
    """The headline: metrics, the memory verdict, the plan, a note. ``pending``: these are the
    closed form's numbers, shown while the discrete-event engine runs (replaced when it is done:
    both passes draw the same elements, so that the second replaces each of the first's)."""
    c1, c2, c3, c4 = st.columns(4)
    c1.metric("Step time", fmt_seconds(pred.step_time_s))
    c2.metric("Tokens/s", f"{pred.tokens_per_s:,.0f}")
    c3.metric("MFU", f"{pred.mfu:.1%}", help=f"{pred.model_tflops_per_gpu:.0f} model TFLOP/s per GPU")
    c4.metric("Peak memory", f"{pred.peak_gib:.1f} GiB", help=f"of {pred.capacity_gib:.0f} GiB per GPU")
    if pred.fits:
        st.badge(f"fits: {pred.peak_gib:.1f} of {pred.capacity_gib:.0f} GiB", icon=":material/check:", color="green")
    else:
        st.badge(f"out of memory: {pred.peak_gib:.1f} of {pred.capacity_gib:.0f} GiB", icon=":material/error:", color="red")
    st.caption(md_escape(f"{scenario.world_size} GPUs · tp {scenario.plan.tp} · pp {scenario.plan.pp} · "
                         f"dp {scenario.plan.dp} · {scenario.plan.num_microbatches} micro-batches per pipeline "
                         f"· bubble {pred.bubble_fraction:.1%} · engine {ENGINE_NAMES.get(pred.engine, pred.engine)}"))
    from simdist.economics import cost_lines, run_cost  # $ per step and GPU energy (issue 18)

    cost = run_cost(scenario, pred)
    st.metric("Cost per step", "no price" if cost.usd_per_step is None else f"${cost.usd_per_step:,.2f}",
              help=md_escape(" · ".join(cost_lines(cost))))
    # one element in both passes (a block redrawn in the same run keeps children it is not given)
    notice = st.empty()
    if pending:
        notice.info("Closed-form numbers; the discrete-event engine is simulating the step (its numbers and "
                    "the timeline replace these when it is done).", icon=":material/hourglass_top:")
    elif note:
        notice.warning(md_escape(note))


def results_figures(pred: Prediction, kind: str, final: bool = True) -> None:
    """The breakdown and memory charts (``final``: the chosen engine's, with their keys)."""
    c1, c2 = st.columns(2)
    c1.plotly_chart(viz.breakdown_figure(pred, kind), key="fig_breakdown" if final else None)
    c2.plotly_chart(viz.memory_figure(pred), key="fig_memory" if final else None)


def assumptions(pred: Prediction) -> None:
    with st.expander("Assumptions"):
        for line in pred.assumptions:
            st.markdown(f"- {md_escape(line)}")


# --- what-if ------------------------------------------------------------------------------------


def whatif_tab(raw: dict[str, Any], base_dir: Path, scenario: Scenario, pred: Prediction,
               profile: CalibrationProfile | None) -> None:
    view = knob_view(raw, scenario, ss)
    c1, c2 = st.columns([1, 4])
    if c1.button("Pin this plan", key="pin", type="primary"):
        ss.pinned = {"name": scenario.name, "view": view, "pred": dataclasses.replace(pred, spans=())}
    if "pinned" in ss and c2.button("Unpin", key="unpin"):
        del ss.pinned
    if "pinned" not in ss:
        st.info("Pin the current plan, then change the knobs in the sidebar to compare.")
    else:
        compare(ss.pinned, view, pred)
    st.subheader("Sweep (analytic engine)")
    c1, c2 = st.columns([1, 2])
    sweep = c1.selectbox("vary", list(SWEEPS), key="sweep")
    current = {"nodes": ss.c_num_nodes, "micro-batch size": ss.p_mbs}.get(sweep)
    defaults = ", ".join(map(str, valid_default_values(raw, base_dir, sweep, current)))
    key = f"sweep_values_{sweep}"
    if ss.get(key) is None or ss.get(key) == ss.get(f"_{key}_default"):  # not edited: follows the knobs
        ss[key] = defaults
    ss[f"_{key}_default"] = defaults
    text = c2.text_input("values (comma-separated)", key=key,
                         help="by default, valid values around the current one, the current one included")
    try:
        values = parse_values(text, sweep)
    except ValueError as exc:
        st.error(md_escape(f"sweep values: {exc}"))
        return
    points = cached_sweep(json.dumps(raw, sort_keys=True), str(base_dir), sweep, json.dumps(values),
                          ss["_profile_key"], profile)
    st.plotly_chart(viz.sweep_figure(points, sweep, log_x=True), key="fig_sweep")
    for p in points:
        if p.problem:
            st.caption(md_escape(f"{sweep} = {p.label}: {p.problem}"))


def compare(pinned: dict[str, Any], view: dict[str, Any], pred: Prediction) -> None:
    a: Prediction = pinned["pred"]
    deltas = metric_deltas(a, pred)
    st.markdown(f"**Pinned** `{pinned['name']}` vs **current**")

    def color(change: float, lower_is_better: bool) -> Any:
        return "off" if abs(change) < 1e-9 else "inverse" if lower_is_better else "normal"

    c = st.columns(4)
    st_a, st_b, st_d = deltas["step_time_s"]
    c[0].metric("Step time (current)", fmt_seconds(st_b), f"{st_d:+.1%} vs {fmt_seconds(st_a)}",
                delta_color=color(st_d, True))
    tk_a, tk_b, tk_d = deltas["tokens_per_s"]
    c[1].metric("Tokens/s (current)", f"{tk_b:,.0f}", f"{tk_d:+.1%} vs {tk_a:,.0f}", delta_color=color(tk_d, False))
    mf_a, mf_b, _ = deltas["mfu"]
    c[2].metric("MFU (current)", f"{mf_b:.1%}", f"{100 * (mf_b - mf_a):+.1f} pts vs {mf_a:.1%}",
                delta_color=color(mf_b - mf_a, False))
    pk_a, pk_b, _ = deltas["peak_gib"]
    c[3].metric("Peak memory (current)", f"{pk_b:.1f} GiB", f"{pk_b - pk_a:+.1f} GiB vs {pk_a:.1f}",
                delta_color=color(pk_b - pk_a, True))
    diffs = diff_fields(pinned["view"], view)
    if diffs:
        st.dataframe([{"field": f, "pinned": str(x), "current": str(y)} for f, x, y in diffs],
                     hide_index=True, key="diff_table")
    else:
        st.caption("The current plan is the pinned one.")
    st.plotly_chart(viz.compare_figure(a, pred), key="fig_compare")


# --- calibration --------------------------------------------------------------------------------


def calibration_tab(profile: CalibrationProfile | None) -> None:
    """The server's own run store (SIMDIST_DB, or the default): its path is not the page's to
    choose (a typed path would create files anywhere), and it is never created from here."""
    st.caption("The server's run store; predictions use the calibration profile uploaded in the sidebar, if any.")
    path = default_db_path()
    if not path.exists():
        st.info("No run store on this server yet: `simdist run FILE --nproc N` stores a measurement.")
        return
    try:
        store = RunStore(path)
        measurements = store.runs("measurement")
        comparisons, skipped = compare_stored(store, profile)
    except (OSError, sqlite3.Error) as exc:  # a broken store (StoreError is an sqlite3.Error)
        st.warning(f"Could not read the server's run store ({type(exc).__name__}).")
        return
    rows = calibration_rows(comparisons)
    newest = {r.scenario_hash: r for r in measurements}  # compare_stored compares the newest of each
    without = sum(1 for r in newest.values() if not r.scenario_yaml)
    summary = store_summary(len(measurements), len(newest), len(rows), len(skipped), without)
    (st.caption if rows else st.info)(summary)
    if rows:
        st.plotly_chart(viz.calibration_figure(rows), key="fig_calibration")
        st.dataframe(rows, hide_index=True, key="calibration_table", column_config=NUMBER_FORMATS,
                     width="stretch")
    for line in skipped:
        st.caption(md_escape(f"skipped {line}"))
    timelines_section(store, profile)  # predicted and measured timelines, simdist.dashboard.timelines


# --- plan search --------------------------------------------------------------------------------


def use_plan(fields: dict[str, Any]) -> None:
    """Load a searched plan into the sidebar's plan knobs."""
    for key, field in PLAN_KNOBS.items():
        if field in fields:
            ss[key] = fields[field]


def search_tab(scenario: Scenario, profile: CalibrationProfile | None) -> None:
    st.caption("Keeps the model, the cluster, the global batch and the precision; searches tp, pp, "
               "dp, cp, virtual stages, schedule, ZeRO stage, sequence parallel, recompute and "
               "micro-batch size.")
    c1, c2, c3 = st.columns([1, 2, 2])
    top = int(c1.number_input("top plans", 1, 200, 10, key="search_top"))
    engine = c2.selectbox("rank with", ["analytic", "auto"], key="search_engine",
                          format_func=lambda e: {"analytic": "closed form (seconds)",
                                                 "auto": "closed form, then the DES for the top"}[e])
    if c3.button("Search plans", key="run_search", type="primary"):
        bar = st.progress(0.0, "searching...")
        shown = [0.0]

        def progress(stage: str, done: int, total: int) -> None:
            if time.monotonic() - shown[0] > 0.25 or done == total:  # a few updates a second
                shown[0] = time.monotonic()
                bar.progress(min(1.0, done / max(total, 1)), f"{stage}: {done:,}/{total:,}")

        try:
            result = search(scenario, Constraints(top=top, engine=engine), progress=progress, profile=profile)
        except ScenarioError as exc:
            show_problems(exc)
            return
        finally:
            bar.empty()
        ss.search_result = (scenario.hash(), result)
    if "search_result" not in ss:
        return
    key, result = ss.search_result
    if key != scenario.hash():
        st.caption("These plans were searched for an earlier scenario; search again to update.")
    d = result.to_dict()
    st.caption(f"{d['evaluated']:,} plans evaluated, {d['feasible']:,} fit, in {d['seconds']:.1f} s; "
               f"top ranked by the {d['engine']} engine")
    for note in d["notes"]:
        st.caption(md_escape(note))
    rows = search_rows(d)
    if not rows:
        st.warning("No plan fits in memory.")
        return
    # every column narrow and the table as wide as the page: nothing scrolls out of view at 1400 px
    # (the long "label" column repeats the plan columns; it stays in the chart's hover)
    shown = [{k: v for k, v in r.items() if k not in ("label", "engine")} for r in rows]
    st.dataframe(shown, hide_index=True, key="search_table", width="stretch", column_config=SEARCH_COLUMNS)
    baseline = search_rows([d["baseline"]])[0] if d["baseline"] else None
    st.plotly_chart(viz.search_figure(rows, d["capacity_gib"], baseline), key="fig_search")
    c1, c2 = st.columns([1, 3])
    pick = int(c1.selectbox("plan", [r["rank"] for r in rows], key="search_pick"))
    c2.button("Use this plan in the sidebar", key="use_plan", on_click=use_plan,
              args=(d["plans"][pick - 1]["plan"],))
