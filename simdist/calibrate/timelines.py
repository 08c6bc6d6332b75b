"""Predicted and measured timelines of one step, side by side: per rank, per phase.

Measured: the executor keeps, for the median measured step, each rank's phase spans (forward of
each chunk, backward of each micro-batch, the pipeline schedule, the optimizer; seconds from the
step's start, which follows a barrier on every rank) and the step's start on the wall clock
(``timeline`` in the measurement). With ``simdist run --trace DIR``, each rank's torch.profiler
(Kineto) trace adds what the CPU phases cannot show: every gloo/NCCL collective as the backend
ran it (``gloo:all_reduce``, ... on the backend's threads) and the training thread's waits for
results (``_c10d_functional::wait_tensor``, ``c10d::wait``, point-to-point ``recv``); Kineto's
timestamps are microseconds from ``baseTimeNanoseconds`` (Unix time), which places them on the
same axis as the executor's spans.

Predicted: the event engine's spans of every rank (``fidelity="full"``).

:func:`two_timelines` writes both into one Chrome/Perfetto trace (predicted rank r above
measured rank r), and :func:`phase_totals` sums each side by phase (forward, backward,
optimizer, each collective kind, sync waits, bubble) for the compare table.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from simdist.results import Span
from simdist.spec.measurement import Measurement

KINDS = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "sendrecv", "send", "recv",
         "push", "pull", "barrier")
_GLOO = {"all_reduce": "allreduce", "allreduce": "allreduce", "all_gather": "allgather", "allgather": "allgather",
         "reduce_scatter": "reducescatter", "reducescatter": "reducescatter", "alltoall": "alltoall",
         "all_to_all": "alltoall", "broadcast": "broadcast", "send": "sendrecv", "recv": "sendrecv",
         "barrier": "barrier", "gather": "allgather", "scatter": "reducescatter"}
_WAITS = ("_c10d_functional::wait_tensor", "c10d::wait", "c10d::recv_", "c10d::recv_any_source_")
MEASURED_PID = 10000  # measured rank r is process MEASURED_PID + r in the combined trace


def measured_spans(m: Measurement, trace_dir: str | Path | None = None) -> list[Span]:
    """The executor's spans of the median step, plus the profiler's collectives and waits when
    ``trace_dir`` holds the run's Kineto traces (``trace-rank<r>.json``)."""
    timeline = m.extras.get("timeline") or {}
    step = float(timeline.get("step_time_s") or m.step_time_s)
    out: list[Span] = []
    for entry in timeline.get("ranks") or []:
        rank = int(entry["rank"])
        rows = [(str(n), float(a), float(b)) for n, a, b in entry.get("spans") or []]
        forwards = [(a, b) for n, a, b in rows if n == "forward"]
        for name, a, b in rows:
            if name == "pipeline":  # the schedule: what its forwards leave is backward and waiting
                for ga, gb in _gaps(a, b, forwards):
                    out.append(Span(rank, "compute", "backward + waits", ga, gb, "backward"))
            else:
                out.append(Span(rank, "compute", name, a, b, name))
        epoch = entry.get("epoch")
        if trace_dir is not None and epoch is not None:
            out += kineto_spans(Path(trace_dir) / f"trace-rank{rank}.json", rank, float(epoch), step)
    return out


def _gaps(start: float, end: float, inside: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out, t = [], start
    for a, b in sorted((max(a, start), min(b, end)) for a, b in inside if b > start and a < end):
        if a > t:
            out.append((t, a))
        t = max(t, b)
    if t < end:
        out.append((t, end))
    return out


def kineto_spans(path: Path, rank: int, epoch: float, step: float) -> list[Span]:
    """Collectives (stream ``comm``) and the training thread's waits (stream ``wait``) of one
    rank's Kineto trace inside the step that starts at ``epoch`` (Unix seconds)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    base_us = float(data.get("baseTimeNanoseconds", 0)) / 1e3
    events = [e for e in data.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    ops: dict[Any, int] = defaultdict(int)
    for e in events:
        if e.get("cat") == "cpu_op":
            ops[e.get("tid")] += 1
    main = max(ops, key=ops.get) if ops else None
    out = []
    for e in events:
        start = (base_us + float(e["ts"])) / 1e6 - epoch
        end = start + float(e.get("dur", 0.0)) / 1e6
        if end <= 0 or start >= step:
            continue
        name = str(e.get("name", ""))
        if name.startswith(("gloo:", "nccl:")):
            kind = _GLOO.get(name.split(":", 1)[1], name.split(":", 1)[1])
            out.append(Span(rank, "comm", kind, max(0.0, start), min(step, end), kind))
        elif e.get("tid") == main and name in _WAITS:
            out.append(Span(rank, "wait", "wait", max(0.0, start), min(step, end), "waits"))
    return out


def predicted_spans(scenario: Any, profile: Any) -> tuple[list[Span], float]:
    """The event engine's spans of every rank, and its step time."""
    from simdist.predict import predict

    pred = predict(scenario, profile=profile, engine="des", fidelity="full", keep_spans=True)
    return list(pred.spans), pred.step_time_s


def phase_of(span: Span) -> str:
    """forward, backward, optimizer, a collective kind, waits, bubble, ... for one span."""
    first = span.name.split(" ")[0]
    if span.category == "idle" or first == "bubble":
        return "bubble"
    if first == "wait" or span.category == "waits":
        return "waits"
    if span.stream in ("comm", "tp", "pp", "dp", "gather", "pull") and first in KINDS:
        return "sendrecv" if first in ("send", "recv") else first
    return span.category or first


def phase_totals(spans: list[Span]) -> dict[str, float]:
    """Seconds per phase, averaged over the ranks that have spans."""
    ranks = {s.rank for s in spans}
    totals: dict[str, float] = defaultdict(float)
    for s in spans:
        totals[phase_of(s)] += max(0.0, s.end - s.start)
    return {k: v / len(ranks) for k, v in sorted(totals.items())} if ranks else {}


def two_timelines(predicted: list[Span], measured: list[Span], metadata: dict[str, Any] | None = None
                  ) -> dict[str, Any]:
    """One Chrome/Perfetto trace: process r is predicted rank r, MEASURED_PID + r measured rank r,
    sorted so that each rank's two timelines sit together; times in microseconds from the step's start."""
    from simdist.trace.perfetto import chrome_trace

    pred = chrome_trace(predicted)["traceEvents"]
    meas = chrome_trace([Span(MEASURED_PID + s.rank, s.stream, s.name, s.start, s.end, s.category)
                         for s in measured])["traceEvents"]
    events = []
    for e in pred + meas:
        pid = int(e["pid"])
        rank, side = (pid - MEASURED_PID, "measured") if pid >= MEASURED_PID else (pid, "predicted")
        if e.get("name") == "process_name":
            e = {**e, "args": {"name": f"rank {rank} {side}"}}
        elif e.get("name") == "process_sort_index":
            e = {**e, "args": {"sort_index": 2 * rank + (side == "measured")}}
        events.append(e)
    out: dict[str, Any] = {"traceEvents": events, "displayTimeUnit": "ms"}
    if metadata:
        out["otherData"] = metadata
    return out


def timeline_rows(m: Measurement, trace_dir: str | Path | None, scenario: Any, profile: Any
                  ) -> tuple[list[Span], list[Span], float]:
    """(predicted spans, measured spans, predicted step) for a measurement and its scenario."""
    predicted, step = predicted_spans(scenario, profile)
    return predicted, measured_spans(m, trace_dir), step
