"""Systems beyond 3D parallelism (simdist.analytic's data_parallel, compression, offload,
param_server and overlap modules, and their use by the closed-form engine):
hybrid sharding, offload, parameter servers, gradient compression, DDP buckets, optimizers, and
the new scenario fields' validation. Every expectation is arithmetic stated in the test."""

from __future__ import annotations

import json

import pytest
from conftest import REPO, base_scenario, run_cli

from simdist.analytic.collectives import Network, layout_for_axis
from simdist.analytic.compression import QUANT_GROUP, compression_ratio, powersgd_elements
from simdist.analytic.cost import cpu_optimizer_time, optimizer_bytes_per_param
from simdist.analytic.data_parallel import dp_traffic
from simdist.analytic.memory import model_state_bytes, optimizer_state_bytes_per_param, stage_memory
from simdist.analytic.offload import offload_traffic
from simdist.analytic.overlap import bucketed_exposed
from simdist.analytic.param_server import ps_times, ps_traffic
from simdist.analytic.params import params_per_rank, total_params
from simdist.errors import ScenarioError
from simdist.predict import predict
from simdist.spec.scenario import load_scenario, scenario_from_dict
from simdist.units import GiB

NEW_SCENARIOS = sorted(
    p for p in (REPO / "scenarios").glob("*.yaml")
    if p.name.startswith(("llama2-7b", "llama2-70b", "gpt3-1.3b-16x1gpu", "llama3-70b-fsdp-256", "llama3-70b-hsdp",
                          "llama3.1-405b-16384"))
)


def sc_of(nodes: int = 1, cluster: dict | None = None, model: str = "gpt3-1.3b", **plan):
    d = base_scenario(**plan)
    d["model"] = {"preset": model}
    d["cluster"]["num_nodes"] = nodes
    d["cluster"].update(cluster or {})
    return scenario_from_dict(d)


def states(sc) -> float:
    s = model_state_bytes(sc.model, sc.plan, 0)
    return s["params"] + s["grads"] + s["optimizer"]


# --- hybrid sharding ---------------------------------------------------------------------------


@pytest.mark.parametrize("shard", [8, 16, 32])
def test_hsdp_model_states_are_16p_over_dp_shard(shard):
    """ZeRO-3 with mixed-precision Adam: 2 + 2 + 12 = 16 B per parameter, over the shard group."""
    sc = sc_of(nodes=4, zero_stage=3, dp_shard=shard, global_batch_size=64)
    n = params_per_rank(sc.model, sc.plan, 0)
    assert states(sc) == pytest.approx(16 * n / shard, rel=1e-12)


def test_hsdp_collectives_stay_in_the_shard_group_and_allreduce_across_replicas():
    sc = sc_of(nodes=4, zero_stage=3, dp_shard=8, global_batch_size=64)
    plan = sc.plan
    tr = dp_traffic(sc.model, plan, 0)
    assert {c.axis for c in tr.fwd_gathers + tr.bwd_gathers} == {"dp_shard"}
    rs, ar = tr.microbatch_grad_sync
    n = params_per_rank(sc.model, plan, 0)
    assert (rs.axis, rs.kind) == ("dp_shard", "reducescatter") and rs.total_bytes == pytest.approx(2 * n)
    # each rank all-reduces its 1/8 shard with the same rank of the 3 other replicas
    assert (ar.axis, ar.kind) == ("dp_replica", "allreduce") and ar.total_bytes == pytest.approx(2 * n / 8)
    assert layout_for_axis(sc.cluster, plan, "dp_shard").nodes == 1  # dp_shard <= 8: inside a node
    assert layout_for_axis(sc.cluster, plan, "dp_replica").nodes == 4


def test_hsdp_is_faster_than_full_shard_on_a_slow_network():
    slow = {"inter_node": {"kind": "ethernet", "nics_per_node": 1, "bandwidth": "25 Gb/s", "latency": "20 us"}}
    full = predict(sc_of(nodes=4, cluster=slow, zero_stage=3, global_batch_size=64), engine="analytic")
    hsdp = predict(sc_of(nodes=4, cluster=slow, zero_stage=3, dp_shard=8, global_batch_size=64), engine="analytic")
    assert hsdp.step_time_s < full.step_time_s
    assert hsdp.peak_gib > full.peak_gib  # the price: 8x the model states per GPU


def test_zeropp_quantized_weights_halve_the_gather_bytes():
    a = dp_traffic(*_mp(sc_of(nodes=2, zero_stage=3, global_batch_size=64)), 0)
    b = dp_traffic(*_mp(sc_of(nodes=2, zero_stage=3, zero_quantized_weights=True, global_batch_size=64)), 0)
    ratio = b.fwd_gathers[0].total_bytes / a.fwd_gathers[0].total_bytes
    assert ratio == pytest.approx((1 + 4 / QUANT_GROUP) / 2)


def _mp(sc):
    return sc.model, sc.plan


# --- offload -------------------------------------------------------------------------------------


LLAMA7B_1GPU = {"gpus_per_node": 1}


def test_offloaded_optimizer_states_leave_the_gpu_and_fits_flips():
    """Llama 2 7B on one 80 GB GPU: 16 B/param = 100 GiB does not fit; ZeRO-Offload keeps
    2 B/param of weights (12.6 GiB) and moves 12 + 4 B/param (100 GiB) to the host."""
    base = dict(zero_stage=2, global_batch_size=4, recompute="full")
    no = sc_of(cluster=LLAMA7B_1GPU, model="llama2-7b", **base)
    p = total_params(no.model)
    assert states(no) == pytest.approx(16 * p)
    assert not predict(no, engine="analytic").fits
    off = sc_of(cluster=LLAMA7B_1GPU, model="llama2-7b", offload={"optimizer": "cpu"}, **base)
    s = model_state_bytes(off.model, off.plan, 0)
    assert s["optimizer"] == 0
    assert s["host_optimizer"] == pytest.approx(16 * p)  # fp32 master + m + v + fp32 gradients
    assert s["grads"] == pytest.approx(2 * off.plan.ddp_bucket_size_bytes)
    pred = predict(off, engine="analytic")
    assert pred.fits and pred.host_peak_gib == pytest.approx(16 * p / GiB)
    assert "offload" in pred.breakdown_s and pred.breakdown_s["optimizer"] > 1.0  # the CPU Adam step


def test_host_memory_too_small_does_not_fit_and_says_so():
    host = {"cpu_memory": "64 GiB", "pcie_bandwidth": "32 GB/s", "nvme_bandwidth": "7 GB/s",
            "cpu_optimizer_throughput": "1e9 params/s"}
    sc = sc_of(cluster={"gpus_per_node": 1, "host": host}, model="llama2-7b", zero_stage=2,
               offload={"optimizer": "cpu"}, global_batch_size=4, recompute="full")
    pred = predict(sc, engine="analytic")
    assert pred.peak_gib < pred.capacity_gib and pred.host_peak_gib > 64  # 100 GiB > 64 GiB
    assert not pred.fits
    d = pred.to_dict()
    assert d["memory"]["fits"] is False and d["offload"]["host_fits"] is False
    assert any("DOES NOT FIT in host memory" in a for a in d["assumptions"])
    from simdist.table import prediction_report

    assert "DOES NOT FIT (host memory)" in prediction_report(pred)


def test_nvme_offload_is_not_host_memory():
    sc = sc_of(cluster={"gpus_per_node": 1}, model="llama2-7b", zero_stage=3, global_batch_size=4,
               offload={"optimizer": "nvme", "params": "nvme"}, recompute="full")
    s = stage_memory(sc.model, sc.plan, 0)
    p = total_params(sc.model)
    assert s.host == 0 and s.nvme == pytest.approx(18 * p)  # 16 B optimizer side + 2 B weights
    tr = offload_traffic(sc.model, sc.plan, sc.cluster, 0)
    assert tr.nvme_per_step_node == pytest.approx(2 * 16 * p + 2 * p)  # states in and out, weights out


def test_cpu_optimizer_time_is_params_on_node_over_throughput():
    sc = sc_of(zero_stage=2, offload={"optimizer": "cpu"}, global_batch_size=64)
    tr = offload_traffic(sc.model, sc.plan, sc.cluster, 0)
    n = params_per_rank(sc.model, sc.plan, 0)
    assert tr.cpu_params_node == pytest.approx(n)  # 8 GPUs x n/8
    assert cpu_optimizer_time(tr.cpu_params_node, sc.plan, sc.cluster.host) == pytest.approx(n / 2e9)


def test_param_offload_uploads_each_gather():
    sc = sc_of(zero_stage=3, offload={"optimizer": "cpu", "params": "cpu"}, global_batch_size=64, recompute="full")
    tr = offload_traffic(sc.model, sc.plan, sc.cluster, 0)
    n = params_per_rank(sc.model, sc.plan, 0)
    assert tr.pcie_up_per_microbatch == pytest.approx(3 * 2 * n / 8)  # fwd, recompute, bwd


# --- parameter servers ------------------------------------------------------------------------------


ETH = {"gpus_per_node": 1, "gpu": "a100-40gb",
       "intra_node": {"kind": "pcie", "bandwidth": "32 GB/s", "latency": "5 us"},
       "inter_node": {"kind": "ethernet", "nics_per_node": 1, "bandwidth": "25 Gb/s", "latency": "30 us"},
       "host": {"cpu_memory": "85 GiB", "pcie_bandwidth": "32 GB/s", "nvme_bandwidth": "2 GB/s",
                "cpu_optimizer_throughput": "5e8 params/s"}}


@pytest.mark.parametrize("servers", [1, 2, 4, 16])
def test_ps_traffic_per_server_is_2_p_bytes_workers_over_servers(servers):
    sc = sc_of(nodes=16, cluster=ETH, gradient_sync="parameter-server", parameter_servers=servers,
               fp32_grad_accumulation=True, global_batch_size=64)
    tr = ps_traffic(sc.model, sc.plan, sc.cluster)
    p = params_per_rank(sc.model, sc.plan, 0)
    assert tr.workers == 16 and tr.servers == servers
    assert tr.per_server_bytes == pytest.approx(2 * p * 4 * 16 / servers)
    # one server per node: a node's NIC carries 2 x G x (K-1)/K per direction, as a ring would
    if servers == 16:
        assert tr.node_nic_bytes == pytest.approx(2 * p * 4 * 15 / 16)
    if servers == 1:
        assert tr.node_nic_bytes == pytest.approx(p * 4 * 15)  # every remote worker, into one NIC


def test_ps_one_server_is_slow_and_one_per_node_matches_ring():
    kw = dict(nodes=16, cluster=ETH, fp32_grad_accumulation=True, global_batch_size=64)
    ring = predict(sc_of(**kw), engine="analytic").step_time_s
    ps1 = predict(sc_of(gradient_sync="parameter-server", parameter_servers=1, **kw), engine="analytic").step_time_s
    ps16 = predict(sc_of(gradient_sync="parameter-server", **kw), engine="analytic").step_time_s
    assert ps1 > 4 * ring
    assert ps16 == pytest.approx(ring, rel=0.15)


def test_async_ps_reports_staleness_and_pays_an_update_per_push():
    """No barrier: with enough servers the cycle is at most the synchronous step; but each push
    is applied on its own, so the servers do dp times the optimizer work, and with few servers
    their CPUs bound the cycle."""
    kw = dict(nodes=16, cluster=ETH, fp32_grad_accumulation=True, global_batch_size=64)
    sync = predict(sc_of(gradient_sync="parameter-server", **kw), engine="analytic")
    asyn = predict(sc_of(gradient_sync="async-parameter-server", **kw), engine="analytic")
    assert asyn.extras["staleness_steps"] == 15 and "staleness_steps" not in sync.extras
    assert asyn.to_dict()["staleness_steps"] == 15
    assert asyn.step_time_s <= sync.step_time_s * 1.0001
    assert sum(asyn.breakdown_s.values()) == pytest.approx(asyn.step_time_s, rel=1e-9)
    few = predict(sc_of(gradient_sync="async-parameter-server", parameter_servers=4, **kw), engine="analytic")
    t = ps_times(*_mp(sc_of(gradient_sync="async-parameter-server", parameter_servers=4, **kw)),
                         sc_of(**kw).cluster, Network.of(sc_of(**kw).cluster))
    assert few.step_time_s == pytest.approx(t.server_cpu) and few.breakdown_s["optimizer"] > 0
    ps = sc_of(gradient_sync="parameter-server", **kw)
    assert model_state_bytes(ps.model, ps.plan)["optimizer"] == 0  # the servers hold the optimizer


# --- compression -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "grads32", "ratio"), [
    ("fp16", True, 0.5), ("bf16", True, 0.5), ("fp16", False, 1.0),
    ("int8", True, (1 + 4 / 512) / 4), ("int8", False, (1 + 4 / 512) / 2),
])
def test_quantization_shrinks_dp_bytes_by_its_ratio(method, grads32, ratio):
    kw = dict(nodes=2, fp32_grad_accumulation=grads32, global_batch_size=64, overlap_grad_reduce=False)
    plain = sc_of(**kw)
    comp = sc_of(grad_compression={"method": method}, **kw)
    m = plain.plan.num_microbatches
    b0 = dp_traffic(plain.model, plain.plan, 0).step_bytes(m)
    b1 = dp_traffic(comp.model, comp.plan, 0).step_bytes(m)
    assert b1 / b0 == pytest.approx(ratio)
    assert compression_ratio(comp.model, comp.plan) == pytest.approx(ratio)


def test_powersgd_sends_rank_r_factors_and_leaves_1d_tensors():
    sc = sc_of(nodes=2, grad_compression={"method": "powersgd", "rank": 4}, global_batch_size=64)
    m = sc.model
    ps = powersgd_elements(m, sc.plan, 0)
    h, f, layers = m.hidden_size, m.ffn_hidden_size, m.num_layers
    # per layer: Wq, Wk, Wv, Wo (h x h) and fc1 (f x h), fc2 (h x f); plus the (tied) embedding V x h
    # and learned positions s x h (torch's powerSGD_hook compresses every tensor viewed as a matrix
    # that the rank shrinks enough)
    pos = m.seq_length if m.position_embedding == "learned" else 0
    p = layers * 4 * (4 * h + f + h) + 4 * m.vocab_size + 4 * pos
    q = layers * 4 * (4 * h + h + f) + 4 * h + (4 * h if pos else 0)
    assert ps.p == pytest.approx(p) and ps.q == pytest.approx(q)
    assert ps.count == layers * 6 + 1 + (1 if pos else 0)
    n = params_per_rank(m, sc.plan, 0)
    assert ps.uncompressed == pytest.approx(n - ps.matrix)  # biases, norms
    assert compression_ratio(m, sc.plan) == pytest.approx((ps.p + ps.q + ps.uncompressed) / n)
    assert compression_ratio(m, sc.plan) < 0.02


def test_topk_is_all_gathered_so_its_cost_grows_with_dp():
    def ag_bytes(nodes):
        sc = sc_of(nodes=nodes, grad_compression={"method": "topk", "ratio": 0.01}, global_batch_size=64 * nodes)
        tr = dp_traffic(sc.model, sc.plan, 0)
        (call,) = tr.step_grad_sync
        assert call.kind == "allgather"
        n = params_per_rank(sc.model, sc.plan, 0)
        assert call.total_bytes == pytest.approx(sc.plan.dp * 0.01 * n * (2 + 4))  # values + int32 indices
        return call.total_bytes

    assert ag_bytes(4) == pytest.approx(4 * ag_bytes(1))


def test_error_feedback_buffer_is_in_gpu_other_memory():
    a = sc_of(nodes=2, global_batch_size=64)
    b = sc_of(nodes=2, grad_compression={"method": "topk", "ratio": 0.01, "error_feedback": True}, global_batch_size=64)
    n = params_per_rank(a.model, a.plan, 0)
    extra = stage_memory(b.model, b.plan, 0).other - stage_memory(a.model, a.plan, 0).other
    assert extra == pytest.approx(n * 2 + 16 * 0.01 * n * 6)  # residual + gathered values/indices


def test_compression_breakdown_key_and_sum():
    sc = sc_of(nodes=2, zero_stage=2, grad_compression={"method": "int8"}, global_batch_size=64)
    p = predict(sc, engine="analytic")
    assert p.breakdown_s["compression"] > 0
    assert sum(p.breakdown_s.values()) == pytest.approx(p.step_time_s, rel=1e-9)
    assert "compression" not in predict(sc_of(nodes=2, global_batch_size=64), engine="analytic").breakdown_s


# --- DDP buckets ------------------------------------------------------------------------------------------


def test_bucketed_overlap_closed_form():
    assert bucketed_exposed(2.0, 1, 10.0) == 2.0  # one bucket: nothing to overlap with
    assert bucketed_exposed(0.1, 10, 10.0) == pytest.approx(0.1)  # keeps up: the last bucket
    # comm-bound: first bucket ready at T/n, then n back-to-back buckets
    assert bucketed_exposed(2.0, 10, 10.0) == pytest.approx(10.0 / 10 + 10 * 2.0 - 10.0)
    assert bucketed_exposed(2.0, 10, 10.0, overlap=False) == pytest.approx(20.0)


def test_bucket_size_trades_latency_for_overlap():
    """On a slow high-latency network: one huge bucket exposes the whole all-reduce; tiny buckets
    pay the ring latency per bucket; the default sits between them."""
    cl = {"inter_node": {"kind": "ethernet", "nics_per_node": 1, "bandwidth": "100 Gb/s", "latency": "50 us"}}
    t = {b: predict(sc_of(nodes=4, cluster=cl, global_batch_size=32, ddp_bucket_size=b), engine="analytic")
         .breakdown_s["dp_comm"] for b in ("256 KiB", "25 MiB", "16 GiB")}
    assert t["25 MiB"] < t["16 GiB"] and t["25 MiB"] < t["256 KiB"]


# --- optimizers ---------------------------------------------------------------------------------------------


def test_optimizer_state_bytes_and_step_traffic():
    m = sc_of().model
    assert optimizer_state_bytes_per_param(m, "adam") == optimizer_state_bytes_per_param(m, "lamb") == 8
    assert optimizer_state_bytes_per_param(m, "sgd") == optimizer_state_bytes_per_param(m, "lars") == 4
    assert 4 < optimizer_state_bytes_per_param(m, "adafactor") < 4.1  # HF docs: "slightly more than 4"
    traffic = {o: optimizer_bytes_per_param(o, "bf16", 2.0) for o in ("adam", "sgd", "lars", "lamb", "adafactor")}
    assert traffic["adam"] == 30  # 2 x (4 + 8) + 2 + 2 + 2
    assert traffic["lars"] == traffic["sgd"] + 4 + 2  # trust ratio: one more read of weights and grads
    assert traffic["lamb"] == traffic["adam"] + 16  # update written, norms, update read again
    assert traffic["sgd"] < traffic["adam"] < traffic["lamb"]


# --- validation of the new fields ------------------------------------------------------------------------


@pytest.mark.parametrize(("plan", "field"), [
    ({"dp_shard": 3}, "plan.dp_shard"),
    ({"dp_shard": 0}, "plan.dp_shard"),
    ({"offload": {"optimizer": "gpu"}, "zero_stage": 2}, "plan.offload.optimizer"),
    ({"offload": {"params": "cpu"}, "zero_stage": 2}, "plan.offload.params"),
    ({"offload": {"optimizer": "cpu"}}, "plan.offload.optimizer"),
    ({"gradient_sync": "gossip"}, "plan.gradient_sync"),
    ({"gradient_sync": "parameter-server", "zero_stage": 3}, "plan.gradient_sync"),
    ({"parameter_servers": 0}, "plan.parameter_servers"),
    ({"grad_compression": {"method": "zip"}}, "plan.grad_compression.method"),
    ({"grad_compression": {"method": "topk", "ratio": 2}}, "plan.grad_compression.ratio"),
    ({"grad_compression": {"method": "powersgd", "rank": 0}}, "plan.grad_compression.rank"),
    ({"grad_compression": {"method": "powersgd"}, "zero_stage": 2}, "plan.grad_compression.method"),
    ({"ddp_bucket_size": 25}, "plan.ddp_bucket_size"),
    ({"optimizer": "adagrad"}, "plan.optimizer"),
    ({"zero_quantized_weights": True, "zero_stage": 1}, "plan.zero_quantized_weights"),
])
def test_bad_new_plan_fields_are_named(plan, field):
    with pytest.raises(ScenarioError) as exc:
        scenario_from_dict(base_scenario(**plan))
    assert field in {p.field for p in exc.value.problems}, exc.value


def test_bad_host_field_exits_2_from_the_cli(tmp_path):
    import yaml

    d = base_scenario(zero_stage=2, offload={"optimizer": "cpu"})
    d["cluster"]["host"] = {"pcie_bandwidth": 32}  # no unit
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(d))
    r = run_cli("predict", str(f), "--engine", "analytic")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "cluster.host.pcie_bandwidth" in r.stderr


def test_bad_offload_device_exits_2_from_the_cli(tmp_path):
    import yaml

    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(base_scenario(zero_stage=3, offload={"params": "disk"})))
    r = run_cli("predict", str(f), "--json")
    assert r.returncode == 2 and "plan.offload.params" in r.stderr and "Traceback" not in r.stderr


# --- the scenarios ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", NEW_SCENARIOS, ids=lambda p: p.name)
def test_new_scenarios_predict(path):
    sc = load_scenario(path)
    p = predict(sc, engine="analytic", keep_spans=False)
    assert p.step_time_s > 0 and 0 < p.mfu < 1
    assert sum(p.breakdown_s.values()) == pytest.approx(p.step_time_s, rel=0.01)


def test_scenario_answers():
    """The questions the scenarios ask, answered as their comments say."""
    def pred(name):
        return predict(load_scenario(REPO / "scenarios" / f"{name}.yaml"), engine="analytic", keep_spans=False)

    assert not pred("llama2-7b-1xa100").fits and pred("llama2-7b-zero-offload-1xa100").fits
    assert not pred("llama2-70b-zero2-8xa100").fits and not pred("llama2-70b-zero3-4xa100").fits
    assert pred("llama2-70b-zero3-offload-2xa100").fits
    ring = pred("gpt3-1.3b-16x1gpu-25gbe-ring").step_time_s
    assert pred("gpt3-1.3b-16x1gpu-25gbe-ps1").step_time_s > 4 * ring
    assert pred("gpt3-1.3b-16x1gpu-25gbe-ps16").step_time_s == pytest.approx(ring, rel=0.15)
    assert pred("gpt3-1.3b-16x1gpu-25gbe-powersgd").step_time_s < 0.6 * ring
    assert pred("llama3-70b-hsdp-256xh100").peak_gib > pred("llama3-70b-fsdp-256xh100").peak_gib


def test_contract_json_of_an_offload_scenario():
    r = run_cli("predict", "scenarios/llama2-7b-zero-offload-1xa100.yaml", "--json", "--engine", "analytic")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert "offload" in d["breakdown_s"]
    assert sum(d["breakdown_s"].values()) == pytest.approx(d["step_time_s"], rel=0.01)
    assert d["memory"]["fits"] and d["memory"]["host_peak_gib"] < d["memory"]["host_capacity_gib"]
