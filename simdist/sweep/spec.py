"""The sweep file (``simdist sweep SWEEP.yaml``): a base scenario, axes over its fields, and what
to do at each point. The format is documented in docs/sweeps.md; every problem is reported at
once, each naming its field (``axes[1].range.step: must be > 0``), as the scenario loader does.

Axes: a list whose items multiply (a product, the first item varying slowest); an item is one
field with ``values`` (a list) or a ``range`` (``start``, ``stop`` inclusive, and ``step`` or
``factor``), or a ``zip`` of such items of equal length that move together. A mapping
``{field: values-or-range, ...}`` is short for a list of one-field items.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from simdist.errors import Collector, Problem, ScenarioError
from simdist.frozen import frozen
from simdist.spec.files import read_yaml
from simdist.spec.scenario import scenario_from_dict
from simdist.units import short_repr

MODES = ("predict", "search")
PREDICT_ENGINES = ("analytic", "des")
SEARCH_ENGINES = ("analytic", "auto", "des")
SECTIONS = ("model", "cluster", "plan", "reliability")  # what an axis may change
MAX_POINTS = 1_000_000  # the driver keeps every point's overrides in memory
SEARCH_KEYS = {  # Constraints fields a sweep may set, and the kind of value each takes
    "top": int, "max_tp": int, "pp": list, "max_cp": int, "max_ep": int, "max_etp": int,
    "uneven_pp": bool, "max_virtual_stages": int, "max_micro_batch": int, "schedules": list,
    "zero_stages": list, "recompute": list, "memory_headroom": float, "rerank": int,
    "rerank_window": float, "rerank_exact": int, "keep_dominated": bool,
}
TOP_KEYS = ("name", "description", "base", "mode", "engine", "search", "cost_per_gpu_hour", "axes")
ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


@frozen
class Axis:
    """One item of the product: one field, or several zipped, with the values they take."""

    fields: tuple[str, ...]
    values: tuple[tuple[Any, ...], ...]  # one tuple per position, a value per field


@frozen(kw_only=True)
class SweepSpec:
    name: str
    base: dict[str, Any]  # the base scenario file's dict
    base_dir: str  # the folder the base scenario's own file references are read from
    base_path: str
    mode: str = "predict"
    engine: str = "analytic"
    search: dict[str, Any] | None = None  # Constraints fields (search mode)
    cost_per_gpu_hour: float | dict[str, float] | None = None  # a price, or one per GPU name
    axes: tuple[Axis, ...] = ()
    description: str = ""

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(f for a in self.axes for f in a.fields)

    @property
    def size(self) -> int:
        return math.prod(len(a.values) for a in self.axes)

    def points(self) -> Iterator[dict[str, Any]]:
        """Each point's overrides, ``{dotted field: value}``, in the product's order."""
        for combo in itertools.product(*(a.values for a in self.axes)):
            yield {f: v for a, vals in zip(self.axes, combo, strict=True)
                   for f, v in zip(a.fields, vals, strict=True)}

    def settings(self) -> dict[str, Any]:
        """What every point shares; a point's key hashes it with the point's overrides, so a
        changed base, mode or option makes every point new."""
        return {"base": self.base, "mode": self.mode, "engine": self.engine, "search": self.search,
                "cost_per_gpu_hour": self.cost_per_gpu_hour}

    def point_key(self, overrides: Mapping[str, Any], settings_blob: str | None = None) -> str:
        blob = settings_blob if settings_blob is not None else canonical_json(self.settings())
        return hashlib.sha256((blob + canonical_json(overrides)).encode()).hexdigest()[:24]


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, default=str, separators=(",", ":"))


def apply_overrides(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the scenario dict ``base`` with each dotted field set (sections created as
    needed); ``plan.dp`` is dropped unless swept, since it follows from the world size."""
    out = copy.deepcopy(dict(base))
    for dotted, value in overrides.items():
        node = out
        *parents, leaf = dotted.split(".")
        for key in parents:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        node[leaf] = copy.deepcopy(value)
    if "plan.dp" not in overrides and isinstance(out.get("plan"), dict):
        out["plan"].pop("dp", None)
    return out


# --- loading ------------------------------------------------------------------------------


def load_sweep(path: str | Path) -> SweepSpec:
    """The sweep file at ``path``, checked; ScenarioError naming every problem."""
    p = Path(path)
    data = read_yaml(p, "file")
    return sweep_from_dict(data, p.parent)


def sweep_from_dict(data: Any, folder: str | Path) -> SweepSpec:
    c = Collector()
    if not isinstance(data, Mapping):
        raise ScenarioError(Problem("file", f"must hold a mapping with name, base and axes, got {short_repr(data)}"))
    for key in data:
        if key not in TOP_KEYS:
            c.add(str(key)[:60], f"unknown field (expected one of {', '.join(TOP_KEYS)})")
    name = data.get("name")
    if not isinstance(name, str) or not ID_PATTERN.match(name):
        c.add("name", "is required: the sweep's id, letters, digits, '.', '_' or '-' (at most 100)")
    if data.get("description") is not None and not isinstance(data["description"], str):
        c.add("description", "must be text")
    mode = data.get("mode", "predict")
    if mode not in MODES:
        c.add("mode", f"{short_repr(mode)} is not one of {', '.join(MODES)}")
    engines = SEARCH_ENGINES if mode == "search" else PREDICT_ENGINES
    engine = data.get("engine", "analytic")
    if engine not in engines:
        c.add("engine", f"{short_repr(engine)} is not one of {', '.join(engines)} (mode {mode})")
    search = _search(data.get("search"), mode, c)
    cost = _cost(data.get("cost_per_gpu_hour"), c)
    base, base_path = _base(data.get("base"), Path(folder), c)
    axes = _axes(data.get("axes"), c)
    if not c.problems and base is not None:
        _check_values(base, Path(base_path).parent, axes, c)
        if mode == "search":
            _check_search(base, Path(base_path).parent, str(engine), search or {}, c)
    c.raise_if_any()
    assert base is not None
    spec = SweepSpec(name=str(name), base=base, base_dir=str(Path(base_path).parent), base_path=base_path,
                     mode=str(mode), engine=str(engine), search=search, cost_per_gpu_hour=cost,
                     axes=tuple(axes), description=str(data.get("description") or ""))
    if spec.size > MAX_POINTS:
        raise ScenarioError(Problem("axes", f"{spec.size:,} points; a sweep has at most {MAX_POINTS:,}"))
    return spec


def _base(value: Any, folder: Path, c: Collector) -> tuple[dict[str, Any] | None, str]:
    if not isinstance(value, str) or not value.strip():
        c.add("base", "is required: the base scenario's file, relative to the sweep file")
        return None, ""
    path = folder / value
    try:
        data = read_yaml(path, "base")
    except ScenarioError as exc:
        c.extend(exc)
        return None, str(path)
    if not isinstance(data, dict):
        c.add("base", f"{value} must hold a scenario mapping with name, model, cluster, plan")
        return None, str(path)
    try:
        scenario_from_dict(data, base_dir=path.parent)
    except ScenarioError as exc:
        for p in exc.problems:
            c.add(f"base: {value}: {p.field}", p.message)
    return data, str(path)


def _search(value: Any, mode: Any, c: Collector) -> dict[str, Any] | None:
    if value is None:
        return {} if mode == "search" else None
    if mode != "search":
        c.add("search", "is only read in mode: search")
        return None
    if not isinstance(value, Mapping):
        c.add("search", "must be a mapping of search options (docs/sweeps.md)")
        return None
    out: dict[str, Any] = {}
    for key, v in value.items():
        kind = SEARCH_KEYS.get(key)
        if kind is None:
            c.add(f"search.{str(key)[:60]}", f"unknown option (expected one of {', '.join(SEARCH_KEYS)})")
        elif kind is list:
            items = v if isinstance(v, list) else [v]
            out[key] = tuple(items)
        elif kind is float and isinstance(v, int | float) and not isinstance(v, bool):
            out[key] = float(v)
        elif kind is not float and isinstance(v, kind) and (kind is bool or not isinstance(v, bool)):
            out[key] = v
        else:
            c.add(f"search.{key}", f"must be {'a number' if kind is float else kind.__name__}, got {short_repr(v)}")
    return out


def _check_search(base: dict[str, Any], base_dir: Path, engine: str, search: dict[str, Any], c: Collector) -> None:
    """The search options as the search checks them (on the base scenario), named as sweep fields."""
    from simdist.search import Constraints

    try:
        constraints = Constraints(**{"engine": engine, **search})
        found = constraints.problems(scenario_from_dict(base, base_dir=base_dir))
    except (ScenarioError, TypeError) as exc:  # the base was checked already; TypeError: a bad kind
        c.add("search", f"cannot be used ({exc})")
        return
    for p in found:
        name = p.field.removeprefix("--").replace("-", "_")
        c.add("engine" if name == "engine" else f"search.{name}" if name in SEARCH_KEYS else p.field, p.message)


def _cost(value: Any, c: Collector) -> float | dict[str, float] | None:
    def price(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0

    if value is None:
        return None
    if price(value):
        return float(value)
    if isinstance(value, Mapping) and value and all(isinstance(k, str) and price(v) for k, v in value.items()):
        return {k: float(v) for k, v in value.items()}
    c.add("cost_per_gpu_hour", "must be a price > 0 per GPU-hour, or a mapping of GPU name to price")
    return None


def _axes(value: Any, c: Collector) -> list[Axis]:
    if isinstance(value, Mapping):
        value = [{"field": k, **({"values": v} if isinstance(v, list) else v if isinstance(v, Mapping)
                                 else {"values": v})} for k, v in value.items()]
    if not isinstance(value, list) or not value:
        c.add("axes", "is required: a list of axes (each a field with values or a range, or a zip)")
        return []
    axes, seen = [], set()
    for i, item in enumerate(value):
        where = f"axes[{i}]"
        if isinstance(item, Mapping) and "zip" in item:
            if set(item) != {"zip"}:
                c.add(where, "a zip item holds only zip: a list of fields with values or a range")
            members = item["zip"]
            if not isinstance(members, list) or len(members) < 2:
                c.add(f"{where}.zip", "must list at least two fields with values or a range")
                continue
            parts = [_one(m, f"{where}.zip[{j}]", c) for j, m in enumerate(members)]
            if any(p is None for p in parts):
                continue
            lengths = {len(p[1]) for p in parts if p}
            if len(lengths) > 1:
                c.add(f"{where}.zip", f"the fields take different numbers of values ({sorted(lengths)}); "
                      "zipped fields move together and need as many values each")
                continue
            fields = tuple(p[0] for p in parts if p)
            axis = Axis(fields, tuple(zip(*(p[1] for p in parts if p), strict=True)))
        else:
            part = _one(item, where, c)
            if part is None:
                continue
            axis = Axis((part[0],), tuple((v,) for v in part[1]))
        for f in axis.fields:
            if f in seen:
                c.add(where, f"{f} is swept twice")
            seen.add(f)
        axes.append(axis)
    return axes


def _one(item: Any, where: str, c: Collector) -> tuple[str, list[Any]] | None:
    if not isinstance(item, Mapping) or "field" not in item:
        c.add(where, "must be a mapping with field and values (or range), or zip")
        return None
    extra = set(item) - {"field", "values", "range"}
    if extra:
        c.add(where, f"unknown key(s) {', '.join(sorted(map(str, extra)))} (expected field, values or range)")
    field = item["field"]
    if not isinstance(field, str) or not all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", s) for s in field.split(".")):
        c.add(f"{where}.field", f"must be a dotted scenario field such as cluster.num_nodes, got {short_repr(field)}")
        return None
    if field.split(".")[0] not in SECTIONS or "." not in field:
        c.add(f"{where}.field", f"{field}: a swept field lies in {', '.join(SECTIONS)} (e.g. plan.tp)")
        return None
    if ("values" in item) == ("range" in item):
        c.add(where, "needs values (a list) or range, one of them")
        return None
    if "values" in item:
        values = item["values"]
        if not isinstance(values, list) or not values:
            c.add(f"{where}.values", "must be a non-empty list")
            return None
        return field, values
    values = _range(item["range"], f"{where}.range", c)
    return (field, values) if values else None


def _range(r: Any, where: str, c: Collector) -> list[Any] | None:
    """``start`` to ``stop`` (inclusive) by ``step`` (added) or ``factor`` (multiplied)."""
    def number(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)

    if not isinstance(r, Mapping) or not {"start", "stop"} <= set(r) or len(set(r) & {"step", "factor"}) != 1 \
            or set(r) - {"start", "stop", "step", "factor"}:
        c.add(where, "must be a mapping of start, stop (inclusive) and step or factor")
        return None
    bad = [k for k in r if not number(r[k])]
    for k in bad:
        c.add(f"{where}.{k}", f"must be a number, got {short_repr(r[k])}")
    if bad:
        return None
    start, stop = r["start"], r["stop"]
    as_int = all(isinstance(v, int) for v in r.values())
    if "step" in r:
        step = r["step"]
        if step <= 0:
            c.add(f"{where}.step", f"must be > 0, got {step}")
            return None
        count = math.floor((stop - start) / step + 1e-9) + 1
        make = (lambda i: start + i * step) if as_int else (lambda i: round(start + i * step, 12))
    else:
        factor = r["factor"]
        if factor <= 1 or start <= 0:
            c.add(f"{where}.factor", f"must be > 1 with start > 0, got factor {factor}, start {start}")
            return None
        count = math.floor(math.log(stop / start) / math.log(factor) + 1e-9) + 1 if stop >= start else 0
        make = (lambda i: start * factor**i) if as_int else (lambda i: round(start * factor**i, 12))
    if count < 1:
        c.add(f"{where}.stop", f"{stop} lies before start {start}: the range is empty")
        return None
    if count > MAX_POINTS:
        c.add(where, f"{count:,} values; at most {MAX_POINTS:,}")
        return None
    return [make(i) for i in range(count)]


def _check_values(base: dict[str, Any], base_dir: Path, axes: list[Axis], c: Collector) -> None:
    """Each axis's values set alone on the base: a problem the scenario loader reports under the
    swept field (an unknown field, a value of the wrong kind) is the sweep file's, named by its
    axis; problems of combinations (a plan that does not divide the GPUs) are the points' own."""
    for i, axis in enumerate(axes):
        for vals in axis.values[:1000]:
            overrides = dict(zip(axis.fields, vals, strict=True))
            try:
                scenario_from_dict(apply_overrides(base, overrides), base_dir=base_dir)
            except ScenarioError as exc:
                for p in exc.problems:
                    hit = next((f for f in axis.fields if p.field == f or p.field.startswith(f + ".")
                                or f.startswith(p.field + ".")), None)
                    if hit is None:
                        continue
                    if p.message.startswith("unknown field"):
                        problem = Problem(f"axes[{i}].field", f"{hit}: {p.message}")
                    else:
                        problem = Problem(f"axes[{i}] {hit} = {short_repr(overrides[hit], 40)}", p.message)
                    if problem not in c.problems:
                        c.problems.append(problem)
