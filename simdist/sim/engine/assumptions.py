"""What the event engine says it assumed, in plain sentences for the prediction."""

from __future__ import annotations

from simdist.sim.engine.state import Run


def engine_assumptions(run: Run) -> list[str]:
    plan = run.plan
    if run.notes and run.notes[0].startswith("full fidelity:"):  # grouped (engine.grouping)
        out = []
    elif run.full:
        out = [f"full fidelity: {plan.world_size} ranks as {len(run.slices)} tensor/context-parallel "
               "slices in lock-step (their per-layer collectives synchronise them)"]
    else:
        out = [f"symmetric fidelity: {plan.pp} representative ranks (one per pipeline stage; "
               "TP/CP peers and DP replicas do the same work)"]
    out += run.notes
    out += run.network.assumptions()
    out += list(run.lowered.notes)
    return out
