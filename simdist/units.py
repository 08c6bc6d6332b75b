"""Parsing of quantities written with their unit: "300 GB/s", "200 Gb/s", "5 us", "80 GiB".

The one place unit arithmetic lives. Inside simdist every quantity is SI: bytes, seconds,
bytes per second, FLOP/s. Case matters for bandwidth: ``B`` is bytes, ``b`` is bits.
A bare number where a unit is expected is an error, never a guess.
"""

from __future__ import annotations

import math
import re

# ASCII digits only: Python's \d and float() also accept full-width and other Unicode digits
_NUMBER = r"([-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)"
_PATTERN = re.compile(rf"^\s*{_NUMBER}\s*([A-Za-z/ µ]+?)\s*$", re.ASCII)
_MAX_TEXT = 64  # a quantity is a short string; longer input is refused before any regex work

_SI = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BIN = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}

_TIME = {
    "ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0,
    "min": 60.0, "h": 3600.0, "hr": 3600.0, "d": 86400.0, "day": 86400.0, "days": 86400.0,
}


class UnitError(ValueError):
    """A quantity that is not a number followed by a known unit."""


def _split(text: object, kind: str) -> tuple[float, str]:
    if isinstance(text, bool | int | float):
        raise UnitError(f"{text!r} has no unit; write the {kind} with its unit, e.g. {_EXAMPLES[kind]}")
    if not isinstance(text, str):
        raise UnitError(f"expected a {kind} such as {_EXAMPLES[kind]}, got {short_repr(text)}")
    m = _PATTERN.match(text) if len(text) <= _MAX_TEXT else None
    if not m:
        raise UnitError(f"{short_repr(text)} is not a {kind}; write e.g. {_EXAMPLES[kind]}")
    value = float(m.group(1))
    if not math.isfinite(value):
        raise UnitError(f"{text!r}: the number is too large")
    return value, m.group(2).replace(" ", "")


_EXAMPLES = {
    "bandwidth": '"300 GB/s" or "200 Gb/s"',
    "size": '"80 GiB" or "25 MiB"',
    "duration": '"5 us", "10 min" or "50000 h"',
    "rate": '"2e9 params/s"',
}


def _prefixed(unit: str, base: str) -> float | None:
    """Multiplier of ``unit`` = <prefix><base>, with SI or binary prefixes; None if no match."""
    if not unit.endswith(base):
        return None
    prefix = unit[: -len(base)]
    if prefix in _BIN:
        return _BIN[prefix]
    if prefix in _SI:
        return _SI[prefix]
    return None


def parse_bandwidth(text: object) -> float:
    """Bytes per second from "300 GB/s" (bytes) or "200 Gb/s" / "1.6 Tb/s" (bits)."""
    value, unit = _split(text, "bandwidth")
    if unit.endswith("bps"):
        unit = unit[:-3] + "b/s"
    if unit.endswith("/s"):
        head = unit[:-2]
        for base, factor in (("B", 1.0), ("b", 0.125)):
            mult = _prefixed(head, base)
            if mult is not None:
                return _positive(value * mult * factor, text, "bandwidth")
    raise UnitError(f"{text!r}: unknown bandwidth unit {unit!r}; write e.g. {_EXAMPLES['bandwidth']}")


def parse_size(text: object) -> float:
    """Bytes from "80 GiB", "80 GB", "25 MiB", "2 TiB"."""
    value, unit = _split(text, "size")
    mult = _prefixed(unit, "B")
    if mult is None:
        raise UnitError(f"{text!r}: unknown size unit {unit!r}; write e.g. {_EXAMPLES['size']}")
    return _positive(value * mult, text, "size")


def parse_duration(text: object) -> float:
    """Seconds from "3 us", "500 ns", "0.01 ms", "10 min", "50000 h"."""
    value, unit = _split(text, "duration")
    if unit not in _TIME:
        raise UnitError(f"{text!r}: unknown time unit {unit!r}; write e.g. {_EXAMPLES['duration']}")
    return _positive(value * _TIME[unit], text, "duration", allow_zero=True)


def parse_rate(text: object, what: str = "params") -> float:
    """Items per second from "2e9 params/s"."""
    value, unit = _split(text, "rate")
    if unit.endswith("/s") and _prefixed(unit[:-2], what) is not None:
        return _positive(value * (_prefixed(unit[:-2], what) or 1.0), text, "rate")
    raise UnitError(f"{text!r}: expected a rate in {what}/s, e.g. {_EXAMPLES['rate']}")


def _positive(value: float, text: object, kind: str, allow_zero: bool = False) -> float:
    if not math.isfinite(value):
        raise UnitError(f"{text!r}: the {kind} is too large")
    if value < 0 or (value == 0 and not allow_zero):
        raise UnitError(f"{text!r}: a {kind} must be positive")
    return value


# --- formatting (for tables and messages) -------------------------------------------------


def short_repr(value: object, limit: int = 60) -> str:
    """``repr`` for error messages, bounded: nested containers are cut (reprlib) before they are
    expanded, and the text is shortened to ``limit`` characters."""
    import reprlib

    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"a {value.bit_length()}-bit integer"
    r = reprlib.Repr()
    r.maxlevel, r.maxlist, r.maxdict, r.maxtuple, r.maxset = 2, 4, 4, 4, 4
    r.maxstring, r.maxother, r.maxlong = limit, limit, 40
    try:
        text = r.repr(value)
    except ValueError:  # e.g. an integer beyond Python's digit limit inside a container
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."

GiB = 2.0**30


def fmt_seconds(t: float) -> str:
    if t >= 86400:
        return f"{t / 86400:.2f} d"
    if t >= 3600:
        return f"{t / 3600:.2f} h"
    if t >= 60:
        return f"{t / 60:.2f} min"
    if t >= 1:
        return f"{t:.3f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.3f} ms"
    return f"{t * 1e6:.1f} us"
