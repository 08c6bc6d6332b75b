"""Where a measured step's time went, in time: phase spans, the wait for a CPU core, and
torch.profiler traces (``simdist run --trace DIR``).

Phase spans: every measured step records, per rank, the spans the step probe already times
(:class:`executor.measure.StepProbe`): each forward of a model chunk, each backward of a
micro-batch (outside a pipeline), the pipeline schedule as a whole, the optimizer step; times
are seconds from the step's start, which follows a barrier on every rank, so the ranks' clocks
line up to within that barrier's skew. Rank 0 keeps the spans of the median step
(:func:`timeline_of`), which ``simdist compare --trace`` sets beside the predicted timeline.

Core wait: on Linux, ``/proc/self/task/TID/schedstat`` holds the time a thread was runnable
but waiting for a CPU (its second field, ``run_delay``). Over a step, wall = CPU time + core
wait + blocked time, so the executor splits what is not CPU time into the wait for a core
(other processes, or more ranks than cores) and the wait for peers (``comm``).

Traces: with ``--trace``, the measured steps run under ``torch.profiler.profile`` (CPU
activities, CUDA too on a GPU) and each rank writes its Chrome/Kineto trace; the phase spans are
added to it as ``user_annotation`` events (``record_function``), so one trace shows both.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def run_delay_s() -> float | None:
    """Seconds the calling thread has waited for a CPU since it started (None off Linux)."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat", encoding="ascii") as fh:
            return int(fh.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class Spans:
    """Named (start, end) spans of one step, in seconds from its start."""

    def __init__(self) -> None:
        self.t0 = 0.0
        self.epoch = 0.0  # the step's start on the wall clock (Unix seconds), to place profiler traces
        self.items: list[tuple[str, float, float]] = []

    def begin(self, t0: float) -> None:
        self.t0 = t0
        self.epoch = time.time()
        self.items = []

    def add(self, name: str, start: float, end: float) -> None:
        self.items.append((name, start - self.t0, end - self.t0))

    def record(self) -> dict[str, Any]:
        """What a rank keeps of one step: its start on the wall clock and its spans."""
        return {"epoch": self.epoch, "spans": [[name, round(a, 7), round(b, 7)] for name, a, b in self.items]}


def timeline_of(ranks: list[dict[str, Any]], step: int, wall: list[float]) -> dict[str, Any]:
    """The measurement's ``timeline``: each rank's spans of measured step ``step`` (the median)."""
    return {"step": step, "step_time_s": wall[step],
            "ranks": [{"rank": r["rank"], **r["spans"][step]} for r in ranks if r.get("spans")]}


class Tracer:
    """torch.profiler over the measured steps, one Chrome trace per rank (``--trace``)."""

    def __init__(self, directory: str | None, rank: int, cuda: bool):
        self.directory = Path(directory) if directory else None
        self.rank, self.cuda = rank, cuda
        self.profiler: Any = None

    @property
    def on(self) -> bool:
        return self.directory is not None

    def start(self) -> None:
        if self.directory is None or self.profiler is not None:
            return
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self.profiler = profile(activities=activities, record_shapes=False, with_stack=False)
        self.profiler.__enter__()

    def stop(self) -> str | None:
        """End the profile and write this rank's trace; returns its path."""
        if self.profiler is None or self.directory is None:
            return None
        self.profiler.__exit__(None, None, None)
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"trace-rank{self.rank}.json"
        tmp = path.with_suffix(".json.tmp")
        self.profiler.export_chrome_trace(str(tmp))
        tmp.replace(path)
        self.profiler = None
        return str(path)

    @contextlib.contextmanager
    def span(self, name: str) -> Iterator[None]:
        """A named range in the trace (only while profiling)."""
        if self.profiler is None:
            yield
            return
        from torch.profiler import record_function

        with record_function(f"simdist:{name}"):
            yield
