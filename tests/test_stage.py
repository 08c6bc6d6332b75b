"""The per-stage description (simdist.analytic.stage): computed once per stage kind, the same as
describing every stage on its own, and the only thing the event engine's lowering reads (it
never calls the closed form)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from simdist.analytic import data_parallel, steptime
from simdist.analytic.collectives import Network
from simdist.analytic.cost import CostModel
from simdist.analytic.memory import stage_memory
from simdist.analytic.stage import StepDescription, describe
from simdist.predict import predict
from simdist.spec.scenario import Scenario, load_scenario, scenario_from_dict

REPO = Path(__file__).resolve().parent.parent


def make(model: str = "gpt3-1.3b", nodes: int = 1, **plan: Any) -> Scenario:
    plan.setdefault("global_batch_size", 16)
    return scenario_from_dict({"name": "t", "model": {"preset": model},
                               "cluster": {"preset": "dgx-a100-80gb", "num_nodes": nodes,
                                           "host": {"cpu_memory": "1 TiB", "pcie_bandwidth": "32 GB/s",
                                                    "nvme_bandwidth": "25 GB/s",
                                                    "cpu_optimizer_throughput": "2e9 params/s"}},
                               "plan": plan})


def described(sc: Scenario, per_kind: bool = True) -> StepDescription:
    return describe(sc, CostModel(sc.cluster.gpu, sc.plan.precision), Network.of(sc.cluster), per_kind)


PLANS = {
    "pp64, uneven layers": dict(model="gpt3-175b", nodes=64, tp=8, pp=64, global_batch_size=128),
    "interleaved, uneven": dict(model="gpt3-13b", nodes=4, tp=2, pp=4, virtual_pipeline_stages=3,
                                global_batch_size=32),
    "no pipeline": dict(tp=8),
    "zero-3 + parameter and optimizer offload": dict(model="llama2-7b", nodes=2, pp=2, zero_stage=3,
                                                     recompute="full",
                                                     offload={"optimizer": "cpu", "params": "cpu"}),
    "parameter servers + compression": dict(nodes=4, pp=2, gradient_sync="parameter-server",
                                            grad_compression={"method": "bf16"}),
    "zero-1 powersgd": dict(nodes=2, pp=2, zero_stage=1, grad_compression={"method": "powersgd"}),
}


def test_a_deep_pipeline_is_described_once_per_stage_kind() -> None:
    sc = make(**PLANS["pp64, uneven layers"])  # 96 layers over 64 stages: 1 or 2 layers each
    d = described(sc)
    assert sc.plan.pp == 64 and 2 <= len(d.kinds) <= 4
    assert {d.stages[s].layers for s in range(64)} == {1, 2}
    assert all(d.stages[s] is d.kinds[d.kind_of[s]] for s in range(64))
    assert d.stages[0].chunks[0].first and d.stages[-1].chunks[-1].last
    assert not any(c.first or c.last for s in d.stages[1:-1] for c in s.chunks)


@pytest.mark.parametrize("name", sorted(PLANS))
def test_stage_kinds_equal_stages_described_alone(name: str) -> None:
    """The kind key (chunk layers, first/last role) holds everything a stage's description
    depends on: memoising per kind changes nothing."""
    sc = make(**PLANS[name])
    alone, shared = described(sc, per_kind=False), described(sc)
    assert len(alone.kinds) == sc.plan.pp
    assert alone.stages == shared.stages


@pytest.mark.parametrize("path", sorted((REPO / "scenarios").glob("*.yaml")), ids=lambda p: p.stem)
def test_memory_shared_per_stage_kind_is_each_stage_on_its_own(path: Path) -> None:
    """StepDescription.memory works the model states out once per stage kind (and the runtime's
    once): the same as each stage's memory worked out on its own."""
    sc = load_scenario(path)
    d = described(sc)
    assert d.memory == tuple(stage_memory(sc.model, sc.plan, s, sc.cluster) for s in range(sc.plan.pp))


def test_the_event_engine_never_calls_the_closed_form(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lowering maps the description to tasks; the closed form's reductions are not used (the
    asynchronous parameter-server mode alone takes the closed form's cycle as its start
    offsets)."""
    sc = make(model="llama2-7b", nodes=2, pp=2, zero_stage=3, recompute="full",
              offload={"optimizer": "cpu", "params": "cpu"}, grad_compression={"method": "int8"})
    expected = predict(sc, keep_spans=False).step_time_s

    def refuse(*_a: Any, **_k: Any) -> None:
        raise AssertionError("the event engine called the closed form")

    for name in ("reduce_step", "stage_time", "end_of_step", "pipeline_time", "offload_per_microbatch"):
        monkeypatch.setattr(steptime, name, refuse)
    monkeypatch.setattr(data_parallel, "dp_times", refuse)
    assert predict(sc, keep_spans=False).step_time_s == expected
    with pytest.raises(AssertionError, match="closed form"):
        predict(sc, engine="analytic")


def test_both_engines_take_compute_and_memory_from_one_description() -> None:
    sc = make(model="llama2-7b", nodes=2, tp=4, pp=2, global_batch_size=32)
    d = described(sc)
    des, ana = predict(sc, keep_spans=False), predict(sc, engine="analytic")
    m = sc.plan.num_microbatches
    busiest = max(d.stages, key=lambda s: s.fwd.total + s.bwd.total)
    # and its last backward, slower beside the gradient sync (overlap.contended_buckets)
    slower = data_parallel.contention_stretch(busiest.dp, sc.plan, busiest.fwd.total,
                                              busiest.bwd.total + busiest.recompute.total)[0]
    assert slower > 0
    assert ana.breakdown_s["compute"] == pytest.approx(m * (busiest.fwd.compute + busiest.bwd.compute) + slower)
    assert des.breakdown_s["compute"] == pytest.approx(ana.breakdown_s["compute"], rel=1e-9)
    assert [s.peak_gib for s in des.per_stage] == [s.peak_gib for s in ana.per_stage]
    assert [s.peak for s in d.memory] == pytest.approx([s.peak_gib * 2**30 for s in ana.per_stage])


def test_interleaved_sends_show_in_both_engines_under_overlap_p2p() -> None:
    """Megatron's interleaved schedule with overlap_p2p_comm: the sender goes on, but chunk j+1
    of a micro-batch waits for chunk j to pass all p stages with no slack, so every send shows
    (sec 2.2.2 of Narayanan et al. SC'21). The closed form charges every send, 2v - 1 per stage
    and micro-batch at pp 2, and lands within 3% of the event engine, which runs the
    dependencies; with ten times fewer chunks the sends cost several times less."""
    kw = dict(model="gpt3-13b", nodes=4, tp=8, pp=2, micro_batch_size=4, global_batch_size=16,
              framework="megatron")
    many, few = make(virtual_pipeline_stages=20, **kw), make(virtual_pipeline_stages=2, **kw)
    d = described(many)
    assert d.send is not None and d.send.overlapped
    m, v = many.plan.num_microbatches, 20
    closed = predict(many, engine="analytic", keep_spans=False)
    assert closed.breakdown_s["pp_comm"] == pytest.approx(m * (2 * v - 1) * (d.send.send_s + d.send.gather_s))
    des = predict(many, engine="des", keep_spans=False)
    assert closed.step_time_s == pytest.approx(des.step_time_s, rel=0.03)
    pp_few = predict(few, engine="analytic", keep_spans=False).breakdown_s["pp_comm"]
    assert closed.breakdown_s["pp_comm"] > 6 * pp_few > 0
