"""The periodic extension of the event engine (simdist.sim.engine.periodic) gives the full
simulation's answer: every bundled scenario, predicted with and without it, to 1e-9 relative
(the golden file's tolerance); pipelined steps (1F1B and zero-bubble, with and without contended
data-parallel traffic, a deep zero-bubble pipeline) give it too and those that do extend really are
extended; the steady state the extension stretches is the schedule's periodic part."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from simdist.sim import schedules
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


def _plan(name: str, nodes: int, **plan) -> dict:
    return {"id": name, "kind": "dict", "input": {
        "name": name, "model": {"preset": "gpt3-13b"}, "cluster": {"preset": "dgx-a100-80gb", "num_nodes": nodes},
        "plan": {"sequence_parallel": True, **plan}}}


# (case, micro-batches, the extension's last answer: True where it must stretch, None where the
# step need not reach a periodic state, and a contended link expected in the assumptions?)
CASES = [
    (_plan("1f1b", 8, tp=4, pp=8, global_batch_size=128), 64, True, True),
    # zero-bubble: the faster stages run ahead on their slack until the slowest stage's pace
    # reaches them (periodic.longer: a second, longer short step); no contention
    (_plan("zb", 8, tp=4, pp=8, global_batch_size=128, schedule="zero-bubble"), 64, True, False),
    # a deep pipeline (the 530B space's PP105 zero-bubble plans, smaller): one micro-batch a stage
    (_plan("zb-deep", 20, tp=8, pp=20, global_batch_size=160, schedule="zero-bubble"), 160, True, False),
    # data-parallel gradient sync overlapped with the cool-down's pipeline sends
    (_plan("zb-overlap", 8, tp=8, pp=4, global_batch_size=128, schedule="zero-bubble",
           overlap_grad_reduce=True), 64, True, False),
    # ZeRO-2: every micro-batch's reduce-scatter contends with the pipeline sends on the NICs;
    # periodic after a third short step here, never within the short steps there
    (_plan("zb-zero2", 8, tp=4, pp=8, global_batch_size=256, schedule="zero-bubble", zero_stage=2),
     128, True, True),
    (_plan("zb-zero2-tp8", 8, tp=8, pp=4, global_batch_size=128, schedule="zero-bubble", zero_stage=2),
     64, None, True),
]


@pytest.mark.parametrize(("case", "m", "stretched", "contended"), CASES, ids=[c[0]["id"] for c in CASES])
def test_extension_is_used_and_exact(case, m, stretched, contended, monkeypatch):
    calls = []
    real = periodic.extend
    monkeypatch.setattr(periodic, "extend", lambda run, m: calls.append(real(run, m)) or calls[-1])
    assert scenario_from_dict(case["input"]).plan.num_microbatches == m
    extended, whole = _both(case, monkeypatch)
    assert calls and all(c is False for c in calls[:-1])  # short steps until one was periodic (or none)
    if stretched is not None:
        assert calls[-1] is stretched  # stretched (the whole step not simulated)
    assert diff(whole, extended) == []
    assert extended["step_time_s"] > 0
    assert any("contention" in a for a in extended["assumptions"]) == contended


@pytest.mark.parametrize(("name", "p", "m", "v"), [("1f1b", 4, 9, 1), ("1f1b", 8, 20, 1),
                                                   ("interleaved-1f1b", 4, 16, 2), ("interleaved-1f1b", 3, 12, 3),
                                                   ("zero-bubble", 4, 9, 1), ("zero-bubble", 8, 20, 1)])
def test_steady_state_is_the_schedules_periodic_part(name, p, m, v):
    """Between periodic.steady's bounds every action is the one a period earlier, q micro-batches on
    (span actions: 2 per micro-batch and chunk, 3 under zero-bubble), and the bounds are as wide as that
    allows (the actions just outside break the pattern)."""
    sched = schedules.schedule(name, p, m, v)
    q, per = (p if v > 1 else 1), periodic.span(name, p, v)
    for s, acts in enumerate(sched):
        first, end = periodic.steady(name, p, v, s, m)
        assert 0 <= first < end <= len(acts)

        assert all(_later(acts, j - per, j, q) for j in range(first + per, end))
        assert first == 0 or not _later(acts, first - 1, first - 1 + per, q)
        assert end + per > len(acts) or not _later(acts, end - per, end, q)


def _later(acts: list, i: int, j: int, q: int) -> bool:
    """Action j is action i, q micro-batches later."""
    a, b = acts[i], acts[j]
    return (a.kind, a.chunk, a.microbatch + q) == (b.kind, b.chunk, b.microbatch)
