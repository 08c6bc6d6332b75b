"""Fit microbenchmark timings (and optionally executor runs) into a CalibrationProfile.

Compute: efficiency = achieved FLOP/s / the device's best GEMM FLOP/s, per op size (FLOPs for
GEMM and attention, bytes for memory-bound ops); top-k selection: seconds per element, per size.
Links: the alpha-beta model of simdist.analytic.collectives (t = steps x alpha + factor x S /
beta, nccl-tests' factors) fitted by least squares on relative error, one (alpha, beta) per
collective kind, since gloo's algorithms differ by kind. Residuals are the RMS relative error of
each fit.
"""

from __future__ import annotations

import math
import platform
import statistics
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from simdist.spec.profile import CalibrationProfile, LinkFit


def _merged(points: list[tuple[Any, float]]) -> list[tuple[Any, float]]:
    """(key, value) sorted by key (a size, or a size and a share), equal keys (every rank's row)
    merged by their mean."""
    merged: dict[Any, list[float]] = {}
    for key, value in points:
        merged.setdefault(key, []).append(value)
    return [(k, sum(v) / len(v)) for k, v in sorted(merged.items())]


def _curve(points: list[tuple[float, float]], peak: float) -> list[tuple[float, float]]:
    """(size, efficiency) sorted by size, merging equal sizes by their mean."""
    return [(s, min(1.0, rate / peak)) for s, rate in _merged(points)]


def ring_terms(kind: str, n: int, nbytes: float) -> tuple[float, float]:
    """(steps, bytes over the busiest link) of a ring collective (nccl-tests PERFORMANCE.md)."""
    if kind == "allreduce":
        return 2 * (n - 1), 2 * (n - 1) / n * nbytes
    if kind in ("allgather", "reducescatter"):
        return n - 1, (n - 1) / n * nbytes
    if kind == "alltoall":  # S/n to each of n - 1 peers at once (simdist.analytic.collectives.alltoall_parts)
        return 1, (n - 1) / n * nbytes
    return 1, nbytes  # sendrecv


def fit_alpha_beta(rows: list[dict[str, Any]]) -> tuple[float, float, float]:
    """Least squares on relative error of t = a*alpha + b/beta; returns (alpha, beta, rms)."""
    import numpy as np

    a = np.array([ring_terms(r["kind"], r["ranks"], r["bytes"])[0] for r in rows])
    b = np.array([ring_terms(r["kind"], r["ranks"], r["bytes"])[1] for r in rows])
    t = np.array([r["seconds"] for r in rows])
    design = np.stack([a / t, b / t], axis=1)
    (alpha, inv_beta), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    alpha, inv_beta = max(alpha, 1e-7), max(inv_beta, 1e-13)
    pred = a * alpha + b * inv_beta
    rms = float(np.sqrt(np.mean(((pred - t) / t) ** 2)))
    return float(alpha), float(1.0 / inv_beta), rms


def bus_bandwidth(rows: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """Bus bandwidth by message size per collective kind, at the largest group measured:
    busbw = (bytes over the busiest link) / time, nccl-tests' figure (PERFORMANCE.md)."""
    out: dict[str, list[tuple[float, float]]] = {}
    for kind in sorted({r["kind"] for r in rows}):
        mine = [r for r in rows if r["kind"] == kind]
        n = max(r["ranks"] for r in mine)
        out[kind] = sorted((float(r["bytes"]), ring_terms(kind, n, r["bytes"])[1] / r["seconds"])
                           for r in mine if r["ranks"] == n)
    return out


def fit_profile(bench: dict[str, Any], fitted_from: list[str] | None = None) -> CalibrationProfile:
    gemm = bench["gemm"]
    peak = max(r["flops"] / r["seconds"] for r in gemm)
    mem_bw = max(r["bytes"] / r["seconds"] for r in bench["memory"])
    curves = {
        "gemm": _curve([(r["flops"], r["flops"] / r["seconds"]) for r in gemm], peak),
        "attention": _curve([(r["flops"], r["flops"] / r["seconds"]) for r in bench["attention"]], peak),
        "memory": _curve([(r["bytes"], r["bytes"] / r["seconds"]) for r in bench["memory"]], mem_bw),
    }
    if bench.get("memory_cold"):  # copies out of the cache, against the in-cache peak (cost.py: copy ops)
        curves["memory.cold"] = _curve([(r["bytes"], r["bytes"] / r["seconds"]) for r in bench["memory_cold"]], mem_bw)
    if bench.get("gemm_bf16"):  # the CPU's GEMMs under bf16 autocast, against the fp32 peak (cost.py: gemm.bf16)
        curves["gemm.bf16"] = _curve([(r["flops"], r["flops"] / r["seconds"]) for r in bench["gemm_bf16"]], peak)
    residuals: dict[str, float] = {}
    links: dict[str, LinkFit] = {}
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for r in bench.get("collectives", []):
        by_kind.setdefault(r["kind"], []).append(r)
    if by_kind:
        alpha, beta, rms = fit_alpha_beta([r for rows in by_kind.values() for r in rows])
        links["intra"] = LinkFit(latency_s=alpha, bandwidth_bytes_per_s=beta)
        residuals["link intra (all kinds)"] = rms
        for kind, rows in by_kind.items():
            alpha, beta, rms = fit_alpha_beta(rows)
            links[f"intra.{kind}"] = LinkFit(latency_s=alpha, bandwidth_bytes_per_s=beta)
            residuals[f"link intra.{kind}"] = rms
    for kind in ("gemm", "attention", "memory"):
        residuals[f"{kind} curve points"] = float(len(curves[kind]))
    threads = bench.get("threads", 1)
    device = bench.get("device", "cpu")
    cuda = device == "cuda"
    if cuda:
        name = f"{bench.get('gpu') or 'cuda'} ({bench.get('dtype', 'bf16')}, {bench.get('world_size', 1)} GPUs)"
    else:
        name = (f"cpu ({platform.processor() or platform.machine()}, {threads} thread(s) per rank, "
                f"{bench.get('world_size', 1)} ranks, {bench.get('cores') or '?'} cores)")
    reducer = reducer_rates(bench.get("reducer", []))
    return CalibrationProfile(
        device=name,
        backend=bench.get("backend") or ("nccl" if cuda else "gloo"),
        peak_flops=peak,
        memory_bandwidth_bytes_per_s=mem_bw,
        compute_curves=curves,
        links=links,
        fitted_from=list(fitted_from or ["microbenchmarks"]),
        residuals=residuals,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        torch_version=str(bench.get("torch_version", "")),
        cores=0 if cuda else int(bench.get("cores") or 0),
        ranks=int(bench.get("local_ranks") or bench.get("world_size") or 0),
        gemm_shapes=[(int(r["m"]), int(r["n"]), int(r["k"]), min(1.0, r["flops"] / r["seconds"] / peak))
                     for r in gemm if "m" in r],
        bus_bandwidth=bus_bandwidth(bench.get("collectives", [])) if cuda else {},
        select_rates=select_rates(bench.get("select", [])),
        scheduler_tick_s=0.0 if cuda else float(bench.get("scheduler_tick_s") or 0.0),
        llc_bytes=0.0 if cuda else float(bench.get("llc_bytes") or 0.0),
        weight_fetch_s=weight_fetch(bench.get("cold_gemm", [])),
        pointwise_s=pointwise_rates(bench.get("pointwise", [])),
        ddp_reducer_tensor_s=reducer[0],
        ddp_reducer_byte_s=reducer[1],
    )


def reducer_rates(rows: list[dict[str, Any]]) -> tuple[float, float]:
    """(seconds per gradient tensor, seconds per gradient byte) DDP's reducer adds to a
    synchronising backward (executor.bench_reducer): least squares through the origin over the
    stacks timed (the ranks' rows of one stack merged by their median), neither below 0; (0, 0)
    without two stacks."""
    import numpy as np

    stacks: dict[tuple[int, int], list[float]] = {}
    for r in rows:
        stacks.setdefault((int(r["tensors"]), int(r["bytes"])), []).append(float(r["extra_s"]))
    if len(stacks) < 2:
        return 0.0, 0.0
    design = np.array([[t, b] for t, b in stacks], dtype=float)
    extra = np.array([statistics.median(v) for v in stacks.values()])
    per_tensor, per_byte = np.linalg.lstsq(design, extra, rcond=None)[0]
    if per_tensor >= 0 and per_byte >= 0:
        return float(per_tensor), float(per_byte)
    col = 0 if per_byte < 0 else 1  # the other costs nothing measurable: this one alone
    x = design[:, col]
    alone = max(0.0, float(x @ extra / (x @ x)))
    return (alone, 0.0) if col == 0 else (0.0, alone)


def pointwise_rates(rows: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """(elements, seconds per element) of each pointwise op and pass (executor.bench.
    bench_pointwise), by size: its time less the fixed part of a call, over its elements. The
    fixed part (the line through the two smallest sizes at no elements: dispatch and autograd's
    bookkeeping) is the per-op overhead the runs fit (simdist.calibrate.phases), which would
    otherwise be counted twice; an op's time may grow faster than its elements out of the L2."""
    out = {}
    for op in sorted({r["op"] for r in rows}):
        points = _merged([(float(r["elements"]), r["seconds"]) for r in rows if r["op"] == op])
        if len(points) < 2:
            continue
        (n1, t1), (n2, t2) = points[:2]
        fixed = t1 - n1 * (t2 - t1) / (n2 - n1)
        out[op] = [(n, max(0.0, (t - fixed) / n)) for n, t in points]
    return out


def weight_fetch(rows: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(weight bytes, seconds) a GEMM pays to fetch its weight from memory: the cold GEMM's time
    less the hot one's (the median of the pairs' differences; never below 0), by the weight's
    size (equal sizes merged by their mean)."""
    return _merged([(float(r["weight_bytes"]), max(0.0, r.get("fetch_s", r["cold_s"] - r["hot_s"]))) for r in rows])


def select_rates(rows: list[dict[str, Any]]) -> list[tuple[float, float, float]]:
    """(elements per call, share kept, seconds per element) of the top-k microbenchmark, by size
    and share (rows of the same size and share merged by their mean)."""
    per_entry = [((float(r["elements"]), round(r["k"] / r["elements"], 6)), r["seconds"] / r["elements"]) for r in rows]
    return [(n, share, s) for (n, share), s in _merged(per_entry)]


def fit_sync_wait(profile: CalibrationProfile, key: str,
                  runs: list[tuple[dict[str, float], dict[str, float]]]) -> CalibrationProfile:
    """The wait at the per-layer sync points of ``key``'s plans per second of compute, from
    executor runs given as (measured phases, predicted phases without such waits): the exposed
    communication the runs measured beyond what the collectives cost (their microbenchmark
    times), over the compute they measured (forward + backward), averaged over the runs."""
    from dataclasses import replace

    fractions = []
    for m, p in runs:
        compute = m.get("forward_s", 0.0) + m.get("backward_s", 0.0)
        if m.get("comm_s") is not None and compute > 0:
            fractions.append(max(0.0, m["comm_s"] - p["comm_s"]) / compute)
    if not fractions:
        return profile
    residuals = dict(profile.residuals)
    if len(fractions) > 1:
        residuals[f"sync wait fraction spread ({key} runs)"] = max(fractions) - min(fractions)
    return replace(profile, sync_wait_fractions={**profile.sync_wait_fractions, key: sum(fractions) / len(fractions)},
                   residuals=residuals)


OVERHEAD_RANGE = (1e-7, 5e-3)  # seconds per op the overhead searches span (0.1 us .. 5 ms)
# sync-point waits of more than three times the compute are not ranks waiting for each other's jitter
# (on tiny models the latency of many small collectives the alpha-beta links underprice lands here too)
SYNC_WAIT_MAX = 3.0


def fit_overhead(profile: CalibrationProfile, error_of: Callable[[CalibrationProfile], float],
                 key: str | None = None) -> CalibrationProfile:
    """Choose the per-op overhead that minimises the mean |log error| of step time over the
    executor runs given for fitting (golden-section search on a log scale over
    :data:`OVERHEAD_RANGE`): the plain per-kernel overhead (framework dispatch on CPU) when
    ``key`` is None, else the extra overhead of one software layer (``framework_overheads_s[key]``)."""
    from dataclasses import replace

    def with_value(v: float) -> CalibrationProfile:
        if key is None:
            return replace(profile, kernel_overhead_s=v)
        return replace(profile, framework_overheads_s={**profile.framework_overheads_s, key: v})

    lo, hi = math.log(OVERHEAD_RANGE[0]), math.log(OVERHEAD_RANGE[1])
    f = lambda x: error_of(with_value(math.exp(x)))  # noqa: E731
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(30):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    best = with_value(math.exp((a + b) / 2))
    label = "executor runs mean |log error|" + (f" ({key} runs)" if key else "")
    return replace(best, residuals={**best.residuals, label: f((a + b) / 2)})
