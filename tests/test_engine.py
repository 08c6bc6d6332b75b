"""The discrete-event engine: pipeline bubbles against the closed forms, agreement with the
analytic engine where nothing overlaps, fidelity modes, stragglers, determinism, contention."""

from __future__ import annotations

import math
from typing import Any

import pytest

from simdist.analytic.collectives import (
    DEEPSPEED_ZERO3_BUSBW,
    Network,
    collective_time,
    layout_for_axis,
)
from simdist.analytic.cost import CostModel
from simdist.analytic.stage import describe
from simdist.predict import predict
from simdist.results import BREAKDOWN_KEYS
from simdist.sim import kernel
from simdist.sim.engine import simulate
from simdist.sim.lowering import lower
from simdist.sim.network import FluidNetwork, LinkModel, software_resource
from simdist.sim.schedules import schedule, simulate_unit_times
from simdist.spec import topology as topo
from simdist.spec.scenario import Scenario, scenario_from_dict


def make(model: str = "gpt3-1.3b", cluster: str = "dgx-a100-80gb", nodes: int = 1,
         gpus_per_node: int = 8, **plan: Any) -> Scenario:
    plan.setdefault("global_batch_size", 16)
    return scenario_from_dict({"name": "t", "model": {"preset": model},
                               "cluster": {"preset": cluster, "num_nodes": nodes, "gpus_per_node": gpus_per_node},
                               "plan": plan})


FREE_NET = Network(intra_bw=1e30, intra_latency=0.0, inter_bw_node=1e30, inter_latency=0.0,
                   nvls=False, intra_line_rate=1e30)


class LayerOnlyCost(CostModel):
    """Transformer layers at their usual cost; embedding, LM head and optimizer free, so every
    pipeline stage does the same work (the closed-form bubbles assume uniform stages)."""

    FREE = ("embedding", "final norm", "lm head", "cross entropy")

    def time(self, op):  # type: ignore[override]
        return 0.0 if op.name.startswith(self.FREE) else super().time(op)

    @property
    def memory_bandwidth(self) -> float:
        return math.inf

    @property
    def kernel_overhead(self) -> float:
        return 0.0


def free_run(sc: Scenario):
    cost = LayerOnlyCost(sc.cluster.gpu, sc.plan.precision)
    described = describe(sc, cost, FREE_NET)
    return simulate(described, keep_spans=False), lower(described)


def stage_times(lowered, kinds: str = "FBW") -> dict[str, float]:
    """Per-stage F / B / W time summed over chunks (stage 0; all stages are equal here)."""
    st = lowered.stages[0]
    out = {}
    for k in kinds:
        out[k] = sum(c.tasks[(k, False)].work.total() for c in st.chunks if (k, False) in c.tasks)
    return out


# --- pipeline bubbles with free communication ------------------------------------------------


@pytest.mark.parametrize("name,p,m,v", [("1f1b", 4, 8, 1), ("gpipe", 4, 8, 1), ("1f1b", 8, 5, 1),
                                         ("interleaved-1f1b", 4, 8, 2), ("interleaved-1f1b", 2, 6, 3)])
def test_bubble_matches_closed_form(name: str, p: int, m: int, v: int) -> None:
    sc = make(gpus_per_node=p, pp=p, virtual_pipeline_stages=v, schedule=name, global_batch_size=m)
    assert sc.plan.dp == 1 and sc.plan.num_microbatches == m
    res, lowered = free_run(sc)
    expected = (p - 1) / (v * m + p - 1)
    assert res.bubble_fraction == pytest.approx(expected, rel=1e-6)
    t = stage_times(lowered, "FB")
    makespan, _ = simulate_unit_times(schedule(name, p, m, v), p, v, t["F"], t["B"])
    assert res.step_time == pytest.approx(makespan, rel=1e-6)


def test_zero_bubble_matches_unit_time_evaluator() -> None:
    p, m = 4, 8
    sc = make(gpus_per_node=p, pp=p, schedule="zero-bubble", global_batch_size=m)
    res, lowered = free_run(sc)
    t = stage_times(lowered)
    assert t["W"] > 0
    makespan, _ = simulate_unit_times(schedule("zero-bubble", p, m), p, 1, t["F"], t["B"], t["W"])
    assert res.step_time == pytest.approx(makespan, rel=1e-6)


# --- agreement with the closed-form engine ------------------------------------------------------


@pytest.mark.parametrize("kwargs", [
    {"gpus_per_node": 1, "global_batch_size": 4},  # a single GPU
    {"tp": 8, "global_batch_size": 8},  # pure TP in one node
    {"nodes": 4, "tp": 8, "pp": 4, "global_batch_size": 16},  # pp across nodes, no dp
    {"tp": 2, "pp": 4, "global_batch_size": 16},  # pp inside a node, no dp
    {"nodes": 2, "tp": 8, "pp": 2, "virtual_pipeline_stages": 2, "global_batch_size": 16},
    {"nodes": 4, "tp": 8, "global_batch_size": 16, "overlap_grad_reduce": False},  # DDP after backward
])
def test_agrees_with_analytic_without_overlap(kwargs: dict[str, Any]) -> None:
    sc = make(**kwargs)
    assert sc.plan.dp == 1 or not sc.plan.overlap_grad_reduce
    des = predict(sc, engine="des", keep_spans=False)
    ana = predict(sc, engine="analytic")
    assert des.step_time_s == pytest.approx(ana.step_time_s, rel=0.02)
    assert des.breakdown_s["compute"] == pytest.approx(ana.breakdown_s["compute"], rel=1e-9)


@pytest.mark.parametrize("model,nodes", [("llama2-7b", 2), ("gpt3-13b", 4)])
def test_zero3_without_overlap_param_gather_agrees_with_analytic(model: str, nodes: int) -> None:
    """ZeRO-3 without overlap_param_gather: no gather prefetched, every reduce-scatter waited
    for, in both engines (the event engine used to prefetch anyway: -17% and -32% here)."""
    steps = {}
    for overlap in (True, False):
        sc = make(model=model, nodes=nodes, zero_stage=3, global_batch_size=16 * nodes,
                  overlap_param_gather=overlap)
        des, ana = predict(sc, keep_spans=False), predict(sc, engine="analytic")
        assert des.step_time_s == pytest.approx(ana.step_time_s, rel=1e-6)
        assert des.breakdown_s["dp_comm"] == pytest.approx(ana.breakdown_s["dp_comm"], rel=1e-6)
        steps[overlap] = des.step_time_s
    assert steps[False] > 1.1 * steps[True]


# --- fidelity, stragglers, determinism ------------------------------------------------------------


def test_full_fidelity_agrees_with_symmetric() -> None:
    sc = make(nodes=8, tp=4, pp=2, global_batch_size=32, zero_stage=1)  # 64 GPUs, dp 8
    assert sc.world_size == 64 and sc.plan.dp == 8
    sym = predict(sc, fidelity="symmetric", keep_spans=False)
    full = predict(sc, fidelity="full", keep_spans=False)
    assert full.step_time_s == pytest.approx(sym.step_time_s, rel=0.01)


def test_straggler_slows_the_synchronous_step() -> None:
    sc = make(nodes=2, tp=4, pp=2, global_batch_size=16)  # dp 2
    base = predict(sc, fidelity="full", keep_spans=False).step_time_s
    one = predict(sc, fidelity="full", keep_spans=False, stragglers={0: 2.0}).step_time_s
    node = predict(sc, fidelity="full", keep_spans=False, stragglers={-2: 2.0}).step_time_s
    # rank 0 is in stage 0 of replica 0: its compute doubles, the pipeline and the DP sync wait
    assert 1.3 < one / base <= 2.05
    assert 1.3 < node / base <= 2.05


def test_deterministic() -> None:
    sc = make(nodes=4, tp=4, pp=4, virtual_pipeline_stages=2, global_batch_size=32)
    a = predict(sc, keep_spans=True)
    b = predict(sc, keep_spans=True)
    assert a.step_time_s == b.step_time_s
    assert a.breakdown_s == b.breakdown_s
    assert a.spans == b.spans


@pytest.mark.parametrize("plan", [
    {"tp": 4, "pp": 4, "virtual_pipeline_stages": 2},
    {"tp": 4, "pp": 4, "schedule": "zero-bubble"},
    {"tp": 4, "pp": 2, "schedule": "gpipe", "recompute": "full"},
    {"tp": 2, "zero_stage": 2},
    {"tp": 1, "zero_stage": 3},
    {"tp": 1, "zero_stage": 3, "dp_shard": 8},
    {"tp": 4, "cp": 2, "sequence_parallel": True, "zero_stage": 1},
    {"tp": 8, "pp": 2, "overlap_grad_reduce": False},
])
def test_breakdown_sums_to_step_time(plan: dict[str, Any]) -> None:
    sc = make(model="llama2-7b", nodes=4, global_batch_size=32, **plan)
    res = predict(sc, keep_spans=False)
    assert tuple(res.breakdown_s) == BREAKDOWN_KEYS + (("cp_comm",) if sc.plan.cp > 1 else ())  # contract v1.2
    assert all(v >= 0 for v in res.breakdown_s.values())
    assert sum(res.breakdown_s.values()) == pytest.approx(res.step_time_s, rel=0.01)
    assert 0.0 <= res.bubble_fraction < 1.0


def test_spans_and_assumptions() -> None:
    sc = make(nodes=2, tp=4, pp=2, global_batch_size=16)
    res = predict(sc, keep_spans=True)
    names = {s.name for s in res.spans}
    assert "F mb0 chunk0" in names and "B mb7 chunk0" in names and "optimizer" in names
    assert any(n.startswith("sendrecv pp") for n in names)
    assert any(n.startswith("allreduce dp") for n in names)
    assert {s.rank for s in res.spans} == {0, 4}  # one representative per stage
    assert all(s.end >= s.start for s in res.spans)
    assert any("symmetric fidelity: 2 representative ranks" in a for a in res.assumptions)
    assert predict(sc, keep_spans=False).spans == ()
    full = predict(sc, fidelity="full", keep_spans=True)
    assert {s.rank for s in full.spans} == set(range(16))


def test_offload_is_simulated_not_handed_to_the_closed_form() -> None:
    sc = make(model="llama2-7b", nodes=2, tp=1, zero_stage=2, global_batch_size=32, offload={"optimizer": "cpu"})
    des = predict(sc, keep_spans=False)
    assert des.step_time_s == pytest.approx(predict(sc, engine="analytic").step_time_s, rel=0.05)
    assert not any("closed-form step time used" in a for a in des.assumptions)
    assert des.breakdown_s["offload"] > 0


def test_rejects_unknown_fidelity() -> None:
    sc = make(nodes=1, tp=8, global_batch_size=8)
    with pytest.raises(ValueError):
        simulate(describe(sc, CostModel(sc.cluster.gpu, "bf16"), Network.of(sc.cluster)), fidelity="exact")


# --- contention on links ----------------------------------------------------------------------


def run_flows(starts: list[tuple[float, float, tuple]], routed: bool = False, tail: float = 0.0,
              peak: list[float] | None = None) -> list[float]:
    """Start flows (start time, solo seconds, loads); return their finish times (``routed``:
    each from a route made beforehand, as pipeline sends start; ``peak`` gets the largest slow-down)."""
    env = kernel.Environment()
    fluid = FluidNetwork(env)
    ends: list[float] = [0.0] * len(starts)

    def go(i: int, at: float, work: float, loads: tuple):
        route = fluid.route(work, loads, tail)
        yield env.timeout(at)
        yield fluid.start(route) if routed else fluid.transfer(work, loads, tail)
        ends[i] = env.now

    for i, (at, work, loads) in enumerate(starts):
        env.process(go(i, at, work, loads))
    env.run()
    if peak is not None:
        peak.append(fluid.peak_overload)
    return ends


def test_a_routed_flow_runs_as_a_transfer_to_the_last_bit() -> None:
    """FluidNetwork.start's short way (all links idle) leaves the same state as transfer: the
    same finish times, bit for bit, contention included (a flow meeting a routed one, one
    starting the instant another ends, an overloaded link)."""
    nic, other = ("nic0.0~leaf0", "up"), ("nic0.1~leaf0", "up")
    cases = [
        [(0.0, 0.3, ((nic, 1.0), (other, 1.0)))],
        [(0.0, 0.3, ((nic, 1.0),)), (0.1, 0.7, ((nic, 1.0), (other, 0.5)))],
        [(0.0, 0.25, ((nic, 1.0),)), (0.25, 0.5, ((nic, 1.0),)), (0.25, 0.5, ((other, 1.0),))],
        [(0.0, 0.3, ((nic, 1.5), (other, 2.0)))],
        [(0.0, 0.3, ((nic, 1.5), (other, 2.0))), (0.2, 0.1, ((other, 1.0),))],
    ]
    for starts in cases:
        peaks: list[float] = []
        plain = run_flows(starts, tail=1e-3, peak=peaks)
        routed = run_flows(starts, routed=True, tail=1e-3, peak=peaks)
        assert routed == plain, starts
        assert peaks[0] == peaks[1], starts


def test_fluid_sharing() -> None:
    nic = ((("nic0.0~leaf0", "up"), 1.0),)
    other = ((("nic0.1~leaf0", "up"), 1.0),)
    assert run_flows([(0.0, 1.0, nic)]) == pytest.approx([1.0])
    assert run_flows([(0.0, 1.0, nic), (0.0, 1.0, nic)]) == pytest.approx([2.0, 2.0])
    assert run_flows([(0.0, 1.0, nic), (0.0, 1.0, other)]) == pytest.approx([1.0, 1.0])
    # the second starts half-way: both at half speed until the first ends at 1.5
    assert run_flows([(0.0, 1.0, nic), (0.5, 1.0, nic)]) == pytest.approx([1.5, 2.0])
    # light loads that fit together do not slow each other
    half = ((("nic0.0~leaf0", "up"), 0.5),)
    assert run_flows([(0.0, 1.0, half), (0.0, 1.0, half)]) == pytest.approx([1.0, 1.0])


def test_pipeline_send_and_gradient_sync_share_the_nic() -> None:
    sc = make(model="gpt3-13b", nodes=4, tp=8, pp=2, global_batch_size=16)  # dp 2 across nodes
    links = LinkModel(sc, Network.of(sc.cluster), replicas_alike=True)
    send = links.p2p(8 * 2**20, 0, 1, 0)
    sync = links.collective("allreduce", 8 * 2**20, "dp", 0, (0,))
    key = (topo.nic_link(sc.cluster, 0), "up")
    assert dict(send.loads)[key] == pytest.approx(1.0)
    assert dict(sync.loads)[key] == pytest.approx(1.0)
    alone = run_flows([(0.0, send.work, send.loads)])[0]
    both = run_flows([(0.0, send.work, send.loads), (0.0, send.work, send.loads)])
    assert both[0] == pytest.approx(2 * alone)
    ends = run_flows([(0.0, send.work, send.loads), (0.0, sync.work, sync.loads)])
    assert min(ends) == pytest.approx(2 * min(send.work, sync.work))


def test_pipeline_send_across_leaves_loads_the_uplinks() -> None:
    sc = scenario_from_dict({
        "name": "t", "model": {"preset": "gpt3-13b"},
        "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 4, "nodes_per_leaf": 2, "spine_oversubscription": 2},
        "plan": {"tp": 8, "pp": 4, "global_batch_size": 16}})
    links = LinkModel(sc, Network.of(sc.cluster), replicas_alike=True)
    loads = dict(links.p2p(2**23, 1, 2, 0).loads)  # stage 1 (node 1, leaf 0) -> stage 2 (node 2, leaf 1)
    # the 8 NICs of stage 1 (of the leaf's 16) through an uplink with half the leaf's bandwidth
    assert loads[("leaf0~spine", "up")] == pytest.approx(1.0)
    assert loads[("leaf1~spine", "down")] == pytest.approx(1.0)
    assert loads[(topo.nic_link(sc.cluster, 8), "up")] == pytest.approx(1.0)
    assert all(topo.link_kind(link) != "pcie" for link, _ in loads)
    assert dict(links.p2p(2**23, 0, 1, 0).loads).keys().isdisjoint({("leaf0~spine", "up")})


def test_intra_node_collective_loads_switch_ports_only() -> None:
    sc = make(model="gpt3-13b", nodes=1, tp=1, global_batch_size=16)  # dp 8 in one node
    sync = LinkModel(sc, Network.of(sc.cluster), replicas_alike=True).collective("allreduce", 2**26, "dp", 0, (0,))
    assert {link for (link, _), _ in sync.loads} == {topo.port_link(sc.cluster, 0)}


def test_software_ceiling_paces_a_collective_and_shares_the_rank() -> None:
    """A DeepSpeed ZeRO-3 collective (busbw ceiling, busbw_cap) takes
    (n-1)/n S / ceiling alone and loads the NICs below their share; two at once on one rank
    share its ceiling, so they take twice as long; an FSDP plan's (zero3_fetch: layer) is not
    capped."""
    sc = make(model="gpt3-13b", nodes=4, tp=1, zero_stage=3, zero3_fetch="module", global_batch_size=32)
    net = Network.of(sc.cluster)
    links = LinkModel(sc, net, replicas_alike=True)
    nbytes, n = 2.0**30, sc.plan.dp
    gather = links.collective("allgather", nbytes, "dp", 0, (0,))
    assert gather.latency == 0.0
    assert gather.work == pytest.approx((n - 1) / n * nbytes / DEEPSPEED_ZERO3_BUSBW)
    loads = dict(gather.loads)
    assert loads[(software_resource(0), "up")] == 1.0
    uncapped = collective_time("allgather", nbytes, layout_for_axis(sc.cluster, sc.plan, "dp"), net)
    assert uncapped < gather.work
    assert 0 < loads[(topo.nic_link(sc.cluster, 0), "up")] < 1.0
    ends = run_flows([(0.0, gather.work, gather.loads), (0.0, gather.work, gather.loads)])
    assert ends == pytest.approx([2 * gather.work] * 2)
    fsdp = make(model="gpt3-13b", nodes=4, tp=1, zero_stage=3, global_batch_size=32)
    plain = LinkModel(fsdp, net, replicas_alike=True).collective("allgather", nbytes, "dp", 0, (0,))
    assert plain.latency + plain.work == pytest.approx(uncapped)


# --- the network behind a narrow interface ------------------------------------------------------


class SoloBackend:
    """A network backend without contention: each transfer takes its solo time (what the fluid
    backend gives a transfer alone). It only implements simdist.sim.network.NetworkBackend."""

    def __init__(self, env: kernel.Environment, sc: Scenario, net: Network, replicas_alike: bool):
        self.env, self.links = env, LinkModel(sc, net, replicas_alike)
        self.calls: dict[str, int] = {}

    def _alone(self, what: str, latency: float, work: float, extra: float = 0.0) -> kernel.Event:
        self.calls[what] = self.calls.get(what, 0) + 1
        return self.env.timeout(work + latency + extra)

    def collective(self, kind, nbytes, axis, stage, replicas, extra_s=0.0):  # type: ignore[no-untyped-def]
        t = self.links.collective(kind, nbytes, axis, stage, replicas)
        return self._alone("collective", t.latency, t.work, extra_s)

    def p2p(self, nbytes, src_stage, dst_stage, replica, extra_s=0.0):  # type: ignore[no-untyped-def]
        t = self.links.p2p(nbytes, src_stage, dst_stage, replica)
        return self._alone("p2p", t.latency, t.work, extra_s)

    def host(self, resource, seconds, stage, replica):  # type: ignore[no-untyped-def]
        return self._alone("host", 0.0, seconds)

    def ps(self, kind, nbytes, stage, replicas):  # type: ignore[no-untyped-def]
        t = self.links.ps(kind, nbytes, stage, replicas)
        return self._alone("ps", t.latency, t.work)

    def ps_update(self, seconds):  # type: ignore[no-untyped-def]
        return self._alone("ps_update", 0.0, seconds)

    def assumptions(self) -> list[str]:
        return ["solo backend: no contention"]

    def usage(self, elapsed: float) -> dict[str, Any]:
        return {}


def test_a_contention_free_backend_plugs_into_the_engine() -> None:
    """The engine reaches the network only through the backend interface: a backend without
    contention gives the fluid backend's answer where nothing contends, and a shorter step where
    a pipeline send and the gradient sync share a NIC."""
    quiet = make(model="gpt3-13b", nodes=2, tp=8, pp=2, global_batch_size=16)  # dp 1: sends only
    d = describe(quiet, CostModel(quiet.cluster.gpu, quiet.plan.precision), Network.of(quiet.cluster))
    backends: list[SoloBackend] = []

    def solo(*args: Any) -> SoloBackend:
        backends.append(SoloBackend(*args))
        return backends[-1]

    fluid = simulate(d, keep_spans=False)
    alone = simulate(d, keep_spans=False, backend=solo)
    assert alone.step_time == pytest.approx(fluid.step_time, rel=1e-9)
    assert backends[0].calls["p2p"] > 0 and "solo backend: no contention" in alone.assumptions
    busy = make(model="gpt3-13b", nodes=4, tp=8, pp=2, global_batch_size=16)  # dp 2 across nodes
    d = describe(busy, CostModel(busy.cluster.gpu, busy.plan.precision), Network.of(busy.cluster))
    fluid, alone = simulate(d, keep_spans=False), simulate(d, keep_spans=False, backend=solo)
    assert any("link contention slowed transfers" in a for a in fluid.assumptions)
    assert alone.step_time < fluid.step_time
    assert backends[1].calls["collective"] > 0
