"""The periodic extension: a long pipelined step simulated as a short one, then stretched.

A 1F1B, interleaved-1F1B or zero-bubble (ZB-H1) step is a warm-up, a steady state that repeats
the same actions every ``q`` micro-batches (1 for 1F1B and zero-bubble; ``pp`` for the
interleaved schedule, whose chunk order cycles every ``pp`` micro-batches), and a cool-down. A
period is :func:`span` actions on every stage: a forward and a backward per micro-batch and
chunk, and under zero-bubble a weight-grad pass too (stage ``s``'s steady state in
:func:`simdist.sim.schedules.zero_bubble` starts with ``s`` F, B pairs whose W is deferred: its
periodic part, :func:`steady`, is the F, B, W triples after them). GPipe has no such steady
state (all forwards, then all backwards: two phases to stretch, not one), nor have the DualPipe
schedules. The engine is deterministic, so once every slice's clock and tally advance by the
same amounts from one period to the next, the state is periodic: a step with ``n`` more periods
in its steady state is the same step with everything from the cool-down on shifted by ``n``
periods, and every running sum of the tallies larger by ``n`` periods' increments.

So :func:`short_count` picks a short step (``m1`` micro-batches, a multiple of ``q``, in which
every stage has ``CHECKED + 1`` periods and ``SETTLE`` actions of steady state), the engine
simulates it while recording each slice's clock and tally at the start of every action, and
:func:`extend` looks, in every slice's steady state, for the latest ``CHECKED + 1`` periods
(ending at most a cool-down's reach, :func:`tail`, before the steady state ends: the first
stage's cool-down reaches the others' last actions) in which every action starts one constant
increment ``D`` after the same action a period earlier, and every tally grows by one constant
increment, to ``RTOL`` of the step; ``D`` must be the same for every slice. If so, the tallies
become those of the ``m``-micro-batch step (exact in exact arithmetic; in floating point it
agrees with the whole simulation to ~1e-13: tests/test_periodic.py compares every bundled
scenario and zero-bubble plans with and without it, tests/test_golden.py every validation row
with the whole simulation's recorded answer); if not, the caller simulates the whole step (the
short one was wasted).

Under zero-bubble the stages faster than the slowest one run at their own pace for a while (the
deferred W passes leave them slack), so the short step may end before every stage keeps the same
pace; :func:`longer` then sizes a longer short step from how far the slowest stage's pace has
spread, still checked by :func:`extend`, and all the short steps together stay shorter than the
whole step.

Only where the state is the schedule and the transfers it starts: symmetric fidelity, no
stragglers, no spans kept (a trace draws every micro-batch), synchronous steps, no host or
parameter-server resource whose use the backend totals.
"""

from __future__ import annotations

import math

from simdist.analytic.stage import StepDescription
from simdist.sim.engine.state import Run, Slice

SCHEDULES = ("1f1b", "interleaved-1f1b", "zero-bubble")
RTOL = 1e-12  # clock and tally increments equal to this fraction of the short step's length
CHECKED = 1  # periods compared with the one before them, in every slice's steady state
SETTLE = 4  # actions before them for the pipeline to settle
LEAD = 4  # zero-bubble: a first short step 1/LEAD pipeline depth longer, to measure the pace's front
GROW = 1.25  # zero-bubble: margin on the extrapolated steady state of the next short step


def period(d: StepDescription) -> int:
    """Micro-batches per period of the schedule's steady state."""
    plan = d.plan
    return plan.pp if plan.virtual_pipeline_stages > 1 else 1


def span(schedule: str, p: int, v: int) -> int:
    """Actions per period on every stage: F and B per micro-batch and chunk (and W under
    zero-bubble), for the period's micro-batches (``p`` interleaved, else 1)."""
    if schedule == "zero-bubble":
        return 3
    return 2 * p * v if v > 1 else 2


def steady(schedule: str, p: int, v: int, s: int, m: int) -> tuple[int, int]:
    """Indices of stage ``s``'s first periodic steady-state action and of the first action after
    its steady state (the cool-down's first, or the flush), in an ``m``-micro-batch step: the
    schedule's own counts (:mod:`simdist.sim.schedules`)."""
    if schedule == "zero-bubble":  # warm-up F as 1F1B, then s F, B pairs, then F, B, W triples
        w = min(p - s - 1, m)
        first = w + 2 * min(s, m - w)
        return first, first + 3 * max(m - w - s, 0)
    w = min((p - s - 1) * 2 + (v - 1) * p, m * v) if v > 1 else min(p - s - 1, m)
    return w, w + 2 * (m * v - w)


def short_count(d: StepDescription, fidelity: str, keep_spans: bool, stragglers: dict[int, float]) -> int | None:
    """Micro-batches of the short step to simulate, or None where the whole step is simulated."""
    plan = d.plan
    if (fidelity != "symmetric" or keep_spans or stragglers or plan.pp < 2 or plan.schedule not in SCHEDULES
            or plan.uses_parameter_servers or plan.offload.any):
        return None
    p, v, q, name = plan.pp, plan.virtual_pipeline_stages, period(d), plan.schedule
    need = (CHECKED + 1) * span(name, p, v) + SETTLE  # every stage's steady state holds this many actions
    m1 = q
    while any(b - a < need for a, b in (steady(name, p, v, s, m1) for s in (0, p - 1))):
        m1 += q  # (stage 0's steady state is the shortest under 1F1B, every stage's alike under zero-bubble)
    if name == "zero-bubble":
        m1 += p // LEAD  # (:func:`longer`)
    if m1 + 2 * q > plan.num_microbatches:  # not worth it
        return None
    return m1


def extend(run: Run, m: int) -> bool:
    """Turn the tallies of the short step simulated in ``run`` into the ``m``-micro-batch step's,
    when its steady state is periodic (True); False leaves them as they are."""
    plan, m1 = run.plan, run.microbatches
    p, v, name = plan.pp, plan.virtual_pipeline_stages, plan.schedule
    q = p if v > 1 else 1
    per = span(name, p, v)
    shift: float | None = None
    steps: list[tuple[Slice, tuple[float, ...]]] = []
    scale = max(sl.tally.end for sl in run.slices)
    tol = RTOL * scale
    for sl in run.slices:
        rec = sl.record
        assert rec is not None
        first, end = steady(name, p, v, sl.stage, m1)
        inc = _periodic_window(rec, first, end, per, tail(p, per, name), tol)
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
        for field, inc in zip(TALLIED, base[1:], strict=True):
            setattr(t, field, getattr(t, field) + n * inc)
        t.flush_end += n * shift
        t.end += n * shift
        t.post = [(a + n * shift, b + n * shift, c) for a, b, c in t.post]
    run.extended = n * shift
    return True


def longer(run: Run, m: int, spent: int) -> int | None:
    """Micro-batches of a longer short step, after the zero-bubble one in ``run`` did not reach a
    periodic state; None where the whole step is cheaper (``spent``: micro-batches simulated so far).

    Under zero-bubble a stage that is faster than the slowest (the last, with the LM head and the
    loss) runs at its own pace on the slack its deferred W passes leave, until its lead is spent;
    then it keeps the slowest stage's pace. That pace spreads from the slowest stage one stage at
    a time, about as many stages per micro-batch all along: the next short step's steady state is
    this one's, times the stages over those already at the slowest pace (at the end of their
    steady state), with a GROW margin (twice this one's length, while that is cheap, where only
    the slowest stage kept its pace so far). Only the length of the next step is guessed: its
    answer is still checked by :func:`extend`; all the short steps together stay shorter than
    the whole step."""
    plan, m1 = run.plan, run.microbatches
    p, name = plan.pp, plan.schedule
    if name != "zero-bubble":
        return None
    per = span(name, p, 1)
    tol = RTOL * max(sl.tally.end for sl in run.slices)
    pace: dict[int, float | None] = {}
    for sl in run.slices:
        assert sl.record is not None
        first, end = steady(name, p, 1, sl.stage, m1)
        inc = _periodic_window(sl.record, first, end, per, tail(p, per, name), tol)
        pace[sl.stage] = None if inc is None else inc[0]
    known = [x for x in pace.values() if x is not None]
    slowest = max(known, default=0.0)
    done = sum(1 for x in pace.values() if x is not None and abs(x - slowest) <= tol)
    periods = m1 - p + 1  # zero-bubble: every stage's steady state holds m1 - p + 1 F, B, W triples
    if done >= len(pace) or periods < 1:
        return None
    if done < 2:  # too early to tell the pace's front: twice as long, while that is cheap
        nxt = 2 * m1 if spent + 2 * m1 + 2 <= m // 2 else None
        return nxt
    nxt = p - 1 + math.ceil(GROW * periods * len(pace) / done)
    if nxt <= m1 or spent + nxt + 2 > m:
        return None
    return nxt


def tail(p: int, span: int, schedule: str = "1f1b") -> int:
    """Actions at the end of a stage's steady state that the other stages' cool-down may reach
    (the first stage enters its cool-down first): two actions a stage (three under zero-bubble,
    whose W passes sit between the B passes the cool-down hurries) and a period."""
    return (3 if schedule == "zero-bubble" else 2) * p + span


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
        if _repeats(rec, lo, stop - span, span, base, tol):
            return tuple(base)
    return None


def _repeats(rec: list[tuple[float, ...]], lo: int, hi: int, span: int, base: list[float], tol: float) -> bool:
    """Whether every record from ``lo`` to ``hi`` (excluded) is the one ``span`` before it plus
    ``base``, each entry to ``tol`` (every record of every slice is compared: the ten entries of a
    record, the clock and the tally's sums, are unpacked by name, twice as fast as a loop over them)."""
    x0, x1, x2, x3, x4, x5, x6, x7, x8, x9 = base
    for (a0, a1, a2, a3, a4, a5, a6, a7, a8, a9), (b0, b1, b2, b3, b4, b5, b6, b7, b8, b9) in zip(
            rec[lo:hi], rec[lo + span:hi + span], strict=True):
        if (abs(b0 - a0 - x0) > tol or abs(b1 - a1 - x1) > tol or abs(b2 - a2 - x2) > tol
                or abs(b3 - a3 - x3) > tol or abs(b4 - a4 - x4) > tol or abs(b5 - a5 - x5) > tol
                or abs(b6 - a6 - x6) > tol or abs(b7 - a7 - x7) > tol or abs(b8 - a8 - x8) > tol
                or abs(b9 - a9 - x9) > tol):
            return False
    return True
