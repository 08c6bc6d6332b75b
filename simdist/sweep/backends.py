"""Where a sweep's points run: local processes (the default) or a Ray cluster (``--ray``).

Points travel in chunks, one task per chunk, so that the cost of scheduling a task is paid once
per chunk rather than once per point. The chunk size (:func:`chunk_size`) follows one rule:

    chunk = max(ceil(20 * overhead / t),  min(ceil(n / (4 * workers)), floor(30 s / t)))

with ``t`` the measured seconds of one point (the driver times the first point itself) and
``overhead`` the seconds a task costs beyond its work (:data:`POOL_TASK_OVERHEAD_S`,
:data:`RAY_TASK_OVERHEAD_S`). The first term keeps scheduling under 5% of the work
(overhead / (chunk * t) <= 1/20) and wins over the others; the second gives each worker about
four chunks, so they finish together; the third keeps a chunk under about 30 s of work, so a
crash loses little and the progress bar moves.

Ray is optional (``pip install 'simdist[cluster]'``) and imported only when asked for.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any

from simdist.errors import Problem, ScenarioError
from simdist.sweep.points import Job, evaluate_chunk

Chunk = list[tuple[int, dict[str, Any]]]
Rows = list[tuple[int, dict[str, Any]]]
POOL_TASK_OVERHEAD_S = 0.002  # a chunk through a forked process pool: pickling both ways, a pipe
RAY_TASK_OVERHEAD_S = 0.02  # a Ray task: submission, scheduling, the object store, across nodes
CHUNK_WORK_S = 30.0  # the most work one chunk should hold
OVERHEAD_SHARE = 0.05  # scheduling may cost at most this share of the work


def chunk_size(n: int, workers: int, seconds_per_point: float, overhead_s: float) -> int:
    """Points per task for ``n`` points on ``workers`` workers (the rule in the module's text)."""
    if n <= 0:
        return 1
    t = max(seconds_per_point, 1e-6)
    floor_for_overhead = math.ceil(overhead_s / (OVERHEAD_SHARE * t))
    balance = math.ceil(n / (4 * max(1, workers)))
    bounded = max(1, math.floor(CHUNK_WORK_S / t))
    return max(1, min(n, max(floor_for_overhead, min(balance, bounded))))


def chunks_of(items: list[tuple[int, dict[str, Any]]], size: int) -> list[Chunk]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def local_workers(workers: int | None) -> int:
    if workers is not None:
        return max(1, workers)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def run_local(job: Job, chunks: list[Chunk], workers: int) -> Iterator[Rows]:
    """Each chunk's rows as it completes; in this process when one worker is asked for."""
    if workers <= 1 or len(chunks) <= 1:
        for chunk in chunks:
            yield evaluate_chunk(job, chunk)
        return
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        pending = {pool.submit(evaluate_chunk, job, chunk) for chunk in chunks}
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    yield future.result()
        finally:
            for future in pending:
                future.cancel()


def ray_module() -> Any:
    """The ``ray`` module, or a ScenarioError naming ``--ray`` when it is not installed."""
    try:
        import ray
    except ImportError:
        raise ScenarioError(Problem("--ray", "Ray is not installed: pip install 'simdist[cluster]' "
                                    "(or run without --ray for local processes)")) from None
    return ray


def connect_ray(address: str | None) -> Any:
    """Ray, connected: to the running instance of this process if there is one, else to
    ``address`` ("auto": the cluster this machine belongs to, or $RAY_ADDRESS)."""
    ray = ray_module()
    if ray.is_initialized():
        return ray
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ScenarioError(Problem("--ray", f"cannot connect to Ray at {address!r}: {exc}")) from None
    return ray


def ray_workers(ray: Any) -> int:
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def run_ray(ray: Any, job: Job, chunks: list[Chunk]) -> Iterator[Rows]:
    """Each chunk as one Ray task (one CPU each); rows as tasks complete."""
    remote = ray.remote(num_cpus=1)(evaluate_chunk)
    job_ref = ray.put(job)  # once in the object store, not once per task
    pending = [remote.remote(job_ref, chunk) for chunk in chunks]
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                yield ray.get(ref)
    finally:
        for ref in pending:
            ray.cancel(ref)
