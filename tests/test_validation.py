"""Predictions against published training runs (simdist/validate/data/training_runs.csv, shipped
with the package; every row names its source). Tolerances are stated per group; the report is
`simdist validate`."""

import csv
import shutil
import subprocess
import sys

import pytest
from conftest import REPO, run_cli

from simdist.validate import (
    build_cases,
    packaged_data_dir,
    run_breadth,
    run_training,
    summarize,
    unsupported,
)


@pytest.fixture(scope="module")
def report():
    results, skipped = run_training(engine="analytic")
    return results, summarize(results), skipped


def test_overall_mean_error_within_10_percent(report):
    _, summary, _ = report
    assert summary["overall"]["n"] >= 250
    assert summary["overall"]["mae"] <= 0.10


def test_megatron_weak_scaling_each_within_10_percent(report):
    """Narayanan et al. SC'21 Table 1: 1.7B on 32 GPUs to 1T on 3,072 A100."""
    results, _, _ = report
    rows = [r for r in results if r.case.group == "Megatron-LM SC'21 weak scaling"]
    assert len(rows) == 10
    for r in rows:
        assert abs(r.error) <= 0.10, (r.case.run_id, r.error)


def test_mosaicml_fsdp_mean_within_10_percent(report):
    _, summary, _ = report
    assert summary["MosaicML llm-foundry MPT benchmarks"]["mae"] <= 0.10


def test_megatron_core_h100_mean_within_15_percent(report):
    _, summary, _ = report
    assert summary["Megatron-Core H100 weak scaling (2024)"]["mae"] <= 0.15


ZERO3_GROUP = "Megatron-LM SC'21 ZeRO-3 comparison"


def test_deepspeed_zero3_rows_each_within_15_percent(report):
    """Narayanan et al. SC'21 Table 2: DeepSpeed ZeRO-3 without model parallelism, 175B and 530B
    on 384-2,240 A100. Within 15% each, 10% on average (they were 27-75% too fast before
    DeepSpeed's fetch ceiling was modelled, and the micro-batch-4 rows 19-21% too fast while
    the 2021 fetch, zero3_fetch: module_sync, hid wholly behind compute)."""
    results, summary, _ = report
    rows = [r for r in results if r.case.group == ZERO3_GROUP]
    assert len(rows) == 6
    for r in rows:
        assert abs(r.error) <= 0.15, (r.case.run_id, r.error)
    assert summary[ZERO3_GROUP]["mae"] <= 0.10


def test_deepspeed_zero3_microbatch_4_pays_the_synchronised_fetch(report):
    """At micro-batch 4 a submodule's compute is about its gather's length, so DeepSpeed 0.3's
    one-submodule-ahead fetch exposes what a layer-wide overlap would hide: the published
    steps (R0011, R0014) are 22% and 40% above the communication-bound rows' per-sample pace,
    and each is predicted within 12% (not 19-21% too fast)."""
    by_id = {r.case.run_id: r for r in report[0]}
    for rid in ("R0011", "R0014"):
        assert abs(by_id[rid].error) <= 0.12, (rid, by_id[rid].error)


def test_deepspeed_zero3_step_stops_shrinking_with_more_gpus(report):
    """Table 2's mechanism: at a fixed global batch, doubling the GPUs halves each one's compute
    but not the bytes its ZeRO-3 collectives move, so past 768 GPUs (175B) and 1,120 (530B) the
    measured step stays put (66.7 s twice; 180 s and 184 s). The prediction must do the same,
    within 5%."""
    by_id = {r.case.run_id: r for r in report[0]}
    for a, b in (("R0012", "R0013"), ("R0015", "R0016")):
        assert by_id[b].predicted_s == pytest.approx(by_id[a].predicted_s, rel=0.05)


def test_deepspeed_zero3_rows_event_engine_agrees():
    """The event engine shares each GPU's capped collectives the same way and runs the same
    one-submodule-ahead fetch (within 20% of the published step, and within 5% of the closed
    form; R0015, the 530B micro-batch-2 row, is the furthest: +17.5% here, +12.8% closed form)."""
    from simdist.predict import predict

    cases = [c for c in build_cases()[0] if c.group == ZERO3_GROUP]
    for c in cases:
        des = predict(c.scenario, engine="des", keep_spans=False).step_time_s
        closed = predict(c.scenario, engine="analytic", keep_spans=False).step_time_s
        assert abs(des / c.measured_step_s - 1) <= 0.20, (c.run_id, des)
        assert des == pytest.approx(closed, rel=0.05), c.run_id


def test_deepspeed_fetch_ceiling_carries_over_to_the_zeropp_blog():
    """The same ceiling (taken from DeepSpeed #1174 on one A100 node, not from either table)
    predicts an independent source: the DeepSpeed ZeRO++ blog's ZeRO-3 baselines on 384 V100 over
    4 x 100 Gb/s per node (breadth.csv BR-D01..D15), each within 25% of the published TFLOP/s
    (they were 24-131% too fast with the network's bandwidth alone)."""
    results = {r.row_id: r for r in run_breadth()}
    baselines = [f"BR-D{i:02d}" for i in range(1, 16, 2)]
    for row in baselines:
        assert abs(results[row].error) <= 0.25, (row, results[row].error)


# --- rows the simulator cannot express yet, and where the data comes from -------------------------


def _rows() -> dict[str, dict[str, str]]:
    with open(packaged_data_dir() / "training_runs.csv", newline="", encoding="utf-8") as fh:
        return {r["run_id"]: r for r in csv.DictReader(fh)}


def test_every_row_is_predicted_or_skipped_with_a_reason(report):
    results, _, skipped = report
    rows = _rows()
    assert len(rows) >= 341
    predicted = {r.case.run_id for r in results}
    reasons = dict(skipped)
    assert predicted.isdisjoint(reasons) and predicted | set(reasons) == set(rows)
    assert all(reasons.values())


@pytest.mark.parametrize(("run_id", "kind"), [  # MoE and CP rows: tests/test_moe_cp.py
    ("R0081", "plan (tp/pp) not stated"),  # NeMo's best configuration without CP, not stated
    ("R0057", "plan (tp/pp) not stated"),
    ("R0102", "LoRA fine-tuning"),
    ("R0130", "precision not stated"),
    ("R0441", "framework not mapped"),  # metaseq
])
def test_rows_the_simulator_cannot_express_yet_say_why(report, run_id, kind):
    reasons = dict(report[2])[run_id].split("; ")
    assert any(r.startswith(kind) for r in reasons), reasons
    assert any(r.startswith(kind) for r in unsupported(_rows()[run_id]))


def test_mosaicml_fp8_rows_are_still_predicted(report):
    """amp_fp8 (the simulator's fp8 precision) is not an FP8 recipe row."""
    rows = _rows()
    fp8 = {rid for rid, r in rows.items() if r["precision"] == "amp_fp8"}
    assert fp8 and fp8 <= {r.case.run_id for r in report[0]}


def test_the_data_ships_inside_the_package():
    assert packaged_data_dir().is_relative_to(REPO / "simdist")
    for name in ("training_runs.csv", "breadth.csv", "memory.csv", "collectives.csv", "pipeline.csv", "README.md"):
        assert (packaged_data_dir() / name).is_file()


def test_validate_runs_outside_the_repository(tmp_path):
    """From any folder (as after a pip install): the packaged data, no path into the clone."""
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "SIMDIST_DB": str(tmp_path / "runs.db")}
    r = subprocess.run([sys.executable, "-m", "simdist.cli", "validate"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "overall" in r.stdout and "MoE: Megatron-Bridge" in r.stdout


def test_data_override_by_flag_and_environment(tmp_path, monkeypatch):
    for name in ("training_runs.csv", "breadth.csv"):
        shutil.copy(packaged_data_dir() / name, tmp_path / name)
    with open(tmp_path / "training_runs.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    keep = [r for r in rows if r["run_id"] in ("R0001", "R0002")]
    with open(tmp_path / "training_runs.csv", "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(keep)
    assert [r.case.run_id for r in run_training(tmp_path)[0]] == ["R0001", "R0002"]
    monkeypatch.setenv("SIMDIST_VALIDATION_DIR", str(tmp_path))
    assert [c.run_id for c in build_cases()[0]] == ["R0001", "R0002"]
    monkeypatch.setenv("SIMDIST_VALIDATION_DIR", str(tmp_path / "nowhere"))
    r = run_cli("validate")
    assert r.returncode == 2 and "SIMDIST_VALIDATION_DIR" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("validate", "--data", str(tmp_path / "nowhere"))
    assert r.returncode == 2 and r.stderr.startswith("error: --data:")
