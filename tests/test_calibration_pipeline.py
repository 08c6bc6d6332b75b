"""A pipeline's runs fitted as the model prices them: its busiest stage's phases, its own sync
points' waits (no gradient all-reduce at dp 1), and zero-bubble's split backward as a software
layer of its own."""

import json
from dataclasses import replace

import pytest
import yaml
from conftest import measurement
from test_calibration import local_scenario, synthetic_bench
from test_calibration_phases import truth

from simdist.analytic.collectives import Network
from simdist.analytic.cost import CostModel
from simdist.analytic.ops import Compute, head_ops
from simdist.analytic.stage import describe
from simdist.analytic.variants import layer_ops
from simdist.calibrate.fit import fit_profile
from simdist.calibrate.phases import measured_waits
from simdist.calibrate.repeat import Repeated
from simdist.calibrate.terms import FitRun
from simdist.predict import predict
from simdist.spec.measurement import Measurement
from simdist.spec.profile import load_profile
from simdist.spec.scenario import scenario_from_dict
from simdist.spec.software_layers import BASE_TERMS, wait_keys

# the ranks of one run of scenarios/local-pp-1f1b.yaml on the 2-core guest (2026-11-28, seconds):
# stage 0 waits for the busier stage 1 every micro-batch (123 ms of "comm"), stage 1 waits 20 ms
RANKS = [{"rank": 0, "forward": 0.0738, "backward": 0.1589, "optimizer": 0.0036, "comm": 0.1227, "core_wait": 0.0028,
          "other": 0.0010, "helper_threads": 0.0},
         {"rank": 1, "forward": 0.0954, "backward": 0.2054, "optimizer": 0.0038, "comm": 0.0197, "core_wait": 0.0004,
          "other": 0.0013, "helper_threads": 0.0}]


def pipeline_run(per_rank: bool = True) -> FitRun:
    d = {**local_scenario(pp=2, micro_batch_size=4, global_batch_size=16), "name": "pp"}
    mean = {k: (RANKS[0][k] + RANKS[1][k]) / 2 for k in RANKS[0] if k != "rank"}
    m = Measurement.from_dict(measurement(name="pp", scenario_hash=scenario_from_dict(d).hash(), step_time_s=0.3628,
                                          phases_s=mean, **({"phases_per_rank_s": RANKS} if per_rank else {})))
    return FitRun("pp", yaml.safe_dump(d), ".", Repeated("pp", (m,), True, "stable"))


def test_a_pipeline_run_is_read_at_its_busiest_rank():
    run = pipeline_run()
    assert run.busiest_rank_phases
    got = run.measured()
    assert got["forward_s"] == pytest.approx(0.0954) and got["comm_s"] == pytest.approx(0.0197)
    # its waits: the step less its work (bubble and waits), not the ranks' mean communication
    assert measured_waits(got, symmetric=True) == pytest.approx(0.3628 - 0.0954 - 0.2054 - 0.0013 - 0.0038)
    older = pipeline_run(per_rank=False)  # a measurement without its ranks' phases: their mean
    assert not older.busiest_rank_phases and older.measured()["forward_s"] == pytest.approx((0.0738 + 0.0954) / 2)


def test_the_plain_plans_wait_at_the_gradient_sync_is_paid_only_with_one():
    plan = lambda **p: scenario_from_dict(local_scenario(**p)).plan  # noqa: E731
    assert wait_keys(plan()) == (BASE_TERMS,)
    assert wait_keys(plan(pp=2, global_batch_size=8)) == ("pipeline",)
    assert wait_keys(plan(tp=2)) == ("tp",)
    four = {"cluster": {"preset": "local", "num_nodes": 1, "gpus_per_node": 4}}
    assert wait_keys(scenario_from_dict({**local_scenario(tp=2), **four}).plan) == (BASE_TERMS, "tp")
    t = truth()  # plain plans wait 5% of their compute at the gradient sync
    pipe = scenario_from_dict(local_scenario(pp=2, global_batch_size=8))
    assert predict(pipe, profile=t, engine="analytic").breakdown_s["dp_comm"] == 0.0


def test_an_older_profiles_multichunk_terms_price_the_split_backward(tmp_path):
    old = fit_profile(synthetic_bench()).to_dict()
    old.update(version=7, framework_overheads_s={"multichunk": 2e-5}, sync_wait_fractions={"multichunk": 0.1})
    del old["select_rates"]
    (tmp_path / "v7.json").write_text(json.dumps(old))
    p = load_profile(tmp_path / "v7.json")
    assert p.framework_overheads_s == {"multichunk": 2e-5, "split_backward": 2e-5}
    assert p.sync_wait_fractions == {"multichunk": 0.1, "split_backward": 0.1}
    assert p.optimizer_layer_tensor_s == {}


def test_the_split_backward_is_paid_in_the_weight_pass_of_chunks_past_virtual_stage_0():
    # torch.distributed.pipelining walks a chunk's autograd graph and runs one traversal per weight
    # group; virtual stage 0 has no input gradient and runs its backward whole (at no extra cost)
    base = truth()
    term = replace(base, framework_overheads_s={**base.framework_overheads_s, "split_backward": 5e-5})
    zb = scenario_from_dict(local_scenario(pp=2, schedule="zero-bubble"))
    plain, split = (describe(zb, CostModel(zb.cluster.gpu, zb.plan.precision, p), Network.of(zb.cluster, p))
                    for p in (base, term))
    ops = sum(1 for op in layer_ops(zb.model, zb.plan, "bwd") if isinstance(op, Compute) and op.kind != "sync")
    head = sum(1 for op in head_ops(zb.model, zb.plan, "bwd") if isinstance(op, Compute))
    (a0, a1), (b0, b1) = plain.stages, split.stages
    assert b0.fwd == a0.fwd and b0.bwd == a0.bwd and b1.fwd == a1.fwd  # no forward pays, nor stage 0
    extra = 5e-5 * (a1.chunks[0].layers * ops + head)
    assert b1.bwd.compute - a1.bwd.compute == pytest.approx(extra)
    assert b1.bwd.weight_grad - a1.bwd.weight_grad == pytest.approx(extra)  # in the W pass: it fills the bubble
    for engine in ("analytic", "des"):
        grown = predict(zb, profile=term, engine=engine).step_time_s - predict(zb, profile=base, engine=engine).step_time_s
        assert 0.5 * zb.plan.num_microbatches * extra < grown <= zb.plan.num_microbatches * extra * 1.001
    ofb = scenario_from_dict(local_scenario(pp=2))  # other schedules do not split the backward
    assert predict(ofb, profile=term, engine="analytic").step_time_s == predict(ofb, profile=base,
                                                                                engine="analytic").step_time_s
