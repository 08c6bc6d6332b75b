"""Per-step passes over the whole gradient buffer besides its reduction (simdist.analytic.cost.
grad_buffer_pass_bytes): Megatron's zero_grad_buffer memset and check_for_nan_in_grad's norm read
the rank's unsharded buffer every step; frameworks without them and sharded gradients pay none."""

import pytest

from simdist.analytic.cost import grad_buffer_pass_bytes
from simdist.analytic.params import params_per_rank
from simdist.predict import predict
from simdist.spec.scenario import scenario_from_dict


def scenario(framework: str | None, zero: int = 1, precision: str = "bf16"):
    plan = {"tp": 2, "zero_stage": zero, "global_batch_size": 64, "precision": precision}
    if framework:
        plan["framework"] = framework
    return scenario_from_dict({"name": "t", "model": {"preset": "gpt3-1.3b"},
                               "cluster": {"preset": "dgx-h100", "num_nodes": 2}, "plan": plan})


def test_megatron_pays_a_memset_and_a_norm_read_of_its_fp32_buffer():
    s = scenario("megatron")
    n = params_per_rank(s.model, s.plan, 0)
    assert s.plan.grad_buffer_bytes == 4  # bf16 forces fp32 main grads in Megatron-LM
    assert grad_buffer_pass_bytes(n, s.plan) == 2 * 4 * n


@pytest.mark.parametrize(("framework", "zero"), [(None, 1), ("pytorch", 0), ("nemo", 1), ("megatron", 3)])
def test_others_and_sharded_gradients_pay_none(framework, zero):
    s = scenario(framework, zero)
    assert grad_buffer_pass_bytes(params_per_rank(s.model, s.plan, 0), s.plan) == 0.0


def test_the_passes_lengthen_the_optimizer_step_in_both_engines():
    meg = scenario("megatron")
    n = params_per_rank(meg.model, meg.plan, 0)
    for engine in ("analytic", "des"):
        p = predict(meg, engine=engine, keep_spans=False)
        hbm = meg.cluster.gpu.memory_bandwidth_bytes_per_s
        # at least the 8 B per parameter at the GPU's full HBM speed
        assert p.breakdown_s["optimizer"] > 8 * n / hbm, engine
