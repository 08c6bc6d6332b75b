"""NCCL's algorithm and protocol choice (simdist.analytic.nccl, after NCCL 2.30 src/graph/tuning.cc)
and the bucket rules per framework (simdist.analytic.overlap)."""

import pytest

from simdist.analytic import nccl
from simdist.analytic.collectives import GroupLayout, Network, collective_choice, collective_time
from simdist.analytic.overlap import (
    bucket_bytes,
    bucketed_exposed,
    chunked_buckets_exposed,
    grad_buckets,
)
from simdist.errors import ScenarioError
from simdist.predict import predict
from simdist.spec.scenario import scenario_from_dict


def cluster(preset="dgx-h100", nodes=1, **extra):
    return scenario_from_dict({"name": "t", "model": {"preset": "gpt3-1.3b"},
                               "cluster": {"preset": preset, "num_nodes": nodes, **extra},
                               "plan": {"global_batch_size": 8 * nodes}}).cluster


def choice(kind, nbytes, size, nodes, preset="dgx-h100", **extra):
    c = cluster(preset, nodes, **extra)
    g = GroupLayout(size, max(1, size // nodes), nodes, c.gpus_per_node)
    return collective_choice(kind, nbytes, g, Network.of(c))


def test_small_messages_take_low_latency_protocols_large_ones_simple():
    assert choice("allreduce", 4096, 8, 1, "dgx-a100-80gb").protocol == "LL"
    big = choice("allreduce", 2**30, 8, 1, "dgx-a100-80gb")
    assert (big.algorithm, big.protocol) == ("ring", "Simple")


def test_ring_latency_is_tuning_cc_s_on_nvlink():
    """8 ranks in one node, Simple ring all-reduce: base 8.4 us + 14 steps x 3.4 us (the preset's
    NVLink step latency is NCCL's)."""
    c = choice("allreduce", 2**30, 8, 1, "dgx-a100-80gb")
    assert c.latency_s == pytest.approx((8.4 + 14 * 3.4) * 1e-6)


def test_large_data_parallel_all_reduce_uses_trees_not_a_latency_bound_ring():
    """256 nodes, one rank each, 25 MiB: a ring pays 2 x 255 network steps; NCCL's trees pay
    2 log2(256); the choice is the tree, and far faster than the ring alone."""
    c = choice("allreduce", 25 * 2**20, 256, 256)
    assert c.algorithm in ("tree", "nvls_tree")
    ring_only = choice("allreduce", 25 * 2**20, 256, 256, nccl_algorithms="ring")
    assert ring_only.algorithm == "ring" and ring_only.latency_s > 5 * c.latency_s
    assert ring_only.seconds > 1.5 * c.seconds


def test_pat_serves_all_gather_at_one_rank_per_node_only():
    one = choice("allgather", 2**20, 64, 64)
    assert one.algorithm == "pat"
    many = choice("allgather", 2**20, 64, 8)  # 8 ranks per node: PAT is off (tuning.cc ncclPatEnable)
    assert many.algorithm == "ring"


def test_nvls_in_h100_nodes_not_in_a100():
    assert choice("allreduce", 256 * 2**20, 8, 1).algorithm == "nvls"
    assert choice("allreduce", 256 * 2**20, 8, 1, "dgx-a100-80gb").algorithm == "ring"
    assert choice("allreduce", 256 * 2**20, 8, 1, nccl_algorithms="^nvls").algorithm == "ring"


def test_in_network_reduction_halves_a_large_cross_node_all_reduce():
    off = choice("allreduce", 2**30, 32, 32, "dgx-a100-80gb")
    on = choice("allreduce", 2**30, 32, 32, "dgx-a100-80gb", in_network_reduction=True)
    assert on.algorithm == "collnet" and off.algorithm != "collnet"
    assert on.transfer_s == pytest.approx(off.transfer_s / 2, rel=0.15)


def test_protocol_override_and_bad_names():
    assert choice("allreduce", 4096, 8, 1, nccl_protocols="Simple").protocol == "Simple"
    with pytest.raises(ScenarioError) as e:
        cluster(nccl_algorithms="ring,hypercube")
    assert "cluster.nccl_algorithms" in str(e.value) and "hypercube" in str(e.value)
    with pytest.raises(ScenarioError) as e:
        cluster(nccl_protocols="^LL,LL128,Simple")
    assert "cluster.nccl_protocols" in str(e.value)
    with pytest.raises(ScenarioError) as e:  # the user's text quoted on one line (found by the slow fuzz test)
        cluster(nccl_algorithms="0\n0," + "x" * 300)
    (problem,) = e.value.problems
    assert "\n" not in problem.message and "'0\\n0'" in problem.message and len(problem.message) < 200


def test_a_slower_link_slows_every_algorithm_alike():
    fast = choice("allreduce", 2**16, 64, 8)
    slow = choice("allreduce", 2**16, 64, 8, inter_node={"latency": "28 us"})
    assert slow.latency_s > fast.latency_s


def test_collective_time_is_the_choice():
    c = cluster("dgx-h100", 4)
    g = GroupLayout(32, 8, 4, 8)
    net = Network.of(c)
    assert collective_time("reducescatter", 2**28, g, net) == collective_choice("reducescatter", 2**28, g, net).seconds
    assert nccl.available(net.nccl_links("reducescatter", g), "reducescatter") == [
        ("ring", "LL"), ("ring", "LL128"), ("ring", "Simple")]


# --- bucket rules -------------------------------------------------------------------------------


def plan(**kw):
    kw.setdefault("global_batch_size", 512)
    return scenario_from_dict({"name": "t", "model": {"preset": "gpt3-1.3b"},
                               "cluster": {"preset": "dgx-h100", "num_nodes": 64}, "plan": kw}).plan


def test_megatron_bucket_grows_with_dp_pytorch_stays_25_mib():
    small, large = plan(framework="megatron", tp=8, pp=8), plan(framework="megatron")
    assert bucket_bytes(small) == 40e6 * 4  # fp32 main grads under bf16
    assert bucket_bytes(large) == 512e6 * 4
    assert bucket_bytes(plan(framework="pytorch")) == 25 * 2**20 == bucket_bytes(plan())
    assert bucket_bytes(plan(framework="deepspeed")) == 5e8 * 2
    assert bucket_bytes(plan(framework="megatron", ddp_bucket_size="8 MiB")) == 8 * 2**20  # set: it wins
    nbytes = 1.3e9 * 4
    assert grad_buckets(nbytes, large) < grad_buckets(nbytes, plan(dp=512, fp32_grad_accumulation=True))


def test_chunked_buckets_reduce_to_the_single_backward_formula():
    assert chunked_buckets_exposed(0.01, [(1.0, 0.0, 20)]) == pytest.approx(bucketed_exposed(0.01, 20, 1.0))
    assert chunked_buckets_exposed(0.1, [(1.0, 0.0, 20)]) == pytest.approx(bucketed_exposed(0.1, 20, 1.0))
    # a chunk finishing long before the end hides entirely; only the last chunk's tail shows
    early_and_late = chunked_buckets_exposed(0.01, [(9.0, 8.0, 10), (1.0, 0.0, 10)])
    assert early_and_late == pytest.approx(bucketed_exposed(0.01, 10, 1.0))


def test_interleaved_cool_down_hides_the_earlier_chunks_reduction():
    """Megatron reduces a chunk's gradients as its last backward runs; with interleaving the
    later chunks finish pp chunk-backwards early per lower chunk, so less DP sync shows."""
    base = {"name": "t", "model": {"preset": "gpt3-13b"}, "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 8},
            "plan": {"tp": 4, "pp": 4, "global_batch_size": 64, "framework": "megatron", "zero_stage": 1,
                     "overlap_grad_reduce": True, "overlap_param_gather": True}}
    one = predict(scenario_from_dict(base), engine="analytic", keep_spans=False)
    base["plan"]["virtual_pipeline_stages"] = 5
    inter = predict(scenario_from_dict(base), engine="analytic", keep_spans=False)
    assert inter.breakdown_s["dp_comm"] < 0.6 * one.breakdown_s["dp_comm"]
    des = predict(scenario_from_dict(base), engine="des", keep_spans=False)  # the event engine agrees
    assert des.breakdown_s["dp_comm"] == pytest.approx(inter.breakdown_s["dp_comm"], rel=0.15)
    assert des.step_time_s == pytest.approx(inter.step_time_s, rel=0.02)


def test_predict_names_the_bucket_rule_and_the_algorithms():
    sc = scenario_from_dict({"name": "t", "model": {"preset": "gpt3-1.3b"},
                             "cluster": {"preset": "dgx-h100", "num_nodes": 4},
                             "plan": {"framework": "megatron", "tp": 2, "global_batch_size": 64,
                                      "overlap_grad_reduce": True}})
    text = "\n".join(predict(sc, engine="analytic", keep_spans=False).assumptions)
    assert "Megatron-Core max(40M, 1M x dp)" in text
    assert "dp allreduce" in text and "tp allreduce" in text and "NCCL" in text
