"""Results: the Prediction users see, with its memory per stage and the engine's spans (plain
data; an engine's own result is :class:`simdist.analytic.result.StepResult`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field
from typing import Any

from simdist.analytic.result import BREAKDOWN_KEYS, Span
from simdist.frozen import frozen
from simdist.units import GiB

__all__ = ["BREAKDOWN_KEYS", "Prediction", "Span", "StageMemoryReport", "to_gib"]


@frozen(slots=True)
class StageMemoryReport:
    """One stage's memory per GPU at its peak. ``peak_gib`` is what the job holds (PyTorch's
    allocated tensors plus the runtime's context and NCCL buffers); ``reserved_gib`` adds what
    the caching allocator keeps reserved beyond it (``allocator_gap_gib``: a number, or a function
    that works it out on first use: the allocator replay is the costliest part of a prediction
    and searches never read it); ``other_parts_gib`` says what ``other_gib`` holds (working
    buffers, CUDA context, NCCL buffers, cuBLAS workspaces)."""

    stage: int
    params_gib: float
    grads_gib: float
    optimizer_gib: float
    activations_gib: float
    other_gib: float
    peak_gib: float
    host_gib: float = 0.0
    other_parts_gib: tuple[tuple[str, float], ...] = ()
    allocator_gap_gib: float | Callable[[], float] = field(default=0.0, compare=False, repr=False)

    @property
    def reserved_gib(self) -> float:
        gap = self.allocator_gap_gib
        return self.peak_gib + max(0.0, gap() if callable(gap) else gap)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "stage": self.stage, "params_gib": self.params_gib, "grads_gib": self.grads_gib,
            "optimizer_gib": self.optimizer_gib, "activations_gib": self.activations_gib,
            "other_gib": self.other_gib, "peak_gib": self.peak_gib,
            "reserved_gib": self.reserved_gib,
        }
        if self.other_parts_gib:
            out["other_parts_gib"] = dict(self.other_parts_gib)
        if self.host_gib:
            out["host_gib"] = self.host_gib
        return out


@frozen
class Prediction:
    name: str
    world_size: int
    step_time_s: float
    tokens_per_s: float
    model_flops_per_step: float
    model_tflops_per_gpu: float
    mfu: float
    bubble_fraction: float
    breakdown_s: dict[str, float]
    per_stage: tuple[StageMemoryReport, ...]
    capacity_gib: float
    engine: str = "analytic"
    recompute_flops_per_step: float = 0.0
    assumptions: tuple[str, ...] = ()
    spans: tuple[Span, ...] = field(default=(), repr=False, compare=False)
    profile: str | None = None
    scenario_hash: str = ""
    host_capacity_gib: float | None = None
    extras: dict[str, Any] = field(default_factory=dict)  # e.g. goodput, staleness

    @property
    def peak_gib(self) -> float:
        return max(s.peak_gib for s in self.per_stage)

    @property
    def reserved_gib(self) -> float:
        return max(s.reserved_gib for s in self.per_stage)

    @property
    def host_peak_gib(self) -> float:
        return max(s.host_gib for s in self.per_stage)

    @property
    def fits(self) -> bool:
        fits = self.peak_gib <= self.capacity_gib
        if self.host_capacity_gib is not None and self.host_peak_gib > 0:
            fits = fits and self.host_peak_gib <= self.host_capacity_gib
        return fits

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of `simdist predict --json` (the output schema of the scenario-format
        reference), plus extensions."""
        out: dict[str, Any] = {
            "name": self.name,
            "world_size": self.world_size,
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "model_flops_per_step": self.model_flops_per_step,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "mfu": self.mfu,
            "bubble_fraction": self.bubble_fraction,
            "breakdown_s": dict(self.breakdown_s),
            "memory": {
                "peak_gib": self.peak_gib,
                "reserved_gib": self.reserved_gib,
                "capacity_gib": self.capacity_gib,
                "fits": self.fits,
                "per_stage": [s.to_dict() for s in self.per_stage],
            },
            "engine": self.engine,
            "recompute_flops_per_step": self.recompute_flops_per_step,
            "scenario_hash": self.scenario_hash,
            "profile": self.profile,
            "assumptions": list(self.assumptions),
        }
        if self.host_capacity_gib is not None and self.host_peak_gib > 0:
            out["memory"]["host_peak_gib"] = self.host_peak_gib
            out["memory"]["host_capacity_gib"] = self.host_capacity_gib
        out.update(self.extras)
        return out


def to_gib(n: float) -> float:
    return n / GiB
