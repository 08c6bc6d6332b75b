"""How much work one simulation would be, estimated from the description before anything is
lowered or simulated, so that a scenario the event engine cannot finish in reasonable time and
memory is turned away (or answered by the closed form) instead of running for minutes.

The estimate counts what the engine creates (:mod:`simdist.sim.lowering` and
:mod:`.step`), per simulated slice: every scheduled action's task (one segment, or one per layer
under ZeRO-3 / parameter offload, each with its parameter gathers and uploads), the gradient
pieces it starts (per layer under ZeRO-2/3, per bucket for a once-per-step sync or
parameter-server push and pull), the pipeline sends, the collectives after the flush; times the
slices simulated (one per stage, or every replica of every stage in full fidelity, several
cycles for asynchronous parameter servers, twice with stragglers). Spans kept for a trace count
once per rank they are drawn on. Setting up the network loads scans ranks: the members of
each collective's group and of its leaf switch per stage (every replica in full fidelity),
and every worker for parameter-server transfers; and the fluid network updates, for each
parameter-server flow, every link it loads and the flows sharing them.

The limits (:data:`MAX_EVENTS` and the others) hold a simulation to about a minute and under a
gigabyte on one core (measured with ``benchmarks/engine_budget.py``); the bundled scenarios
need at most a few hundred thousand events in symmetric fidelity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from simdist.analytic.data_parallel import DataParallelTraffic
from simdist.analytic.stage import StageDescription, StepDescription
from simdist.errors import Problem, ScenarioError
from simdist.sim import kernel
from simdist.sim.engine.servers import ASYNC_CYCLES
from simdist.sim.kernel import EmptySchedule, StopSimulation

# each limit is about a minute or under a gigabyte on one core (5-20 us per event, 0.6 us and
# 50 bytes per rank scanned, 0.1-2 us per estimated flow-link update)
MAX_EVENTS = 3_000_000  # kernel events scheduled
MAX_SPANS = 5_000_000  # timeline spans kept (a trace, the dashboard's timeline), ~200 bytes each
MAX_RANK_SCANS = 10_000_000  # ranks listed to set up the links' loads
MAX_LINK_UPDATES = 20_000_000  # flows x links x flows sharing them, in the fluid network
XFER = 3  # events per transfer: its stream item, the meeting of its group, the flow's end
HARD_FACTOR = 10  # a run stops past this many times MAX_EVENTS, whatever the estimate said
CHECK_EVERY = 1024  # events between two looks at the count and the clock
_KERNEL_STEP = kernel.Environment.step  # the kernel's own (a subclass may watch each step)


@dataclass(frozen=True)
class Factors:
    """What the work grows with, each the figure that one input drives (see ``FIELD``)."""

    microbatches: int = 1  # per pipeline per step
    chunks: int = 1  # virtual pipeline stages
    stages: int = 1
    layers: int = 1  # per chunk, when tasks are split per layer
    gather_calls: int = 1  # parameter all-gathers per layer (zero3_fetch)
    buckets: int = 1  # gradient buckets of a once-per-step sync (or push/pull)
    replicas: int = 1  # data-parallel replicas simulated
    world: int = 1  # ranks (GPUs)
    span_ranks: int = 0  # ranks each span is drawn on (0: no spans kept)


# the input each factor comes from, as named in an error
FIELD = {
    "microbatches": "plan.global_batch_size",
    "chunks": "plan.virtual_pipeline_stages",
    "stages": "plan.pp",
    "layers": "model.num_layers",
    "gather_calls": "plan.zero3_fetch",
    "buckets": "plan.ddp_bucket_size",
    "replicas": "--fidelity",
    "world": "cluster.num_nodes",
    "span_ranks": "plan.tp",
}


@dataclass(frozen=True)
class WorkEstimate:
    events: int  # kernel events the engine schedules (its time)
    spans: int  # timeline spans it keeps (their memory)
    rank_scans: int  # ranks listed to set up the links' loads
    link_updates: int  # parameter-server flows x the links they load x the flows sharing those
    factors: Factors
    driver: str  # the input whose growth adds the most work

    @property
    def load(self) -> float:
        """The largest figure as a fraction of its limit (> 1: too much work)."""
        return max(x / limit for x, limit in zip(self.figures, limits(), strict=True))

    @property
    def figures(self) -> tuple[int, int, int, int]:
        return self.events, self.spans, self.rank_scans, self.link_updates

    @property
    def within_limits(self) -> bool:
        return self.load <= 1.0

    def message(self) -> str:
        f = self.factors
        parts = [f"{self.events:,} events (limit {MAX_EVENTS:,})"]
        if self.spans:
            parts.append(f"{self.spans:,} timeline spans (limit {MAX_SPANS:,})")
        parts.append(f"{self.rank_scans:,} rank scans (limit {MAX_RANK_SCANS:,})")
        if self.link_updates:
            parts.append(f"{self.link_updates:,} link updates (limit {MAX_LINK_UPDATES:,})")
        return (f"the event engine would need about {', '.join(parts)}: {f.stages:,} stages x "
                f"{f.replicas:,} replicas x {f.microbatches:,} micro-batches x {f.chunks:,} chunks, "
                f"{f.buckets:,} gradient buckets, {f.world:,} GPUs")


def estimate_work(d: StepDescription, fidelity: str = "symmetric", keep_spans: bool = False,
                  stragglers: bool = False) -> WorkEstimate:
    """The work of simulating ``d`` (see the module docstring), and the input that drives it."""
    base = _factors(d, "full" if stragglers else fidelity, keep_spans)
    figures = _count(d, base, stragglers)
    best, driver = -1.0, FIELD["microbatches"]
    for f in fields(Factors):  # the factor whose growth adds the most: the input to name
        if getattr(base, f.name) <= 1:
            continue
        without = _count(d, replace(base, **{f.name: 1}), stragglers)
        saved = sum((a - b) / limit for a, b, limit in zip(figures, without, limits(), strict=True))
        if saved > best:
            best, driver = saved, FIELD[f.name]
    if driver == FIELD["replicas"] and fidelity != "full" and not stragglers:
        driver = "cluster.num_nodes"  # full fidelity was forced (asynchronous servers, stragglers)
    return WorkEstimate(*figures, base, driver)


def limits() -> tuple[int, int, int, int]:
    """The limits of (events, spans, rank scans, link updates), read when asked (a test may lower them)."""
    return MAX_EVENTS, MAX_SPANS, MAX_RANK_SCANS, MAX_LINK_UPDATES


def check_work(d: StepDescription, fidelity: str = "symmetric", keep_spans: bool = False,
               stragglers: bool = False) -> WorkEstimate:
    """The estimate, or a ScenarioError naming the input that drives it past a limit."""
    est = estimate_work(d, fidelity, keep_spans, stragglers)
    if not est.within_limits:
        raise ScenarioError(Problem(est.driver, f"too large for the event engine: {est.message()}; "
                                    "the closed form (--engine analytic) answers it"))
    return est


def run_bounded(env: kernel.Environment, est: WorkEstimate, until: kernel.Event | None = None) -> None:
    """``env.run(until)``, stopped past HARD_FACTOR x MAX_EVENTS events (a ScenarioError naming
    the input that drives the work: the estimate was wrong, the bound holds anyway) or when the
    simulated clock stops being a finite number (FloatingPointError: an input so extreme that a
    duration overflowed)."""
    limit = HARD_FACTOR * MAX_EVENTS
    if until is not None:
        until.callbacks.append(StopSimulation.callback)
    n = 0
    if type(env).step is _KERNEL_STEP:  # CHECK_EVERY events at a time, in one frame
        steps = env.steps
    else:  # an environment that watches each step (a test counting them)
        def steps(k: int) -> None:
            for _ in range(k):
                env.step()
    try:
        while True:
            steps(CHECK_EVERY)
            n += CHECK_EVERY
            if n > limit:
                raise ScenarioError(Problem(est.driver, f"too large for the event engine: stopped after "
                                            f"{n:,} events (its limit is {limit:,})"))
            if not math.isfinite(env.now):
                raise FloatingPointError(f"the simulated clock reached {env.now}")
    except StopSimulation:
        return
    except EmptySchedule:
        if until is not None:
            raise RuntimeError("the simulation ended before its last event") from None
    if not math.isfinite(env.now):
        raise FloatingPointError(f"the simulated clock reached {env.now}")


# --- the count ----------------------------------------------------------------------------


def _factors(d: StepDescription, fidelity: str, keep_spans: bool) -> Factors:
    plan, sc = d.plan, d.scenario
    full = fidelity == "full" or plan.async_parameter_servers
    layers = max(c.layers for k in d.kinds for c in k.chunks)
    gathers = max((_calls(k.dp.fwd_gathers, k.dp) for k in d.kinds if k.dp.fwd_gathers), default=1)
    buckets = max((_buckets(d, k) for k in d.kinds), default=1)
    span_ranks = (plan.tp * plan.cp if full else 1) if keep_spans else 0
    return Factors(microbatches=plan.num_microbatches, chunks=plan.virtual_pipeline_stages, stages=plan.pp,
                   layers=max(1, layers), gather_calls=max(1, gathers), buckets=max(1, buckets),
                   replicas=plan.dp if full else 1, world=sc.world_size, span_ranks=span_ranks)


def _count(d: StepDescription, f: Factors, stragglers: bool) -> tuple[int, int, int, int]:
    """(events, spans, rank scans, link updates) for the factors ``f``."""
    plan, c = d.plan, d.scenario.cluster
    split = plan.split_backward
    items = ps_transfers = 0
    for k in d.kinds:  # the busiest kind stands for every stage
        i, p = _slice_items(d, k, f, split)
        items, ps_transfers = max(items, i), max(ps_transfers, p)
    cycles = ASYNC_CYCLES + 1 if plan.async_parameter_servers else 1
    runs = 2 if stragglers else 1
    slices = f.stages * f.replicas
    # built once: the schedule's actions, and each stage kind's per-layer work lists (lowering)
    built = f.stages * f.microbatches * f.chunks * (3 if split else 2) + len(d.kinds) * f.chunks * f.layers * 3
    events = runs * (cycles * slices * items + built)
    spans = cycles * slices * items * f.span_ranks
    # setting up a collective's loads scans its group and its leaf switch's ranks, per stage and
    # simulated replica
    scans = f.stages * f.replicas * (min(f.world, c.nodes_per_leaf * c.gpus_per_node) + min(plan.dp, f.world))
    touches = 0
    if ps_transfers:  # a push or pull loads every worker's NIC (or its replica's) and the servers'
        nodes = max(1, f.world // c.gpus_per_node)
        workers = f.world // max(1, f.stages) if f.replicas == 1 else plan.tp * plan.cp
        loads = workers + nodes * c.nics_per_node
        concurrent = 2 if f.replicas == 1 else f.replicas  # flows sharing the servers' NICs
        scans += f.stages * f.replicas * 2 * f.world
        touches = runs * cycles * slices * ps_transfers * loads * concurrent
    return events, spans, scans, touches


def _slice_items(d: StepDescription, k: StageDescription, f: Factors, split: bool) -> tuple[int, int]:
    """(items, parameter-server transfers) of one slice in one step, for a stage of kind ``k``
    (its largest chunk stands for each)."""
    tr = k.dp
    per_layer = _per_layer(d, k)
    segments = f.layers if per_layer else 1
    # a compute segment is one timeout; a transfer (a collective, a host copy, a send, a push or
    # a pull) about XFER events: its stream item, the meeting of its group, the flow's end
    segment = 1 + XFER * ((f.gather_calls + 1) if per_layer else 0)  # with its gathers and upload
    pieces = f.layers * XFER * (len(tr.microbatch_grad_sync) + (k.offload.pcie_down_per_microbatch > 0))
    # + the two sends: a plain task's blocking send is reserved with its compute (one event for
    # both, step.StepDriver._step), counted one event here; else XFER
    merged = not per_layer and not pieces and not f.span_ranks and not d.plan.dualpipe
    chunk = segments * segment * (3 if split else 2) + pieces + 2 * (1 if merged else XFER)
    per_bucket = len(tr.step_grad_sync) + (3 if k.ps is not None else 0) + (1 if k.offload.used else 0)
    post = sum(max(1, e.calls) for e in tr.post_step_gathers)
    per_step = XFER * (f.buckets * max(1, per_bucket) + post) + 8
    ps = 2 * f.buckets if k.ps is not None else 0
    return f.microbatches * f.chunks * chunk + per_step, ps


def _per_layer(d: StepDescription, k: StageDescription) -> bool:
    """Tasks split per layer: ZeRO-3 gathers, or parameter uploads from the host."""
    return bool(k.dp.fwd_gathers) or (k.offload.pcie_up_per_microbatch > 0
                                       and d.scenario.cluster.host is not None)


def _calls(entries: tuple, tr: DataParallelTraffic) -> int:
    per = max(1, tr.gather_chunks)
    return sum(max(1, round(e.calls / per)) for e in entries) or 1


def _buckets(d: StepDescription, k: StageDescription) -> int:
    if k.dp.step_grad_sync:
        return k.dp.step_buckets
    if k.ps is not None:
        return k.ps.buckets
    return k.offload.down_buckets if k.offload.used else 1
