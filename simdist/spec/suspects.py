"""Which input is behind an absurd prediction: the inputs that time each part of a step
(compute, links, host, reliability), and the one furthest from a typical value in the direction
that explains the absurdity. ``simdist.predict.check_prediction`` names it in its error, so that
an infinite step or an MFU above 1 points at, say, ``cluster.inter_node.bandwidth: "1e-300 GB/s"``
rather than at the output.

Typical values are round figures of current hardware (an A100/H100 node: ~100 TFLOP/s achieved
and 1 TB/s of HBM per GPU, 100 GB/s NVLink and 25 GB/s per NIC, a few microseconds of latency);
only their order of magnitude matters.
"""

from __future__ import annotations

import math

from simdist.spec.profile import CalibrationProfile
from simdist.spec.scenario import Scenario

# (field, value, typical value, +1 if a larger value makes the step faster / -1 slower / 0 a
# fraction of a peak, which cannot exceed 1)
Candidate = tuple[str, float, float, int]
FRACTION = 0


def suspect(sc: Scenario, profile: CalibrationProfile | None, kind: str = "any", way: str = "any") -> str:
    """The input most likely behind an absurd prediction: among the inputs in effect that time
    ``kind`` (compute, links, host, reliability or any), the one furthest from a typical value
    in the direction that makes the step ``way``: "slow" (an infinite step, an MFU of 0), "fast"
    (an MFU above 1: only an efficiency can do that, a peak divides out), or "any"."""
    cands = candidates(sc, profile, kind) or candidates(sc, profile, "any")
    if way == "fast":
        cands = [c for c in cands if c[3] == FRACTION] or cands
    best, name = -math.inf, cands[0][0]
    for field, value, typical, sense in cands:
        score = _slowness(value, typical, sense)
        if way == "fast":
            score = math.inf if sense == FRACTION and value > 1 else -score
        elif way == "any":
            score = abs(score)
        if score > best:
            best, name = score, field
    return name


def _slowness(value: float, typical: float, sense: int) -> float:
    """How much slower than typical (orders of magnitude) the value makes the step."""
    faster_when_larger = sense != -1
    if value <= 0:
        return math.inf if faster_when_larger else 0.0  # a zero rate or fraction: an infinite step
    gap = math.log10(typical) - math.log10(value)
    return gap if faster_when_larger else -gap


def candidates(sc: Scenario, profile: CalibrationProfile | None, kind: str) -> list[Candidate]:
    """The inputs in effect (a profile's figures replace the catalog's) that time ``kind``."""
    c, gpu = sc.cluster, sc.cluster.gpu
    out: list[Candidate] = []
    fitted = profile.compute_curves if profile is not None else {}
    if kind in ("compute", "any"):
        if profile is not None and profile.peak_flops:
            out.append(("--profile.peak_flops", profile.peak_flops, 1e14, 1))
        else:
            try:
                peak = gpu.peak(sc.plan.precision)
            except KeyError:
                peak = min(gpu.peak_flops.values(), default=0.0)
            key = next((k for k, v in gpu.peak_flops.items() if v == peak), sc.plan.precision)
            out.append((f"cluster.gpu.peak_tflops.{key}", peak, 1e14, 1))
        if profile is not None and profile.memory_bandwidth_bytes_per_s:
            out.append(("--profile.memory_bandwidth_bytes_per_s", profile.memory_bandwidth_bytes_per_s, 1e12, 1))
        else:
            out.append(("cluster.gpu.memory_bandwidth", gpu.memory_bandwidth_bytes_per_s, 1e12, 1))
        out.append(("cluster.gpu.sms", float(gpu.sms), 100.0, 1))
        out += [(f"cluster.gpu.efficiency.{k}", v, 0.5, FRACTION) for k, v in gpu.efficiency.items()
                if (k.removeprefix("fp8_")) not in fitted]
        if profile is not None:
            if profile.kernel_overhead_s:
                out.append(("--profile.kernel_overhead_s", profile.kernel_overhead_s, 5e-6, -1))
            out += [(f"--profile.compute_curves.{k}.{i}", float(p[1]), 0.5, FRACTION)
                    for k, pts in fitted.items() for i, p in enumerate(pts)]
            out += [(f"--profile.framework_overheads_s.{k}", v, 1e-5, -1)
                    for k, v in profile.framework_overheads_s.items() if v > 0]
    if kind in ("links", "any"):
        links = profile.links if profile is not None else {}
        for where, short, link, typical in (("intra_node", "intra", c.intra_node, 1e11),
                                            ("inter_node", "inter", c.inter_node, 2.5e10)):
            if short in links:
                fit = links[short]
                out += [(f"--profile.links.{short}.bandwidth_bytes_per_s", fit.bandwidth_bytes_per_s, typical, 1)]
                if fit.latency_s:
                    out.append((f"--profile.links.{short}.latency_s", fit.latency_s, 5e-6, -1))
            else:
                out.append((f"cluster.{where}.bandwidth", link.bandwidth_bytes_per_s, typical, 1))
                if link.latency_s:
                    out.append((f"cluster.{where}.latency", link.latency_s, 5e-6, -1))
        out += [("cluster.inter_node.nics_per_node", float(c.nics_per_node), 4.0, 1),
                ("cluster.spine_oversubscription", c.spine_oversubscription, 1.0, -1),
                ("plan.ddp_bucket_size", sc.plan.ddp_bucket_size_bytes, 25 * 2**20, 1)]
    if kind in ("host", "any") and c.host is not None:
        h = c.host
        out += [("cluster.host.pcie_bandwidth", h.pcie_bandwidth_bytes_per_s, 2.5e10, 1),
                ("cluster.host.nvme_bandwidth", h.nvme_bandwidth_bytes_per_s, 5e9, 1),
                ("cluster.host.cpu_optimizer_throughput", h.cpu_optimizer_params_per_s, 1e9, 1)]
    if kind in ("reliability", "any") and sc.reliability is not None:
        r = sc.reliability
        out += [("reliability.gpu_mtbf", r.gpu_mtbf_s, 1e8, 1),
                ("reliability.checkpoint_bandwidth", r.checkpoint_bandwidth_bytes_per_s, 1e10, 1)]
    return out
