"""The periodic extension of the event engine (simdist.sim.engine.periodic) gives the full
simulation's answer: every bundled scenario, predicted with and without it, to 1e-9 relative
(the golden file's tolerance), and a pipelined step that does extend really is extended."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from simdist.sim.engine import periodic
from simdist.spec.scenario import scenario_from_dict

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(REPO / "tests"))

import golden  # noqa: E402
from test_golden import diff  # noqa: E402

SCENARIOS = [c for c in golden.cases() if c["kind"] == "file"]


def _both(case: dict, monkeypatch) -> tuple[dict | str, dict | str]:
    extended = golden.predict_case(case, "des")
    with monkeypatch.context() as mp:
        mp.setattr(periodic, "short_count", lambda *a, **k: None)
        whole = golden.predict_case(case, "des")
    return extended, whole


@pytest.mark.slow
@pytest.mark.parametrize("case", SCENARIOS, ids=[c["id"] for c in SCENARIOS])
def test_bundled_scenarios_unchanged(case, monkeypatch):
    extended, whole = _both(case, monkeypatch)
    assert diff(whole, extended) == []


def test_extension_is_used_and_exact(monkeypatch):
    calls = []
    real = periodic.extend
    monkeypatch.setattr(periodic, "extend", lambda run, m: calls.append(real(run, m)) or calls[-1])
    case = {"id": "1f1b", "kind": "dict", "input": {
        "name": "pp8", "model": {"preset": "gpt3-13b"}, "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 8},
        "plan": {"tp": 4, "pp": 8, "global_batch_size": 128, "sequence_parallel": True}}}
    assert scenario_from_dict(case["input"]).plan.num_microbatches == 64
    extended, whole = _both(case, monkeypatch)
    assert calls == [True]  # the short step was periodic and stretched (the whole run not called)
    assert diff(whole, extended) == []
    assert extended["step_time_s"] > 0
