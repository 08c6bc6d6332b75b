"""The measured step beside the predicted one: two Gantt charts on one time axis.

For a stored measurement that kept its timeline (every `simdist run` does; with `--trace` it also
has the collectives and waits from torch.profiler), the upper chart is the event engine's
prediction of every rank, the lower one what the executor measured, both in seconds from the
start of the step (simdist.calibrate.timelines). A table gives the per-phase times of both
sides and the error; the combined Perfetto file can be downloaded.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from simdist.results import Span

PHASE_COLORS = {"allreduce": "#54A24B", "allgather": "#88D27A", "reducescatter": "#2E7D32", "sendrecv": "#B279A2",
                "alltoall": "#9C6ADE", "broadcast": "#6B8E23", "push": "#54A24B", "pull": "#88D27A",
                "waits": "#E45756", "bubble": "#BAB0AC", "barrier": "#777777"}


def two_gantt_figure(predicted: Sequence[Span], measured: Sequence[Span], title: str = "") -> Any:
    """Plotly figure: predicted (top) and measured (bottom) Gantt charts sharing the x axis."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from simdist.calibrate.timelines import phase_of
    from simdist.viz import COLORS

    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("predicted (event engine)", "measured (executor)"))
    shown: set[str] = set()
    for row, spans in ((1, predicted), (2, measured)):
        lanes = sorted({(s.rank, s.stream) for s in spans})
        by_phase: dict[str, list[Span]] = {}
        for s in spans:
            by_phase.setdefault(phase_of(s), []).append(s)
        for phase, group in sorted(by_phase.items()):
            fig.add_trace(go.Bar(
                name=phase, legendgroup=phase, showlegend=phase not in shown, orientation="h",
                base=[s.start for s in group], x=[max(s.end - s.start, 1e-9) for s in group],
                y=[f"rank {s.rank} · {s.stream}" for s in group],
                marker={"color": PHASE_COLORS.get(phase) or COLORS.get(phase) or COLORS.get(group[0].category or "",
                                                                                       "#888888"),
                        "line": {"width": 0}},
                hovertext=[f"{s.name}: {s.start * 1e3:.2f} to {s.end * 1e3:.2f} ms" for s in group],
                hoverinfo="text+name"), row=row, col=1)
            shown.add(phase)
        fig.update_yaxes(categoryorder="array", categoryarray=[f"rank {r} · {st}" for r, st in lanes],
                         autorange="reversed", row=row, col=1)
    fig.update_layout(barmode="overlay", bargap=0.15, title=title, height=260 + 28 * (
        len({(s.rank, s.stream) for s in predicted}) + len({(s.rank, s.stream) for s in measured})))
    fig.update_xaxes(title="seconds from the start of the step", row=2, col=1)
    return fig


def phase_rows(predicted: Sequence[Span], measured: Sequence[Span]) -> list[dict[str, Any]]:
    """Per-phase seconds (mean over ranks) of both timelines, with the error."""
    from simdist.calibrate.timelines import phase_totals

    got, want = phase_totals(list(measured)), phase_totals(list(predicted))
    return [{"phase": k, "measured_s": got.get(k, 0.0), "predicted_s": want.get(k, 0.0),
             "error": (want.get(k, 0.0) / got[k] - 1) if got.get(k) else None} for k in sorted(set(got) | set(want))]


def timelines_section(store: Any, profile: Any) -> None:
    """Streamlit: pick a stored measurement and show its two timelines (the Calibration tab)."""
    import streamlit as st
    import yaml

    from simdist.calibrate.compare import as_run_dict
    from simdist.calibrate.timelines import measured_spans, predicted_spans, two_timelines
    from simdist.dashboard.text import md_escape
    from simdist.errors import ScenarioError
    from simdist.spec.measurement import Measurement
    from simdist.spec.scenario import scenario_from_dict

    stored = store.runs("measurement")
    runs = [r for r in stored if r.scenario_yaml and (r.payload or {}).get("timeline")]
    st.subheader("Predicted and measured timelines")
    if not runs:
        which = "No stored measurement has" if not stored else (
            "The stored measurement has no" if len(stored) == 1 else f"None of the {len(stored):,} stored measurements has")
        st.caption(f"{which} timeline with its scenario yet: `simdist run FILE --nproc N` (add `--trace DIR` "
                   "for the collectives) keeps one.")
        return
    labels = {f"{r.name} (run {r.id}, {r.created})": r for r in reversed(runs)}
    run = labels[st.selectbox("measurement", list(labels), key="timeline_run")]
    try:
        m = Measurement.from_dict(run.payload)
        sc = scenario_from_dict(as_run_dict(yaml.safe_load(run.scenario_yaml), m.extras.get("as_run") or {}))
        predicted, step = predicted_spans(sc, profile)
    except ScenarioError as exc:
        st.warning(md_escape(f"Cannot predict {run.name}: {exc.problems[0]}"))
        return
    measured = measured_spans(m, m.extras.get("trace_dir"))
    st.caption(f"predicted step {step:.4g} s, measured median step {m.step_time_s:.4g} s"
               + (" (traced: the profiler slowed the measured steps)" if m.extras.get("traced") else ""))
    st.plotly_chart(two_gantt_figure(predicted, measured, run.name), key="fig_two_timelines")
    st.dataframe(phase_rows(predicted, measured), hide_index=True, key="timeline_phases")
    st.download_button("Download both timelines (Perfetto JSON)",
                       json.dumps(two_timelines(predicted, measured, {"scenario": run.name})),
                       file_name=f"{run.name}-timelines.json", mime="application/json", key="dl_two_timelines")
