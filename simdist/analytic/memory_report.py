"""The sentence ``predict`` prints about memory: what other_gib holds, which framework layout and
FP8 recipe the memory follows, and how reserved_gib is obtained."""

from __future__ import annotations

from collections.abc import Sequence

from simdist.analytic.fp8_memory import describe_fp8
from simdist.analytic.hpz import hpz_enabled
from simdist.analytic.memory import StageMemory
from simdist.analytic.memory_conventions import conventions
from simdist.analytic.runtime_memory import describe_runtime, is_cuda
from simdist.analytic.transients import PART_NAMES
from simdist.spec.scenario import Scenario
from simdist.units import GiB


def memory_assumption(sc: Scenario, memory: Sequence[StageMemory]) -> str:
    """"memory overheads: ..." for the busiest stage."""
    plan = sc.plan
    top = max(memory, key=lambda s: s.peak)
    clauses = [describe_runtime(top.runtime)]
    buffers = [f"{PART_NAMES[n]} {v / GiB:.2f} GiB" for n, v in top.other_parts if n in PART_NAMES and v]
    if buffers:
        clauses.append("working buffers at the peak: " + ", ".join(buffers))
    if top.step_peak:
        clauses.append("the peak is the optimizer step's (activations freed)")
    conv = conventions(plan)
    if plan.framework:
        clauses.append(f"{plan.framework}'s memory layout ({conv.family})")
    if (fp8 := describe_fp8(plan)) is not None:
        clauses.append(fp8)
    if hpz_enabled(plan):
        clauses.append(f"ZeRO++ hpZ: a secondary 16-bit weight partition over groups of "
                       f"{plan.zero_hpz_partition_size}")
    if is_cuda(sc.cluster):
        clauses.append("reserved_gib adds the CUDA caching allocator's cached-but-free blocks (PyTorch's "
                       "allocator rules replayed over two steps' tensors, default allocator settings)")
    return "memory overheads: " + "; ".join(clauses)
