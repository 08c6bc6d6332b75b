"""Cross-validation of the fitted constants (`simdist validate --cv`): the error a user should
expect on runs simdist was never tuned to.

Every fitted constant (:mod:`simdist.validate.fit`: the per-generation GEMM and attention
efficiencies) is refitted with one source group of training_runs.csv left out, and that group
is predicted with the refit; a generation with no rows left takes the pooled constants (the
mean of the other generations'). Per group
the report shows, side by side:

- ``catalog``: the error with the constants simdist ships (what `simdist validate` reports);
- ``in-sample``: with the constants fitted on every row, this group included;
- ``cross-validated``: with the constants fitted without this group.

Peak memory is scored the same way on the rows that publish it, through :data:`MEMORY_MODEL`
(a memory model with fitted constants replaces it, and its constants are refitted per group
like the efficiencies).

Below "overall", :data:`OVERALL_DENSE` pools every row but the mixture-of-experts ones: their
steps hold host work the model prices only in part, so they are scored but neither fitted on
(:func:`simdist.validate.moe_cp.fitted`) nor counted in the dense-model figure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from simdist.frozen import frozen
from simdist.validate.fit import FitResult, case_time, fit
from simdist.validate.moe_cp import GROUP_MOE
from simdist.validate.rows import error_summary
from simdist.validate.training import Case


@frozen
class MemoryModel:
    """How cross-validation predicts a row's peak memory: ``fit`` the memory model's constants on
    the training rows (anything; None when it has none), ``peak_gib`` predicts one row with
    them. The memory model that fits constants registers its own here."""

    fit: Callable[[Sequence[Case]], Any]
    peak_gib: Callable[[Case, Any], float]


def predicted_peak_gib(case: Case, fitted: Any = None) -> float:
    """The prediction's peak memory per GPU (reserved by the allocator when the prediction
    reports it, else the tensors' peak)."""
    from simdist.predict import predict

    p = predict(case.scenario, engine="analytic", keep_spans=False)
    reserved = getattr(p, "reserved_gib", None)
    if reserved is None:
        per_stage = [getattr(s, "reserved_gib", None) for s in p.per_stage]
        reserved = max(per_stage) if per_stage and all(v is not None for v in per_stage) else None
    return float(reserved) if reserved is not None else p.peak_gib


OVERALL_DENSE = "overall, MoE rows excepted"
MEMORY_MODEL = MemoryModel(fit=lambda cases: None, peak_gib=predicted_peak_gib)


@frozen
class GroupScore:
    """One source group (or "overall"): mean |error| of the step time with the shipped, the
    in-sample and the cross-validated constants, the cross-validated bias and worst row, and
    the same for peak memory on the rows that publish it (None without such rows)."""

    group: str
    rows: int
    catalog: float
    in_sample: float
    cross_validated: float
    cv_bias: float
    cv_max: float
    memory_rows: int = 0
    memory_in_sample: float | None = None
    memory_cross_validated: float | None = None


@frozen
class CrossValidation:
    groups: tuple[GroupScore, ...]
    full_fit: FitResult
    held_out_fits: dict[str, FitResult]
    errors: dict[str, tuple[float, float, float]]  # run_id -> (catalog, in-sample, cross-validated)


def cross_validate(cases: Sequence[Case], memory: MemoryModel = MEMORY_MODEL) -> CrossValidation:
    """Leave each source group out in turn: refit, predict it, and score it."""
    groups = sorted({c.group for c in cases})
    full = fit(cases)
    mem_full = memory.fit(cases)
    held: dict[str, FitResult] = {}
    errors: dict[str, tuple[float, float, float]] = {}
    mem: dict[str, tuple[float, float, float]] = {}  # run_id -> (measured, in-sample, cv)
    for g in groups:
        test = [c for c in cases if c.group == g]
        train = [c for c in cases if c.group != g]
        held[g] = fit(train, start=full, only={c.gpu_generation for c in test})
        mem_held = memory.fit(train)
        for c in test:
            gen = c.gpu_generation
            err = (case_time(c) / c.measured_step_s - 1,
                   case_time(c, full.for_generation(gen)) / c.measured_step_s - 1,
                   case_time(c, held[g].for_generation(gen)) / c.measured_step_s - 1)
            errors[c.run_id] = err
            if c.measured_peak_gib:
                mem[c.run_id] = (c.measured_peak_gib, memory.peak_gib(c, mem_full), memory.peak_gib(c, mem_held))
    return CrossValidation(tuple(_scores(cases, errors, mem)), full, held, errors)


def _scores(cases: Sequence[Case], errors: dict[str, tuple[float, float, float]],
            mem: dict[str, tuple[float, float, float]]) -> list[GroupScore]:
    out = []
    order = sorted({c.group for c in cases}, key=lambda g: min(c.run_id for c in cases if c.group == g))
    pooled = {"overall": lambda c: True}
    if any(c.group == GROUP_MOE for c in cases):  # the dense-model figure (module docstring)
        pooled[OVERALL_DENSE] = lambda c: c.group != GROUP_MOE
    for g in [*order, *pooled]:
        rows = [c for c in cases if (pooled[g](c) if g in pooled else c.group == g)]
        per = [error_summary(((g, errors[c.run_id][i]) for c in rows), overall=False)[g] for i in range(3)]
        mrows = [c for c in rows if c.run_id in mem]
        m_in = m_cv = None
        if mrows:
            m_in = sum(abs(mem[c.run_id][1] / mem[c.run_id][0] - 1) for c in mrows) / len(mrows)
            m_cv = sum(abs(mem[c.run_id][2] / mem[c.run_id][0] - 1) for c in mrows) / len(mrows)
        out.append(GroupScore(g, len(rows), per[0]["mae"], per[1]["mae"], per[2]["mae"], per[2]["bias"],
                              per[2]["max"], len(mrows), m_in, m_cv))
    return out


def crossval_rows_table(cv: CrossValidation, cases: Sequence[Case]) -> str:
    """One line per row: its plan and tokens per micro-batch (what residuals are read against),
    then its step-time error with the shipped, in-sample and cross-validated constants."""
    from simdist.table import table

    rows = []
    for c in cases:
        if c.run_id not in cv.errors:
            continue
        p, m = c.scenario.plan, c.scenario.model
        plan = (f"tp{p.tp} pp{p.pp} dp{p.dp} v{p.virtual_pipeline_stages} mb{p.micro_batch_size} z{p.zero_stage} "
                f"{p.recompute} {p.precision}")
        cat, ins, held = cv.errors[c.run_id]
        rows.append([c.run_id, c.group[:32], c.label, c.scenario.cluster.gpu.name, c.scenario.world_size,
                     m.seq_length, m.seq_length * p.micro_batch_size, plan, f"{cat:+.1%}", f"{ins:+.1%}",
                     f"{held:+.1%}"])
    return table(["run", "group", "model", "GPU", "GPUs", "seq", "tokens/mb", "plan", "catalog", "in-sample",
                  "cross-val"], rows, align="llllrrrlrrr")


def crossval_table(cv: CrossValidation) -> str:
    """The side-by-side report, then the constants each fit found."""
    from simdist.table import table

    def pct(x: float | None) -> str:
        return "" if x is None else f"{x:.1%}"

    rows = [[s.group, s.rows, pct(s.catalog), pct(s.in_sample), pct(s.cross_validated), f"{s.cv_bias:+.1%}",
             pct(s.cv_max), s.memory_rows or "", pct(s.memory_in_sample), pct(s.memory_cross_validated)]
            for s in cv.groups]
    out = [table(["group", "rows", "catalog", "in-sample", "cross-val", "cv bias", "cv max", "mem rows",
                  "mem in-sample", "mem cross-val"], rows, align="lrrrrrrrrr")]
    out.append("")
    out.append("step time: mean |predicted/measured - 1| per group; catalog = shipped constants, in-sample = fitted "
               "on every row, cross-val = fitted without the group (a generation left without rows: pooled)")
    fits = [("all rows", cv.full_fit)] + [(f"without {g}", f) for g, f in cv.held_out_fits.items()]
    lines = []
    for name, f in fits:
        gens = ", ".join(f"{gen} gemm {e['gemm']:.3f} attn {e['attention']:.3f}"
                         + (f" fp8 {e['fp8_gemm']:.3f}" if "fp8_gemm" in e else "") for gen, e in f.per_generation.items())
        lacking = sorted(set(cv.full_fit.per_generation) - set(f.per_generation))
        pooled = (f"; {', '.join(lacking)} pooled gemm {f.pooled['gemm']:.3f} attn {f.pooled['attention']:.3f}"
                  if lacking and f.pooled else "")
        lines.append(f"  {name}: {gens}{pooled}")
    out.append("fitted constants:")
    out += lines
    return "\n".join(out)
