"""The MoE rows of the Megatron-Bridge performance summaries mapped with the recipe of the
release that produced them (simdist.validate.moe_releases)."""

from __future__ import annotations

import pytest

from simdist.predict import predict
from simdist.spec.scenario import scenario_from_dict
from simdist.validate import moe_cp, moe_releases
from simdist.validate.rows import data_dir, read_csv


def _row(run_id: str) -> dict[str, str]:
    return next(r for r in read_csv(data_dir(None) / "training_runs.csv") if r["run_id"] == run_id)


def test_container_read_from_the_framework_cell() -> None:
    assert moe_releases.container({"framework": "Megatron-Bridge/NeMo 25.09 NeMo Container"}) == "25.09"
    assert moe_releases.container({"framework": "Megatron-Bridge/NeMo 26.02.01 NeMo Container"}) == "26.02.01"
    assert moe_releases.container({"framework": "Megatron-LM"}) is None
    assert moe_releases.release_plan("qwen3_30b_a3b", {"framework": "Megatron-LM"}) == {}


@pytest.mark.parametrize(("run_id", "dispatcher", "ep_overlap", "tp_overlap"), [
    ("R0135", "alltoall", False, True),   # 25.09: run_script.py sets the a2a overlap for DeepSeek-V3 only
    ("R0134", "alltoall", False, False),  # 25.09, TP1: no TP overlap to run
    ("R0128", "alltoall", True, False),   # 25.11: moe_a2a_overlap=True, no flex backend
    ("R0116", "flex", False, False),      # 26.02.01: HybridEP, no overlap (#2477, r0.3.0 / v0.3.1)
    ("R0122", "flex", True, False),       # 26.02: DeepEP with moe_a2a_overlap=True (v0.3.0)
    ("R0099", "flex", False, False),      # 26.06: HybridEP, no overlap (the current recipe)
    ("R0107", "alltoall", True, False),   # Qwen3-235B from 25.11 on: alltoall with the overlap
    ("R0133", "flex", True, True),        # DeepSeek-V3, 25.09: DeepEP with A2A_1F1B on H100
])
def test_each_row_gets_its_release_recipe(run_id: str, dispatcher: str, ep_overlap: bool, tp_overlap: bool) -> None:
    plan = moe_cp.moe_scenario(_row(run_id))["plan"]
    assert (plan["moe_dispatcher"], plan.get("ep_comm_overlap", False),
            plan["tp_comm_overlap"]) == (dispatcher, ep_overlap, tp_overlap)


def test_qwen3_235b_token_drop_step_within_fifteen_percent_of_the_25_09_summary() -> None:
    """Megatron-Bridge performance summary, 25.09 NeMo container, DGX-H100 (docs/performance-
    summary-archive.md): Qwen3_235B_a22B (tokendrop), 256 GPUs, TP2 PP8 VP4 EP32, GBS 2048, MBS 1,
    1204 tokens/s/GPU = 2048 x 4096 / (1204 x 256) = 27.216 s per step (R0135). Mapped with the
    current recipe's all-to-all overlap, which that release did not run, it was predicted 26%
    fast; with its own recipe -13%. Published figure, tolerance 15%."""
    row = _row("R0135")
    published = 2048 * 4096 / (float(row["measured_tokens_per_s_per_gpu"]) * 256)
    assert published == pytest.approx(27.216, abs=1e-3)
    p = predict(scenario_from_dict(moe_cp.moe_scenario(row)), engine="analytic", keep_spans=False)
    assert p.step_time_s == pytest.approx(published, rel=0.15)


def test_deepseek_v3_step_within_ten_percent_of_the_25_09_summary() -> None:
    """Megatron-Bridge performance summary, 25.09 NeMo container, DGX-H100: DeepSeekV3 (dropless),
    1024 GPUs, TP2 PP8 VP4 EP64, GBS 8192, MBS 1, 1297 tokens/s/GPU = 8192 x 4096 / (1297 x 1024)
    = 25.264 s per step (R0133). That release's run_script.py runs it with the 1F1B all-to-all
    overlap on H100 (A2A_1F1B); mapped without it, it was predicted 12% slow. Published figure,
    tolerance 10%."""
    row = _row("R0133")
    published = 8192 * 4096 / (float(row["measured_tokens_per_s_per_gpu"]) * 1024)
    assert published == pytest.approx(25.264, abs=1e-3)
    p = predict(scenario_from_dict(moe_cp.moe_scenario(row)), engine="analytic", keep_spans=False)
    assert p.step_time_s == pytest.approx(published, rel=0.10)


def _parallelism(plan: dict[str, object]) -> tuple[object, ...]:
    return (plan["pp"], plan["ep"], plan.get("virtual_pipeline_stages", 1), plan.get("ep_comm_overlap", False))


def test_the_26_02_01_run_is_mapped_with_the_recipe_its_branch_held() -> None:
    """Megatron-Bridge's 26.02.01 section repeats the 26.02 section's parallelism (PP2 VP12 EP8)
    for Qwen3-30B on H100, but its numbers were measured with the r0.3.0 branch after #2477
    (2026-02-24: PP1 EP16, HybridEP, no all-to-all overlap; v0.3.1). Published, DGX-H100, 16 GPUs,
    GBS 1024: 26.02 5,113 tokens/s/GPU (R0122), 26.02.01 9,058 (R0116), 26.04 8,901 (R0111),
    26.04.01 8,960 (R0106), 26.06 8,826 (R0099): the 26.02.01 run is within 3% of every run of the
    PP1 EP16 recipe and 1.77x the 26.02 run of the PP2 VP12 EP8 one."""
    tput = {rid: float(_row(rid)["measured_tokens_per_s_per_gpu"]) for rid in ("R0099", "R0106", "R0111", "R0116", "R0122")}
    assert tput["R0116"] / tput["R0122"] == pytest.approx(1.77, abs=0.01)
    assert all(tput["R0116"] == pytest.approx(tput[rid], rel=0.03) for rid in ("R0099", "R0106", "R0111"))
    assert (_row("R0116")["pp"], _row("R0116")["vpp"], _row("R0116")["ep"]) == ("2", "12", "8")  # the columns
    plans = {rid: moe_cp.moe_scenario(_row(rid))["plan"] for rid in ("R0111", "R0116", "R0122")}
    assert _parallelism(plans["R0116"]) == _parallelism(plans["R0111"]) == (1, 16, 1, False)
    assert _parallelism(plans["R0122"]) == (2, 8, 12, True)
