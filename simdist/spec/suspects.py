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

# (field, value, typical value, +1 if a larger value makes the step faster / -1 slower)
Candidate = tuple[str, float, float, int]


def suspect(sc: Scenario, profile: CalibrationProfile | None, kind: str = "any", way: str = "any") -> str:
    """The input most likely behind an absurd prediction: among the inputs that time ``kind``
    (compute, links, host, reliability or any), the one furthest from a typical value in the
    direction that makes the step ``way`` (slow, fast, or either)."""
    cands = candidates(sc, profile, kind) or candidates(sc, profile, "any")
    best, name = -math.inf, cands[0][0]
    for field, value, typical, sense in cands:
        if value <= 0:
            score = math.inf if sense > 0 else 0.0  # a zero rate makes the step infinite
        else:
            score = sense * (math.log10(typical) - math.log10(value))  # > 0: slower than typical
        if way == "fast":
            score = -score
        elif way == "any":
            score = abs(score)
        if score > best:
            best, name = score, field
    return name


def candidates(sc: Scenario, profile: CalibrationProfile | None, kind: str) -> list[Candidate]:
    c, gpu = sc.cluster, sc.cluster.gpu
    out: list[Candidate] = []
    if kind in ("compute", "any"):
        if profile is not None:
            out += [("--profile.peak_flops", profile.peak_flops or 1e14, 1e14, 1),
                    ("--profile.memory_bandwidth_bytes_per_s", profile.memory_bandwidth_bytes_per_s or 1e12, 1e12, 1),
                    ("--profile.kernel_overhead_s", profile.kernel_overhead_s or 5e-6, 5e-6, -1)]
            out += [(f"--profile.compute_curves.{k}.{i}", float(p[1]), 0.5, 1)
                    for k, pts in profile.compute_curves.items() for i, p in enumerate(pts)]
            out += [(f"--profile.framework_overheads_s.{k}", v or 1e-5, 1e-5, -1)
                    for k, v in profile.framework_overheads_s.items()]
        key = next((k for k, v in gpu.peak_flops.items() if v == gpu.peak(sc.plan.precision)), sc.plan.precision)
        out += [(f"cluster.gpu.peak_tflops.{key}", gpu.peak(sc.plan.precision), 1e14, 1),
                ("cluster.gpu.memory_bandwidth", gpu.memory_bandwidth_bytes_per_s, 1e12, 1),
                ("cluster.gpu.sms", float(gpu.sms), 100.0, 1)]
        out += [(f"cluster.gpu.efficiency.{k}", v, 0.5, 1) for k, v in gpu.efficiency.items()]
    if kind in ("links", "any"):
        for where, link, typical in (("intra_node", c.intra_node, 1e11), ("inter_node", c.inter_node, 2.5e10)):
            out += [(f"cluster.{where}.bandwidth", link.bandwidth_bytes_per_s, typical, 1),
                    (f"cluster.{where}.latency", link.latency_s or 5e-6, 5e-6, -1)]
        out += [("cluster.inter_node.nics_per_node", float(c.nics_per_node), 4.0, 1),
                ("cluster.spine_oversubscription", c.spine_oversubscription, 1.0, -1),
                ("plan.ddp_bucket_size", sc.plan.ddp_bucket_size_bytes, 25 * 2**20, 1)]
        if profile is not None:
            for k, fit in profile.links.items():
                out += [(f"--profile.links.{k}.bandwidth_bytes_per_s", fit.bandwidth_bytes_per_s, 2.5e10, 1),
                        (f"--profile.links.{k}.latency_s", fit.latency_s or 5e-6, 5e-6, -1)]
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
