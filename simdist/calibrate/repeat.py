"""Repeat an executor run until its median step is stable, or a budget runs out.

One run of a few steps on a shared machine says little: another process can slow every step
of it. So a calibration run is repeated: after each run, the median over the runs' medians is
compared with the one before; the series is *stable* when at least ``min_runs`` runs agree so
that adding the last one moved that median by at most ``tolerance`` (relative). It stops there,
or after ``max_runs`` runs or ``budget_s`` seconds, and says which. Runs made while the host ran
slower than during the series' others (:func:`at_host_speed`: fixed workloads timed between the
steps took more CPU time) do not count towards it, so another run replaces them.

What it keeps: every run's median step, their run-to-run spread ((max - min) / median, the
figure the fits are held to), the run whose median is the median of medians (its phases stand
for the series), and how noisy the machine was: the largest share of the step the ranks waited
for a CPU core (``phases_s.core_wait``) and the most CPU other processes used during a run
(``host.others_cores``, from executor.hostload), and whether the runs disagree on the work
itself (:meth:`Repeated.doubt`): runs whose compute phases fall in two groups more than
:data:`COMPUTE_GAP` apart while the machine was quiet measured two different machines (a
frequency step, another NUMA placement, a cache-hostile neighbour), so their median is one of
the two by chance and an error against it doubts the measurement, not the model.

How many steps a run measures (:func:`repeat_sized`): the steps of one run jitter by a quarter
of a step and more where a step is 10-20 ms (2 ranks and gloo's threads on 2 cores: a step that
lost a scheduler slice is 1.5 ms longer), and the median of 5 such steps moves by about as
much from run to run (measured: tiny-ddp runs' medians 10.3-12.9 ms). The median of n steps
jitters about as 1/sqrt(n), so a run measures at least :data:`MEASURED_S` of steps: a first run
of the asked-for steps sizes the rest, and is set aside when they take more steps.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import field, replace
from typing import Any

from simdist.calibrate.honesty import BUSY_SHARE, HOST_DRIFT, drift_note, median_speed
from simdist.frozen import frozen
from simdist.spec.measurement import Measurement
from simdist.spec.profile import UNKNOWN_SPEED, HostSpeed

COMPUTE_GAP = 0.25  # runs whose sorted compute phases jump by more than this (relative) fall in two groups
MEASURED_S = 1.0  # s of measured steps a run aims for (module docstring)
MAX_STEPS = 60  # ... in at most this many steps


@frozen
class Repeated:
    """A scenario measured several times."""

    name: str
    runs: tuple[Measurement, ...]
    stable: bool  # the median settled within the tolerance
    stopped: str  # "stable" | "max runs" | "budget" | "failed" (PlanFailed) | "stored"
    seconds: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def medians(self) -> list[float]:
        return [m.step_time_s for m in self.runs]

    @property
    def median(self) -> float:
        return statistics.median(self.medians)

    @property
    def spread(self) -> float:
        """Run-to-run spread of the medians; one run: the spread of its own steps."""
        if len(self.runs) < 2:
            return self.runs[0].spread
        return (max(self.medians) - min(self.medians)) / self.median

    @property
    def median_error(self) -> float:
        """The uncertainty (s) of the median step: a median's standard error, sqrt(pi/2) sigma /
        sqrt(n), with sigma from the runs' median absolute deviation (x 1.4826, a normal
        distribution's), which one outlying run of several does not inflate as it does the spread
        (q40, 2026-11-29: one of four fit-fsdp3 runs 50% slow, spread 58%, deviation 3%); one run:
        the same over its own steps. Its steps' spread (max - min), taken before, overstated a
        one-run median's uncertainty about fourteen-fold: q69 (2026-12-07) kept one fit-fsdp2 run
        of five, 24 steps of 31-45 ms (spread 37%, standard error 1 ms), and ZeRO-2's waits (7 ms
        a step) fell under it as noise, fitted as none: fit-fsdp2 -24%, tiny-fsdp2 -29% held out."""
        values = self.medians if len(self.runs) > 1 else list(self.runs[0].step_times_s)
        mid = statistics.median(values)
        mad = statistics.median(abs(x - mid) for x in values)
        return math.sqrt(math.pi / 2) * 1.4826 * mad / math.sqrt(len(values))

    @property
    def representative(self) -> Measurement:
        """The run whose median is the median of medians (the lower middle for an even count)."""
        order = sorted(self.runs, key=lambda m: m.step_time_s)
        return order[(len(order) - 1) // 2]

    @property
    def core_wait(self) -> float:
        """The largest share of a step the ranks waited for a CPU core, over the runs."""
        return max((core_wait_share(m) for m in self.runs), default=0.0)

    @property
    def others_cores(self) -> float:
        """The most CPU (in cores) other processes used during one of the runs."""
        return max((others_cores(m) for m in self.runs), default=0.0)

    @property
    def compute_gap(self) -> float:
        """The largest jump between the runs' compute phases (forward + backward + the rest of
        the step's CPU time), sorted, relative to the lower of the two; 0 with fewer than two
        runs that measured them."""
        return max((b / a - 1 for a, b in itertools.pairwise(self._computes)), default=0.0)

    @property
    def _computes(self) -> list[float]:
        return sorted(c for c in (compute_phase(m) for m in self.runs) if c is not None and c > 0)

    @property
    def _slow_from(self) -> int:
        """Where :attr:`_computes` jumps most: the index of the slower group's first run."""
        values = self._computes
        return max(range(1, len(values)), key=lambda i: values[i] / values[i - 1])

    @property
    def at_host_speed(self) -> Repeated:
        """The series without the runs made while the host ran slower (:func:`at_host_speed`),
        which its notes name; itself when there were none."""
        slower = _slower_than_fastest(self.runs)
        kept = tuple(m for m, x in zip(self.runs, slower, strict=True) if x <= HOST_DRIFT)
        if len(kept) == len(self.runs):
            return self
        return replace(self, runs=kept, notes=(*self.notes, f"{len(self.runs) - len(kept)} of {len(self.runs)} run(s) "
                                               f"set aside, the host up to {max(slower):.0%} slower during them"))

    @property
    def undisturbed(self) -> Repeated:
        """The series at the host's speed (:attr:`at_host_speed`), without its slower group of runs
        where their compute falls in two groups (:data:`COMPUTE_GAP`): the same work on one
        machine, and interference only adds CPU time (a neighbour evicting the cache, a lower
        clock). A fit run is fitted on it (q41, 2026-11-29: two of three fit-pp-1f1b runs took
        1.28x the third's CPU time for the same work, the fitted pipeline terms priced the tiny
        pipelines 13-28% slow; on the faster run alone, within 3-7%)."""
        base = self.at_host_speed
        if base.compute_gap <= COMPUTE_GAP:
            return base
        values, cut = base._computes, base._slow_from
        fast = tuple(m for m in base.runs if (compute_phase(m) or 0.0) <= values[cut - 1])
        return replace(base, runs=fast, notes=(*base.notes, f"{len(base.runs) - len(fast)} of {len(base.runs)} run(s) "
                                               f"set aside, their compute {1 + base.compute_gap:.2f}x the others'"))

    def doubt(self, cores: int, baseline: HostSpeed = UNKNOWN_SPEED) -> str | None:
        """A note when the measured median is in doubt rather than the prediction; None else:

        - the runs' compute falls in two groups (:data:`COMPUTE_GAP`) though other processes left
          the cores alone (at most honesty.BUSY_SHARE of ``cores``): the same work took unlike times;
        - the host ran slower or faster than at ``baseline``, its speed during the fit runs (the
          profile's, :meth:`CalibrationProfile.host_speed`; honesty.HOST_DRIFT)."""
        notes = []
        gap = self.compute_gap
        if gap > COMPUTE_GAP and not (cores > 0 and self.others_cores > BUSY_SHARE * cores):
            values, cut = self._computes, self._slow_from
            notes.append(f"compute {1 + gap:.2f}x between runs ({len(values) - cut} of {len(values)} slow) on a quiet "
                         "machine: the measurement is in doubt")
        drift = drift_note(self.reference.drift(baseline))
        if drift:
            notes.append(drift + ": the measurement is of another machine")
        return "; ".join(notes) or None

    @property
    def reference(self) -> HostSpeed:
        """The host's speed over the runs: each reference workload's median CPU time."""
        return median_speed([host_speed(m) for m in self.runs])

    @property
    def loadavg(self) -> list[float] | None:
        """The load averages seen at the end of the busiest run (highest 1-minute figure)."""
        seen = [list((m.extras.get("host") or {}).get("loadavg") or []) for m in self.runs]
        seen = [x for x in seen if x]
        return max(seen, key=lambda x: x[0]) if seen else None


def core_wait_share(m: Measurement) -> float:
    wait = m.phase("core_wait")
    return 0.0 if wait is None or m.step_time_s <= 0 else wait / m.step_time_s


def compute_phase(m: Measurement) -> float | None:
    """A run's compute: forward + backward + the rest of the step's CPU time (None without them)."""
    parts = [m.phase(k) for k in ("forward", "backward")]
    if any(p is None for p in parts):
        return None
    return sum(parts) + (m.phase("other") or 0.0)  # type: ignore[arg-type]


def host_speed(m: Measurement) -> HostSpeed:
    """The run's reference workloads' CPU times (executor.hostspeed.reference_cpu_s): those timed
    between its measured steps (:func:`speed_amid_steps`), which saw what the steps saw; for a run
    without them, the slowest of its timings before the first step and after the last
    (``environment``). q47 (2026-11-29): every local-tp-fit run timed its workloads at the host's
    usual between its steps (GEMMs 3.14-3.22 ms, small ops 5.18-5.45), while the timings around
    them (up to 3.97 and 7.18 ms before the first run's first step, small ops 5.90 after the
    third's last) put the series 12% above the fit runs' median and refused the fit as made on
    another host."""
    amid = speed_amid_steps(m)
    return amid if amid.gemm > 0 else _speed(m.extras.get("environment") or {})


def speed_amid_steps(m: Measurement) -> HostSpeed:
    """The reference workloads' CPU times timed between the run's measured steps (``environment.
    reference_between``, executor.hostspeed.BetweenSteps); unknown for a run without them."""
    return _speed((m.extras.get("environment") or {}).get("reference_between") or {})


def _speed(timings: dict[str, Any]) -> HostSpeed:
    return HostSpeed(float(timings.get("reference_cpu_s") or 0.0), float(timings.get("reference_ops_cpu_s") or 0.0))


def fastest_host(runs: Sequence[Measurement]) -> HostSpeed:
    """The timings between the steps of the run that ran nearest each workload's least CPU time
    over ``runs`` (by its slower workload): one run's, so that it is never itself set aside (runs
    each slow in another workload would all be, against the least of each); unknown where no run
    has them."""
    speeds = [s for s in map(speed_amid_steps, runs) if s.gemm > 0 and s.ops > 0]
    if not speeds:
        return HostSpeed()
    floor = HostSpeed(min(s.gemm for s in speeds), min(s.ops for s in speeds))
    return min(speeds, key=lambda s: s.slower_than(floor))


def at_host_speed(runs: Sequence[Measurement]) -> list[Measurement]:
    """The runs made while the host ran at its speed: those whose reference workloads, timed
    between their measured steps, took at most honesty.HOST_DRIFT more CPU time, in either
    workload, than the fastest run's (:func:`fastest_host`). A run without them counts. q45 (2026-11-29): the first
    fit-pp-zb run's workloads took 1.7x and 1.9x their CPU time between its steps, its compute
    1.71x the second run's, while the timings before and after it were the host's usual; the same
    minute slowed fit-pp-interleaved's first run (1.35x, compute 1.43x). The timings before the
    first step do not count here: in q41 the one fit-pp-1f1b run of three whose compute was at the
    machine's speed timed its small ops 22% slow before its first step, and the two 1.28x slower
    ones at the usual."""
    return [m for m, x in zip(runs, _slower_than_fastest(runs), strict=True) if x <= HOST_DRIFT]


def _slower_than_fastest(runs: Sequence[Measurement]) -> list[float]:
    """How much slower each run's host ran between its steps than :func:`fastest_host`'s."""
    best = fastest_host(runs)
    return [speed_amid_steps(m).slower_than(best) for m in runs]


def others_cores(m: Measurement) -> float:
    return float((m.extras.get("host") or {}).get("others_cores") or 0.0)


def sized_steps(step_s: float, steps: int, measured_s: float = MEASURED_S, max_steps: int = MAX_STEPS) -> int:
    """Steps for a run to measure at least ``measured_s`` of ``step_s`` steps: ``steps`` at
    least, ``max_steps`` at most (never fewer than ``steps``)."""
    if step_s <= 0:
        return steps
    return max(steps, min(max_steps, math.ceil(measured_s / step_s)))


PlanRuns = tuple[str, Callable[[int], Measurement], Callable[[Measurement], object]]  # name, run(n steps), keep


class PlanFailed(RuntimeError):
    """Raised by a plan's run to drop that plan from the rounds while the others go on (a
    held-out plan the executor could not run); the message becomes the plan's note."""


def repeat_sized(name: str, run: Callable[[int], Measurement], steps: int, *,
                 keep: Callable[[Measurement], object] = lambda m: None, **repeat: Any) -> Repeated:
    """:func:`repeat_in_rounds` of one plan: ``run(n)`` (a run of ``n`` measured steps, not
    recorded) until its median is stable; ``keep`` records each run the series counts."""
    return repeat_in_rounds([(name, run, keep)], steps, **repeat)[0]


def repeat_in_rounds(plans: Sequence[PlanRuns], steps: int, *, measured_s: float = MEASURED_S,
                     max_steps: int = MAX_STEPS, clock: Callable[[], float] = time.monotonic,
                     **repeat: Any) -> list[Repeated]:
    """Each plan run until its median is stable (the module docstring's rule: at least
    ``min_runs`` runs, 3, the last of which moved it by at most ``tolerance``, 3%; or after
    ``max_runs`` runs, 8, or ``budget_s`` seconds of its runs, 600: ``repeat``), the plans taking
    turns: one run of every plan not done yet, then the next round. A slow phase of the machine
    that lasts minutes then moves one run of each plan, which the spread shows, not every run of
    one plan, which it does not (on the 2-core guest simdist was calibrated on, a fit plan's three
    back-to-back runs came out within 2% of each other and 24% slower than in the calibration
    before, 2026-11-29: benchmarks/README.md, run S). A plan's first run, of ``steps``, sizes its
    others (:func:`sized_steps`); it counts when it measured enough, else it is set aside (its
    median, of fewer steps, is noisier) and named in the notes. A run that raises
    :class:`PlanFailed` ends its plan's series ("failed", the reason in the notes, the runs so far
    kept); any other error ends them all."""
    series, sizes = [], []
    for name, run, keep in plans:
        s = _Series(name, **repeat)
        series.append(s)
        t0 = clock()
        first = s.attempt(run, steps)
        if first is None:
            sizes.append(steps)
            continue
        n = sized_steps(first.step_time_s, steps, measured_s, max_steps)
        if n == steps:
            keep(first)
            s.add(first, clock() - t0)
        else:
            s.notes = (f"{n} steps a run (a first run of {steps} took {first.step_time_s * 1e3:.1f} ms a step; "
                       "set aside)",)
        sizes.append(n)
    while not all(s.stopped for s in series):
        for s, (_, run, keep), n in zip(series, plans, sizes, strict=True):
            if s.stopped:
                continue
            t0 = clock()
            m = s.attempt(run, n)
            if m is None:
                continue
            keep(m)
            s.add(m, s.seconds + clock() - t0)
    return [s.result() for s in series]


class _Series:
    """One plan's runs as they come, and whether they are done (:func:`repeat_in_rounds`)."""

    def __init__(self, name: str, min_runs: int = 3, max_runs: int = 8, tolerance: float = 0.03,
                 budget_s: float = 600.0):
        self.name, self.min_runs, self.max_runs, self.tolerance, self.budget_s = (
            name, min_runs, max(1, max_runs), tolerance, budget_s)
        self.runs: list[Measurement] = []
        self.previous: float | None = None
        self.stopped = ""  # "stable" | "budget" | "max runs" | "failed" once done
        self.seconds = 0.0
        self.notes: tuple[str, ...] = ()

    def add(self, m: Measurement, seconds: float) -> None:
        """Count run ``m``; ``seconds``: the series' time so far, this run's included."""
        self.runs.append(m)
        self.seconds = seconds
        kept = at_host_speed(self.runs)  # a run made while the host ran slower is replaced by another
        current = statistics.median(r.step_time_s for r in kept)
        if len(kept) >= self.min_runs and self.previous is not None \
                and abs(current - self.previous) <= self.tolerance * current:
            self.stopped = "stable"
        elif seconds >= self.budget_s:
            self.stopped = "budget"
        elif len(self.runs) >= self.max_runs:
            self.stopped = "max runs"
        self.previous = current

    def attempt(self, run: Callable[[int], Measurement], n: int) -> Measurement | None:
        """``run(n)``, or None when it raised :class:`PlanFailed`: the series stops ("failed"),
        the reason in its notes."""
        try:
            return run(n)
        except PlanFailed as exc:
            self.stopped = "failed"
            self.notes = (*self.notes, str(exc))
            return None

    def result(self) -> Repeated:
        return Repeated(self.name, tuple(self.runs), self.stopped == "stable", self.stopped, self.seconds, self.notes)
