"""The event engine's discrete-event kernel: SimPy's environment and events, with the two
things the engine's hot paths add to them.

Events are processed in SimPy's order (time, then priority, then scheduling order), so every
answer is SimPy's. The additions:

- :meth:`Event.succeed_in`: trigger an event ``delay`` seconds from now, without a timeout
  whose callback would trigger it (the fluid network's transfer ends: one queued event
  instead of two);
- :meth:`Environment.steps`: process the next ``n`` events in one call (the bounded run's
  loop, :mod:`simdist.sim.engine.budget`, checks its limits once per batch).

:meth:`Environment.event` makes such events, and the engine makes them through it or
``Event(env)``.
"""

from __future__ import annotations

from typing import Any

import simpy
from simpy.core import EmptySchedule, StopSimulation
from simpy.events import NORMAL, URGENT, AllOf, Process, Timeout

__all__ = ["NORMAL", "URGENT", "AllOf", "EmptySchedule", "Environment", "Event", "Process",
           "StopSimulation", "Timeout"]


class Event(simpy.Event):
    """A SimPy event that can also be triggered at a later instant."""

    def succeed_in(self, delay: float, value: Any = None) -> None:
        """Trigger the event ``delay`` seconds from now (what :meth:`succeed` does now)."""
        if self._value is not simpy.events.PENDING:
            raise RuntimeError(f"{self!r} has already been triggered")
        self._ok = True
        self._value = value
        self.env.schedule(self, NORMAL, delay)


class Environment(simpy.Environment):
    """SimPy's environment, whose :meth:`event` is a :class:`Event`, with :meth:`steps`."""

    def event(self) -> Event:
        return Event(self)

    def steps(self, n: int) -> None:
        """Process the next ``n`` events (raises EmptySchedule when none is left)."""
        step = self.step
        for _ in range(n):
            step()
