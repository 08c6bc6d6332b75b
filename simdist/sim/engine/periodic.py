"""The periodic extension: a long pipelined step simulated as a short one, then stretched.

A 1F1B or interleaved-1F1B step is a warm-up, a steady state that repeats the same actions
every ``q`` micro-batches (1 for 1F1B; ``pp`` for the interleaved schedule, whose chunk order
cycles every ``pp`` micro-batches), and a cool-down. The engine is deterministic, so once every
slice's clock and tally advance by the same amounts from one period to the next, the state is
periodic: a step with ``n`` more periods in its steady state is the same step with everything
from the cool-down on shifted by ``n`` periods, and every running sum of the tallies larger by
``n`` periods' increments.

So :func:`short_count` picks a short step (``m1`` micro-batches, a multiple of ``q``, whose
first stage, the one with the longest warm-up, has ``CHECKED + 1`` periods and ``SETTLE`` actions
of steady state), the engine simulates it while recording each slice's clock and tally at the
start of every action, and :func:`extend` looks, in every slice's steady state, for the latest
``CHECKED + 1`` periods (ending at most a cool-down's reach, :func:`tail`, before the steady
state ends: the first stage's cool-down reaches the others' last actions) in which every action
starts one constant increment ``D`` after the same action a period earlier, and every tally
grows by one constant increment, to ``RTOL`` of the step; ``D`` must be the same for every
slice. If so, the tallies become those of the ``m``-micro-batch step (exact in exact arithmetic;
in floating point it agrees with the whole simulation to ~1e-13: tests/test_periodic.py
compares every bundled scenario with and without it, tests/test_golden.py every validation row
with the whole simulation's recorded answer); if not, the caller simulates the whole
step (the short one was wasted).

Only where the state is the schedule and the transfers it starts: symmetric fidelity, no
stragglers, no spans kept (a trace draws every micro-batch), synchronous steps, no host or
parameter-server resource whose use the backend totals.
"""

from __future__ import annotations

from simdist.analytic.stage import StepDescription
from simdist.sim.engine.state import Run, Slice

SCHEDULES = ("1f1b", "interleaved-1f1b")
RTOL = 1e-12  # clock and tally increments equal to this fraction of the short step's length
CHECKED = 1  # periods compared with the one before them, in every slice's steady state
SETTLE = 4  # actions before them for the pipeline to settle


def period(d: StepDescription) -> int:
    """Micro-batches per period of the schedule's steady state."""
    plan = d.plan
    return plan.pp if plan.virtual_pipeline_stages > 1 else 1


def warmup(p: int, v: int, s: int, m: int) -> int:
    """Actions before stage ``s``'s steady state (the schedule's own count,
    :func:`simdist.sim.schedules.interleaved_1f1b`)."""
    return min((p - s - 1) * 2 + (v - 1) * p, m * v) if v > 1 else min(p - s - 1, m)


def short_count(d: StepDescription, fidelity: str, keep_spans: bool, stragglers: dict[int, float]) -> int | None:
    """Micro-batches of the short step to simulate, or None where the whole step is simulated."""
    plan = d.plan
    if (fidelity != "symmetric" or keep_spans or stragglers or plan.pp < 2 or plan.schedule not in SCHEDULES
            or plan.uses_parameter_servers or plan.offload.any):
        return None
    p, v, q = plan.pp, plan.virtual_pipeline_stages, period(d)
    # stage 0 has the longest warm-up: its steady state must hold CHECKED + 1 periods and SETTLE actions
    span = 2 * q * v
    m1 = q
    while 2 * (m1 * v - warmup(p, v, 0, m1)) < (CHECKED + 1) * span + SETTLE:
        m1 += q
    if m1 + 2 * q > plan.num_microbatches:  # not worth it
        return None
    return m1


def extend(run: Run, m: int) -> bool:
    """Turn the tallies of the short step simulated in ``run`` into the ``m``-micro-batch step's,
    when its steady state is periodic (True); False leaves them as they are."""
    plan, m1 = run.plan, run.microbatches
    p, v = plan.pp, plan.virtual_pipeline_stages
    q = p if v > 1 else 1
    span = 2 * q * v  # actions per period (a forward and a backward per micro-batch and chunk)
    shift: float | None = None
    steps: list[tuple[Slice, tuple[float, ...]]] = []
    scale = max(sl.tally.end for sl in run.slices)
    tol = RTOL * scale
    for sl in run.slices:
        rec = sl.record
        assert rec is not None
        first = warmup(p, v, sl.stage, m1)
        end = first + 2 * (m1 * v - first)  # index of the first cool-down action (or the flush)
        inc = _periodic_window(rec, first, end, span, tail(p, span), tol)
        if inc is None:
            return False
        if shift is None:
            shift = inc[0]
        elif abs(inc[0] - shift) > tol:
            return False
        steps.append((sl, inc))
    n = (m - m1) // q
    assert shift is not None and n * q == m - m1
    from simdist.sim.engine.step import TALLIED

    for sl, base in steps:
        t = sl.tally
        for name, inc in zip(TALLIED, base[1:], strict=True):
            setattr(t, name, getattr(t, name) + n * inc)
        t.flush_end += n * shift
        t.end += n * shift
        t.post = [(a + n * shift, b + n * shift, c) for a, b, c in t.post]
    run.extended = n * shift
    return True


def tail(p: int, span: int) -> int:
    """Actions at the end of a stage's steady state that the other stages' cool-down may reach
    (the first stage enters its cool-down first)."""
    return 2 * p + span


def _periodic_window(rec: list[tuple[float, ...]], first: int, end: int, span: int, late: int,
                     tol: float) -> tuple[float, ...] | None:
    """The clock and tally increments of one period, from the latest CHECKED + 1 periods of the
    steady state (``first`` to ``end``, at most ``late`` actions before its end) in which every
    action starts one constant increment after the same action a period earlier; None if none."""
    for stop in range(end, max(end - late, first) - 1, -1):
        lo = stop - (CHECKED + 1) * span
        if lo < first:
            return None
        base = [b - a for a, b in zip(rec[stop - span], rec[stop], strict=True)]
        if all(abs((b - a) - x) <= tol for j in range(lo, stop - span)
               for a, b, x in zip(rec[j], rec[j + span], base, strict=True)):
            return tuple(base)
    return None
