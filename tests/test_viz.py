"""The dashboard's figure builders and helpers: pure functions, no Streamlit."""

from __future__ import annotations

import subprocess
import sys

import plotly.graph_objects as go
import pytest
from conftest import REPO, base_scenario

from simdist import viz
from simdist.dashboard import diff, sweep, tables
from simdist.dashboard.gantt import drawn_spans
from simdist.predict import predict
from simdist.results import Prediction, Span, StageMemoryReport
from simdist.spec.scenario import scenario_from_dict


def make_prediction(step: float = 10.0, peaks: tuple[float, ...] = (30.0, 20.0), capacity: float = 80.0,
                    **breakdown: float) -> Prediction:
    parts = breakdown or {"compute": 6.0, "recompute": 0.0, "tp_comm": 1.0, "pp_comm": 0.5,
                          "dp_comm": 0.5, "bubble": 1.5, "optimizer": 0.5}
    stages = tuple(StageMemoryReport(stage=i, params_gib=p * 0.1, grads_gib=p * 0.1, optimizer_gib=p * 0.4,
                                     activations_gib=p * 0.3, other_gib=p * 0.1, peak_gib=p)
                   for i, p in enumerate(peaks))
    return Prediction(name="t", world_size=16, step_time_s=step, tokens_per_s=1e5,
                      model_flops_per_step=1e18, model_tflops_per_gpu=100.0, mfu=0.4,
                      bubble_fraction=0.15, breakdown_s=parts, per_stage=stages, capacity_gib=capacity)


def pipeline_spans(stages: int = 2, microbatches: int = 4, t: float = 1.0) -> list[Span]:
    """GPipe-like spans: stage s runs F mb i at (s + i) * t, then the backwards; a DP all-reduce."""
    spans = []
    for s in range(stages):
        for i in range(microbatches):
            f0 = (s + i) * t
            spans.append(Span(s, "compute", f"F mb{i} chunk0", f0, f0 + t, "forward"))
            b0 = (stages + microbatches + (stages - 1 - s) + i) * t
            spans.append(Span(s, "compute", f"B mb{i} chunk0", b0, b0 + t, "backward"))
            spans.append(Span(s, "pp", "sendrecv pp 6.0 MiB", f0 + t, f0 + 1.1 * t, "pp_comm"))
        end = (2 * stages + 2 * microbatches) * t
        spans.append(Span(s, "dp", "allreduce dp 1 GiB", end, end + t, "dp_comm"))
    return spans


@pytest.mark.parametrize("module", ["simdist.viz", "simdist.dashboard.knobs", "simdist.dashboard.diff",
                                    "simdist.dashboard.sweep", "simdist.dashboard.tables", "simdist.dashboard.gantt",
                                    "simdist.dashboard.text", "simdist.dashboard.sweep_defaults"])
def test_figures_and_dashboard_logic_do_not_import_streamlit(module: str) -> None:
    code = f"import sys, {module}; assert 'streamlit' not in sys.modules, '{module} imported streamlit'"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_breakdown_bar_and_pie() -> None:
    pred = make_prediction()
    fig = viz.breakdown_figure(pred)
    assert isinstance(fig, go.Figure)
    (bar,) = fig.data
    assert bar.type == "bar"
    assert sum(bar.x) == pytest.approx(pred.step_time_s)
    assert "exposed TP comm" in bar.y and "pipeline bubble" in bar.y
    assert "10.000 s" in fig.layout.title.text
    pie = viz.breakdown_figure(pred, kind="pie")
    assert pie.data[0].type == "pie"
    assert list(pie.data[0].values) == list(bar.x)


def test_breakdown_keeps_extension_keys() -> None:
    pred = make_prediction(compute=8.0, offload=2.0)
    labels = viz.breakdown_figure(pred).data[0].y
    assert list(labels) == ["compute", "offload"]


def test_memory_figure_stacks_parts_against_capacity() -> None:
    pred = make_prediction(peaks=(30.0, 20.0), capacity=80.0)
    fig = viz.memory_figure(pred)
    bars = [t for t in fig.data if t.type == "bar"]
    assert [t.name for t in bars] == ["params", "grads", "optimizer", "activations", "other"]
    assert list(bars[0].x) == ["stage 0", "stage 1"]
    assert sum(t.y[0] for t in bars) == pytest.approx(30.0)
    assert fig.layout.barmode == "stack"
    (line,) = fig.layout.shapes
    assert line.y0 == line.y1 == 80.0
    assert "fits" in fig.layout.title.text


def test_memory_figure_flags_out_of_memory() -> None:
    fig = viz.memory_figure(make_prediction(peaks=(95.0, 60.0), capacity=80.0))
    assert "OUT OF MEMORY" in fig.layout.title.text
    assert fig.layout.yaxis.range[1] > 95.0  # the tallest bar is not cut off


def test_microbatch_of() -> None:
    assert viz.microbatch_of(Span(0, "compute", "F mb12 chunk1", 0, 1)) == 12
    assert viz.microbatch_of(Span(0, "dp", "allreduce dp 48 MiB", 0, 1)) is None


def test_idle_gaps() -> None:
    spans = [Span(0, "compute", "F mb0", 1.0, 2.0, "forward"), Span(0, "compute", "F mb1", 3.0, 4.0, "forward"),
             Span(0, "dp", "allreduce", 0.0, 5.0, "dp_comm")]
    gaps = viz.idle_gaps(spans)
    assert [(g.start, g.end, g.category) for g in gaps] == [(0.0, 1.0, "idle"), (2.0, 3.0, "idle")]


def test_timeline_figure_rows_and_categories() -> None:
    spans = pipeline_spans(stages=2, microbatches=2)
    fig = viz.timeline_figure(spans, rank_labels={0: "stage 0", 1: "stage 1"})
    names = [t.name for t in fig.data if t.showlegend is not False]  # each category once in the legend
    assert names[:2] == ["forward", "backward"] and "idle" in names and "pp_comm" in names
    hover = next(t for t in fig.data if t.name == "forward" and t.mode == "markers")
    assert len(hover.hovertext) == 4 and "F mb0 chunk0" in hover.hovertext[0]  # one hover point per span
    drawn = drawn_spans(fig)
    fwd = [d for d in drawn if d[0] == "forward"]
    assert min(start for _, _, start, _ in fwd) == 0.0 and all(e - s == pytest.approx(1.0) for _, _, s, e in fwd)
    assert {lane for _, lane, _, _ in fwd} == {"stage 0 · compute", "stage 1 · compute"}
    assert len(drawn) == len(spans) + len([t for t in drawn if t[0] == "idle"])  # every span, and the idle gaps
    rows = list(fig.layout.yaxis.ticktext)
    assert rows[0] == "stage 0 · compute" and rows[-1] == "stage 1 · dp"


def test_timeline_uses_engine_idle_spans_when_given() -> None:
    spans = [Span(0, "compute", "F mb0", 1.0, 2.0, "forward"), Span(0, "compute", "wait", 0.0, 1.0, "idle")]
    fig = viz.timeline_figure(spans)
    assert [d for d in drawn_spans(fig) if d[0] == "idle"] == [("idle", "rank 0 · compute", 0.0, 1.0)]


def test_compare_figure_and_deltas() -> None:
    a = make_prediction(step=10.0)
    b = make_prediction(step=8.0, compute=6.0, tp_comm=1.0, bubble=1.0)
    fig = viz.compare_figure(a, b)
    assert fig.layout.barmode == "stack"
    compute = next(t for t in fig.data if t.name == "compute")
    assert list(compute.y) == ["pinned", "current"] and list(compute.x) == [6.0, 6.0]
    bubble = next(t for t in fig.data if t.name == "pipeline bubble")
    assert list(bubble.x) == [1.5, 1.0]
    d = diff.metric_deltas(a, b)
    assert d["step_time_s"] == (10.0, 8.0, pytest.approx(-0.2))
    assert d["peak_gib"][2] == pytest.approx(0.0)


def test_flatten_and_diff_fields() -> None:
    a = {"plan": {"tp": 8, "pp": 2}, "cluster": {"gpu": "a100-80gb"}}
    b = {"plan": {"tp": 4, "pp": 2}, "cluster": {"gpu": "h200", "num_nodes": 2}}
    assert diff.flatten(a) == {"plan.tp": 8, "plan.pp": 2, "cluster.gpu": "a100-80gb"}
    assert diff.diff_fields(a, b) == [("plan.tp", 8, 4), ("cluster.gpu", "a100-80gb", "h200"),
                                     ("cluster.num_nodes", None, 2)]
    assert diff.diff_fields(a, a) == []


def test_sweep_variants_set_the_field_and_drop_dp() -> None:
    raw = base_scenario(dp=8)
    variants = sweep.sweep_variants(raw, "inter-node bandwidth", ["100 Gb/s", "400 Gb/s"])
    assert [v for v, _ in variants] == ["100 Gb/s", "400 Gb/s"]
    assert variants[1][1]["cluster"]["inter_node"] == {"bandwidth": "400 Gb/s"}
    assert "dp" not in variants[0][1]["plan"]
    assert raw["plan"]["dp"] == 8 and "inter_node" not in raw["cluster"]  # the input is not touched
    (_, nodes2), = sweep.sweep_variants(raw, "nodes", [2])
    assert nodes2["cluster"]["num_nodes"] == 2
    assert scenario_from_dict(nodes2).world_size == 16


def test_sweep_values_and_x() -> None:
    assert sweep.default_sweep_values("nodes", 8) == [2, 4, 8, 16, 32]
    assert sweep.default_sweep_values("nodes", 1) == [1, 2, 4]
    assert sweep.parse_values("1, 2,4", "micro-batch size") == [1, 2, 4]
    assert sweep.parse_values("200 Gb/s, 400 Gb/s", "inter-node bandwidth") == ["200 Gb/s", "400 Gb/s"]
    with pytest.raises(ValueError, match="'x' is not a whole number"):
        sweep.parse_values("1, x", "nodes")
    with pytest.raises(ValueError):
        sweep.parse_values("200", "inter-node bandwidth")  # a bare number is not a bandwidth
    assert sweep.sweep_x("inter-node bandwidth", "200 Gb/s") == pytest.approx(200.0)
    assert sweep.sweep_x("intra-node bandwidth", "300 GB/s") == pytest.approx(300.0)
    assert sweep.sweep_x("nodes", 4) == 4.0


def test_sweep_figure_marks_oom_and_skips_invalid() -> None:
    points = [sweep.SweepPoint(x=1, label="1", step_time_s=2.0, mfu=0.5, peak_gib=40, fits=True),
              sweep.SweepPoint(x=2, label="2", step_time_s=1.0, mfu=0.45, peak_gib=90, fits=False),
              sweep.SweepPoint(x=0, label="3", problem="plan.dp: ...")]
    fig = viz.sweep_figure(points, "nodes", log_x=True)
    step, mfu = fig.data
    assert list(step.y) == [2.0, 1.0] and list(mfu.y) == [50.0, 45.0]
    assert list(step.marker.symbol) == ["circle", "x"]
    assert step.yaxis == "y" and mfu.yaxis == "y2"
    assert fig.layout.xaxis.type == "log"
    assert "1 invalid point(s) skipped" in fig.layout.title.text


def test_sweep_over_real_predictions() -> None:
    points = []
    for value, d in sweep.sweep_variants(base_scenario(), "micro-batch size", [1, 2, 4]):
        p = predict(scenario_from_dict(d), engine="analytic", keep_spans=False)
        points.append(sweep.SweepPoint(x=value, label=str(value), step_time_s=p.step_time_s, mfu=p.mfu,
                                     peak_gib=p.peak_gib, fits=p.fits))
    fig = viz.sweep_figure(points, "micro-batch size")
    assert len(fig.data[0].x) == 3 and all(t > 0 for t in fig.data[0].y)


CONTRACT_SEARCH = {
    "evaluated": 10, "feasible": 2, "seconds": 0.1,
    "plans": [
        {"plan": {"tp": 8, "pp": 2, "dp": 4, "cp": 1, "virtual_pipeline_stages": 1, "schedule": "1f1b",
                  "zero_stage": 1, "sequence_parallel": True, "recompute": "selective",
                  "micro_batch_size": 1}, "step_time_s": 1.0, "mfu": 0.5, "peak_gib": 61.0, "fits": True},
        {"plan": {"tp": 4, "pp": 4, "dp": 4}, "step_time_s": 1.2, "mfu": 0.4, "peak_gib": 90.0, "fits": False},
    ],
}


def test_search_rows_from_contract_json() -> None:
    rows = tables.search_rows(CONTRACT_SEARCH)
    assert [r["rank"] for r in rows] == [1, 2]
    assert rows[0]["tp"] == 8 and rows[0]["zero"] == 1 and rows[0]["sp"] is True
    assert rows[1]["schedule"] is None and rows[1]["fits"] is False
    assert "tp=4" in rows[1]["label"]
    fig = viz.search_figure(rows, capacity_gib=80.0, baseline={"step_time_s": 1.5, "peak_gib": 50.0, "label": "x"})
    assert [t.name for t in fig.data] == ["fits", "out of memory", "current plan"]
    assert fig.layout.shapes[0].x0 == 80.0


def test_search_rows_from_the_real_search() -> None:
    from simdist import search
    sc = scenario_from_dict(base_scenario())
    result = search.search(sc, search.Constraints(top=5, engine="analytic"))
    rows = tables.search_rows(result)
    assert 1 <= len(rows) <= 5
    times = [r["step_time_s"] for r in rows]
    assert times == sorted(times)
    assert all(r["label"] for r in rows)


def test_calibration_rows_and_figure() -> None:
    comps = [
        {"name": "a", "measured": {"step_time_s": 2.0, "forward_s": 0.5}, "predicted": {"step_time_s": 2.2, "forward_s": 0.4},
         "spread": 0.1},
        {"name": "no-time", "measured": {}, "predicted": {"step_time_s": 1.0}},
    ]
    rows = tables.calibration_rows(comps)
    assert len(rows) == 1
    assert rows[0]["error"] == pytest.approx(0.1) and rows[0]["forward_s error"] == pytest.approx(-0.2)
    fig = viz.calibration_figure(rows)
    runs = fig.data[-1]
    assert list(runs.x) == [2.0] and list(runs.y) == [2.2]
    assert fig.layout.xaxis.type == "log"
    assert len(viz.calibration_figure([]).data) == 0


def test_calibration_rows_from_compare_objects() -> None:
    from simdist.calibrate import compare

    c = compare.Comparison("x", "h", {"step_time_s": 1.0}, {"step_time_s": 0.9}, 0.0)
    (row,) = tables.calibration_rows([c])
    assert row["name"] == "x" and row["error"] == pytest.approx(-0.1)


def test_figures_from_a_real_prediction_serialize() -> None:
    pred = predict(scenario_from_dict(base_scenario(pp=2)), engine="analytic", keep_spans=False)
    for fig in (viz.breakdown_figure(pred), viz.memory_figure(pred), viz.compare_figure(pred, pred)):
        assert fig.to_json()
    assert len(next(t for t in viz.memory_figure(pred).data if t.type == "bar").x) == 2


def test_timeline_from_the_discrete_event_engine() -> None:
    sc = scenario_from_dict(base_scenario(pp=4, global_batch_size=64))
    pred = predict(sc, engine="des")
    assert pred.spans
    from simdist.dashboard.gantt import step_gantt

    gantt = step_gantt(pred.spans, [s * sc.plan.tp for s in range(sc.plan.pp)])
    assert len(gantt.ranks) == 4 and gantt.end == pytest.approx(pred.step_time_s, rel=1e-3)
    fig = viz.timeline_figure(gantt.spans, x_end=gantt.end)
    names = {t.name for t in fig.data}
    assert {"forward", "backward", "idle"} <= names
    stages = {label.split(" · ")[0] for label in fig.layout.yaxis.ticktext}
    assert len(stages) == 4
