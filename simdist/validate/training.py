"""The training-runs report: predict the published training runs of training_runs.csv and
compare the step time, per row, per source and overall.

A report, not a gate. Rows that leave part of the plan unstated (micro-batch size, interleaving)
are predicted with the fastest setting that fits among the usual choices, as the authors tuned
their runs; the row says so. Step time is measured directly where the source gives it, else
derived from the reported TFLOP/s with the source's own FLOP formula (see each group's notes).

How a row becomes a scenario is :mod:`simdist.validate.mapping`. Rows the simulator cannot
express yet are skipped, each with its reasons (:func:`unsupported`): LoRA, rows whose plan,
precision, batch or model dimensions are unstated, GPUs without a cluster preset, and frameworks
whose defaults are not mapped. Mixture-of-experts and context-parallel rows are mapped by
:mod:`simdist.validate.moe_cp`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from simdist.analytic.flops import megatron_flops_per_step, model_flops_per_step
from simdist.errors import ScenarioError
from simdist.spec.scenario import Scenario, scenario_from_dict
from simdist.validate import moe_cp
from simdist.validate.mapping import candidates, row_defaults, row_to_scenario_dict, unsupported
from simdist.validate.rows import cell_float, data_dir, error_summary, read_csv

__all__ = ["Case", "Result", "build_cases", "candidates", "row_to_scenario_dict", "run_training", "summarize",
           "unsupported"]

@dataclass
class Case:
    """A predictable row: its scenario and what was measured."""

    run_id: str
    group: str
    label: str
    measured_step_s: float
    measured_from: str  # "step time" | "TFLOP/s (Megatron eq. 3)" | "TFLOP/s (model)"
    scenario: Scenario
    tuned: list[str]  # unstated plan fields chosen as the fastest that fits
    # the runner-up choices of the unstated fields (fitting, fastest first, ``scenario`` among
    # them): cross-validation picks among them again with its refitted constants
    options: tuple[tuple[Scenario, tuple[str, ...]], ...] = ()
    measured_peak_gib: float | None = None  # the row's published peak memory per GPU, if any
    defaults: tuple[str, ...] = ()  # unstated values taken from the framework's documented defaults
    # False: scored, but not used to fit the shared efficiencies (simdist.validate.moe_cp.fitted)
    fitted: bool = True

    @property
    def gpu_generation(self) -> str:
        """The GPU generation whose fitted efficiencies this row informs (a100, h100, ...)."""
        return generation(self.scenario.cluster.gpu.name)


def generation(gpu_name: str) -> str:
    """A catalog GPU's generation: the efficiencies are fitted per generation, never per SKU."""
    return gpu_name.split("-")[0]


def _measured(row: dict[str, str], sc: Scenario) -> tuple[float, str] | None:
    step = cell_float(row["measured_step_s"]) or cell_float(row["derived_step_s"])
    if step:
        return step, "step time"
    tokens = cell_float(row.get("measured_tokens_per_s_per_gpu"))
    if tokens:  # the plan's global batch of sequences over the whole job's throughput
        return sc.plan.global_batch_size * sc.model.seq_length / (tokens * sc.world_size), "tokens/s"
    tflops = cell_float(row["measured_tflops_per_gpu"])
    if not tflops:
        return None
    n = sc.world_size
    if "eq.3" in row["recompute"] or row["source"].startswith("Megatron-LM SC'21"):
        return megatron_flops_per_step(sc.model, sc.plan) / (tflops * 1e12 * n), "TFLOP/s (Megatron eq. 3)"
    return model_flops_per_step(sc.model, sc.plan) / (tflops * 1e12 * n), "TFLOP/s (model FLOPs)"


OPTIONS_KEPT = 3  # runner-up choices of unstated fields kept for cross-validation


def build_cases(data: str | Path | None = None) -> tuple[list[Case], list[tuple[str, str]]]:
    """The predictable rows of training_runs.csv as cases, and (run_id, reasons) of the rest."""
    from simdist.predict import predict

    cases: list[Case] = []
    skipped: list[tuple[str, str]] = []
    for row in read_csv(data_dir(data) / "training_runs.csv"):
        rid = row["run_id"]
        if moe_cp.handles(row):  # experts and context parallelism: simdist.validate.moe_cp
            got = moe_cp.build(row)
            if isinstance(got, str):
                skipped.append((rid, got))
            else:
                cases.append(Case(rid, moe_cp.group(row), row["model_name"], got[2][0], got[2][1], got[0], got[1],
                                  measured_peak_gib=cell_float(row.get("measured_peak_mem_gib")),
                                  fitted=moe_cp.fitted(row)))
            continue
        why = unsupported(row)
        if why:
            skipped.append((rid, "; ".join(why)))
            continue
        base = row_to_scenario_dict(row)
        ranked: list[tuple[tuple[bool, float], int, Scenario, tuple[str, ...]]] = []
        for i, ov in enumerate(candidates(row, base)):
            try:
                sc = scenario_from_dict(row_to_scenario_dict(row, ov))
            except ScenarioError:
                continue
            p = predict(sc, engine="analytic", keep_spans=False)
            # fitting plans first, then the fastest
            ranked.append(((not p.fits, p.step_time_s), i, sc, tuple(f"{k}={v}" for k, v in ov.items())))
        if not ranked:
            skipped.append((rid, "no valid plan"))
            continue
        ranked.sort(key=lambda r: r[:2])
        options = tuple((r[2], r[3]) for r in ranked[:OPTIONS_KEPT] if r[0][0] == ranked[0][0][0])
        sc, tuned = options[0][0], list(options[0][1])
        meas = _measured(row, sc)
        if meas is None:
            skipped.append((rid, "no step time or TFLOP/s"))
            continue
        cases.append(Case(rid, row["source"], row["model_name"], meas[0], meas[1], sc, tuned, options,
                          cell_float(row.get("measured_peak_mem_gib")), tuple(row_defaults(row))))
    return cases, skipped


# --- report ---------------------------------------------------------------------------------


@dataclass
class Result:
    case: Case
    predicted_s: float

    @property
    def error(self) -> float:
        return self.predicted_s / self.case.measured_step_s - 1.0


def run_training(data: str | Path | None = None, engine: str = "analytic"
                 ) -> tuple[list[Result], list[tuple[str, str]]]:
    """Every predictable row predicted by ``engine``, and (run_id, reasons) of the skipped rows."""
    from simdist.predict import predict

    cases, skipped = build_cases(data)
    results = [Result(c, predict(c.scenario, engine=engine, keep_spans=False).step_time_s) for c in cases]
    return results, skipped


def summarize(results: list[Result]) -> dict[str, dict[str, float]]:
    """Rows, mean |error|, bias and max |error| per source group and overall."""
    return error_summary((r.case.group, r.error) for r in results)
