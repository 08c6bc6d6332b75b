"""The dashboard's pure parts behind issue 18's defects: escaped text, the breakdown and memory
charts, round axis ticks, the whole-step Gantt chart, the run store's counts, sweep defaults."""

from __future__ import annotations

import math
import re

import pytest
import yaml
from conftest import REPO, base_scenario
from test_viz import make_prediction, pipeline_spans

from simdist import viz
from simdist.dashboard.gantt import MAX_DRAWN, drawn_spans, merge_touching, spread, step_gantt
from simdist.dashboard.sweep_defaults import valid_default_values
from simdist.dashboard.tables import store_summary
from simdist.dashboard.text import md_escape, md_unescape, plural
from simdist.results import Span
from simdist.spec.scenario import scenario_from_dict

# --- text -------------------------------------------------------------------------------------

MESSAGES = ["plan.tp: tp*pp*cp = 384 does not divide the cluster's 1024 GPUs",
            "model.hf_config: my_model_config.json was not uploaded", "a :red[b] $x$ `c` [d](e) #f <g> ~h~ |i|",
            "back\\slash and *both* _kinds_", "two\nlines"]


@pytest.mark.parametrize("message", MESSAGES)
def test_md_escape_escapes_every_markdown_character_and_round_trips(message: str) -> None:
    escaped = md_escape(message)
    assert md_unescape(escaped) == message
    unescaped = re.sub(r"\\.", "", escaped)  # what Markdown would still read as syntax
    assert not set(unescaped) & set("*_`[]$:#<>~|\\")


def test_plural() -> None:
    assert plural(1, "measurement") == "1 measurement" and plural(2, "measurement") == "2 measurements"
    assert plural(1200, "scenario") == "1,200 scenarios"


# --- breakdown and memory -----------------------------------------------------------------------


def test_pie_rounds_and_drops_negligible_slices() -> None:
    pred = make_prediction(step=10.0, compute=8.0, tp_comm=2.0, bubble=1.23e-15, optimizer=0.0)
    fig = viz.breakdown_figure(pred, "pie")
    (pie,) = fig.data
    assert list(pie.labels) == ["compute", "exposed TP comm"]
    assert list(pie.text) == ["80.0%", "20.0%"]
    assert pie.textinfo == "text" and pie.textposition == "inside" and pie.automargin
    assert fig.layout.legend.orientation == "v" and fig.layout.legend.x > 1  # beside the pie, not on the title
    (note,) = fig.layout.annotations
    assert "pipeline bubble" in note.text and "optimizer" in note.text
    bar = viz.breakdown_figure(pred, "bar")
    assert list(bar.data[0].y) == ["compute", "exposed TP comm"]
    assert all("e-" not in t for t in bar.data[0].text)


def test_nothing_left_out_means_no_note() -> None:
    pred = make_prediction(compute=6.0, tp_comm=2.0, bubble=2.0)
    fig = viz.breakdown_figure(pred, "pie")
    assert not fig.layout.annotations
    assert sum(fig.data[0].values) == pytest.approx(10.0)  # every part is drawn


def test_memory_capacity_is_a_legend_entry_not_a_label_over_the_bars() -> None:
    fig = viz.memory_figure(make_prediction(peaks=(95.0, 60.0), capacity=80.0))
    assert not fig.layout.annotations
    assert [t.name for t in fig.data if t.type == "scatter" and t.mode == "lines"] == ["GPU capacity 80 GiB"]
    assert [s.y0 for s in fig.layout.shapes] == [80.0]


# --- round ticks -------------------------------------------------------------------------------


@pytest.mark.parametrize("top", [0.4555, 3.2, 47.3, 1234.0, 99.99, 100.0, 1e-4])
def test_nice_range_is_round(top: float) -> None:
    (lo, hi), step = viz.nice_range(top)
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert lo == 0 and hi >= top and round(mantissa, 9) in (1, 2, 2.5, 5)
    assert round(hi / step, 9).is_integer() and 3 <= hi / step <= 10


def test_sweep_axes_have_round_ticks() -> None:
    from simdist.dashboard.sweep import SweepPoint

    points = [SweepPoint(x=n, label=str(n), step_time_s=t, mfu=m, peak_gib=30, fits=True)
              for n, t, m in ((32, 97.3, 0.4557), (64, 49.1, 0.4512), (128, 25.6, 0.4333))]
    fig = viz.sweep_figure(points, "nodes", log_x=True)
    assert list(fig.layout.yaxis.range) == [0.0, 100.0] and fig.layout.yaxis.dtick == 20
    assert list(fig.layout.yaxis2.range) == [0.0, 50.0] and fig.layout.yaxis2.dtick == 10


# --- the whole step -------------------------------------------------------------------------------


def test_merge_touching_keeps_interleaved_kinds_apart() -> None:
    spans = [Span(0, "compute", "F mb0", 0.0, 1.0, "forward"), Span(0, "compute", "F mb1", 1.0, 2.0, "forward"),
             Span(0, "compute", "B mb0", 2.0, 3.0, "backward"), Span(0, "compute", "F mb2", 3.0, 4.0, "forward"),
             Span(1, "compute", "F mb0", 1.0, 2.0, "forward")]
    merged = merge_touching(spans, 0.0)
    assert sorted((s.rank, s.start, s.end, s.category) for s in merged) == [
        (0, 0.0, 2.0, "forward"), (0, 2.0, 3.0, "backward"), (0, 3.0, 4.0, "forward"), (1, 1.0, 2.0, "forward")]
    assert any("(2 spans)" in s.name for s in merged)
    assert len(merge_touching([*spans[:2], Span(0, "compute", "F", 2.5, 3.0, "forward")], 0.4)) == 2


def test_spread_keeps_the_first_and_the_last() -> None:
    assert spread(list(range(16)), 4) == [0, 5, 10, 15]
    assert spread([3, 4], 5) == [3, 4] and spread([7, 8, 9], 1) == [7]


def test_step_gantt_draws_every_microbatch_and_names_what_it_leaves_out() -> None:
    spans = pipeline_spans(stages=4, microbatches=32)
    full = step_gantt(spans, [0, 1, 2, 3])
    assert full.ranks == [0, 1, 2, 3] and full.end == max(s.end for s in spans)
    assert {s.rank for s in full.spans} == {0, 1, 2, 3}
    small = step_gantt(spans, [0, 1, 2, 3], max_drawn=80)
    assert small.ranks[0] == 0 and small.ranks[-1] == 3 and len(small.ranks) < 4
    caption = small.caption({r: f"stage {r}" for r in range(4)}, 4, 32)
    assert f"Drawn: {len(small.ranks)} of 4 pipeline stages" in caption and "Not drawn" in caption
    assert "stage 1" in caption.split("Not drawn")[1]
    picked = step_gantt(spans, [0, 1, 2, 3], chosen=[2])
    assert picked.ranks == [2] and {s.rank for s in picked.spans} == {2}
    fig = viz.timeline_figure(full.spans, x_end=full.end)
    assert list(fig.layout.xaxis.range) == [0.0, full.end] and fig.layout.xaxis.rangeslider.visible
    ends = [e for *_, e in drawn_spans(fig)]
    assert max(ends) == full.end  # the last micro-batch is drawn, not only the first eight


def test_step_gantt_of_a_real_step_stays_drawable() -> None:
    from simdist.predict import predict

    sc = scenario_from_dict(base_scenario(pp=4, global_batch_size=256))
    pred = predict(sc, engine="des")
    reps = [s * sc.plan.tp for s in range(sc.plan.pp)]
    g = step_gantt(pred.spans, reps, max_drawn=MAX_DRAWN)
    assert len(g.spans) <= MAX_DRAWN or len(g.ranks) == 1
    assert g.end == pytest.approx(max(s.end for s in pred.spans))
    # no hole where the engine ran something: every lane's drawn bars cover what its spans covered
    for r in g.ranks:
        lane = [s for s in pred.spans if s.rank == r and s.stream == "compute"]
        drawn = [s for s in g.spans if s.rank == r and s.stream == "compute"]
        assert sum(s.end - s.start for s in drawn) >= sum(s.end - s.start for s in lane) * (1 - 1e-9)


# --- counts and sweep defaults ------------------------------------------------------------------


def test_store_summary_counts_every_measurement_once() -> None:
    assert store_summary(0, 0, 0, 0, 0).startswith("No stored measurement yet")
    one = store_summary(1, 1, 0, 0, 1)
    assert one.startswith("1 stored measurement of 1 scenario:") and "1 stored without its scenario" in one
    many = store_summary(5, 2, 1, 1, 0)
    assert "5 stored measurements of 2 scenarios" in many and "3 older runs" in many
    assert "(s)" not in one + many


def test_default_sweep_values_are_valid_and_hold_the_current_value() -> None:
    raw = yaml.safe_load((REPO / "scenarios" / "gpt3-175b-1024xa100.yaml").read_text())
    nodes = valid_default_values(raw, REPO / "scenarios", "nodes", 128)
    assert 128 in nodes and len(nodes) == 5 and nodes == sorted(nodes)
    from simdist.dashboard.sweep import sweep_variants

    for _, variant in sweep_variants(raw, "nodes", nodes):
        scenario_from_dict(variant, base_dir=REPO / "scenarios")  # raises if one is invalid
    mbs = valid_default_values(raw, REPO / "scenarios", "micro-batch size", 1)
    assert 1 in mbs and 16 not in mbs  # 192 / 16 = 12 micro-batches: not a multiple of pp 16
    raw["plan"]["tp"] = 5  # nothing valid around an invalid plan: no values, not invalid ones
    assert valid_default_values(raw, REPO / "scenarios", "nodes", 128) == []
