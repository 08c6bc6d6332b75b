"""The event engine's discrete-event kernel: an environment with a clock and a queue of events,
events with callbacks, timeouts, generator processes and all-of conditions.

It keeps the semantics the engine was written against (those of SimPy 4, whose model it
follows: Matloff's and SimPy's process-interaction style), so that every answer is the same:
events are processed in (time, priority, scheduling order); a process starts with an urgent
event at its creation; a process that yields an event already processed goes on at once; a
finished process is an event scheduled when its generator returns. It leaves out what the
engine never uses (failing events, interrupts, resources, real time), and so it is lighter:
slotted events, one callback list, no per-event checks; and it starts fast (no package
metadata read at import).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from heapq import heappop, heappush
from itertools import count
from typing import Any

URGENT = 0  # a process's start
NORMAL = 1  # everything else
_PENDING = object()
_new = object.__new__


class EmptySchedule(Exception):
    """No event is left to process."""


class StopSimulation(Exception):
    """Raised by the callback of the event a run waits for."""

    @classmethod
    def callback(cls, event: Event) -> None:
        raise cls(event._value)


class Event:
    """Something that happens at an instant: its callbacks run when it is processed."""

    __slots__ = ("_value", "callbacks", "env")

    def __init__(self, env: Environment):
        self.env = env
        self.callbacks: list[Callable[[Event], Any]] | None = []
        self._value: Any = _PENDING

    @property
    def triggered(self) -> bool:
        return self._value is not _PENDING

    @property
    def processed(self) -> bool:
        return self.callbacks is None

    @property
    def ok(self) -> bool:
        return self._value is not _PENDING

    @property
    def value(self) -> Any:
        if self._value is _PENDING:
            raise AttributeError(f"value of {self!r} is not yet available")
        return self._value

    def succeed(self, value: Any = None) -> Event:
        """Trigger the event now (its callbacks run when the queue reaches it)."""
        if self._value is not _PENDING:
            raise RuntimeError(f"{self!r} has already been triggered")
        self._value = value
        env = self.env
        heappush(env._queue, (env.now, NORMAL, next(env._eid), self))
        return self

    def succeed_in(self, delay: float, value: Any = None) -> None:
        """Trigger the event ``delay`` seconds from now."""
        self._value = value
        env = self.env
        heappush(env._queue, (env.now + delay, NORMAL, next(env._eid), self))


class Timeout(Event):
    """An event that happens ``delay`` after its creation."""

    __slots__ = ()

    def __init__(self, env: Environment, delay: float, value: Any = None):
        if delay < 0:
            raise ValueError(f"negative delay {delay}")
        self.env = env
        self.callbacks = []
        self._value = value
        heappush(env._queue, (env.now + delay, NORMAL, next(env._eid), self))


class Process(Event):
    """A generator driven by the events it yields; itself an event, triggered (with the
    generator's return value) when the generator returns. An exception in the generator ends
    the run (the engine has no process that fails on purpose)."""

    __slots__ = ("_gen",)

    def __init__(self, env: Environment, generator: Generator[Event, Any, Any]):
        self.env = env
        self.callbacks = []
        self._value = _PENDING
        self._gen = generator
        start = Event(env)
        start._value = None
        start.callbacks.append(self._resume)
        heappush(env._queue, (env.now, URGENT, next(env._eid), start))

    def _resume(self, event: Event) -> None:
        send = self._gen.send
        while True:
            try:
                event = send(event._value)
            except StopIteration as stop:
                self._value = stop.value
                env = self.env
                heappush(env._queue, (env.now, NORMAL, next(env._eid), self))
                return
            callbacks = event.callbacks
            if callbacks is not None:
                callbacks.append(self._resume)
                return


class AllOf(Event):
    """Triggered once every one of ``events`` has been processed."""

    __slots__ = ("_count", "_events")

    def __init__(self, env: Environment, events: Iterable[Event]):
        super().__init__(env)
        self._events = tuple(events)
        self._count = 0
        if not self._events:
            self.succeed()
            return
        for event in self._events:
            if event.callbacks is None:
                self._check(event)
            else:
                event.callbacks.append(self._check)

    def _check(self, _event: Event) -> None:
        if self._value is not _PENDING:
            return
        self._count += 1
        if self._count == len(self._events):
            self.succeed()


class Environment:
    """The clock and the queue of scheduled events."""

    def __init__(self) -> None:
        self.now: float = 0  # the clock (an attribute: the engine reads it at every step)
        self._queue: list[tuple[float, int, int, Event]] = []
        self._eid = count()  # events scheduled so far (next() numbers the next one)

    def event(self) -> Event:
        return Event(self)

    def timeout(self, delay: float, value: Any = None) -> Timeout:
        if delay < 0:
            raise ValueError(f"negative delay {delay}")
        event = _new(Timeout)  # Timeout(self, delay, value), one call fewer on the hottest path
        event.env = self
        event.callbacks = []
        event._value = value
        heappush(self._queue, (self.now + delay, NORMAL, next(self._eid), event))
        return event

    def process(self, generator: Generator[Event, Any, Any]) -> Process:
        return Process(self, generator)

    def all_of(self, events: Iterable[Event]) -> AllOf:
        return AllOf(self, events)

    def schedule(self, event: Event, priority: int = NORMAL, delay: float = 0) -> None:
        heappush(self._queue, (self.now + delay, priority, next(self._eid), event))

    def step(self) -> None:
        """Process the next event: advance the clock to it and run its callbacks."""
        try:
            self.now, _, _, event = heappop(self._queue)
        except IndexError:
            raise EmptySchedule from None
        callbacks, event.callbacks = event.callbacks, None
        for callback in callbacks:
            callback(event)

    def steps(self, n: int) -> None:
        """Process the next ``n`` events (:meth:`step` ``n`` times, in one frame: the engine's
        hot loop)."""
        queue = self._queue
        for _ in range(n):
            try:
                self.now, _, _, event = heappop(queue)
            except IndexError:
                raise EmptySchedule from None
            callbacks, event.callbacks = event.callbacks, None
            for callback in callbacks:
                callback(event)

    def run(self, until: Event | None = None) -> Any:
        """Process events until ``until`` is processed (its value is returned) or, without it,
        until none is left."""
        if until is not None:
            if until.callbacks is None:
                return until._value
            until.callbacks.append(StopSimulation.callback)
        try:
            while True:
                self.step()
        except StopSimulation as stop:
            return stop.args[0]
        except EmptySchedule:
            if until is not None:
                raise RuntimeError("no event left, but the run's end was not reached") from None
        return None
