"""Parameter servers in the event engine: each bucket is pushed as backward fills it, updated on
the servers' CPUs once every worker pushed it (synchronous) or at once (asynchronous), then
pulled; the step waits for the last pull.

Asynchronous parameter servers have no step barrier, so they always run in full fidelity for
several cycles: each replica starts 1/dp of a cycle after the previous one (the steady state of
free-running workers, which drift apart) and goes on at its own pace; the step time is the
time between dp updates in the steady state, and the staleness of each update (updates by other
workers between a worker's pull and its push) is counted from the simulated order.
"""

from __future__ import annotations

from typing import Any

from simdist.analytic.param_server import async_staleness_steps
from simdist.sim import kernel
from simdist.sim.engine.state import Pull, Run, Slice
from simdist.sim.engine.streams import Streams
from simdist.sim.work import PsSpec

ASYNC_CYCLES = 6  # simulated steps' worth of updates in the asynchronous mode (1 warm-up)


class Servers:
    def __init__(self, run: Run, streams: Streams, stagger: float):
        self.run, self.streams = run, streams
        self.async_mode = run.plan.async_parameter_servers
        self.meetings: dict[tuple, list] = {}  # (stage, key) -> [pushes arrived, update done]
        self.update_began: dict[kernel.Event, float] = {}  # synchronous servers: when each update started
        # asynchronous parameter servers: updates of the first stage's parameters, in order
        self.stagger = stagger
        self.updates = 0
        self.update_log: list[tuple[float, int, int, int]] = []  # (time, replica, staleness, cycle)
        self.target = ASYNC_CYCLES * run.plan.dp
        self.window: list[float] = []  # times of the dp-th and the target-th update
        self.stop = run.env.event()

    def pushed(self, sl: Slice, spec: PsSpec) -> None:
        """After a push: the servers apply the bucket (synchronously once every replica pushed
        it; asynchronously at once), then the slice pulls it."""
        run = self.run
        if self.async_mode or not run.full:
            update = self._update(sl, spec)
        else:
            key = (sl.stage, spec.key)
            meet = self.meetings.get(key)
            if meet is None:
                meet = self.meetings[key] = [0, run.env.event()]
            meet[0] += 1
            if meet[0] == len(run.group(sl.replica, "dp")):
                done: kernel.Event = meet[1]
                self.update_began[done] = run.env.now
                self._update(sl, spec).callbacks.append(lambda _e: done.succeed())
            update = meet[1]
        sl.tails["update"] = update
        self.streams.submit(sl, "pull", run.env.now, (Pull(spec),), after=update)

    def _update(self, sl: Slice, spec: PsSpec) -> kernel.Event:
        run = self.run
        start = run.env.now
        flow = run.network.ps_update(spec.update_s)
        if run.keep_spans and spec.update_s > 0:
            flow.callbacks.append(lambda _e: run.span(sl, "ps", "server update", start, run.env.now, "optimizer"))
        return flow

    def applied(self, sl: Slice) -> None:
        """Asynchronous mode: the worker's push is applied; it reads the new version (its pull)."""
        now = self.run.env.now
        self.update_log.append((now, sl.replica, self.updates - sl.version, sl.cycle))
        self.updates += 1
        sl.version = self.updates
        if self.updates in (self.run.plan.dp, self.target):
            self.window.append(now)
        if self.updates >= self.target and not self.stop.triggered:
            self.stop.succeed()

    def steady_step(self) -> float:
        """The time between dp updates in the steady state."""
        return (self.window[1] - self.window[0]) / (ASYNC_CYCLES - 1)

    def staleness(self) -> dict[str, Any]:
        """The simulated staleness of the updates (after the warm-up cycle), and a note."""
        plan = self.run.plan
        logged = [s for _, _, s, cycle in self.update_log if cycle >= 1] or [s for _, _, s, _ in self.update_log]
        by_worker: dict[int, list[int]] = {}
        for _, replica, s, cycle in self.update_log:
            if cycle >= 1:
                by_worker.setdefault(replica, []).append(s)
        extras: dict[str, Any] = {
            "staleness_steps": sum(logged) / len(logged),
            "staleness": {
                "mean_steps": sum(logged) / len(logged),
                "max_steps": max(logged),
                "closed_form_steps": async_staleness_steps(plan),
                "updates_simulated": len(self.update_log),
                "per_worker_mean_steps": {str(r): sum(v) / len(v) for r, v in sorted(by_worker.items())},
            },
        }
        self.run.notes.append(f"asynchronous parameter servers: {len(self.update_log)} updates simulated "
                              f"({ASYNC_CYCLES} per worker, the first cycle as warm-up), replicas started "
                              f"{self.stagger:.3g} s apart; mean staleness {extras['staleness_steps']:.2f} "
                              f"updates (closed form {async_staleness_steps(plan):.0f})")
        return extras
