"""Gradient accumulation (simdist.analytic.grad_accumulation): every micro-batch after the first
adds its gradients into the kept ones, unless the framework fuses the add into the GEMM."""

import pytest

import simdist.analytic.stage as stage_module
from simdist.analytic.collectives import Network
from simdist.analytic.cost import CostModel
from simdist.analytic.grad_accumulation import accumulation_time, kept_gradients
from simdist.analytic.params import params_per_rank
from simdist.predict import predict
from simdist.spec.scenario import scenario_from_dict


def scenario(framework: str | None = "pytorch", zero: int = 0, micro_batches: int = 4, pp: int = 1,
             schedule: str = "1f1b", fusion: bool | None = None):
    plan = {"tp": 2, "pp": pp, "zero_stage": zero, "micro_batch_size": 1, "schedule": schedule,
            "global_batch_size": micro_batches * 16 // (2 * pp), "precision": "bf16"}
    if fusion is not None:
        plan["grad_accumulation_fusion"] = fusion
    if framework:
        plan["framework"] = framework
    return scenario_from_dict({"name": "t", "model": {"preset": "gpt3-1.3b"},
                               "cluster": {"preset": "dgx-h100", "num_nodes": 2}, "plan": plan})


def cost(s):
    return CostModel(s.cluster.gpu, s.plan.precision)


def test_one_micro_batch_or_a_fused_accumulation_adds_nothing():
    one = scenario(micro_batches=1)
    assert one.plan.num_microbatches == 1
    assert accumulation_time(one, cost(one), 0) == 0.0
    for fw in ("megatron", "nemo", None):  # simdist's own defaults: fused kernels
        s = scenario(fw)
        assert s.plan.num_microbatches == 4
        assert accumulation_time(s, cost(s), 0) == 0.0, fw
    for fw in ("pytorch", "torchtitan", "deepspeed"):
        s = scenario(fw)
        assert accumulation_time(s, cost(s), 0) > 0.0, fw
    # the plan field wins over the framework's default, both ways
    assert accumulation_time(s := scenario("megatron", fusion=False), cost(s), 0) > 0.0
    assert accumulation_time(s := scenario("pytorch", fusion=True), cost(s), 0) == 0.0


def test_the_first_micro_batch_of_a_step_adds_nothing():
    """Per micro-batch, averaged over the step: (m - 1) / m of one add pass."""
    two, eight = scenario(micro_batches=2), scenario(micro_batches=8)
    assert (two.plan.num_microbatches, eight.plan.num_microbatches) == (2, 8)
    t2, t8 = accumulation_time(two, cost(two), 0), accumulation_time(eight, cost(eight), 0)
    assert t8 / t2 == pytest.approx((7 / 8) / (1 / 2), rel=1e-12)


def test_sharded_gradients_accumulate_their_shard_unless_a_pipeline_defers_the_reduction():
    """FSDP2 in a pipeline stage defers the reduction to the last micro-batch, and so does
    torchtitan's stage at any ZeRO stage (as the memory model counts its gradients)."""
    s = scenario(zero=2)
    n = params_per_rank(s.model, s.plan, 0)
    assert kept_gradients(scenario(zero=1).plan, n, fsdp2=False) == n
    assert kept_gradients(s.plan, n, fsdp2=False) == pytest.approx(n / s.plan.dp)
    assert kept_gradients(scenario(zero=2, pp=2).plan, n, fsdp2=False) == pytest.approx(n / s.plan.dp * 2)
    # FSDP2 in a pipeline stage (the executor's, torchtitan's) reduces at the last micro-batch
    assert kept_gradients(scenario(zero=2, pp=2).plan, n, fsdp2=True) == n
    assert kept_gradients(scenario("torchtitan", zero=3, pp=2).plan, n, fsdp2=False) == n
    assert accumulation_time(s, cost(s), 0) < accumulation_time(scenario(zero=1), cost(s), 0)


# (pp, schedule, the fewest micro-batches' adds the step must grow by): every micro-batch's
# backward on the busiest stage; zero-bubble's weight passes, where the adds run, partly fill the
# cool-down gap (ZB-H1: by one W pass of each other stage, and one more with micro-batches to spare)
@pytest.mark.parametrize(("pp", "schedule", "fewest"), [(1, "1f1b", 4), (2, "1f1b", 4), (2, "zero-bubble", 2)])
def test_both_engines_lengthen_the_step_by_the_adds(monkeypatch, pp, schedule, fewest):
    s = scenario(pp=pp, schedule=schedule)
    d = stage_module.describe(s, cost(s), Network.of(s.cluster, None))
    adds = max(k.accumulation for k in d.kinds)
    assert adds > 0 and s.plan.num_microbatches == 4
    with_adds = {e: predict(s, engine=e, keep_spans=False).step_time_s for e in ("analytic", "des")}
    monkeypatch.setattr(stage_module, "accumulation_time", lambda *a: 0.0)
    for engine, step in with_adds.items():
        grew = step - predict(s, engine=engine, keep_spans=False).step_time_s
        assert fewest * adds * 0.95 < grew < (s.plan.num_microbatches + pp) * adds * 1.05, engine
