"""One-knob sweeps: the variants of a scenario dict with one field set to each value, the values
a user types, and their predictions as points for ``simdist.viz.sweep_figure``."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from simdist.errors import ScenarioError
from simdist.frozen import frozen
from simdist.spec.profile import CalibrationProfile
from simdist.units import UnitError, parse_bandwidth

SWEEPS: dict[str, tuple[str, ...]] = {
    # name -> path of the field in the scenario dict
    "nodes": ("cluster", "num_nodes"),
    "micro-batch size": ("plan", "micro_batch_size"),
    "inter-node bandwidth": ("cluster", "inter_node", "bandwidth"),
    "intra-node bandwidth": ("cluster", "intra_node", "bandwidth"),
}


@frozen
class SweepPoint:
    x: float
    label: str
    step_time_s: float | None = None  # None: the variant was not a valid scenario
    mfu: float | None = None
    peak_gib: float | None = None
    fits: bool | None = None
    problem: str = ""


def sweep_variants(raw: Mapping[str, Any], sweep: str, values: Iterable[Any]) -> list[tuple[Any, dict[str, Any]]]:
    """Copies of the scenario dict ``raw`` with the swept field set to each value."""
    path = SWEEPS[sweep]
    out = []
    for v in values:
        d = copy.deepcopy(dict(raw))
        node = d
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = v
        d.get("plan", {}).pop("dp", None)  # derived from the world size
        out.append((v, d))
    return out


def sweep_x(sweep: str, value: Any) -> float:
    """The numeric x of a sweep value: bandwidths in Gb/s (inter-node) or GB/s (intra-node)."""
    if sweep == "inter-node bandwidth":
        return parse_bandwidth(value) * 8 / 1e9
    if sweep == "intra-node bandwidth":
        return parse_bandwidth(value) / 1e9
    return float(value)


def default_sweep_values(sweep: str, current: Any) -> list[Any]:
    """A sensible range around the current value of a sweep."""
    if sweep == "nodes":
        n = int(current)
        return sorted({max(1, n // 4), max(1, n // 2), n, 2 * n, 4 * n})
    if sweep == "micro-batch size":
        return [1, 2, 4, 8, 16]
    if sweep == "inter-node bandwidth":
        return ["50 Gb/s", "100 Gb/s", "200 Gb/s", "400 Gb/s", "800 Gb/s"]
    return ["64 GB/s", "150 GB/s", "300 GB/s", "450 GB/s", "900 GB/s"]


MAX_POINTS = 32  # each point is a prediction: a text box must not order thousands


def parse_values(text: str, sweep: str) -> list[Any]:
    """Comma-separated sweep values from a text box (whole numbers, or bandwidth strings)."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if len(items) > MAX_POINTS:
        raise ValueError(f"{len(items)} values; a sweep has at most {MAX_POINTS}")
    if sweep in ("nodes", "micro-batch size"):
        out = []
        for t in items:
            try:
                out.append(int(t))
            except ValueError:
                raise ValueError(f"{t!r} is not a whole number") from None
        return out
    for t in items:
        parse_bandwidth(t)  # raises UnitError (a ValueError) naming the bad item
    return items


def sweep_points(raw: Mapping[str, Any], base_dir: str | Path, sweep: str, values: Iterable[Any],
                 profile: CalibrationProfile | None = None) -> list[SweepPoint]:
    """Each variant predicted by the closed form; an invalid one becomes a point with its problem."""
    from simdist.predict import predict
    from simdist.spec.scenario import scenario_from_dict

    points = []
    for value, variant in sweep_variants(raw, sweep, values):
        label = str(value)
        try:
            x = sweep_x(sweep, value)
            p = predict(scenario_from_dict(variant, base_dir=base_dir), profile=profile, engine="analytic",
                        keep_spans=False)
        except ScenarioError as exc:
            points.append(SweepPoint(x=0.0, label=label, problem=str(exc.problems[0])))
            continue
        except UnitError as exc:
            points.append(SweepPoint(x=0.0, label=label, problem=str(exc)))
            continue
        points.append(SweepPoint(x=x, label=label, step_time_s=p.step_time_s, mfu=p.mfu,
                                 peak_gib=p.peak_gib, fits=p.fits))
    return points
