"""The discrete-event engine (simpy): every simulated rank's compute and communication streams
over the cluster's links, for one optimizer step.

A *slice* is the tensor- and context-parallel group of one pipeline stage of one data-parallel
replica: its ranks run the same kernels in lock-step (TP/CP collectives inside every layer
synchronise them), so one simpy process drives its compute stream. Symmetric fidelity simulates
one slice per stage (replica 0; the other replicas do the same work at the same time, and their
load on shared links is counted by :class:`simdist.sim.network.LinkModel`); full fidelity
simulates every replica, so stragglers and slow nodes delay the collectives that wait for them.

Per slice, streams as in Megatron-LM / PyTorch: ``compute`` (the pipeline schedule's actions
from :mod:`simdist.sim.schedules`, the optimizer), ``pp`` (blocking sends: Megatron's batched
isend/irecv is waited for before the next action), ``dp`` (gradient reductions, FIFO, one NCCL
stream) and ``gather`` (ZeRO-3 parameter all-gathers, FIFO, prefetched one layer ahead).

Synchronisation points, as in the frameworks: under ZeRO-2/3 a backward returns only when its
gradient reductions are done (DeepSpeed's reduce epilogue, FSDP's post-backward callback); the
optimizer waits for the whole gradient sync; with Megatron's ``--overlap-param-gather`` the
ZeRO-1 parameter all-gather only delays the next step's first forward as far as it must.
Plans with CPU/NVMe offload, parameter servers or compression kernels, which this engine does
not simulate, get the closed-form step time (:func:`not_simulated` names them).

Breakdown (the parts sum to the step time exactly): up to the pipeline flush (the last compute
action of any slice), the busiest slice's compute, recompute, exposed TP/CP, pipeline sends and
the exposed part of waits for a transfer in flight, waits for ZeRO-3 parameters, and the rest of
its idle time as bubble; after the flush, the critical (last finishing) slice's optimizer, and
everything else (gradient sync, parameter all-gather) as data-parallel communication.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import simpy

from simdist.cost import CostModel
from simdist.results import Span
from simdist.sim.collectives import Network
from simdist.sim.lowering import CommSpec, Lowered, StageWork, Task, lower
from simdist.sim.network import FluidNetwork, LinkModel
from simdist.sim.schedules import Action
from simdist.spec.plan import RankCoord, rank_of
from simdist.spec.scenario import Scenario

Proc = Generator[simpy.Event, Any, Any]
FIDELITIES = ("symmetric", "full")
CATEGORY = {"F": "forward", "B": "backward", "W": "backward"}


@dataclass(frozen=True)
class SimResult:
    step_time: float
    breakdown: dict[str, float]
    bubble_fraction: float
    spans: tuple[Span, ...]
    assumptions: list[str]
    events: int = 0  # simpy events processed
    busiest_stage: int = 0
    extras: dict[str, Any] = field(default_factory=dict)  # from the closed form, when it is used


def events_scheduled(env: simpy.Environment) -> int:
    """Events the environment has scheduled so far (simpy numbers them with ``_eid``)."""
    counter = getattr(env, "_eid", None)
    return next(counter) if counter is not None else 0


@dataclass
class Tally:
    """What one slice's compute stream did, in seconds."""

    compute: float = 0.0
    recompute: float = 0.0
    tp: float = 0.0
    pp: float = 0.0  # blocking sends + the exposed part of waits for a transfer
    dp: float = 0.0  # waits for ZeRO-3 parameters before the flush
    flush_end: float = 0.0
    end: float = 0.0
    opt: tuple[float, float] = (0.0, 0.0)

    @property
    def busy(self) -> float:
        return self.compute + self.recompute + self.tp + self.pp


@dataclass
class Slice:
    replica: int
    stage: int
    ranks: tuple[int, ...]  # ranks that get spans (the representative, or the whole slice)
    factor: float  # compute slow-down (the slowest rank of the slice)
    tally: Tally = field(default_factory=Tally)
    tails: dict[str, simpy.Event] = field(default_factory=dict)  # stream -> last submitted item
    seq: dict[str, int] = field(default_factory=dict)  # stream -> items submitted


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
    whole node); they need full fidelity, which is used when any is given.
    """
    if fidelity not in FIDELITIES:
        raise ValueError(f"fidelity must be one of {FIDELITIES}, got {fidelity!r}")
    missing = not_simulated(scenario)
    if missing:
        return _closed_form(scenario, cost, net, missing)
    notes: list[str] = []
    if stragglers and fidelity == "symmetric":
        fidelity = "full"
        notes.append("stragglers given: full fidelity used")
    return _Simulation(scenario, lower(scenario, cost, net), net, fidelity, keep_spans,
                       stragglers or {}, notes).run()


def not_simulated(sc: Scenario) -> list[str]:
    """Mechanisms of the plan the event engine does not model (the closed form does)."""
    plan = sc.plan
    out = []
    if plan.offload.any:
        out.append("CPU/NVMe offload")
    if plan.gradient_sync != "allreduce":
        out.append(f"{plan.gradient_sync} gradient sync")
    if plan.grad_compression.enabled and plan.dp > 1:
        out.append("gradient compression kernels")
    return out


def _closed_form(sc: Scenario, cost: CostModel, net: Network, missing: list[str]) -> SimResult:
    from simdist.analytic.steptime import analytic_step

    step = analytic_step(sc, cost, net)
    note = f"event engine does not simulate {', '.join(missing)}: closed-form step time used"
    return SimResult(step.step_time, dict(step.breakdown), step.bubble_fraction, (), [note],
                     busiest_stage=step.busiest_stage, extras=dict(step.extras))


class _Simulation:
    def __init__(self, sc: Scenario, lowered: Lowered, net: Network, fidelity: str,
                 keep_spans: bool, stragglers: dict[int, float], notes: list[str]):
        self.sc, self.plan, self.lowered = sc, sc.plan, lowered
        self.full = fidelity == "full"
        self.keep_spans, self.notes = keep_spans, notes
        self.env = simpy.Environment()
        self.links = LinkModel(sc, net, replicas_alike=not self.full)
        self.fluid = FluidNetwork(self.env)
        self.arrivals: dict[tuple[int, int, Action], simpy.Event] = {}
        self.meetings: dict[tuple, list] = {}
        self.spans: list[tuple] = []
        replicas = range(self.plan.dp) if self.full else range(1)
        self.slices = [self._slice(d, s, stragglers) for d in replicas for s in range(self.plan.pp)]

    def _slice(self, replica: int, stage: int, stragglers: dict[int, float]) -> Slice:
        plan, gpn = self.plan, self.sc.cluster.gpus_per_node
        ranks = tuple(rank_of(RankCoord(replica, stage, c, t), plan)
                      for c in range(plan.cp) for t in range(plan.tp))
        factor = max(max(stragglers.get(r, 1.0), stragglers.get(-(r // gpn) - 1, 1.0)) for r in ranks)
        return Slice(replica, stage, ranks if self.full else ranks[:1], factor)

    # --- running ---

    def run(self) -> SimResult:
        for sl in self.slices:
            self.env.process(self._stage(sl, self.lowered.stages[sl.stage]))
        self.env.run()
        return self._result()

    def _stage(self, sl: Slice, work: StageWork) -> Proc:
        env, m = self.env, self.plan.num_microbatches
        for action, deps in zip(work.actions, work.deps, strict=True):
            yield from self._wait(sl, deps)
            chunk = work.chunks[action.chunk]
            yield from self._task(sl, action, chunk.task(action.kind, action.microbatch == m - 1))
            spec = chunk.send_fwd if action.kind == "F" else chunk.send_bwd if action.kind == "B" else None
            if spec is not None:
                yield from self._send(sl, action, spec)
        sl.tally.flush_end = env.now
        for spec in work.flush:
            self._submit(sl, "dp", env.now, (spec,))
        if "dp" in sl.tails:
            yield sl.tails["dp"]
        start = env.now
        yield env.timeout(work.optimizer * sl.factor)
        sl.tally.opt = (start, env.now)
        self._span(sl, "compute", "optimizer", start, env.now, "optimizer")
        if work.post_hides_in_forward:
            yield from self._gather_behind_forward(sl, work)
            return
        if work.post_optimizer:
            yield self._submit(sl, "dp", env.now, work.post_optimizer)
        sl.tally.end = env.now

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
            ev = self._arrival(sl.replica, stage, action)
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

    def _arrival(self, replica: int, stage: int, action: Action) -> simpy.Event:
        key = (replica, stage, action)
        ev = self.arrivals.get(key)
        if ev is None:
            ev = self.arrivals[key] = self.env.event()
        return ev

    def _task(self, sl: Slice, action: Action, task: Task) -> Proc:
        env, t = self.env, sl.tally
        start = env.now
        gathers: list[simpy.Event] = []
        pieces, k = task.pieces, 0  # ordered by segment
        for i, seg in enumerate(task.segments):
            if task.gathers:
                while len(gathers) < min(i + 2, len(task.gathers)):  # this layer's and the next
                    gathers.append(self._submit(sl, "gather", env.now, task.gathers[len(gathers)]))
                if not gathers[i].processed:
                    t0 = env.now
                    yield gathers[i]
                    t.dp += env.now - t0
            length = seg.total(sl.factor)
            while k < len(pieces) and pieces[k].segment == i:
                self._submit(sl, "dp", env.now + pieces[k].at * length, pieces[k].comms)
                k += 1
            yield env.timeout(length)
            t.compute += seg.compute * sl.factor
            t.recompute += seg.recompute * sl.factor
            t.tp += seg.tp
        end = env.now
        if self.keep_spans:
            self._task_spans(sl, action, task, start, end)
        tail = sl.tails.get("dp")
        if task.drain and tail is not None and not tail.processed:
            yield tail
            t.dp += env.now - end
            self._span(sl, "compute", "wait for gradient reduce-scatter", end, env.now, "dp_comm")

    def _task_spans(self, sl: Slice, action: Action, task: Task, start: float, end: float) -> None:
        w = task.work
        name = f"{action.kind} mb{action.microbatch} chunk{action.chunk}"
        rec = w.recompute * sl.factor if len(task.segments) == 1 else 0.0
        if rec > 0:
            self._span(sl, "compute", f"R mb{action.microbatch} chunk{action.chunk}", start, start + rec, "recompute")
        self._span(sl, "compute", name, start + rec, end, CATEGORY[action.kind])
        if w.tp > 0:
            self._span(sl, "tp", task.tp_name or "tp", end - w.tp, end, "tp_comm")

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
        self._arrival(sl.replica, sl.stage, action).succeed(start)

    # --- streams and collectives ---

    def _submit(self, sl: Slice, stream: str, ready: float, comms: tuple[CommSpec, ...]) -> simpy.Event:
        """Queue ``comms`` on a FIFO stream of the slice, to start no earlier than ``ready``."""
        prev = sl.tails.get(stream)
        seq = sl.seq.get(stream, 0)
        sl.seq[stream] = seq + 1
        proc = self.env.process(self._stream_item(sl, stream, seq, prev, ready, comms))
        sl.tails[stream] = proc
        return proc

    def _stream_item(self, sl: Slice, stream: str, seq: int, prev: simpy.Event | None,
                     ready: float, comms: tuple[CommSpec, ...]) -> Proc:
        env = self.env
        if prev is not None and not prev.processed:
            yield prev
        if ready > env.now:
            yield env.timeout(ready - env.now)
        for i, spec in enumerate(comms):
            start = env.now
            yield self._collective(sl, spec, (stream, seq, i))
            self._span(sl, stream, spec.name, start, env.now, "dp_comm")

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

    def _result(self) -> SimResult:
        tallies = [sl.tally for sl in self.slices]
        step = max(t.end for t in tallies)
        flush = max(t.flush_end for t in tallies)
        busiest = max(range(len(self.slices)), key=lambda i: tallies[i].busy)
        b = tallies[busiest]
        crit = next(t for t in tallies if t.end == step)
        opt = max(0.0, min(crit.opt[1], step) - max(crit.opt[0], flush))
        parts = {"compute": b.compute, "recompute": b.recompute, "tp_comm": b.tp, "pp_comm": b.pp}
        bubble = max(0.0, flush - sum(parts.values()) - b.dp)
        breakdown = {**parts, "dp_comm": b.dp + (step - flush - opt), "bubble": bubble, "optimizer": opt}
        spans = tuple(Span(*s) for s in sorted(self.spans, key=lambda s: (s[0], s[3], s[1])))
        return SimResult(
            step_time=step,
            breakdown=breakdown,
            bubble_fraction=bubble / step if step > 0 and self.plan.pp > 1 else 0.0,
            spans=spans,
            assumptions=self._assumptions(),
            events=events_scheduled(self.env),
            busiest_stage=self.slices[busiest].stage,
        )

    def _assumptions(self) -> list[str]:
        plan = self.plan
        if self.full:
            out = [f"full fidelity: {plan.world_size} ranks as {len(self.slices)} tensor/context-parallel "
                   "slices in lock-step (their per-layer collectives synchronise them)"]
        else:
            out = [f"symmetric fidelity: {plan.pp} representative ranks (one per pipeline stage; "
                   "TP/CP peers and DP replicas do the same work)"]
        out += self.notes
        out.append("event engine: links shared as a fluid (NIC, NVSwitch port, leaf uplink); "
                   "TP/CP collectives timed in closed form inside each layer; pipeline sends block the sender")
        if self.fluid.peak_overload > 1.0 + 1e-6:
            out.append(f"link contention slowed transfers by up to {self.fluid.peak_overload:.2f}x")
        out += list(self.lowered.notes)
        return out
