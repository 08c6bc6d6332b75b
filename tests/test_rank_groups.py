"""Full fidelity by groups of ranks that behave alike (simdist.sim.engine.grouping) gives the
answer of simulating every rank: every bundled scenario small enough to simulate rank by rank
(within the event engine's work limits; the larger ones are skipped, saying so), and straggler
cases, which are never grouped."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from simdist.errors import ScenarioError
from simdist.predict import predict
from simdist.sim.engine import grouping
from simdist.spec.profile import CalibrationProfile
from simdist.spec.scenario import load_scenario

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(REPO / "tests"))

import golden  # noqa: E402
from test_golden import diff  # noqa: E402

SMALL = [p for p in sorted((REPO / "scenarios").glob("*.yaml")) if load_scenario(p).world_size <= 1024]


def _full(path: Path, monkeypatch, grouped: bool, stragglers: dict[int, float] | None = None) -> dict:
    sc = load_scenario(path)
    profile = CalibrationProfile.from_dict(golden.LOCAL_PROFILE) if sc.requires_profile else None
    with monkeypatch.context() as mp:
        if not grouped:
            mp.setattr(grouping, "simulated_fidelity", lambda d, fidelity, *a: fidelity)
        try:  # fallback=False: past the event engine's limits it refuses rather than answer in closed form
            out = predict(sc, profile=profile, fidelity="full", keep_spans=False, stragglers=stragglers,
                          fallback=False).to_dict()
        except ScenarioError as exc:
            if "too large for the event engine" not in str(exc) or grouped:
                raise
            pytest.skip(f"every rank of {path.name} is past the event engine's limits")
    # the fidelity sentence says how the ranks were simulated; every number must agree
    out["assumptions"] = [a for a in out["assumptions"] if not a.startswith(("full fidelity", "symmetric fidelity"))]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("path", SMALL, ids=[p.name for p in SMALL])
def test_grouped_full_fidelity_is_every_rank(path, monkeypatch):
    assert diff(_full(path, monkeypatch, False), _full(path, monkeypatch, True)) == []


def test_a_small_case_is_grouped_and_unchanged(monkeypatch):
    path = REPO / "scenarios" / "llama3-70b-tp8-pp4-64xh100.yaml"
    sc = load_scenario(path)
    lines = predict(sc, fidelity="full", keep_spans=False).assumptions
    assert any(a.startswith(f"full fidelity: {sc.world_size} ranks in {sc.plan.pp} groups") for a in lines)
    assert diff(_full(path, monkeypatch, False), _full(path, monkeypatch, True)) == []


@pytest.mark.parametrize("stragglers", [{3: 1.5}, {-2: 1.2}])
def test_stragglers_are_never_grouped(stragglers, monkeypatch):
    path = REPO / "scenarios" / "llama3-70b-tp8-pp4-64xh100.yaml"
    sc = load_scenario(path)
    lines = predict(sc, fidelity="full", keep_spans=False, stragglers=stragglers).assumptions
    assert any(a.startswith(f"full fidelity: {sc.world_size} ranks as") for a in lines)
    assert diff(_full(path, monkeypatch, False, stragglers), _full(path, monkeypatch, True, stragglers)) == []


def test_ungrouped_really_simulates_every_rank(monkeypatch):
    path = REPO / "scenarios" / "llama3-70b-tp8-pp4-64xh100.yaml"
    monkeypatch.setattr(grouping, "simulated_fidelity", lambda d, fidelity, *a: fidelity)
    lines = predict(load_scenario(path), fidelity="full", keep_spans=False).assumptions
    assert any(a.startswith("full fidelity: 64 ranks as 8 tensor/context-parallel slices") for a in lines)
