"""`simdist predict FILE`: one step of a scenario, as a table or the contract's JSON."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from simdist.cli.inputs import add_profile_argument, add_straggler_arguments, load_inputs


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="scenario YAML file")
    p.add_argument("--json", action="store_true", help="print the contract's JSON object")
    p.add_argument("--engine", default="des", choices=("des", "analytic"))
    add_straggler_arguments(p)
    add_profile_argument(p)
    p.add_argument("--db", help="run store (SQLite) to record the prediction in")
    p.add_argument("--no-store", action="store_true", help="do not record the prediction")


def main(args: argparse.Namespace) -> int:
    from simdist.predict import predict

    scenario, profile, stragglers, fidelity = load_inputs(args)
    pred = predict(scenario, profile=profile, engine=args.engine, fidelity=fidelity,
                   keep_spans=False, stragglers=stragglers)
    if args.json:
        print(json.dumps(pred.to_dict(), indent=2))
    else:
        from simdist.table import prediction_report

        print(prediction_report(pred))
        band = profile.band_text(pred.step_time_s) if profile is not None else None
        if band:
            print(band)
    if not args.no_store:
        store_prediction(args.db, args.file, pred)
    return 0


def store_prediction(db: str | None, file: str, pred: Any) -> None:
    """Keep every prediction in the run store; a store problem never fails the prediction."""
    import sqlite3
    from pathlib import Path

    from simdist.calibrate.store import RunStore

    try:
        RunStore(db).add("prediction", pred.to_dict(), Path(file).read_text(encoding="utf-8"),
                         engine=pred.engine, profile=pred.profile)
    except (OSError, sqlite3.Error) as exc:
        print(f"warning: prediction not stored ({exc})", file=sys.stderr)
