"""`simdist calibrate --nproc N --out PROFILE.json [FILE ...]`: fit this machine, honestly.

Microbenchmarks (executor.bench, started by the executor's launcher) give the compute curves
and the alpha-beta links, and the cores the ranks had. Each scenario given is then run with the
executor, repeated until its median step is stable or a budget runs out, the scenarios taking
turns (simdist.calibrate.repeat.repeat_in_rounds), each run recorded in the run store; the runs
fit the per-op overhead and each software layer's terms (simdist.calibrate.terms). The fit is
refused, with no profile written and exit code 1, when a parameter ends at a bound, when the
profile misses one of its own runs by more than that run's spread, or when other processes were
busy during a run (simdist.calibrate.honesty); the refused fit is kept beside it
(PROFILE.refused.json), from which ``--refit ... --force`` writes it after all without measuring
again. The profile keeps the runs' spreads and the error band that ``simdist predict --profile``
prints. It is written atomically.

``--held-out FILE ...``: scenarios measured in the same rounds as the fitted ones but not fitted;
once the profile is written, each is predicted with it and its error printed beside its run-to-run
spread, and a note where its measurement is in doubt (its runs' compute in two groups, or the host
at another speed than during the fit). Taking turns with the fitted runs, each held-out plan's runs
meet the same slow and fast phases of the machine as the fit did (with ``--refit``: their stored
runs).

``--from-logs LOG ... --scenario FILE``: fit a GPU cluster's GEMM and network efficiencies
from its training logs instead (simdist.calibrate.logs).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from simdist.cli.inputs import add_db_argument
from simdist.errors import Problem, ScenarioError

if TYPE_CHECKING:
    from simdist.spec.measurement import Measurement


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="*", help="scenarios to run with the executor and fit the overheads to")
    p.add_argument("--held-out", nargs="+", default=[], metavar="FILE",
                   help="scenarios to measure in the same rounds but not fit: after the fit, each one's error "
                        "against its measured median (with --refit: its stored runs)")
    p.add_argument("--nproc", type=int, default=2, help="ranks of the microbenchmarks (at most the cores)")
    p.add_argument("--out", required=True, help="calibration profile to write (JSON)")
    p.add_argument("--steps", type=int, default=5,
                   help="measured steps per executor run at least: a first run sizes the others to 1 s of steps "
                        "(at most 60), since the median of a few short steps is as noisy as one of them")
    p.add_argument("--min-runs", type=int, default=3, help="runs of each scenario before its median counts as stable")
    p.add_argument("--max-runs", type=int, default=6, help="at most this many runs of each scenario")
    p.add_argument("--tolerance", type=float, default=0.03,
                   help="stable: one more run moves the median of the run medians by at most this (relative)")
    p.add_argument("--budget", type=float, default=600.0, help="seconds of runs per scenario at most")
    p.add_argument("--quick", action="store_true", help="fewer benchmark sizes (for tests)")
    p.add_argument("--bench", help="reuse a microbenchmark JSON instead of running them")
    p.add_argument("--force", action="store_true",
                   help="write the profile even when the fit is refused (the reasons are still printed, and the "
                        "profile's error band covers the largest miss): for looking into a noisy machine, not for use")
    p.add_argument("--refit", metavar="PROFILE",
                   help="run nothing: keep PROFILE's microbenchmark part and fit its executor terms again from the "
                        "run store's measurements of each FILE (after a model change, or on a subset of the runs)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="auto: the GPUs with NCCL when there is one per rank, else the CPU with gloo")
    p.add_argument("--from-logs", nargs="+", metavar="LOG",
                   help="fit from Megatron-LM, torchtitan or NeMo training logs instead (needs --scenario)")
    p.add_argument("--scenario", action="append", default=None, metavar="FILE",
                   help="with --from-logs: the cluster, model and plan of the logged jobs (once for all logs, "
                        "or once per log in order)")
    p.add_argument("--fit", type=int, default=None, metavar="K",
                   help="with --from-logs: fit on the first K logs and hold the others out (default: all but one)")
    add_db_argument(p)


def run_executor(file: str, steps: int, device: str = "auto") -> Measurement:
    """`simdist run FILE --no-store` on the plan's own ranks (the executor)."""
    from executor.launch import execute
    from simdist.spec.scenario import load_scenario

    nproc = load_scenario(file).plan.world_size
    outcome = execute(file=file, nproc=nproc, steps=steps, device=device, quiet=True)
    if outcome.measurement is None:
        raise RuntimeError(f"simdist run {file} failed (exit {outcome.code})")
    return outcome.measurement


def main(args: argparse.Namespace) -> int:
    if args.from_logs:
        from simdist.calibrate.from_logs import calibrate_from_logs

        return calibrate_from_logs(args.from_logs, args.scenario or [], args.out, args.fit, args.db)
    from executor.hostload import cores

    problems = []
    if args.nproc < 1:
        problems.append(Problem("--nproc", f"must be at least 1, got {args.nproc}"))
    elif args.nproc > cores() and args.device != "cuda" and not (args.bench or args.refit):
        problems.append(Problem("--nproc", f"{args.nproc} ranks on {cores()} cores would time-share them during the "
                                f"microbenchmarks; use at most {cores()} (plans of more ranks are priced from it)"))
    for key in ("min_runs", "max_runs", "steps"):
        if getattr(args, key) < 1:
            problems.append(Problem(f"--{key.replace('_', '-')}", f"must be at least 1, got {getattr(args, key)}"))
    problems += [Problem("file", f"{f} does not exist") for f in args.files if not Path(f).is_file()]
    problems += [Problem("--held-out", f"{f} does not exist") for f in args.held_out if not Path(f).is_file()]
    problems += [Problem("--held-out", f"{f} is also fitted (a FILE): a plan cannot be held out of its own fit")
                 for f in args.held_out if any(Path(f).resolve() == Path(g).resolve() for g in args.files)]
    if problems:
        raise ScenarioError(problems)
    return fit_machine(args)


def fit_machine(args: argparse.Namespace) -> int:
    from simdist.calibrate.fit import fit_profile
    from simdist.calibrate.repeat import PlanFailed, repeat_in_rounds
    from simdist.calibrate.terms import FitRun
    from simdist.cli.run import store_measurement

    if args.refit:
        return refit_machine(args)
    if args.bench:
        bench = json.loads(Path(args.bench).read_text())
    else:
        from executor.launch import microbenchmarks

        print(f"running microbenchmarks on {max(2, args.nproc)} ranks ...", file=sys.stderr)
        bench = microbenchmarks(args.nproc, quick=args.quick, device=args.device)
    held_out = f" and {len(args.held_out)} held out" if args.held_out else ""
    print(f"running {len(args.files)} plan(s){held_out} with the executor, taking turns, until each median step is "
          "stable ...", file=sys.stderr)

    def plan_runs(f: str, held: bool):  # (name, a run of n steps, what keeps a run): repeat.PlanRuns
        def once(n: int):
            print(f"running {f} ({n} steps) ...", file=sys.stderr)
            try:
                return run_executor(f, n, args.device)
            except RuntimeError as exc:  # a held-out plan that fails leaves the others to go on
                if held:
                    raise PlanFailed(str(exc)) from None
                raise
        return Path(f).stem, once, lambda m: store_measurement(m, f, args.db)

    files = [(f, False) for f in args.files] + [(f, True) for f in args.held_out]
    reps = repeat_in_rounds([plan_runs(f, held) for f, held in files], args.steps, min_runs=args.min_runs,
                            max_runs=args.max_runs, tolerance=args.tolerance, budget_s=args.budget)
    fitted, held_out = [], []
    for (f, held), rep in zip(files, reps, strict=True):
        print(f"  {rep.name}: {len(rep.runs)} run(s), medians {', '.join(f'{t:.4f}' for t in rep.medians)} s "
              f"({rep.stopped}{': ' + rep.notes[-1] if rep.stopped == 'failed' else ''})", file=sys.stderr)
        if rep.runs:  # a fitted plan always has runs: its failure ends the rounds
            (held_out if held else fitted).append(
                FitRun(rep.name, Path(f).read_text(encoding="utf-8"), str(Path(f).parent), rep))
    return fit_and_write(fit_profile(bench, ["microbenchmarks"] + [r.name for r in fitted]), fitted, args, held_out)


def refit_machine(args: argparse.Namespace) -> int:
    """--refit: the given profile's microbenchmark part, the stored runs of each file."""
    from simdist.calibrate.refit import microbenchmark_part, stored_fit_runs
    from simdist.calibrate.store import RunStore
    from simdist.spec.profile import load_profile

    base = microbenchmark_part(load_profile(args.refit))
    store = RunStore(args.db)
    runs, held = stored_fit_runs(store, args.files), stored_fit_runs(store, args.held_out)
    for r in runs + held:
        print(f"  {r.name}: {len(r.repeated.runs)} stored run(s), medians "
              f"{', '.join(f'{t:.4f}' for t in r.repeated.medians)} s", file=sys.stderr)
    from dataclasses import replace

    return fit_and_write(replace(base, fitted_from=["microbenchmarks"] + [r.name for r in runs]), runs, args, held)


def fit_and_write(profile, runs, args: argparse.Namespace, held=()) -> int:
    """Fit the executor terms, check the fit (refuse it unless --force) and write the profile;
    then the held-out runs against it."""
    from simdist.calibrate.honesty import refusal
    from simdist.calibrate.terms import fit_checks, fit_terms, with_honesty

    runs, held = _as_read(runs, fitted=True), _as_read(held, fitted=False)
    profile, bounds, unusable = fit_terms(profile, runs)
    checks = fit_checks(profile, runs)
    lines = refusal(checks, bounds, profile.cores)
    if unusable:
        lines = (lines or ["calibration refused, no profile written:"]) + [f"  - {u}" for u in unusable]
    print(_table(checks))
    for line in lines:
        print(line, file=sys.stderr)
    profile = with_honesty(profile, checks)
    if lines and not args.force:
        _keep_refused(profile, args)
        return 1
    if lines:
        print("--force: writing the refused profile anyway", file=sys.stderr)
    profile.save(args.out)
    _summary(profile)
    print(f"wrote {args.out}")
    if held:
        print(_held_table(profile, list(held)))
    return 0


def refused_path(out: str) -> Path:
    """Where a refused fit is kept beside ``--out`` (PROFILE.json -> PROFILE.refused.json)."""
    return Path(out).with_suffix(".refused.json")


def _keep_refused(profile, args: argparse.Namespace) -> None:
    """Keep a refused fit beside ``--out``, never at it, and say how to accept it without
    measuring again: its microbenchmarks are in it and its runs in the run store."""
    kept = refused_path(args.out)
    profile.save(kept)
    command = ["simdist", "calibrate", "--refit", str(kept), *(["--db", args.db] if args.db else []),
               "--out", args.out, "--force", *args.files, *(["--held-out", *args.held_out] if args.held_out else [])]
    print(f"the refused fit is kept in {kept}, not for use: to write it to {args.out} after all without measuring "
          f"again, `{shlex.join(command)}`", file=sys.stderr)


def _as_read(runs, fitted: bool) -> list:
    """``runs`` as the calibration reads them (FitRun.as_read), naming the runs set aside."""
    out = []
    for r in runs:
        kept, notes = r.as_read(fitted)
        for note in notes:
            print(f"{r.name}: {note}; {'fitted' if fitted else 'measured'} on the rest", file=sys.stderr)
        out.append(kept)
    return out


def _table(checks) -> str:
    from simdist.table import table

    rows = [[c.name, c.runs, f"{c.measured:.4f}", f"{c.spread:.1%}", f"{c.predicted:.4f}", f"{c.error:+.1%}",
             f"{c.core_wait:.0%}", f"{c.others_cores:.2f}"] for c in checks]
    return table(["fitted run", "runs", "median s", "spread", "fitted s", "error", "core wait", "other CPU (cores)"],
                 rows, align="lrrrrrrr") if rows else "(no executor runs: microbenchmarks only)"


HELD_OUT_BAR = 0.15  # the error a held-out local plan is held to (benchmarks/local_calibration.py's bar)
HELD_OUT_HEADING = "held-out run"  # the held-out table's first column (benchmarks/local_calibration.py cuts there)


def _held_table(profile, held) -> str:
    """The held-out runs against the written profile: error beside spread, and why a measurement
    is in doubt (simdist.calibrate.repeat.Repeated.doubt)."""
    from simdist.calibrate.honesty import FLOOR
    from simdist.calibrate.terms import fit_checks
    from simdist.table import table

    checks = fit_checks(profile, held)
    rows = [[c.name, c.runs, f"{c.measured:.4f}", f"{c.spread:.1%}", f"{c.predicted:.4f}", f"{c.error:+.1%}",
             r.repeated.doubt(profile.cores, profile.host_speed_for(c.processes)) or ""]
            for c, r in zip(checks, held, strict=True)]
    close = sum(abs(c.error) <= HELD_OUT_BAR for c in checks)
    within = sum(abs(c.error) <= max(c.spread, FLOOR) for c in checks)
    return ("\n" + table([HELD_OUT_HEADING, "runs", "median s", "spread", "predicted s", "error", "in doubt"], rows,
                         align="lrrrrrl")
            + f"\n{close} of {len(checks)} held-out plans within {HELD_OUT_BAR:.0%} of their measured median, {within} "
              f"within their run-to-run spread (at least {FLOOR:.0%})")


POINT_NAMES = {"transfer": "transfer", "gather": "FSDP2 collective", "call": "collective call"}


def _summary(profile) -> None:
    from simdist.spec.software_layers import sync_points

    print(f"\npeak {profile.peak_flops / 1e9:.1f} GFLOP/s per rank, memory {profile.memory_bandwidth_bytes_per_s / 1e9:.1f}"
          f" GB/s, {profile.cores or '-'} cores, fitted at {profile.ranks} ranks; per-op overhead "
          f"{(profile.kernel_overhead_s or 0) * 1e6:.1f} us"
          + "".join(f"; {k} +{v * 1e6:.1f} us/op" for k, v in profile.framework_overheads_s.items())
          + "".join(f"; {k} sync waits {v:.0%} of compute" for k, v in profile.sync_wait_fractions.items())
          + "".join(f" (+{w * 1e3:.2f} ms per {k} {POINT_NAMES[sync_points(k)]})"
                    for k, w in profile.sync_point_waits_s.items())
          + (f"; +{profile.dp_step_wait_s * 1e3:.2f} ms per step at the gradient sync" if profile.dp_step_wait_s else "")
          + (f"; executor rate {profile.compute_scale:.2f}x the microbenchmarks'" if profile.compute_scale != 1 else "")
          + ("" if profile.optimizer_tensor_s is None else
             f"; optimizer {profile.optimizer_tensor_s * 1e6:.1f} us/tensor"
             + "".join(f" ({k} +{v * 1e6:.1f})" for k, v in profile.optimizer_layer_tensor_s.items() if v))
          + (f"; {profile.coschedule_wait_s * 1e3:.2f} ms per sync point of time-shared ranks"
             if profile.coschedule_wait_s else "")
          + "".join(f"; a rank sleeps {v:.0%} of its {k} communication" for k, v in profile.sleep_shares.items())
          + (f"; scheduler tick {profile.scheduler_tick_s * 1e3:g} ms (a pipeline's first sends wait for it)"
             if profile.scheduler_tick_s else ""))
    if profile.select_rates:
        print("top-k selection: " + ", ".join(f"{r * 1e9:.1f} ns per entry keeping {share:.1%} of {n:,.0f}"
                                               for n, share, r in profile.select_rates))
    if profile.pointwise_s:
        print("pointwise ops, ns per element at their smallest size: " + ", ".join(
            f"{op} {points[0][1] * 1e9:.2f}" for op, points in sorted(profile.pointwise_s.items())))
    if profile.ddp_reducer_tensor_s or profile.ddp_reducer_byte_s:
        print(f"DDP's reducer in the backward that synchronises: {profile.ddp_reducer_tensor_s * 1e6:.1f} us per "
              f"gradient tensor, {profile.ddp_reducer_byte_s * 2**20 * 1e3:.3f} ms per MiB")
    for k, link in profile.links.items():
        print(f"link {k}: latency {link.latency_s * 1e6:.1f} us, bandwidth {link.bandwidth_bytes_per_s / 1e9:.2f} GB/s")
    print(f"error band of predictions: +/-{profile.error_band:.0%} (the largest spread or residual of the fitted runs)")
    if profile.reference_cpu_s:
        from simdist.calibrate.honesty import HOST_DRIFT
        from simdist.spec.profile import HostSpeed

        print(f"host speed during the fitted runs: reference {profile.host_speed.describe()} of CPU per rank "
              f"(a run {HOST_DRIFT:.0%} away measured another host: simdist compare flags it)")
        if profile.reference_by_processes:
            print("  by processes at once (a run is held against the fit runs of its own count, or the nearest): "
                  + "; ".join(f"{n}: {HostSpeed(*speed).describe()}"
                              for n, speed in sorted(profile.reference_by_processes.items(), key=lambda x: int(x[0]))))
