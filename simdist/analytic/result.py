"""What an engine returns for one optimizer step: both engines (the closed form and the event
engine) give a :class:`StepResult`, which :func:`simdist.predict.predict` turns into the
Prediction users see. Plain data."""

from __future__ import annotations

from dataclasses import field
from typing import Any

from simdist.frozen import frozen

BREAKDOWN_KEYS = ("compute", "recompute", "tp_comm", "pp_comm", "dp_comm", "bubble", "optimizer")


@frozen(slots=True)
class Span:
    """One interval of a rank's timeline (the event engine's output, drawn by the trace viewer)."""

    rank: int
    stream: str  # "compute", "tp", "pp", "dp", ...
    name: str  # "F mb3 chunk1", "allreduce tp 48 MiB", ...
    start: float  # seconds from the start of the step
    end: float
    category: str = ""  # forward | backward | recompute | tp_comm | pp_comm | dp_comm | optimizer | idle


@frozen
class StepResult:
    """One step as an engine saw it. The breakdown's parts sum to the step time; ``offload``
    and ``compression`` appear only when the plan uses them."""

    step_time: float
    breakdown: dict[str, float]
    bubble_fraction: float
    busiest_stage: int
    spans: tuple[Span, ...] = ()
    assumptions: tuple[str, ...] = ()  # what this engine assumed, beyond the prediction's own
    events: int = 0  # simpy events processed (the event engine)
    extras: dict[str, Any] = field(default_factory=dict)  # staleness, bottleneck, stragglers...
    # the parameter servers' update the step exposes, within ``optimizer`` (a worker waits for it
    # between its push and its pull: the executor measures it as communication)
    server_update_s: float = 0.0


def breakdown_keys(offload: bool, compression: bool, ep: bool = False, cp: bool = False) -> tuple[str, ...]:
    """The breakdown's parts, in order, for a plan that offloads and/or compresses gradients, and
    (contract v1.2) splits the experts (``ep_comm``: exposed all-to-all) or the sequence
    (``cp_comm``: exposed context-parallel communication)."""
    return (BREAKDOWN_KEYS + (("offload",) if offload else ()) + (("compression",) if compression else ())
            + (("ep_comm",) if ep else ()) + (("cp_comm",) if cp else ()))
