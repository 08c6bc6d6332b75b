"""What a slice does after its pipeline flush, in the step driver (:mod:`.step`): waiting for
the gradient sync (reductions or pushes, the servers' updates, the pulls, the copies to the
host), ZeRO-Offload's CPU step beside the parameter upload and NVMe swap, and Megatron's
parameter all-gather hidden behind the next step's forward; and how each is recorded (the
tally's ``post`` list, the spans)."""

from __future__ import annotations

from simdist.sim import kernel
from simdist.sim.engine.servers import Servers
from simdist.sim.engine.state import Proc, Run, Slice
from simdist.sim.engine.streams import Streams
from simdist.sim.work import HostXfer, StageWork


class AfterFlush:
    """The step driver's steps after the flush (a base of :class:`.step.StepDriver`, whose
    state they use)."""

    run: Run
    env: kernel.Environment
    streams: Streams
    servers: Servers

    def _post(self, sl: Slice, start: float, category: str, name: str = "", stream: str = "",
              end: float | None = None) -> None:
        """Record what the slice did or waited for after the flush, from ``start`` to now."""
        now = self.env.now if end is None else end
        if now > start:
            sl.tally.post.append((start, now, category))
            if name:
                self.run.span(sl, stream, name, start, now, category)

    def _gradients_done(self, sl: Slice) -> Proc:
        """Wait for the step's gradient sync: reductions or pushes (dp), the servers' updates
        (optimizer), the pulls (dp) and the copies to the host (offload)."""
        for stream, category in (("dp", "dp_comm"), ("update", "optimizer"), ("pull", "dp_comm"),
                                 ("d2h", "offload")):
            ev = sl.tails.get(stream)
            if ev is not None and not ev.processed:
                start = self.env.now
                yield ev
                if stream == "update":  # waiting for the other replicas' pushes is not the update
                    began = max(start, self.servers.update_began.get(ev, start))
                    self._post(sl, start, "dp_comm", end=began)
                    start = began
                self._post(sl, start, category)
            if stream == "update" and self.servers.async_mode and sl.stage == 0:
                self.servers.applied(sl)

    def _host_step(self, sl: Slice, xfer: HostXfer) -> Proc:
        """ZeRO-Offload's step: the node's CPU updates the states while the updated parameters go
        up and the states swap with NVMe (DeepSpeed pipelines them tile by tile): the CPU part
        is optimizer time, what outlasts it offload."""
        env = self.env
        start = env.now
        events = {r: self.streams.flow(sl, r, s) for r, s in xfer.parts}
        cpu = events.pop("cpu", None)
        if cpu is not None:
            yield cpu
            self._post(sl, start, "optimizer", xfer.name, "host")
        rest = env.now
        for ev in events.values():
            if not ev.processed:
                yield ev
        self._post(sl, rest, "offload", "parameter upload / NVMe swap", "host")

    def _gather_behind_forward(self, sl: Slice, work: StageWork) -> Proc:
        """Megatron's distributed optimizer with --overlap-param-gather: bucket k's all-gather
        is waited for only before the next step's forward reaches its layers, so what counts in
        this step is how far the gathers push that forward (each bucket's share of it waits
        for its gather)."""
        start, n = self.env.now, len(work.post_optimizer)
        done = [self.streams.submit(sl, "dp", start, (spec,)) for spec in work.post_optimizer]
        clock = start  # where the next step's forward would be
        for ev in done:
            if not ev.processed:
                yield ev
            clock = max(clock, self.env.now) + (work.first_forward * sl.factor + work.forward_stretch) / n
        sl.tally.end = max(start, clock - work.first_forward * sl.factor)
        self.run.span(sl, "compute", "next forward waits for parameters", start, sl.tally.end, "dp_comm")
