"""Fit the executor-run terms of a profile, one software layer at a time, and check the fit.

The microbenchmarks fix the compute curves and the links (simdist.calibrate.fit). What they
cannot see is the framework around the kernels, so executor runs fit it, phase by phase
(simdist.calibrate.phases) and layer by layer (:func:`simdist.spec.software_layers.profile_layers`: "tp",
"cp", "ep", "zero1", "zero2", "zero3", "hsdp", "pipeline", "multichunk", "split_backward",
"compression", "ps", "async"):

1. runs of plans through no layer (plain DDP) fit the kernels' rate relative to the
   microbenchmarks' and the per-op overhead (forward + backward + the rest of the step's CPU
   time), the optimizer's cost per parameter tensor (optimizer phase) and their own waits
   (``sync_wait_fractions["base"]``: comm + core wait beyond the collectives' prices);
2. then, repeatedly, the runs that add exactly one layer not fitted yet fit that layer: its
   extra per-op cost (``framework_overheads_s``) and per-tensor optimizer cost, which may be
   below zero (cheaper than plain DDP), then its sync-point waits (a share of compute and,
   where its runs tell them apart, a fixed wait per collective call), from those of its runs
   whose ranks have a core each, and the share of its communication they sleep (the TP layer:
   what time-shared ranks of the same stage fill, simdist.analytic.timeshare);
3. runs with more ranks than cores then fit the wait at a sync point whose peers are
   descheduled (``coschedule_wait_s``, simdist.analytic.cpu_syncs) on their step times;
4. a run whose plan adds two unfitted layers at once cannot tell them apart: it is reported.

Runs without separate phases (a GPU's: no exposed-communication phase) fit the per-op overheads
to their step times instead (golden-section search, :func:`simdist.calibrate.fit.fit_overhead`).
Every fitted value is checked against its search range, and every fitted run against its own
measured spread (:mod:`simdist.calibrate.honesty`). A run's measured step is the median of its
repeated runs' medians (:mod:`simdist.calibrate.repeat`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace

import yaml

from simdist.calibrate.fit import OVERHEAD_RANGE, SYNC_WAIT_MAX, fit_overhead
from simdist.calibrate.honesty import Bound, FitCheck, median_speed, reference_baseline
from simdist.calibrate.phases import (
    SCALE_RANGE,
    fit_coschedule,
    fit_layer,
    fit_plain,
    fit_sleep,
    fit_waits,
)
from simdist.calibrate.repeat import Repeated
from simdist.frozen import frozen
from simdist.spec.measurement import Measurement
from simdist.spec.profile import CalibrationProfile, HostSpeed, busy_ranks, local_processes
from simdist.spec.software_layers import BASE_TERMS, profile_layers


@frozen
class FitRun:
    """A scenario measured for fitting: its YAML text, where relative paths start, its runs."""

    name: str
    scenario_yaml: str
    base_dir: str
    repeated: Repeated

    @property
    def scenario(self):
        return _parsed(self.scenario_yaml, self.base_dir)

    def as_read(self, fitted: bool) -> tuple[FitRun, tuple[str, ...]]:
        """The runs a calibration reads, and the notes of those it set aside: a fitted plan's
        undisturbed runs, a held-out plan's made at the host's speed (Repeated.undisturbed,
        Repeated.at_host_speed: interference only adds CPU time)."""
        kept = self.repeated.undisturbed if fitted else self.repeated.at_host_speed
        return replace(self, repeated=kept), kept.notes[len(self.repeated.notes):]

    @property
    def layers(self) -> tuple[str, ...]:
        return profile_layers(self.scenario.plan)

    def predicted(self, profile: CalibrationProfile) -> dict[str, float]:
        from simdist.calibrate.compare import compare_one

        return compare_one(self.repeated.representative, self.scenario_yaml, profile, self.base_dir).predicted

    def predicted_step(self, profile: CalibrationProfile) -> float:
        """The step time ``simdist predict --profile`` gives the plan as it ran (the executor's
        ``as_run`` fields; the event engine, its default): what a fitted run is checked against."""
        from simdist.calibrate.compare import as_run_dict
        from simdist.predict import predict
        from simdist.spec.scenario import scenario_from_dict

        ran = self.repeated.representative.extras.get("as_run") or {}
        sc = scenario_from_dict(as_run_dict(yaml.safe_load(self.scenario_yaml), ran), self.base_dir)
        return predict(sc, profile=profile, engine="des", keep_spans=False).step_time_s

    @property
    def has_phases(self) -> bool:
        """The executor measured forward, backward, optimizer and communication apart (CPU runs)."""
        m = self.measured()
        return all(m.get(k) is not None for k in ("forward_s", "backward_s", "optimizer_s", "comm_s"))

    def measured(self) -> dict[str, float]:
        """The representative run's quantities, each phase the median over the repeated runs
        (one run's phases jitter as much as its step: a phase of the run whose step is the
        median need not be a median phase), and the median step. A pipeline's phases are its
        busiest rank's (:attr:`busiest_rank_phases`), as the model prices its busiest stage."""
        import statistics

        from simdist.calibrate.compare import measured_quantities

        rep = self.repeated.representative
        out = {**measured_quantities(rep), "step_time_s": self.repeated.median}
        phases = [_busiest_rank(m) if self.busiest_rank_phases else m.phases_s for m in self.repeated.runs]
        for k in ("forward", "backward", "optimizer", "comm", "other", "core_wait", "helper_threads"):
            values = [float(p[k]) for p in phases if p.get(k) is not None]
            if values:
                out[f"{k}_s"] = statistics.median(values)
        return out

    @property
    def busiest_rank_phases(self) -> bool:
        """Whether :meth:`measured` reads the phases of each run's busiest rank (the one that
        computed most) rather than the ranks' mean: for a pipeline, whose stages differ by design
        (a stage behind a busier one waits for it every micro-batch, which the ranks' mean counts
        as communication and the model, pricing the busiest stage, does not), when every run
        recorded its ranks' phases."""
        return self.scenario.plan.pp > 1 and all(m.extras.get("phases_per_rank_s") for m in self.repeated.runs)


@functools.lru_cache(maxsize=256)
def _parsed(scenario_yaml: str, base_dir: str):
    """A fit run's scenario, parsed once: the fit reads it at every probe of every term."""
    from simdist.spec.scenario import scenario_from_dict

    return scenario_from_dict(yaml.safe_load(scenario_yaml), base_dir)


def _busiest_rank(m: Measurement) -> dict[str, float]:
    """The phases of the rank of ``m`` with the most forward + backward time."""
    return max(m.extras["phases_per_rank_s"], key=lambda r: (r.get("forward") or 0.0) + (r.get("backward") or 0.0))


def _mean_log_error(runs: list[FitRun]):
    def error(profile: CalibrationProfile) -> float:
        errs = [abs(math.log(r.predicted(profile)["step_time_s"] / r.repeated.median)) for r in runs]
        return sum(errs) / len(errs)
    return error


COSCHEDULE_MAX = 0.05  # s: ten times the slice Linux gives a task on 64 cores (simdist.analytic.cpu_syncs)


def _time_shared(run: FitRun, profile: CalibrationProfile) -> bool:
    return profile.cores > 0 and busy_ranks(run.scenario) > profile.cores


def fit_terms(profile: CalibrationProfile, runs: list[FitRun]) -> tuple[CalibrationProfile, list[Bound], list[str]]:
    """The profile with every layer's terms fitted, the bounds to check, and the runs that could
    not be used (one line each)."""
    bounds: list[Bound] = []
    problems: list[str] = []
    terms_from = dict(profile.terms_from)
    plain = [r for r in runs if not r.layers]
    phased = all(r.has_phases for r in runs)  # else (e.g. GPU runs, no exposed-comm phase) fit step times
    if plain and phased:
        profile = fit_plain(profile, plain)  # (the compute phases: CPU time, never shared)
        own_cores = [r for r in plain if not _time_shared(r, profile)]
        profile = fit_waits(profile, BASE_TERMS, own_cores)
        profile = fit_sleep(profile, BASE_TERMS, own_cores)
        bounds.append(Bound("the per-op overhead (s)", profile.kernel_overhead_s or 0.0, *OVERHEAD_RANGE))
        bounds.append(Bound("the executor's compute rate over the microbenchmarks'", profile.compute_scale,
                            *SCALE_RANGE, upper_only=False))
        bounds.append(Bound("the optimizer's cost per parameter tensor (s)", profile.optimizer_tensor_s or 0.0,
                            *OVERHEAD_RANGE))
        bounds.append(Bound("the plain plans' sync-point waits (share of compute)",
                            profile.sync_wait_fractions.get(BASE_TERMS, 0.0), 0.0, SYNC_WAIT_MAX))
        bounds.append(Bound("the plain plans' wait per step at the gradient sync (s)", profile.dp_step_wait_s, 0.0,
                            COSCHEDULE_MAX))
        terms_from["per-op"] = ", ".join(r.name for r in plain)
    elif plain:
        profile = fit_overhead(profile, _mean_log_error(plain))
        bounds.append(Bound("the per-op overhead (s)", profile.kernel_overhead_s or 0.0, *OVERHEAD_RANGE))
        terms_from["per-op"] = ", ".join(r.name for r in plain)
    elif runs:
        problems.append("no run of a plain data-parallel plan (zero_stage 0, no tp, pp or compression) to fit "
                        "the per-op overhead from: add one, e.g. scenarios/local-dp.yaml")
    fitted: set[str] = set()
    pending = [r for r in runs if r.layers]
    while pending:
        groups: dict[str, list[FitRun]] = {}
        for r in pending:
            new = [x for x in r.layers if x not in fitted]
            if len(new) == 1:
                groups.setdefault(new[0], []).append(r)
        if not groups:
            break
        for layer, subset in groups.items():
            profile = fit_layer(profile, layer, subset) if phased else \
                fit_overhead(profile, _mean_log_error(subset), layer)
            bounds.append(Bound(f"the {layer} per-op overhead (s)", profile.framework_overheads_s[layer],
                                *OVERHEAD_RANGE))  # may be negative: cheaper per op than plain DDP
            own_cores = [r for r in subset if not _time_shared(r, profile)]  # waits of shared ones: coschedule
            if phased and own_cores:
                profile = fit_waits(profile, layer, own_cores)
                wait = profile.sync_wait_fractions.get(layer, 0.0)
                bounds.append(Bound(f"the {layer} sync-point waits (share of compute)", wait, 0.0, SYNC_WAIT_MAX))
                if layer in profile.sync_point_waits_s:
                    bounds.append(Bound(f"the {layer} wait per collective call (s)",
                                        profile.sync_point_waits_s[layer], 0.0, COSCHEDULE_MAX))
                profile = fit_sleep(profile, layer, own_cores)
            terms_from[layer] = ", ".join(r.name for r in subset)
            fitted.add(layer)
        pending = [r for r in pending if any(x not in fitted for x in r.layers)]
    shared = [r for r in runs if _time_shared(r, profile)]
    if phased and shared:
        profile = fit_coschedule(profile, shared)
        bounds.append(Bound("the wait at a sync point of ranks that time-share the cores (s)",
                            profile.coschedule_wait_s, 0.0, COSCHEDULE_MAX))
        terms_from["coschedule"] = ", ".join(r.name for r in shared)
    for r in pending:
        new = [x for x in r.layers if x not in fitted]
        problems.append(f"{r.name}: its plan runs through {' and '.join(new)} at once, which one run cannot tell "
                        "apart: fit each from a run that adds only one of them")
    return replace(profile, terms_from=terms_from), bounds, problems


def fit_checks(profile: CalibrationProfile, runs: list[FitRun]) -> list[FitCheck]:
    """Each fitted run against the fitted profile, with how noisy its runs were: the measured
    step is the one the fit reads (:meth:`FitRun.measured`, the median over the repeated runs),
    the predicted one what ``simdist predict --profile`` gives (:meth:`FitRun.predicted_step`).
    ``simdist calibrate``'s table, its refusal check and benchmarks/local_calibration.py's
    fitted rows all come from here."""
    out = []
    for r in runs:
        rep = r.repeated
        out.append(FitCheck(name=r.name, measured=r.measured()["step_time_s"], predicted=r.predicted_step(profile),
                            spread=rep.spread, runs=len(rep.runs), core_wait=rep.core_wait,
                            others_cores=rep.others_cores, processes=local_processes(r.scenario),
                            cores=profile.cores, loadavg=tuple(rep.loadavg) if rep.loadavg else None,
                            reference=rep.reference))
    return out


def with_honesty(profile: CalibrationProfile, checks: list[FitCheck]) -> CalibrationProfile:
    """The profile with the spreads, core waits and error band of the runs it was fitted on, and the
    host's speed during them (honesty.reference_baseline)."""
    band = max([max(c.spread, abs(c.error)) for c in checks], default=0.0)
    return replace(profile,
                   spreads={**profile.spreads, **{c.name: c.spread for c in checks}},
                   core_waits={**profile.core_waits, **{c.name: c.core_wait for c in checks}},
                   residuals={**profile.residuals, **{f"fitted run {c.name} |error|": abs(c.error) for c in checks}},
                   error_band=max(profile.error_band, band),
                   reference_by_processes={**profile.reference_by_processes, **_speed_by_processes(checks)},
                   **_speed(reference_baseline(checks), profile))


def _speed_by_processes(checks: list[FitCheck]) -> dict[str, tuple[float, float]]:
    """The host's speed over the fit runs of each process count (where they measured it)."""
    counts = sorted({c.processes for c in checks})
    speeds = {p: median_speed([c.reference for c in checks if c.processes == p]) for p in counts}
    return {str(p): (s.gemm, s.ops) for p, s in speeds.items() if s.gemm > 0 and s.ops > 0}


def _speed(measured: HostSpeed, profile: CalibrationProfile) -> dict[str, float]:
    """The profile's host-speed fields: the fit runs' where they measured it, else kept."""
    return {"reference_cpu_s": measured.gemm or profile.reference_cpu_s,
            "reference_ops_cpu_s": measured.ops or profile.reference_ops_cpu_s}
