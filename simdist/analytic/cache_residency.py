"""Whether a CPU's ranks keep their layers' weights in the last-level cache between uses (a CPU
calibration profile only).

A training step uses each weight once per micro-batch and pass (forward, data grad, weight
grad); between two uses the rank touches all its other weights, their gradients and the
micro-batches' activations. While that working set, summed over the ranks that share the
last-level cache, fits in it, a GEMM finds its weight there, as the microbenchmarks' repeated
GEMMs do; beyond it, every use fetches the weight from memory again: a loop over a working set
larger than an LRU cache misses on every access (Denning 1968, "The working set model for
program behavior", CACM 11(5): a program runs at its cached speed only while its working set is
resident).

So where the ranks' working sets overflow the cache, each GEMM of a layer's weight pays the
fetch the profile measured by the weight's size (``weight_fetch_s``, executor.bench.
bench_cold_gemm: the same GEMM with its weight evicted, against it in the cache), in every
micro-batch: a plan of more, smaller micro-batches fetches the weights more often for the same
tokens. Measured on the 2-core EPYC this was written on (32 MiB L3, 2026-11-29): the last stage of
local-pp-fit.yaml (two layers of the local GPT and its head, 10 MiB of weights) ran 8
micro-batches of 2 as fast as 4 of 4 alone (355 and 358 ms), but 21 ms slower (+6%) beside the
other stage in the real 2-rank pipeline; a cold 1 MiB weight cost a GEMM 0.10-0.19 ms more.

Working set of a rank: its stage's memory at the peak without the optimizer's states, which a
step touches once (:func:`simdist.analytic.memory.stage_memory`: weights, gradients, the live
activations and the working buffers), the largest stage's for every rank.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from simdist.spec.profile import CalibrationProfile


def working_set_bytes(scenario: Any) -> float:
    """The bytes the ranks of ``scenario`` touch between two uses of a weight, summed over them
    (worked out once per scenario: a prediction asks for it to price and to say so)."""
    return scenario.kept("working_set_bytes", _working_set_bytes)


def _working_set_bytes(scenario: Any) -> float:
    from simdist.analytic.memory import stage_memory

    model, plan = scenario.model, scenario.plan
    per_rank = max(s.peak - s.optimizer for s in (stage_memory(model, plan, i) for i in range(plan.pp)))
    return per_rank * plan.world_size


def fetches_weights(scenario: Any, profile: CalibrationProfile | None) -> bool:
    """Whether ``scenario``'s GEMMs fetch their weights from memory on the profiled machine: the
    profile measured the fetch and the cache, and the ranks' working sets overflow the cache."""
    if profile is None or not profile.weight_fetch_s or profile.llc_bytes <= 0:
        return False
    return working_set_bytes(scenario) > profile.llc_bytes


def resident(scenario: Any, profile: CalibrationProfile | None) -> CalibrationProfile | None:
    """The profile ``scenario``'s GEMMs see: without the weight fetch where the cache holds the
    weights (or the profile does not know its cache); every GPU profile measures none."""
    if profile is None or not profile.weight_fetch_s or fetches_weights(scenario, profile):
        return profile
    return replace(profile, weight_fetch_s=[])


def fetch_note(scenario: Any, profile: CalibrationProfile | None) -> str | None:
    """The assumption a prediction states when its GEMMs fetch their weights (else None)."""
    if not fetches_weights(scenario, profile):
        return None
    assert profile is not None
    return (f"weights fetched from memory by every GEMM: the ranks' working sets ({working_set_bytes(scenario) / 2**20:.0f}"
            f" MiB) overflow the {profile.llc_bytes / 2**20:.0f} MiB last-level cache (simdist.analytic.cache_residency)")
