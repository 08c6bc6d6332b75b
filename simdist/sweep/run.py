"""``run_sweep``: the driver. It lists the points, skips those the run store already holds for
the sweep's id, times one point itself to size the chunks, sends the rest out in chunks (local
processes or Ray), stores each finished chunk in one transaction, and returns the table.

A crash or Ctrl-C loses at most the chunks in flight: rerun the same sweep id and it continues.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from simdist.frozen import frozen
from simdist.sweep import backends
from simdist.sweep.points import RESULT_COLUMNS, Job, evaluate_chunk
from simdist.sweep.spec import SweepSpec, canonical_json
from simdist.sweep.store import SweepStore
from simdist.sweep.table import to_frame

if TYPE_CHECKING:
    import pandas as pd

Backend = Literal["local", "ray"]
Progress = Callable[[int, int], None]  # (points done, points in all)


@frozen
class SweepOutcome:
    sweep_id: str
    table: pd.DataFrame
    points: int
    skipped: int  # already in the store
    computed: int  # run now
    chunk_size: int
    workers: int
    backend: str
    seconds: float


def columns_of(spec: SweepSpec) -> list[str]:
    """The table's columns: ``cost`` only with prices, ``goodput`` only with a reliability section."""
    reliability = spec.base.get("reliability") is not None or any(f.startswith("reliability.") for f in spec.fields)
    optional = {"cost": spec.cost_per_gpu_hour is not None, "goodput": reliability}
    return ["point", *spec.fields, *(c for c in RESULT_COLUMNS if optional.get(c, True))]


def run_sweep(spec: SweepSpec, store: SweepStore, sweep_id: str | None = None, backend: Backend = "local",
              workers: int | None = None, ray_address: str | None = "auto",
              progress: Progress | None = None) -> SweepOutcome:
    """Run the points of ``spec`` not yet stored under ``sweep_id`` (default: the sweep's name)."""
    start = time.perf_counter()
    sweep_id = sweep_id or spec.name
    points = list(spec.points())
    blob = canonical_json(spec.settings())
    keys = [spec.point_key(p, blob) for p in points]
    columns = columns_of(spec)
    ray = backends.connect_ray(ray_address) if backend == "ray" else None
    n_workers = backends.ray_workers(ray) if ray is not None else backends.local_workers(workers)
    store.begin(sweep_id, {"name": spec.name, "base": spec.base_path, **spec.settings(),
                           "axes": [[list(a.fields), [list(v) for v in a.values]] for a in spec.axes]},
                columns, keys)
    done = store.done_keys(sweep_id)
    todo = [(i, p) for i, p in enumerate(points) if keys[i] not in done]
    skipped = len(points) - len(todo)
    finished = skipped
    if progress:
        progress(finished, len(points))

    def keep(rows: list[tuple[int, dict[str, Any]]]) -> None:
        nonlocal finished
        store.save(sweep_id, [(keys[i], i, {"point": i, **points[i], **row}) for i, row in rows])
        finished += len(rows)
        if progress:
            progress(finished, len(points))

    job, size = Job.of(spec), 1
    if todo:
        t0 = time.perf_counter()
        keep(evaluate_chunk(job, todo[:1]))  # timed here: it sizes the chunks
        per_point = time.perf_counter() - t0
        rest = todo[1:]
        overhead = backends.RAY_TASK_OVERHEAD_S if ray is not None else backends.POOL_TASK_OVERHEAD_S
        size = backends.chunk_size(len(rest), n_workers, per_point, overhead)
        chunks = backends.chunks_of(rest, size)
        results = backends.run_ray(ray, job, chunks) if ray is not None else \
            backends.run_local(job, chunks, n_workers)
        for rows in results:
            keep(rows)
    cols, rows = store.rows(sweep_id)
    return SweepOutcome(sweep_id=sweep_id, table=to_frame(cols, rows), points=len(points), skipped=skipped,
                        computed=len(todo), chunk_size=size, workers=n_workers, backend=backend,
                        seconds=time.perf_counter() - start)


class ProgressBar:
    """A tqdm bar of points on standard error (tqdm hides it when stderr is not a terminal)."""

    def __init__(self, enabled: bool = True, desc: str = "sweep"):
        self.enabled, self.desc, self.bar = enabled, desc, None

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=done, desc=self.desc, unit="point", file=sys.stderr,
                            disable=None, leave=False)
        else:
            self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
