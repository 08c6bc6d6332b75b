"""Measurement: what ``simdist run`` measured, the JSON the executor writes (validated on load).

The contract's keys (``simdist run FILE --nproc N --out M.json``, docs/scenario-format.md)::

    name, scenario_hash, world_size, device, backend, torch_version, steps,
    step_time_s (median of the measured steps), step_times_s, losses (global, one per step),
    phases_s {forward, backward, optimizer, comm: seconds or null},
    memory {peak_gib, per_rank [{rank, model_state_gib, activations_gib, peak_gib}]}

Every other key the executor adds (collectives, compression, ps, restarts, environment, ...)
is kept in ``extras`` as written, and ``to_dict`` puts it back after the contract's keys, so a
measurement reads and writes the same JSON. The executor builds one to write it; the run store
and ``simdist compare`` build one to read it. Bad input raises ScenarioError naming each field
(``measurement.step_time_s: ...``).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path
from typing import Any

from simdist.errors import Collector, Problem, ScenarioError
from simdist.frozen import frozen
from simdist.spec.files import write_json_atomic

PHASES = ("forward", "backward", "optimizer", "comm")
_TEXT = ("name", "scenario_hash", "device", "backend", "torch_version")


@frozen(slots=True)
class RankMemory:
    rank: int
    model_state_gib: float
    activations_gib: float
    peak_gib: float


@frozen(kw_only=True)
class Measurement:
    name: str
    scenario_hash: str
    world_size: int
    device: str  # "cpu" | "cuda"
    backend: str  # "gloo" | "nccl"
    torch_version: str
    steps: int
    step_time_s: float
    step_times_s: tuple[float, ...]
    losses: tuple[float, ...]
    phases_s: Mapping[str, float | None]  # PHASES (and "other") -> seconds, None when not measured
    peak_gib: float
    per_rank: tuple[RankMemory, ...]
    extras: Mapping[str, Any] = field(default_factory=dict)

    @property
    def spread(self) -> float:
        """Run-to-run spread of the measured steps: (max - min) / median."""
        mid = statistics.median(self.step_times_s)
        return (max(self.step_times_s) - min(self.step_times_s)) / mid if mid else 0.0

    def phase(self, key: str) -> float | None:
        value = self.phases_s.get(key)
        return None if value is None else float(value)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: the contract's keys in its order, then the extras."""
        return {
            "name": self.name, "scenario_hash": self.scenario_hash, "world_size": self.world_size,
            "device": self.device, "backend": self.backend, "torch_version": self.torch_version,
            "steps": self.steps, "step_time_s": self.step_time_s, "step_times_s": list(self.step_times_s),
            "losses": list(self.losses), "phases_s": dict(self.phases_s),
            "memory": {"peak_gib": self.peak_gib,
                       "per_rank": [{"rank": r.rank, "model_state_gib": r.model_state_gib,
                                     "activations_gib": r.activations_gib, "peak_gib": r.peak_gib}
                                    for r in self.per_rank]},
            **self.extras,
        }

    @classmethod
    def from_dict(cls, d: Any) -> Measurement:
        """A validated Measurement; ScenarioError lists every problem, each naming its key."""
        c = Collector("measurement")
        if not isinstance(d, Mapping):
            raise ScenarioError(Problem("measurement", f"must be a JSON object, got {type(d).__name__}"))
        for key in _TEXT:
            if not isinstance(d.get(key), str):
                c.add(key, f"must be text, got {d.get(key)!r}")
        world, steps = _count(c, d, "world_size"), _count(c, d, "steps")
        step_time = _seconds(c, "step_time_s", d.get("step_time_s"))
        times = _numbers(c, "step_times_s", d.get("step_times_s"), _seconds)
        losses = _numbers(c, "losses", d.get("losses"), _finite)
        if times is not None and steps is not None and len(times) != steps:
            c.add("step_times_s", f"holds {len(times)} steps, but steps is {steps}")
        phases = _phases(c, d.get("phases_s"))
        peak, per_rank = _memory(c, d.get("memory"))
        c.raise_if_any()
        assert world is not None and steps is not None and step_time is not None and times is not None
        assert losses is not None and phases is not None and peak is not None and per_rank is not None
        contract = {"name", "scenario_hash", "world_size", "device", "backend", "torch_version", "steps",
                    "step_time_s", "step_times_s", "losses", "phases_s", "memory"}
        return cls(name=d["name"], scenario_hash=d["scenario_hash"], world_size=world, device=d["device"],
                   backend=d["backend"], torch_version=d["torch_version"], steps=steps,
                   step_time_s=step_time, step_times_s=tuple(times), losses=tuple(losses), phases_s=phases,
                   peak_gib=peak, per_rank=per_rank, extras={k: v for k, v in d.items() if k not in contract})

    def save(self, path: str | Path) -> None:
        """Write the JSON atomically: whole or not at all."""
        write_json_atomic(path, self.to_dict())


def load_measurement(path: str | Path) -> Measurement:
    """Read and validate a measurement JSON file (problems name the file's keys)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ScenarioError(Problem("measurement", f"{p} does not exist")) from None
    except json.JSONDecodeError as exc:
        raise ScenarioError(Problem("measurement", f"{p} is not valid JSON: {exc}")) from None
    return Measurement.from_dict(data)


def _count(c: Collector, d: Mapping[str, Any], key: str) -> int | None:
    value = d.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        c.add(key, f"must be a whole number >= 1, got {value!r}")
        return None
    return value


def _finite(c: Collector, key: str, value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        c.add(key, f"must be a finite number, got {value!r}")
        return None
    return float(value)


def _seconds(c: Collector, key: str, value: Any) -> float | None:
    number = _finite(c, key, value)
    if number is not None and number <= 0:
        c.add(key, f"must be a positive number of seconds, got {value!r}")
        return None
    return number


def _nonnegative(c: Collector, key: str, value: Any) -> float | None:
    number = _finite(c, key, value)
    if number is not None and number < 0:
        c.add(key, f"must be 0 or more, got {value!r}")
        return None
    return number


def _numbers(c: Collector, key: str, value: Any, check: Any) -> list[float] | None:
    if not isinstance(value, list) or not value:
        c.add(key, f"must be a non-empty list of numbers, got {value!r}")
        return None
    out = [check(c, f"{key}[{i}]", v) for i, v in enumerate(value)]
    return None if any(v is None for v in out) else out


def _phases(c: Collector, value: Any) -> dict[str, float | None] | None:
    if not isinstance(value, Mapping):
        c.add("phases_s", f"must be an object of phase -> seconds, got {value!r}")
        return None
    out: dict[str, float | None] = {}
    for key, v in value.items():
        out[key] = None if v is None else _nonnegative(c, f"phases_s.{key}", v)
    return out


def _memory(c: Collector, value: Any) -> tuple[float | None, tuple[RankMemory, ...] | None]:
    if not isinstance(value, Mapping):
        c.add("memory", f"must be an object with peak_gib and per_rank, got {value!r}")
        return None, None
    peak = _nonnegative(c, "memory.peak_gib", value.get("peak_gib"))
    ranks = value.get("per_rank")
    if not isinstance(ranks, list):
        c.add("memory.per_rank", f"must be a list, got {ranks!r}")
        return peak, None
    out = []
    for i, r in enumerate(ranks):
        where = f"memory.per_rank[{i}]"
        if not isinstance(r, Mapping) or isinstance(r.get("rank"), bool) or not isinstance(r.get("rank"), int):
            c.add(where, f"must be an object with a whole-number rank, got {r!r}")
            continue
        values = [_nonnegative(c, f"{where}.{k}", r.get(k)) for k in ("model_state_gib", "activations_gib", "peak_gib")]
        if all(v is not None for v in values):
            out.append(RankMemory(r["rank"], *values))  # type: ignore[arg-type]
    return peak, tuple(out)
