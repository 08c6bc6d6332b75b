"""`simdist run FILE --nproc N`: run the scenario for real (the executor) and keep the measurement.

The executor (executor.launch) checks the plan, runs torchrun and writes the measurement
(``--out``); this command adds the run store: every successful measurement is recorded there
with the scenario file's text (``--db``, as ``simdist predict`` records predictions;
``--no-store`` skips it), for ``simdist runs`` and ``simdist compare``. No torch import here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from executor.launch import add_run_arguments, execute
from simdist.cli.inputs import add_set_argument
from simdist.spec.measurement import Measurement


def add_arguments(p: argparse.ArgumentParser) -> None:
    """FILE, --nproc, --steps, --warmup, --out, ... (the executor's), then --db and --no-store."""
    add_run_arguments(p)
    add_set_argument(p)
    p.add_argument("--db", default=None, help="run store (SQLite) to record the measurement in "
                   "(default: $SIMDIST_DB or the user's data directory)")
    p.add_argument("--no-store", action="store_true", help="do not record the measurement in the run store")


def main(args: argparse.Namespace) -> int:
    """Exit code 0 (measured), 1 (the run failed) or 2 (refused before launch)."""
    opts = {k: v for k, v in vars(args).items() if k not in ("db", "no_store", "func", "set")}
    merged = None
    if args.set:  # the workers read a file: the scenario with --set applied, written beside the run
        from simdist.spec.overrides import write_merged

        merged = write_merged(args.file, args.set)
        opts["file"] = str(merged)
    try:
        outcome = execute(opts)
        if outcome.measurement is not None and not args.no_store:
            store_measurement(outcome.measurement, opts["file"], args.db)
    finally:
        if merged is not None and args.print_launch:  # the printed commands name it: keep it
            print(f"note: the scenario with --set applied is {merged}", file=sys.stderr)
        elif merged is not None:
            merged.unlink(missing_ok=True)
    return outcome.code


def store_measurement(measurement: Measurement, file: str, db: str | None) -> None:
    """Keep a measurement in the run store with its scenario's text; a store problem never
    fails the run (it is said on stderr)."""
    import sqlite3

    from simdist.calibrate.store import RunStore

    try:
        RunStore(db).add("measurement", measurement.to_dict(), Path(file).read_text(encoding="utf-8"))
    except (OSError, sqlite3.Error) as exc:
        print(f"warning: measurement not stored ({exc})", file=sys.stderr)
