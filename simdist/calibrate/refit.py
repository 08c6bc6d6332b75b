"""Fit a profile's executor terms again from runs already in the run store: no runs, no
microbenchmarks (``simdist calibrate --refit PROFILE``).

The microbenchmark part of a profile (compute curves, links, cores) is kept; every term fitted
from executor runs is reset (:func:`microbenchmark_part`) and fitted again, by the same code as a
fresh calibration (simdist.calibrate.terms), from every stored measurement of each scenario
given. Useful after a change of the model, or to fit a subset of the runs of a calibration.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from simdist.calibrate.phases import at_rate
from simdist.calibrate.repeat import Repeated
from simdist.calibrate.store import RunStore
from simdist.calibrate.terms import FitRun
from simdist.errors import Problem, ScenarioError
from simdist.spec.measurement import Measurement
from simdist.spec.profile import CalibrationProfile

MICROBENCHMARK_RESIDUALS = ("link ", "gemm curve", "attention curve", "memory curve")


def microbenchmark_part(profile: CalibrationProfile) -> CalibrationProfile:
    """The profile as the microbenchmarks alone fitted it: no executor-run terms, no record of
    fitted runs (the compute scale taken back out of the peaks)."""
    return replace(
        at_rate(profile, 1.0 / (profile.compute_scale or 1.0)), compute_scale=1.0, kernel_overhead_s=None, framework_overheads_s={}, sync_wait_fractions={}, sync_point_waits_s={}, dp_step_wait_s=0.0,
        optimizer_tensor_s=None, optimizer_layer_tensor_s={}, coschedule_wait_s=0.0, sleep_shares={}, fitted_from=["microbenchmarks"],
        residuals={k: v for k, v in profile.residuals.items() if k.startswith(MICROBENCHMARK_RESIDUALS)},
        spreads={}, core_waits={}, error_band=0.0, terms_from={})


def stored_fit_runs(store: RunStore, files: list[str], since: int = 0) -> list[FitRun]:
    """Each scenario file's stored measurements (matched by the scenario's hash; only those stored
    after run id ``since``: one calibration's in a store that holds several) as one repeated
    series; a file with none is a problem naming it."""
    from simdist.spec.scenario import load_scenario

    runs, problems = [], []
    for f in files:
        sc = load_scenario(f)
        stored = [r for r in store.runs("measurement", sc.hash()) if r.id > since]
        if not stored:
            problems.append(Problem("file", f"{f}: the run store {store.path} holds no measurement of it "
                                    f"(scenario hash {sc.hash()}); run it first (simdist run, or calibrate without --refit)"))
            continue
        measurements = tuple(Measurement.from_dict(r.payload) for r in stored)
        rep = Repeated(Path(f).stem, measurements, stable=True, stopped="stored")
        runs.append(FitRun(rep.name, Path(f).read_text(encoding="utf-8"), str(Path(f).parent), rep))
    if problems:
        raise ScenarioError(problems)
    return runs
