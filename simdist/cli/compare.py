"""`simdist compare`: predicted against measured, for the newest measurement of each scenario
in the run store (step time, phases, memory, traffic), as a table, JSON or an HTML chart.

``--trace OUT.json`` also sets the predicted timeline (the event engine's spans of every rank)
beside the measured one (the executor's phase spans of the median step, plus the collectives and
waits of its torch.profiler traces when it ran with ``simdist run --trace``) in one Perfetto
file, predicted rank r above measured rank r on one time axis, and adds the per-phase times
(forward, backward, optimizer, each collective kind, sync waits, bubble) to the table."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from simdist.cli.inputs import add_db_argument, load_profile_arg

QUANTITIES = ("step_time_s", "forward_s", "backward_s", "optimizer_s", "comm_s", "model_state_gib",
              "activations_gib", "dp_bytes_per_step", "ps_bytes_per_server", "restarts", "restart_s")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", help="calibration profile to predict with")
    p.add_argument("--html", help="write a plotly chart of predicted vs measured (HTML)")
    p.add_argument("--scenario", help="only this scenario: its name or its hash (or a hash prefix)")
    p.add_argument("--trace", metavar="OUT.json",
                   help="write the predicted and measured timelines in one Perfetto trace (one file per scenario: "
                        "OUT-<name>.json when several) and add per-phase rows to the table")
    p.add_argument("--json", action="store_true")
    add_db_argument(p)


def main(args: argparse.Namespace) -> int:
    from simdist.calibrate.compare import compare_stored, comparison_figure
    from simdist.calibrate.honesty import drift_note
    from simdist.calibrate.store import RunStore
    from simdist.spec.files import write_text_atomic
    from simdist.table import table

    store = RunStore(args.db)
    profile = load_profile_arg(args.profile)
    comps, skipped = compare_stored(store, profile, args.scenario)
    for line in skipped:
        print(f"skipped {line}", file=sys.stderr)
    phases = traces(store, profile, args.scenario, args.trace) if args.trace else {}
    if args.json:
        print(json.dumps([{"name": c.name, "scenario_hash": c.scenario_hash, "measured": c.measured,
                           "predicted": c.predicted, "spread": c.spread, "host_drift": c.host_drift,
                           **({"phases": phases[c.scenario_hash]} if c.scenario_hash in phases else {})}
                          for c in comps], indent=2))
    elif not comps:
        stored = len(store.runs("measurement", args.scenario))
        which = f" of scenario {args.scenario!r}" if args.scenario else ""
        if stored:
            print(f"{stored} measurement(s){which} stored in {store.path}, none could be compared: "
                  "the reasons are above")
        else:
            print(f"no measurements{which} in {store.path}: run `simdist run FILE --nproc N` first")
    else:
        rows = []
        for c in comps:
            for k in QUANTITIES:
                if k in c.measured:
                    e = c.error(k)
                    rows.append([c.name, k, c.measured[k], c.predicted.get(k, float("nan")),
                                 "" if e is None else f"{e:+.1%}", f"{c.spread:.1%}" if k == "step_time_s" else ""])
            for phase, (measured, predicted) in (phases.get(c.scenario_hash) or {}).items():
                e = f"{predicted / measured - 1:+.1%}" if measured > 0 else ""
                rows.append([c.name, f"timeline {phase} s", measured, predicted, e, ""])
        print(table(["scenario", "quantity", "measured", "predicted", "error", "run spread"], rows, align="llrrrr"))
        for c in comps:
            note = drift_note(c.host_drift)
            if note:
                print(f"note: {c.name}: {note}; its error measures the host as much as the model")
    if args.html and comps:
        write_text_atomic(args.html, comparison_figure(comps).to_html(include_plotlyjs="cdn"))
        print(f"wrote {args.html}", file=sys.stderr)
    return 0


def traces(store, profile, scenario_hash: str | None, out: str) -> dict[str, dict[str, tuple[float, float]]]:
    """Write the two-timeline trace of each stored scenario's newest measurement; returns its
    per-phase (measured, predicted) seconds, mean over ranks, by scenario hash."""
    import yaml

    from simdist.calibrate.compare import as_run_dict
    from simdist.calibrate.timelines import (
        measured_spans,
        phase_totals,
        predicted_spans,
        two_timelines,
    )
    from simdist.errors import ScenarioError
    from simdist.spec.files import write_json_atomic
    from simdist.spec.measurement import Measurement
    from simdist.spec.scenario import scenario_from_dict

    latest = {r.scenario_hash: r for r in store.runs("measurement", scenario_hash) if r.scenario_yaml}
    result: dict[str, dict[str, tuple[float, float]]] = {}
    for r in latest.values():
        try:
            m = Measurement.from_dict(r.payload)
            sc = scenario_from_dict(as_run_dict(yaml.safe_load(r.scenario_yaml or ""), m.extras.get("as_run") or {}))
            predicted, step = predicted_spans(sc, profile)
        except ScenarioError as exc:
            print(f"no timeline for {r.name}: {exc.problems[0]}", file=sys.stderr)
            continue
        if not m.extras.get("timeline"):
            print(f"no timeline for {r.name} (run {r.id}): measured before the executor kept phase spans",
                  file=sys.stderr)
            continue
        measured = measured_spans(m, m.extras.get("trace_dir"))
        path = Path(out) if len(latest) == 1 else Path(out).with_name(f"{Path(out).stem}-{r.name}{Path(out).suffix}")
        meta = {"scenario": r.name, "predicted_step_s": step, "measured_step_s": m.step_time_s,
                "measured_median_step_s": (m.extras.get("timeline") or {}).get("step_time_s"),
                "traced": bool(m.extras.get("traced"))}
        write_json_atomic(path, two_timelines(predicted, measured, meta))
        print(f"wrote {path}: predicted and measured timelines of {r.name} (open it in https://ui.perfetto.dev)",
              file=sys.stderr)
        got, want = phase_totals(measured), phase_totals(predicted)
        result[r.scenario_hash] = {k: (got.get(k, 0.0), want.get(k, 0.0)) for k in sorted(set(got) | set(want))}
    return result
