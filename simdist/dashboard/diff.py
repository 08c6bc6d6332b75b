"""Scenario diffing for the pinned-vs-current comparison: flattened fields and metric deltas."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from simdist.results import Prediction


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"plan": {"tp": 8}} -> {"plan.tp": 8}."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping):
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


def diff_fields(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(field, a's value, b's value) for every flattened field that differs (None = absent)."""
    fa, fb = flatten(a), flatten(b)
    keys = list(fa) + [k for k in fb if k not in fa]
    return [(k, fa.get(k), fb.get(k)) for k in keys if fa.get(k) != fb.get(k)]


def metric_deltas(a: Prediction, b: Prediction) -> dict[str, tuple[float, float, float]]:
    """(a, b, relative change b/a - 1) of step time, tokens/s, MFU and peak memory."""
    out = {}
    for name, va, vb in (
        ("step_time_s", a.step_time_s, b.step_time_s),
        ("tokens_per_s", a.tokens_per_s, b.tokens_per_s),
        ("mfu", a.mfu, b.mfu),
        ("peak_gib", a.peak_gib, b.peak_gib),
    ):
        out[name] = (va, vb, (vb / va - 1.0) if va else math.nan)
    return out
