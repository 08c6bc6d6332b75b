"""Fields the scenario carries that the simulator does not use yet (contract v1.2).

The spec reads, checks and documents them so that files written today keep their meaning; the
engines learn them one by one. Until a field is simulated, a prediction whose scenario sets it
must say so rather than ignore it silently: :func:`not_simulated` lists the fields a scenario
sets away from the value they take when absent, with what the engines do instead. ``blocking``
entries cannot be predicted at all yet (the event engine has no such schedule): refuse them.
Remove an entry in the change that teaches the engines its field.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simdist.frozen import frozen
from simdist.spec.fields import legacy_view, spec_fields

if TYPE_CHECKING:
    from simdist.spec.scenario import Scenario


@frozen(slots=True)
class NotSimulated:
    field: str  # dotted scenario field
    instead: str  # what the engines do today
    blocking: bool = False  # True: the engines cannot run the scenario at all


NOT_SIMULATED_YET: tuple[NotSimulated, ...] = (
    NotSimulated("plan.zero_hpz_partition_size",
                 "time: the backward all-gather spans the whole shard group (memory holds the secondary partition)"),
)
_BY_FIELD = {n.field: n for n in NOT_SIMULATED_YET}


def not_simulated(scenario: Scenario) -> list[NotSimulated]:
    """The entries of :data:`NOT_SIMULATED_YET` that ``scenario`` uses."""
    out = []
    for section in ("model", "plan"):
        obj = getattr(scenario, section)
        listed = [(fs, _BY_FIELD[f"{section}.{fs.key}"]) for fs in spec_fields(type(obj))
                  if f"{section}.{fs.key}" in _BY_FIELD]
        if not listed:  # (the view below is the dear part)
            continue
        used = legacy_view(obj)
        for fs, entry in listed:
            if fs.name not in used:
                continue
            if entry.field == "plan.schedule" and not _is_dualpipe(used[fs.name]):
                continue
            out.append(entry)
    return out


def _is_dualpipe(schedule: Any) -> bool:
    return schedule in ("dualpipe", "dualpipev")
