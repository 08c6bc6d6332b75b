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
isend/irecv is waited for before the next action), but Megatron's overlapped ones and, on a CPU
whose cores all compute, torch's isends, the first of which leave when their stage next waits
for an input or the scheduler's tick lets them (:meth:`StepDriver._wake_lags`). A task's steps
are in :mod:`.tasks`, the steps after the flush in :mod:`.flush`.

The hot loop runs a plain action (one stretch of compute, no spans kept, not DualPipe) inline,
with the tally's running sums in locals; any other action takes the general steps,
with the sums on the tally. Arrivals are keyed by the sending action's code
(:mod:`simdist.sim.actions`), one set per step and replica.

Where a backend offers ``p2p_at`` (the fluid one: FluidNetwork.reserve), a plain action's
blocking send is asked for when its compute starts, to start when the compute ends: where its
links are free of other flows from then to its end, the send's completion is the action's one
kernel event (no timeout for the compute, no start, no wake-up of the network), the same
instants as the compute's timeout followed by the send; a flow that reaches its links first
turns it back into that. The receiver then never sees the send under way, only its arrival,
which gives the same wait (from its send's start, or from when it began waiting if later).
"""

from __future__ import annotations

from collections.abc import Callable

from simdist.analytic.profile_terms import sync_wait_part
from simdist.analytic.transport_wake import wake_lag_s
from simdist.sim import dualpipe, kernel
from simdist.sim.actions import chunks_per_stage, decode
from simdist.sim.engine.flush import AfterFlush
from simdist.sim.engine.servers import Servers
from simdist.sim.engine.state import Proc, Run, Slice, Tally
from simdist.sim.engine.streams import Streams
from simdist.sim.engine.tasks import TaskSteps
from simdist.sim.schedules import Action
from simdist.sim.work import ChunkWork, CommSpec, StageWork, Task

TALLIED = ("compute", "recompute", "compression", "tp", "cp", "ep", "pp", "dp", "offload")  # summed per action

# the arrivals of one step of one replica, keyed by the sending action's code (simdist.sim.actions):
# sent before anyone waited (when its send started), waited for (the event), blocking sends under way
Mail = tuple[dict[int, float], dict[int, kernel.Event], dict[int, kernel.Event]]
# what the step driver looks up once per task index: the chunk, the task, the length of a task run
# inline (None: not so), the send and its destination stage, the send asked for ahead with the
# compute before it (None: not so), and what the plain task adds to the tally
Found = tuple[ChunkWork, Task, float | None, CommSpec | None, int, Callable[[float], kernel.Event | None] | None,
              tuple[float, ...]]


class StepDriver(AfterFlush, TaskSteps):
    def __init__(self, run: Run, streams: Streams, servers: Servers):
        self.run, self.streams, self.servers = run, streams, servers
        self.env, self.plan, self.net = run.env, run.plan, run.network
        self.keep_spans = run.keep_spans
        self.sync_on_tp = sync_wait_part(run.plan) == "tp_comm"
        self.ahead_of = getattr(self.net, "p2p_at", None)  # a send timed with its compute (backend's choice)
        self.mail: dict[tuple[int, int], Mail] = {}  # (cycle, replica) -> its step's arrivals
        self.lags: dict[tuple[int, float], dict[int, float]] = {}  # (stage, compute factor) -> _wake_lags

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

    def _mail(self, sl: Slice) -> Mail:
        """The arrivals of the slice's step (its cycle) and replica."""
        mail = self.mail.get((sl.cycle, sl.replica))
        if mail is None:
            mail = self.mail[(sl.cycle, sl.replica)] = ({}, {}, {})
        return mail

    def _look_up(self, sl: Slice, work: StageWork, action: Action) -> Found:
        """What the hot loop needs of an action's task index, found from its first action."""
        kind, mb, c = action
        chunk = work.chunks[c]
        task = chunk.task(kind, mb == self.run.microbatches - 1)
        spec = chunk.send_fwd if kind == "F" else chunk.send_bwd if kind == "B" else None
        dst = (sl.stage + (1 if kind == "F" else -1)) % self.plan.pp
        inline = task.plain and not self.keep_spans and not self.plan.dualpipe
        length = task.segments[0].total(sl.factor) if inline else None
        ahead = None
        if spec is not None and inline and not chunk.send_async and self.ahead_of is not None:
            ahead = self.ahead_of(spec.nbytes, sl.stage, dst, sl.replica, spec.extra_s)
        seg, factor = task.segments[0], sl.factor  # (what _tally adds, for the plain task)
        counts = (seg.compute * factor, seg.recompute * factor, seg.compression * factor, seg.tp, seg.cp, seg.sync)
        return chunk, task, length, spec, dst, ahead, counts

    def _step(self, sl: Slice, work: StageWork) -> Proc:
        env, t, record = self.env, sl.tally, sl.record
        arrived, arrivals, sending = mail = self._mail(sl)
        # the hot loop (every action of the step): a plain action inline, with its state in locals
        timeout, p2p, kernel_event, resume_with = env.timeout, self.net.p2p, kernel.Event, kernel.resume_with
        replica, stage, sync_on_tp = sl.replica, sl.stage, self.sync_on_tp
        keep, dual = self.keep_spans, self.plan.dualpipe
        looked_up: list[Found | None] = [None] * (6 * len(work.chunks))  # by task index (simdist.sim.actions)
        # the tally's running sums in locals (an attribute costs more); the tally holds them
        # while any other action's steps run and after the loop
        compute, recompute, compression, tp, cp, ep, pp, dp, offload = \
            t.compute, t.recompute, t.compression, t.tp, t.cp, t.ep, t.pp, t.dp, t.offload
        # (the clock read as SimPy's step keeps it, env._now: the ``now`` property is a call per read)
        sched = work.schedule
        lags = self.lags.get((sl.stage, sl.factor))
        if lags is None:
            lags = self.lags[sl.stage, sl.factor] = self._wake_lags(sl, work)
        for action, index, mine, need in zip(sched.actions, sched.tasks, sched.codes, sched.inputs, strict=True):
            if record is not None:  # the clock and the tally's running sums (what periodic.extend compares)
                record.append((env._now, compute, recompute, compression, tp, cp, ep, pp, dp, offload))
            found = looked_up[index]
            if found is None:
                found = looked_up[index] = self._look_up(sl, work, action)
            chunk, task, length, spec, dst, ahead, counts = found
            if length is None:  # not run inline (spans kept, a task of more than one stretch of
                # compute, DualPipe's sends): every step, on the tally
                t.compute, t.recompute, t.compression, t.tp, t.cp, t.ep, t.pp, t.dp, t.offload = \
                    compute, recompute, compression, tp, cp, ep, pp, dp, offload
                if need >= 0:
                    yield from (self._wait if keep else self._input)(sl, need, mail)
                yield from self._task(sl, action, task)
                if spec is not None and chunk.send_async:
                    self._send_async(sl, spec, dst, mine, mail, lags.get(mine, 0.0))
                elif spec is not None:
                    yield from (self._send(sl, action, spec, mine, mail) if dual else
                                self._blocking(sl, spec, dst, mine, mail))
                compute, recompute, compression, tp, cp, ep, pp, dp, offload = \
                    t.compute, t.recompute, t.compression, t.tp, t.cp, t.ep, t.pp, t.dp, t.offload
                continue
            if need >= 0 and arrived.pop(need, None) is None:  # not sent before: wait (_input's steps, inline)
                ev = sending.pop(need, None)
                if ev is not None:  # its send under way (the whole wait exposed): resume with the sender
                    t0 = env._now
                    yield ev
                    pp += env._now - t0
                else:
                    ev = arrivals.get(need)
                    if ev is None:
                        ev = arrivals[need] = kernel_event(env)
                    if ev.callbacks is not None:  # not processed yet
                        t0 = env._now
                        yield ev
                        pp += env._now - max(t0, ev._value)
            # one stretch of compute (_task's steps, inline)
            done = None
            if ahead is not None:  # its send asked for now, to start when the compute ends
                start = env._now + length  # (the instant timeout(length) would resume at)
                done = ahead(start)  # its end: one event for compute and send, where sure now
            if done is None:
                yield timeout(length)
            else:
                running = done.callbacks  # as for the blocking send below
                yield done
            c_compute, c_recompute, c_compression, c_tp, c_cp, c_sync = counts  # self._tally(t, seg, factor)
            compute += c_compute
            recompute += c_recompute
            compression += c_compression
            tp += c_tp
            cp += c_cp
            if sync_on_tp:
                tp += c_sync
            else:
                dp += c_sync
            if done is not None:  # the send's end: as below, the receiver never saw it under way
                pp += env._now - start
                ev = arrivals.pop(mine, None)
                if ev is None:
                    arrived[mine] = start
                else:
                    resume_with(ev, start, running)
                continue
            if spec is None:
                continue
            if chunk.send_async:
                self._send_async(sl, spec, dst, mine, mail, lags.get(mine, 0.0))
                continue
            start = env._now  # a blocking send (_blocking's steps, inline)
            done = sending[mine] = p2p(spec.nbytes, stage, dst, replica, spec.extra_s)
            running = done.callbacks  # the list its step will run (this process's resumption first)
            yield done
            pp += env._now - start
            if sending.pop(mine, None) is None:
                continue  # the receiver waited for the send itself, and resumes after this
            ev = arrivals.pop(mine, None)  # self._arrive(mail, mine, start), inline
            if ev is None:
                arrived[mine] = start
            else:  # waiting since before the send: it resumes right after this, as above
                resume_with(ev, start, running)
        t.compute, t.recompute, t.compression, t.tp, t.cp, t.ep, t.pp, t.dp, t.offload = \
            compute, recompute, compression, tp, cp, ep, pp, dp, offload
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


    def _input(self, sl: Slice, need: int, mail: Mail) -> Proc:
        """Wait for the input another stage sends (its code): sent before, it goes on at once;
        its blocking send under way, it waits with its sender (the whole wait exposed); else
        until it arrives (exposed from its send's start)."""
        env, t = self.env, sl.tally
        arrived, _, sending = mail
        if arrived.pop(need, None) is not None:
            return
        ev = sending.pop(need, None)
        if ev is not None:
            t0 = env.now
            yield ev
            t.pp += env.now - t0
            return
        ev = self._arrival(mail, need)
        if ev.callbacks is not None:
            t0 = env.now
            yield ev
            t.pp += env.now - max(t0, ev.value)

    def _wait(self, sl: Slice, need: int, mail: Mail) -> Proc:
        """Wait for the input another stage sends (its code), drawn: the part of the wait after
        the send started is exposed pipeline communication, the rest is bubble."""
        if mail[0].pop(need, None) is not None:
            return  # sent before: no wait
        ev = self._arrival(mail, need)
        if ev.processed:
            return
        t0 = self.env.now
        yield ev
        now = self.env.now
        exposed = now - max(t0, ev.value)
        sl.tally.pp += exposed
        _, action = decode(need, self.plan.pp, chunks_per_stage(self.plan.virtual_pipeline_stages, self.plan.dualpipe))
        what = f"{action.kind} mb{action.microbatch} chunk{action.chunk}"
        self.run.span(sl, "compute", "bubble", t0, now - exposed, "idle")
        self.run.span(sl, "pp", f"recv {what}", now - exposed, now, "pp_comm")

    def _arrival(self, mail: Mail, key: int) -> kernel.Event:
        ev = mail[1].get(key)
        if ev is None:
            ev = mail[1][key] = self.env.event()
        return ev

    def _arrive(self, mail: Mail, key: int, sent: float) -> None:
        """An input has arrived (its send started at ``sent``): the stage waiting for it resumes;
        if none waits yet, the arrival is only noted (no event), and the stage that needs
        it later goes on at once, as it would past an event already processed."""
        ev = mail[1].get(key)
        if ev is None:
            mail[0][key] = sent
        else:
            ev.succeed(sent)

    def _blocking(self, sl: Slice, spec: CommSpec, dst: int, mine: int, mail: Mail) -> Proc:
        """A blocking pipeline send (it holds the sender until it is done) to stage ``dst``: a
        receiver that waits for it meanwhile resumes with the sender (:meth:`_input`)."""
        env = self.env
        arrived, arrivals, sending = mail
        start = env.now
        done = sending[mine] = self.net.p2p(spec.nbytes, sl.stage, dst, sl.replica, spec.extra_s)
        running = done.callbacks  # the list its step will run (this process's resumption first)
        yield done
        sl.tally.pp += env.now - start
        if self.keep_spans:
            self.run.span(sl, "pp", spec.name, start, env.now, "pp_comm")
        if sending.pop(mine, None) is None:
            return  # the receiver waited for the send itself, and resumes after this
        ev = arrivals.pop(mine, None)
        if ev is None:
            arrived[mine] = start
        else:  # waiting since before the send: it resumes right after this, as above
            kernel.resume_with(ev, start, running)

    def _send_async(self, sl: Slice, spec: CommSpec, dst: int, mine: int, mail: Mail, lag: float = 0.0) -> None:
        """A pipeline send to stage ``dst`` that does not block the sender (isend, waited for by
        the receiver), ``lag`` later than its transfer alone: the receiver's wait for it is the
        exposed part."""
        start = self.env.now
        done = self.net.p2p(spec.nbytes, sl.stage, dst, sl.replica, spec.extra_s + lag)
        done.callbacks.append(lambda _ev: self._arrive(mail, mine, start))
        if self.keep_spans:
            done.callbacks.append(lambda _ev: self.run.span(sl, "pp", spec.name, start, self.env.now, "pp_comm"))

    def _wake_lags(self, sl: Slice, work: StageWork) -> dict[int, float]:
        """What the first send of the step to each neighbour waits on a CPU whose cores all
        compute (simdist.analytic.transport_wake), by the sending action's code: the stage
        computes on after posting it, through the actions that need no other stage's input, and
        blocks at the next that does (or at the step's end). Later sends to the same neighbour
        left at once in the traces. Empty where the sends do not wait so (no tick)."""
        tick = work.wake_tick_s
        if tick <= 0:
            return {}
        sched, m, p = work.schedule, self.run.microbatches, self.plan.pp
        after, busy = [0.0] * len(sched.actions), 0.0  # the compute after each action until a wait
        for i in range(len(sched.actions) - 1, -1, -1):
            after[i] = busy
            kind, mb, c = sched.actions[i]
            length = work.chunks[c].task(kind, mb == m - 1).work.total(sl.factor)
            busy = 0.0 if sched.inputs[i] >= 0 else length + busy
        lags: dict[int, float] = {}
        sent_to: set[int] = set()
        for i, (kind, _mb, c) in enumerate(sched.actions):
            chunk = work.chunks[c]
            if (chunk.send_fwd if kind == "F" else chunk.send_bwd if kind == "B" else None) is None:
                continue
            dst = (sl.stage + (1 if kind == "F" else -1)) % p
            if dst not in sent_to:
                sent_to.add(dst)
                lags[sched.codes[i]] = wake_lag_s(after[i], tick)
        return lags

    def _send(self, sl: Slice, action: Action, spec: CommSpec, mine: int, mail: Mail) -> Proc:
        """A DualPipe pipeline send (blocking) to the stage that needs this action's output."""
        p = self.plan.pp
        dst = dualpipe.neighbour(self.plan.schedule, action, sl.stage, p, self.plan.num_microbatches)
        if dst == sl.stage:  # the next stage's rank is itself, at the tip of DualPipeV's V
            self._arrive(mail, mine, self.env.now)
            return
        start = self.env.now
        yield self.net.p2p(spec.nbytes, sl.stage, dst, sl.replica, spec.extra_s)
        sl.tally.pp += self.env.now - start
        if self.keep_spans:
            self.run.span(sl, "pp", spec.name, start, self.env.now, "pp_comm")
        self._arrive(mail, mine, start)
