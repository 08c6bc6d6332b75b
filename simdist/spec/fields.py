"""Spec fields described once, on the dataclass: type, YAML key, unit, range, documentation.

Each field of a spec dataclass carries what its type cannot say as metadata (:func:`spec_field`):
the YAML key when it differs from the attribute (``ddp_bucket_size`` -> ``ddp_bucket_size_bytes``),
the unit parser (``"25 MiB"``), the range (positive, >= 1, a fraction), a shorthand spelling
(``offload: none``) and a line of documentation. The Python type says the rest: ``int``,
``float``, ``bool``, ``str``, ``Literal[...]`` (the single source of allowed values), ``X | None``,
``dict[str, float]`` and nested frozen dataclasses.

Two functions read that description:

- :func:`simdist.spec.parse.parse_fields`: a YAML mapping -> constructor arguments, reporting
  unknown keys, missing required fields, wrong types, unit and range errors, every one naming
  its field;
- :func:`field_problems`: the same type and range checks on values already built, which every
  spec dataclass runs in ``__post_init__`` (:func:`validate`), so a spec object built in code is
  held to the rules of one read from a file.

Every number is checked finite, and whole numbers are bounded by :data:`MAX_INT` (2^53, exact
in floating point), so nothing downstream overflows.
"""

from __future__ import annotations

import copy
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, field, fields, is_dataclass
from functools import cache
from typing import Any, Literal, get_args, get_origin

from simdist.errors import Collector, Problem, ScenarioError
from simdist.frozen import frozen
from simdist.units import (
    parse_bandwidth,
    parse_duration,
    parse_rate,
    parse_size,
    short_repr,
)

MAX_INT = 2**53
Check = Literal["positive", "nonneg", "at_least_1", "fraction", "any"]
Unit = Literal["size", "bandwidth", "duration", "rate"]
UNIT_PARSERS: dict[str, Callable[[object], float]] = {
    "size": parse_size, "bandwidth": parse_bandwidth, "duration": parse_duration, "rate": parse_rate}


def spec_field(default: Any = MISSING, *, default_factory: Any = MISSING, key: str | None = None,
               unit: Unit | None = None, check: Check = "any", doc: str = "", since: str = "1.0",
               compare: bool = True, internal: bool = False, scale: float = 1.0,
               keys: tuple[str, ...] = (), auto: str | None = None, numeric_text: bool = False,
               shorthand: Callable[[Any], Any] | None = None, null_is_default: bool = False,
               yaml_required: bool = False, prepare: Callable[[Any, Collector], Any] | None = None,
               hashed: bool = True) -> Any:
    """A dataclass field with its scenario-file description.

    ``key``: YAML key (dotted: inside another section); ``unit``: the value is a quantity with
    its unit; ``check``: range of the user's value (a field's own default is always allowed);
    ``since``: contract version (fields newer than 1.1 are left out of the scenario hash while
    at their default, so older files keep their hash); ``internal``: not a YAML key;
    ``scale``: multiplier of a plain number (TFLOP/s -> FLOP/s); ``keys``: allowed keys of a
    mapping field; ``auto``: a word that means None; ``numeric_text``: a number may be written
    as text ("2e12"); ``shorthand``: turns a non-mapping value into a mapping; ``null_is_default``:
    ``null`` means "absent"; ``yaml_required``: required whenever the section is written;
    ``prepare``: rewrites the YAML value first (a catalog name -> its entry), reporting into the
    collector and returning None when it cannot; ``hashed=False``: not part of the scenario hash
    (a figure that prices the run, such as its dollars per GPU-hour, not one that is simulated)."""
    meta = {"key": key, "unit": unit, "check": check, "doc": doc, "since": since, "internal": internal,
            "scale": scale, "keys": keys, "auto": auto, "numeric_text": numeric_text,
            "shorthand": shorthand, "null_is_default": null_is_default, "yaml_required": yaml_required,
            "prepare": prepare, "hashed": hashed}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, compare=compare, metadata=meta)
    return field(default=default, compare=compare, metadata=meta)


@frozen(slots=True)
class FieldSpec:
    """What the parser and the validator know about one field."""

    name: str
    key: str  # YAML key ("" for internal fields)
    kind: str  # int | float | bool | str | choice | mapping | spec
    optional: bool
    choices: tuple[Any, ...]
    nested: type | None
    default: Any
    required: bool
    meta: Mapping[str, Any]

    @property
    def check(self) -> str:
        return str(self.meta.get("check", "any"))


@cache
def spec_fields(cls: type) -> tuple[FieldSpec, ...]:
    """The described fields of a spec dataclass, in declaration order."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in fields(cls):
        kind, optional, choices, nested = _kind(hints[f.name])
        meta = dict(f.metadata) if f.metadata else {}
        key = "" if meta.get("internal") else (meta.get("key") or f.name)
        default = f.default if f.default is not MISSING else (
            f.default_factory() if f.default_factory is not MISSING else MISSING)  # type: ignore[misc]
        out.append(FieldSpec(f.name, key, kind, optional, choices, nested, default,
                             f.default is MISSING and f.default_factory is MISSING, meta))
    return tuple(out)


def _kind(tp: Any) -> tuple[str, bool, tuple[Any, ...], type | None]:
    optional = False
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        optional = len(args) < len(get_args(tp))
        tp = args[0] if len(args) == 1 else tp
        origin = get_origin(tp)
    if origin is Literal:
        return "choice", optional, get_args(tp), None
    if origin is dict:
        return "mapping", optional, (), None
    if is_dataclass(tp):
        return "spec", optional, (), tp  # type: ignore[return-value]
    names = {int: "int", float: "float", bool: "bool", str: "str"}
    if tp in names:
        return names[tp], optional, (), None
    raise TypeError(f"spec field type {tp!r} is not supported")


# --- checking values --------------------------------------------------------------------------

INT_WORDS = {"positive": "a positive whole number", "at_least_1": "a positive whole number",
              "nonneg": "a whole number >= 0", "any": "a whole number"}
FLOAT_WORDS = {"positive": "a positive number", "at_least_1": "a number >= 1",
                "nonneg": "a number >= 0", "fraction": "a fraction in (0, 1]", "any": "a number"}


def in_range(x: float, check: str) -> bool:
    if check in ("positive", "at_least_1") and not (x > 0 if check == "positive" else x >= 1):
        return False
    if check == "nonneg" and x < 0:
        return False
    return not (check == "fraction" and not 0 < x <= 1)


def value_problem(fs: FieldSpec, v: Any, check: str | None = None) -> str | None:
    """Why ``v`` is not a valid (already converted) value of the field, or None."""
    check = fs.check if check is None else check
    if v is None:
        return None if fs.optional else f"must be {_expected(fs)}, got null"
    kind = fs.kind
    if kind == "int":
        if isinstance(v, bool) or not isinstance(v, int) or not in_range(v, check):
            return f"must be {INT_WORDS.get(check, 'a whole number')}, got {short_repr(v)}"
        if abs(v) > MAX_INT:
            return f"{short_repr(v)} is too large (the limit is 2^53)"
    elif kind == "float":
        if isinstance(v, bool) or not isinstance(v, int | float):
            return f"must be {FLOAT_WORDS[check]}, got {short_repr(v)}"
        if not math.isfinite(v):
            return f"must be a finite number, got {short_repr(v)}"
        if abs(v) > 1e300:
            return f"{short_repr(v)} is too large"
        if not in_range(v, check):
            return f"must be {FLOAT_WORDS[check]}, got {short_repr(v)}"
    elif kind == "bool":
        if not isinstance(v, bool):
            return f"must be true or false, got {short_repr(v)}"
    elif kind == "str":
        if not isinstance(v, str):
            return f"must be text, got {short_repr(v)}"
    elif kind == "choice":
        if not any(v == c and type(v) is type(c) for c in fs.choices):
            return f"{short_repr(v)} is not one of {', '.join(str(c) for c in fs.choices)}"
    elif kind == "spec":
        if not isinstance(v, fs.nested):  # type: ignore[arg-type]
            return f"must be a {fs.nested.__name__}, got {short_repr(v)}"  # type: ignore[union-attr]
    elif kind == "mapping":
        return _mapping_problem(fs, v, check)
    return None


def _expected(fs: FieldSpec) -> str:
    return {"int": INT_WORDS.get(fs.check, "a whole number"), "float": FLOAT_WORDS.get(fs.check, "a number"),
            "bool": "true or false", "str": "text", "choice": "one of " + ", ".join(map(str, fs.choices)),
            "mapping": "a mapping", "spec": "a mapping"}[fs.kind]


def _mapping_problem(fs: FieldSpec, v: Any, check: str) -> str | None:
    if not isinstance(v, dict):
        return f"must be a mapping, got {short_repr(v)}"
    allowed = fs.meta.get("keys") or ()
    for k, x in v.items():
        if not isinstance(k, str) or (allowed and k not in allowed):
            return f"{short_repr(k)} is not one of {', '.join(allowed)}"
        if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x) or not in_range(x, check):
            return f"{k}: must be {FLOAT_WORDS[check]}, got {short_repr(x)}"
    return None


def field_problems(obj: Any) -> list[Problem]:
    """Type and range problems of a built spec object (a field at its default always passes)."""
    out = []
    for fs in spec_fields(type(obj)):
        v = getattr(obj, fs.name)
        if fs.default is not MISSING and _same(v, fs.default):
            continue
        why = value_problem(fs, v)
        if why:
            out.append(Problem(fs.key or fs.name, why))
    return out


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def validate(obj: Any) -> None:
    """``__post_init__`` check of a spec dataclass: every type and range problem at once."""
    problems = field_problems(obj)
    if problems:
        raise ScenarioError(problems)


_HASH = "_hash_once"


def hash_once(cls: type) -> type:
    """Class decorator for a frozen spec dataclass: its hash (the dataclass's own, over the
    compared fields) computed once per object and kept on it. Every memoised function of the
    analytic model hashes its model and plan arguments on each call, and a plan has some fifty
    fields, some of them dataclasses; the kept hash never travels with a pickled or copied
    object (a process with another hash seed computes its own)."""
    field_hash = cls.__hash__

    def __hash__(self: Any) -> int:
        h = self.__dict__.get(_HASH)
        if h is None:
            h = field_hash(self)
            object.__setattr__(self, _HASH, h)
        return h

    def __getstate__(self: Any) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != _HASH}

    cls.__hash__ = __hash__  # type: ignore[method-assign]
    cls.__getstate__ = __getstate__  # type: ignore[attr-defined]
    return cls


def since(fs: FieldSpec) -> tuple[int, ...]:
    return tuple(map(int, str(fs.meta.get("since", "1.0")).split(".")))


def yaml_keys(cls: type) -> list[str]:
    """The YAML keys of a spec dataclass (for messages and the field reference)."""
    return [fs.key for fs in spec_fields(cls) if fs.key]


@cache
def _by_contract(cls: type) -> tuple[tuple[str, ...], frozenset[str]]:
    """The names of a spec dataclass's fields of contract 1.1, and of those newer."""
    newer = {f.name: since(f) > (1, 1) for f in spec_fields(cls)}
    return tuple(name for name, new in newer.items() if not new), frozenset(name for name, new in newer.items() if new)


_ATOMIC = (bool, int, float, str, type(None))  # what copy.deepcopy gives back as it is


def legacy_view(obj: Any) -> dict[str, Any]:
    """``asdict``-like view without the fields newer than contract 1.1 that sit at the value
    they take when absent, so a file that does not use them keeps its scenario hash."""
    out: dict[str, Any] = {}
    cls = type(obj)
    old, newer = _by_contract(cls)
    reference = None
    if newer:
        try:
            reference = cls(**{name: getattr(obj, name) for name in old})
        except (ScenarioError, TypeError):
            reference = None
    for fs in spec_fields(cls):
        v = getattr(obj, fs.name)
        if not fs.meta.get("hashed", True):
            continue
        if fs.name in newer and reference is not None and _same(v, getattr(reference, fs.name)):
            continue
        if is_dataclass(v) and not isinstance(v, type):
            out[fs.name] = legacy_view(v)
        else:
            out[fs.name] = v if type(v) in _ATOMIC else copy.deepcopy(v)
    return out
