"""The MoE layer's host read of the tokens per expert (simdist.analytic.host) and the SMs the
dispatcher's kernels take from the compute they overlap (simdist.analytic.moe.dispatcher_sms)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from simdist.analytic import host, moe
from simdist.analytic.collectives import Network, layout_for_axis
from simdist.analytic.cost import CostModel
from simdist.analytic.passes import OpTimer
from simdist.analytic.variants import moe_block
from simdist.predict import predict
from simdist.spec.scenario import scenario_from_dict


def _scenario(**plan: object) -> object:
    base = {"tp": 1, "pp": 1, "ep": 8, "precision": "fp8", "framework": "nemo", "micro_batch_size": 1,
            "global_batch_size": 16}
    return scenario_from_dict({"name": "moe host", "model": {"preset": "qwen3-30b-a3b", "num_layers": 4},
                               "cluster": {"preset": "dgx-h100", "num_nodes": 2, "gpus_per_node": 8},
                               "plan": {**base, **plan}})


def test_refill_idle_is_the_queue_of_one_issuer_and_one_gpu() -> None:
    # kernels longer than the issue time: the GPU waits only for the first issue
    assert host.refill_idle([1e-3] * 5, issue_s=1e-5) == pytest.approx(1e-5)
    # kernels shorter than the issue time: the GPU waits (issue - kernel) for each after the first
    assert host.refill_idle([2e-6] * 4, issue_s=1e-5) == pytest.approx(1e-5 + 3 * 8e-6)
    # a long kernel builds a lead that hides the short ones after it
    assert host.refill_idle([1e-3, 1e-6, 1e-6], issue_s=1e-5) == pytest.approx(1e-5)
    assert host.refill_idle([]) == 0.0


def test_dropless_forward_syncs_once_padded_capacity_never() -> None:
    sc = _scenario()
    m, plan = sc.model, sc.plan
    fwd = [op.name for op in moe.routed_ops(m, plan, bwd=False)]
    assert fwd.count("dispatcher host sync") == 1
    assert fwd.index("dispatcher host sync") < fwd.index("alltoall ep dispatch")  # the split sizes
    assert "dispatcher host sync" not in [op.name for op in moe.routed_ops(m, plan, bwd=True)]
    dropped = replace(m, moe_capacity_factor=1.0)
    assert "dispatcher host sync" not in [op.name for op in moe.routed_ops(dropped, plan, bwd=False)]


def test_the_sync_costs_its_round_trip_and_the_refill() -> None:
    sc = _scenario()
    cost, net = CostModel(sc.cluster.gpu, sc.plan.precision), Network.of(sc.cluster)
    timer = OpTimer(sc, cost, net)
    ops = tuple(moe_block(sc.model, sc.plan, "fwd"))
    i = [op.name for op in ops].index("dispatcher host sync")
    with_sync = timer.passes(ops).compute
    without = timer.passes(ops[:i] + ops[i + 1:]).compute
    stall = with_sync - without
    assert stall >= host.SYNC_ROUND_TRIP_S + host.HOST_ISSUE_S  # the drain, then at least one issue
    # per-expert kernels: the local experts' GEMMs (fc1, fc2) are issued one by one (their FP8
    # casts fused into one kernel per operand under the default delayed scaling)
    assert stall == pytest.approx(host.SYNC_ROUND_TRIP_S + host.DISPATCHER_GAP_S
                                  + host.refill_idle(timer._kernels(ops[i + 1:])))
    assert len(timer._kernels(ops[i + 1:])) > 2 * moe.local_experts(sc.model, sc.plan)


def test_the_dispatcher_gap_is_the_measured_gpu_idle_per_moe_forward() -> None:
    """Megatron-Bridge's Nsight profile of Qwen3-30B-A3B on 16 H100 (HybridEP, no all-to-all
    overlap): 24.714 s per step, 22.821 s of it GPU-active, 64 micro-batches x 48 MoE layers:
    616 us idle per MoE forward, of which the round trip is 10 us."""
    assert pytest.approx((24.7138 - 22.821) / (64 * 48)) == host.DISPATCHER_GAP_S + host.SYNC_ROUND_TRIP_S
    assert 550e-6 < host.DISPATCHER_GAP_S < 650e-6
    # overlapped (the paired micro-batch's kernels are queued) or on CPUs under gloo: no idle
    assert host.drain_gap(overlapped=True) == 0.0
    assert host.drain_gap(overlapped=False) == host.DISPATCHER_GAP_S
    from simdist.spec.profile import CalibrationProfile

    assert host.drain_gap(False, CalibrationProfile(device="cpu (2 cores)", backend="gloo")) == 0.0
    assert host.drain_gap(False, CalibrationProfile(device="NVIDIA H100", backend="nccl")) == host.DISPATCHER_GAP_S


def _qwen30b_bridge_bf16(**plan: object) -> object:
    """The plan of Megatron-Bridge's Qwen3-30B-A3B H100 pre-training recipe (R0099's row) in BF16,
    as the skill benchmark of its expert-parallel overlap ran it."""
    from simdist.validate import moe_cp
    from simdist.validate.rows import data_dir, read_csv

    row = next(r for r in read_csv(data_dir(None) / "training_runs.csv") if r["run_id"] == "R0099")
    d = moe_cp.moe_scenario(row)
    d["plan"].update(precision="bf16", **plan)
    d["plan"].pop("fp8_recipe", None)
    return scenario_from_dict(d)


def test_qwen3_30b_bf16_hybridep_step_within_ten_percent_of_the_bridge_benchmark() -> None:
    """Megatron-Bridge skills/nemo-mbridge-perf-expert-parallel-overlap/SKILL.md (2026-07-25):
    Qwen3-30B-A3B pre-training on 16 H100, BF16, TP1 PP1 EP16, micro-batch 1, global batch
    1024, sequence 4096, flex dispatcher with HybridEP, force-balanced routing, overlap off:
    24.714 s per step. In-sample, not evidence of accuracy: host.DISPATCHER_GAP_S was measured on
    this very run's profile, so this checks that the rest of the model keeps the step within 10%
    once that gap is priced (it was 11% fast without it). The independent checks of the two MoE
    terms are test_moe_overlap.py's Megatron-MoE-ModelZoo steps."""
    p = predict(_qwen30b_bridge_bf16(ep_comm_overlap=False), engine="analytic", keep_spans=False)
    assert p.step_time_s == pytest.approx(24.7138, rel=0.10)


def test_overlapped_dispatch_slows_the_compute_beside_it() -> None:
    """With ep_comm_overlap the all-to-all hides behind another micro-batch's compute, which
    then runs on the SMs the dispatcher's kernels leave: DeepEP's 20 (DeepSeek-V3 sec 3.2.2) for
    the flex dispatcher, one per NCCL channel (32 on Hopper) for alltoall."""
    plain = _scenario(moe_dispatcher="alltoall")
    over = _scenario(moe_dispatcher="alltoall", ep_comm_overlap=True)
    flex = _scenario(moe_dispatcher="flex", ep_comm_overlap=True)
    assert moe.dispatcher_sms(over.plan, over.cluster) == 32
    assert moe.dispatcher_sms(flex.plan, flex.cluster) == moe.DEEPEP_SMS == 20
    p_plain, p_over = (predict(s, engine="analytic", keep_spans=False) for s in (plain, over))
    assert p_over.breakdown_s["ep_comm"] < p_plain.breakdown_s["ep_comm"]  # overlap hides
    # and costs SMs; the plain run's compute holds the drain gap at each MoE forward's read,
    # which the overlapped run hides (host.drain_gap): 4 layers, one micro-batch per rank
    gaps = 4 * host.DISPATCHER_GAP_S * plain.plan.num_microbatches
    assert p_over.breakdown_s["compute"] > p_plain.breakdown_s["compute"] - gaps
    assert p_over.step_time_s < p_plain.step_time_s  # never more than it hides (c < sms)


def _dsv3(**model: object) -> object:
    return scenario_from_dict({"name": "dsv3", "model": {"preset": "deepseek-v3", **model},
                               "cluster": {"preset": "dgx-h100", "num_nodes": 8, "gpus_per_node": 8},
                               "plan": {"tp": 1, "ep": 64, "moe_dispatcher": "flex", "global_batch_size": 64}})


def test_node_limited_routing_reaches_at_most_its_group_topk_nodes() -> None:
    """DeepSeek-V3 sec 2.1.2: each token's 8 experts come from 4 of 8 groups (one group per node
    at EP64 on 8 nodes), so it reaches at most 4 nodes: 4 x (1 - C(96,8)/C(128,8)) on average,
    against 8 x (1 - C(224,8)/C(256,8)) under uniform routing."""
    limited, uniform = _dsv3(), _dsv3(moe_router_groups=1, moe_router_group_topk=1)
    assert (limited.model.moe_router_groups, limited.model.moe_router_group_topk) == (8, 4)  # the preset
    reached = 8 * (1 - moe.node_missed(limited.model, 8))
    assert reached == pytest.approx(4 * (1 - math.comb(96, 8) / math.comb(128, 8)))
    assert 8 * (1 - moe.node_missed(uniform.model, 8)) == pytest.approx(8 * (1 - math.comb(224, 8) / math.comb(256, 8)))
    # every group allowed is uniform routing again
    assert moe.node_missed(_dsv3(moe_router_group_topk=8).model, 8) == pytest.approx(moe.node_missed(uniform.model, 8))
    # groups spanning two nodes each: a node is reached only through its chosen group
    half = _dsv3(moe_router_groups=4, moe_router_group_topk=2).model
    assert moe.node_missed(half, 8) == pytest.approx(0.5 + 0.5 * math.comb(96, 8) / math.comb(128, 8))
    g = layout_for_axis(limited.cluster, limited.plan, "ep")
    assert moe.wire_factor(limited.model, limited.plan, g) < moe.wire_factor(uniform.model, uniform.plan, g)


def test_assumptions_name_the_host_read_the_dispatcher_sms_and_the_routing_groups() -> None:
    over = predict(_scenario(moe_dispatcher="alltoall", ep_comm_overlap=True), engine="analytic", keep_spans=False)
    line = next(a for a in over.assumptions if a.startswith("mixture of experts"))
    assert "host reads the tokens per expert" in line and "32 SMs" in line
    padded = _scenario()
    padded = replace(padded, model=replace(padded.model, moe_capacity_factor=1.0))
    line = next(a for a in predict(padded, engine="analytic", keep_spans=False).assumptions
                if a.startswith("mixture of experts"))
    assert "padded to capacity" in line
    line = next(a for a in predict(_dsv3(), engine="analytic", keep_spans=False).assumptions
                if a.startswith("mixture of experts"))
    assert "4 of 8 groups" in line


def test_qwen3_30b_bf16_hybridep_overlapped_step_within_ten_percent_of_the_bridge_benchmark() -> None:
    """The same benchmark with the all-to-all overlap on: 20.992 s per step. In-sample too:
    moe.OVERLAP_STRETCH comes from this run and the one above (asserted below from the profile's
    figures); the SM share alone (c / (sms - c)) predicted it 13% fast."""
    p = predict(_qwen30b_bridge_bf16(ep_comm_overlap=True), engine="analytic", keep_spans=False)
    assert p.step_time_s == pytest.approx(20.992, rel=0.10)
    assert pytest.approx(1 - (22.821 - 21.221) / 3.959) == moe.OVERLAP_STRETCH
    from simdist.spec.profile import CalibrationProfile

    sc = _qwen30b_bridge_bf16(ep_comm_overlap=True)
    c = moe.dispatcher_sms(sc.plan, sc.cluster)
    gloo = CalibrationProfile(device="cpu (2 cores)", backend="gloo")
    assert moe.overlap_stretch(sc.plan, sc.cluster, gloo) == pytest.approx(c / (sc.cluster.gpu.sms - c))
    # DeepSeek's DualPipe without Megatron's combined 1F1B keeps the SM share (DeepEP's 20 SMs)
    dual = replace(sc.plan, ep_comm_overlap=False, schedule="dualpipev")
    assert moe.dispatch_overlapped(dual)
    assert moe.overlap_stretch(dual, sc.cluster) == pytest.approx(c / (sc.cluster.gpu.sms - c))
