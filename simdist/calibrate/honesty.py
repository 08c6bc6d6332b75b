"""When a calibration must not be trusted, and what to tell the user instead.

A fit is refused, and no profile written, when

- a fitted parameter ends at a bound of its search (:class:`Bound`): no value in the plausible
  range explains the runs, so the value found describes the noise, not the machine;
- the fitted profile misses one of the runs it was fitted on by more than that run's measured
  run-to-run spread (never less than :data:`FLOOR`): the terms cannot reproduce even their own
  data, so they will not predict anything else;
- other processes used a sizeable part of the cores during a run (:data:`BUSY_SHARE` of them,
  executor.hostload): the run measured that moment's sharing, not the machine;
- the host itself ran slower or faster during a run than during the others (:data:`HOST_DRIFT`):
  fixed workloads timed by CPU time on every rank between its measured steps (executor.hostspeed:
  GEMMs, and many small ops with their autograd; for a run without those, the slower of the
  timings before its first step and after its last: repeat.host_speed) took another time than the
  fit runs' median. On the 2-core
  guest simdist was calibrated on, calibrations had phases where the tiny plans' compute took
  10-40% more CPU time with no other process running and no steal time reported
  (benchmarks/README.md): the load figures do not show such a phase. The GEMM workload did not
  either (2-4% in the one phase measured with it): the phase slowed the per-op work, which the
  small-op workload times.

The message names the run that was noisiest (the CPU other processes used during it, the share
of each step its ranks waited for a core, the spread of its medians, the load average) and what
to do: calibrate again on a quiet machine, with fewer ranks, or with more repeats. A run missed
on a quiet machine although its repeats agree (:func:`model_limits`) is named apart: that miss is
the model's, and a quieter machine would not change it.
"""

from __future__ import annotations

import statistics

from simdist.frozen import frozen
from simdist.spec.profile import UNKNOWN_SPEED, HostSpeed

FLOOR = 0.05  # the smallest error a fit is held to: two medians of a few steps rarely agree closer
BUSY_SHARE = 0.2  # other processes using more than this share of the cores make a run noisy
HOST_DRIFT = 0.10  # a run whose reference workload took this much more or less CPU time ran on another host
# (on a steady host each workload stays within 6% of its median: GEMMs 2.54-2.84 ms over 330 runs, small ops
# 2.74-3.08 ms over 165 but one, 2026-11-28: benchmarks/README.md)
CORE_WAIT_SHARE = 0.10  # with no more ranks than cores, waiting this share of a step for a core is noise


@frozen
class Bound:
    """A fitted parameter and the range its search allowed."""

    parameter: str
    value: float
    low: float
    high: float
    upper_only: bool = True  # the lower bound means "none needed", which is a fine answer

    @property
    def hit(self) -> str | None:
        """"upper" or "lower" when the value sits on a bound (within 1% of the range in log terms)."""
        import math

        if self.value >= self.high * 0.99:
            return "upper"
        if not self.upper_only and self.value <= self.low * (1 + 0.01 * math.log(self.high / self.low)):
            return "lower"
        return None


@frozen
class FitCheck:
    """One fitted run: its measured median against the fitted profile's prediction."""

    name: str
    measured: float
    predicted: float
    spread: float
    runs: int
    core_wait: float = 0.0  # largest share of a step waiting for a core
    others_cores: float = 0.0  # most CPU other processes used during a run
    processes: int = 2
    cores: int = 0
    loadavg: tuple[float, ...] | None = None
    reference: HostSpeed = UNKNOWN_SPEED  # the host's speed over the runs (the median of each workload)

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1.0

    @property
    def allowed(self) -> float:
        return max(self.spread, FLOOR)

    @property
    def busy(self) -> bool:
        return self.cores > 0 and self.others_cores > BUSY_SHARE * self.cores

    @property
    def noise(self) -> float:
        """A score to pick the noisiest run: other processes' CPU share, core waits beyond
        what more ranks than cores explain, and the spread."""
        share = self.others_cores / self.cores if self.cores else 0.0
        wait = self.core_wait if self.processes <= max(1, self.cores) else 0.0
        return share + wait + self.spread


def median_speed(speeds: list[HostSpeed]) -> HostSpeed:
    """Each workload's median (the lower middle) over the runs that measured it."""
    def med(xs: list[float]) -> float:
        seen = [x for x in xs if x > 0]
        return statistics.median_low(seen) if seen else 0.0

    return HostSpeed(med([x.gemm for x in speeds]), med([x.ops for x in speeds]))


def reference_baseline(checks: list[FitCheck]) -> HostSpeed:
    """The host's speed over the fit runs (each workload's median)."""
    return median_speed([c.reference for c in checks])


def _how_much(drift: float) -> str:
    return f"{abs(drift):.0%} {'slower' if drift > 0 else 'faster'}"


def drift_note(drift: float) -> str:
    """A note when ``drift`` (HostSpeed.drift) is beyond :data:`HOST_DRIFT`; "" else."""
    return (f"the host ran {_how_much(drift)} than during the fit runs (by the CPU time of fixed reference "
            "workloads on every rank)") if abs(drift) > HOST_DRIFT else ""


def refusal(checks: list[FitCheck], bounds: list[Bound], cores: int) -> list[str]:
    """Every reason to refuse the fit, then the noisiest run and what to do; [] when it stands."""
    reasons = []
    for b in bounds:
        where = b.hit
        if where:
            reasons.append(f"{b.parameter} came out at its {where} bound ({b.value:.3g}; the search allows "
                           f"{b.low:.3g} to {b.high:.3g}): no plausible value explains the runs")
    for c in checks:
        if abs(c.error) > c.allowed:
            reasons.append(f"{c.name}: the fitted profile predicts {c.predicted:.4f} s against a measured median of "
                           f"{c.measured:.4f} s ({c.error:+.0%}), more than the run-to-run spread "
                           f"{c.spread:.0%} of its {c.runs} run(s) (at least {FLOOR:.0%} is allowed)")
        if c.busy:
            reasons.append(f"{c.name}: other processes used {c.others_cores:.2g} of the {c.cores} cores while it ran, "
                           "so it measured that moment's sharing, not the machine")
    base = reference_baseline(checks)
    drifted = _drifted(checks, base)
    for c, drift in drifted.items():
        reasons.append(f"{c.name}: the host ran {_how_much(drift)} during it than during the other fit runs (its "
                       f"reference workloads took {c.reference.describe()} of CPU time per rank, their median "
                       f"{base.describe()}; no other process needs to run for this), so it measured another machine")
    if not reasons:
        return []
    worst = max(checks, key=lambda c: c.noise) if checks else None
    out = ["calibration refused, no profile written:"] + [f"  - {r}" for r in reasons]
    limits = model_limits(checks)
    if limits:
        out.append(f"{', '.join(c.name for c in limits)}: measured on a quiet machine and repeatable (each run's "
                   "spread at most half its miss), yet missed: the fitted terms of their software layers cannot "
                   "reproduce them, a limit of the model, not the machine's noise, which a quieter machine will not "
                   "fix; fit without them (the other layers' terms stand) and see docs/calibration.md")
    noisy = any(b.hit for b in bounds) or any(abs(c.error) > c.allowed and c not in limits for c in checks) \
        or any(c.busy for c in checks) or bool(drifted)
    if worst is not None and noisy:
        load = f", load average {', '.join(f'{x:.2f}' for x in worst.loadavg)}" if worst.loadavg else ""
        out.append(f"the noisiest run was {worst.name}: other processes used {worst.others_cores:.2g} of the "
                   f"{worst.cores or '?'} cores during it{load}; its ranks waited {worst.core_wait:.0%} of a step "
                   f"for a core; its medians spread {worst.spread:.0%} over {worst.runs} run(s)")
    if noisy:
        out.append(f"what to do: calibrate again when the machine is quiet (`uptime` load average well below its "
                   f"{cores or '?'} cores), with fewer ranks (--nproc), or with more repeats (--max-runs, --budget)")
    return out


def model_limits(checks: list[FitCheck]) -> list[FitCheck]:
    """The fitted runs missed beyond their spread although nothing disturbed them: other
    processes left the cores alone and their repeated runs agree to within half the miss. Their
    miss is the model's, not noise."""
    drifted = _drifted(checks, reference_baseline(checks))
    return [c for c in checks if abs(c.error) > c.allowed and not c.busy and c.runs > 1
            and c.spread <= abs(c.error) / 2 and c not in drifted]


def _drifted(checks: list[FitCheck], base: HostSpeed) -> dict[FitCheck, float]:
    """The fit runs whose host ran :data:`HOST_DRIFT` slower or faster than ``base``, the fit runs' median."""
    drifts = {c: c.reference.drift(base) for c in checks}
    return {c: d for c, d in drifts.items() if abs(d) > HOST_DRIFT}
