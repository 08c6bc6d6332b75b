"""CalibrationProfile: fitted compute efficiencies and link parameters (versioned JSON).

A profile replaces the catalog's starting efficiencies for the hardware it was measured on.
Compute curves give efficiency (fraction of the device's peak FLOP/s or memory bandwidth) as a
function of op size (FLOPs for GEMM/attention, bytes for memory-bound ops), interpolated in
log-size; link entries give latency and achieved bandwidth per link kind.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from simdist.errors import Problem, ScenarioError
from simdist.spec.files import read_json_object, write_json_atomic

PROFILE_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class LinkFit:
    latency_s: float
    bandwidth_bytes_per_s: float  # achieved bus bandwidth (nccl-tests' busbw sense)


@dataclass(frozen=True, kw_only=True)
class CalibrationProfile:
    version: int = PROFILE_VERSION
    device: str  # e.g. "cpu (2 cores)", "NVIDIA H100 80GB HBM3"
    backend: str = ""
    peak_flops: float = 0.0  # per precision not needed: a profile is for one precision
    memory_bandwidth_bytes_per_s: float = 0.0
    # op kind -> sorted [(size, efficiency)] points; size = FLOPs (gemm, attention) or bytes
    compute_curves: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    kernel_overhead_s: float | None = None
    # extra framework time per compute op for plans that run through a software layer the
    # plain run does not ("tp": DTensor dispatch of tensor-parallel plans, "zero3": FSDP2's
    # sharded-parameter hooks), fitted from executor runs of such plans
    framework_overheads_s: dict[str, float] = field(default_factory=dict)
    # the same layers' waits at their per-layer synchronisation points (each TP collective, each
    # FSDP parameter gather), as a fraction of the compute since the previous one: the ranks'
    # compute jitters independently, and a collective starts when the last rank arrives
    # (Hoefler et al. SC'10, "Characterizing the influence of system noise"). Fitted from the
    # exposed-communication phase of executor runs; 0 (none) on profiles without such runs
    sync_wait_fractions: dict[str, float] = field(default_factory=dict)
    links: dict[str, LinkFit] = field(default_factory=dict)  # "intra" / "inter" / link kind
    fitted_from: list[str] = field(default_factory=list)
    residuals: dict[str, float] = field(default_factory=dict)  # e.g. rms relative error per fit
    created: str = ""
    torch_version: str = ""

    def efficiency(self, kind: str, size: float) -> float | None:
        """Interpolated efficiency for an op of ``kind`` and ``size``, or None if not fitted."""
        points = self.compute_curves.get(kind)
        if not points:
            return None
        xs = [math.log(max(p[0], 1.0)) for p in points]
        x = math.log(max(size, 1.0))
        i = bisect.bisect_left(xs, x)
        if i == 0:
            return points[0][1]
        if i >= len(points):
            return points[-1][1]
        w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
        return points[i - 1][1] * (1 - w) + points[i][1] * w

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CalibrationProfile:
        if d.get("version") != PROFILE_VERSION:
            raise ScenarioError(Problem("profile.version", f"{d.get('version')!r} is not supported "
                                        f"(this simdist reads version {PROFILE_VERSION})"))
        d = dict(d)
        d["links"] = {k: LinkFit(**v) for k, v in (d.get("links") or {}).items()}
        d["compute_curves"] = {k: [tuple(p) for p in v] for k, v in (d.get("compute_curves") or {}).items()}
        return cls(**d)

    def save(self, path: str | Path) -> None:
        """Write atomically: whole or not at all."""
        write_json_atomic(path, self.to_dict())


def load_profile(path: str | Path) -> CalibrationProfile:
    p = Path(path)
    data = read_json_object(p, "--profile")  # a regular file, bounded, a JSON object
    try:
        profile = CalibrationProfile.from_dict(data)
    except (TypeError, AttributeError, ValueError) as exc:  # a section of the wrong shape
        raise ScenarioError(Problem("--profile", f"{p} is not a calibration profile: {exc}")) from None
    bad = [f"--profile.{where}" for where, x in _numbers(profile.to_dict(), "")
           if isinstance(x, bool) or not math.isfinite(x) or x < 0]
    if bad:  # NaN or a negative speed would hang or invert the event engine
        raise ScenarioError([Problem(w, "must be a finite number >= 0") for w in bad[:10]])
    return profile


def _numbers(x: Any, where: str) -> list[tuple[str, float]]:
    """Every number in a profile's dict, with its dotted place."""
    if isinstance(x, int | float):
        return [(where, x)]
    items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list | tuple) else ()
    return [n for k, v in items for n in _numbers(v, f"{where}.{k}" if where else str(k))]
