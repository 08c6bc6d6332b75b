"""DeepSpeed <= 0.4.0's ZeRO-3 fetch (zero3_fetch: module_sync, simdist.analytic.zero3_sync):
one submodule's gather in flight beside the current submodule's compute."""

from __future__ import annotations

import pytest
from test_engine import make

from simdist.analytic.data_parallel import dp_traffic
from simdist.analytic.zero3_sync import one_ahead_seconds, submodule_shares, synced_exposed
from simdist.predict import predict


def test_one_ahead_pairs_each_compute_with_the_next_gather() -> None:
    # gather 0 alone, then max(3, 4) + max(1, 4) + max(4, 3) + max(4, nothing)
    assert one_ahead_seconds([3.0, 1.0, 4.0, 4.0], [1.0, 4.0, 4.0, 3.0]) == pytest.approx(17.0)
    # a backward reduction shares the next segment with the gather after it, the last one waits
    assert one_ahead_seconds([2.0, 2.0], [1.0, 1.0], [2.5, 0.5]) == pytest.approx(1 + 2 + 2.5 + 0.5)


def test_unequal_submodules_expose_what_layer_totals_hide() -> None:
    """GPT layers (QKV 3h^2, out h^2, fc1 4h^2, fc2 4h^2) with compute equal to gathers in
    total: the small output projection cannot hide the large fc1 gather, so the pass is longer
    than max(compute, gathers); equal submodules expose only the first gather."""
    layers = 10
    gpt = (3 / 12, 1 / 12, 4 / 12, 4 / 12)
    exposed = synced_exposed(gpt, layers, float(layers), gpt)
    assert exposed > 2.0  # 3/12 of a layer per layer, plus the first gather
    assert exposed == pytest.approx(0.25 + layers * 0.25)  # first gather + (1/3 - 1/12) per layer
    even = (0.25,) * 4
    assert synced_exposed(even, layers, float(layers), even) == pytest.approx(0.25)
    # gather-bound: the gathers set the pace either way
    assert synced_exposed(gpt, layers, 1.0, tuple(4 * s for s in gpt)) == pytest.approx(4 * layers - 1.0, rel=0.05)


def test_submodule_shares_follow_the_weights() -> None:
    sc = make(model="gpt3-175b", nodes=2, zero_stage=3, zero3_fetch="module_sync")
    shares = dict(submodule_shares(sc.model))
    assert list(shares) == ["qkv", "attention out", "mlp fc1", "mlp fc2"]
    assert shares["qkv"] == pytest.approx(3 / 12) and shares["mlp fc1"] == pytest.approx(4 / 12)
    llama = make(model="llama2-7b", nodes=2, zero_stage=3, zero3_fetch="module_sync")
    assert len(submodule_shares(llama.model)) == 5  # gate, up, down


def test_synced_fetch_moves_the_same_bytes() -> None:
    kw = dict(model="gpt3-13b", nodes=2, zero_stage=3, recompute="full", global_batch_size=16)
    a, b = make(zero3_fetch="module", **kw), make(zero3_fetch="module_sync", **kw)
    ta, tb = dp_traffic(a.model, a.plan, 0), dp_traffic(b.model, b.plan, 0)
    for part in ("fwd_gathers", "bwd_gathers", "microbatch_grad_sync"):
        total = [sum(c.total_bytes for c in getattr(t, part)) for t in (ta, tb)]
        assert total[1] == pytest.approx(total[0]), part


def test_synced_fetch_is_slower_where_compute_meets_gathers_in_both_engines() -> None:
    """Four micro-batch-4 ranks of GPT-3 13B on two nodes under DeepSpeed's fetch ceiling: the
    2021 fetch (module_sync) runs longer than the fully prefetched one (module), never shorter,
    and the two engines agree within 5%."""
    kw = dict(model="gpt3-13b", nodes=2, zero_stage=3, recompute="full", micro_batch_size=4, global_batch_size=64)
    steps = {}
    for fetch in ("module", "module_sync"):
        sc = make(zero3_fetch=fetch, **kw)
        steps[fetch] = {e: predict(sc, engine=e, keep_spans=False).step_time_s for e in ("analytic", "des")}
    for e in ("analytic", "des"):
        assert steps["module_sync"][e] > 1.02 * steps["module"][e], (e, steps)
    assert steps["module_sync"]["des"] == pytest.approx(steps["module_sync"]["analytic"], rel=0.05)
