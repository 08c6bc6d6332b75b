"""`simdist sweep SWEEP.yaml`: every point of a sweep predicted or searched, as one table kept in
the run store under the sweep's id (rerun to continue after a crash), printed and, with --out,
written as CSV or Parquet. `simdist sweep --list` lists the sweeps in the store.

Exit codes: 0 with at least one point that fits, 1 when none does, 2 for bad input.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from simdist.cli.inputs import add_db_argument
from simdist.errors import Collector

if TYPE_CHECKING:
    from simdist.sweep import SweepOutcome, SweepStore

SHOWN_ROWS = 40


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Run a base scenario over axes of its fields (docs/sweeps.md): each point a "
                     "prediction or a search for its best plan.")
    p.epilog = "Exit code 0: done; 1: no point fits; 2: bad input."
    p.add_argument("file", nargs="?", help="sweep YAML file")
    p.add_argument("--out", metavar="FILE", help="write the table to FILE (.csv, or .parquet with pyarrow)")
    p.add_argument("--id", metavar="ID", help="the sweep's id in the run store (default: its name)")
    p.add_argument("--workers", metavar="N", help="local worker processes (default: the CPUs available)")
    p.add_argument("--ray", metavar="ADDRESS", help="run on Ray: auto (this machine's cluster, or "
                   "$RAY_ADDRESS) or the head's ADDRESS; needs simdist[cluster]")
    p.add_argument("--list", action="store_true", help="list the sweeps in the run store")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on standard error")
    add_db_argument(p)


def main(args: argparse.Namespace) -> int:
    from simdist.sweep.spec import ID_PATTERN
    from simdist.sweep.store import SweepStore
    from simdist.sweep.table import out_problems

    if args.list:
        return _list(SweepStore(args.db))
    c = Collector()
    if not args.file:
        c.add("file", "name a sweep YAML file (or --list)")
    workers = None
    if args.workers is not None:
        workers = int(args.workers) if args.workers.isdigit() and int(args.workers) > 0 else None
        if workers is None:
            c.add("--workers", f"must be a positive whole number, got {args.workers!r}")
    if args.id is not None and not ID_PATTERN.match(args.id):
        c.add("--id", "letters, digits, '.', '_' or '-' (at most 100)")
    if args.ray is not None and not args.ray.strip():
        c.add("--ray", "auto, or the Ray head's address")
    if args.ray is not None and workers is not None:
        c.add("--workers", "is for local processes; with --ray, Ray's CPUs are the workers")
    c.problems += out_problems(args.out)
    c.raise_if_any()
    return _run(args, workers, SweepStore(args.db))


def _run(args: argparse.Namespace, workers: int | None, store: SweepStore) -> int:
    from simdist.sweep.run import ProgressBar, run_sweep
    from simdist.sweep.spec import load_sweep
    from simdist.sweep.table import write_table

    spec = load_sweep(args.file)
    if args.ray is not None:
        from simdist.sweep.backends import ray_module

        ray_module()  # a missing Ray is bad input (exit 2) before anything runs
    bar = ProgressBar(enabled=not args.no_progress, desc=args.id or spec.name)
    try:
        out = run_sweep(spec, store, sweep_id=args.id, backend="ray" if args.ray else "local",  # type: ignore[arg-type]
                        workers=workers, ray_address=args.ray, progress=bar)
    finally:
        bar.close()
    if args.out:
        write_table(out.table, args.out)
    print(_report(out))
    if args.out:
        print(f"table ({len(out.table)} rows) written to {args.out}")
    return 0 if (out.table["status"] == "ok").any() else 1


def _report(out: SweepOutcome) -> str:
    from simdist.sweep.table import axis_columns
    from simdist.table import table
    from simdist.units import fmt_seconds

    df = out.table
    axes = axis_columns(df.columns)
    shown = df.head(SHOWN_ROWS)

    def cell(v: Any, fmt: str = "{}") -> str:
        return "" if v is None or v != v else fmt.format(v)

    rows = [[*(cell(r[a]) for a in axes), r["status"],
             cell(r["step_time_s"]) and fmt_seconds(r["step_time_s"]), cell(r["mfu"], "{:.1%}"),
             cell(r["peak_gib"], "{:.1f}"), cell(r["gpu_hours"], "{:.3f}"), r["plan"] or r["problem"]]
            for _, r in shown.iterrows()]
    lines = [table([*axes, "status", "step time", "MFU", "peak GiB", "GPU-h/step", "plan"], rows)]
    failed = int((df["status"] == "error").sum())
    if failed:
        lines.append(f"{failed} point(s) failed in the simulator (status error; the reason in the problem "
                     "column): please report them")
    if len(df) > SHOWN_ROWS:
        lines.append(f"... {len(df) - SHOWN_ROWS} more rows (--out FILE writes them all)")
    lines.append(f"\nsweep {out.sweep_id}: {out.points} points, {out.skipped} already stored, {out.computed} "
                 f"run on {out.workers} {out.backend} worker(s) in chunks of {out.chunk_size}, {out.seconds:.1f} s")
    return "\n".join(lines)


def _list(store: SweepStore) -> int:
    from simdist.table import table

    sweeps = store.sweeps()
    if not sweeps:
        print(f"no sweeps stored in {store.path}")
        return 0
    print(table(["sweep id", "points", "done", "created", "updated"],
                [[s.sweep_id, s.points, s.done, s.created, s.updated] for s in sweeps], align="lrrll"))
    return 0
