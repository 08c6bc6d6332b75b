"""The house rules that keep simdist readable, checked on the source: layers point one way, no
import cycles, the executor sees only the scenario's specification, no source file above 400
lines.

Layers, lowest first (a module may import its own layer and the ones below):

  0  simdist.units, simdist.errors, simdist.frozen, simdist.io, simdist.catalog   parsing, errors, data files, records
  1  simdist.spec        frozen, validated inputs (model, cluster, plan, scenario, profile)
  2  simdist.analytic    what runs (ops), what it costs, closed forms, the per-stage description
  3  simdist.sim         lowering, schedules, network backends, the event engine
  4  simdist.predict, simdist.results, simdist.reliability        the one predict() and its output
  5  everything else     search, sweep, calibrate, validate, cli, trace, viz, table, dashboard, app

Every import counts, also those inside functions (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("simdist", "executor")
MAX_LINES = 400

LAYERS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (0, ("simdist", "simdist.units", "simdist.errors", "simdist.frozen", "simdist.io", "simdist.catalog")),
    (1, ("simdist.spec",)),
    (2, ("simdist.analytic",)),
    (3, ("simdist.sim",)),
    (4, ("simdist.predict", "simdist.results", "simdist.reliability")),
)
TOP = 5
EXECUTOR_MAY_IMPORT = ("simdist.spec", "simdist.units", "simdist.errors", "simdist.catalog")



def _is_under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_of(module: str) -> int:
    """The layer of a simdist module (the longest matching prefix decides)."""
    best, length = TOP, -1
    for layer, prefixes in LAYERS:
        for p in prefixes:
            if _is_under(module, p) and len(p) > length and (p != "simdist" or module == "simdist"):
                best, length = layer, len(p)
    return best


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def source_files() -> tuple[Path, ...]:
    files = [p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")]
    return tuple(sorted(files))


@cache
def known_modules() -> frozenset[str]:
    return frozenset(module_name(p) for p in source_files())


def imports_of(path: Path) -> set[str]:
    """The repository modules ``path`` imports (``from pkg import mod`` names the module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known_modules() else base
                       for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known_modules():
                t = t.rpartition(".")[0]  # a name inside a module: the module
            if t and t != here:
                out.add(t)
    return out


@cache
def graph() -> dict[str, frozenset[str]]:
    return {module_name(p): frozenset(imports_of(p)) for p in source_files()}


def cycles(g: dict[str, frozenset[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(frozenset(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def _rel(p: Path) -> str:
    return p.relative_to(REPO).as_posix()


SIMDIST = [p for p in source_files() if _rel(p).startswith("simdist/")]
EXECUTOR = [p for p in source_files() if _rel(p).startswith("executor/")]


@pytest.mark.parametrize("path", SIMDIST, ids=_rel)
def test_no_upward_import(path: Path) -> None:
    here = module_name(path)
    up = sorted(f"{m} (layer {layer_of(m)})" for m in graph()[here]
                if m.startswith("simdist") and layer_of(m) > layer_of(here))
    assert not up, f"{here} (layer {layer_of(here)}) imports from above: {', '.join(up)}"


def test_no_import_cycle() -> None:
    found = cycles(graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(sorted(c)) for c in found)


def test_executor_imports_only_the_specification() -> None:
    bad = sorted({f"{module_name(p)} -> {m}" for p in EXECUTOR for m in graph()[module_name(p)]
                  if m.startswith("simdist") and not any(_is_under(m, ok) for ok in EXECUTOR_MAY_IMPORT)})
    assert not bad, "executor reaches past the specification: " + ", ".join(bad)


SIZED = [*source_files(), REPO / "app.py"]


@pytest.mark.parametrize("path", SIZED, ids=_rel)
def test_source_file_at_most_400_lines(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{_rel(path)} has {lines} lines (at most {MAX_LINES})"


# --- the checks themselves can fail ------------------------------------------------------------


def test_layer_order() -> None:
    assert layer_of("simdist") == layer_of("simdist.units") == layer_of("simdist.catalog") == 0
    assert layer_of("simdist.spec.plan") == 1 and layer_of("simdist.analytic.cost") == 2
    assert layer_of("simdist.sim.engine") == 3 and layer_of("simdist.predict") == 4
    assert layer_of("simdist.search") == layer_of("simdist.cli") == layer_of("simdist.simulator") == TOP
    assert layer_of("simdist.sweep.run") == TOP


def test_cycle_finder_finds_a_cycle() -> None:
    g = {"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}), "d": frozenset({"a"})}
    assert cycles(g) == [frozenset({"a", "b", "c"})]
    assert cycles({"a": frozenset({"b"}), "b": frozenset()}) == []


def test_imports_are_resolved_to_modules() -> None:
    deps = graph()["simdist.predict"]
    assert "simdist.spec.scenario" in deps  # from simdist.spec.scenario import Scenario
    assert all(m in known_modules() for m in deps)
