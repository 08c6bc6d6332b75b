"""How fast the host ran while a CPU run measured it: fixed workloads timed on every rank before
its first step, between its measured steps and after its last (torch only inside the functions
the ranks call).

The load figures (executor.hostload) say how much of the cores other processes took; they do
not say how fast the cores ran what they were given. On the 2-core guest simdist was calibrated
on, calibrations had phases with the tiny plans' compute 10-40% slower while no other process
ran and no steal was reported (benchmarks/README.md). So every CPU rank times two fixed
workloads by CPU time (:func:`reference_cpu_s`): before its first step and after its last (the
least of :data:`REFERENCE_REPS` repeats each), and between the measured steps
(:class:`BetweenSteps`), where it also times a round of one-element all-reduces, the
collectives' latency at that moment. Timings around a run miss a slow phase that begins after
its first step and ends before its last: q41 (2026-11-29) had two of three fit-pp-1f1b runs take
1.28x the third's CPU time for the same work with their timings around the run at the host's
usual; q42's fit-ddp runs waited 1.2-2.2 ms a step for their collectives against q44's 0.7-1.2 ms,
their compute alike.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

REFERENCE_REPS = 7
BETWEEN_REPS = 2  # repeats of each workload between steps (the lesser counts)
BETWEEN_SAMPLES = 8  # at most this many measured steps are followed by a timing, spread evenly
LATENCY_ROUNDS = 8  # one-element all-reduces timed between steps (their median counts)


def reference_cpu_s(reps: int = REFERENCE_REPS) -> dict[str, float]:
    """CPU seconds (``time.thread_time``) the calling thread takes for two fixed workloads, each
    the least of ``reps`` repeats (one interrupted repeat does not count):

    - ``reference_cpu_s``: a chain of eight 256 x 256 x 256 fp32 GEMMs, each followed by a GELU
      and an add: the kernels' own speed (2.5-2.8 ms single-threaded on the 2-core machine it was
      written on);
    - ``reference_ops_cpu_s``: twenty forward and backward passes of four 32-wide linear layers
      on 8 rows: the cost of each op's dispatch and autograd bookkeeping, which is most of a tiny
      plan's step (2.7-3.1 ms there).

    CPU time, not wall time, so that ranks waiting for a core (more ranks than cores) do not
    count it. Its own generator: the global RNG, and so the run's losses, are untouched. The
    measurement keeps, per workload, the slowest timing of each rank (before, between, after),
    its median over the ranks (``environment``: executor.report.reference_speed), so that runs of
    one calibration made while the host ran slower can be told apart (simdist.calibrate.honesty)."""
    import torch  # the ranks have it; the launcher, which imports this package, need not

    g = torch.Generator().manual_seed(0)
    w = torch.randn(256, 256, generator=g) / 16
    x0 = torch.randn(256, 256, generator=g)
    small_w = (torch.randn(32, 32, generator=g) / 6).requires_grad_()
    small_x = torch.randn(8, 32, generator=g)

    def gemms() -> None:
        x = x0
        for _ in range(8):
            x = torch.nn.functional.gelu(x @ w) + x

    def ops() -> None:
        for _ in range(20):
            x = small_x
            for _ in range(4):
                x = torch.nn.functional.gelu(x @ small_w) + x
            x.sum().backward()
        small_w.grad = None

    return {"reference_cpu_s": _least_cpu(gemms, reps), "reference_ops_cpu_s": _least_cpu(ops, reps)}


def _least_cpu(fn: Callable[[], None], reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
    return best


def allreduce_latency_s(group: Any = None, rounds: int = LATENCY_ROUNDS) -> float:
    """The median wall time of ``rounds`` all-reduces of one float on ``group``: the
    collectives' latency at this moment (on gloo mostly the wake-up of the peers' threads)."""
    import torch
    import torch.distributed as dist

    x = torch.zeros(1)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        dist.all_reduce(x, group=group)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


class BetweenSteps:
    """The host's speed timed after measured steps, every rank at once: after ``sync`` (a barrier:
    no rank still computes a step), :func:`reference_cpu_s` (the least of :data:`BETWEEN_REPS`)
    and :func:`allreduce_latency_s`; after at most :data:`BETWEEN_SAMPLES` of ``steps`` measured
    steps, spread evenly, so that a long run is not lengthened by much (about 20 ms a sample)."""

    def __init__(self, steps: int):
        self.every = max(1, -(-steps // BETWEEN_SAMPLES))
        self.samples: list[dict[str, float]] = []

    def after(self, index: int, sync: Callable[[], None], group: Any = None) -> None:
        """After the ``index``-th measured step (from 0)."""
        if index % self.every:
            return
        sync()
        self.samples.append({**reference_cpu_s(BETWEEN_REPS), "allreduce_s": allreduce_latency_s(group)})

    def result(self) -> dict[str, float] | None:
        """Each figure's median over the samples; None without any."""
        if not self.samples:
            return None
        return {k: statistics.median(s[k] for s in self.samples) for k in self.samples[0]}
