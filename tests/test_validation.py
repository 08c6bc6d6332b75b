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
