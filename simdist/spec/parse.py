"""Reading a YAML mapping into a spec dataclass, by the fields' own descriptions
(:mod:`simdist.spec.fields`): unknown keys (with a suggestion), missing required fields, units,
shorthands, types and ranges, every problem named by its dotted field; then the object's own
cross-field checks (its ``problems()``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from simdist.errors import Collector, ScenarioError
from simdist.spec.fields import (
    FLOAT_WORDS,
    MAX_INT,
    UNIT_PARSERS,
    FieldSpec,
    in_range,
    spec_fields,
    value_problem,
)
from simdist.units import UnitError, short_repr


def parse_fields(cls: type, raw: Any, c: Collector, *, skip: frozenset[str] = frozenset(),
                 hint: str = "", missing: bool = True) -> dict[str, Any] | None:
    """Constructor arguments of ``cls`` from the YAML mapping ``raw``; problems go to ``c``
    (whose prefix names the section). None when ``raw`` is not a mapping. ``skip``: keys that
    belong to another field; ``hint``: appended to "is required"; ``missing``: report missing
    required fields (not after a preset that failed, which would have given them)."""
    if not isinstance(raw, Mapping):
        c.add("", f"must be a mapping, got {short_repr(raw)}")
        return None
    specs = spec_fields(cls)
    known = {fs.key.split(".")[0] for fs in specs if fs.key}
    for key in raw:
        if not isinstance(key, str) or (key not in known and key not in skip):
            c.add(_key_text(key), _unknown(key, known))
    out: dict[str, Any] = {}
    for fs in specs:
        if not fs.key:
            continue
        present, value = _lookup(raw, fs.key)
        if present and value is None and (fs.meta.get("null_is_default") and not fs.optional):
            present = False
        if not present:
            if missing and (fs.required or fs.meta.get("yaml_required")):
                c.add(fs.key, "is required" + (f" ({hint})" if hint and fs.required else ""))
            continue
        sub = Collector(_join(c.prefix, fs.key))
        converted = convert(fs, value, sub, skip=frozenset(k.split(".", 1)[1] for k in _dotted(specs, fs.key)))
        c.problems.extend(sub.problems)
        if converted is not _BAD:
            out[fs.name] = converted
    return out


_BAD = object()


def convert(fs: FieldSpec, value: Any, c: Collector, skip: frozenset[str] = frozenset()) -> Any:
    """One YAML value -> the field's value (``_BAD`` after reporting a problem into ``c``)."""
    meta = fs.meta
    n0 = len(c.problems)
    if meta.get("auto") is not None and value == meta["auto"]:
        return None
    if value is not None and meta.get("shorthand") and not isinstance(value, Mapping):
        value = meta["shorthand"](value)
    if meta.get("prepare"):
        value = meta["prepare"](value, c)
        if value is None:
            return _BAD
    if fs.kind == "spec":
        if value is None and meta.get("null_is_default"):
            return fs.default
        if value is None and fs.optional:
            return None
        args = parse_fields(fs.nested, value, c, skip=skip)  # type: ignore[arg-type]
        if args is None or len(c.problems) > n0:
            return _BAD
        obj = build(fs.nested, args, c)  # type: ignore[arg-type]
        return obj if obj is not None and len(c.problems) == n0 else _BAD
    if value is not None and meta.get("unit"):
        try:
            value = UNIT_PARSERS[meta["unit"]](value)
        except UnitError as exc:
            c.add("", str(exc))
            return _BAD
    elif value is not None and fs.kind == "float":
        value = _number(value, meta, c)
        if value is _BAD:
            return _BAD
    elif value is not None and fs.kind == "mapping":
        value = _scaled_mapping(fs, value, c)
        if value is _BAD:
            return _BAD
    why = value_problem(fs, value)
    if why:
        c.add("", why)
        return _BAD
    return value


def _number(value: Any, meta: Mapping[str, Any], c: Collector) -> Any:
    if isinstance(value, str) and meta.get("numeric_text"):
        try:
            value = float(value.strip()) if value.strip().isascii() else value
        except ValueError:
            c.add("", f"must be a number, got {short_repr(value)}")
            return _BAD
    if isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > MAX_INT:
            c.add("", f"{short_repr(value)} is too large (the limit is 2^53)")
            return _BAD
        return float(value) * meta.get("scale", 1.0)
    if isinstance(value, float):
        return value * meta.get("scale", 1.0)
    return value


def _scaled_mapping(fs: FieldSpec, value: Any, c: Collector) -> Any:
    if not isinstance(value, Mapping):
        c.add("", f"must be a mapping, got {short_repr(value)}")
        return _BAD
    out: dict[str, Any] = {}
    allowed = fs.meta.get("keys") or ()
    for k, x in value.items():
        if not isinstance(k, str) or (allowed and k not in allowed):
            c.add(_key_text(k), f"unknown key (one of {', '.join(allowed)})")
            continue
        x2 = _number(x, fs.meta, Collector(_join(c.prefix, k)))
        if isinstance(x2, bool) or not isinstance(x2, float) or not math.isfinite(x2) or not in_range(x2, fs.check):
            c.add(k, f"must be {FLOAT_WORDS[fs.check]}, got {short_repr(x)}")
            continue
        out[k] = x2
    return out if len(out) == len(value) else _BAD


def build(cls: type, args: dict[str, Any], c: Collector, local: bool = True) -> Any:
    """``cls(**args)`` (None after reporting its type and range problems into ``c``); with
    ``local``, the object's own cross-field ``problems()`` are reported too."""
    try:
        obj = cls(**args)
    except ScenarioError as exc:
        for p in exc.problems:
            c.add(p.field, p.message)
        return None
    if local and callable(getattr(obj, "problems", None)):
        for p in obj.problems():
            c.add(p.field, p.message)
    return obj


def _lookup(raw: Mapping[str, Any], key: str) -> tuple[bool, Any]:
    head, _, rest = key.partition(".")
    if head not in raw:
        return False, None
    if not rest:
        return True, raw[head]
    inner = raw[head]
    if isinstance(inner, Mapping) and rest in inner:
        return True, inner[rest]
    return False, None


def _dotted(specs: tuple[FieldSpec, ...], head: str) -> list[str]:
    return [fs.key for fs in specs if "." in fs.key and fs.key.split(".")[0] == head]


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix and key else (key or prefix)


def _key_text(key: Any) -> str:
    return key if isinstance(key, str) and len(key) <= 60 else short_repr(key, 40)


def _unknown(key: Any, known: set[str]) -> str:
    if not isinstance(key, str):
        return "unknown field (field names are text)"
    import difflib  # only for a misspelt key: kept out of every command's start-up

    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.8)
    return "unknown field" + (f"; did you mean {close[0]}?" if close else "")
