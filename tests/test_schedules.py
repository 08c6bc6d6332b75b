"""Pipeline schedules: completeness, per-stage order, deadlock freedom, bubble and memory."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simdist.sim.schedules import (
    Action,
    DeadlockError,
    dependencies,
    gpipe,
    in_flight_peak,
    interleaved_1f1b,
    one_f_one_b,
    schedule,
    simulate_unit_times,
    virtual_stage,
    zero_bubble,
)

F, B, W = "F", "B", "W"


def check_complete(sched: list[list[Action]], p: int, m: int, v: int, split: bool) -> None:
    """Every stage runs each (kind, microbatch, chunk) exactly once, and nothing else."""
    assert len(sched) == p
    kinds = (F, B, W) if split else (F, B)
    want = Counter(Action(k, i, c) for k in kinds for i in range(m) for c in range(v))
    for s, acts in enumerate(sched):
        assert Counter(acts) == want, f"stage {s}"


def check_stage_order(sched: list[list[Action]]) -> None:
    """On each stage: B after its own F, W after its own B."""
    for s, acts in enumerate(sched):
        index = {a: n for n, a in enumerate(acts)}
        for a, n in index.items():
            before = {B: F, W: B}.get(a.kind)
            if before is not None:
                assert index[Action(before, a.microbatch, a.chunk)] < n, f"stage {s}: {a}"


def bubble(sched: list[list[Action]], p: int, v: int, **times: float) -> tuple[float, float]:
    """(idle time, idle fraction) of the busiest stage."""
    makespan, busy = simulate_unit_times(sched, p, v, **times)
    return makespan - max(busy), 1 - max(busy) / makespan


def short(acts: list[Action]) -> str:
    return " ".join(f"{a.kind}{a.microbatch}" + (f".{a.chunk}" if a.chunk else "") for a in acts)


CASES = [(p, m) for p in (1, 2, 4, 8) for m in (p, 4 * p)] + [(3, 5), (4, 2), (8, 1)]


@pytest.mark.parametrize(("p", "m"), CASES)
def test_gpipe_and_1f1b_bubble_and_memory(p: int, m: int) -> None:
    for build in (gpipe, one_f_one_b):
        sched = build(p, m)
        check_complete(sched, p, m, 1, split=False)
        check_stage_order(sched)
        assert bubble(sched, p, 1, t_f=1, t_b=2)[1] == pytest.approx(
            (p - 1) / (m + p - 1), abs=1e-9
        )
    assert [in_flight_peak(a) for a in gpipe(p, m)] == [m] * p
    assert [in_flight_peak(a) for a in one_f_one_b(p, m)] == [min(p - s, m) for s in range(p)]


@pytest.mark.parametrize(("p", "m"), [(p, m) for p in (1, 2, 4, 8) for m in (p, 4 * p)])
@pytest.mark.parametrize("v", [2, 3])
def test_interleaved_bubble(p: int, m: int, v: int) -> None:
    sched = interleaved_1f1b(p, m, v)
    check_complete(sched, p, m, v, split=False)
    check_stage_order(sched)
    assert bubble(sched, p, v, t_f=1, t_b=2)[1] == pytest.approx(
        (p - 1) / (v * m + p - 1), abs=1e-9
    )
    # better than plain 1F1B whenever there is a bubble at all
    if p > 1:
        assert bubble(sched, p, v)[1] < bubble(one_f_one_b(p, m), p, 1)[1]


def test_interleaved_order_matches_megatron() -> None:
    # p=2, m=4, v=2, stage 0: warm-up (2-0-1)*2 + (2-1)*2 = 4 forwards; groups of p microbatches
    # per chunk; backwards walk the chunks in reverse.
    assert short(interleaved_1f1b(2, 4, 2)[0]) == (
        "F0 F1 F0.1 F1.1 F2 B0.1 F3 B1.1 F2.1 B0 F3.1 B1 B2.1 B3.1 B2 B3"
    )
    # last stage: warm-up (v-1)*p = 2
    assert short(interleaved_1f1b(2, 4, 2)[1]) == (
        "F0 F1 F0.1 B0.1 F1.1 B1.1 F2 B0 F3 B1 F2.1 B2.1 F3.1 B3.1 B2 B3"
    )


def test_interleaved_rejects_uneven_microbatches() -> None:
    with pytest.raises(ValueError, match="multiple of"):
        interleaved_1f1b(4, 6, 2)
    with pytest.raises(ValueError, match="multiple of"):
        schedule("interleaved-1f1b", 4, 2, v=3)
    assert interleaved_1f1b(4, 6, 1) == one_f_one_b(4, 6)  # v=1 is plain 1F1B, any m


def test_1f1b_order() -> None:
    assert short(one_f_one_b(4, 6)[1]) == "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5"
    assert short(one_f_one_b(4, 6)[3]) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5"


def test_zero_bubble_order() -> None:
    # last stage defers W by p-1 = 3 microbatches; first stage runs W right after B
    assert short(zero_bubble(4, 6)[3]) == "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 W3 W4 W5"
    assert short(zero_bubble(4, 6)[0]) == "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 B3 W3 B4 W4 B5 W5"


@pytest.mark.parametrize(("p", "m"), [(p, m) for p in (1, 2, 4, 8) for m in (p, 4 * p)] + [(3, 5)])
def test_zero_bubble_h1(p: int, m: int) -> None:
    sched = zero_bubble(p, m)
    check_complete(sched, p, m, 1, split=True)
    check_stage_order(sched)
    zb_idle, zb_frac = bubble(sched, p, 1, t_f=1, t_b=1, t_w=1)
    ref_idle, ref_frac = bubble(one_f_one_b(p, m), p, 1, t_f=1, t_b=2)  # B+W as one pass
    # ZB README: ZB-H1's bubble (idle time) is 1F1B's / 3 when m >= p; that is (p-1)(F+B-W).
    # (The idle *fraction* shrinks less, since the makespan shrinks too.)
    assert zb_idle <= ref_idle / 3 + 1e-9
    assert zb_idle == pytest.approx(p - 1, abs=1e-9)
    assert zb_frac == pytest.approx((p - 1) / (3 * m + p - 1), abs=1e-9)
    assert zb_frac < ref_frac or p == 1
    # Memory: full activations (F done, B not) per stage equal 1F1B's p - s ...
    assert [in_flight_peak(a, freed_by="B") for a in sched] == [p - s for s in range(p)]
    # ... and counting the weight-grad stash (W frees) the peak is p everywhere, i.e. the
    # paper's (p-i+1)M_B + (i-1)M_W: never above 1F1B's peak, which is on the first stage.
    assert [in_flight_peak(a) for a in sched] == [p] * p
    assert max(in_flight_peak(a) for a in sched) == max(
        in_flight_peak(a) for a in one_f_one_b(p, m)
    )


def test_zero_bubble_few_microbatches_still_beats_1f1b() -> None:
    for p, m in [(4, 1), (4, 2), (8, 3)]:
        zb = bubble(zero_bubble(p, m), p, 1, t_f=1, t_b=1, t_w=1)[0]
        assert zb < bubble(one_f_one_b(p, m), p, 1, t_f=1, t_b=2)[0]


def test_schedule_dispatch() -> None:
    assert schedule("gpipe", 2, 3) == gpipe(2, 3)
    assert schedule("1f1b", 2, 3) == one_f_one_b(2, 3)
    assert schedule("zero-bubble", 2, 3) == zero_bubble(2, 3)
    assert schedule("interleaved-1f1b", 2, 4, v=2) == interleaved_1f1b(2, 4, 2)
    with pytest.raises(ValueError, match="unknown pipeline schedule"):
        schedule("pipedream", 2, 3)
    with pytest.raises(ValueError, match="v=2"):
        schedule("1f1b", 2, 4, v=2)
    with pytest.raises(ValueError, match="m must be"):
        schedule("gpipe", 2, 0)


def test_virtual_stage_and_dependencies() -> None:
    p, v = 4, 2
    assert virtual_stage(1, 1, p) == 5
    # forward: previous virtual stage; chunk 1 of stage 0 follows chunk 0 of the last stage
    assert dependencies(Action(F, 3, 0), 0, p, v, False) == []
    assert dependencies(Action(F, 3, 1), 0, p, v, False) == [(3, Action(F, 3, 0))]
    assert dependencies(Action(F, 3, 1), 2, p, v, False) == [(1, Action(F, 3, 1))]
    # backward: next virtual stage; the very last one turns around on its own forward
    assert dependencies(Action(B, 3, 1), 3, p, v, False) == [(3, Action(F, 3, 1))]
    assert dependencies(Action(B, 3, 0), 3, p, v, False) == [(0, Action(B, 3, 1))]
    assert dependencies(Action(B, 3, 1), 0, p, v, True) == [(1, Action(B, 3, 1))]
    assert dependencies(Action(W, 3, 1), 2, p, v, True) == [(2, Action(B, 3, 1))]
    with pytest.raises(ValueError):
        dependencies(Action(W, 3, 1), 2, p, v, False)


def test_deadlock_is_detected() -> None:
    # stage 1 wants microbatch 1 first, but stage 0 only sends it after B0, which needs stage 1
    bad = [
        [Action(F, 0), Action(B, 0), Action(F, 1), Action(B, 1)],
        [Action(F, 1), Action(B, 1), Action(F, 0), Action(B, 0)],
    ]
    with pytest.raises(DeadlockError):
        simulate_unit_times(bad, 2, 1)
    # a backward placed before its own forward on the last stage can never start either
    with pytest.raises(DeadlockError):
        simulate_unit_times([[Action(B, 0), Action(F, 0)]], 1, 1)


def test_unit_times_of_a_single_stage() -> None:
    makespan, busy = simulate_unit_times(zero_bubble(1, 3), 1, 1, t_f=1, t_b=1.5, t_w=0.5)
    assert makespan == pytest.approx(9.0)
    assert busy == [pytest.approx(9.0)]


@st.composite
def configs(draw: st.DrawFn) -> tuple[str, int, int, int]:
    name = draw(st.sampled_from(["gpipe", "1f1b", "interleaved-1f1b", "zero-bubble"]))
    p = draw(st.integers(1, 6))
    if name == "interleaved-1f1b":
        v = draw(st.integers(1, 4))
        m = draw(st.integers(1, 10)) if v == 1 else p * draw(st.integers(1, 3))
    else:
        v, m = 1, draw(st.integers(1, 10))
    return name, p, m, v


@settings(max_examples=200, deadline=None)
@given(configs(), st.sampled_from([(1.0, 2.0, 0.0), (1.0, 1.0, 1.0), (0.5, 3.0, 0.25)]))
def test_property_complete_and_deadlock_free(
    cfg: tuple[str, int, int, int], times: tuple[float, float, float]
) -> None:
    name, p, m, v = cfg
    sched = schedule(name, p, m, v)
    split = name == "zero-bubble"
    check_complete(sched, p, m, v, split)
    check_stage_order(sched)
    t_f, t_b, t_w = times
    makespan, busy = simulate_unit_times(sched, p, v, t_f=t_f, t_b=t_b, t_w=t_w)
    work = m * (t_f + t_b + (t_w if split else 0.0))
    assert busy == [pytest.approx(work)] * p
    # never faster than one microbatch's critical path, nor than one stage's work
    assert makespan >= max(work, p * t_f + p * t_b + (t_w if split else 0.0)) - 1e-9
    if name in ("1f1b", "zero-bubble"):
        assert [in_flight_peak(a, freed_by="B") for a in sched] == [min(p - s, m) for s in range(p)]


@pytest.mark.parametrize(("name", "p", "m", "v"), [("gpipe", 4, 6, 1), ("1f1b", 5, 7, 1), ("1f1b", 1, 3, 1),
                                                   ("zero-bubble", 4, 8, 1), ("interleaved-1f1b", 4, 8, 3),
                                                   ("interleaved-1f1b", 2, 4, 2), ("dualpipe", 4, 8, 1),
                                                   ("dualpipev", 3, 6, 1)])
def test_stage_actions_are_the_schedule_and_its_cross_stage_dependencies(name: str, p: int, m: int, v: int) -> None:
    """The engine's per-stage actions (simdist.sim.actions): the schedule's, each with its task
    index, a code distinct among the step's actions (decoded back to the stage and action) and
    the code of its one dependency on another stage (-1: none)."""
    from simdist.sim import dualpipe
    from simdist.sim.actions import chunks_per_stage, code, decode, stage_actions, task_index

    dual, split = name.startswith("dualpipe"), name == "zero-bubble"
    sched = dualpipe.schedule(name, p, m) if dual else schedule(name, p, m, v)
    c = chunks_per_stage(v, dual)
    kept = stage_actions.__wrapped__(name, p, m, v, split, dual)  # (worked out afresh)
    seen = set()
    for stage, actions in enumerate(sched):
        got = kept[stage]
        deps = [dualpipe.dependencies(name, a, stage, p, m, split) if dual else dependencies(a, stage, p, v, split)
                for a in actions]
        assert got.actions == tuple(actions)
        assert got.tasks == tuple(task_index(a, m) for a in actions)
        assert all(0 <= i < 6 * c for i in got.tasks)
        assert got.codes == tuple(code(stage, a, p, c) for a in actions)
        assert [decode(x, p, c) for x in got.codes] == [(stage, a) for a in actions]
        others = [[code(s, d, p, c) for s, d in ds if s != stage] for ds in deps]
        assert got.inputs == tuple(x[0] if x else -1 for x in others) and all(len(x) <= 1 for x in others)
        seen.update(got.codes)
    assert len(seen) == sum(len(a) for a in sched)


@pytest.mark.parametrize("name,p,m,v,split", [("interleaved-1f1b", 4, 8, 2, False), ("zero-bubble", 3, 6, 1, True),
                                             ("1f1b", 2, 5, 1, False)])
def test_lowering_keeps_each_schedule_shape_once_and_unchanged(name: str, p: int, m: int, v: int, split: bool) -> None:
    """The lowering keeps the actions, their task indices, codes and inputs per schedule shape
    (simdist.sim.actions.stage_actions): the same tuples as worked out afresh, shared by the next
    lowering of that shape."""
    from simdist.sim.actions import stage_actions

    stage_actions.cache_clear()
    kept = stage_actions(name, p, m, v, split, False)
    assert kept == stage_actions.__wrapped__(name, p, m, v, split, False) and len(kept) == p
    assert stage_actions(name, p, m, v, split, False) is kept
    assert stage_actions(name, p, 2 * m, v, split, False) != kept  # another shape, its own
