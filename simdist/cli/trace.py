"""`simdist trace FILE -o trace.json`: simulate one step and write its timeline for Perfetto."""

from __future__ import annotations

import argparse

from simdist.cli.inputs import (
    add_profile_argument,
    add_set_argument,
    add_straggler_arguments,
    load_inputs,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = ("The timeline comes from the discrete-event engine: a scenario past its work limits "
                "(see `simdist predict --help`) is refused with exit code 2, naming the input to reduce.")
    p.add_argument("file", help="scenario YAML")
    p.add_argument("-o", "--output", default="trace.json", help="trace file to write (default trace.json)")
    add_set_argument(p)
    add_profile_argument(p)
    add_straggler_arguments(p)


def main(args: argparse.Namespace) -> int:
    from simdist.predict import predict
    from simdist.spec.plan import rank_coord
    from simdist.trace.perfetto import write_trace

    scenario, profile, stragglers, fidelity = load_inputs(args)
    # a trace is the event engine's timeline: past its work limits the scenario is refused
    # (naming the input that drives the work), never answered by the closed form
    pred = predict(scenario, profile=profile, engine="des", fidelity=fidelity, keep_spans=True,
                   stragglers=stragglers, fallback=False)
    plan = scenario.plan
    meta = {"scenario": scenario.name, "step_time_s": pred.step_time_s, "fidelity": fidelity,
            "breakdown_s": pred.breakdown_s, "assumptions": list(pred.assumptions)}
    n = write_trace(args.output, pred.spans, lambda r: rank_coord(r, plan).pp, meta)
    ranks = len({s.rank for s in pred.spans})
    print(f"wrote {args.output}: {n} spans on {ranks} ranks, step {pred.step_time_s:.4g} s "
          "(open it in https://ui.perfetto.dev)")
    return 0
