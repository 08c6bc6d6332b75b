"""`simdist calibrate`, `simdist runs`, `simdist compare`."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from simdist.errors import Problem, ScenarioError


def _db_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", help="run store (SQLite); default: the user's data directory or $SIMDIST_DB")


# --- calibrate ------------------------------------------------------------------------------


def add_calibrate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="*", help="scenarios to run with the executor and fit the overhead to")
    p.add_argument("--nproc", type=int, default=2, help="processes (ranks) on this machine")
    p.add_argument("--out", required=True, help="calibration profile to write (JSON)")
    p.add_argument("--steps", type=int, default=5, help="measured steps per executor run")
    p.add_argument("--quick", action="store_true", help="fewer benchmark sizes (for tests)")
    p.add_argument("--bench", help="reuse a microbenchmark JSON instead of running them")
    _db_arg(p)


def _torchrun(nproc: int, module: str, *args: str) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", module, *args]
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    done = subprocess.run(cmd, env=env, timeout=1800, start_new_session=True)
    if done.returncode:
        raise RuntimeError(f"{module} failed with exit code {done.returncode}")


def run_executor(file: str, nproc: int, steps: int, db: str | None) -> dict:
    """`simdist run FILE` in a subprocess; returns its measurement."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "m.json"
        cmd = [sys.executable, "-m", "simdist.cli", "run", file, "--nproc", str(nproc), "--steps", str(steps),
               "--out", str(out)] + (["--db", db] if db else [])
        done = subprocess.run(cmd, timeout=1800)
        if done.returncode or not out.exists():
            raise RuntimeError(f"simdist run {file} failed (exit {done.returncode})")
        return json.loads(out.read_text())


def calibrate_main(args: argparse.Namespace) -> int:
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
        with tempfile.TemporaryDirectory() as tmp:
            raw = Path(tmp) / "bench.json"
            print(f"running microbenchmarks on {args.nproc} ranks ...", file=sys.stderr)
            _torchrun(max(2, args.nproc), "simdist.calibrate.bench_worker", "--out", str(raw),
                      *(["--quick"] if args.quick else []))
            bench = json.loads(raw.read_text())
    runs = []
    for f in args.files:
        print(f"running {f} with the executor ...", file=sys.stderr)
        runs.append((Path(f).read_text(), run_executor(f, args.nproc, args.steps, args.db), str(Path(f).parent)))
    profile = fit_profile(bench, ["microbenchmarks"] + [r[1]["name"] for r in runs])
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
            errs = [abs(math.log(compare_one(m, y, p, d).predicted["step_time_s"] / m["step_time_s"]))
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


# --- runs -----------------------------------------------------------------------------------


def add_runs_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kind", choices=("measurement", "prediction"))
    p.add_argument("--scenario", help="scenario hash (or its prefix)")
    p.add_argument("--json", action="store_true")
    _db_arg(p)


def runs_main(args: argparse.Namespace) -> int:
    from simdist.calibrate.store import RunStore
    from simdist.table import table

    store = RunStore(args.db)
    rows = store.runs(args.kind, args.scenario)
    if args.json:
        print(json.dumps([{**r.payload, "id": r.id, "kind": r.kind, "created": r.created} for r in rows], indent=2, default=str))
        return 0
    if not rows:
        print(f"no runs stored in {store.path}")
        return 0
    print(table(["id", "kind", "name", "scenario", "GPUs", "step time s", "engine/profile", "created"],
                [[r.id, r.kind, r.name, r.scenario_hash, r.world_size or "", r.step_time_s or 0.0,
                  r.engine or r.profile or r.payload.get("backend", ""), r.created] for r in rows],
                align="rlllrrll"))
    print(f"\n{len(rows)} runs in {store.path}")
    return 0


# --- compare --------------------------------------------------------------------------------


def add_compare_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", help="calibration profile to predict with")
    p.add_argument("--html", help="write a plotly chart of predicted vs measured (HTML)")
    p.add_argument("--scenario", help="only this scenario hash (or prefix)")
    p.add_argument("--json", action="store_true")
    _db_arg(p)


def compare_main(args: argparse.Namespace) -> int:
    from simdist.calibrate.compare import compare_one, comparison_figure
    from simdist.calibrate.store import RunStore
    from simdist.spec.files import write_text_atomic
    from simdist.spec.profile import load_profile
    from simdist.table import table

    profile = load_profile(args.profile) if args.profile else None
    store = RunStore(args.db)
    latest: dict[str, object] = {}
    for r in store.runs("measurement", args.scenario):
        if r.scenario_yaml:
            latest[r.scenario_hash] = r  # the newest measurement of each scenario
    comps = []
    for r in latest.values():
        try:
            comps.append(compare_one(r.payload, r.scenario_yaml, profile))  # type: ignore[attr-defined]
        except ScenarioError as exc:
            print(f"skipped {r.name}: {exc}", file=sys.stderr)  # type: ignore[attr-defined]
    if args.json:
        print(json.dumps([{"name": c.name, "scenario_hash": c.scenario_hash, "measured": c.measured,
                           "predicted": c.predicted, "spread": c.spread} for c in comps], indent=2))
    elif not comps:
        print(f"no measurements in {store.path}: run `simdist run FILE --nproc N` first")
    else:
        keys = ["step_time_s", "forward_s", "backward_s", "optimizer_s", "comm_s", "model_state_gib", "activations_gib",
                "dp_bytes_per_step", "ps_bytes_per_server", "restarts", "restart_s"]
        rows = []
        for c in comps:
            for k in keys:
                if k in c.measured:
                    e = c.error(k)
                    rows.append([c.name, k, c.measured[k], c.predicted.get(k, float("nan")),
                                 "" if e is None else f"{e:+.1%}", f"{c.spread:.1%}" if k == "step_time_s" else ""])
        print(table(["scenario", "quantity", "measured", "predicted", "error", "run spread"], rows, align="llrrrr"))
    if args.html and comps:
        write_text_atomic(args.html, comparison_figure(comps).to_html(include_plotlyjs="cdn"))
        print(f"wrote {args.html}", file=sys.stderr)
    return 0
