"""Spans -> Chrome trace event JSON, which Perfetto (ui.perfetto.dev) and chrome://tracing open.

Format: the Trace Event Format (Google, "Trace Event Format" document): one process per rank
(``process_name`` metadata "rank N (stage s)"), one thread per stream (compute, tp, pp, dp,
gather), each span a complete event (``"ph": "X"``) with ``ts`` and ``dur`` in microseconds.
Pure functions of the spans, so a cached Prediction can be traced again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from simdist.results import Span

STREAM_ORDER = ("compute", "tp", "pp", "dp", "gather")
US = 1e6  # microseconds per second


def _tid(stream: str) -> int:
    return STREAM_ORDER.index(stream) + 1 if stream in STREAM_ORDER else len(STREAM_ORDER) + 1 + sum(map(ord, stream))


def chrome_trace(
    spans: Iterable[Span],
    stage_of: Callable[[int], int] | None = None,
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The trace as a JSON-ready dict; ``stage_of(rank)`` names each rank's pipeline stage."""
    spans = list(spans)
    events: list[dict[str, Any]] = []
    threads: dict[tuple[int, str], None] = {}
    for s in spans:
        threads[(s.rank, s.stream)] = None
    for rank in sorted({r for r, _ in threads}):
        label = f"rank {rank}" + (f" (stage {stage_of(rank)})" if stage_of else "")
        events.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": label}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
    for rank, stream in sorted(threads, key=lambda k: (k[0], _tid(k[1]))):
        tid = _tid(stream)
        events.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": stream}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": rank, "tid": tid, "args": {"sort_index": tid}})
    for s in spans:
        events.append({
            "name": s.name, "cat": s.category or s.stream, "ph": "X",
            "ts": s.start * US, "dur": max(0.0, s.end - s.start) * US,
            "pid": s.rank, "tid": _tid(s.stream),
        })
    out: dict[str, Any] = {"traceEvents": events, "displayTimeUnit": "ms"}
    if metadata:
        out["otherData"] = metadata
    return out


def write_trace(path: str | Path, spans: Iterable[Span], stage_of: Callable[[int], int] | None = None,
                metadata: dict[str, Any] | None = None) -> int:
    """Write the trace atomically (whole or not at all); returns the number of spans written."""
    from simdist.spec.files import write_json_atomic

    data = chrome_trace(spans, stage_of, metadata)
    write_json_atomic(path, data)
    return sum(1 for e in data["traceEvents"] if e["ph"] == "X")
