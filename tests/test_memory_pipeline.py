"""Pipeline-stage memory: the layers an interleaved stage holds, ZeRO-2 style FSDP, the SwiGLU
tensors saved eager or fused, and Llama 3 405B's pre-training plan, which the paper ran without
activation checkpointing on 80 GB H100s (Dubey et al. arXiv:2407.21783 sec 3.3.2 and Table 4)."""

from __future__ import annotations

import pytest
from conftest import base_scenario

from simdist.analytic.activations import layer_saved_tensors, layers_held
from simdist.analytic.memory import memory_per_stage, model_state_bytes
from simdist.analytic.params import params_per_rank
from simdist.sim import schedules
from simdist.spec.scenario import scenario_from_dict
from simdist.spec.stages import stage_layer_ranges
from simdist.validate.rows import packaged_data_dir, read_csv


def sc_of(model: str = "llama3-8b", gpus: int = 8, **plan):
    d = base_scenario(**plan)
    d["model"] = {"preset": model}
    d["cluster"] = {"preset": "dgx-h100", "num_nodes": gpus // 8}
    return scenario_from_dict(d)


def replayed_layers_peak(num_layers: int, p: int, m: int, v: int, stage: int) -> int:
    """Walk the event engine's interleaved order and add each live chunk forward's layers."""
    sizes = [len(r) for r in stage_layer_ranges(num_layers, p, v)[stage]]
    live = peak = 0
    for a in schedules.interleaved_1f1b(p, m, v)[stage]:
        live += sizes[a.chunk] if a.kind == "F" else -sizes[a.chunk]
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize(("layers", "p", "m", "v"), [(126, 16, 16, 7), (126, 16, 32, 7), (30, 4, 8, 4),
                                                     (32, 4, 4, 8), (80, 8, 24, 3), (96, 16, 192, 2), (12, 2, 6, 3)])
def test_interleaved_stage_holds_the_layers_of_its_live_chunks(layers, p, m, v):
    """Chunks of unequal size (pp*v not dividing the layers) hold their own layers: the old count
    (forwards in flight x the largest chunk) put Llama 3 405B at TP 8, PP 16, v 7 at 156 GiB."""
    d = base_scenario(pp=p, virtual_pipeline_stages=v, schedule="interleaved-1f1b", global_batch_size=m)
    d["model"] = {"preset": "gpt3-175b", "num_layers": layers}
    d["cluster"]["gpus_per_node"] = p
    sc = scenario_from_dict(d)
    for stage in range(p):
        assert layers_held(sc.model, sc.plan, stage) == replayed_layers_peak(layers, p, m, v, stage)


def test_zero2_fsdp_shards_the_fp32_weights_and_keeps_the_gathered_ones():
    """SHARD_GRAD_OP / reshard_after_forward=False: fp32 shard + the gathered bf16 weights (not an
    unsharded fp32 copy besides); gradients reduce-scattered per micro-batch stay sharded."""
    sc = sc_of(framework="pytorch", zero_stage=2, pp=2, global_batch_size=16)
    n = params_per_rank(sc.model, sc.plan, 0)
    s = model_state_bytes(sc.model, sc.plan, 0)
    assert s["params"] == pytest.approx(4 * n / 4 + 2 * n)
    assert s["grads"] == pytest.approx(4 * n / 4)


def test_zero2_fsdp_under_torchtitans_pipeline_accumulates_unsharded_gradients():
    sc = sc_of(framework="torchtitan", zero_stage=2, pp=2, global_batch_size=16)
    n = params_per_rank(sc.model, sc.plan, 0)
    s = model_state_bytes(sc.model, sc.plan, 0)
    assert s["params"] == pytest.approx(4 * n / 4 + 2 * n)
    assert s["grads"] == pytest.approx(4 * n / 4 + 4 * n)


def test_fused_swiglu_saves_gate_and_up_but_not_silu():
    fused = sc_of(fused_elementwise=True, global_batch_size=8)
    eager = sc_of(fused_elementwise=False, global_batch_size=8)
    f_names = [n for n, _ in layer_saved_tensors(fused.model, fused.plan)]
    e_names = [n for n, _ in layer_saved_tensors(eager.model, eager.plan)]
    assert "silu(gate)" in e_names and "silu(gate)" not in f_names
    extra = sum(b for _, b in layer_saved_tensors(eager.model, eager.plan)) - sum(
        b for _, b in layer_saved_tensors(fused.model, fused.plan))
    m = fused.model
    assert extra == pytest.approx(2 * m.seq_length * fused.plan.micro_batch_size * m.ffn_hidden_size)


# Llama 3 405B, 8K sequences on 16,384 H100 80GB: TP 8, PP 16, DP 128, 16 sequences per DP
# group (Table 4); "we could pre-train Llama 3 on sequences of 8K tokens without activation
# checkpointing" (sec 3.3.2). The paper made it fit with memory work of its own (deallocating the
# stages' input and output tensors), so the prediction must sit close below the HBM capacity.


@pytest.mark.parametrize("v", [2, 4, 7])
def test_llama3_405b_8k_plan_fits_80gb_without_recompute(v):
    from simdist.validate.mapping import row_to_scenario_dict

    row = {r["run_id"]: r for r in read_csv(packaged_data_dir() / "training_runs.csv")}["R0060"]
    sc = scenario_from_dict(row_to_scenario_dict(row, {"virtual_pipeline_stages": v}))
    assert sc.plan.recompute == "none" and sc.plan.num_microbatches == 16
    peak = max(s.peak for s in memory_per_stage(sc.model, sc.plan, sc.cluster))
    assert 0.8 * sc.cluster.gpu.memory_bytes <= peak <= sc.cluster.gpu.memory_bytes
