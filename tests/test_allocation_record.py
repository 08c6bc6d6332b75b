"""The recorded replay (simdist.analytic.allocation_record + allocator.replay) gives the peaks of
the call-by-call CachingAllocator, and a step repeated from its recording gives those of the
step worked out again."""

from __future__ import annotations

import random

import pytest
from conftest import REPO

from simdist.analytic.allocation_record import Trace
from simdist.analytic.allocation_trace import _Replay
from simdist.analytic.allocator import CachingAllocator
from simdist.spec.scenario import load_scenario

MiB, GiB = 2**20, 2**30


def _random_calls(seed: int, n: int = 3000) -> list[tuple]:
    """Mallocs and frees of small and large sizes on two streams, some keys allocated again
    while live (their first block then stays allocated, as the replay's leaked buffers do)."""
    rng = random.Random(seed)
    sizes = [300, 4096, 700 * 1024, 3 * MiB, 9 * MiB, 12 * MiB + 5, 64 * MiB, 300 * MiB]
    live: list[int] = []
    calls = []
    for i in range(n):
        if live and rng.random() < 0.45:
            calls.append(("free", live.pop(rng.randrange(len(live)))))
        else:
            key = rng.randrange(i + 1) if rng.random() < 0.02 and i else i + n
            if key not in live:
                live.append(key)
            calls.append(("malloc", key, rng.choice(sizes) * rng.choice([1, 1, 2, 0.5]),
                          rng.choice(["compute", "compute", "ag"])))
    return calls


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("limit", [float("inf"), 2 * GiB])
def test_the_recorded_replay_gives_the_allocators_peaks(seed, limit):
    calls = _random_calls(seed)
    a, t = CachingAllocator(limit=limit), Trace()
    for call in calls:
        for target in (a, t):
            getattr(target, call[0])(*call[1:])
    assert t.peaks(limit) == (a.peak_allocated, a.peak_reserved)
    assert a.peak_reserved > a.peak_allocated  # the trace leaves a gap to reproduce


def test_a_segment_repeats_only_when_what_it_depended_on_is_as_at_its_start():
    t = Trace()
    t.malloc("kept", GiB)
    start = t.begin()
    t.malloc("tmp", MiB)
    t.free("tmp")
    if not t.live("flag"):
        t.malloc("flag", 2 * MiB)
    t.free("kept")
    seg = t.end(start)
    assert dict(seg.depends) == {"flag": False, "kept": True}
    n = len(t.ops)
    assert not t.repeat(seg)  # "kept" is gone and "flag" is live now
    assert len(t.ops) == n  # nothing appended
    t.free("flag")
    t.malloc("kept", GiB)
    assert t.repeat(seg)
    assert t.ops[n + 2:] == t.ops[seg.start:seg.end]
    assert t.live_keys() == ["flag"]


@pytest.mark.parametrize("name", ["gpt3-175b-1024xa100", "llama3-70b-fsdp-256xh100", "tiny-2d-pp-fsdp",
                                  "megatron-1t-3072xa100", "llama3-70b-tp8-pp4-64xh100"])
def test_a_repeated_step_gives_what_working_it_out_again_gives(name, monkeypatch):
    sc = load_scenario(REPO / "scenarios" / f"{name}.yaml")
    stages = sorted({0, sc.plan.pp // 2, sc.plan.pp - 1})
    repeated = [_Replay(sc.model, sc.plan, s, float("inf")).run() for s in stages]
    monkeypatch.setattr(Trace, "repeat", lambda self, seg: False)
    again = [_Replay(sc.model, sc.plan, s, float("inf")).run() for s in stages]
    assert repeated == again


def test_the_replay_gives_the_garbage_collector_back_as_it_found_it():
    import gc

    from simdist.analytic.allocation_trace import allocator_gap

    sc = load_scenario(REPO / "scenarios" / "gpt3-175b-1024xa100.yaml")
    allocator_gap.cache_clear()
    assert gc.isenabled()
    allocator_gap(sc.model, sc.plan, sc.cluster, 0)
    assert gc.isenabled()
    gc.disable()
    try:
        allocator_gap.cache_clear()
        allocator_gap(sc.model, sc.plan, sc.cluster, 0)
        assert not gc.isenabled()
    finally:
        gc.enable()
