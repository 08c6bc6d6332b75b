"""Typed reads from a foreign config (a parsed JSON/YAML dict), each problem naming its key.

A config from the outside world may hold anything where a number is expected: text, a list,
``NaN`` or ``Infinity`` (accepted by Python's JSON reader), a 400-digit integer. These readers
return a value of the asked type or None after reporting the problem into the collector.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from simdist.errors import Collector
from simdist.units import short_repr

MAX_INT = 2**53
_OR_AUTO = ' or "auto"'


def is_auto(v: Any) -> bool:
    """The Hugging Face Trainer's "auto": the value comes from elsewhere."""
    return isinstance(v, str) and v.strip().lower() == "auto"


def whole(cfg: Mapping[str, Any], key: str, c: Collector, *, minimum: int = 1, auto: bool = False,
          where: str | None = None) -> int | None:
    """An integer >= ``minimum`` (a float with an integral value is accepted, as JSON writers
    sometimes emit ``8.0``); None when absent, null or (with ``auto``) "auto"."""
    v = cfg.get(key)
    if v is None or (auto and is_auto(v)):
        return None
    name = where or key
    if isinstance(v, float) and math.isfinite(v) and v.is_integer() and abs(v) <= MAX_INT:
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        c.add(name, f"must be a whole number{_OR_AUTO if auto else ''}, got {short_repr(v)}")
        return None
    if v < minimum or v > MAX_INT:
        c.add(name, f"must be a whole number >= {minimum}, got {short_repr(v)}")
        return None
    return v


def number(cfg: Mapping[str, Any], key: str, c: Collector, *, positive: bool = True, auto: bool = False,
           where: str | None = None) -> float | None:
    """A finite number (positive unless told otherwise)."""
    v = cfg.get(key)
    if v is None or (auto and is_auto(v)):
        return None
    name = where or key
    if isinstance(v, bool) or not isinstance(v, int | float) or (isinstance(v, int) and abs(v) > MAX_INT):
        c.add(name, f"must be a number, got {short_repr(v)}")
        return None
    if not math.isfinite(v) or (positive and v <= 0):
        c.add(name, f"must be a {'positive ' if positive else ''}finite number, got {short_repr(v)}")
        return None
    return float(v)


def flag(cfg: Mapping[str, Any], key: str, c: Collector, *, auto: bool = False, where: str | None = None) -> bool | None:
    v = cfg.get(key)
    if v is None or (auto and is_auto(v)):
        return None
    if not isinstance(v, bool):
        c.add(where or key, f"must be true or false{_OR_AUTO if auto else ''}, got {short_repr(v)}")
        return None
    return v


def text(cfg: Mapping[str, Any], key: str, c: Collector, where: str | None = None) -> str | None:
    v = cfg.get(key)
    if v is None:
        return None
    if not isinstance(v, str):
        c.add(where or key, f"must be text, got {short_repr(v)}")
        return None
    return v


def texts(cfg: Mapping[str, Any], key: str, c: Collector) -> list[str]:
    """A list of strings (empty when absent)."""
    v = cfg.get(key)
    if v is None:
        return []
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        c.add(key, f"must be a list of names, got {short_repr(v)}")
        return []
    return list(v)


def section(cfg: Mapping[str, Any], key: str, c: Collector, where: str | None = None) -> Mapping[str, Any]:
    """A nested object (empty when absent or null)."""
    v = cfg.get(key)
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        c.add(where or key, f"must be an object, got {short_repr(v)}")
        return {}
    return v
