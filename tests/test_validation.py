"""Predictions against published training runs (tests/data/validation/training_runs.csv; every
row names its source). Tolerances are stated per group; the report is `simdist validate`."""

import pytest
from conftest import DATA

from simdist.validation import run, summarize


@pytest.fixture(scope="module")
def report():
    results, _ = run(DATA / "validation", engine="analytic")
    return results, summarize(results)


def test_overall_mean_error_within_10_percent(report):
    _, summary = report
    assert summary["overall"]["n"] >= 250
    assert summary["overall"]["mae"] <= 0.10


def test_megatron_weak_scaling_each_within_10_percent(report):
    """Narayanan et al. SC'21 Table 1: 1.7B on 32 GPUs to 1T on 3,072 A100."""
    results, _ = report
    rows = [r for r in results if r.case.group == "Megatron-LM SC'21 weak scaling"]
    assert len(rows) == 10
    for r in rows:
        assert abs(r.error) <= 0.10, (r.case.run_id, r.error)


def test_mosaicml_fsdp_mean_within_10_percent(report):
    _, summary = report
    assert summary["MosaicML llm-foundry MPT benchmarks"]["mae"] <= 0.10


def test_megatron_core_h100_mean_within_15_percent(report):
    _, summary = report
    assert summary["Megatron-Core H100 weak scaling (2024)"]["mae"] <= 0.15


ZERO3_GROUP = "Megatron-LM SC'21 ZeRO-3 comparison"


def test_deepspeed_zero3_rows_each_within_25_percent(report):
    """Narayanan et al. SC'21 Table 2: DeepSpeed ZeRO-3 without model parallelism, 175B and 530B
    on 384-2,240 A100. Within 25% each (they were 27-75% too fast before DeepSpeed's fetch
    ceiling was modelled)."""
    results, _ = report
    rows = [r for r in results if r.case.group == ZERO3_GROUP]
    assert len(rows) == 6
    for r in rows:
        assert abs(r.error) <= 0.25, (r.case.run_id, r.error)


def test_deepspeed_zero3_step_stops_shrinking_with_more_gpus(report):
    """Table 2's mechanism: at a fixed global batch, doubling the GPUs halves each one's compute
    but not the bytes its ZeRO-3 collectives move, so past 768 GPUs (175B) and 1,120 (530B) the
    measured step stays put (66.7 s twice; 180 s and 184 s). The prediction must do the same,
    within 5%."""
    by_id = {r.case.run_id: r for r in report[0]}
    for a, b in (("R0012", "R0013"), ("R0015", "R0016")):
        assert by_id[b].predicted_s == pytest.approx(by_id[a].predicted_s, rel=0.05)


def test_deepspeed_zero3_rows_event_engine_agrees():
    """The event engine shares each GPU's capped collectives the same way (within 25% of the
    published step, and within 10% of the closed form)."""
    from simdist.predict import predict
    from simdist.validation import build_cases

    cases = [c for c in build_cases(DATA / "validation")[0] if c.group == ZERO3_GROUP]
    for c in cases:
        des = predict(c.scenario, engine="des", keep_spans=False).step_time_s
        closed = predict(c.scenario, engine="analytic", keep_spans=False).step_time_s
        assert abs(des / c.measured_step_s - 1) <= 0.25, (c.run_id, des)
        assert des == pytest.approx(closed, rel=0.10), c.run_id


def test_deepspeed_fetch_ceiling_carries_over_to_the_zeropp_blog():
    """The same ceiling (taken from DeepSpeed #1174 on one A100 node, not from either table)
    predicts an independent source: the DeepSpeed ZeRO++ blog's ZeRO-3 baselines on 384 V100 over
    4 x 100 Gb/s per node (breadth.csv BR-D01..D15), each within 25% of the published TFLOP/s
    (they were 24-131% too fast with the network's bandwidth alone)."""
    from simdist.validation_breadth import run_breadth

    results = {r.row_id: r for r in run_breadth(DATA / "validation")}
    baselines = [f"BR-D{i:02d}" for i in range(1, 16, 2)]
    for row in baselines:
        assert abs(results[row].error) <= 0.25, (row, results[row].error)
