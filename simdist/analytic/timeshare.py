"""More ranks than cores: the profile a time-shared run sees (a CPU calibration profile only).

Ranks beyond the cores share them; each waits for a core while the others compute. When every
rank is runnable, each gets cores/ranks of one, and everything it does on the CPU stretches by
ranks/cores (:meth:`simdist.spec.profile.CalibrationProfile.time_share`, relative to the share
the profile was fitted at). A pipeline stage in its bubble waits for its neighbour's
activations or gradients, blocked, and gives its core to the stages that compute then, so the
bubble is not stretched: it fills with other stages' work. So the step takes the larger of

- the full-speed step (a prediction with the profile as fitted), and
- the work that has to share the cores: ranks/cores x each rank's busy time, the full-speed
  step less its pipeline bubble and less what it sleeps in communication that other ranks
  fill (below).

(The processor-sharing view of a CPU-bound parallel program: the step is bounded below by its
total CPU demand over the cores and by its critical path.) The rest of a rank's step at full
speed, its collectives and the waits at their sync points, is CPU work on gloo: the copies and
reductions, the transport threads' reads and writes and the kernel's loopback TCP. Measured on
the 2-core machine this was written on (``tools/cores_busy.py``: ``/proc/stat`` over steady
steps, 2026-11-28), the cores were 79-89% busy with 2 ranks (tiny-llama-tp, tiny-fsdp3,
tiny-moe-ep, tiny-ddp: far more than the training threads' own 48-90%), 89-93% with 4 ranks
(tiny-hsdp, tiny-moe-ep-dp, tiny-2d-tp-dp) and 96-97% with 8 (tiny-3d): the waits of the 2-rank
step were mostly not time the cores could give to other ranks. (Before the executor ran gloo's
transport threads under the idle policy, executor.hostload.idle_transport_threads, the model
let the sync-point waits and the links' latency fill with other ranks' work too; over four
fresh calibration runs since, that held 15 of 36 time-shared held-out predictions within 15%,
this 23; benchmarks/README.md.)

What a rank sleeps of its communication at full speed, though, is time other ranks can use:
the share of each kind of communication in the breakdown that the rank's process spends off the
cores (``CalibrationProfile.sleep_shares``, fitted per software layer, and for the plain plans,
on their runs with a core per rank: neither the training thread nor gloo's threads on a core,
simdist.calibrate.phases.fit_sleep; :data:`COMM_LAYERS` names whose share prices which) leaves
the busy time. Any rank that can run fills it: the other groups of the layer in the rank's stage
(a TP group's data-parallel replicas, HSDP's other shard groups, the other expert groups), and
the rank's own peers, which are what it waits for: a collective's early ranks sleep while the
late ones, waiting for a core, take theirs. Fitted on the tiny TP plan (2 ranks, the
``tiny-llama`` model), a rank slept 36-48% of the TP communication the model prices on the
2-core AMD host of 2026-11-28; without it the TP x DP plans of 4 and 8 ranks (tiny-2d-tp-dp,
tiny-3d) came out 8-46% too slow in the five calibrations whose fit was sound, with it -4% to
+17% (benchmarks/README.md). Until 2026-12-07 only a layer's other groups in the stage filled its
sleep, and only for TP, ZeRO-3 and expert parallelism; on the 2-core Intel host of that day (q59:
the time-shared held-out plans' steps 1.04-1.09x their ranks' summed CPU time over the cores,
pipelines aside; the plain plans' ranks off the cores for 39% of the all-reduce the model prices)
that left the 4-rank expert-parallel plans 21-25% and tiny-3d 19% too slow (benchmarks/README.md).
A collective inside the layers (TP, CP, expert parallelism) holds every rank of its group, and where
a pipeline stage's ranks do not outnumber the cores, the stage's group is all of them: only another
stage can fill their sleep, and another stage computes only part of the step (:func:`filling`;
none of it while the stage runs the pipeline's fill or drain alone). The data-parallel and
pipeline transfers' sleep falls while other stages compute (a pipeline's receive waits for its
neighbour's work; the last stage's gradient sync runs while the first still computes) and is
filled whole. Filling it whole left tiny-2d-pp-tp (a TP group a stage, GPipe, two micro-batches)
12-18% too fast in six calibrations of 2026-12-07, its step 1.24x its ranks' summed CPU time over
the cores; so filled, 3-10% (benchmarks/README.md).

To that come the waits at the sync points whose peers the scheduler has not running
(simdist.analytic.cpu_syncs), when the profile fitted them, counting the ranks that compete for
the cores (:func:`competing_ranks`: a pipeline stage computes m x its time per micro-batch of
the step and waits for its neighbours, off the cores, the rest of it). The factor that maps the
full-speed step to that time is applied to the whole profile (:meth:`CalibrationProfile.slowed`),
so the breakdown and the timeline stay consistent with the step time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from simdist.spec.profile import CalibrationProfile, busy_ranks
from simdist.spec.software_layers import BASE_TERMS, profile_layers


def time_shared(scenario: Any, profile: CalibrationProfile | None) -> tuple[CalibrationProfile | None, float]:
    """(the profile ``scenario``'s ranks see, the factor it is slowed by); (profile, 1.0) when
    the ranks have a core each (or the profile does not know its cores: a GPU profile)."""
    if profile is None or profile.cores <= 0:
        return profile, 1.0
    share = profile.time_share(busy_ranks(scenario))
    if share <= 1.0:
        return profile, 1.0
    from simdist.analytic.collectives import Network
    from simdist.analytic.cost import CostModel
    from simdist.analytic.stage import describe
    from simdist.analytic.steptime import reduce_step

    cluster = scenario.cluster
    described = describe(scenario, CostModel(cluster.gpu, scenario.plan.precision, profile), Network.of(cluster, profile))
    full = reduce_step(described)
    if full.step_time <= 0:
        return profile.slowed(share), share
    fill = filling(described, full.step_time, profile.cores)
    busy = max(0.0, full.step_time - full.breakdown.get("bubble", 0.0) - slept(scenario, full.breakdown, profile, fill))
    coschedule = 0.0
    ranks = competing_ranks(described, full.step_time)
    if profile.coschedule_wait_s > 0 and ranks > profile.cores:  # sync points whose peers are descheduled
        from simdist.analytic.cpu_syncs import sync_points
        from simdist.analytic.fsdp2 import runs_fsdp2

        fsdp2 = runs_fsdp2(scenario.plan, profile)
        points = max(sync_points(scenario, s, fsdp2) for s in range(scenario.plan.pp))
        coschedule = points * (1 - profile.cores / ranks) * profile.coschedule_wait_s
    factor = max(1.0, (max(full.step_time, share * busy) + coschedule) / full.step_time)
    return profile.slowed(factor), factor


# breakdown entry -> the plan's degree that makes it (none below 2), and the layers whose fitted
# sleep share prices it, the most specific first; an entry whose layers the plan does not run (or
# the profile did not fit) takes the plain plans'
COMM_LAYERS: dict[str, tuple[Callable[[Any], int], tuple[str, ...]]] = {
    "tp_comm": (lambda plan: plan.tp, ("tp",)),
    "cp_comm": (lambda plan: plan.cp, ("cp",)),
    "ep_comm": (lambda plan: plan.ep, ("ep",)),
    "pp_comm": (lambda plan: plan.pp, ("split_backward", "multichunk", "pipeline")),
    "dp_comm": (lambda plan: plan.dp, ("hsdp", "zero3", "zero2", "zero1", "compression", "async", "ps")),
}


def filled(plan: Any, profile: CalibrationProfile) -> dict[str, float]:
    """Breakdown entry -> the share of its communication a rank sleeps (module docstring), for the
    kinds of communication the plan has."""
    layers, shares = profile_layers(plan), profile.sleep_shares
    out = {}
    for entry, (degree, owners) in COMM_LAYERS.items():
        share = next((shares[x] for x in owners if x in layers and x in shares), shares.get(BASE_TERMS, 0.0))
        if degree(plan) > 1 and share > 0:
            out[entry] = share
    return out


# the breakdown entries of collectives inside the layers, which hold every rank of their group
IN_LAYER = ("tp_comm", "cp_comm", "ep_comm")


def slept(scenario: Any, breakdown: dict[str, float], profile: CalibrationProfile, fill: float = 1.0) -> float:
    """The time (s) of a full-speed step (``breakdown``) that a rank sleeps where other ranks fill
    it: the share of each entry's communication it sleeps (:func:`filled`), of the collectives
    inside the layers the part ``fill`` (:func:`filling`)."""
    return sum(share * breakdown.get(entry, 0.0) * (fill if entry in IN_LAYER else 1.0)
               for entry, share in filled(scenario.plan, profile).items())


def stage_fits_cores(scenario: Any, cores: int) -> bool:
    """Whether a pipeline's stages hold no more ranks than the cores (so a stage alone runs at full
    speed, and its in-layer collectives hold all of its ranks at once)."""
    return scenario.plan.pp > 1 and busy_ranks(scenario) / scenario.plan.pp <= cores


def time_share_note(scenario: Any, profile: CalibrationProfile, factor: float) -> str:
    """The assumption a time-shared prediction states."""
    n, sleeps = busy_ranks(scenario), filled(scenario.plan, profile)
    return (f"{n} ranks time-share the profiled machine's {profile.cores} cores ({profile.time_share(n):.2g}x its "
            f"share at calibration, {max(1, profile.ranks)} ranks): the step is priced {factor:.2g}x the "
            "full-speed one (all of each rank's step stretched but its pipeline bubble, which fills with other stages' "
            "work" + "".join(f", and the {share:.0%} of its {entry.removesuffix('_comm')} communication it sleeps"
                             for entry, share in sleeps.items())
            + (", which the other ranks fill" if sleeps else "")
            + (" (that of its in-layer collectives only while another pipeline stage computes)"
               if stage_fits_cores(scenario, profile.cores) and any(e in IN_LAYER for e in sleeps) else "")
            + (f"; {profile.coschedule_wait_s * 1e3:.2g} ms at each sync point whose peers are descheduled"
               if profile.coschedule_wait_s else "") + ")")


def filling(d: Any, step_s: float, cores: int) -> float:
    """The part of a rank's sleep in its in-layer collectives that other ranks fill: all of it
    unless a pipeline's stages fit the cores (:func:`stage_fits_cores`), then the share of the
    step (``step_s``, at full speed) in which another stage computes (:func:`_stage_shares`)."""
    if not stage_fits_cores(d.scenario, cores) or step_s <= 0:
        return 1.0
    shares = _stage_shares(d, step_s)
    return min(1.0, sum(shares) - max(shares))


def _stage_shares(d: Any, step_s: float) -> list[float]:
    """Each pipeline stage's share of the step (``step_s``, at full speed) in which it computes:
    m x its time per micro-batch; the rest of it the stage waits for its neighbours (the
    pipeline's fill and drain, a lighter stage's slack), blocked, off the cores."""
    from simdist.analytic.steptime import stage_time

    return [min(1.0, d.plan.num_microbatches * stage_time(d, s).total / step_s) for s in d.stages]


def competing_ranks(d: Any, step_s: float) -> float:
    """Ranks that compete for the cores at a sync point (simdist.analytic.cpu_syncs: a peer is
    descheduled with probability 1 - cores / these) of the busiest pipeline stage: its own ranks,
    and those of every other stage for its share of the step (:func:`_stage_shares`). All the
    ranks without a pipeline; with many micro-batches, a stage's share tends to its time over the
    busiest's."""
    plan = d.plan
    if plan.pp == 1 or step_s <= 0:
        return float(busy_ranks(d.scenario))
    shares = _stage_shares(d, step_s)
    if max(shares) <= 0:
        return float(busy_ranks(d.scenario))
    return busy_ranks(d.scenario) / plan.pp * (1.0 + sum(shares) - max(shares))  # the busiest: all its step
