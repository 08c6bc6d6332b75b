"""Full recompute under PyTorch's non-reentrant checkpoint (plan.recompute_early_stop): the
recompute stops once the last tensor backward saved is back, so a 16-bit down-projection (and
the residual add after it) is not run again; an FP8 down-projection, or dropout after it, is.
The frameworks that checkpoint this way (pytorch, torchtitan) stop early by default, the others
(megatron, nemo, deepspeed, none) re-run the whole layer."""

import pytest
from conftest import base_scenario

from simdist.analytic.ops import Compute, layer_ops, recompute_ops
from simdist.predict import predict
from simdist.spec.frameworks import recompute_early_stop
from simdist.spec.scenario import scenario_from_dict


def sc(model=None, **plan):
    """GPT-3 1.3B with full recompute on one DGX H100, without dropout unless ``model`` says so."""
    d = base_scenario(recompute="full", **plan)
    d["model"] = {**d["model"], "dropout": False, **(model or {})}
    d["cluster"] = {**d["cluster"], "preset": "dgx-h100"}
    return scenario_from_dict(d)


def names(ops):
    return [op.name for op in ops]


def gemm_flops(ops):
    return sum(op.flops for op in ops if isinstance(op, Compute) and op.kind == "gemm")


def test_the_frameworks_that_use_non_reentrant_checkpoint_stop_early():
    for fw, early in (("pytorch", True), ("torchtitan", True), ("megatron", False), ("nemo", False),
                      ("deepspeed", False), (None, False)):
        plan = sc(**({"framework": fw} if fw else {})).plan
        assert recompute_early_stop(plan) is early, fw
    # the plan field wins over the framework's rule, both ways
    assert recompute_early_stop(sc(framework="megatron", recompute_early_stop=True).plan)
    assert not recompute_early_stop(sc(framework="pytorch", recompute_early_stop=False).plan)


def test_a_16_bit_down_projection_and_what_follows_are_not_recomputed():
    s = sc(framework="pytorch", precision="bf16")
    m, plan = s.model, s.plan
    fwd = layer_ops(m, plan, "fwd")
    rec = recompute_ops(m, plan)
    i = names(fwd).index("fc2")
    assert tuple(rec) == fwd[:i]  # everything up to the down-projection, in order
    fc2 = fwd[i]
    assert gemm_flops(fwd) - gemm_flops(rec) == pytest.approx(fc2.flops)
    # GPT: the down-projection is 8h^2 of the layer's 24h^2 weight FLOPs per token
    h = m.hidden_size
    assert fc2.flops == pytest.approx(2 * plan.micro_batch_size * m.seq_length * h * m.ffn_hidden_size)
    whole = sc(framework="pytorch", precision="bf16", recompute_early_stop=False)
    assert recompute_ops(whole.model, whole.plan) == fwd


def test_an_fp8_down_projection_runs_again_and_dropout_keeps_the_whole_layer():
    s = sc(framework="torchtitan", precision="fp8", zero_stage=0)
    fwd, rec = layer_ops(s.model, s.plan, "fwd"), recompute_ops(s.model, s.plan)
    i = names(fwd).index("fc2")
    assert fwd[i].fp8 and tuple(rec) == fwd[:i + 1]  # the FP8 GEMM and its casts, not the residual add
    assert "bias dropout add" in names(fwd[i + 1:]) and len(rec) < len(fwd)
    drop = sc(model={"dropout": True}, framework="pytorch", precision="bf16")
    assert recompute_ops(drop.model, drop.plan) == layer_ops(drop.model, drop.plan, "fwd")


@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_early_stop_shortens_the_step_by_the_down_projection(engine):
    early = predict(sc(framework="pytorch", zero_stage=3), engine=engine, keep_spans=False)
    whole = predict(sc(framework="pytorch", zero_stage=3, recompute_early_stop=False), engine=engine,
                    keep_spans=False)
    gain = whole.breakdown_s["recompute"] - early.breakdown_s["recompute"]
    # fc2 is a third of a GPT layer's weight GEMMs: the recompute loses a large part, not all
    assert 0.15 * whole.breakdown_s["recompute"] < gain < 0.5 * whole.breakdown_s["recompute"]
    assert early.step_time_s < whole.step_time_s
    assert any("stops early" in a for a in early.assumptions)
    assert not any("stops early" in a for a in whole.assumptions)


def test_the_llm_foundry_rows_checkpoint_without_reentrancy():
    """llm-foundry's benchmark script sets activation_checkpointing_reentrant: False, so its
    full-recompute rows stop early (the other full-recompute rows, Megatron's, do not)."""
    from simdist.validate.training import build_cases

    cases = build_cases()[0]
    mpt = [c for c in cases if c.group.startswith("MosaicML") and c.scenario.plan.recompute == "full"]
    megatron = [c for c in cases if c.group.startswith("Megatron-LM SC'21 weak")]
    assert mpt and megatron
    assert all(recompute_early_stop(c.scenario.plan) for c in mpt)
    assert not any(recompute_early_stop(c.scenario.plan) for c in megatron)


def test_the_executor_skips_the_down_projection_only_with_early_stop():
    """executor.model.Block under full recompute: fc2 runs twice per step (forward and the
    recompute) without early stop, once with it."""
    torch = pytest.importorskip("torch")
    from executor.model import Block

    m = scenario_from_dict({**base_scenario(), "model": {
        "num_layers": 1, "hidden_size": 32, "num_attention_heads": 4, "vocab_size": 64, "seq_length": 8}}).model
    calls = {}
    for early in (True, False):
        block = Block(m, "full", 0, early_stop=early)
        n = [0]
        block.mlp.fc2.register_forward_hook(lambda *_, n=n: n.__setitem__(0, n[0] + 1))
        x = torch.randn(2, m.seq_length, m.hidden_size, requires_grad=True)
        block(x).sum().backward()
        calls[early] = n[0]
    assert calls == {True: 1, False: 2}
