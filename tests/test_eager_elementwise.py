"""Eager versus fused elementwise ops (plan.fused_elementwise, simdist.analytic.eager): the HBM
traffic of norms, RoPE and SwiGLU run one PyTorch op per kernel, the framework default, the
field's validation and the torchtitan mapping."""

import pytest

from simdist.analytic import eager
from simdist.analytic.ops import Compute, layer_ops
from simdist.predict import predict
from simdist.spec.scenario import scenario_from_dict


def sc(model="llama3-8b", **plan):
    plan.setdefault("global_batch_size", 8)
    return scenario_from_dict({"name": "t", "model": {"preset": model}, "cluster": {"preset": "dgx-h100", "num_nodes": 1},
                               "plan": plan})


def mem_bytes(s, phase="fwd") -> dict[str, float]:
    out: dict[str, float] = {}
    for op in layer_ops(s.model, s.plan, phase):
        if isinstance(op, Compute) and op.kind == "memory":
            out[op.name] = out.get(op.name, 0.0) + op.bytes
    return out


@pytest.mark.parametrize("phase", ["fwd", "bwd"])
def test_eager_ops_move_the_traffic_of_their_op_lists(phase):
    fused, unfused = mem_bytes(sc(fused_elementwise=True), phase), mem_bytes(sc(fused_elementwise=False), phase)
    assert unfused["norm1"] == pytest.approx(9 * fused["norm1"])  # RMSNorm: 36 B against 4 B per element
    assert unfused["rope"] == pytest.approx(5 * fused["rope"])
    assert unfused["swiglu"] == pytest.approx(eager.SWIGLU[phase] * fused["swiglu"])
    assert unfused["bias dropout add"] == fused["bias dropout add"]  # residual adds: one kernel either way


def test_layernorm_and_gelu_are_one_kernel_eager_or_not():
    gpt = {"num_layers": 2, "hidden_size": 1024, "num_attention_heads": 16, "vocab_size": 1000, "seq_length": 1024,
           "norm": "layernorm", "mlp": "gelu"}
    a, b = (scenario_from_dict({"name": "t", "model": gpt, "cluster": {"preset": "dgx-h100", "num_nodes": 1},
                                "plan": {"global_batch_size": 8, "fused_elementwise": f}}) for f in (True, False))
    assert mem_bytes(a) == mem_bytes(b)


def test_framework_default_and_the_field_wins():
    assert not eager.fused(sc(framework="torchtitan", zero_stage=0).plan)  # compile off by default
    assert eager.fused(sc(framework="torchtitan", zero_stage=0, fused_elementwise=True).plan)
    assert eager.fused(sc(framework="nemo").plan) and eager.fused(sc().plan)
    slow = predict(sc(framework="torchtitan", zero_stage=0)).step_time_s
    fast = predict(sc(framework="torchtitan", zero_stage=0, fused_elementwise=True)).step_time_s
    assert slow > 1.03 * fast


def test_torchtitan_rows_take_compile_from_their_notes():
    from simdist.validate.training import build_cases

    cases = {c.run_id: c for c in build_cases()[0]}
    assert cases["R0145"].scenario.plan.fused_elementwise is False  # "FSDP"
    assert cases["R0146"].scenario.plan.fused_elementwise is True  # "FSDP + torch.compile"


def test_predict_says_when_elementwise_ops_run_eager():
    lines = [a for a in predict(sc(framework="torchtitan", zero_stage=0)).assumptions if a.startswith("elementwise")]
    assert lines and "the framework's default" in lines[0]
    assert not [a for a in predict(sc()).assumptions if a.startswith("elementwise")]
