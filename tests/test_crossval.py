"""The efficiency fit (simdist.validate.fit) and cross-validation (simdist.validate.crossval): the
fit finds constants that generated the data, and cross-validation predicts a left-out group
with constants fitted without it."""

from dataclasses import replace

import pytest

from simdist.validate.crossval import (
    MemoryModel,
    cross_validate,
    crossval_rows_table,
    crossval_table,
)
from simdist.validate.fit import case_time, fit, fit_constants, objective, with_efficiency
from simdist.validate.training import build_cases

NO_MEMORY = MemoryModel(fit=lambda cases: None, peak_gib=lambda case, fitted: 1.0)


@pytest.fixture(scope="module")
def cases():
    return build_cases()[0]


def _synthetic(cases, group_gen_eff):
    """Cases whose 'measured' step is what the closed form predicts with the given constants per
    generation (and a group label per generation), so the fit must find them again."""
    out = []
    for c in cases:
        eff = group_gen_eff.get(c.gpu_generation)
        if eff is None:
            continue
        out.append(replace(c, measured_step_s=case_time(c, eff)))
    return out


def test_fit_recovers_the_constants_that_generated_the_data(cases):
    picked = [c for c in cases if c.group.startswith("Megatron-Core H100")]
    truth = {"gemm": 0.62, "attention": 0.41}
    synthetic = _synthetic(picked, {"h100": truth})
    eff, score = fit_constants(synthetic)
    assert eff["gemm"] == pytest.approx(truth["gemm"], abs=0.01)
    assert score < 0.01
    # the objective is worse away from the truth
    assert objective(synthetic, {"gemm": 0.50, "attention": 0.41}) > 5 * max(score, 1e-4)


def test_with_efficiency_keeps_the_fp8_ratio(cases):
    sc = next(c.scenario for c in cases if c.gpu_generation == "h100")
    old = sc.cluster.gpu.efficiency
    new = with_efficiency(sc, {"gemm": old["gemm"] / 2, "attention": 0.3}).cluster.gpu.efficiency
    assert new["fp8_gemm"] == pytest.approx(old["fp8_gemm"] / 2)
    assert new["attention"] == 0.3 and new["memory"] == old["memory"]


def test_a_generation_without_rows_takes_the_pooled_constants(cases):
    picked = [c for c in cases if c.group.startswith(("Megatron-Core H100", "Megatron-LM SC'21 weak"))]
    result = fit([c for c in picked if c.gpu_generation == "h100"] + [c for c in picked if c.gpu_generation == "a100"])
    assert set(result.per_generation) == {"a100", "h100"}
    assert result.for_generation("v100") == result.pooled
    for k in ("gemm", "attention"):
        lo, hi = sorted(e[k] for e in result.per_generation.values())
        assert lo <= result.pooled[k] <= hi


def test_cross_validation_scores_each_group_with_a_fit_that_never_saw_it(cases):
    """Two groups generated with different constants on one generation: fitted together, each is
    off; each left out, it is predicted with the other's constants, so its cross-validated
    error is the gap between them, larger than its in-sample error."""
    a = [c for c in cases if c.group.startswith("Megatron-Core H100")]
    b = [c for c in cases if c.group.startswith("MosaicML") and c.gpu_generation == "h100"][:12]
    a = _synthetic(a, {"h100": {"gemm": 0.50, "attention": 0.35}})
    b = _synthetic(b, {"h100": {"gemm": 0.70, "attention": 0.35}})
    cv = cross_validate(a + b, NO_MEMORY)
    by = {s.group: s for s in cv.groups}
    for g in (a[0].group, b[0].group):
        assert by[g].cross_validated > by[g].in_sample
    # group a ran at 50% GEMM efficiency; predicted with b's 70% it comes out too fast
    assert by[a[0].group].cv_bias < -0.10 and by[b[0].group].cv_bias > 0.10
    assert set(cv.held_out_fits) == {a[0].group, b[0].group}
    text = crossval_table(cv)
    assert "cross-val" in text and "overall" in text and "without " + a[0].group in text
    # per row: every row once, its cross-validated error as the fit without its group gives it
    lines = crossval_rows_table(cv, a + b).splitlines()
    assert len(lines) == 2 + len(a) + len(b)
    row = next(line for line in lines if line.startswith(a[0].run_id + " "))
    assert row.rstrip().endswith(f"{cv.errors[a[0].run_id][2]:+.1%}") and cv.errors[a[0].run_id][2] < -0.10


def test_memory_columns_use_the_registered_memory_model(cases):
    """A memory model that fits one constant (a scale) per training set: the cross-validated
    figure uses the constant fitted without the group."""
    picked = [replace(c, measured_peak_gib=10.0 if c.group.startswith("Megatron-Core") else 20.0)
              for c in cases if c.group.startswith(("Megatron-Core H100", "Megatron-LM SC'21 weak"))]
    model = MemoryModel(fit=lambda rows: sum(r.measured_peak_gib for r in rows) / len(rows),
                        peak_gib=lambda case, mean: mean)
    cv = cross_validate(picked, model)
    by = {s.group: s for s in cv.groups}
    core = by["Megatron-Core H100 weak scaling (2024)"]
    assert core.memory_rows == 9
    assert core.memory_cross_validated == pytest.approx(1.0)  # predicted 20 GiB for 10
    assert core.memory_in_sample < core.memory_cross_validated


def test_the_objective_weights_each_source_group_once(cases):
    """A table repeated ten times moves the fit no more than once: the objective is the mean over
    groups of each group's mean |log error| (simdist.validate.fit.objective)."""
    a = [c for c in cases if c.group.startswith("Megatron-Core H100")][:3]
    b = [c for c in cases if c.group.startswith("torchtitan Llama 3.1 H100")][:2]
    eff = {"gemm": 0.5, "attention": 0.3}
    assert objective(a + b * 10, eff) == pytest.approx(objective(a + b, eff))
    per = [objective(a, eff), objective(b, eff)]
    assert objective(a + b, eff) == pytest.approx(sum(per) / 2)


def test_the_dense_overall_leaves_out_exactly_the_moe_rows(cases):
    """"overall, MoE rows excepted" pools every row but the mixture-of-experts group's, and its
    error is the mean over exactly those rows (weighted by rows, as "overall")."""
    from simdist.validate.crossval import OVERALL_DENSE
    from simdist.validate.moe_cp import GROUP_MOE

    moe = [c for c in cases if c.group == GROUP_MOE][:2]
    dense = [c for c in cases if c.group.startswith("Megatron-Core H100")][:3]
    assert len(moe) == 2 and len(dense) == 3
    cv = cross_validate(moe + dense, NO_MEMORY)
    by = {s.group: s for s in cv.groups}
    assert by["overall"].rows == 5 and by[OVERALL_DENSE].rows == 3
    expected = sum(abs(cv.errors[c.run_id][2]) for c in dense) / 3
    assert by[OVERALL_DENSE].cross_validated == pytest.approx(expected)
    assert OVERALL_DENSE not in {s.group for s in cross_validate(dense, NO_MEMORY).groups}
