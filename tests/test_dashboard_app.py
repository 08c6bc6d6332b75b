"""The dashboard page (app.py) as a new user meets it, driven with streamlit.testing's AppTest:
the closed form first and the event engine after, errors shown as written, the charts'
defects (asserted on the plotly figures the page sends), consistent counts, the whole-step
timeline, and predicted beside measured timelines for a stored run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO, base_scenario, measurement

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest

from simdist.dashboard.gantt import drawn_spans
from simdist.dashboard.text import md_unescape
from simdist.predict import predict
from simdist.spec.scenario import load_scenario, scenario_from_dict
from simdist.units import fmt_seconds

APP = str(REPO / "app.py")
TIMEOUT = 120
GPT3 = REPO / "scenarios" / "gpt3-175b-1024xa100.yaml"


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "runs.db"
    monkeypatch.setenv("SIMDIST_DB", str(path))  # never the user's run store
    return path


@pytest.fixture
def at(db: Path) -> AppTest:
    app = AppTest.from_file(APP, default_timeout=TIMEOUT)
    app.run()
    assert not app.exception, app.exception
    return app


def figures(at: AppTest) -> dict[str, dict[str, Any]]:
    """The page's plotly figures (as sent to the browser) by their key."""
    import plotly.graph_objects as go

    out = {}
    for el in at.get("plotly_chart"):
        key = el.proto.id.rsplit("-", 1)[-1] if el.proto.id else ""
        out[key] = go.Figure(json.loads(el.proto.spec))
    return out


def metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def texts(at: AppTest) -> list[str]:
    """Every message, caption, markdown and alert on the page, as the reader sees it."""
    out = []
    for kind in ("caption", "markdown", "info", "warning", "error", "success", "subheader"):
        out += [md_unescape(str(e.value)) for e in at.get(kind)]
    return out


# --- speed: the closed form at once, the event engine when ready ------------------------------


def stop_at_the_event_engine(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make the event engine's step fail loudly, so that a run shows what the page had drawn
    before it (the first pass); returns the engines asked for."""
    from simdist.dashboard import cache

    asked: list[str] = []

    def run_predict(scenario, engine, *args, **kwargs):
        asked.append(engine)
        raise RuntimeError("stopped before the event engine")

    monkeypatch.setattr(cache, "run_predict", run_predict)  # app.py imports it on every run
    return asked


def test_the_closed_form_is_drawn_before_the_event_engine_runs(db: Path, monkeypatch) -> None:
    import streamlit as st

    st.cache_resource.clear()
    try:
        asked = stop_at_the_event_engine(monkeypatch)
        app = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
        assert asked == ["des"]
        closed = predict(load_scenario(GPT3), engine="analytic", keep_spans=False)
        assert metric(app, "Step time") == fmt_seconds(closed.step_time_s)  # already on the page
        said = texts(app)
        assert any("the discrete-event engine is simulating the step" in t for t in said)
        assert any("The timeline appears when the discrete-event engine is done" in t for t in said)
        assert len(app.get("plotly_chart")) == 2  # breakdown and memory, from the closed form
        assert any("Something went wrong" in e.value for e in app.error)  # the stop, reported
    finally:
        st.cache_resource.clear()


def test_a_scenario_seen_before_skips_the_closed_form_pass(db: Path, monkeypatch) -> None:
    import streamlit as st

    st.cache_resource.clear()
    try:
        app = AppTest.from_file(APP, default_timeout=TIMEOUT).run()  # the event engine's prediction, cached
        des = predict(load_scenario(GPT3), engine="des", keep_spans=False)
        assert metric(app, "Step time") == fmt_seconds(des.step_time_s)
        assert not any("simulating the step" in t for t in texts(app))
        assert "fig_timeline" in figures(app)
        stop_at_the_event_engine(monkeypatch)
        app.run()
        assert not app.metric  # no closed-form pass: the cached prediction is drawn at once, in one pass
        assert not any("simulating the step" in t for t in texts(app))
    finally:
        st.cache_resource.clear()


def test_analytic_engine_draws_once_with_no_pending_note(at: AppTest) -> None:
    at.sidebar.radio(key="engine").set_value("analytic").run()
    assert not at.exception
    closed = predict(load_scenario(GPT3), engine="analytic", keep_spans=False)
    assert metric(at, "Step time") == fmt_seconds(closed.step_time_s)
    assert not any("simulating" in t for t in texts(at))
    assert any("engine closed form" in t for t in texts(at))


# --- errors as written --------------------------------------------------------------------------


def test_errors_keep_their_asterisks_and_underscores(at: AppTest) -> None:
    at.sidebar.number_input(key="p_cp").set_value(3).run()  # tp*pp*cp = 384 does not divide 1024
    assert not at.exception
    raw = [e.value for e in at.error]
    shown = [md_unescape(v) for v in raw]
    hit = next(s for s in shown if "tp*pp*cp" in s)
    assert hit.startswith("plan.")
    source = raw[shown.index(hit)]
    assert "\\*" in source and "tp*pp" not in source  # escaped: Markdown cannot italicise "pp"


# --- charts ------------------------------------------------------------------------------------


def test_pie_has_no_negligible_slice_and_a_legend_clear_of_the_title(at: AppTest) -> None:
    at.sidebar.selectbox(key="src_file").select("llama3-8b-fsdp-8xh100.yaml").run()  # no pipeline: bubble 0
    at.radio(key="breakdown_kind").set_value("pie").run()
    assert not at.exception
    fig = figures(at)["fig_breakdown"]
    (pie,) = fig.data
    total = sum(pie.values)
    assert min(pie.values) / total >= 0.0005
    assert "pipeline bubble" not in pie.labels
    assert all(len(t.split(".")[-1]) <= 2 for t in pie.text)  # "12.3%", never "1.23e-13%"
    assert all("e-" not in t for t in pie.text)
    assert fig.layout.legend.orientation == "v" and fig.layout.legend.x > 1  # right of the pie, not under the title
    assert any("not drawn" in a.text and "pipeline bubble" in a.text for a in fig.layout.annotations)


def test_capacity_is_in_the_legend_not_over_the_bars_when_a_stage_overflows(at: AppTest) -> None:
    at.sidebar.number_input(key="p_pp").set_value(2).run()  # out of memory
    assert not at.exception
    fig = figures(at)["fig_memory"]
    assert not any("capacity" in (a.text or "") for a in fig.layout.annotations)
    assert any(t.name == "GPU capacity 80 GiB" for t in fig.data)
    assert any(s.type == "line" and s.y0 == pytest.approx(80.0) for s in fig.layout.shapes)


def test_sweep_starts_at_valid_values_around_the_current_one_with_round_ticks(at: AppTest) -> None:
    box = at.text_input(key="sweep_values_nodes")
    values = [int(v) for v in box.value.split(",")]
    assert 128 in values and len(values) >= 3
    fig = figures(at)["fig_sweep"]
    assert "invalid" not in fig.layout.title.text
    for axis in (fig.layout.yaxis, fig.layout.yaxis2):
        lo, hi = axis.range
        assert lo == 0 and axis.dtick and round(hi / axis.dtick, 6).is_integer()
        mantissa = axis.dtick / 10 ** __import__("math").floor(__import__("math").log10(axis.dtick))
        assert round(mantissa, 6) in (1, 2, 2.5, 5)
    # the default follows the knob while the box is not edited ...
    at.sidebar.number_input(key="c_num_nodes").set_value(64).run()
    assert 64 in [int(v) for v in at.text_input(key="sweep_values_nodes").value.split(",")]
    # ... and an edited box is kept
    at.text_input(key="sweep_values_nodes").input("32, 64").run()
    at.sidebar.number_input(key="c_num_nodes").set_value(128).run()
    assert at.text_input(key="sweep_values_nodes").value == "32, 64"


def test_every_default_sweep_value_is_valid(at: AppTest) -> None:
    at.sidebar.number_input(key="p_tp").set_value(4).run()  # tp*pp = 64: 1024 nodes' worth, not any count
    at.selectbox(key="sweep").select("micro-batch size").run()
    assert not at.exception
    assert not any(c.startswith("micro-batch size = ") for c in texts(at))  # no invalid point listed
    assert "invalid" not in figures(at)["fig_sweep"].layout.title.text


def test_whole_step_timeline_with_zoom_and_a_caption_of_what_is_hidden(at: AppTest) -> None:
    fig = figures(at)["fig_timeline"]
    des = predict(load_scenario(GPT3), engine="des", keep_spans=False)
    assert fig.layout.xaxis.range[0] == 0 and fig.layout.xaxis.range[1] == pytest.approx(des.step_time_s, rel=1e-3)
    assert fig.layout.xaxis.rangeslider.visible
    drawn = drawn_spans(fig)
    assert max(end for *_, end in drawn) == pytest.approx(des.step_time_s, rel=1e-3)  # the last micro-batch too
    caption = next(t for t in texts(at) if t.startswith("The whole step"))
    assert "Drawn:" in caption and "of 16 pipeline stages" in caption
    shown = at.multiselect(key="timeline_stages_16").value
    if len(shown) < 16:
        assert "Not drawn" in caption
    # no gap the engine did not leave: the drawn bars of a lane cover what the engine's spans covered
    full = predict(load_scenario(GPT3), engine="des")
    rank = shown[0]
    lane = f"stage 0 (rank {rank}) · compute" if rank == 0 else next(lbl for _, lbl, *_ in drawn if f"(rank {rank})" in lbl)
    busy = sum(s.end - s.start for s in full.spans if s.rank == rank and s.stream == "compute")
    assert sum(e - s for _, lbl, s, e in drawn if lbl == lane) >= busy * (1 - 1e-9)
    at.multiselect(key="timeline_stages_16").set_value([120]).run()  # the last stage: tp 8, so rank 8 * 15
    assert not at.exception
    assert {lbl.split(" · ")[0] for _, lbl, *_ in drawn_spans(figures(at)["fig_timeline"])} == {"stage 15 (rank 120)"}


def test_full_scenario_name_is_shown(at: AppTest) -> None:
    long = "a-scenario-name-long-enough-to-be-cut-by-the-sidebar-text-box-at-1400-px"
    at.sidebar.text_input(key="s_name").input(long).run()
    assert not at.exception
    assert any(md_unescape(m.value).endswith(long) for m in at.markdown)


def test_search_table_fits_the_page(at: AppTest) -> None:
    at.sidebar.selectbox(key="src_file").select("llama3-8b-fsdp-8xh100.yaml").run()
    at.number_input(key="search_top").set_value(5)
    at.button(key="run_search").click().run()
    assert not at.exception
    table = next(d for d in at.dataframe if "step_time_s" in d.value.columns)
    assert "label" not in table.value.columns and "engine" not in table.value.columns
    config = json.loads(table.proto.columns)
    assert all(c.get("width") == "small" for name, c in config.items() if name in ("tp", "pp", "dp", "mbs"))


# --- calibration --------------------------------------------------------------------------------


def test_calibration_counts_add_up(db: Path) -> None:
    from simdist.calibrate.store import RunStore

    sc = scenario_from_dict(base_scenario())
    # a measurement stored without its scenario: it is counted, and no line says there is none
    RunStore(db).add("measurement", measurement(sc.name, sc.hash(), step_time_s=1.0))
    app = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not app.exception
    said = texts(app)
    assert any(t.startswith("1 stored measurement of 1 scenario:") and "without its scenario" in t for t in said)
    assert not any(t.startswith("No stored measurement") for t in said), said
    assert not any("measurement(s)" in t for t in said)


def test_predicted_and_measured_timelines_of_a_run_both_predicted_and_executed(db: Path) -> None:
    from simdist.calibrate.store import RunStore

    raw = base_scenario()
    sc = scenario_from_dict(raw)
    text = yaml.safe_dump(raw)
    store = RunStore(db)
    store.add("prediction", predict(sc, engine="analytic", keep_spans=False).to_dict(), text, engine="analytic")
    spans = [["forward", 0.0, 0.1], ["backward", 0.1, 0.3], ["optimizer", 0.35, 0.4]]
    timeline = {"step": 0, "step_time_s": 0.4, "ranks": [{"rank": r, "epoch": 1.79e9, "spans": spans} for r in (0, 1)]}
    store.add("measurement", measurement(sc.name, sc.hash(), step_time_s=0.4, timeline=timeline), text)
    app = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not app.exception, app.exception
    labels = app.selectbox(key="timeline_run").options
    assert len(labels) == 1 and labels[0].startswith(f"{sc.name} (run 2")  # the measurement, not the prediction
    fig = figures(app)["fig_two_timelines"]
    assert {t.yaxis for t in fig.data} == {"y", "y2"}  # a Gantt chart each
    assert fig.layout.xaxis.matches == "x2" or fig.layout.xaxis2.matches == "x"  # on one time axis
    phases = next(d.value for d in app.dataframe if "phase" in d.value.columns)
    row = phases.set_index("phase").loc["forward"]
    assert row["measured_s"] == pytest.approx(0.1) and row["predicted_s"] > 0
    assert any(t.startswith("1 stored measurement of 1 scenario: 1 compared") for t in texts(app))
