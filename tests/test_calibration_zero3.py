"""FSDP2's waits at its own collectives: a fixed wait per all-gather and reduce-scatter
(``sync_point_waits_s["zero3"]``), told from a share of compute by a tiny ZeRO-3 plan and a large one."""

from dataclasses import replace

import pytest
from test_calibration import local_scenario
from test_calibration_phases import phased, truth

from simdist.calibrate.refit import microbenchmark_part
from simdist.calibrate.terms import fit_checks, fit_terms
from simdist.predict import predict
from simdist.spec.scenario import scenario_from_dict
from simdist.spec.software_layers import BASE_TERMS

# scenarios/local-zero3-fit.yaml's model: few large ops beside each gather, where the tiny plan has many small ones
LARGE = {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "ffn_hidden_size": 1024,
         "vocab_size": 2048, "seq_length": 128, "mlp": "gelu", "norm": "layernorm", "tie_embeddings": False}


def test_each_fsdp2_collective_waits_its_fixed_time():
    t = truth()
    plan = {"zero_stage": 3, "global_batch_size": 8, "micro_batch_size": 1}
    sc = scenario_from_dict(local_scenario(**plan))
    waits = replace(t, sync_point_waits_s={"zero3": 1e-4})
    extra = (predict(sc, profile=waits, engine="analytic").breakdown_s["dp_comm"]
             - predict(sc, profile=t, engine="analytic").breakdown_s["dp_comm"])
    # per micro-batch, each layer and the root module: a gather before forward, one before backward,
    # the reduce-scatter after it
    assert extra == pytest.approx(sc.plan.num_microbatches * (sc.model.num_layers + 1) * 3 * 1e-4, rel=1e-6)
    # with TP beside ZeRO-3 the same: TP's collectives do not pay FSDP2's wait
    four = {"cluster": {"preset": "local", "num_nodes": 1, "gpus_per_node": 4}}
    both = scenario_from_dict({**local_scenario(tp=2, **plan), **four})
    roomy = {"cores": 4}  # a core per rank: the step is not stretched by time-sharing
    extra = (predict(both, profile=replace(waits, **roomy), engine="analytic").step_time_s
             - predict(both, profile=replace(t, **roomy), engine="analytic").step_time_s)
    assert extra == pytest.approx(both.plan.num_microbatches * (both.model.num_layers + 1) * 3 * 1e-4, rel=1e-6)


def test_a_tiny_and_a_large_zero3_plan_tell_the_wait_per_collective_from_the_share_of_compute():
    t = truth()
    t = replace(t, sync_wait_fractions={BASE_TERMS: 0.05, "zero3": 0.04}, sync_point_waits_s={"zero3": 2e-4},
                framework_overheads_s={"zero3": 3e-5})
    runs = [phased(t, "small")[1], phased(t, "large", micro_batch_size=8, global_batch_size=16)[1],
            phased(t, "zero3", zero_stage=3)[1],
            phased(t, "zero3-large", model=LARGE, zero_stage=3, micro_batch_size=2, global_batch_size=16)[1]]
    fitted, bounds, unusable = fit_terms(microbenchmark_part(t), runs)
    assert unusable == [] and not [b for b in bounds if b.hit]
    assert fitted.sync_point_waits_s["zero3"] == pytest.approx(2e-4, rel=0.05)
    assert fitted.sync_wait_fractions["zero3"] == pytest.approx(0.04, rel=0.1)
    assert all(abs(c.error) < 0.01 for c in fit_checks(fitted, runs))
