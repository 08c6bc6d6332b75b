"""The step driver: one process per slice runs the pipeline schedule's actions on the compute
stream, waits for the inputs other stages send, starts the gradient reductions, host copies and
parameter gathers its tasks make ready (on :mod:`~simdist.sim.engine.streams`), then does what
comes after the flush: compression kernels of a once-per-step sync, the gradient sync, the
optimizer, the CPU step of ZeRO-Offload, the parameter all-gather.

Synchronisation points, as in the frameworks: under ZeRO-2/3 a backward returns only when its
gradient reductions (and, with optimizer offload, their copies to the host) are done (DeepSpeed's
reduce epilogue, FSDP's post-backward callback); the optimizer waits for the whole gradient sync;
with Megatron's ``--overlap-param-gather`` the ZeRO-1 parameter all-gather only delays the next
step's first forward as far as it must. Offload: after the last gradient copy the node's CPU runs
the optimizer step while the updated parameters go up and the states swap with NVMe (pipelined
tile by tile, so they run together). Pipeline sends block the sender (Megatron's batched
isend/irecv is waited for before the next action). The steps after the flush are in
:mod:`.flush`.

Where a backend offers ``p2p_at`` (the fluid one: FluidNetwork.reserve), a plain action's
blocking send is asked for when its compute starts, to start when the compute ends: where its
links are free of other flows from then to its end, the send's completion is the action's one
kernel event (no timeout for the compute, no start, no wake-up of the network), the same
instants as the compute's timeout followed by the send; a flow that reaches its links first
turns it back into that. The receiver then never sees the send under way, only its arrival,
which gives the same wait (from its send's start, or from when it began waiting if later).
"""

from __future__ import annotations

from typing import Any

from simdist.analytic.passes import sync_wait_part
from simdist.sim import dualpipe, kernel
from simdist.sim.engine.flush import AfterFlush
from simdist.sim.engine.servers import Servers
from simdist.sim.engine.state import Proc, Run, Slice, Tally
from simdist.sim.engine.streams import Streams
from simdist.sim.schedules import Action
from simdist.sim.work import ChunkWork, CommSpec, GradPiece, StageWork, Task, Work

CATEGORY = {"F": "forward", "B": "backward", "W": "backward"}
TALLIED = ("compute", "recompute", "compression", "tp", "cp", "ep", "pp", "dp", "offload")  # summed per action


class StepDriver(AfterFlush):
    def __init__(self, run: Run, streams: Streams, servers: Servers):
        self.run, self.streams, self.servers = run, streams, servers
        self.env, self.plan, self.net = run.env, run.plan, run.network
        self.keep_spans = run.keep_spans
        self.sync_on_tp = sync_wait_part(run.plan) == "tp_comm"
        self.arrivals: dict[tuple[int, int, int, Action], kernel.Event] = {}  # waited for
        self.arrived: dict[tuple[int, int, int, Action], float] = {}  # sent before anyone waited
        self.sending: dict[tuple[int, int, int, Action], kernel.Event] = {}  # blocking sends under way

    def process(self, sl: Slice, work: StageWork) -> Proc:
        """The slice's process: one step, or (asynchronous parameter servers) cycles of them."""
        return self.worker(sl, work) if self.servers.async_mode else self._step(sl, work)

    def worker(self, sl: Slice, work: StageWork) -> Proc:
        """Asynchronous parameter servers: the slice's steps, one per cycle."""
        servers = self.servers
        if sl.replica and servers.stagger > 0:
            yield self.env.timeout(sl.replica * servers.stagger)
        for cycle in range(servers.target + 1):  # the run stops at the target-th update
            sl.cycle, sl.tally = cycle, Tally(start=self.env.now)
            yield from self._step(sl, work)
            sl.history.append(sl.tally)

    def _step(self, sl: Slice, work: StageWork) -> Proc:
        env, m, t, record = self.env, self.run.microbatches, sl.tally, sl.record
        # the hot loop (every action of the step): the common cases inline, with their state in locals
        keep, timeout, arrived, p2p = self.keep_spans, env.timeout, self.arrived, self.net.p2p
        ahead_of = getattr(self.net, "p2p_at", None)  # a send timed with its compute (backend's choice)
        cycle, replica, stage, factor = sl.cycle, sl.replica, sl.stage, sl.factor
        fwd, bwd = (stage + 1) % self.plan.pp, (stage - 1) % self.plan.pp
        blocking = not self.plan.dualpipe  # a blocking send to the next or previous stage
        sync_on_tp, arrivals, sending = self.sync_on_tp, self.arrivals, self.sending
        # (chunk, kind, last micro-batch?) -> the chunk, the task, the plain task's length, the send,
        # the send asked for ahead, with the compute before it (None: not so)
        looked_up: dict[tuple[int, str, bool], tuple[ChunkWork, Task, float | None, CommSpec | None, Any, tuple]] = {}
        # (the clock read as SimPy's step keeps it, env._now: the ``now`` property is a call per read)
        for action, deps in zip(work.actions, work.deps, strict=True):
            if record is not None:  # the clock and the tally's running sums (what periodic.extend compares)
                record.append((env._now, t.compute, t.recompute, t.compression, t.tp, t.cp, t.ep, t.pp, t.dp,
                               t.offload))
            if keep:  # the inputs
                yield from self._wait(sl, deps)
                deps = ()
            for dep_stage, dep in deps:  # (_wait's steps, inline)
                key = (cycle, replica, dep_stage, dep)
                if arrived.pop(key, None) is not None:
                    continue  # sent before: no wait
                ev = sending.pop(key, None)
                if ev is not None:  # its send under way (the whole wait exposed): resume with the sender
                    t0 = env.now
                    yield ev
                    t.pp += env.now - t0
                    continue
                ev = arrivals.get(key)
                if ev is None:
                    ev = arrivals[key] = kernel.Event(env)
                if ev.callbacks is not None:  # not processed yet
                    t0 = env._now
                    yield ev
                    t.pp += env._now - max(t0, ev._value)
            kind, mb, c = action
            what = (c, kind, mb == m - 1)
            found = looked_up.get(what)
            if found is None:
                chunk = work.chunks[c]
                task = chunk.task(kind, mb == m - 1)
                length = task.segments[0].total(factor) if task.plain and not keep else None
                spec = chunk.send_fwd if kind == "F" else chunk.send_bwd if kind == "B" else None
                ahead = None
                if spec is not None and length is not None and blocking and not chunk.send_async and ahead_of:
                    ahead = ahead_of(spec.nbytes, stage, fwd if kind == "F" else bwd, replica, spec.extra_s)
                seg = task.segments[0]  # (what _tally adds, for the plain task)
                counts = (seg.compute * factor, seg.recompute * factor, seg.compression * factor, seg.tp, seg.cp,
                          seg.sync)
                found = looked_up[what] = (chunk, task, length, spec, ahead, counts)
            chunk, task, length, spec, ahead, counts = found
            if length is not None:  # one stretch of compute: _task's steps, inline
                done = None
                if ahead is not None:  # its send asked for now, to start when the compute ends
                    start = env._now + length  # (the instant timeout(length) would resume at)
                    done = ahead(start)  # its end: one event for compute and send, where sure now
                if done is None:
                    yield timeout(length)
                else:
                    running = done.callbacks  # as for the blocking send below
                    yield done
                compute, recompute, compression, tp, cp, sync = counts  # self._tally(t, seg, factor)
                t.compute += compute
                t.recompute += recompute
                t.compression += compression
                t.tp += tp
                t.cp += cp
                if sync_on_tp:
                    t.tp += sync
                else:
                    t.dp += sync
                if done is not None:  # the send's end: as below, the receiver never saw it under way
                    t.pp += env._now - start
                    key = (cycle, replica, stage, action)
                    ev = arrivals.pop(key, None)
                    if ev is None:
                        arrived[key] = start
                    else:
                        kernel.resume_with(ev, start, running)
                    continue
            else:
                yield from self._task(sl, action, task)
            if spec is None:
                continue
            if chunk.send_async:
                self._send_async(sl, action, spec)
            elif blocking:  # _send's steps, inline
                start, key = env.now, (cycle, replica, stage, action)
                done = sending[key] = p2p(spec.nbytes, stage, fwd if kind == "F" else bwd, replica, spec.extra_s)
                running = done.callbacks  # the list its step will run (this process's resumption first)
                yield done
                t.pp += env.now - start
                if keep:
                    self.run.span(sl, "pp", spec.name, start, env.now, "pp_comm")
                if sending.pop(key, None) is None:
                    continue  # the receiver waited for the send itself, and resumes after this
                ev = arrivals.pop(key, None)  # self._arrive(*key, start), inline
                if ev is None:
                    arrived[key] = start
                else:  # waiting since before the send: it resumes right after this, as above
                    kernel.resume_with(ev, start, running)
            else:
                yield from self._send(sl, action, spec)
        if record is not None:
            record.append((env.now, t.compute, t.recompute, t.compression, t.tp, t.cp, t.ep, t.pp, t.dp, t.offload))
        t.flush_end = env.now
        if work.flush_compression:
            start = env.now
            yield env.timeout(work.flush_compression * sl.factor)
            self._post(sl, start, "compression", "compress gradients", "compute")
        for piece in work.flush:
            self._piece(sl, env.now, piece)
        yield from self._gradients_done(sl)
        if work.optimizer:
            start = env.now
            yield env.timeout(work.optimizer * sl.factor)
            self._post(sl, start, "optimizer", "optimizer", "compute")
        if work.host_step is not None:
            yield from self._host_step(sl, work.host_step)
        if work.host_after_optimizer is not None:
            start = env.now
            yield self.streams.host(sl, work.host_after_optimizer)
            self._post(sl, start, "offload", work.host_after_optimizer.name, "host")
        if work.post_hides_in_forward:
            yield from self._gather_behind_forward(sl, work)
            return
        if work.post_optimizer:
            start = env.now
            yield self.streams.submit(sl, "dp", env.now, work.post_optimizer)
            self._post(sl, start, "dp_comm")
        t.end = env.now

    def _wait(self, sl: Slice, deps: tuple[tuple[int, Action], ...]) -> Proc:
        """Wait for the inputs another stage sends; the part of the wait after the send
        started is exposed pipeline communication, the rest is bubble."""
        for stage, action in deps:
            key = (sl.cycle, sl.replica, stage, action)
            if self.arrived.pop(key, None) is not None:
                continue  # sent before: no wait
            ev = self._arrival(*key)
            if ev.processed:
                continue
            t0 = self.env.now
            yield ev
            now = self.env.now
            exposed = now - max(t0, ev.value)
            sl.tally.pp += exposed
            if self.keep_spans:
                what = f"{action.kind} mb{action.microbatch} chunk{action.chunk}"
                self.run.span(sl, "compute", "bubble", t0, now - exposed, "idle")
                self.run.span(sl, "pp", f"recv {what}", now - exposed, now, "pp_comm")

    def _arrival(self, cycle: int, replica: int, stage: int, action: Action) -> kernel.Event:
        key = (cycle, replica, stage, action)
        ev = self.arrivals.get(key)
        if ev is None:
            ev = self.arrivals[key] = self.env.event()
        return ev

    def _arrive(self, cycle: int, replica: int, stage: int, action: Action, sent: float) -> None:
        """An input has arrived (its send started at ``sent``): the stage waiting for it resumes;
        if none waits yet, the arrival is only noted (no event), and the stage that needs
        it later goes on at once, as it would past an event already processed."""
        key = (cycle, replica, stage, action)
        ev = self.arrivals.get(key)
        if ev is None:
            self.arrived[key] = sent
        else:
            ev.succeed(sent)

    def _task(self, sl: Slice, action: Action, task: Task) -> Proc:
        env, t = self.env, sl.tally
        flow = None
        if task.ep is not None:  # the task's expert all-to-all (simdist.sim.expert_flows)
            spec, t0 = task.ep, env.now
            flow = self.net.collective(spec.collective, spec.nbytes, spec.axis, sl.stage, (sl.replica,), spec.extra_s)
            if not task.ep_overlap:
                yield flow
                t.ep += env.now - t0
                self.run.span(sl, "ep", spec.name, t0, env.now, "ep_comm")
            else:
                flow.callbacks.append(lambda _e, t0=t0: self.run.span(sl, "ep", spec.name, t0, env.now, "ep_comm"))
        start = env.now
        ready: list[tuple[kernel.Event | None, kernel.Event | None]] = []  # per segment: upload, gather
        pieces, k = task.pieces, 0  # ordered by segment
        ahead = 2 if task.overlapped else 1
        for i, seg in enumerate(task.segments):
            if task.gathers:
                while len(ready) < min(i + ahead, len(task.gathers)):  # this layer's (and the next)
                    ready.append(self._prefetch(sl, task, len(ready)))
                up, gather = ready[i]
                if up is not None and not up.processed:
                    t0 = env.now
                    yield up
                    t.offload += env.now - t0
                if gather is not None and not gather.processed:
                    t0 = env.now
                    yield gather
                    t.dp += env.now - t0
            length = seg.total(sl.factor)
            while k < len(pieces) and pieces[k].segment == i:
                self._piece(sl, env.now + pieces[k].at * length, pieces[k])
                k += 1
            yield env.timeout(length)
            self._tally(t, seg, sl.factor)
            if not task.overlapped and pieces:
                yield from self._reduced(sl)
        if flow is not None and task.ep_overlap and not flow.processed:
            t0 = env.now
            yield flow
            t.ep += env.now - t0
        end = env.now
        if self.keep_spans:
            self._task_spans(sl, action, task, start, end)
        if task.drain:
            yield from self._drain(sl, end)

    def _tally(self, t: Tally, seg: Work, factor: float) -> None:
        """Count a segment of a task that ran on the compute stream."""
        t.compute += seg.compute * factor
        t.recompute += seg.recompute * factor
        t.compression += seg.compression * factor
        t.tp += seg.tp
        t.cp += seg.cp
        if self.sync_on_tp:
            t.tp += seg.sync
        else:
            t.dp += seg.sync

    def _reduced(self, sl: Slice) -> Proc:
        """Wait for the reductions started so far (a segment's gradients, not overlapped)."""
        tail = sl.tails.get("dp")
        if tail is not None and not tail.processed:
            t0 = self.env.now
            yield tail
            sl.tally.dp += self.env.now - t0
            self.run.span(sl, "compute", "wait for gradient reduce-scatter", t0, self.env.now, "dp_comm")

    def _drain(self, sl: Slice, end: float) -> Proc:
        """ZeRO-2/3: the backward returns when its reductions, then its copies to the host, are done."""
        env, t = self.env, sl.tally
        tail = sl.tails.get("dp")
        if tail is not None and not tail.processed:
            yield tail
            t.dp += env.now - end
            self.run.span(sl, "compute", "wait for gradient reduce-scatter", end, env.now, "dp_comm")
        tail, start = sl.tails.get("d2h"), env.now
        if tail is not None and not tail.processed:
            yield tail
            t.offload += env.now - start
            self.run.span(sl, "compute", "wait for gradient copy to host", start, env.now, "offload")

    def _prefetch(self, sl: Slice, task: Task, j: int) -> tuple[kernel.Event | None, kernel.Event | None]:
        """Segment ``j``'s parameters: the shard fetched from the host (parameter offload), then
        the all-gather that waits for it (ZeRO-3)."""
        now = self.env.now
        xfer = task.uploads[j] if task.uploads else None
        up = self.streams.submit(sl, "h2d", now, (xfer,)) if xfer is not None else None
        gathers = task.gathers[j]
        gather = self.streams.submit(sl, "gather", now, gathers, after=up) if gathers else None
        return up, gather

    def _piece(self, sl: Slice, ready: float, piece: GradPiece) -> None:
        """Start a gradient piece's sync at ``ready``, and its copy to the host after it."""
        done = self.streams.submit(sl, "dp", ready, piece.comms) if piece.comms else None
        if piece.down is not None:
            self.streams.submit(sl, "d2h", ready, (piece.down,), after=done)

    def _task_spans(self, sl: Slice, action: Action, task: Task, start: float, end: float) -> None:
        w = task.work
        name = f"{action.kind} mb{action.microbatch} chunk{action.chunk}"
        rec = w.recompute * sl.factor if len(task.segments) == 1 else 0.0
        if rec > 0:
            self.run.span(sl, "compute", f"R mb{action.microbatch} chunk{action.chunk}", start, start + rec, "recompute")
        self.run.span(sl, "compute", name, start + rec, end, CATEGORY[action.kind])
        if w.tp + w.cp > 0:
            part = "cp_comm" if w.cp > w.tp and self.plan.cp > 1 else "tp_comm"
            self.run.span(sl, "tp", task.tp_name or "tp", end - w.tp - w.cp - w.sync, end - w.sync, part)
        if w.sync > 0:
            stream, part = ("tp", "tp_comm") if self.sync_on_tp else ("dp", "dp_comm")
            self.run.span(sl, stream, "wait for the slowest rank", end - w.sync, end, part)
        if w.compression > 0:
            self.run.span(sl, "compute", "compress gradients", end - w.compression * sl.factor, end, "compression")

    def _send_async(self, sl: Slice, action: Action, spec: CommSpec) -> None:
        """A pipeline send that does not block the sender (isend, waited for by the receiver):
        the receiver's wait for it is the exposed part."""
        p = self.plan.pp
        dst = (sl.stage + (1 if action.kind == "F" else -1)) % p
        start = self.env.now
        done = self.net.p2p(spec.nbytes, sl.stage, dst, sl.replica, spec.extra_s)
        key = (sl.cycle, sl.replica, sl.stage, action)
        done.callbacks.append(lambda _ev: self._arrive(*key, start))
        if self.keep_spans:
            done.callbacks.append(lambda _ev: self.run.span(sl, "pp", spec.name, start, self.env.now, "pp_comm"))

    def _send(self, sl: Slice, action: Action, spec: CommSpec) -> Proc:
        """A blocking pipeline send to the stage that needs this action's output."""
        p = self.plan.pp
        if self.plan.dualpipe:  # the next stage's rank (itself at the tip of DualPipeV's V)
            dst = dualpipe.neighbour(self.plan.schedule, action, sl.stage, p, self.plan.num_microbatches)
            if dst == sl.stage:
                self._arrive(sl.cycle, sl.replica, sl.stage, action, self.env.now)
                return
        else:
            dst = (sl.stage + (1 if action.kind == "F" else -1)) % p
        start = self.env.now
        yield self.net.p2p(spec.nbytes, sl.stage, dst, sl.replica, spec.extra_s)
        sl.tally.pp += self.env.now - start
        if self.keep_spans:
            self.run.span(sl, "pp", spec.name, start, self.env.now, "pp_comm")
        self._arrive(sl.cycle, sl.replica, sl.stage, action, start)
