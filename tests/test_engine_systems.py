"""The discrete-event engine simulates every mechanism beyond 3D parallelism itself (offload,
parameter servers, gradient compression) and shows how stragglers are absorbed: no closed-form
fallback, agreement with the closed form where nothing contends beyond what it models, the
server NIC as the bottleneck of one parameter server, staleness of asynchronous servers from
the simulated order of pushes and pulls, breakdowns that sum, determinism."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from conftest import REPO

from simdist.analytic.collectives import DEEPSPEED_ZERO3_BUSBW, Network
from simdist.analytic.compression import compression_ratio
from simdist.analytic.cost import CostModel, cpu_optimizer_time
from simdist.analytic.data_parallel import dp_traffic
from simdist.analytic.offload import offload_traffic
from simdist.analytic.param_server import async_staleness_steps
from simdist.analytic.params import params_per_rank
from simdist.analytic.stage import describe
from simdist.predict import predict
from simdist.results import BREAKDOWN_KEYS
from simdist.sim.lowering import lower
from simdist.sim.work import CommSpec, PsSpec
from simdist.spec.scenario import Scenario, load_scenario, scenario_from_dict

AGREEING = ["llama2-7b-zero-offload-1xa100", "gpt3-1.3b-16x1gpu-25gbe-ring",
            "gpt3-1.3b-16x1gpu-25gbe-ps1", "gpt3-1.3b-16x1gpu-25gbe-ps16", "gpt3-1.3b-16x1gpu-25gbe-powersgd"]
FALLBACK = ("closed-form step time used", "does not simulate")


def scenario(name: str) -> Scenario:
    return load_scenario(REPO / "scenarios" / f"{name}.yaml")


def variant(name: str, cluster: dict[str, Any] | None = None, **plan: Any) -> Scenario:
    """A scenario file with some plan (and cluster) fields changed."""
    d = yaml.safe_load((REPO / "scenarios" / f"{name}.yaml").read_text())
    d["plan"].update(plan)
    d["cluster"].update(cluster or {})
    return scenario_from_dict(d)


def ethernet(workers: int = 16, **plan: Any) -> Scenario:
    """GPT-3 1.3B on one-GPU nodes over 25 GbE (the ps/ring scenarios), big buckets so that
    full fidelity stays fast."""
    plan.setdefault("ddp_bucket_size", "256 MiB")
    plan.setdefault("global_batch_size", 16 * workers)
    plan.setdefault("parameter_servers", workers)  # one per node
    return variant("gpt3-1.3b-16x1gpu-25gbe-ps16", cluster={"num_nodes": workers}, **plan)


def make(model: str = "gpt3-1.3b", nodes: int = 1, gpus_per_node: int = 8, host: dict | None = None,
         **plan: Any) -> Scenario:
    plan.setdefault("global_batch_size", 16)
    cluster: dict[str, Any] = {"preset": "dgx-a100-80gb", "num_nodes": nodes, "gpus_per_node": gpus_per_node}
    if host:
        cluster["host"] = host
    return scenario_from_dict({"name": "t", "model": {"preset": model}, "cluster": cluster, "plan": plan})


def des(sc: Scenario, **kw: Any):
    kw.setdefault("keep_spans", False)
    return predict(sc, engine="des", **kw)


def sums(pred) -> None:
    assert all(v >= -1e-12 for v in pred.breakdown_s.values()), pred.breakdown_s
    assert sum(pred.breakdown_s.values()) == pytest.approx(pred.step_time_s, rel=0.01)


# --- every mechanism through the engine ---------------------------------------------------------


MECHANISMS = {
    "zero-offload (ZeRO-2, 1 GPU)": lambda: scenario("llama2-7b-zero-offload-1xa100"),
    "zero-infinity params+optimizer on cpu": lambda: scenario("llama2-70b-zero3-offload-2xa100"),
    "optimizer and params on nvme": lambda: make("llama2-7b", zero_stage=3, recompute="full",
                                                 offload={"optimizer": "nvme", "params": "nvme"}),
    "zero-1 optimizer offload, dp 8": lambda: make(zero_stage=1, offload={"optimizer": "cpu"}),
    "fsdp param offload, gpu optimizer": lambda: make(zero_stage=3, offload={"params": "cpu"}),
    "sync parameter servers": lambda: scenario("gpt3-1.3b-16x1gpu-25gbe-ps1"),
    "async parameter servers": lambda: ethernet(4, gradient_sync="async-parameter-server"),
    "powersgd": lambda: scenario("gpt3-1.3b-16x1gpu-25gbe-powersgd"),
    "top-k": lambda: ethernet(4, gradient_sync="allreduce", grad_compression={"method": "topk", "ratio": 0.01}),
    "int8 with ZeRO-2": lambda: make(zero_stage=2, grad_compression={"method": "int8"}),
    "compressed pushes": lambda: ethernet(4, grad_compression={"method": "bf16"}),
    "pipeline + offload": lambda: make("llama2-7b", gpus_per_node=4, pp=2, zero_stage=1,
                                       offload={"optimizer": "cpu"}),
}


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_each_mechanism_runs_through_the_engine(name: str) -> None:
    sc = MECHANISMS[name]()
    pred = des(sc, keep_spans=True)
    assert not any(f in a for a in pred.assumptions for f in FALLBACK)
    assert pred.spans, "the engine produced no spans: it did not simulate"
    keys = list(BREAKDOWN_KEYS)
    plan = sc.plan
    if plan.offload.any:
        keys.append("offload")
    if plan.grad_compression.enabled:
        keys.append("compression")
    assert list(pred.breakdown_s) == keys
    sums(pred)
    names = {s.name for s in pred.spans}
    if plan.offload.optimizer != "none":
        assert "CPU optimizer step" in names
    if plan.gradient_sync != "allreduce":
        assert any(n.startswith("push ") for n in names) and any(n.startswith("pull ") for n in names)
    if plan.grad_compression.enabled and plan.dp > 1:
        assert pred.breakdown_s["compression"] > 0 and "compress gradients" in names
    json.dumps(pred.to_dict())  # extras are plain JSON


@pytest.mark.parametrize("name", AGREEING)
def test_agrees_with_the_closed_form(name: str) -> None:
    """Nothing contends here beyond what the closed form models (differences in the report)."""
    sc = scenario(name)
    d, a = des(sc), predict(sc, engine="analytic")
    assert d.step_time_s == pytest.approx(a.step_time_s, rel=0.03)
    assert d.breakdown_s["compute"] == pytest.approx(a.breakdown_s["compute"], rel=1e-6)
    for key in ("offload", "compression"):
        assert (key in d.breakdown_s) == (key in a.breakdown_s)


def test_offloaded_deepspeed_fetch_couples_upload_and_gather() -> None:
    """ZeRO-Infinity on 2 GPUs (DeepSpeed fetch, parameters on the host): each layer's shard
    comes up over PCIe before its all-gather, and the gathers run at DeepSpeed's fetch ceiling,
    so both chains are longer than the layer's compute. The event engine runs them as the chain
    they are (a layer's gather waits for its upload); the closed form overlaps each alone, so
    the engine's step is longer, by less than a quarter, with the same compute."""
    sc = scenario("llama2-70b-zero3-offload-2xa100")
    d, a = des(sc), predict(sc, engine="analytic")
    assert a.step_time_s < d.step_time_s < 1.25 * a.step_time_s
    assert d.breakdown_s["compute"] == pytest.approx(a.breakdown_s["compute"], rel=1e-6)


# --- parameter servers ---------------------------------------------------------------------------


def test_one_server_is_a_bottleneck_sixteen_relieve_it() -> None:
    one, sixteen = des(scenario("gpt3-1.3b-16x1gpu-25gbe-ps1")), des(scenario("gpt3-1.3b-16x1gpu-25gbe-ps16"))
    assert one.step_time_s > 4 * sixteen.step_time_s
    # every worker's push goes into node 0's NIC: it carries 15/16 of the traffic, busy most of the step
    ps1 = one.extras["parameter_servers"]
    assert ps1["bottleneck_link"] == "nic0.0~leaf0 down"
    assert ps1["bottleneck_busy_fraction"] > 0.85
    assert sixteen.extras["parameter_servers"]["bottleneck_busy_fraction"] < ps1["bottleneck_busy_fraction"]
    # the same with every worker simulated on its own: the contention comes out of the fluid network
    full1, full16 = (des(ethernet(parameter_servers=k), fidelity="full") for k in (1, 16))
    assert full1.step_time_s > 4 * full16.step_time_s
    assert full1.extras["parameter_servers"]["bottleneck_link"] == "nic0.0~leaf0 down"


def test_server_cpu_can_be_the_bottleneck() -> None:
    """Asynchronous servers update on every push: 4 servers' CPUs cannot keep up with 16 workers."""
    sc = ethernet(16, gradient_sync="async-parameter-server", parameter_servers=4)
    pred = des(sc)
    assert pred.extras["parameter_servers"]["bottleneck_link"].startswith("cpu")
    assert pred.step_time_s == pytest.approx(predict(sc, engine="analytic").step_time_s, rel=0.05)


def test_async_staleness_from_the_simulated_order() -> None:
    sc = ethernet(8, gradient_sync="async-parameter-server")
    pred = des(sc)
    st = pred.extras["staleness"]
    assert st["closed_form_steps"] == async_staleness_steps(sc.plan) == 7
    assert pred.extras["staleness_steps"] == st["mean_steps"]
    assert st["mean_steps"] == pytest.approx(7, abs=1.0)  # W - 1 other updates between pull and push
    assert pred.to_dict()["staleness_steps"] == st["mean_steps"]  # the simulated figure wins
    assert any("full fidelity used" in a for a in pred.assumptions)
    sums(pred)


# --- offload ----------------------------------------------------------------------------------------


def test_offload_shifts_time_into_offload_and_the_cpu() -> None:
    sc = scenario("llama2-7b-zero-offload-1xa100")
    pred = des(sc)
    host = sc.cluster.host
    tr = offload_traffic(sc.model, sc.plan, sc.cluster, 0)
    cpu = cpu_optimizer_time(tr.cpu_params_node, sc.plan, host)
    assert pred.breakdown_s["optimizer"] == pytest.approx(cpu, rel=1e-6)  # the CPU step, not the GPU's
    assert pred.extras["offload"]["cpu_busy_s"] == pytest.approx(cpu, rel=1e-6)
    # a slower PCIe link: more exposed offload, the same compute
    slow = variant("llama2-7b-zero-offload-1xa100", cluster={"host": {**yaml.safe_load(
        (REPO / "scenarios" / "llama2-7b-zero-offload-1xa100.yaml").read_text())["cluster"]["host"],
        "pcie_bandwidth": "4 GB/s"}})
    slower = des(slow)
    assert slower.breakdown_s["offload"] > 4 * pred.breakdown_s["offload"]
    assert slower.breakdown_s["compute"] == pytest.approx(pred.breakdown_s["compute"])
    assert slower.step_time_s == pytest.approx(predict(slow, engine="analytic").step_time_s, rel=0.05)


def test_nvme_is_shared_by_the_nodes_gpus() -> None:
    """ZeRO-Infinity with the optimizer states on NVMe: the node's 8 GPUs share one NVMe, so the
    swap takes the node's bytes over its bandwidth, in full and in symmetric fidelity."""
    host = {"cpu_memory": "2 TiB", "pcie_bandwidth": "32 GB/s", "nvme_bandwidth": "2 GB/s",
            "cpu_optimizer_throughput": "1e12 params/s"}  # a fast CPU: the NVMe swap is what shows
    sc = make(zero_stage=1, offload={"optimizer": "nvme"}, host=host)
    tr = offload_traffic(sc.model, sc.plan, sc.cluster, 0)
    node_swap = tr.nvme_per_step_node / sc.cluster.host.nvme_bandwidth_bytes_per_s
    for fidelity in ("symmetric", "full"):
        pred = des(sc, fidelity=fidelity)
        assert pred.breakdown_s["offload"] >= 0.95 * node_swap
        assert pred.step_time_s == pytest.approx(predict(sc, engine="analytic").step_time_s, rel=0.05)


# --- compression --------------------------------------------------------------------------------------


def dp_bytes(sc: Scenario) -> float:
    """Bytes one GPU puts into gradient collectives in a step (the lowered DP traffic)."""
    lw = lower(describe(sc, CostModel(sc.cluster.gpu, sc.plan.precision), Network.of(sc.cluster)))
    total = 0.0
    for chunk in lw.stages[0].chunks:
        for (_, last), task in chunk.tasks.items():
            times = 1 if last else sc.plan.num_microbatches - (1 if any(k[1] for k in chunk.tasks) else 0)
            total += times * sum(c.nbytes for p in task.pieces for c in p.comms if isinstance(c, CommSpec))
    return total


def test_compression_shrinks_dp_bytes_and_adds_kernels() -> None:
    ring, psgd = scenario("gpt3-1.3b-16x1gpu-25gbe-ring"), scenario("gpt3-1.3b-16x1gpu-25gbe-powersgd")
    ratio = dp_bytes(psgd) / dp_bytes(ring)
    assert ratio == pytest.approx(compression_ratio(psgd.model, psgd.plan), rel=0.02)
    assert ratio < 0.01
    a, b = des(ring), des(psgd)
    assert "compression" not in a.breakdown_s and b.breakdown_s["compression"] > 0
    assert b.breakdown_s["dp_comm"] < 0.01 * a.breakdown_s["dp_comm"]
    assert b.step_time_s < 0.5 * a.step_time_s
    # the kernels are the closed form's memory-bound time, on the compute stream
    assert b.breakdown_s["compression"] == pytest.approx(predict(psgd, engine="analytic").breakdown_s["compression"],
                                                         rel=0.01)


def test_topk_is_an_allgather_and_pushes_shrink() -> None:
    pred = des(ethernet(4, gradient_sync="allreduce", grad_compression={"method": "topk", "ratio": 0.01}),
               keep_spans=True)
    assert any(s.name.startswith("allgather dp") for s in pred.spans)
    plain, bf16 = ethernet(4), ethernet(4, grad_compression={"method": "bf16"})
    lw = lower(describe(bf16, CostModel(bf16.cluster.gpu, "bf16"), Network.of(bf16.cluster)))
    pushed = sum(c.nbytes for ch in lw.stages[0].chunks for t in ch.tasks.values() for p in t.pieces
                 for c in p.comms if isinstance(c, PsSpec))
    assert pushed == pytest.approx(params_per_rank(bf16.model, bf16.plan, 0) * 2, rel=1e-9)  # fp32 -> bf16
    assert des(bf16).step_time_s < des(plain).step_time_s


# --- stragglers -------------------------------------------------------------------------------------


def test_straggler_in_sync_dp_slows_the_step_by_its_compute_share() -> None:
    sc = make(global_batch_size=64)  # dp 8 over NVSwitch: compute-bound
    base = des(sc, fidelity="full")
    slow = des(sc, stragglers={3: 2.0})
    st = slow.extras["stragglers"]
    share = st["extra_work_s"] / base.step_time_s  # (factor - 1) x its compute / step
    assert share > 0.8
    assert slow.step_time_s / base.step_time_s == pytest.approx(1 + share, rel=0.05)
    assert st["mode"] == "sync-dp" and st["critical_fraction"] == pytest.approx(1.0, abs=0.1)
    assert st["uniform_step_s"] == pytest.approx(base.step_time_s)
    assert any(a.startswith("stragglers (rank 3") for a in slow.assumptions)
    sums(slow)


def test_pipeline_bubbles_absorb_part_of_a_slow_stage() -> None:
    sc = make(gpus_per_node=4, pp=4, global_batch_size=8)  # the last stage (LM head) is the slowest
    first = des(sc, stragglers={0: 2.0}).extras["stragglers"]
    last = des(sc, stragglers={3: 2.0}).extras["stragglers"]
    assert first["mode"] == "pipeline"
    assert first["absorbed_fraction"] > 0.3  # stage 0 had slack
    assert last["absorbed_fraction"] < 0.05  # the bottleneck stage had none
    node = des(sc, stragglers={-1: 2.0}).extras["stragglers"]  # the whole node: every stage
    assert node["slowdown"] == pytest.approx(2.0, rel=0.02)


def test_async_servers_absorb_a_straggler_sync_ones_do_not() -> None:
    sync_sc = ethernet(8)
    async_sc = ethernet(8, gradient_sync="async-parameter-server")
    sync = des(sync_sc, stragglers={0: 2.0}).extras["stragglers"]
    asy = des(async_sc, stragglers={0: 2.0})
    st = asy.extras["stragglers"]
    assert sync["mode"] == "sync-ps" and st["mode"] == "async-ps"
    assert sync["slowdown"] > 1.15
    assert st["slowdown"] < 1 + (sync["slowdown"] - 1) / 3  # the others keep going
    assert st["throughput_ratio"] == pytest.approx(1 / st["slowdown"])
    assert st["straggler_staleness_steps"] > st["uniform_staleness_steps"]  # its updates are staler
    sums(asy)


# --- determinism -------------------------------------------------------------------------------------


@pytest.mark.parametrize("make_sc,kw", [
    (lambda: scenario("llama2-70b-zero3-offload-2xa100"), {}),
    (lambda: ethernet(4, gradient_sync="async-parameter-server"), {"stragglers": {1: 1.5}}),
    (lambda: ethernet(4, parameter_servers=1), {"fidelity": "full"}),
])
def test_deterministic(make_sc, kw: dict[str, Any]) -> None:
    a = predict(make_sc(), keep_spans=True, **kw)
    b = predict(make_sc(), keep_spans=True, **kw)
    assert a.step_time_s == b.step_time_s
    assert a.breakdown_s == b.breakdown_s
    assert a.spans == b.spans
    assert a.extras == b.extras


def test_deepspeed_fetch_ceiling_paces_zero3_in_both_engines() -> None:
    """DeepSpeed's per-submodule ZeRO-3 fetch (zero3_fetch: module) runs at no more than
    DEEPSPEED_ZERO3_BUSBW per GPU, however fast the links: on four NVSwitch + 8 x HDR
    nodes with one micro-batch of one sequence the step is paced by the bytes every GPU's
    collectives move over that ceiling (they share it, so the step is at least their sum), while
    FSDP-style layer gathers (zero3_fetch: layer) of the same bytes run at the network's speed."""
    kw = dict(nodes=4, zero_stage=3, recompute="full", micro_batch_size=1, global_batch_size=32)
    ds, fsdp = make(zero3_fetch="module", **kw), make(zero3_fetch="layer", **kw)
    tr = dp_traffic(ds.model, ds.plan, 0)
    n = ds.plan.dp
    moved = sum(c.total_bytes for c in tr.fwd_gathers + tr.bwd_gathers + tr.microbatch_grad_sync) * (n - 1) / n
    floor = moved / DEEPSPEED_ZERO3_BUSBW
    for engine in ("analytic", "des"):
        t_ds = predict(ds, engine=engine, keep_spans=False).step_time_s
        t_fsdp = predict(fsdp, engine=engine, keep_spans=False).step_time_s
        assert floor <= t_ds <= 1.15 * floor, (engine, t_ds, floor)
        assert t_fsdp < 0.5 * t_ds, (engine, t_fsdp, t_ds)
