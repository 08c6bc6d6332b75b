"""`simdist predict FILE`: one step of a scenario, as a table or the contract's JSON."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from simdist.cli.inputs import (
    add_profile_argument,
    add_set_argument,
    add_straggler_arguments,
    load_inputs,
    scenario_text,
)

LIMITS_HELP = (
    "Input limits: a scenario file, hf_config or deepspeed_config is at most {mib} MiB, nested at most "
    "{depth} levels, with YAML aliases expanding to at most {nodes:,} values; plans with experts or context "
    "parallelism at most {gpus:,} GPUs per stage, models {layers:,} layers, plans {chunks:,} pipeline chunks (pp x virtual stages). The discrete-event engine (the default) runs a scenario "
    "only if its estimated work is within {events:,} events, {spans:,} timeline spans, {scans:,} rank "
    "scans and {updates:,} link updates (about a minute and under a gigabyte); past that the closed "
    "form answers (the JSON's engine says \"analytic\" and an assumption says why). See "
    "docs/scenario-format.md, section Input limits. Exit code 0: predicted; 2: bad input, one "
    "line per problem naming the field.")

# one prediction: the event engine's work is bounded (simdist.sim.engine.budget) and runs with the
# collector paused anyway (simdist.sim.engine.simulation); the rest makes little garbage
PAUSE_GC = True
# run as the program, the process ends once the prediction is written and stored (no threads,
# pools or temporary files to wait for): tearing down its heap would cost some 30 ms
EXIT_WHEN_DONE = True


def limits_help() -> str:
    from simdist.io.text import MAX_DEPTH, MAX_EXPANDED_NODES
    from simdist.predict import MAX_VIRTUAL_STAGES
    from simdist.sim.engine import budget
    from simdist.spec.consistency import MAX_GROUP_RANKS
    from simdist.spec.files import MAX_INPUT_BYTES
    from simdist.spec.model import MAX_LAYERS

    return LIMITS_HELP.format(mib=MAX_INPUT_BYTES // 2**20, depth=MAX_DEPTH, nodes=MAX_EXPANDED_NODES,
                              gpus=MAX_GROUP_RANKS, layers=MAX_LAYERS,
                              chunks=MAX_VIRTUAL_STAGES, events=budget.MAX_EVENTS, spans=budget.MAX_SPANS,
                              scans=budget.MAX_RANK_SCANS, updates=budget.MAX_LINK_UPDATES)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = limits_help()
    p.add_argument("file", help="scenario YAML file")
    p.add_argument("--json", action="store_true", help="print the contract's JSON object")
    p.add_argument("--engine", default="des", choices=("des", "analytic"))
    p.add_argument("--tokens", metavar="N", help="also price a run to N tokens (300e9, 300B, 15T; default: "
                   "reliability.train_tokens when given)")
    add_set_argument(p)
    add_straggler_arguments(p)
    add_profile_argument(p)
    p.add_argument("--db", help="run store (SQLite) to record the prediction in")
    p.add_argument("--no-store", action="store_true", help="do not record the prediction")


def main(args: argparse.Namespace) -> int:
    from simdist.economics import cost_lines, parse_tokens, run_cost
    from simdist.predict import predict

    tokens = parse_tokens(args.tokens) if args.tokens else None
    scenario, profile, stragglers, fidelity = load_inputs(args)
    pred = predict(scenario, profile=profile, engine=args.engine, fidelity=fidelity,
                   keep_spans=False, stragglers=stragglers)
    if pred.engine != args.engine:
        why = next((a for a in pred.assumptions if a.startswith("closed form used")), "closed form used")
        print(f"note: {why}", file=sys.stderr)
    cost = run_cost(scenario, pred, tokens)
    if args.json:  # the contract's object, plus "cost" (a new key: the others never change)
        print(to_json({**pred.to_dict(), "cost": cost.to_dict()}))
    else:
        from simdist.table import prediction_report

        print(prediction_report(pred, cost_lines(cost)))
        band = profile.band_text(pred.step_time_s) if profile is not None else None
        if band:
            print(band)
    if not args.no_store:
        store_prediction(args.db, args, pred)
    return 0


def to_json(data: Any) -> str:
    """Strict JSON (no NaN or Infinity, which JSON does not have); predict() already refused a
    non-finite prediction, so a failure here is a figure it did not check: an error, not output."""
    try:
        return json.dumps(data, indent=2, allow_nan=False)
    except ValueError as exc:
        from simdist.errors import Problem, ScenarioError

        raise ScenarioError(Problem("output", f"the prediction holds a number JSON cannot carry ({exc})")) from None


def store_prediction(db: str | None, args: argparse.Namespace, pred: Any) -> None:
    """Keep every prediction in the run store; a store problem never fails the prediction."""
    import sqlite3

    from simdist.calibrate.store import RunStore

    try:
        RunStore(db).add("prediction", pred.to_dict(), scenario_text(args),
                         engine=pred.engine, profile=pred.profile)
    except (OSError, sqlite3.Error) as exc:
        print(f"warning: prediction not stored ({exc})", file=sys.stderr)
