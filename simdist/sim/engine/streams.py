"""The slices' FIFO streams beside the compute stream, as in Megatron-LM / PyTorch / DeepSpeed:
``dp`` (gradient reductions or parameter-server pushes, one NCCL stream), ``gather`` (ZeRO-3
parameter all-gathers, prefetched one layer ahead), ``h2d`` and ``d2h`` (offload copies over
PCIe on the copy engines) and ``pull`` (parameter-server pulls). Items on one stream run one
after the other; a data-parallel collective starts when every simulated member of its group has
reached it (a meeting point), then the network backend times it."""

from __future__ import annotations

from collections.abc import Callable

from simdist.sim import kernel
from simdist.sim.engine.state import Proc, Run, Slice
from simdist.sim.work import CommSpec, HostXfer, PsSpec


class Streams:
    def __init__(self, run: Run):
        self.run = run
        self.meetings: dict[tuple, list] = {}  # collective -> [members arrived, done event]
        # what follows a parameter-server push (the servers' update, then the pull): set by the
        # simulation to its servers' handler
        self.pushed: Callable[[Slice, PsSpec], None] = Streams.no_push

    @staticmethod
    def no_push(sl: Slice, spec: PsSpec) -> None:
        """What follows a push where no servers are wired in: nothing."""

    def submit(self, sl: Slice, stream: str, ready: float, items: tuple, after: kernel.Event | None = None,
               ) -> kernel.Event:
        """Queue ``items`` on a FIFO stream of the slice, to start no earlier than ``ready`` and
        not before ``after``."""
        prev = sl.tails.get(stream)
        seq = sl.seq.get(stream, 0)
        sl.seq[stream] = seq + 1
        proc = self.run.env.process(self._item(sl, stream, seq, prev, ready, items, after))
        sl.tails[stream] = proc
        return proc

    def _item(self, sl: Slice, stream: str, seq: int, prev: kernel.Event | None,
              ready: float, items: tuple, after: kernel.Event | None) -> Proc:
        run = self.run
        env, net = run.env, run.network
        if prev is not None and not prev.processed:
            yield prev
        if after is not None and not after.processed:
            yield after
        if ready > env.now:
            yield env.timeout(ready - env.now)
        for i, spec in enumerate(items):
            start = env.now
            if type(spec) is CommSpec:
                yield self.collective(sl, spec, (stream, seq, i))
                run.span(sl, stream, spec.name, start, env.now, "dp_comm")
            elif type(spec) is HostXfer:
                yield self.host(sl, spec)
                run.span(sl, stream, spec.name, start, env.now, "offload")
            elif type(spec) is PsSpec:
                yield net.ps("push", spec.nbytes, sl.stage, (sl.replica,))
                run.span(sl, stream, "push " + spec.name.removeprefix("push+pull "), start, env.now, "dp_comm")
                self.pushed(sl, spec)
            else:  # a Pull
                yield net.ps("pull", spec.spec.nbytes, sl.stage, (sl.replica,))
                run.span(sl, stream, "pull " + spec.spec.name.removeprefix("push+pull "), start, env.now,
                         "dp_comm")

    def collective(self, sl: Slice, spec: CommSpec, key: tuple) -> kernel.Event:
        """A DP-family collective: it starts when every simulated member slice has reached it."""
        run = self.run
        group = run.group(sl.replica, spec.axis)
        meet = self.meetings.get((sl.stage, spec.axis, group, key))
        if meet is None:
            meet = self.meetings[(sl.stage, spec.axis, group, key)] = [0, run.env.event()]
        meet[0] += 1
        if meet[0] == len(group):
            done: kernel.Event = meet[1]
            flow = run.network.collective(spec.collective, spec.nbytes, spec.axis, sl.stage, group, spec.extra_s)
            flow.callbacks.append(lambda _e: done.succeed())
        return meet[1]

    def flow(self, sl: Slice, resource: str, seconds: float) -> kernel.Event:
        """One GPU's transfer on a host resource."""
        return self.run.network.host(resource, seconds, sl.stage, sl.replica)

    def host(self, sl: Slice, xfer: HostXfer) -> kernel.Event:
        """All parts of a host transfer at once; done when the last is."""
        events = [self.flow(sl, r, s) for r, s in xfer.parts]
        return events[0] if len(events) == 1 else kernel.AllOf(self.run.env, events)
