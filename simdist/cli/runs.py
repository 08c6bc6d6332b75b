"""`simdist runs`: the measurements and predictions kept in the run store."""

from __future__ import annotations

import argparse
import json

from simdist.cli.inputs import add_db_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kind", choices=("measurement", "prediction"))
    p.add_argument("--scenario", help="scenario hash (or its prefix)")
    p.add_argument("--json", action="store_true")
    add_db_argument(p)


def main(args: argparse.Namespace) -> int:
    from simdist.calibrate.store import RunStore
    from simdist.table import table

    store = RunStore(args.db)
    rows = store.runs(args.kind, args.scenario)
    if args.json:
        print(json.dumps([{**r.payload, "id": r.id, "kind": r.kind, "created": r.created} for r in rows],
                         indent=2, default=str))
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
