"""The calibration check on this machine: fit on a few plans, predict every other bundled local
and tiny plan, and set each error beside the run-to-run spread of its measurement.

    python benchmarks/local_calibration.py [--out out/calibration] [--steps 5] [--min-runs 3]
        [--max-runs 5] [--only NAME ...] [--profile PROFILE]   (reuse a profile: no fit)
        [--repredict]   (no runs: predict --out's report.json again, after a model change)
        [--refit]   (no runs: fit --out's profile again from its run store's fit runs, then --repredict)
        [--before PROFILE]   (with --repredict/--refit: a column of this profile's predictions)

Fit (``simdist calibrate --nproc 2``, every run repeated until its median is stable): the
microbenchmarks, then one plan per software layer of the executor (simdist.spec.software_layers.
profile_layers), each another plan than the bundled ones it predicts (micro-batches of another size or number): local-dp and a tiny
DDP plan (the kernels' rate and the per-op overhead: large ops and small ones), local-tp-fit and
a tiny TP plan (DTensor TP), local-zero3-fit and a tiny FSDP plan (FSDP2 resharding), local-pp-fit
and a tiny 1F1B plan (the pipeline's wait per transfer and share of compute), and
variants of tiny plans written under ``--out/fit`` (as many micro-batches, each twice as large;
and tiny-ddp with twice as many micro-batches of its own size, a third plain plan that a slow phase
of one of the others cannot bend the plain terms around unseen):
ZeRO-1, ZeRO-2, HSDP (4 ranks), the 1F1B pipeline, an interleaved pipeline (several chunks per
rank) and a zero-bubble one (a split backward: as many transfers as 1F1B, a third of the
interleaved one's, which tells the multi-chunk wait per transfer from its share of compute), fp16
compression, the synchronous parameter server and the asynchronous one, expert
parallelism (all-to-all dispatch) and context parallelism (4 ranks: a ring of point-to-point
exchanges; with HSDP they fit the waits of ranks that time-share the cores). A refused fit (a
noisy machine) stops here with the reasons (``--force`` goes on with it; so does ``--refit --force``
afterwards, from the refused fit and the runs it kept, without measuring again).

Held out: every bundled ``scenarios/local-*.yaml`` and ``scenarios/tiny-*.yaml`` the fit did not
use, 2 to 8 ranks on this machine's cores (more ranks than cores are priced as time-sharing
them), measured in the same rounds as the fitted runs, taking turns with them (``simdist calibrate
--held-out``), so that a slow phase of the machine moves a run of each plan, not every run of some
(with ``--profile``: the held-out plans take turns among themselves). The table gives the measured median, the
run-to-run spread, the prediction and the error, and the machine's load during the runs
(``others`` = CPU other processes used, in cores). Results go to ``--out`` (profile, run store,
``report.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

FIT_BUNDLED = ["local-dp", "local-tp-fit", "local-zero3-fit", "local-pp-fit"]
# (bundled plan, what its variant fits): the variant doubles the micro-batch (same micro-batches and ops,
# twice the tokens in each); the plain DDP variant pins the per-op overhead with small ops, local-dp with large
FIT_VARIANTS = {"tiny-ddp": "per-op overhead", "tiny-llama-tp": "tp", "tiny-fsdp3": "zero3", "tiny-zero1": "zero1", "tiny-fsdp2": "zero2", "tiny-hsdp": "hsdp", "tiny-pp-1f1b": "pipeline",
                "tiny-pp-interleaved": "multichunk", "tiny-pp-zb": "split_backward",
                "tiny-compress-fp16": "compression", "tiny-ps": "ps",
                "tiny-moe-ep": "ep", "tiny-cp": "cp", "tiny-ps-async": "async"}
# (bundled plan, what its variant fits): twice as many micro-batches of the bundled size; a third plain plan,
# so that the two plain terms (kernel rate, per-op overhead), which every plan's price rests on, are not solved
# exactly from two plans, one of them slowed for all its runs (q50: fit-ddp 30% slow, its host 5-10% slow)
FIT_ACCUMULATED = {"tiny-ddp": "per-op overhead at the bundled micro-batch"}


def simdist(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "simdist.cli", *args], text=True, capture_output=True, env=env,
                          cwd=REPO)


def variant(name: str, out: Path, accumulated: bool = False) -> Path:
    """The fit variant of a bundled plan, written under ``out``: as many micro-batches, each twice as
    large (``fit-NAME``), or (``accumulated``) twice as many of the bundled size (``fit-NAME-accum``)."""
    d = yaml.safe_load((REPO / "scenarios" / f"{name}.yaml").read_text())
    d["name"] = f"fit-{name.removeprefix('tiny-')}" + ("-accum" if accumulated else "")
    d["plan"]["global_batch_size"] *= 2
    if not accumulated:
        d["plan"]["micro_batch_size"] = 2 * d["plan"].get("micro_batch_size", 1)
    path = out / f"{d['name']}.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return path


def fit_plans(out: Path) -> list[Path]:
    """The fitted plans: the bundled ones and the variants (written under ``out/fit``)."""
    return ([REPO / "scenarios" / f"{n}.yaml" for n in FIT_BUNDLED] + [variant(n, out / "fit") for n in FIT_VARIANTS]
            + [variant(n, out / "fit", accumulated=True) for n in FIT_ACCUMULATED])


def measure_in_rounds(paths: list[Path], db: str, steps: int, min_runs: int, max_runs: int) -> None:
    """With a profile given (no fit): run the held-out plans, taking turns, each until its median is
    stable (simdist.calibrate.repeat.repeat_in_rounds), every run kept in the run store."""
    from simdist.calibrate.repeat import PlanFailed, repeat_in_rounds
    from simdist.cli.run import store_measurement
    from simdist.spec.measurement import load_measurement

    tmp = Path(db).parent / "measurements"
    tmp.mkdir(exist_ok=True)

    def plan_runs(path: Path):
        count = [0]

        def once(n: int):
            count[0] += 1
            out = tmp / f"{path.stem}-{count[0]}.json"
            r = simdist("run", str(path), "--nproc", str(_workers(path)), "--steps", str(n), "--out", str(out),
                        "--no-store")
            if r.returncode != 0:
                raise PlanFailed(f"{path.stem}: simdist run exited {r.returncode}: {r.stderr[-800:]}")
            return load_measurement(out)
        return path.stem, once, lambda m: store_measurement(m, str(path), db)

    repeat_in_rounds([plan_runs(p) for p in paths], steps, min_runs=min_runs, max_runs=max_runs)


def _cores() -> int:
    from executor.hostload import cores

    return cores()


def _workers(path: Path) -> int:
    from simdist.spec.scenario import load_scenario

    return load_scenario(path).plan.world_size


def checked(runs, profile: str, before: str | None = None, role: str = "") -> list[dict]:
    """A row per plan (stored runs, simdist.calibrate.terms.FitRun) as simdist calibrate checks its
    fitted and held-out runs (terms.fit_checks: the median the fit reads, the plan as it ran, the
    event engine; a fit run's undisturbed runs, a held-out plan's at the host's speed, naming the
    runs set aside), with the prediction of the ``before`` profile beside it and why the
    measurement is in doubt (simdist.calibrate.repeat.Repeated.doubt)."""
    from simdist.calibrate.terms import fit_checks
    from simdist.spec.profile import load_profile

    prof, cores = load_profile(profile), _cores()
    read = [r.as_read(fitted=role == "fit") for r in runs]  # the runs simdist calibrate reads
    kept = [k for k, _ in read]
    was = fit_checks(load_profile(before), kept) if before else [None] * len(kept)
    return [{"scenario": c.name, "role": role, "kind": "+".join(run.layers) or "ddp", "ranks": c.processes,
             "runs": c.runs, "median_s": c.measured, "spread": c.spread, "predicted_s": c.predicted,
             "before_s": old and old.predicted, "error": c.error, "others_cores": c.others_cores,
             "loadavg": list(c.loadavg or [0.0]), "doubt": run.repeated.doubt(cores, prof.host_speed_for(c.processes)) or "",
             "set_aside": "; ".join(notes)}
            for (run, notes), c, old in zip(read, fit_checks(prof, kept), was, strict=True)]


def print_rows(rows: list[dict]) -> None:
    """The rows, then how many held-out plans are within the bar and which measurements are in doubt."""
    from simdist.cli.calibrate import HELD_OUT_BAR

    for row in rows:
        old = row["before_s"]
        was = "" if old is None else f"  before {old:8.4f} s ({old / row['median_s'] - 1:+7.1%})"
        print(f"{row['role']:<4} {row['scenario']:<24} {row['kind']:<26} {row['ranks']:>2} ranks  "
              f"{row['median_s']:8.4f} s  spread {row['spread']:6.1%}{was}  predicted {row['predicted_s']:8.4f} s  "
              f"error {row['error']:+7.1%}  others {row['others_cores']:.2f} cores"
              + (f"  [{row['doubt']}]" if row["doubt"] else "")
              + (f"  ({row['set_aside']})" if row.get("set_aside") else ""), flush=True)
    held = [r for r in rows if r["role"] == "held"]
    within = [r for r in held if abs(r["error"]) <= HELD_OUT_BAR]
    print(f"\n{len(within)} of {len(held)} held-out plans within {HELD_OUT_BAR:.0%} of their measured median")
    doubted = [r for r in held if r["doubt"]]
    if doubted:
        print(f"{len(doubted)} held-out measurement(s) in doubt (their runs' compute fell in two groups on a quiet "
              "machine, or the host ran at another speed than during the fit): "
              + ", ".join(f"{r['scenario']} {r['error']:+.1%}" for r in doubted))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out/calibration")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--min-runs", type=int, default=3)
    ap.add_argument("--max-runs", type=int, default=5)
    ap.add_argument("--profile", help="reuse this profile instead of fitting one")
    ap.add_argument("--only", nargs="*", help="held-out plans to run (default: all)")
    ap.add_argument("--force", action="store_true", help="keep going with a refused fit (simdist calibrate --force)")
    ap.add_argument("--repredict", action="store_true",
                    help="no runs: predict the plans of --out's report.json again with its profile (after a model change)")
    ap.add_argument("--refit", action="store_true",
                    help="no runs: keep --out's profile's microbenchmarks, fit its executor terms again from the fit "
                         "runs in --out's run store (simdist calibrate --refit; the old profile is kept as "
                         "profile.previous.json), then --repredict")
    ap.add_argument("--before", help="with --repredict or --refit: also predict with this profile (a 'before' column)")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    (out / "fit").mkdir(parents=True, exist_ok=True)
    db, profile = str(out / "runs.db"), args.profile or str(out / "profile.json")
    if args.refit:
        fit = stored(fit_plans(out), db)
        previous = out / "profile.previous.json"
        from simdist.cli.calibrate import refused_path

        # the newer of the written fit and a refused one (a later calibration into --out refused)
        kept = max((f for f in (Path(profile), refused_path(profile)) if f.exists()), key=lambda f: f.stat().st_mtime)
        previous.write_bytes(kept.read_bytes())
        r = simdist("calibrate", "--refit", str(previous), "--db", db, "--out", profile, *map(str, fit),
                    *(["--force"] if args.force else []))
        print(r.stdout + r.stderr, flush=True)
        if r.returncode != 0:
            return r.returncode
        return repredict(out, profile, args.before or str(previous), fit)
    if args.repredict:
        return repredict(out, profile, args.before)
    load0 = os.getloadavg()
    print(f"load average at the start: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} on {os.cpu_count()} CPUs",
          flush=True)
    fit = fit_plans(out)
    held = held_plans(args.only)
    from simdist.calibrate.store import RunStore

    store = RunStore(db)
    first_id = max((r.id for r in store.runs()), default=0)
    t0 = time.time()
    if args.profile:
        measure_in_rounds(held, db, args.steps, args.min_runs, args.max_runs)
    else:  # the held-out plans take turns with the fitted ones (simdist calibrate --held-out)
        r = simdist("calibrate", "--nproc", "2", "--out", profile, "--steps", str(args.steps), "--db", db,
                    "--min-runs", str(args.min_runs), "--max-runs", str(args.max_runs), *map(str, fit),
                    "--held-out", *map(str, held), *(["--force"] if args.force else []))
        from simdist.cli.calibrate import HELD_OUT_HEADING

        print(r.stdout.split("\n" + HELD_OUT_HEADING)[0], flush=True)  # its held-out table: the rows below, with more
        print("\n".join(line for line in r.stderr.splitlines() if not line.startswith(("[rank", "running "))
                         and "Warning" not in line and "return func" not in line)[-6000:], flush=True)
        if r.returncode != 0:
            if not args.profile:
                print(f"its measurements are kept: `python benchmarks/local_calibration.py --out {args.out} --refit "
                      "--force` writes the refused fit and predicts the held-out plans with it", flush=True)
            return r.returncode
    print(f"{'measured' if args.profile else 'measured and fitted'} in {time.time() - t0:.0f} s", flush=True)
    from simdist.calibrate.refit import stored_fit_runs
    from simdist.spec.files import write_json_atomic

    rows = checked(stored_fit_runs(store, [str(p) for p in stored(held, db, since=first_id)], since=first_id),
                   profile, role="held")
    print_rows(rows)
    write_json_atomic(out / "report.json", [{k: v for k, v in r.items() if k not in ("role", "before_s")}
                                            for r in rows])  # whole or not at all
    load1 = os.getloadavg()
    print(f"load average at the end: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    return 0


def stored(files: list[Path], db: str, since: int = 0) -> list[Path]:
    """The scenarios the run store has runs of (stored after run id ``since``), naming the others
    (an older calibration's plan, or one whose runs failed)."""
    from simdist.calibrate.store import RunStore
    from simdist.spec.scenario import load_scenario

    store = RunStore(db)
    have = [f for f in files if any(r.id > since for r in store.runs("measurement", load_scenario(f).hash()))]
    for f in sorted(set(files) - set(have)):
        print(f"{f.stem}: no stored runs in {db}, left out", flush=True)
    return have


def held_plans(only: list[str] | None = None) -> list[Path]:
    """The bundled local and tiny plans the fit does not use (those named in ``only``, if given)."""
    held = sorted(p for p in (REPO / "scenarios").glob("*.yaml")
                  if p.stem.startswith(("local-", "tiny-")) and p.stem not in FIT_BUNDLED)
    return [p for p in held if p.stem in only] if only else held


def repredict(out: Path, profile: str, before: str | None = None, fit: list[Path] | None = None) -> int:
    """Predict the fit runs and the held-out plans (report.json's; after a refused fit, which
    writes none, every held-out plan the run store has runs of) from the run store with
    ``profile``, and with ``before`` beside it (else without)."""
    from simdist.calibrate.refit import stored_fit_runs
    from simdist.calibrate.store import RunStore

    store = RunStore(out / "runs.db")
    report = out / "report.json"
    held = ([str(REPO / "scenarios" / f"{row['scenario']}.yaml") for row in json.loads(report.read_text())]
            if report.exists() else [str(p) for p in stored(held_plans(), str(out / "runs.db"))])
    print_rows(checked(stored_fit_runs(store, [str(p) for p in fit or []]), profile, before, role="fit")
               + checked(stored_fit_runs(store, held), profile, before, role="held"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
