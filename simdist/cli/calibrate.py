"""`simdist calibrate --nproc N --out PROFILE.json [FILE ...]`: fit this machine.

Microbenchmarks (executor.bench, started by the executor's launcher) give the compute curves
and the alpha-beta links; executor runs of the given scenarios (each recorded in the run store)
then fit the per-op overhead, and TP and ZeRO-3 runs the extra overhead and sync-point waits of
DTensor and FSDP2 (simdist.calibrate.fit). The profile is written atomically.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from simdist.cli.inputs import add_db_argument
from simdist.errors import Problem, ScenarioError

if TYPE_CHECKING:
    from simdist.spec.measurement import Measurement


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="*", help="scenarios to run with the executor and fit the overhead to")
    p.add_argument("--nproc", type=int, default=2, help="processes (ranks) on this machine")
    p.add_argument("--out", required=True, help="calibration profile to write (JSON)")
    p.add_argument("--steps", type=int, default=5, help="measured steps per executor run")
    p.add_argument("--quick", action="store_true", help="fewer benchmark sizes (for tests)")
    p.add_argument("--bench", help="reuse a microbenchmark JSON instead of running them")
    add_db_argument(p)


def run_executor(file: str, nproc: int, steps: int, db: str | None) -> Measurement:
    """`simdist run FILE` (the executor, then the run store); returns its measurement."""
    from executor.launch import execute
    from simdist.cli.run import store_measurement

    outcome = execute(file=file, nproc=nproc, steps=steps)
    if outcome.measurement is None:
        raise RuntimeError(f"simdist run {file} failed (exit {outcome.code})")
    store_measurement(outcome.measurement, file, db)
    return outcome.measurement


def main(args: argparse.Namespace) -> int:
    from simdist.calibrate.compare import compare_one
    from simdist.calibrate.fit import fit_overhead, fit_profile, fit_sync_wait
    from simdist.table import table

    if args.nproc < 1:
        raise ScenarioError(Problem("--nproc", f"must be at least 1, got {args.nproc}"))
    for f in args.files:
        if not Path(f).is_file():
            raise ScenarioError(Problem("file", f"{f} does not exist"))
    if args.bench:
        bench = json.loads(Path(args.bench).read_text())
    else:
        from executor.launch import microbenchmarks

        print(f"running microbenchmarks on {max(2, args.nproc)} ranks ...", file=sys.stderr)
        bench = microbenchmarks(args.nproc, quick=args.quick)
    runs = []
    for f in args.files:
        print(f"running {f} with the executor ...", file=sys.stderr)
        runs.append((Path(f).read_text(), run_executor(f, args.nproc, args.steps, args.db), str(Path(f).parent)))
    profile = fit_profile(bench, ["microbenchmarks"] + [r[1].name for r in runs])
    # plain runs fix the per-kernel overhead; TP and ZeRO-3 runs then fit the extra overhead
    # of DTensor and FSDP2 on top (each from its own runs only)
    groups: dict[str | None, list] = {}
    for y, m, d in runs:
        plan = yaml.safe_load(y).get("plan", {})
        key = "tp" if plan.get("tp", 1) > 1 else "zero3" if plan.get("zero_stage", 0) == 3 else None
        groups.setdefault(key, []).append((y, m, d))
    for key in sorted(groups, key=lambda k: k is not None):
        subset = groups[key]

        def mean_log_error(p, subset=subset) -> float:
            errs = [abs(math.log(compare_one(m, y, p, d).predicted["step_time_s"] / m.step_time_s))
                    for y, m, d in subset]
            return sum(errs) / len(errs)

        if key is not None:  # the sync-point waits first: they come from the measured phases
            pairs = [compare_one(m, y, profile, d) for y, m, d in subset]
            profile = fit_sync_wait(profile, key, [(c.measured, c.predicted) for c in pairs])
        profile = fit_overhead(profile, mean_log_error, key)
    profile.save(args.out)
    rows = [[k, f"{v:.3g}"] for k, v in profile.residuals.items()]
    print(table(["fit", "residual (RMS relative error / count)"], rows, align="lr"))
    print(f"\npeak {profile.peak_flops / 1e9:.1f} GFLOP/s per rank, memory {profile.memory_bandwidth_bytes_per_s / 1e9:.1f} GB/s;"
          f" kernel overhead {(profile.kernel_overhead_s or 0) * 1e6:.1f} us"
          + "".join(f"; {k} +{v * 1e6:.1f} us/op" for k, v in profile.framework_overheads_s.items())
          + "".join(f"; {k} sync waits {v:.0%} of compute" for k, v in profile.sync_wait_fractions.items()))
    for k, link in profile.links.items():
        print(f"link {k}: latency {link.latency_s * 1e6:.1f} us, bandwidth {link.bandwidth_bytes_per_s / 1e9:.2f} GB/s")
    print(f"wrote {args.out}")
    return 0
