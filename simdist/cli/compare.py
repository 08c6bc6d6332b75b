"""`simdist compare`: predicted against measured, for the newest measurement of each scenario
in the run store (step time, phases, memory, traffic), as a table, JSON or an HTML chart."""

from __future__ import annotations

import argparse
import json
import sys

from simdist.cli.inputs import add_db_argument, load_profile_arg

QUANTITIES = ("step_time_s", "forward_s", "backward_s", "optimizer_s", "comm_s", "model_state_gib",
              "activations_gib", "dp_bytes_per_step", "ps_bytes_per_server", "restarts", "restart_s")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", help="calibration profile to predict with")
    p.add_argument("--html", help="write a plotly chart of predicted vs measured (HTML)")
    p.add_argument("--scenario", help="only this scenario hash (or prefix)")
    p.add_argument("--json", action="store_true")
    add_db_argument(p)


def main(args: argparse.Namespace) -> int:
    from simdist.calibrate.compare import compare_stored, comparison_figure
    from simdist.calibrate.store import RunStore
    from simdist.spec.files import write_text_atomic
    from simdist.table import table

    store = RunStore(args.db)
    comps, skipped = compare_stored(store, load_profile_arg(args.profile), args.scenario)
    for line in skipped:
        print(f"skipped {line}", file=sys.stderr)
    if args.json:
        print(json.dumps([{"name": c.name, "scenario_hash": c.scenario_hash, "measured": c.measured,
                           "predicted": c.predicted, "spread": c.spread} for c in comps], indent=2))
    elif not comps:
        print(f"no measurements in {store.path}: run `simdist run FILE --nproc N` first")
    else:
        rows = []
        for c in comps:
            for k in QUANTITIES:
                if k in c.measured:
                    e = c.error(k)
                    rows.append([c.name, k, c.measured[k], c.predicted.get(k, float("nan")),
                                 "" if e is None else f"{e:+.1%}", f"{c.spread:.1%}" if k == "step_time_s" else ""])
        print(table(["scenario", "quantity", "measured", "predicted", "error", "run spread"], rows, align="llrrrr"))
    if args.html and comps:
        write_text_atomic(args.html, comparison_figure(comps).to_html(include_plotlyjs="cdn"))
        print(f"wrote {args.html}", file=sys.stderr)
    return 0
