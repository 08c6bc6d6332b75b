"""Predicted and measured timelines side by side (no torch: the measured side is a measurement's
``timeline`` and a Kineto trace written here in the profiler's format)."""

import json

import pytest
import yaml
from conftest import measurement, run_cli
from test_calibration import local_scenario, synthetic_bench

from simdist.calibrate.fit import fit_profile
from simdist.calibrate.store import RunStore
from simdist.calibrate.timelines import (
    MEASURED_PID,
    kineto_spans,
    measured_spans,
    phase_of,
    phase_totals,
    predicted_spans,
    two_timelines,
)
from simdist.results import Span
from simdist.spec.measurement import Measurement
from simdist.spec.scenario import scenario_from_dict

EPOCH = 1_790_000_000.0  # the step's start, Unix seconds


def timeline(pipeline: bool = False) -> dict:
    if pipeline:  # a pipeline rank: two forwards inside the schedule, the rest is backward and waits
        spans = [["forward", 0.0, 0.1], ["forward", 0.2, 0.3], ["pipeline", 0.0, 0.6], ["optimizer", 0.6, 0.7]]
    else:
        spans = [["forward", 0.0, 0.1], ["backward", 0.1, 0.3], ["optimizer", 0.35, 0.4]]
    return {"step": 0, "step_time_s": 0.7 if pipeline else 0.4,
            "ranks": [{"rank": r, "epoch": EPOCH, "spans": spans} for r in (0, 1)]}


def kineto(tmp_path, rank: int) -> None:
    """A Kineto trace as torch.profiler exports it: microseconds from baseTimeNanoseconds."""
    base_ns = 1_789_999_000 * 10**9
    at = lambda seconds: (EPOCH + seconds) * 1e6 - base_ns / 1e3  # noqa: E731
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "tid": 11, "ts": at(0.01), "dur": 5e4},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "tid": 11, "ts": at(0.06), "dur": 1e4},
        {"ph": "X", "cat": "cpu_op", "name": "_c10d_functional::wait_tensor", "tid": 11, "ts": at(0.3), "dur": 4e4},
        {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "tid": 42, "ts": at(0.2), "dur": 1.2e5},
        {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "tid": 42, "ts": at(5.0), "dur": 1e5},
    ]
    (tmp_path / f"trace-rank{rank}.json").write_text(json.dumps({"baseTimeNanoseconds": base_ns, "traceEvents": events}))


def test_the_executors_spans_and_the_profilers_collectives_share_one_axis(tmp_path):
    for r in (0, 1):
        kineto(tmp_path, r)
    m = Measurement.from_dict(measurement(timeline=timeline()))
    spans = measured_spans(m, tmp_path)
    comm = [s for s in spans if s.stream == "comm"]
    assert [(round(s.start, 6), round(s.end, 6), s.name) for s in comm if s.rank == 0] == [(0.2, 0.32, "allreduce")]
    waits = [s for s in spans if s.stream == "wait" and s.rank == 1]
    assert [(round(s.start, 6), round(s.end, 6)) for s in waits] == [(0.3, 0.34)]  # the training thread's wait
    totals = phase_totals(spans)
    assert totals == pytest.approx({"forward": 0.1, "backward": 0.2, "optimizer": 0.05, "allreduce": 0.12,
                                    "waits": 0.04})
    assert kineto_spans(tmp_path / "missing.json", 0, EPOCH, 1.0) == []


def test_a_pipeline_ranks_backward_is_what_its_forwards_leave_of_the_schedule():
    spans = measured_spans(Measurement.from_dict(measurement(timeline=timeline(pipeline=True))))
    rank0 = sorted((s.start, s.end, s.name) for s in spans if s.rank == 0)
    assert [(round(a, 6), round(b, 6), n) for a, b, n in rank0] == [
        (0.0, 0.1, "forward"), (0.1, 0.2, "backward + waits"), (0.2, 0.3, "forward"), (0.3, 0.6, "backward + waits"),
        (0.6, 0.7, "optimizer")]


def test_phases_of_predicted_spans():
    assert phase_of(Span(0, "dp", "allreduce dp 16 MiB", 0, 1, "dp_comm")) == "allreduce"
    assert phase_of(Span(0, "tp", "wait", 0, 1, "tp_comm")) == "waits"
    assert phase_of(Span(0, "compute", "bubble", 0, 1, "idle")) == "bubble"
    assert phase_of(Span(0, "pp", "recv pp 1 MiB", 0, 1, "pp_comm")) == "sendrecv"
    assert phase_of(Span(0, "compute", "F mb0 chunk0", 0, 1, "forward")) == "forward"


def test_both_timelines_go_in_one_perfetto_trace():
    prof = fit_profile(synthetic_bench())
    predicted, step = predicted_spans(scenario_from_dict(local_scenario(pp=2, global_batch_size=8)), prof)
    assert {s.rank for s in predicted} == {0, 1} and step > 0
    measured = measured_spans(Measurement.from_dict(measurement(timeline=timeline(pipeline=True))))
    trace = two_timelines(predicted, measured, {"scenario": "x"})
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {0: "rank 0 predicted", 1: "rank 1 predicted", MEASURED_PID: "rank 0 measured",
                     MEASURED_PID + 1: "rank 1 measured"}
    order = {e["pid"]: e["args"]["sort_index"] for e in trace["traceEvents"] if e["name"] == "process_sort_index"}
    assert sorted(order, key=order.get) == [0, MEASURED_PID, 1, MEASURED_PID + 1]  # each rank's pair together
    assert all(e["ts"] >= 0 for e in trace["traceEvents"] if e["ph"] == "X") and trace["otherData"] == {"scenario": "x"}


def test_compare_trace_writes_the_file_and_per_phase_rows(tmp_path):
    prof = fit_profile(synthetic_bench())
    prof.save(tmp_path / "p.json")
    d = local_scenario()
    sc = scenario_from_dict(d)
    RunStore(tmp_path / "runs.db").add("measurement", measurement(scenario_hash=sc.hash(), timeline=timeline()),
                                       yaml.safe_dump(d))
    r = run_cli("compare", "--db", str(tmp_path / "runs.db"), "--profile", str(tmp_path / "p.json"),
                "--trace", str(tmp_path / "both.json"))
    assert r.returncode == 0, r.stderr
    assert "timeline forward s" in r.stdout and "timeline optimizer s" in r.stdout
    trace = json.loads((tmp_path / "both.json").read_text())
    assert {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"} >= {
        "rank 0 predicted", "rank 0 measured"}


def test_the_dashboard_draws_two_gantt_charts_on_one_axis():
    from simdist.dashboard.timelines import phase_rows, two_gantt_figure

    prof = fit_profile(synthetic_bench())
    predicted, _ = predicted_spans(scenario_from_dict(local_scenario()), prof)
    measured = measured_spans(Measurement.from_dict(measurement(timeline=timeline())))
    fig = two_gantt_figure(predicted, measured, "x")
    assert fig.layout.xaxis.matches == "x2" or fig.layout.xaxis2.matches == "x"  # shared time axis
    assert {a.text for a in fig.layout.annotations} == {"predicted (event engine)", "measured (executor)"}
    assert {t.yaxis for t in fig.data} == {"y", "y2"}
    rows = {r["phase"]: r for r in phase_rows(predicted, measured)}
    assert rows["forward"]["measured_s"] == pytest.approx(0.1) and rows["forward"]["predicted_s"] > 0
