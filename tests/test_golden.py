"""Golden predictions: every bundled scenario and every public validation row, both engines,
compared with the JSON recorded by ``python tools/golden.py`` (to 1e-9 relative).

A difference means a change moved a prediction. If the change is an intended, documented fix,
regenerate the file with that command and say so in the commit; never loosen the tolerance.
"""

from __future__ import annotations

import gzip
import json
import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "data" / "golden" / "predictions.json.gz"
sys.path.insert(0, str(REPO / "tools"))

import golden  # noqa: E402

REL = 1e-9


def _entries() -> list[dict]:
    return json.loads(gzip.decompress(GOLDEN.read_bytes()))["cases"]


def diff(expected, got, path: str = "") -> list[str]:
    """Paths where ``got`` differs from ``expected`` (numbers to REL, everything else exactly)."""
    if isinstance(expected, dict) and isinstance(got, dict):
        out = [f"{path}.{k}: missing" for k in expected if k not in got]
        out += [f"{path}.{k}: new" for k in got if k not in expected]
        for k in expected.keys() & got.keys():
            out += diff(expected[k], got[k], f"{path}.{k}")
        return out
    if isinstance(expected, list) and isinstance(got, list):
        if len(expected) != len(got):
            return [f"{path}: {len(got)} items, expected {len(expected)}"]
        return [d for i, (a, b) in enumerate(zip(expected, got, strict=True)) for d in diff(a, b, f"{path}[{i}]")]
    if isinstance(expected, (int, float)) and isinstance(got, (int, float)) and not isinstance(expected, bool):
        if math.isclose(expected, got, rel_tol=REL, abs_tol=1e-12):
            return []
        return [f"{path}: {got!r}, expected {expected!r}"]
    return [] if expected == got else [f"{path}: {got!r}, expected {expected!r}"]


ENTRIES = _entries()


@pytest.mark.parametrize("engine", golden.ENGINES)
def test_predictions_unchanged(engine):
    failures = []
    for entry in ENTRIES:
        got = json.loads(json.dumps(golden.predict_case(entry, engine)))
        d = diff(entry["predictions"][engine], got)
        if d:
            failures.append(f"{entry['id']}: " + "; ".join(d[:4]))
    assert not failures, f"{len(failures)} of {len(ENTRIES)} cases changed:\n" + "\n".join(failures[:30])


def test_diff_finds_a_moved_number():
    assert diff({"a": [1.0, {"b": 2.0}]}, {"a": [1.0, {"b": 2.0 * (1 + 1e-12)}]}) == []
    assert diff({"a": [1.0, {"b": 2.0}]}, {"a": [1.0, {"b": 2.001}]}) == [".a[1].b: 2.001, expected 2.0"]
    assert sorted(diff({"a": "x"}, {"a": "y", "c": 1})) == [".a: 'y', expected 'x'", ".c: new"]
