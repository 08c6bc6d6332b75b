"""A task on the compute stream, in the step driver (:mod:`.step`): its segments, the parameter
gathers and uploads each waits for (ZeRO-3, parameter offload), the gradient reductions and host
copies it starts, the expert all-to-all, and what it tallies and draws. The driver runs a plain
task (one segment and nothing else) inline; every other task comes here."""

from __future__ import annotations

from simdist.sim import kernel
from simdist.sim.engine.state import Proc, Run, Slice, Tally
from simdist.sim.engine.streams import Streams
from simdist.sim.network import NetworkBackend
from simdist.sim.schedules import Action
from simdist.sim.work import GradPiece, Task, Work
from simdist.spec.plan import ParallelPlan

CATEGORY = {"F": "forward", "B": "backward", "W": "backward"}


class TaskSteps:
    """The step driver's steps of one task (a base of :class:`.step.StepDriver`, whose state
    they use)."""

    run: Run
    env: kernel.Environment
    plan: ParallelPlan
    net: NetworkBackend
    streams: Streams
    keep_spans: bool
    sync_on_tp: bool

    def _task(self, sl: Slice, action: Action, task: Task) -> Proc:
        """Run ``task``, ``action``'s work, on the slice's compute stream."""
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
            if task.in_line and pieces:
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
        """Wait for the reductions started so far (a segment's gradients, in line: Task.in_line)."""
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
