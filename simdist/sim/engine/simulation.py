"""simulate(): one optimizer step of a described scenario in the event engine."""

from __future__ import annotations

import gc
from dataclasses import replace

from simdist.analytic.result import StepResult
from simdist.analytic.stage import StepDescription
from simdist.sim.engine import grouping, periodic
from simdist.sim.engine.accounting import async_result, step_result
from simdist.sim.engine.budget import WorkEstimate, check_work, run_bounded
from simdist.sim.engine.servers import Servers
from simdist.sim.engine.state import BackendFactory, Run
from simdist.sim.engine.step import StepDriver
from simdist.sim.engine.stragglers import straggler_summary
from simdist.sim.engine.streams import Streams
from simdist.sim.lowering import lower
from simdist.sim.network import FluidBackend
from simdist.sim.work import Lowered

FIDELITIES = ("symmetric", "full")


def simulate(
    described: StepDescription,
    fidelity: str = "symmetric",
    keep_spans: bool = True,
    stragglers: dict[int, float] | None = None,
    backend: BackendFactory = FluidBackend,
) -> StepResult:
    """Simulate one optimizer step of the described scenario (:func:`simdist.analytic.stage.describe`).

    ``stragglers`` maps a rank to a compute slow-down factor (a negative key -(node+1) slows a
    whole node); they need full fidelity, which is used when any is given, and the result then
    also says how the plan absorbs them (a uniform run for comparison; ``extras["stragglers"]``).
    Asynchronous parameter servers always run in full fidelity. ``backend`` builds the network
    the transfers run on (:class:`simdist.sim.network.NetworkBackend`). A scenario past the
    work limits of :mod:`.budget` is refused (ScenarioError naming the input) before anything
    is built.

    The cyclic garbage collector is paused for the run (its previous state restored after):
    the run makes ~10^4-10^6 short-lived events, processes and spans, and each collection they
    trigger walks every live one (the pending events, the lowered work, the timeline) although
    almost none die in a cycle. predict, the search's re-rank, calibration and the trace all
    come through here.
    """
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _simulate(described, fidelity, keep_spans, stragglers, backend)
    finally:
        if collecting:
            gc.enable()


def _simulate(described: StepDescription, fidelity: str, keep_spans: bool,
              stragglers: dict[int, float] | None, backend: BackendFactory) -> StepResult:
    if fidelity not in FIDELITIES:
        raise ValueError(f"fidelity must be one of {FIDELITIES}, got {fidelity!r}")
    sc = described.scenario
    notes: list[str] = []
    stragglers = {k: v for k, v in (stragglers or {}).items() if v != 1.0}
    if stragglers and fidelity == "symmetric":
        fidelity = "full"
        notes.append("stragglers given: full fidelity used")
    if sc.plan.async_parameter_servers and fidelity == "symmetric":
        fidelity = "full"
        notes.append("asynchronous parameter servers: full fidelity used (each worker runs at its own pace)")
    grouped = grouping.simulated_fidelity(described, fidelity, keep_spans, bool(stragglers)) != fidelity
    if grouped:  # every rank of a stage behaves alike: one group per stage (engine.grouping)
        fidelity = "symmetric"
        notes.insert(0, grouping.grouped_line(described))
    work = check_work(described, fidelity, keep_spans, bool(stragglers))  # before anything is built
    short, spent = periodic.short_count(described, fidelity, keep_spans, stragglers), 0
    while short is not None:  # a short step, stretched when its steady state is periodic
        sim = Simulation(described, lower(described, short), False, False, {}, list(notes), 0.0, backend, short)
        result = sim.run(work)
        if result is not None:
            return result
        spent += short  # else (zero-bubble) maybe a longer short step (periodic.longer)
        short = periodic.longer(sim.state, sc.plan.num_microbatches, spent)
    lowered = lower(described)
    stagger = _async_stagger(described)
    sim = Simulation(described, lowered, fidelity == "full", keep_spans, stragglers, notes, stagger, backend)
    result = sim.run(work)
    if stragglers:
        uniform = Simulation(described, lowered, fidelity == "full", False, {}, [], stagger, backend)
        base = uniform.run(work)
        summary, line = straggler_summary(sc, sim.state, result, uniform.state, base)
        result = replace(result, assumptions=(*result.assumptions, line),
                         extras={**result.extras, "stragglers": summary})
    return result


def _async_stagger(d: StepDescription) -> float:
    """Start offset between consecutive replicas in the asynchronous mode: the closed form's
    cycle over dp, so that the pushes are spread evenly over a cycle from the start (an initial
    condition only: the simulated steady state does not depend on it)."""
    if not d.plan.async_parameter_servers:
        return 0.0
    from simdist.analytic.steptime import reduce_step

    return reduce_step(d).step_time / d.plan.dp


class Simulation:
    """The parts of one simulation, wired together: the shared state, the streams, the
    parameter servers and the step driver."""

    def __init__(self, d: StepDescription, lowered: Lowered, full: bool, keep_spans: bool,
                 stragglers: dict[int, float], notes: list[str], stagger: float, backend: BackendFactory,
                 short: int | None = None):
        self.state = Run(d.scenario, lowered, d.net, full, keep_spans, stragglers, notes, backend, short,
                         record=short is not None)
        self.streams = Streams(self.state)
        self.servers = Servers(self.state, self.streams, stagger)
        self.streams.pushed = self.servers.pushed
        self.driver = StepDriver(self.state, self.streams, self.servers)

    def run(self, work: WorkEstimate | None = None) -> StepResult | None:
        """Run the step (bounded by ``work``'s limits when given: :func:`.budget.run_bounded`);
        a short step (``short`` micro-batches) that does not reach a periodic state gives None."""
        state = self.state
        env = state.env
        for sl in state.slices:
            env.process(self.driver.process(sl, state.lowered.stages[sl.stage]))
        until = self.servers.stop if self.servers.async_mode else None
        try:
            if work is None:
                env.run(until=until)
            else:
                run_bounded(env, work, until)
            if self.servers.async_mode:
                return async_result(state, self.servers)
            if state.microbatches != state.plan.num_microbatches and not periodic.extend(state, state.plan.num_microbatches):
                return None
            return step_result(state)
        finally:
            self.release()

    def release(self) -> None:
        """Break the reference cycles of the run (the streams and the servers point at each
        other; each route of the network at its links' reservations, which point back at it),
        so that the run's objects go when the last reference to them does, not at the next
        collection of the cyclic garbage collector, which would walk every one of them: ~10^4
        to 10^5 records, events and tallies, about a third of a prediction's time otherwise.
        The state (``self.state``) stays readable."""
        self.streams.pushed = Streams.no_push
        release = getattr(self.state.network, "release", None)  # (a backend's own cycles, if any)
        if release is not None:
            release()
