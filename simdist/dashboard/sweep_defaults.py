"""The values a one-knob sweep starts with: around the current value, with the current value,
and only values that make a valid scenario (a node count that tp*pp*cp does not divide, or a
micro-batch size the global batch cannot be split into, is left out). Pure, no Streamlit."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from simdist.dashboard.sweep import default_sweep_values, sweep_variants
from simdist.errors import ScenarioError
from simdist.spec.scenario import scenario_from_dict

CANDIDATES = 12  # validations tried per default sweep (each a few milliseconds)


def candidates(sweep: str, current: Any) -> list[Any]:
    """Values to try, nearest the current value first."""
    if sweep == "nodes":
        n = max(1, int(current))
        near = {n, *(n // d for d in (2, 4, 8) if n // d >= 1), *(n * m for m in (2, 4, 8)),
                *(n + k for k in (-2, -1, 1, 2) if n + k >= 1)}
        return sorted(near, key=lambda v: (abs(v - n) / n if v >= n else (n / v - 1), v))[:CANDIDATES]
    if sweep == "micro-batch size":
        m = max(1, int(current))
        return sorted({m, 1, 2, 4, 8, 16, 32, 2 * m, max(1, m // 2)}, key=lambda v: (abs(v - m), v))[:CANDIDATES]
    return list(default_sweep_values(sweep, current))


def valid_default_values(raw: Mapping[str, Any], base_dir: str | Path, sweep: str, current: Any,
                         points: int = 5) -> list[Any]:
    """Up to ``points`` valid values for the sweep, the current one included, in order."""
    ok = []
    for value, variant in sweep_variants(raw, sweep, candidates(sweep, current)):
        try:
            scenario_from_dict(variant, base_dir=base_dir)
        except (ScenarioError, ValueError):
            continue
        ok.append(value)
        if len(ok) == points:
            break
    if sweep in ("nodes", "micro-batch size"):
        return sorted(ok)
    return ok
