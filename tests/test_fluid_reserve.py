"""The fluid network's reserved transfers (FluidNetwork.reserve): a pipeline send timed when its
compute starts, one kernel event for both, gives the finish times a send started when the
compute ends gives, bit for bit, contention included; the kernel's schedule_at / unschedule
that it rests on."""

from __future__ import annotations

import pytest

from simdist.sim import kernel
from simdist.sim.network import FluidNetwork

NIC, OTHER, THIRD = ("nic0.0~leaf0", "up"), ("nic0.1~leaf0", "up"), ("nic0.2~leaf0", "up")


def run(flows: list[tuple[float, float, float, tuple, bool]], tail: float = 1e-3) -> tuple[list[float], float, int]:
    """Each flow: (when its sender asks, when it starts, solo seconds, loads, reserved?). A
    reserved one is reserved when asked (or, refused, started when due, as the engine does);
    the others are started when due. Returns the finish times, the peak overload and the
    kernel events processed."""
    env = kernel.Environment()
    fluid = FluidNetwork(env)
    ends = [0.0] * len(flows)

    def go(i: int, asked: float, at: float, work: float, loads: tuple, reserved: bool):
        route = fluid.route(work, loads, tail)
        yield env.timeout(asked)
        done = fluid.reserve(route, at) if reserved else None
        if done is None:
            yield env.timeout(at - env.now)
            done = fluid.start(route)
        yield done
        ends[i] = env.now

    for i, flow in enumerate(flows):
        env.process(go(i, *flow))
    steps = 0
    while True:
        try:
            env.step()
        except kernel.EmptySchedule:
            break
        steps += 1
    return ends, fluid.peak_overload, steps


CASES = [
    # alone: its end as a send started when due
    [(0.0, 0.2, 0.3, ((NIC, 1.0), (OTHER, 1.0)), True)],
    # two reservations back to back on one link (intervals apart), and one overlapping (refused)
    [(0.0, 0.1, 0.2, ((NIC, 1.0),), True), (0.0, 0.35, 0.1, ((NIC, 1.0),), True),
     (0.05, 0.4, 0.2, ((NIC, 1.0), (OTHER, 1.0)), True)],
    # a flow not reserved meets a reservation before it starts, and one while it runs
    [(0.0, 0.5, 0.3, ((NIC, 1.0),), True), (0.1, 0.2, 0.5, ((NIC, 1.0),), False)],
    [(0.0, 0.1, 0.3, ((NIC, 1.0),), True), (0.1, 0.2, 0.5, ((NIC, 0.5), (OTHER, 1.0)), False)],
    # ... and the reservations after it on its links follow (a chain over two links)
    [(0.0, 0.1, 0.3, ((NIC, 1.0),), True), (0.0, 0.45, 0.2, ((NIC, 1.0), (OTHER, 1.0)), True),
     (0.0, 0.3, 0.1, ((OTHER, 1.0), (THIRD, 1.0)), True), (0.2, 0.2, 0.4, ((NIC, 1.0),), False),
     (0.7, 0.7, 0.2, ((THIRD, 1.0),), False)],
    # an overloaded link on its own, and a flow meeting it the instant it ends
    [(0.0, 0.1, 0.3, ((NIC, 1.5), (OTHER, 2.0)), True), (0.0, 0.1 + 0.3 * 2.0, 0.1, ((OTHER, 1.0),), False)],
]


@pytest.mark.parametrize("flows", CASES)
def test_a_reserved_send_ends_as_one_started_when_due(flows) -> None:
    reserved, peak, _ = run(flows)
    due, peak_due, _ = run([(at, at, work, loads, False) for _, at, work, loads, _ in flows])
    assert reserved == due
    assert peak == peak_due


def test_a_reserved_send_is_one_event() -> None:
    """Uncontended: the send's completion is the only event (no start, no wake-up)."""
    flows = [(0.0, 0.2, 0.3, ((NIC, 1.0),), True)]
    _, _, reserved = run(flows)
    _, _, due = run([(0.0, 0.2, 0.3, ((NIC, 1.0),), False)])
    assert reserved == due - 2  # less the timeout to its start and the network's wake-up


def test_schedule_at_and_unschedule() -> None:
    env = kernel.Environment()
    order: list[str] = []
    a, b, c = env.event(), env.event(), env.event()
    for name, ev in (("a", a), ("b", b), ("c", c)):
        ev.callbacks.append(lambda _e, name=name: order.append(name))
    env.schedule_at(b, 2.0)
    env.schedule_at(a, 1.0)
    env.schedule_at(c, 2.0)  # after b: the same instant, queued later
    env.unschedule(a)
    assert not a.triggered
    env.schedule_at(a, 3.0)  # pending again, so it can be triggered anew
    env.run()
    assert order == ["b", "c", "a"] and env.now == 3.0
    with pytest.raises(RuntimeError):
        env.unschedule(a)  # processed: not queued
    with pytest.raises(ValueError):
        env.schedule_at(env.event(), 1.0)  # before now
