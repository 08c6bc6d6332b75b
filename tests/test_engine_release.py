"""The event engine leaves no reference cycles behind (simulation.Simulation.release): its
records, events and tallies go when the run does, not at the next collection of the cyclic
garbage collector, which would walk every one of them (a third of a prediction's time)."""

from __future__ import annotations

import gc

import pytest
from conftest import REPO

from simdist.predict import predict
from simdist.spec.scenario import load_scenario


@pytest.mark.parametrize("name", ["gpt3-175b-1024xa100", "gpt3-1.3b-16x1gpu-25gbe-ps16",
                                  "llama2-70b-zero3-offload-2xa100"])
def test_a_prediction_leaves_no_cyclic_garbage(name: str) -> None:
    sc = load_scenario(REPO / "scenarios" / f"{name}.yaml")
    predict(sc, keep_spans=False)  # (first-use caches and imports)
    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        predict(sc, keep_spans=False)
        assert gc.collect() == 0
    finally:
        if collecting:
            gc.enable()
