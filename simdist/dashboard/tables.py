"""Table rows for the dashboard: the ranked plans of a search, and predicted vs measured runs."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

_PLAN_COLUMNS = (("tp", "tp"), ("pp", "pp"), ("dp", "dp"), ("cp", "cp"), ("ep", "ep"),
                 ("virtual_pipeline_stages", "vpp"), ("schedule", "schedule"),
                 ("zero_stage", "zero"), ("sequence_parallel", "sp"), ("recompute", "recompute"),
                 ("micro_batch_size", "mbs"))
CALIBRATION_QUANTITIES = ("forward_s", "backward_s", "optimizer_s", "comm_s", "model_state_gib",
                          "activations_gib")


def plain(obj: Any) -> dict[str, Any]:
    """A shallow dict view of a dict, a dataclass or an object with ``to_dict()``."""
    if isinstance(obj, Mapping):
        return dict(obj)
    if hasattr(obj, "to_dict"):
        return dict(obj.to_dict())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    raise TypeError(f"cannot read a {type(obj).__name__} as a table row")


def search_rows(result: Any) -> list[dict[str, Any]]:
    """Table rows (fastest first) from a plan search: a SearchResult, its ``simdist search
    --json`` object ``{"plans": [{"plan": {...}, "step_time_s", "mfu", "peak_gib", "fits"}]}``,
    or a list of such entries."""
    data = result if isinstance(result, list | tuple) else plain(result).get("plans", [])
    rows = []
    for i, entry in enumerate(data, start=1):
        e = plain(entry)
        plan = plain(e.get("plan", {}))
        row: dict[str, Any] = {"rank": i}
        for key, col in _PLAN_COLUMNS:
            row[col] = plan.get(key)
        for key in ("step_time_s", "mfu", "peak_gib", "fits", "engine"):
            row[key] = e.get(key)
        row["label"] = e.get("label") or " ".join(f"{c}={row[c]}" for _, c in _PLAN_COLUMNS
                                                  if row[c] is not None)
        rows.append(row)
    return rows


def store_summary(measurements: int, scenarios: int, compared: int, skipped: int, without_scenario: int) -> str:
    """One sentence on the run store's measurements that adds up: every measurement is counted once
    (compared, could not be compared, stored without its scenario, or an older run of a scenario)."""
    from simdist.dashboard.text import plural

    if not measurements:
        return "No stored measurement yet: `simdist run FILE --nproc N` stores one."
    older = measurements - compared - skipped - without_scenario
    parts = [f"{compared:,} compared with its prediction" if compared == 1 else
             f"{compared:,} compared with their predictions"]
    if skipped:
        parts.append(f"{skipped:,} could not be compared (the reasons are below)")
    if without_scenario:
        parts.append(f"{without_scenario:,} stored without its scenario (cannot be predicted)")
    if older:
        parts.append(f"{older:,} older {'run' if older == 1 else 'runs'} of the same "
                     f"{'scenario' if scenarios == 1 else 'scenarios'} (the newest is compared)")
    return (f"{plural(measurements, 'stored measurement')} of {plural(scenarios, 'scenario')}: "
            + "; ".join(parts) + ".")


def calibration_rows(comparisons: Iterable[Any]) -> list[dict[str, Any]]:
    """One row per measured scenario: measured and predicted step time, the error, the run's
    spread, and the error of each other quantity both sides have.

    A comparison is ``simdist.calibrate.compare.Comparison`` (or a dict with its fields:
    ``name``, ``measured`` and ``predicted`` dicts of quantities, ``spread``).
    """
    rows = []
    for comp in comparisons:
        c = plain(comp)
        meas, pred = c.get("measured") or {}, c.get("predicted") or {}
        m, p = meas.get("step_time_s"), pred.get("step_time_s")
        if not m or p is None:
            continue
        row: dict[str, Any] = {"name": str(c.get("name", "?")), "measured_s": float(m),
                               "predicted_s": float(p), "error": float(p) / float(m) - 1.0,
                               "spread": float(c.get("spread") or 0.0)}
        for key in CALIBRATION_QUANTITIES:
            if meas.get(key) and pred.get(key) is not None:
                row[f"{key} error"] = pred[key] / meas[key] - 1.0
        rows.append(row)
    return rows
