"""Experts, expert parallelism, context parallelism, MLA, windows, MTP and DualPipe in the
simulator: each mechanism against an independent count or a published formula."""

from __future__ import annotations

import math

import pytest
from param_count import attention_params as mla_reference
from param_count import ffn_params

from simdist.analytic.collectives import Network, collective_time, layout_for_axis
from simdist.analytic.context import kv_block_bytes
from simdist.analytic.flops import model_flops_per_token
from simdist.analytic.memory import model_state_bytes
from simdist.analytic.moe import TOKEN_COUNTS, dispatch_bytes, wire_factor
from simdist.analytic.params import (
    expert_params_per_rank,
    params_per_rank,
    stage_params,
)
from simdist.analytic.variants import comm_bytes, layer_ops
from simdist.errors import ScenarioError
from simdist.predict import predict
from simdist.results import BREAKDOWN_KEYS
from simdist.spec.groups import expert_coord, group_ranks
from simdist.spec.layers import LayerKind, kind_counts, layer_kind
from simdist.spec.scenario import scenario_from_dict


def make(model: str | dict, nodes: int = 1, cluster: str = "dgx-h100", **plan) -> object:
    plan.setdefault("global_batch_size", 64)
    m = {"preset": model} if isinstance(model, str) else model
    return scenario_from_dict({"name": "t", "model": m, "cluster": {"preset": cluster, "num_nodes": nodes},
                               "plan": plan})


DSV3 = {"tp": 2, "pp": 8, "virtual_pipeline_stages": 4, "schedule": "interleaved-1f1b", "ep": 64,
        "sequence_parallel": True, "global_batch_size": 8192, "zero_stage": 1, "fp32_grad_accumulation": True}


# --- layout -----------------------------------------------------------------------------------


def test_megatron_expert_layout_with_pipeline_outermost():
    """DeepSeek-V3's public plan: an expert group is 64 consecutive ranks (8 whole nodes), the
    two replicas of each expert 64 ranks apart; dense dp groups stride tp."""
    sc = make("deepseek-v3", nodes=128, **DSV3)
    plan = sc.plan
    assert group_ranks(plan, "ep", 0) == tuple(range(64))
    assert group_ranks(plan, "edp", 0) == (0, 64)
    assert group_ranks(plan, "pp", 0) == tuple(range(0, 1024, 128))
    assert [expert_coord(r, plan) for r in (0, 1, 63, 64)] == [(0, 0, 0), (0, 1, 0), (0, 63, 0), (0, 0, 1)]
    g = layout_for_axis(sc.cluster, plan, "ep")
    assert (g.size, g.ranks_per_node, g.nodes) == (64, 8, 8)


def test_layer_kinds_dense_first_and_windows_alternate():
    ds = make("deepseek-v3", nodes=128, **DSV3).model
    assert [layer_kind(ds, i).moe for i in range(5)] == [False, False, False, True, True]
    oss = make("gpt-oss-120b", nodes=8, ep=8).model
    assert [layer_kind(oss, i).window for i in range(4)] == [True, False, True, False]
    assert sum(layer_kind(oss, i).window for i in range(oss.num_layers)) == 18


@pytest.mark.parametrize("model", [{"preset": "deepseek-v3"}, {"preset": "gpt-oss-120b"},
                                   {"preset": "gpt-oss-120b", "sliding_window_layers": 7},
                                   {"preset": "qwen3-30b-a3b", "first_dense_layers": 5}])
def test_layer_counts_of_a_range_match_the_layers_one_by_one(model):
    """The closed form that counts a range of layers by kind agrees with counting each layer
    (so a model of any depth is counted in constant time)."""
    m = make(model, nodes=8, ep=8).model
    n = m.num_layers
    for a, b in ((0, n), (0, 1), (1, n - 1), (3, 4), (n // 3, 2 * n // 3), (5, 5)):
        one_by_one: dict[LayerKind, int] = {}
        for i in range(a, b):
            one_by_one[layer_kind(m, i)] = one_by_one.get(layer_kind(m, i), 0) + 1
        assert kind_counts(m, range(a, b)) == tuple(one_by_one.items()), (a, b)


def test_a_model_too_deep_to_walk_is_refused_naming_the_field():
    with pytest.raises(ScenarioError, match="num_layers"):
        make({"preset": "gpt3-1.3b", "num_layers": 652_405_696})


def test_experts_on_a_cluster_too_large_to_walk_are_refused_naming_the_field():
    """Expert and context-parallel groups are walked rank by rank: the fuzz test's 2**45-node
    Qwen3 plan ran out of memory; a dense plan on as many GPUs still builds (closed-form groups)."""
    from simdist.spec.consistency import MAX_GROUP_RANKS

    nodes = 2**45
    with pytest.raises(ScenarioError) as err:
        make("qwen3-235b-a22b", nodes=nodes, tp=2, pp=8, ep=32, global_batch_size=nodes)
    assert "cluster.num_nodes" in {p.field for p in err.value.problems}
    with pytest.raises(ScenarioError, match=r"cluster\.num_nodes"):
        make("gpt3-1.3b", nodes=nodes, cp=2, global_batch_size=nodes * 4)
    assert make("gpt3-1.3b", nodes=nodes, global_batch_size=nodes * 8).cluster.num_nodes == nodes
    largest = make("qwen3-30b-a3b", nodes=MAX_GROUP_RANKS // 8 * 2, pp=2, ep=8, global_batch_size=MAX_GROUP_RANKS)
    assert largest.cluster.world_size // largest.plan.pp == MAX_GROUP_RANKS


# --- parameters, FLOPs --------------------------------------------------------------------------


def test_expert_parameters_split_over_ep_and_etp():
    sc = make("qwen3-30b-a3b", nodes=2, ep=8, etp=2)
    m = sc.model
    expert = ffn_params(m, m.moe_ffn_hidden_size)
    assert expert_params_per_rank(m, sc.plan, 0) == m.num_layers * (m.num_experts // 8) * expert // 2
    dense = stage_params(m, sc.plan, 0).total - m.num_layers * m.num_experts * expert
    assert params_per_rank(m, sc.plan, 0) == dense + expert_params_per_rank(m, sc.plan, 0)


def test_model_states_match_megatron_theoretical_memory_for_moe():
    """Megatron-LM training/theoretical_memory_usage.py with the distributed optimizer: expert
    parameters take 6 + 12/expert_dp bytes each (bf16 weight, fp32 grad, fp32 master + Adam
    over the expert data-parallel group), the rest 6 + 12/dp (dp*cp with context parallel)."""
    sc = make("deepseek-v3", nodes=128, **DSV3)
    m, plan = sc.model, sc.plan
    for stage in (0, 3):
        experts = expert_params_per_rank(m, plan, stage)
        dense = params_per_rank(m, plan, stage) - experts
        want = experts * (6 + 12 / 2) + dense * (6 + 12 / 64)
        got = sum(v for k, v in model_state_bytes(m, plan, stage).items() if k in ("params", "grads", "optimizer"))
        assert got == pytest.approx(want, rel=1e-9)


def test_mla_parameters_and_kv_blocks():
    m = make("deepseek-v3", nodes=128, **DSV3).model
    from simdist.analytic.params import attention_params

    assert attention_params(m).total == mla_reference(m)
    plan = make("deepseek-v3", nodes=128, **{**DSV3, "ep": 32, "cp": 2}).plan
    s = m.seq_length // 2
    assert kv_block_bytes(m, plan) == s * m.num_attention_heads * (128 + 64 + 128) * 2 / 2


def test_flops_count_active_parameters():
    """6 x active non-embedding weights + LM head + attention square, as frameworks count MoE
    (Qwen3-30B-A3B: 3.3B active of 30.5B)."""
    m = make("qwen3-30b-a3b", nodes=2, ep=16).model
    h, a, d, kv = m.hidden_size, m.num_attention_heads, m.head_dim, m.kv_dim
    attn = 2 * h * a * d + 2 * h * kv
    experts = (m.experts_per_token + m.num_shared_experts) * 3 * h * m.moe_ffn_hidden_size
    per_layer = attn + experts + h * m.num_experts
    want = 6 * (m.num_layers * per_layer + h * m.vocab_size) + 3 * m.num_layers * 4 * m.seq_length * a * d
    assert model_flops_per_token(m) == pytest.approx(want, rel=1e-12)
    assert per_layer * m.num_layers + 2 * h * m.vocab_size == pytest.approx(3.3e9, rel=0.03)


def test_sliding_window_and_mtp_flops():
    oss = make("gpt-oss-120b", nodes=8, ep=8).model
    full = make({"preset": "gpt-oss-120b", "sliding_window": None, "sliding_window_layers": None}, nodes=8, ep=8)
    assert model_flops_per_token(oss) < model_flops_per_token(full.model)
    ds = make("deepseek-v3", nodes=128, **DSV3).model
    no_mtp = make({"preset": "deepseek-v3", "mtp_layers": 0}, nodes=128, **DSV3).model
    extra = model_flops_per_token(ds) - model_flops_per_token(no_mtp)
    layer = model_flops_per_token(no_mtp) / (ds.num_layers + 1)
    assert 0.5 * layer < extra < 3 * layer  # one more MoE layer, a projection and an LM head


# --- dispatch ---------------------------------------------------------------------------------


def test_dropless_alltoall_dispatch_gathers_the_token_counts_first():
    """Megatron-Core's alltoall dispatcher (and the executor's) all-gathers every rank's tokens per
    expert before the host reads them, once per MoE forward; the backward reuses the splits, a
    padded (capacity) plan needs no counts, DeepEP's flex dispatch exchanges them in its kernel."""
    def counts(ops):
        return [op for op in ops if getattr(op, "name", "") == TOKEN_COUNTS]

    moe = LayerKind(True, False)
    sc = make("qwen3-30b-a3b", nodes=2, ep=16, global_batch_size=1024)
    m, plan = sc.model, sc.plan
    fwd = layer_ops(m, plan, "fwd", moe)
    (op,) = counts(fwd)
    assert (op.collective, op.axis, op.bytes) == ("allgather", "ep", 16 * m.num_experts * 8)
    names = [getattr(o, "name", "") for o in fwd]
    assert names.index(TOKEN_COUNTS) < names.index("dispatcher host sync") < names.index("alltoall ep dispatch")
    assert counts(layer_ops(m, plan, "bwd", moe)) == []
    flex = make("qwen3-30b-a3b", nodes=2, ep=16, global_batch_size=1024, moe_dispatcher="flex")
    assert counts(layer_ops(flex.model, flex.plan, "fwd", moe)) == []
    padded = make({"preset": "qwen3-30b-a3b", "moe_capacity_factor": 1.0}, nodes=2, ep=16, global_batch_size=1024)
    assert counts(layer_ops(padded.model, padded.plan, "fwd", moe)) == []


def test_dispatch_bytes_and_alltoall_on_the_topology():
    sc = make("qwen3-30b-a3b", nodes=2, ep=16, global_batch_size=1024)
    m, plan = sc.model, sc.plan
    ops = layer_ops(m, plan, "fwd", LayerKind(True, False))
    t = m.seq_length * plan.micro_batch_size
    assert dispatch_bytes(m, plan) == t * m.experts_per_token * m.hidden_size * 2
    assert comm_bytes(ops, "ep", "alltoall") == 2 * dispatch_bytes(m, plan)  # dispatch + combine
    net = Network.of(sc.cluster)
    g = layout_for_axis(sc.cluster, plan, "ep")
    one_node = layout_for_axis(make("qwen3-30b-a3b", nodes=1, ep=8).cluster, make("qwen3-30b-a3b", nodes=1, ep=8).plan, "ep")
    s = dispatch_bytes(m, plan)
    # half the copies leave the node through the NICs, a quarter of NVLink's speed each
    assert collective_time("alltoall", s, g, net) == pytest.approx(net.inter_latency + 8 / 16 * s / (net.inter_bw_node / 8))
    assert collective_time("alltoall", s, one_node, net) < collective_time("alltoall", s, g, net) / 4
    flex = make("qwen3-30b-a3b", nodes=2, ep=16, moe_dispatcher="flex")
    # 8 of 128 experts among 64 per node: a token reaches the other node ~once, against 4 copies
    assert wire_factor(flex.model, flex.plan, g) == pytest.approx((1 - math.comb(64, 8) / math.comb(128, 8)) / 4)


@pytest.mark.parametrize("plan", [
    {"ep": 16},
    {"ep": 16, "ep_comm_overlap": True},
    {"ep": 8, "pp": 2, "schedule": "dualpipev", "global_batch_size": 64},
])
def test_ep_comm_in_the_breakdown_both_engines(plan):
    sc = make("qwen3-30b-a3b", nodes=2, **plan)
    got = {}
    for engine in ("analytic", "des"):
        p = predict(sc, engine=engine, keep_spans=engine == "des")
        assert tuple(p.breakdown_s) == (*BREAKDOWN_KEYS, "ep_comm")
        assert sum(p.breakdown_s.values()) == pytest.approx(p.step_time_s, rel=0.01)
        got[engine] = p
    assert got["des"].step_time_s == pytest.approx(got["analytic"].step_time_s, rel=0.05)
    if plan.get("ep_comm_overlap") or plan.get("schedule"):  # mostly hidden behind the other pass
        alone = predict(make("qwen3-30b-a3b", nodes=2, ep=plan["ep"], pp=plan.get("pp", 1),
                             global_batch_size=plan.get("global_batch_size", 64)), engine="analytic")
        assert got["analytic"].breakdown_s["ep_comm"] < 0.5 * alone.breakdown_s["ep_comm"]
    else:
        assert got["analytic"].breakdown_s["ep_comm"] > 0.05 * got["analytic"].step_time_s
        assert any(s.category == "ep_comm" for s in got["des"].spans)


def test_event_engine_alltoall_contends_with_data_parallel_traffic():
    """ZeRO-3's parameter all-gathers (forward and backward) share the NICs with an all-to-all that
    runs beside the compute: the event engine's all-to-all takes longer than its solo time,
    which is what the closed form charges."""
    sc = make("qwen3-30b-a3b", nodes=2, ep=16, zero_stage=3, ep_comm_overlap=True, global_batch_size=64)
    closed = predict(sc, engine="analytic", keep_spans=False)
    des = predict(sc, engine="des", keep_spans=False)
    assert des.breakdown_s["ep_comm"] > closed.breakdown_s["ep_comm"] * 1.01
    assert any("contention" in a for a in des.assumptions)


# --- context parallelism ---------------------------------------------------------------------


@pytest.mark.parametrize("method", ["ring", "allgather", "ulysses"])
def test_context_parallel_methods(method):
    sc = make({"preset": "llama3-8b", "seq_length": 65536}, nodes=1, cp=4, cp_method=method, global_batch_size=8,
              recompute="full")
    p = predict(sc, engine="analytic", keep_spans=False)
    des = predict(sc, engine="des", keep_spans=False)
    assert tuple(p.breakdown_s) == (*BREAKDOWN_KEYS, "cp_comm")
    assert des.step_time_s == pytest.approx(p.step_time_s, rel=0.02)
    single = predict(make({"preset": "llama3-8b", "seq_length": 65536}, nodes=1, global_batch_size=8,
                          recompute="full"), engine="analytic", keep_spans=False)
    # 8 sequences on 8 GPUs either way: the same compute per GPU (the causal work balanced)
    assert p.breakdown_s["compute"] == pytest.approx(single.breakdown_s["compute"], rel=0.15)
    if method == "ring":  # K/V blocks hide behind the previous block's kernel
        assert p.breakdown_s["cp_comm"] < 0.01 * p.step_time_s
    else:
        assert p.breakdown_s["cp_comm"] > 0


def test_context_parallel_shards_dense_states_over_dp_cp():
    base = make({"preset": "llama3-8b", "seq_length": 32768}, nodes=1, zero_stage=1, global_batch_size=8)
    cp = make({"preset": "llama3-8b", "seq_length": 32768}, nodes=1, zero_stage=1, cp=2, global_batch_size=4)
    opt = model_state_bytes(base.model, base.plan)["optimizer"]
    assert model_state_bytes(cp.model, cp.plan)["optimizer"] == pytest.approx(opt, rel=1e-12)  # 8 ranks either way


# --- DualPipe -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["dualpipe", "dualpipev"])
def test_dualpipe_schedules_run_and_agree(name):
    from simdist.sim.dualpipe import dependencies, schedule

    p, m = 4, 16
    sched = schedule(name, p, m)
    stages = 2 * p if name == "dualpipev" else p
    assert sum(len(a) for a in sched) == 2 * m * stages
    done: set = set()
    pos = [0] * p
    for _ in range(4 * m * stages):  # every rank can always advance: no deadlock
        for r in range(p):
            if pos[r] < len(sched[r]) and all(d in done for d in dependencies(name, sched[r][pos[r]], r, p, m, False)):
                done.add((r, sched[r][pos[r]]))
                pos[r] += 1
    assert pos == [len(a) for a in sched]
    sc = make("qwen3-30b-a3b", nodes=2, ep=8, pp=2, schedule=name, global_batch_size=64)
    closed = predict(sc, engine="analytic", keep_spans=False)
    des = predict(sc, engine="des", keep_spans=False)
    assert des.step_time_s == pytest.approx(closed.step_time_s, rel=0.05)
    one = predict(make("qwen3-30b-a3b", nodes=2, ep=8, pp=2, global_batch_size=64), engine="analytic", keep_spans=False)
    assert closed.step_time_s < one.step_time_s  # all-to-all hidden, smaller bubble
    if name == "dualpipe":  # two stages' parameters per rank
        assert closed.per_stage[0].params_gib == pytest.approx(2 * one.per_stage[0].params_gib, rel=0.1)


def test_deepseek_v3_plan_predicts_and_fits_checks():
    sc = make("deepseek-v3", nodes=128, **DSV3)
    p = predict(sc, engine="des", keep_spans=False)
    assert p.breakdown_s["ep_comm"] > 0 and 0.05 < p.mfu < 0.6


# --- validation rows ---------------------------------------------------------------------------


def test_moe_and_cp_rows_are_predicted_with_their_groups():
    from simdist.validate import moe_cp
    from simdist.validate.rows import packaged_data_dir, read_csv

    rows = {r["run_id"]: r for r in read_csv(packaged_data_dir() / "training_runs.csv")}
    for rid, group in (("R0106", moe_cp.GROUP_MOE), ("R0133", moe_cp.GROUP_MOE), ("R0105", moe_cp.GROUP_MOE),
                       ("R0092", moe_cp.GROUP_CP["NeMo"]), ("R0150", moe_cp.GROUP_CP["torchtitan"])):
        assert moe_cp.handles(rows[rid]) and moe_cp.group(rows[rid]) == group
        _, _, (measured, how) = moe_cp.build(rows[rid])
        assert measured > 0 and how in ("step time", "tokens/s", "TFLOP/s (model FLOPs)")
    ds, _, _ = moe_cp.build(rows["R0133"])  # the DeepSeek-V3 row: the public plan on the preset
    assert (ds.model.num_experts, ds.plan.ep, ds.plan.tp, ds.plan.pp, ds.plan.virtual_pipeline_stages) == (256, 64, 2, 8, 4)
    assert moe_cp.build(rows["R0100"]).startswith("model not expressible")  # Nemotron 3 Nano: Mamba layers
    assert moe_cp.build(rows["R0081"]).startswith("plan (tp/pp) not stated")
