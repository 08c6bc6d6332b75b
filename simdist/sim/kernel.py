"""The event engine's discrete-event kernel: SimPy's environment and events, with the two
things the engine's hot paths add to them.

Events are processed in SimPy's order (time, then priority, then scheduling order), so every
answer is SimPy's. The additions:

- :meth:`Event.succeed_in`: trigger an event ``delay`` seconds from now, without a timeout
  whose callback would trigger it (the fluid network's transfer ends: one queued event
  instead of two);
- :meth:`Environment.steps`: process the next ``n`` events in one call (the bounded run's
  loop, :mod:`simdist.sim.engine.budget`, checks its limits once per batch);
- :meth:`Environment.schedule_at` (:meth:`Environment.event_at`, for a new event) and
  :meth:`Environment.unschedule`: trigger an event at an
  absolute instant computed ahead (the arithmetic of the events it stands for, so the instant
  is theirs to the bit), and take such an event back before it is processed (the fluid
  network's reserved transfers, :meth:`simdist.sim.network.fluid.FluidNetwork.reserve`, whose
  links another flow reached first).

:meth:`Environment.event` makes such events, and the engine makes them through it or
``Event(env)``.

SimPy's package ``__init__`` only gathers its submodules' names, and reads SimPy's version from
the installed package metadata (``importlib.metadata``, with the ``email`` parser it pulls in:
about 40 ms of CPU, a seventh of a ``simdist predict`` command). The engine needs only
``simpy.core`` and ``simpy.events``, so :func:`_import_simpy` imports them with the package
module made but its ``__init__`` deferred until something asks the package for a name it holds
(``simpy.Store``, ``simpy.__version__``, ``from simpy import Resource``): then it runs, once,
and the package is the same as if imported directly.
"""

from __future__ import annotations

import heapq
import importlib.util
import sys
from typing import Any


def _import_simpy() -> None:
    """Put SimPy's package in ``sys.modules`` with its ``__init__`` run on first use of one of
    its names (see the module docstring); nothing to do where it is imported already or is not
    a plain package."""
    if "simpy" in sys.modules:
        return
    spec = importlib.util.find_spec("simpy")
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return  # (an import below then says what is missing)
    package = importlib.util.module_from_spec(spec)

    def complete(name: str) -> Any:
        del package.__dict__["__getattr__"]  # once: the package's own code runs now
        spec.loader.exec_module(package)  # type: ignore[union-attr]
        return getattr(package, name)

    package.__getattr__ = complete  # type: ignore[method-assign]
    sys.modules["simpy"] = package


_import_simpy()

import simpy.core  # noqa: E402  (after _import_simpy)
import simpy.events  # noqa: E402
from simpy.core import EmptySchedule, StopSimulation  # noqa: E402
from simpy.events import NORMAL, PENDING, URGENT, AllOf, EventPriority, Process, Timeout  # noqa: E402

__all__ = ["NORMAL", "URGENT", "AllOf", "EmptySchedule", "Environment", "Event", "Process",
           "StopSimulation", "Timeout"]


_new, _push = object.__new__, heapq.heappush  # (hot paths: a global each, not a global and an attribute)


class Event(simpy.events.Event):
    """A SimPy event that can also be triggered at a later instant."""

    def succeed_in(self, delay: float, value: Any = None) -> None:
        """Trigger the event ``delay`` seconds from now (what :meth:`succeed` does now)."""
        if self._value is not PENDING:
            raise RuntimeError(f"{self!r} has already been triggered")
        self._ok = True
        self._value = value
        self.env.schedule(self, NORMAL, delay)


class Environment(simpy.core.Environment):
    """SimPy's environment, whose :meth:`event` is a :class:`Event`, with :meth:`steps`."""

    def event(self) -> Event:
        return Event(self)

    def schedule_at(self, event: simpy.events.Event, at: float, value: Any = None) -> None:
        """Trigger ``event`` (pending) to be processed at the instant ``at`` (not before now),
        in SimPy's order: after what is queued for ``at`` already, as :meth:`schedule` would."""
        if event._value is not PENDING:
            raise RuntimeError(f"{event!r} has already been triggered")
        if at < self._now:
            raise ValueError(f"cannot schedule at {at}, before now ({self._now})")
        event._ok = True
        event._value = value
        heapq.heappush(self._queue, (at, NORMAL, next(self._eid), event))

    def event_at(self, at: float) -> Event:
        """A new event, triggered to be processed at the instant ``at``: :meth:`schedule_at` of
        a new :class:`Event`, in one call."""
        if at < self._now:
            raise ValueError(f"cannot schedule at {at}, before now ({self._now})")
        event = _new(Event)  # Event(self), without the call of its __init__ (a hot path)
        event.env = self
        event.callbacks = []
        event._ok = True
        event._value = None
        _push(self._queue, (at, NORMAL, next(self._eid), event))
        return event

    def unschedule(self, event: simpy.events.Event) -> None:
        """Take back a triggered ``event`` not processed yet: it leaves the queue and is pending
        again (its callbacks kept), to be triggered anew."""
        queue = self._queue
        for i, entry in enumerate(queue):
            if entry[3] is event:
                last = queue.pop()
                if i < len(queue):
                    queue[i] = last
                    heapq.heapify(queue)
                event._value = PENDING
                return
        raise RuntimeError(f"{event!r} is not queued")

    def steps(self, n: int) -> None:
        """Process the next ``n`` events (raises EmptySchedule when none is left): SimPy's
        :meth:`step` ``n`` times, its body inline (one call fewer per event, a hot path)."""
        queue, pop = self._queue, heapq.heappop
        for _ in range(n):
            try:
                self._now, _, _, event = pop(queue)
            except IndexError:
                raise EmptySchedule from None
            callbacks, event.callbacks = event.callbacks, None
            try:
                for callback in callbacks:  # (callbacks added to the list meanwhile run too)
                    callback(event)
            except StopSimulation:  # as step(): the rest of the callbacks when the run goes on
                event.callbacks = callbacks[callbacks.index(callback) + 1:]
                self.schedule(event, EventPriority(-1))
                raise
            if not event._ok and not hasattr(event, "_defused"):  # a failure nobody handled
                exc = type(event._value)(*event._value.args)
                exc.__cause__ = event._value
                raise exc


def resume_with(waited: simpy.events.Event, value: Any, running: list) -> None:
    """Trigger ``waited`` with ``value``, its callbacks (the processes waiting for it) to run
    right after those in ``running``, the callback list of the event being processed now
    (taken from it before its step: SimPy's step runs the list the event held, to its end,
    so callbacks added to it run next), instead of in a step of their own later at the same
    instant (one event fewer)."""
    waited._ok = True
    waited._value = value
    running.extend(waited.callbacks)  # type: ignore[arg-type]
    waited.callbacks = None  # processed: whoever reaches it from now on goes on at once
