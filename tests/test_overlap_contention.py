"""Compute slowed by a collective running beside it on the same GPU (the data-parallel sync, TP/CP
collectives hidden behind a kernel)
(simdist.analytic.overlap.contended_buckets; Lee et al. 2025, arXiv:2507.03114: 18.9% average
compute slowdown under overlap), the same seconds in both engines."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from simdist.analytic import overlap, passes
from simdist.analytic.collectives import CommContext, Network
from simdist.analytic.cost import CostModel
from simdist.analytic.data_parallel import contention_stretch
from simdist.analytic.passes import OpTimer
from simdist.analytic.stage import stage_sync
from simdist.predict import predict
from simdist.spec.profile import CalibrationProfile
from simdist.spec.scenario import scenario_from_dict


def test_no_slowdown_is_the_plain_bucket_overlap() -> None:
    for t_b, n, t in ((0.01, 8, 1.0), (0.5, 8, 1.0), (0.2, 1, 0.3)):
        assert overlap.contended_buckets(t_b, n, t, slowdown=0.0) == (0.0, overlap.bucketed_exposed(t_b, n, t))


def test_hidden_sync_stretches_the_backward_by_the_slowdown_of_its_window() -> None:
    # 8 buckets of 10 ms behind a 1 s backward: all but the last hide (70 ms beside compute)
    stretch, exposed = overlap.contended_buckets(0.01, 8, 1.0, slowdown=0.2)
    assert stretch == pytest.approx(0.2 * 0.07)
    assert exposed == pytest.approx(0.01)
    # a sync longer than the backward: it runs beside all of the backward after the first
    # bucket is ready (7/8 of it), and the longer backward lets more of it hide, so the step
    # grows by less than the stretch
    stretch, exposed = overlap.contended_buckets(0.5, 8, 1.0, slowdown=0.2)
    plain = overlap.bucketed_exposed(0.5, 8, 1.0)
    assert stretch == pytest.approx(0.2 * 7 / 8)
    assert exposed == pytest.approx(plain - stretch * 7 / 8)
    assert plain < stretch + exposed < plain + stretch


def test_gathers_behind_the_forward_stretch_it_too() -> None:
    # 4 gathers of 10 ms ahead of a 1 s forward: the first waits, 30 ms run beside the forward
    stretch, exposed = overlap.contended_prefetch(0.04, 4, 1.0, slowdown=0.2)
    assert stretch == pytest.approx(0.2 * 0.03)
    assert exposed == pytest.approx(0.01)
    assert overlap.contended_prefetch(0.04, 4, 1.0, slowdown=0.0) == (0.0, overlap.prefetch_exposed(0.04, 4, 1.0))
    # gathers longer than the forward: all of the forward runs beside them, and the longer
    # forward hides as much more
    stretch, exposed = overlap.contended_prefetch(4.0, 4, 1.0, slowdown=0.2)
    assert stretch == pytest.approx(0.2)
    assert exposed == pytest.approx(4.0 - 1.2)


def _ddp(pp: int, overlap_grad_reduce: bool = True, overlap_param_gather: bool = False) -> object:
    return scenario_from_dict({
        "name": "contention", "model": {"preset": "gpt3-1.3b", "num_layers": 8},
        "cluster": {"preset": "dgx-h100", "num_nodes": 4, "gpus_per_node": 8},
        "plan": {"tp": 1, "pp": pp, "global_batch_size": 64, "micro_batch_size": 1, "framework": "megatron",
                 "overlap_grad_reduce": overlap_grad_reduce, "overlap_param_gather": overlap_param_gather,
                 "zero_stage": 1},
    })


@pytest.mark.parametrize(("pp", "gather"), [(1, False), (4, False), (1, True)])
def test_both_engines_slow_the_compute_alike(pp: int, gather: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    sc = _ddp(pp, overlap_param_gather=gather)
    new = [predict(sc, engine=e, keep_spans=False).step_time_s for e in ("analytic", "des")]
    monkeypatch.setattr(overlap, "OVERLAP_COMPUTE_SLOWDOWN", 0.0)
    old = [predict(sc, engine=e, keep_spans=False).step_time_s for e in ("analytic", "des")]
    assert new[0] > old[0] and new[1] > old[1]
    assert new[0] - old[0] == pytest.approx(new[1] - old[1], rel=0.1)
    assert new[0] == pytest.approx(new[1], rel=0.02)


def test_without_overlap_nothing_is_slowed(monkeypatch: pytest.MonkeyPatch) -> None:
    sc = _ddp(1, overlap_grad_reduce=False)
    before = [predict(sc, engine=e, keep_spans=False).step_time_s for e in ("analytic", "des")]
    monkeypatch.setattr(overlap, "OVERLAP_COMPUTE_SLOWDOWN", 0.0)
    after = [predict(sc, engine=e, keep_spans=False).step_time_s for e in ("analytic", "des")]
    assert after == pytest.approx(before, rel=1e-12)


def _increments(sc: object, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    new = [predict(sc, engine=e, keep_spans=False).step_time_s for e in ("analytic", "des")]
    with monkeypatch.context() as mp:
        mp.setattr(overlap, "OVERLAP_COMPUTE_SLOWDOWN", 0.0)
        old = [predict(sc, engine=e, keep_spans=False).step_time_s for e in ("analytic", "des")]
    return [a - b for a, b in zip(new, old, strict=True)]


def test_the_post_step_gathers_slow_the_next_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    # the same sync, plus the all-gathers behind the next step's first forward: more slowdown
    behind = _increments(_ddp(1, overlap_param_gather=True), monkeypatch)
    after = _increments(_ddp(1), monkeypatch)
    assert behind[0] > after[0] and behind[1] > after[1]


def test_a_gemm_beside_a_hidden_tp_collective_runs_slower(monkeypatch: pytest.MonkeyPatch) -> None:
    sc = scenario_from_dict({
        "name": "tp overlap", "model": {"preset": "gpt3-1.3b", "num_layers": 4},
        "cluster": {"preset": "dgx-h100", "num_nodes": 1, "gpus_per_node": 8},
        "plan": {"tp": 8, "pp": 1, "global_batch_size": 8, "micro_batch_size": 1, "sequence_parallel": True,
                 "tp_comm_overlap": True},
    })
    new = [predict(sc, engine=e, keep_spans=False).breakdown_s for e in ("analytic", "des")]
    monkeypatch.setattr(overlap, "OVERLAP_COMPUTE_SLOWDOWN", 0.0)
    old = [predict(sc, engine=e, keep_spans=False).breakdown_s for e in ("analytic", "des")]
    for n, o in zip(new, old, strict=True):
        assert n["compute"] > o["compute"]  # the hidden collectives' GEMMs take longer
        assert n["tp_comm"] == pytest.approx(o["tp_comm"])  # and what they expose is the same
    assert new[0]["compute"] == pytest.approx(new[1]["compute"], rel=1e-9)


def test_userbuffers_slow_the_gemm_by_their_own_sms_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under tp_comm_overlap Transformer Engine's userbuffers kernels hold 1 (all-gather ring
    exchange), 24 (reduce-scatter pipeline) or 2 (bulk) of H100's 132 SMs: less than NCCL's 18.9%."""
    sc = scenario_from_dict({
        "name": "tp overlap", "model": {"preset": "gpt3-1.3b", "num_layers": 4},
        "cluster": {"preset": "dgx-h100", "num_nodes": 1, "gpus_per_node": 8},
        "plan": {"tp": 8, "pp": 1, "global_batch_size": 8, "micro_batch_size": 1, "sequence_parallel": True,
                 "tp_comm_overlap": True},
    })
    timer = OpTimer(sc, CostModel(sc.cluster.gpu, "bf16"), None)  # type: ignore[arg-type]
    assert timer._slowdown("allgather") == pytest.approx(1 / 132)
    assert timer._slowdown("reducescatter") == pytest.approx(24 / 132)
    assert timer._slowdown(None) == overlap.OVERLAP_COMPUTE_SLOWDOWN  # NCCL's share elsewhere

    def compute() -> float:
        return predict(sc, engine="analytic", keep_spans=False).breakdown_s["compute"]

    userbuffers = compute()
    monkeypatch.setattr(passes, "USERBUFFERS_SMS", {k: 0.189 * 132 for k in passes.USERBUFFERS_SMS})
    nccl_share = compute()
    monkeypatch.setattr(overlap, "OVERLAP_COMPUTE_SLOWDOWN", 0.0)
    alone = compute()
    assert alone < userbuffers < nccl_share


def test_gloo_on_cpus_shares_no_sms() -> None:
    """Neither the TP/CP passes nor the data-parallel sync slow compute under a gloo profile."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    import golden

    sc = scenario_from_dict({"name": "t", "model": {"preset": "gpt3-1.3b", "num_layers": 2},
                             "cluster": {"preset": "dgx-h100", "num_nodes": 1, "gpus_per_node": 2},
                             "plan": {"tp": 1, "global_batch_size": 8, "overlap_grad_reduce": True}})
    gloo = CalibrationProfile.from_dict(golden.LOCAL_PROFILE)
    gpu = sc.cluster.gpu
    for profile, slowdown in ((gloo, 0.0), (None, overlap.OVERLAP_COMPUTE_SLOWDOWN)):
        cost = CostModel(gpu, "bf16", profile)
        assert OpTimer(sc, cost, None).contention == slowdown  # type: ignore[arg-type]
        ctx = CommContext(sc.cluster, sc.plan, Network.of(sc.cluster, profile))
        traffic, _ = stage_sync(sc, ctx, cost, 0)
        assert traffic.step_grad_sync and traffic.contention == slowdown
        stretch = contention_stretch(traffic, sc.plan, 0.1, 0.2)[0]
        assert (stretch > 0) == (slowdown > 0)
        # and the assumptions say so: no claim of a slowdown the step does not include
        claims = [a for a in predict(sc, profile=profile).assumptions if "slower (Lee et al. 2025)" in a]
        assert len(claims) == (slowdown > 0)
