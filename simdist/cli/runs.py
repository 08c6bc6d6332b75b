"""`simdist runs`: the measurements and predictions kept in the run store; `simdist runs rm ID...`
deletes some of them."""

from __future__ import annotations

import argparse
import json
import sys

from simdist.cli.inputs import add_db_argument
from simdist.errors import Problem, ScenarioError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("List the stored runs (id, date, kind, scenario), or `simdist runs rm ID [ID...]` "
                     "to delete runs by id.")
    p.add_argument("action", nargs="?", default="list", choices=("list", "rm"),
                   help="list (default) or rm (delete the runs named by id)")
    p.add_argument("ids", nargs="*", metavar="ID", help="run ids for rm (see the id column)")
    p.add_argument("--kind", choices=("measurement", "prediction"))
    p.add_argument("--scenario", help="only this scenario: its name or its hash (or a hash prefix)")
    p.add_argument("--json", action="store_true")
    add_db_argument(p)


def main(args: argparse.Namespace) -> int:
    from simdist.calibrate.store import RunStore

    if args.action == "rm":
        return remove(args)
    if args.ids:
        raise ScenarioError(Problem("ID", "run ids go with rm: simdist runs rm ID [ID...]"))
    store = RunStore(args.db)
    rows = store.runs(args.kind, args.scenario)
    if args.json:
        print(json.dumps([{**r.payload, "id": r.id, "kind": r.kind, "created": r.created} for r in rows],
                         indent=2, default=str))
        return 0
    if not rows:
        which = f" for scenario {args.scenario!r}" if args.scenario else ""
        print(f"no runs stored{which} in {store.path}")
        return 0
    from simdist.table import table

    print(table(["id", "date (UTC)", "kind", "scenario", "hash", "GPUs", "step time (s)", "engine / profile"],
                [[r.id, r.created.replace("T", " ").split("+")[0], r.kind, r.name, r.scenario_hash,
                  r.world_size or "", r.step_time_s or 0.0,
                  r.engine or r.profile or r.payload.get("backend", "")] for r in rows],
                align="rlllllrl"))
    print(f"\n{len(rows)} runs in {store.path}; delete with `simdist runs rm ID`")
    return 0


def remove(args: argparse.Namespace) -> int:
    from simdist.calibrate.store import RunStore

    ids = []
    for text in args.ids:
        if not text.isdigit():
            raise ScenarioError(Problem("ID", f"{text[:40]!r} is not a run id (a whole number from `simdist runs`)"))
        ids.append(int(text))
    if not ids:
        raise ScenarioError(Problem("ID", "rm needs at least one run id (see `simdist runs`)"))
    store = RunStore(args.db)
    gone = store.remove(ids)
    missing = [i for i in ids if i not in gone]
    if gone:
        print(f"deleted {len(gone)} run(s) from {store.path}: {', '.join(map(str, gone))}")
    if missing:
        print(f"no run with id {', '.join(map(str, missing))} in {store.path}", file=sys.stderr)
        return 1
    return 0
