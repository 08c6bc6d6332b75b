"""`simdist validate`: predict the public training runs (and, with --breadth, the breadth rows)
and report the error per row, per source and overall."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", type=Path, help="folder with training_runs.csv and breadth.csv (default: "
                   "$SIMDIST_VALIDATION_DIR if set, else the copy shipped with simdist)")
    p.add_argument("--engine", default="analytic", choices=("des", "analytic"))
    p.add_argument("--rows", action="store_true", help="print every row (and every skipped row), not only the summary; "
                   "with --cv, every row's catalog, in-sample and cross-validated error")
    p.add_argument("--cv", action="store_true",
                   help="cross-validate: refit the fitted constants without each source group and predict it "
                   "(in-sample and cross-validated error side by side; closed form)")
    p.add_argument("--breadth", action="store_true",
                   help="also predict the fully stated rows of breadth.csv (offload, ZeRO++, FSDP, reliability)")


def main(args: argparse.Namespace) -> int:
    from simdist.table import table
    from simdist.validate import breadth_table, data_dir, run_breadth, run_training, summarize

    data = data_dir(args.data)
    if args.cv:
        from simdist.validate.crossval import cross_validate, crossval_rows_table, crossval_table
        from simdist.validate.training import build_cases

        cases, _ = build_cases(data)
        cv = cross_validate(cases)
        if args.rows:
            print(crossval_rows_table(cv, cases))
            print()
        print(crossval_table(cv))
        return 0
    results, skipped = run_training(data, args.engine)
    if args.rows:
        rows = []
        for r in results:
            c = r.case
            p = c.scenario.plan
            plan = f"tp{p.tp} pp{p.pp} dp{p.dp} v{p.virtual_pipeline_stages} mb{p.micro_batch_size} z{p.zero_stage} {p.recompute}"
            rows.append([c.run_id, c.label, c.scenario.world_size, plan, c.measured_step_s, r.predicted_s,
                         f"{r.error:+.1%}", "; ".join(([", ".join(c.tuned) + " (tuned)"] if c.tuned else [])
                                                      + list(c.defaults))])
        print(table(["run", "model", "GPUs", "plan", "measured s", "predicted s", "error", "unstated"], rows,
                    align="llrlrrrl"))
        print()
    summary = summarize(results)
    print(table(["group", "rows", "mean |error|", "mean error", "max |error|"],
                [[g, int(s["n"]), f"{s['mae']:.1%}", f"{s['bias']:+.1%}", f"{s['max']:.1%}"]
                 for g, s in summary.items()], align="lrrrr"))
    if args.breadth:
        print("\n" + breadth_table(run_breadth(data, args.engine)))
    if skipped:
        print(f"\nskipped {len(skipped)} rows the simulator cannot express yet"
              + (":" if args.rows else "; their reasons (a row can have several; --rows lists each row):"))
        if args.rows:
            print(table(["run", "why"], [list(s) for s in skipped], align="ll"))
        else:
            kinds = Counter(reason.split(":")[0] for _, why in skipped for reason in why.split("; "))
            for kind, n in kinds.most_common():
                print(f"  {n:4d}  {kind}")
    return 0
