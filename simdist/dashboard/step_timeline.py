"""The Results tab's pipeline timeline (Streamlit): the whole step of one rank per pipeline stage,
drawn by :func:`simdist.viz.timeline_figure` from :func:`simdist.dashboard.gantt.step_gantt`,
with a caption that says what is not drawn, and the Perfetto download of every span."""

from __future__ import annotations

import json

import streamlit as st

from simdist import viz
from simdist.dashboard.gantt import step_gantt
from simdist.dashboard.text import md_escape
from simdist.results import Prediction
from simdist.spec.plan import rank_coord
from simdist.spec.scenario import Scenario
from simdist.trace.perfetto import chrome_trace


def stage_labels(scenario: Scenario, ranks: list[int]) -> dict[int, str]:
    plan, out = scenario.plan, {}
    for r in ranks:
        c = rank_coord(r, plan) if 0 <= r < scenario.world_size else None
        out[r] = f"stage {c.pp} (rank {r})" if c else f"rank {r}"
    return out


def timeline(scenario: Scenario, pred: Prediction) -> None:
    st.subheader("Pipeline timeline")
    if not pred.spans:
        dropped = pred.extras.get("spans_dropped")
        st.info(f"This step has {dropped:,} spans, more than the page keeps: `simdist trace FILE` writes them "
                "for https://ui.perfetto.dev." if dropped else
                "The timeline comes from the discrete-event engine's spans; this prediction has none "
                f"(engine: {pred.engine}).")
        return
    plan = scenario.plan
    reps = [s * plan.cp * plan.tp for s in range(plan.pp)]  # (dp 0, stage s, cp 0, tp 0)
    simulated = sorted({s.rank for s in pred.spans})
    labels = stage_labels(scenario, sorted(set(reps) | set(simulated)))
    default = step_gantt(pred.spans, reps)
    picked = default.ranks
    if len(default.all_ranks) > 1:
        picked = st.multiselect("pipeline stages drawn", default.all_ranks, default=default.ranks,
                                format_func=lambda r: labels.get(r, f"rank {r}"),
                                key=f"timeline_stages_{len(default.all_ranks)}") or default.ranks
    gantt = default if picked == default.ranks else step_gantt(pred.spans, reps, chosen=picked)
    st.plotly_chart(viz.timeline_figure(gantt.spans, labels, x_end=gantt.end), key="fig_timeline")
    st.caption(md_escape(gantt.caption(labels, len(simulated), scenario.world_size)))

    def trace_json() -> str:  # built only when the button is pressed
        data = chrome_trace(pred.spans, stage_of=lambda r: rank_coord(r, plan).pp,
                            metadata={"scenario": scenario.name, "engine": pred.engine})
        return json.dumps(data)

    st.download_button("Download Perfetto trace", trace_json, file_name=f"{scenario.name}.trace.json",
                       mime="application/json", key="dl_trace",
                       help="every simulated span; open it in https://ui.perfetto.dev")
