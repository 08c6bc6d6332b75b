"""The discrete-event engine (simpy): every simulated rank's compute and communication streams
over the cluster's links, for one optimizer step.

A *slice* is the tensor- and context-parallel group of one pipeline stage of one data-parallel
replica: its ranks run the same kernels in lock-step (TP/CP collectives inside every layer
synchronise them), so one simpy process drives its compute stream. Symmetric fidelity simulates
one slice per stage (replica 0; the other replicas do the same work at the same time, and their
load on shared links is counted by :class:`simdist.sim.network.LinkModel`); full fidelity
simulates every replica, so stragglers and slow nodes delay the collectives that wait for them.

Per slice, streams as in Megatron-LM / PyTorch / DeepSpeed: ``compute`` (the pipeline schedule's
actions from :mod:`simdist.sim.schedules`, compression kernels, the optimizer), ``pp`` (blocking
sends: Megatron's batched isend/irecv is waited for before the next action), ``dp`` (gradient
reductions or parameter-server pushes, FIFO, one NCCL stream), ``gather`` (ZeRO-3 parameter
all-gathers, FIFO, prefetched one layer ahead), ``h2d`` and ``d2h`` (offload copies over PCIe on
the copy engines), ``pull`` (parameter-server pulls); the node's CPU and NVMe are shared
resources of the fluid network (:class:`simdist.sim.network.FluidNetwork`).

Synchronisation points, as in the frameworks: under ZeRO-2/3 a backward returns only when its
gradient reductions (and, with optimizer offload, their copies to the host) are done (DeepSpeed's
reduce epilogue, FSDP's post-backward callback); the optimizer waits for the whole gradient sync;
with Megatron's ``--overlap-param-gather`` the ZeRO-1 parameter all-gather only delays the next
step's first forward as far as it must. Offload: after the last gradient copy the node's CPU runs
the optimizer step while the updated parameters go up and the states swap with NVMe (pipelined
tile by tile, so they run together). Parameter servers: each bucket is pushed as backward fills
it, updated on the servers' CPUs once every worker pushed it (synchronous) or at once
(asynchronous), then pulled; the step waits for the last pull.

Asynchronous parameter servers have no step barrier, so they always run in full fidelity for
several cycles: each replica starts 1/dp of a cycle after the previous one (the steady state of
free-running workers, which drift apart) and goes on at its own pace; the step time is the
time between dp updates in the steady state, and the staleness of each update (updates by other
workers between a worker's pull and its push) is counted from the simulated order.

Breakdown (the parts sum to the step time exactly): up to the pipeline flush (the last compute
action of any slice), the busiest slice's compute, recompute, compression kernels, exposed TP/CP,
pipeline sends and the exposed part of waits for a transfer in flight, waits for ZeRO-3
parameters (dp) and for parameter uploads and gradient copies (offload), and the rest of its idle
time as bubble; after the flush, what the critical (last finishing) slice waited for, by kind:
the optimizer (GPU, host CPU or the servers' update), offload copies, compression kernels, and
everything else (gradient sync, pushes and pulls, parameter all-gathers) as data-parallel
communication. In the asynchronous mode the same parts are the mean over the measured cycles,
scaled to the step time.

Where this engine and the closed form (:mod:`simdist.analytic.steptime`) differ by mechanism,
not only by link contention the closed form does not see:

- asynchronous parameter servers: the closed form takes the larger of a worker's own cycle (its
  push and pull at its share of the NIC) and the busiest NIC's traffic per cycle; here a worker's
  push shares its node's NIC with the replies its node's server sends to the other workers at
  the same time, so the two partly add (4 workers on 25 GbE: +14%, 16: +23%);
- parameter servers with coarse buckets: the last bucket is pulled only after its push and its
  update, a drain the closed form's bucket formula leaves out (ps1 on 25 GbE: +0.5% with 25 MiB
  buckets, +5% with 256 MiB);
- ZeRO-3/FSDP parameter offload with the optimizer on the GPU: the updated shard goes back to the
  host after the optimizer (exposed here; the closed form overlaps it with backward);
- offload with several pipeline stages on one node: the node's CPU is shared by stages whose
  shards differ and whose last backward ends at different times; the closed form charges every
  GPU of the node the busiest stage's shard at once (this engine is lower);
- ZeRO-0/1 optimizer offload with dp > 1: each bucket's copy to the host follows its reduction
  and overlaps the next one; the closed form adds the two.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import simpy

from simdist.analytic import systems
from simdist.analytic.collectives import Network
from simdist.analytic.cost import CostModel
from simdist.analytic.steptime import sync_wait_part
from simdist.results import Span
from simdist.sim.lowering import (
    CommSpec,
    GradPiece,
    HostXfer,
    Lowered,
    PsSpec,
    StageWork,
    Task,
    lower,
)
from simdist.sim.network import FluidNetwork, LinkModel
from simdist.sim.schedules import Action
from simdist.spec.plan import RankCoord, rank_of
from simdist.spec.scenario import Scenario

Proc = Generator[simpy.Event, Any, Any]
FIDELITIES = ("symmetric", "full")
CATEGORY = {"F": "forward", "B": "backward", "W": "backward"}
ASYNC_CYCLES = 6  # simulated steps' worth of updates in the asynchronous mode (1 warm-up)
PRE_FLUSH = ("compute", "recompute", "compression", "tp", "pp", "dp", "offload")
BREAKDOWN_NAME = {"tp": "tp_comm", "pp": "pp_comm", "dp": "dp_comm"}


@dataclass(frozen=True)
class SimResult:
    step_time: float
    breakdown: dict[str, float]
    bubble_fraction: float
    spans: tuple[Span, ...]
    assumptions: list[str]
    events: int = 0  # simpy events processed
    busiest_stage: int = 0
    extras: dict[str, Any] = field(default_factory=dict)  # staleness, bottleneck, offload, stragglers


def events_scheduled(env: simpy.Environment) -> int:
    """Events the environment has scheduled so far (simpy numbers them with ``_eid``)."""
    counter = getattr(env, "_eid", None)
    return next(counter) if counter is not None else 0


@dataclass
class Tally:
    """What one slice's compute stream did in one step (one cycle, asynchronously), in seconds."""

    compute: float = 0.0
    recompute: float = 0.0
    compression: float = 0.0
    tp: float = 0.0
    pp: float = 0.0  # blocking sends + the exposed part of waits for a transfer
    dp: float = 0.0  # waits for ZeRO-3 parameters and gradient reductions before the flush
    offload: float = 0.0  # waits for parameter uploads and gradient copies before the flush
    start: float = 0.0
    flush_end: float = 0.0
    end: float = 0.0
    post: list[tuple[float, float, str]] = field(default_factory=list)  # after the flush: waits, work

    @property
    def busy(self) -> float:
        return self.compute + self.recompute + self.compression + self.tp + self.pp

    @property
    def work(self) -> float:
        """GPU work a slower GPU stretches (what a straggler factor multiplies)."""
        return self.compute + self.recompute + self.compression


@dataclass
class Slice:
    replica: int
    stage: int
    ranks: tuple[int, ...]  # ranks that get spans (the representative, or the whole slice)
    factor: float  # compute slow-down (the slowest rank of the slice)
    tally: Tally = field(default_factory=Tally)
    tails: dict[str, simpy.Event] = field(default_factory=dict)  # stream -> last submitted item
    seq: dict[str, int] = field(default_factory=dict)  # stream -> items submitted
    cycle: int = 0
    history: list[Tally] = field(default_factory=list)  # finished cycles (asynchronous mode)
    version: int = 0  # parameter version of its last pull (asynchronous mode)


@dataclass(frozen=True, slots=True)
class _Pull:
    """The pull that follows a parameter-server push, once the servers applied it."""

    spec: PsSpec


def simulate(
    scenario: Scenario,
    cost: CostModel,
    net: Network,
    fidelity: str = "symmetric",
    keep_spans: bool = True,
    stragglers: dict[int, float] | None = None,
) -> SimResult:
    """Simulate one optimizer step of ``scenario``.

    ``stragglers`` maps a rank to a compute slow-down factor (a negative key -(node+1) slows a
    whole node); they need full fidelity, which is used when any is given, and the result then
    also says how the plan absorbs them (a uniform run for comparison; ``extras["stragglers"]``).
    Asynchronous parameter servers always run in full fidelity.
    """
    if fidelity not in FIDELITIES:
        raise ValueError(f"fidelity must be one of {FIDELITIES}, got {fidelity!r}")
    notes: list[str] = []
    stragglers = {k: v for k, v in (stragglers or {}).items() if v != 1.0}
    if stragglers and fidelity == "symmetric":
        fidelity = "full"
        notes.append("stragglers given: full fidelity used")
    if scenario.plan.async_parameter_servers and fidelity == "symmetric":
        fidelity = "full"
        notes.append("asynchronous parameter servers: full fidelity used (each worker runs at its own pace)")
    lowered = lower(scenario, cost, net)
    stagger = _async_stagger(scenario, cost, net)
    sim = _Simulation(scenario, lowered, net, fidelity, keep_spans, stragglers, notes, stagger)
    result = sim.run()
    if stragglers:
        uniform = _Simulation(scenario, lowered, net, fidelity, False, {}, [], stagger)
        base = uniform.run()
        summary, line = straggler_summary(scenario, sim, result, uniform, base)
        result.extras["stragglers"] = summary
        result.assumptions.append(line)
    return result


def _async_stagger(sc: Scenario, cost: CostModel, net: Network) -> float:
    """Start offset between consecutive replicas in the asynchronous mode: the closed form's
    cycle over dp, so that the pushes are spread evenly over a cycle from the start."""
    if sc.plan.gradient_sync != "async-parameter-server":
        return 0.0
    from simdist.analytic.steptime import analytic_step

    return analytic_step(sc, cost, net).step_time / sc.plan.dp


class _Simulation:
    def __init__(self, sc: Scenario, lowered: Lowered, net: Network, fidelity: str,
                 keep_spans: bool, stragglers: dict[int, float], notes: list[str], stagger: float = 0.0):
        self.sc, self.plan, self.lowered = sc, sc.plan, lowered
        self.sync_on_tp = sync_wait_part(sc.plan) == "tp_comm"
        self.full = fidelity == "full"
        self.keep_spans, self.notes = keep_spans, notes
        self.env = simpy.Environment()
        self.links = LinkModel(sc, net, replicas_alike=not self.full)
        plan = self.plan
        self.ps = plan.uses_parameter_servers
        self.async_ps = plan.async_parameter_servers
        self.fluid = FluidNetwork(self.env, track=self.ps or plan.offload.any)
        self.arrivals: dict[tuple[int, int, int, Action], simpy.Event] = {}
        self.meetings: dict[tuple, list] = {}
        self.update_began: dict[simpy.Event, float] = {}  # synchronous servers: when each update started
        self.spans: list[tuple] = []
        replicas = range(plan.dp) if self.full else range(1)
        self.stragglers = stragglers
        self.slices = [self._slice(d, s, stragglers) for d in replicas for s in range(plan.pp)]
        # asynchronous parameter servers: updates of the first stage's parameters, in order
        self.stagger = stagger
        self.updates = 0
        self.update_log: list[tuple[float, int, int, int]] = []  # (time, replica, staleness, cycle)
        self.target = ASYNC_CYCLES * plan.dp
        self.window: list[float] = []  # times of the dp-th and the target-th update
        self.stop = self.env.event()

    def _slice(self, replica: int, stage: int, stragglers: dict[int, float]) -> Slice:
        plan, gpn = self.plan, self.sc.cluster.gpus_per_node
        ranks = tuple(rank_of(RankCoord(replica, stage, c, t), plan)
                      for c in range(plan.cp) for t in range(plan.tp))
        factor = max(max(stragglers.get(r, 1.0), stragglers.get(-(r // gpn) - 1, 1.0)) for r in ranks)
        return Slice(replica, stage, ranks if self.full else ranks[:1], factor)

    # --- running ---

    def run(self) -> SimResult:
        for sl in self.slices:
            self.env.process(self._worker(sl, self.lowered.stages[sl.stage]))
        if self.async_ps:
            self.env.run(until=self.stop)
            return self._async_result()
        self.env.run()
        return self._result()

    def _worker(self, sl: Slice, work: StageWork) -> Proc:
        if not self.async_ps:
            yield from self._step(sl, work)
            return
        if sl.replica and self.stagger > 0:
            yield self.env.timeout(sl.replica * self.stagger)
        for cycle in range(self.target + 1):  # the run stops at the target-th update
            sl.cycle, sl.tally = cycle, Tally(start=self.env.now)
            yield from self._step(sl, work)
            sl.history.append(sl.tally)

    def _step(self, sl: Slice, work: StageWork) -> Proc:
        env, m, t = self.env, self.plan.num_microbatches, sl.tally
        for action, deps in zip(work.actions, work.deps, strict=True):
            yield from self._wait(sl, deps)
            chunk = work.chunks[action.chunk]
            yield from self._task(sl, action, chunk.task(action.kind, action.microbatch == m - 1))
            spec = chunk.send_fwd if action.kind == "F" else chunk.send_bwd if action.kind == "B" else None
            if spec is not None:
                yield from self._send(sl, action, spec)
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
            yield self._host(sl, work.host_after_optimizer)
            self._post(sl, start, "offload", work.host_after_optimizer.name, "host")
        if work.post_hides_in_forward:
            yield from self._gather_behind_forward(sl, work)
            return
        if work.post_optimizer:
            start = env.now
            yield self._submit(sl, "dp", env.now, work.post_optimizer)
            self._post(sl, start, "dp_comm")
        t.end = env.now

    def _post(self, sl: Slice, start: float, category: str, name: str = "", stream: str = "",
              end: float | None = None) -> None:
        """Record what the slice did or waited for after the flush, from ``start`` to now."""
        now = self.env.now if end is None else end
        if now > start:
            sl.tally.post.append((start, now, category))
            if name:
                self._span(sl, stream, name, start, now, category)

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
                    began = max(start, self.update_began.get(ev, start))
                    self._post(sl, start, "dp_comm", end=began)
                    start = began
                self._post(sl, start, category)
            if stream == "update" and self.async_ps and sl.stage == 0:
                self._applied(sl)

    def _applied(self, sl: Slice) -> None:
        """Asynchronous mode: the worker's push is applied; it reads the new version (its pull)."""
        now = self.env.now
        self.update_log.append((now, sl.replica, self.updates - sl.version, sl.cycle))
        self.updates += 1
        sl.version = self.updates
        if self.updates in (self.plan.dp, self.target):
            self.window.append(now)
        if self.updates >= self.target and not self.stop.triggered:
            self.stop.succeed()

    def _host_step(self, sl: Slice, xfer: HostXfer) -> Proc:
        """ZeRO-Offload's step: the node's CPU updates the states while the updated parameters go
        up and the states swap with NVMe (DeepSpeed pipelines them tile by tile): the CPU part
        is optimizer time, what outlasts it offload."""
        env = self.env
        start = env.now
        events = {r: self._flow(sl, r, s) for r, s in xfer.parts}
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
        done = [self._submit(sl, "dp", start, (spec,)) for spec in work.post_optimizer]
        clock = start  # where the next step's forward would be
        for ev in done:
            if not ev.processed:
                yield ev
            clock = max(clock, self.env.now) + work.first_forward * sl.factor / n
        sl.tally.end = max(start, clock - work.first_forward * sl.factor)
        self._span(sl, "compute", "next forward waits for parameters", start, sl.tally.end, "dp_comm")

    def _wait(self, sl: Slice, deps: tuple[tuple[int, Action], ...]) -> Proc:
        """Wait for the inputs another stage sends; the part of the wait after the send
        started is exposed pipeline communication, the rest is bubble."""
        for stage, action in deps:
            ev = self._arrival(sl.cycle, sl.replica, stage, action)
            if ev.processed:
                continue
            t0 = self.env.now
            yield ev
            now = self.env.now
            exposed = now - max(t0, ev.value)
            sl.tally.pp += exposed
            what = f"{action.kind} mb{action.microbatch} chunk{action.chunk}"
            self._span(sl, "compute", "bubble", t0, now - exposed, "idle")
            self._span(sl, "pp", f"recv {what}", now - exposed, now, "pp_comm")

    def _arrival(self, cycle: int, replica: int, stage: int, action: Action) -> simpy.Event:
        key = (cycle, replica, stage, action)
        ev = self.arrivals.get(key)
        if ev is None:
            ev = self.arrivals[key] = self.env.event()
        return ev

    def _task(self, sl: Slice, action: Action, task: Task) -> Proc:
        env, t = self.env, sl.tally
        start = env.now
        ready: list[tuple[simpy.Event | None, simpy.Event | None]] = []  # per segment: upload, gather
        pieces, k = task.pieces, 0  # ordered by segment
        for i, seg in enumerate(task.segments):
            if task.gathers:
                while len(ready) < min(i + 2, len(task.gathers)):  # this layer's and the next
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
            t.compute += seg.compute * sl.factor
            t.recompute += seg.recompute * sl.factor
            t.compression += seg.compression * sl.factor
            t.tp += seg.tp
            if self.sync_on_tp:
                t.tp += seg.sync
            else:
                t.dp += seg.sync
        end = env.now
        if self.keep_spans:
            self._task_spans(sl, action, task, start, end)
        if task.drain:
            yield from self._drain(sl, end)

    def _drain(self, sl: Slice, end: float) -> Proc:
        """ZeRO-2/3: the backward returns when its reductions, then its copies to the host, are done."""
        env, t = self.env, sl.tally
        tail = sl.tails.get("dp")
        if tail is not None and not tail.processed:
            yield tail
            t.dp += env.now - end
            self._span(sl, "compute", "wait for gradient reduce-scatter", end, env.now, "dp_comm")
        tail, start = sl.tails.get("d2h"), env.now
        if tail is not None and not tail.processed:
            yield tail
            t.offload += env.now - start
            self._span(sl, "compute", "wait for gradient copy to host", start, env.now, "offload")

    def _prefetch(self, sl: Slice, task: Task, j: int) -> tuple[simpy.Event | None, simpy.Event | None]:
        """Segment ``j``'s parameters: the shard fetched from the host (parameter offload), then
        the all-gather that waits for it (ZeRO-3)."""
        now = self.env.now
        xfer = task.uploads[j] if task.uploads else None
        up = self._submit(sl, "h2d", now, (xfer,)) if xfer is not None else None
        gathers = task.gathers[j]
        gather = self._submit(sl, "gather", now, gathers, after=up) if gathers else None
        return up, gather

    def _piece(self, sl: Slice, ready: float, piece: GradPiece) -> None:
        """Start a gradient piece's sync at ``ready``, and its copy to the host after it."""
        done = self._submit(sl, "dp", ready, piece.comms) if piece.comms else None
        if piece.down is not None:
            self._submit(sl, "d2h", ready, (piece.down,), after=done)

    def _task_spans(self, sl: Slice, action: Action, task: Task, start: float, end: float) -> None:
        w = task.work
        name = f"{action.kind} mb{action.microbatch} chunk{action.chunk}"
        rec = w.recompute * sl.factor if len(task.segments) == 1 else 0.0
        if rec > 0:
            self._span(sl, "compute", f"R mb{action.microbatch} chunk{action.chunk}", start, start + rec, "recompute")
        self._span(sl, "compute", name, start + rec, end, CATEGORY[action.kind])
        if w.tp > 0:
            self._span(sl, "tp", task.tp_name or "tp", end - w.tp - w.sync, end - w.sync, "tp_comm")
        if w.sync > 0:
            stream, part = ("tp", "tp_comm") if self.sync_on_tp else ("dp", "dp_comm")
            self._span(sl, stream, "wait for the slowest rank", end - w.sync, end, part)
        if w.compression > 0:
            self._span(sl, "compute", "compress gradients", end - w.compression * sl.factor, end, "compression")

    def _send(self, sl: Slice, action: Action, spec: CommSpec) -> Proc:
        """A blocking pipeline send to the stage that needs this action's output."""
        p = self.plan.pp
        step = 1 if action.kind == "F" else -1
        dst = (sl.stage + step) % p
        start = self.env.now
        timing = self.links.p2p(spec.nbytes, sl.stage, dst, sl.replica)
        yield self.fluid.transfer(timing.work, timing.loads, timing.latency + spec.extra_s)
        sl.tally.pp += self.env.now - start
        self._span(sl, "pp", spec.name, start, self.env.now, "pp_comm")
        self._arrival(sl.cycle, sl.replica, sl.stage, action).succeed(start)

    # --- streams, collectives, host transfers, parameter servers ---

    def _submit(self, sl: Slice, stream: str, ready: float, items: tuple, after: simpy.Event | None = None,
                ) -> simpy.Event:
        """Queue ``items`` on a FIFO stream of the slice, to start no earlier than ``ready`` and
        not before ``after``."""
        prev = sl.tails.get(stream)
        seq = sl.seq.get(stream, 0)
        sl.seq[stream] = seq + 1
        proc = self.env.process(self._stream_item(sl, stream, seq, prev, ready, items, after))
        sl.tails[stream] = proc
        return proc

    def _stream_item(self, sl: Slice, stream: str, seq: int, prev: simpy.Event | None,
                     ready: float, items: tuple, after: simpy.Event | None) -> Proc:
        env = self.env
        if prev is not None and not prev.processed:
            yield prev
        if after is not None and not after.processed:
            yield after
        if ready > env.now:
            yield env.timeout(ready - env.now)
        for i, spec in enumerate(items):
            start = env.now
            if type(spec) is CommSpec:
                yield self._collective(sl, spec, (stream, seq, i))
                self._span(sl, stream, spec.name, start, env.now, "dp_comm")
            elif type(spec) is HostXfer:
                yield self._host(sl, spec)
                self._span(sl, stream, spec.name, start, env.now, "offload")
            elif type(spec) is PsSpec:
                timing = self.links.ps("push", spec.nbytes, sl.stage, (sl.replica,))
                yield self.fluid.transfer(timing.work, timing.loads, timing.latency)
                self._span(sl, stream, "push " + spec.name.removeprefix("push+pull "), start, env.now, "dp_comm")
                self._pushed(sl, spec)
            else:  # _Pull
                timing = self.links.ps("pull", spec.spec.nbytes, sl.stage, (sl.replica,))
                yield self.fluid.transfer(timing.work, timing.loads, timing.latency)
                self._span(sl, stream, "pull " + spec.spec.name.removeprefix("push+pull "), start, env.now,
                           "dp_comm")

    def _pushed(self, sl: Slice, spec: PsSpec) -> None:
        """After a push: the servers apply the bucket (synchronously once every replica pushed
        it; asynchronously at once), then the slice pulls it."""
        if self.async_ps or not self.full:
            update = self._update(sl, spec)
        else:
            key = (sl.stage, spec.key)
            meet = self.meetings.get(key)
            if meet is None:
                meet = self.meetings[key] = [0, self.env.event()]
            meet[0] += 1
            if meet[0] == len(self._group(sl.replica, "dp")):
                done: simpy.Event = meet[1]
                self.update_began[done] = self.env.now
                self._update(sl, spec).callbacks.append(lambda _e: done.succeed())
            update = meet[1]
        sl.tails["update"] = update
        self._submit(sl, "pull", self.env.now, (_Pull(spec),), after=update)

    def _update(self, sl: Slice, spec: PsSpec) -> simpy.Event:
        timing = self.links.ps_update(spec.update_s)
        start = self.env.now
        flow = self.fluid.transfer(timing.work, timing.loads)
        if self.keep_spans and spec.update_s > 0:
            flow.callbacks.append(lambda _e: self._span(sl, "ps", "server update", start, self.env.now, "optimizer"))
        return flow

    def _flow(self, sl: Slice, resource: str, seconds: float) -> simpy.Event:
        timing = self.links.host(resource, seconds, sl.stage, sl.replica)
        return self.fluid.transfer(timing.work, timing.loads)

    def _host(self, sl: Slice, xfer: HostXfer) -> simpy.Event:
        """All parts of a host transfer at once; done when the last is."""
        events = [self._flow(sl, r, s) for r, s in xfer.parts]
        return events[0] if len(events) == 1 else simpy.AllOf(self.env, events)

    def _collective(self, sl: Slice, spec: CommSpec, key: tuple) -> simpy.Event:
        """A DP-family collective: it starts when every simulated member slice has reached it."""
        group = self._group(sl.replica, spec.axis)
        meet = self.meetings.get((sl.stage, spec.axis, group, key))
        if meet is None:
            meet = self.meetings[(sl.stage, spec.axis, group, key)] = [0, self.env.event()]
        meet[0] += 1
        if meet[0] == len(group):
            timing = self.links.collective(spec.collective, spec.nbytes, spec.axis, sl.stage, group)
            done: simpy.Event = meet[1]
            flow = self.fluid.transfer(timing.work, timing.loads, timing.latency + spec.extra_s)
            flow.callbacks.append(lambda _e: done.succeed())
        return meet[1]

    def _group(self, replica: int, axis: str) -> tuple[int, ...]:
        """Simulated replicas in ``replica``'s group along a data-parallel axis."""
        if not self.full:
            return (0,)
        plan = self.plan
        if axis == "dp_shard":
            base = replica // plan.dp_shard * plan.dp_shard
            return tuple(range(base, base + plan.dp_shard))
        if axis == "dp_replica":
            return tuple(range(replica % plan.dp_shard, plan.dp, plan.dp_shard))
        return tuple(range(plan.dp))

    # --- results ---

    def _span(self, sl: Slice, stream: str, name: str, start: float, end: float, category: str) -> None:
        if self.keep_spans and end > start:
            for r in sl.ranks:
                self.spans.append((r, stream, name, start, end, category))

    def _keys(self) -> tuple[str, ...]:
        keys = ("compute", "recompute", "tp_comm", "pp_comm", "dp_comm", "bubble", "optimizer")
        if self.plan.offload.any:
            keys += ("offload",)
        if self.plan.grad_compression.enabled:
            keys += ("compression",)
        return keys

    def _parts(self, t: Tally) -> dict[str, float]:
        return {BREAKDOWN_NAME.get(k, k): getattr(t, k) for k in PRE_FLUSH}

    def _result(self) -> SimResult:
        tallies = [sl.tally for sl in self.slices]
        step = max(t.end for t in tallies)
        flush = max(t.flush_end for t in tallies)
        busiest = max(range(len(self.slices)), key=lambda i: tallies[i].busy)
        parts = self._parts(tallies[busiest])
        parts["bubble"] = max(0.0, flush - sum(parts.values()))
        crit = next(t for t in tallies if t.end == step)
        after = 0.0
        for start, end, category in crit.post:
            d = max(0.0, min(end, step) - max(start, flush))
            if d > 0 and category != "dp_comm":
                parts[category] = parts.get(category, 0.0) + d
                after += d
        parts["dp_comm"] += max(0.0, step - flush - after)  # syncs, pushes, pulls, gathers
        return self._finish(step, parts, self.slices[busiest].stage, {})

    def _async_result(self) -> SimResult:
        """Steady state of the asynchronous mode: the time between the dp-th and the last
        counted update over the steps they make up; the parts are the busiest stage's mean
        cycle, scaled to that step time."""
        plan = self.plan
        step = (self.window[1] - self.window[0]) / (ASYNC_CYCLES - 1)
        by_stage: dict[int, list[Tally]] = {}
        for sl in self.slices:
            by_stage.setdefault(sl.stage, []).extend(sl.history[1:] or sl.history)
        stage = max(by_stage, key=lambda s: sum(t.busy for t in by_stage[s]) / max(1, len(by_stage[s])))
        cycles = by_stage[stage]
        mean: dict[str, float] = dict.fromkeys(self._keys(), 0.0)
        length = 0.0
        for t in cycles:
            for k, v in self._parts(t).items():
                mean[k] = mean.get(k, 0.0) + v / len(cycles)
            for start, end, category in t.post:
                mean[category] = mean.get(category, 0.0) + (end - start) / len(cycles)
            length += (t.end - t.start) / len(cycles)
        mean["bubble"] = max(0.0, length - sum(v for k, v in mean.items() if k != "bubble"))
        scale = step / length if length > 0 else 1.0
        parts = {k: v * scale for k, v in mean.items()}
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
                "closed_form_steps": systems.async_staleness_steps(plan),
                "updates_simulated": len(self.update_log),
                "per_worker_mean_steps": {str(r): sum(v) / len(v) for r, v in sorted(by_worker.items())},
            },
        }
        self.notes.append(f"asynchronous parameter servers: {len(self.update_log)} updates simulated "
                          f"({ASYNC_CYCLES} per worker, the first cycle as warm-up), replicas started "
                          f"{self.stagger:.3g} s apart; mean staleness {extras['staleness_steps']:.2f} updates "
                          f"(closed form {systems.async_staleness_steps(plan):.0f})")
        return self._finish(step, parts, stage, extras)

    def _finish(self, step: float, parts: dict[str, float], stage: int, extras: dict[str, Any]) -> SimResult:
        breakdown = {k: parts.get(k, 0.0) for k in self._keys()}
        extras.update(self._link_extras(step))
        spans = tuple(Span(*s) for s in sorted(self.spans, key=lambda s: (s[0], s[3], s[1])))
        return SimResult(
            step_time=step,
            breakdown=breakdown,
            bubble_fraction=breakdown["bubble"] / step if step > 0 and self.plan.pp > 1 else 0.0,
            spans=spans,
            assumptions=self._assumptions(),
            events=events_scheduled(self.env),
            busiest_stage=stage,
            extras=extras,
        )

    def _link_extras(self, step: float) -> dict[str, Any]:
        """The bottleneck the fluid network saw (parameter servers) and how busy the host
        resources of the first simulated GPU were (offload)."""
        if not self.fluid.track:
            return {}
        out: dict[str, Any] = {}
        elapsed = max(self.env.now, step)
        top = self.fluid.busiest()
        if self.ps and top is not None:
            (link, direction), busy = top
            out["parameter_servers"] = {"bottleneck_link": f"{link} {direction}", "bottleneck_busy_s": busy,
                                        "bottleneck_busy_fraction": busy / elapsed}
        if self.plan.offload.any:
            from simdist.sim.network import HOST_DIRECTION, host_link, node_resource

            c = self.sc.cluster
            rep = self.links.rep(0, 0)
            keys = {f"{r}_busy_s": (host_link(c, rep), d) for r, d in HOST_DIRECTION.items()}
            keys |= {f"{r}_busy_s": (node_resource(r, c.node_of(rep)), "up") for r in ("nvme", "cpu")}
            out["offload"] = {name: self.fluid.busy.get(key, 0.0) for name, key in keys.items()}
        return out

    def _assumptions(self) -> list[str]:
        plan = self.plan
        if self.full:
            out = [f"full fidelity: {plan.world_size} ranks as {len(self.slices)} tensor/context-parallel "
                   "slices in lock-step (their per-layer collectives synchronise them)"]
        else:
            out = [f"symmetric fidelity: {plan.pp} representative ranks (one per pipeline stage; "
                   "TP/CP peers and DP replicas do the same work)"]
        out += self.notes
        out.append("event engine: links shared as a fluid (NIC, NVSwitch port, leaf uplink"
                   + (", PCIe, NVMe, host CPU" if plan.offload.any or self.ps else "")
                   + "); TP/CP collectives timed in closed form inside each layer; pipeline sends block the sender")
        if self.fluid.peak_overload > 1.0 + 1e-6:
            out.append(f"link contention slowed transfers by up to {self.fluid.peak_overload:.2f}x")
        out += list(self.lowered.notes)
        return out


# --- stragglers ---------------------------------------------------------------------------------


def straggler_summary(sc: Scenario, sim: _Simulation, result: SimResult, uniform: _Simulation,
                      base: SimResult) -> tuple[dict[str, Any], str]:
    """How the plan absorbs its stragglers: the step against a uniform run, and how much of the
    stragglers' extra GPU work (factor - 1 times their work in the uniform run) reached the
    critical path. Synchronous data parallelism waits for the slowest replica at every gradient
    sync (all of it); a pipeline's bubbles absorb part of a slow stage; asynchronous parameter
    servers let the others go on (throughput drops by the straggler's share, its updates get
    staler)."""
    plan = sc.plan
    extra = 0.0
    for slow, same in zip(sim.slices, uniform.slices, strict=True):
        if slow.factor > 1.0:
            cycles = same.history[1:] or same.history or [same.tally]
            work = sum(t.work for t in cycles) / len(cycles)
            extra = max(extra, (slow.factor - 1.0) * work)
    t, t0 = result.step_time, base.step_time
    critical = (t - t0) / extra if extra > 0 else 0.0
    if plan.async_parameter_servers:
        mode = "async-ps"
    elif plan.pp > 1:
        mode = "pipeline"
    else:
        mode = "sync-ps" if plan.gradient_sync == "parameter-server" else "sync-dp"
    who = ", ".join(f"node {-k - 1}" if k < 0 else f"rank {k}" for k in sorted(sim.stragglers))
    factor = max(sl.factor for sl in sim.slices)
    summary: dict[str, Any] = {
        "mode": mode, "slowest_factor": factor, "who": who, "uniform_step_s": t0, "step_s": t,
        "slowdown": t / t0 if t0 > 0 else math.nan, "extra_work_s": extra,
        "critical_fraction": critical, "absorbed_fraction": 1.0 - critical,
    }
    line = (f"stragglers ({who}, up to x{factor:g}): step {t:.4g} s vs {t0:.4g} s uniform "
            f"({t / t0:.3f}x); {critical:.0%} of their extra GPU work ({extra:.3g} s) on the critical path")
    if mode in ("sync-dp", "sync-ps"):
        line += ": every gradient sync waits for the slowest replica"
        if critical < 0.9:
            line += f"; communication that outlasts backward hides {1 - critical:.0%} of it"
    elif mode == "pipeline" and critical > 0.95:
        line += ": the slow stage sets the pipeline's pace, nothing is absorbed"
    elif mode == "pipeline":
        line += f": the other stages' slack (pipeline bubbles) absorbed {1 - critical:.0%}"
    else:
        s0 = base.extras.get("staleness", {})
        s1 = result.extras.get("staleness", {})
        slow = [sl.replica for sl in sim.slices if sl.factor > 1.0]
        per = s1.get("per_worker_mean_steps", {})
        slow_stale = max((per.get(str(r), 0.0) for r in slow), default=0.0)
        summary.update({"throughput_ratio": t0 / t, "uniform_staleness_steps": s0.get("mean_steps"),
                        "staleness_steps": s1.get("mean_steps"), "straggler_staleness_steps": slow_stale})
        line += (f": no barrier, the other workers keep going (throughput {t0 / t:.3f}x of uniform); "
                 f"mean staleness {s0.get('mean_steps', 0):.2f} -> {s1.get('mean_steps', 0):.2f} updates, "
                 f"the slow worker's {slow_stale:.2f}")
    return summary, line
