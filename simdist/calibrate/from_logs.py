"""`simdist calibrate --from-logs LOG ... --scenario FILE`: a GPU cluster's efficiencies from the
training logs its users already have.

Each log (simdist.calibrate.logs) becomes a measurement in the run store, with the scenario it
ran: the ``--scenario`` file (one for all logs, or one per log), with what the log itself states
over it (Megatron's arguments block: parallel sizes, batch, model dimensions, world size). Then
two numbers are fitted, by minimising the mean |log(predicted / measured)| step time over the
fitted logs (alternating golden-section searches on a log scale):

- the GEMM efficiency, as a factor on the catalog GPU's dense peak (the catalog's shape model
  of tile and wave quantisation stays: the profile's ``peak_flops``);
- the network efficiency, as a factor on the catalog links' achieved bandwidth, inside the node
  and across nodes (the profile's ``links``).

A factor the logs do not determine (every step barely depends on it: a 2x change moves the
error by less than half a percent) keeps the catalog's value. Logs not fitted are held out
(``--fit K`` fits the first K; by default each log is predicted by a fit of all the others),
and their errors are the profile's error band. The fit is refused when a factor ends at a bound
of its search.
"""

from __future__ import annotations

import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from simdist.calibrate.honesty import Bound
from simdist.calibrate.logs import LogRun, median_step, parse_log, spread
from simdist.errors import Problem, ScenarioError
from simdist.spec.profile import CalibrationProfile, LinkFit

GEMM_RANGE = (0.3, 1.6)  # factor on the catalog's peak x efficiency
NETWORK_RANGE = (0.2, 3.0)  # factor on the catalog's achieved link bandwidth


@dataclass
class LoggedRun:
    run: LogRun
    scenario_dict: dict[str, Any]
    scenario: Any
    times: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.times)


def load_runs(logs: list[str], scenarios: list[str]) -> list[LoggedRun]:
    """Each log with its scenario (every problem at once, each naming its file)."""
    from simdist.spec.scenario import scenario_from_dict

    problems = []
    if len(scenarios) not in (1, len(logs)):
        problems.append(Problem("--scenario", f"give one scenario for all {len(logs)} logs or one per log, got "
                                f"{len(scenarios)}"))
    if not scenarios:
        problems.append(Problem("--scenario", "is required with --from-logs (the cluster, model and plan of the jobs)"))
    problems += [Problem("--from-logs", f"{f} does not exist") for f in logs if not Path(f).is_file()]
    problems += [Problem("--scenario", f"{f} does not exist") for f in scenarios if not Path(f).is_file()]
    if problems:
        raise ScenarioError(problems)
    out = []
    for i, log in enumerate(logs):
        file = scenarios[0] if len(scenarios) == 1 else scenarios[i]
        try:
            run = parse_log(log)
        except ValueError as exc:
            problems.append(Problem("--from-logs", str(exc)))
            continue
        d = with_log_fields(yaml.safe_load(Path(file).read_text(encoding="utf-8")), run)
        try:
            sc = scenario_from_dict(d, str(Path(file).parent))
        except ScenarioError as exc:
            problems += [Problem(f"{run.name}: {p.field}", p.message) for p in exc.problems]
            continue
        times = median_step(run, sc.plan.global_batch_size * sc.model.seq_length, sc.world_size)
        if not times:
            problems.append(Problem("--from-logs", f"{log}: no step after the warm-up"))
            continue
        if not run.losses:
            problems.append(Problem("--from-logs", f"{log}: no loss on its step lines"))
            continue
        out.append(LoggedRun(run, d, sc, times))
    if problems:
        raise ScenarioError(problems)
    return out


def with_log_fields(d: dict[str, Any], run: LogRun) -> dict[str, Any]:
    """The scenario dict with the fields the log states, and the log's name."""
    d = {**d, "name": run.name, "model": dict(d.get("model") or {}), "plan": dict(d.get("plan") or {}),
         "cluster": dict(d.get("cluster") or {})}
    for key, value in run.overrides().items():
        if key == "world_size":
            gpn = int(d["cluster"].get("gpus_per_node") or 8)
            if isinstance(value, int) and value % gpn == 0:
                d["cluster"]["num_nodes"] = value // gpn
            continue
        section, _, name = key.partition(".")
        d[section][name] = value
    d["plan"].pop("dp", None)  # dp follows from the GPUs and the model-parallel sizes the log states
    return d


def scaled_profile(sc: Any, gemm: float, network: float, label: str) -> CalibrationProfile:
    """The catalog cluster of ``sc`` with its GEMM and network efficiencies scaled."""
    from simdist.analytic.collectives import LINK_EFFICIENCY

    c = sc.cluster
    intra = c.intra_node.bandwidth_bytes_per_s * LINK_EFFICIENCY.get(c.intra_node.kind, 0.8) * network
    inter = c.inter_node.bandwidth_bytes_per_s * LINK_EFFICIENCY.get(c.inter_node.kind, 0.85) * network
    return CalibrationProfile(
        device=label, backend="nccl", peak_flops=c.gpu.peak(sc.plan.precision) * gemm,
        links={"intra": LinkFit(latency_s=c.intra_node.latency_s, bandwidth_bytes_per_s=intra),
               "inter": LinkFit(latency_s=c.inter_node.latency_s, bandwidth_bytes_per_s=inter)})


def _predict(r: LoggedRun, gemm: float, network: float) -> float:
    from simdist.predict import predict

    return predict(r.scenario, profile=scaled_profile(r.scenario, gemm, network, "fit"), engine="analytic",
                   keep_spans=False).step_time_s


def _error(runs: list[LoggedRun], gemm: float, network: float) -> float:
    return statistics.mean(abs(math.log(_predict(r, gemm, network) / r.median)) for r in runs)


def _golden(f, lo: float, hi: float, rounds: int = 24) -> float:
    a, b = math.log(lo), math.log(hi)
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(math.exp(c)), f(math.exp(d))
    for _ in range(rounds):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(math.exp(d))
    return math.exp((a + b) / 2)


def fit_factors(runs: list[LoggedRun]) -> tuple[float, float, bool]:
    """(gemm factor, network factor, whether the network factor was determined)."""
    gemm, network = 1.0, 1.0
    for _ in range(3):
        gemm = _golden(lambda x, n=network: _error(runs, x, n), *GEMM_RANGE)
        network = _golden(lambda x, g=gemm: _error(runs, g, x), *NETWORK_RANGE)
    best = _error(runs, gemm, network)
    flat = all(abs(_error(runs, gemm, network * k) - best) < 0.005 for k in (0.5, 2.0))
    if flat:
        network = 1.0
        gemm = _golden(lambda x: _error(runs, x, network), *GEMM_RANGE)
    return gemm, network, not flat


def calibrate_from_logs(logs: list[str], scenarios: list[str], out: str, fit: int | None, db: str | None) -> int:
    from simdist.table import table

    runs = load_runs(logs, scenarios)
    precisions = {(r.scenario.cluster.gpu.name, r.scenario.plan.precision) for r in runs}
    if len(precisions) > 1:
        raise ScenarioError(Problem("--scenario", f"the logs mix GPUs or precisions ({sorted(precisions)}): one "
                                    "profile describes one GPU in one precision"))
    k = len(runs) if fit is None else fit
    if not 1 <= k <= len(runs):
        raise ScenarioError(Problem("--fit", f"must be between 1 and {len(runs)} (the logs), got {fit}"))
    store_logged(runs, db)
    fitted = runs[:k]
    gemm, network, determined = fit_factors(fitted)
    held: dict[str, float] = {}
    if k < len(runs):
        held = {r.run.name: _predict(r, gemm, network) / r.median - 1 for r in runs[k:]}
    elif len(runs) > 1:  # each log predicted by a fit of the others
        for i, r in enumerate(runs):
            g, n, _ = fit_factors(runs[:i] + runs[i + 1:])
            held[r.run.name] = _predict(r, g, n) / r.median - 1
    rows = []
    for r in runs:
        pred = _predict(r, gemm, network)
        rows.append([r.run.name, r.run.framework, r.scenario.world_size, len(r.times), f"{r.median:.4g}",
                     f"{spread(r.times):.1%}", f"{pred:.4g}", f"{pred / r.median - 1:+.1%}",
                     f"{held[r.run.name]:+.1%}" if r.run.name in held else "-"])
    print(table(["log", "framework", "GPUs", "steps", "median s", "spread", "fitted s", "error", "held-out error"],
                rows, align="llrrrrrrr"))
    bounds = [Bound("the GEMM efficiency factor", gemm, *GEMM_RANGE, upper_only=False)]
    if determined:
        bounds.append(Bound("the network efficiency factor", network, *NETWORK_RANGE, upper_only=False))
    hit = [b for b in bounds if b.hit]
    if hit:
        for b in hit:
            print(f"calibration refused, no profile written: {b.parameter} came out at its {b.hit} bound "
                  f"({b.value:.3g}; the search allows {b.low:.3g} to {b.high:.3g}): the scenario does not describe "
                  "these jobs (check the plan, the precision and the model the logs ran)", file=sys.stderr)
        return 1
    sc = runs[0].scenario
    label = f"{sc.cluster.gpu.name} cluster from {len(runs)} training log(s) ({sc.plan.precision})"
    band = max([abs(e) for e in held.values()], default=max(abs(_predict(r, gemm, network) / r.median - 1) for r in runs))
    from dataclasses import replace

    profile = replace(scaled_profile(sc, gemm, network, label), fitted_from=[r.run.name for r in fitted],
                      spreads={r.run.name: spread(r.times) for r in runs}, error_band=band,
                      residuals={"gemm efficiency factor": gemm, "network efficiency factor": network,
                                 **{f"held-out log {k} |error|": abs(v) for k, v in held.items()}})
    profile.save(out)
    net = f"network x{network:.3f}" if determined else "network: not determined by these logs, the catalog's kept"
    print(f"\nGEMM efficiency x{gemm:.3f} of the catalog's {sc.cluster.gpu.name}; {net}; held-out error at most "
          f"{band:.1%}\nwrote {out}")
    return 0


def store_logged(runs: list[LoggedRun], db: str | None) -> None:
    """Each log as a measurement in the run store, with its scenario."""
    import sqlite3

    from simdist.calibrate.store import RunStore
    from simdist.spec.measurement import Measurement

    for r in runs:
        m = Measurement.from_dict({
            "name": r.run.name, "scenario_hash": r.scenario.hash(), "world_size": r.scenario.world_size,
            "device": "cuda", "backend": "nccl", "torch_version": "unknown (from a training log)",
            "steps": len(r.times), "step_time_s": r.median, "step_times_s": r.times, "losses": r.run.losses,
            "phases_s": {"forward": None, "backward": None, "optimizer": None, "comm": None},
            "memory": {"peak_gib": r.run.memory_gib or 0.0, "per_rank": []},
            "source": {"log": str(Path(r.run.path).resolve()), "framework": r.run.framework,
                       "iterations": r.run.iterations, "memory_reported": r.run.memory_gib is not None,
                       "memory_kind": r.run.memory_kind},
            "tflops_per_gpu": statistics.median(r.run.tflops_per_gpu) if r.run.tflops_per_gpu else None,
        })
        try:
            RunStore(db).add("measurement", m.to_dict(), yaml.safe_dump(r.scenario_dict, sort_keys=False))
        except (OSError, sqlite3.Error) as exc:
            print(f"warning: {r.run.name} not stored ({exc})", file=sys.stderr)
