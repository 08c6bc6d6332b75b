"""The event engine's kernel (simdist.sim.kernel): the order in which it processes events, which
every answer of the event engine depends on (tests/test_golden.py checks the answers)."""

from __future__ import annotations

import pytest

from simdist.sim import kernel


def test_same_instant_events_run_in_scheduling_order_and_process_starts_first() -> None:
    env = kernel.Environment()
    seen: list[str] = []
    for name in ("a", "b"):
        env.timeout(1.0).callbacks.append(lambda _e, name=name: seen.append(name))
    env.timeout(0.5).callbacks.append(lambda _e: seen.append("early"))
    later = env.event()
    later.callbacks.append(lambda _e: seen.append("succeeded"))

    def proc():
        seen.append("started")
        yield env.timeout(1.0)
        seen.append("proc")
        later.succeed()

    env.timeout(0.0).callbacks.append(lambda _e: seen.append("zero"))
    env.process(proc())  # its start is urgent: before the timeout scheduled earlier at 0
    env.run()
    assert seen == ["started", "zero", "early", "a", "b", "proc", "succeeded"]
    assert env.now == 1.0


def test_a_processed_event_lets_the_process_go_on_at_once() -> None:
    env = kernel.Environment()
    done = env.timeout(1.0, value="x")
    got: list[tuple[float, object]] = []

    def proc():
        yield env.timeout(2.0)
        value = yield done  # processed at 1: no wait
        got.append((env.now, value))
        return "end"

    p = env.process(proc())
    assert env.run(until=p) == "end"
    assert got == [(2.0, "x")]
    assert p.triggered and p.value == "end"


def test_all_of_fires_when_the_last_event_is_processed() -> None:
    env = kernel.Environment()
    events = [env.timeout(t) for t in (3.0, 1.0, 2.0)]
    both = kernel.AllOf(env, events)
    times: list[float] = []
    both.callbacks.append(lambda _e: times.append(env.now))
    env.run()
    assert times == [3.0]
    assert kernel.AllOf(env, []).triggered


def test_steps_is_step_repeated_and_an_empty_queue_says_so() -> None:
    def trace(batch: bool) -> list[tuple[float, int]]:
        env = kernel.Environment()
        out: list[tuple[float, int]] = []
        for i, t in enumerate((2.0, 1.0, 1.0, 0.0)):
            env.timeout(t).callbacks.append(lambda _e, i=i: out.append((env.now, i)))
        with pytest.raises(kernel.EmptySchedule):
            if batch:
                env.steps(10)
            else:
                while True:
                    env.step()
        return out

    assert trace(True) == trace(False) == [(0.0, 3), (1.0, 1), (1.0, 2), (2.0, 0)]


def test_misuse_is_refused() -> None:
    env = kernel.Environment()
    ev = env.event()
    ev.succeed(1)
    with pytest.raises(RuntimeError):
        ev.succeed(2)
    with pytest.raises(ValueError):
        env.timeout(-1.0)
    with pytest.raises(AttributeError):
        _ = env.event().value
    with pytest.raises(RuntimeError):
        env.run(until=env.event())  # nothing left and the event never happened


def test_simpy_package_completes_on_first_use_without_reading_metadata_before() -> None:
    """The kernel imports SimPy's core and events without its package __init__ (which reads the
    installed metadata); the package still gives every name, and its version, when asked."""
    import subprocess
    import sys

    code = ("import sys; before = 'importlib.metadata' in sys.modules\n"
            "import simdist.sim.kernel as k\n"
            "print(before or 'importlib.metadata' not in sys.modules)\n"
            "import simpy\n"
            "from simpy import Store\n"
            "print(simpy.Environment is simpy.core.Environment, bool(simpy.__version__), Store.__name__)\n"
            "print(issubclass(k.Environment, simpy.Environment))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "True", "True", "Store", "True"]


def test_resume_with_runs_the_waiters_right_after_the_running_event_in_its_step() -> None:
    env = kernel.Environment()
    seen: list[tuple[str, float, object]] = []
    waited = env.event()
    done = env.timeout(2.0)
    running = done.callbacks  # taken before the step, as the step driver does
    env.timeout(2.0).callbacks.append(lambda _e: seen.append(("later at 2", env.now, None)))

    def receiver():
        value = yield waited
        seen.append(("receiver", env.now, waited.value))
        assert value is None  # resumed by done's step: the value is read from the waited event

    def sender():
        yield done
        seen.append(("sender", env.now, None))
        kernel.resume_with(waited, "sent", running)

    env.process(receiver())
    env.process(sender())
    steps = 0
    while True:
        try:
            env.step()
        except kernel.EmptySchedule:
            break
        steps += 1
    # the receiver goes on in the sender's step, before the other event at the same instant
    assert [s[0] for s in seen] == ["sender", "receiver", "later at 2"]
    assert seen[1][1:] == (2.0, "sent")
    assert waited.processed and waited.ok
    assert steps == 6  # two process starts, two timeouts, two process ends: no step of its own for waited


def test_steps_stops_like_step_and_raises_an_unhandled_failure() -> None:
    """steps() has SimPy's step inline: a StopSimulation from a callback leaves the event's
    remaining callbacks for when the run goes on, and a failed event nobody waited for raises."""
    env = kernel.Environment()
    out: list[str] = []
    ev = env.timeout(1.0)
    ev.callbacks.append(lambda _e: out.append("first"))
    ev.callbacks.append(kernel.StopSimulation.callback)
    ev.callbacks.append(lambda _e: out.append("after"))
    with pytest.raises(kernel.StopSimulation):
        env.steps(5)
    assert out == ["first"] and env.now == 1.0
    env.steps(1)  # the rest of its callbacks, at once
    assert out == ["first", "after"]
    bad = env.event()
    bad.fail(ValueError("lost"))
    with pytest.raises(ValueError, match="lost"):
        env.steps(1)
