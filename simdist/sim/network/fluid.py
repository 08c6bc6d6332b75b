"""Sharing bandwidth in simulated time: the fluid (flow-level) part of the network backend.

While the loads on a link add up to more than 1, every flow on it is slowed by that factor;
rates are recomputed whenever a flow starts or ends (the bandwidth-sharing idea of flow-level
network simulators such as SimGrid, Casanova et al. 2014, in its simplest proportional form).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from functools import partial
from typing import NamedTuple

from simdist.sim import kernel
from simdist.sim.network.links import LinkKey, Loads


class _Flow:
    __slots__ = ("arg", "done", "loads", "over", "rate", "remaining", "stamp", "tail", "token")

    def __init__(self, work: float, loads: Loads, done: kernel.Event, now: float, tail: float):
        self.remaining, self.loads, self.done, self.tail = work, loads, done, tail
        self.rate, self.stamp, self.token = 0.0, now, 0
        self.over, self.arg = 0.0, loads[0][0]  # total load of its most loaded link, and which


# A reserved transfer (:meth:`FluidNetwork.reserve`): (when it starts, when it ends alone, its
# route, its completion, queued). Two on one link never share both instants (they would overlap),
# so list.remove finds the one meant by its first two fields.
_Held = tuple[float, float, "Route", kernel.Event]


class Route(NamedTuple):
    """A transfer's arguments, and its rating when its links are idle (:meth:`FluidNetwork.route`)."""

    work: float
    loads: Loads
    tail: float
    over: float  # the largest load on its idle links, on link ``arg``
    arg: LinkKey
    rate: float
    solo: bool  # its links distinct and no use totalled: :meth:`FluidNetwork.start`'s short way applies
    keys: tuple[LinkKey, ...]  # its links
    cells: tuple[tuple[dict, list], ...]  # per link: its flows and its reservations (the network's own)


class FluidNetwork:
    """Flows on shared links: a link whose loads add up to L > 1 slows each of its flows by L;
    a flow runs at the rate its most overloaded link allows (1 = its solo speed).

    Each flow keeps the total load of its most loaded link, so a change on one link re-rates
    only the flows it concerns; finish times wait in one heap, woken by one timeout at
    a time (a rate change leaves a stale entry that its token voids), so a busy network costs
    one kernel event per flow, not one per rate change. A transfer known ahead whose links stay
    free of other flows (a pipeline send, asked for when the compute before it starts) can be
    reserved (:meth:`reserve`): its completion queued at once, no wake-up.

    With ``track`` it also adds up what each link carries, in seconds of full use (a flow's
    load times its solo seconds: its bytes over the link's bandwidth), into ``busy``, from which
    :meth:`busiest` names the bottleneck."""

    def __init__(self, env: kernel.Environment, track: bool = False):
        self.env = env
        self._on: dict[LinkKey, dict[_Flow, float]] = {}  # link -> its flows and their loads
        self._total: dict[LinkKey, float] = {}
        self.peak_overload = 1.0  # largest slow-down any flow saw (reported in assumptions)
        self.track = track
        self.busy: dict[LinkKey, float] = {}  # seconds of full use, per link
        self._heap: list[tuple[float, int, _Flow, int]] = []  # (finish time, order, flow, token)
        self._order = 0
        self._armed: set[float] = set()  # times of pending wake-ups
        self._reserved: dict[LinkKey, list[_Held]] = {}  # link -> the reserved transfers on it (:meth:`reserve`)
        self._starting: dict[LinkKey, int] = {}  # link -> reserved transfers put back to start later

    def busiest(self, prefix: str = "") -> tuple[LinkKey, float] | None:
        """The link (whose id starts with ``prefix``) that carried the most, in seconds of full
        use; ties go to the first in sorted order, so the answer is deterministic."""
        cands = [(-v, k) for k, v in self.busy.items() if k[0].startswith(prefix) and v > 0]
        if not cands:
            return None
        v, k = min(cands)
        return k, -v

    def transfer(self, work: float, loads: Loads, tail: float = 0.0, done: kernel.Event | None = None,
                 ) -> kernel.Event:
        """Start a flow of ``work`` solo seconds; the event (``done``, or a new one) fires
        ``tail`` seconds (latency, fixed extra time) after it has finished."""
        env = self.env
        if done is None:
            done = kernel.Event(env)  # the flow's completion, fired its tail after the transfer ends
        if self._reserved:
            self._settle(loads)
        if work <= 0.0:
            done.succeed_in(tail)
            return done
        now = env.now
        flow = _Flow(work, loads, done, now, tail)
        on, total = self._on, self._total
        if self.track:
            busy = self.busy
            for key, load in loads:
                busy[key] = busy.get(key, 0.0) + load * work
        shared = False  # does another flow use one of its links?
        for key, load in loads:
            flows = on.get(key)
            if flows is None:
                flows = on[key] = {}
            elif flows:
                shared = True
            flows[flow] = load
            total[key] = total.get(key, 0.0) + load
        if shared:  # the other flows on these links: a total only grew, so it is their new maximum or nothing
            grown: dict[_Flow, None] = {}
            for key, _ in loads:
                t = total[key]
                for f in on[key]:
                    if t > f.over and f is not flow:
                        f.over, f.arg = t, key
                        grown[f] = None
            if grown:
                self._rerate(grown)
            self._rescan(flow)
            self._rerate((flow,))
        else:  # alone on its links: _rescan and _rerate of this one flow, inline
            over, arg = 0.0, flow.arg
            for key, _ in loads:
                t = total[key]
                if t > over:
                    over, arg = t, key
            flow.over, flow.arg = over, arg
            rate = 1.0 / over if over > 1.0 + 1e-9 else 1.0
            if rate < 1.0 and over > self.peak_overload:
                self.peak_overload = over
            flow.rate, flow.token = rate, 1
            self._order += 1
            heapq.heappush(self._heap, (now + max(0.0, work) / rate, self._order, flow, 1))
        self._arm()
        return done

    def route(self, work: float, loads: Loads, tail: float = 0.0) -> Route:
        """A transfer to start again and again (:meth:`start`), with what :meth:`transfer`
        works out when it finds all its links idle done once."""
        keys = [key for key, _ in loads]
        over, arg = 0.0, loads[0][0]
        for key, load in loads:  # on idle links each total is the flow's own load
            if load > over:
                over, arg = load, key
        rate = 1.0 / over if over > 1.0 + 1e-9 else 1.0
        solo = work > 0.0 and len(set(keys)) == len(keys) and not self.track
        on, reserved = self._on, self._reserved
        cells = tuple((on.setdefault(key, {}), reserved.setdefault(key, [])) for key in keys)
        return Route(work, loads, tail, over, arg, rate, solo, tuple(keys), cells)

    def start(self, r: Route, done: kernel.Event | None = None) -> kernel.Event:
        """Start the transfer of route ``r``: what :meth:`transfer` does, the same state and the
        same order of events, in fewer steps when every link of it is idle (a pipeline send
        mostly is)."""
        on = self._on
        if not r.solo:
            return self.transfer(r.work, r.loads, r.tail, done)
        if self._reserved:
            self._settle(r.loads)
        for key, _ in r.loads:
            if on.get(key):  # another flow on it
                return self.transfer(r.work, r.loads, r.tail, done)
        env = self.env
        if done is None:
            done = kernel.Event(env)
        now = env.now
        if r.rate < 1.0 and r.over > self.peak_overload:
            self.peak_overload = r.over
        self._alone(r, done, now, now + r.work / r.rate)
        return done

    def _alone(self, r: Route, done: kernel.Event, since: float, end: float) -> None:
        """Route ``r``'s flow running alone on its idle links from ``since`` to ``end``."""
        flow = _Flow(r.work, r.loads, done, since, r.tail)
        flow.over, flow.arg, flow.rate, flow.token = r.over, r.arg, r.rate, 1
        on, total = self._on, self._total
        for key, load in r.loads:
            flows = on.get(key)
            if flows is None:
                on[key] = {flow: load}
            else:
                flows[flow] = load
            total[key] = load  # (0.0 + load: an idle link's total is 0.0)
        self._order += 1
        heapq.heappush(self._heap, (end, self._order, flow, 1))
        self._arm()

    def reserve(self, r: Route, at: float) -> kernel.Event | None:
        """The transfer of route ``r`` starting at the instant ``at`` (now or later), its end
        fixed now: what :meth:`start` at ``at`` does when its links are idle from then until it
        ends, with its completion queued at once (one kernel event for the transfer, no
        wake-up; the caller need not resume at ``at`` to start it). Its links hold it as a
        reservation, a time interval beside the other reservations that do not overlap it; a
        flow that is not reserved reaching one of them before it ends (:meth:`_settle`) turns
        it back into what :meth:`start` would have made by then: a flow running since ``at``,
        or a start at ``at``. None where that is not sure now (it is not ``solo``, a link
        carries a flow, or a reservation overlaps it): the caller starts it at ``at`` itself."""
        if not r.solo:
            return None
        starting = self._starting
        if starting and any(starting.get(key) for key in r.keys):
            return None
        end = at + r.work / r.rate  # as start() at ``at`` queues it
        cells = r.cells
        for flows, held in cells:
            if flows:
                return None
            for f in held:  # (one that ended before now ended before ``at``)
                if at < f[1] and f[0] < end:
                    return None
        if r.rate < 1.0 and r.over > self.peak_overload:
            self.peak_overload = r.over
        env = self.env
        # when _arm's timeout (now + its delay) would wake, then _finish's succeed_in(tail)
        done = env.event_at(at + (end - at) + r.tail)
        h = (at, end, r, done)
        now = env._now  # (SimPy's field: the ``now`` property is a call)
        for _, held in cells:  # those that have ended: off the link
            n = len(held)
            if n == 1:
                if held[0][1] <= now:
                    held[0] = h
                    continue
            elif n == 2:  # (mostly: one ended, one not)
                if held[0][1] <= now:
                    if held[1][1] <= now:
                        held[:] = (h,)
                        continue
                    held[0] = held[1]
                    held[1] = h
                    continue
                if held[1][1] <= now:
                    held[1] = h
                    continue
            elif held:
                for f in held:
                    if f[1] <= now:
                        held[:] = [f for f in held if f[1] > now]
                        break
            held.append(h)
        return done

    def release(self) -> None:
        """Forget the reservations (each holds its route, whose links hold it: a reference
        cycle); for after the run, when none can be settled any more."""
        for held in self._reserved.values():
            held.clear()

    def _settle(self, loads: Loads) -> None:
        """Before a flow that is not reserved uses ``loads``' links: each reservation on them
        that has not ended becomes what :meth:`start` would have made by now (:meth:`reserve`)."""
        reserved, now = self._reserved, self.env.now
        for key, _ in loads:
            held = reserved.get(key)
            while held:
                f = held[0]
                if f[1] <= now:
                    held.remove(f)  # ended, as it would have alone
                else:
                    self._unreserve(f)

    def _unreserve(self, h: _Held) -> None:
        """Reservation ``h`` becomes the flow :meth:`start` would have made by now, and so does
        every other reservation on its links (their intervals counted on its end)."""
        env, reserved = self.env, self._reserved
        stamp, end, r, done = h
        now = env.now
        for key in r.keys:
            reserved[key].remove(h)
        env.unschedule(done)
        if now < stamp:  # not started: start it at its instant, as its sender would have
            starting = self._starting
            for k in r.keys:
                starting[k] = starting.get(k, 0) + 1
            begin = kernel.Event(env)
            begin.callbacks.append(partial(self._begin, h))
            env.schedule_at(begin, stamp)
        else:  # running since its stamp alone on its links: start()'s state
            self._alone(r, done, stamp, end)
        for key in r.keys:  # the others on its links
            held = reserved[key]
            while held:
                g = held[0]
                if g[1] <= now:
                    held.remove(g)
                else:
                    self._unreserve(g)

    def _begin(self, h: _Held, _event: kernel.Event) -> None:
        starting = self._starting
        for k in h[2].keys:
            starting[k] -= 1
            if not starting[k]:
                del starting[k]  # (reserve looks at the links only while any is starting)
        self.start(h[2], h[3])

    def _rescan(self, f: _Flow) -> None:
        total = self._total
        over, arg = 0.0, f.arg
        for key, _ in f.loads:
            t = total[key]
            if t > over:
                over, arg = t, key
        f.over, f.arg = over, arg

    def _rerate(self, flows: Iterable[_Flow]) -> None:
        """New rates from the flows' ``over``; a flow whose rate changes is advanced to now at its
        old rate and queued with its new finish time (its old entry is voided by the token)."""
        now = self.env.now
        heap = self._heap
        for f in flows:
            over = f.over
            rate = 1.0 / over if over > 1.0 + 1e-9 else 1.0
            if rate == f.rate:
                continue  # its queued finish time still holds
            if rate < 1.0 and over > self.peak_overload:
                self.peak_overload = over
            f.remaining -= f.rate * (now - f.stamp)
            f.stamp = now
            f.rate = rate
            f.token += 1
            self._order += 1
            heapq.heappush(heap, (now + max(0.0, f.remaining) / rate, self._order, f, f.token))

    def _arm(self) -> None:
        """Make sure a wake-up is pending for the earliest valid finish time."""
        heap = self._heap
        while heap:
            at, _, f, token = heap[0]
            if token == f.token:
                break
            heapq.heappop(heap)
        else:
            return
        armed = self._armed
        if armed and min(armed) <= at:
            return  # an earlier wake-up is pending; it arms the next one
        armed.add(at)
        env = self.env
        now = env.now
        kernel.Timeout(env, at - now if at > now else 0.0).callbacks.append(partial(self._wake, at))

    def _wake(self, at: float, _event: kernel.Event) -> None:
        """Finish every flow due by ``at`` (in finish-time, then queueing order)."""
        self._armed.discard(at)
        heap = self._heap
        while heap and heap[0][0] <= at:
            _, _, flow, token = heapq.heappop(heap)
            if token == flow.token:
                self._finish(flow)
        self._arm()

    def _finish(self, flow: _Flow) -> None:
        on, total = self._on, self._total
        flow.token += 1  # no entry of it is valid any more
        shrunk: dict[_Flow, None] = {}  # flows whose most loaded link got lighter
        for key, load in flow.loads:
            flows = on[key]
            del flows[flow]
            if flows:
                total[key] -= load
                for f in flows:
                    if f.arg == key:
                        shrunk[f] = None
            else:
                total[key] = 0.0  # no drift accumulates on an idle link
        for f in shrunk:
            self._rescan(f)
        if shrunk:
            self._rerate(shrunk)
        flow.done.succeed_in(flow.tail)
