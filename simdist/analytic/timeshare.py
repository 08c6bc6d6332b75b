"""More ranks than cores: the profile a time-shared run sees (a CPU calibration profile only).

Ranks beyond the cores share them; each waits for a core while the others compute. When every
rank is runnable, each gets cores/ranks of one, and everything it does on the CPU stretches by
ranks/cores (:meth:`simdist.spec.profile.CalibrationProfile.time_share`, relative to the share
the profile was fitted at). A pipeline stage in its bubble waits for its neighbour's
activations or gradients, blocked, and gives its core to the stages that compute then, so the
bubble is not stretched: it fills with other stages' work. So the step takes the larger of

- the full-speed step (a prediction with the profile as fitted), and
- the work that has to share the cores: ranks/cores x each rank's busy time, the full-speed
  step less its pipeline bubble.

(The processor-sharing view of a CPU-bound parallel program: the step is bounded below by its
total CPU demand over the cores and by its critical path.) The rest of a rank's step at full
speed, its collectives and the waits at their sync points, is CPU work on gloo: the copies and
reductions, the transport threads' reads and writes and the kernel's loopback TCP. Measured on
the 2-core machine this was written on (``tools/cores_busy.py``: ``/proc/stat`` over steady
steps, 2026-11-28), the cores were 79-89% busy with 2 ranks (tiny-llama-tp, tiny-fsdp3,
tiny-moe-ep, tiny-ddp: far more than the training threads' own 48-90%), 89-93% with 4 ranks
(tiny-hsdp, tiny-moe-ep-dp, tiny-2d-tp-dp) and 96-97% with 8 (tiny-3d): the waits of the 2-rank
step were not time the cores could give to other ranks. (Before the executor ran gloo's
transport threads under the idle policy, executor.hostload.idle_transport_threads, the model
let the sync-point waits and the links' latency fill with other ranks' work too; over four
fresh calibration runs since, that held 15 of 36 time-shared held-out predictions within 15%,
this 23; benchmarks/README.md.) Where it errs: tiny-3d (8 ranks) is predicted 27-51% too slow,
and tiny-2d-tp-dp 21-35% in the runs since its optimizer is priced as it runs (local shards under
DDP, simdist.analytic.cpu_optimizer): data-parallel replicas of a TP group fill each other's
waits, and each rank's CPU demand is less than the full-speed step less its bubble (63 ms of
a 93 ms step there; measured with one TP group alone, 81 ms of 104). A pipeline's stages and
FSDP's shard groups do not fill them so (tiny-2d-pp-tp, tiny-hsdp within 2-10%). Which waits
fill, per plan kind, is not priced yet; the executor records what it needs (the training
thread's CPU time and its process's other threads', ``phases_s.helper_threads``).

To that come the waits at the sync points whose peers the scheduler has not running
(simdist.analytic.cpu_syncs), when the profile fitted them, counting the ranks that compete for
the cores (:func:`competing_ranks`: a pipeline stage computes m x its time per micro-batch of
the step and waits for its neighbours, off the cores, the rest of it). The factor that maps the
full-speed step to that time is applied to the whole profile (:meth:`CalibrationProfile.slowed`),
so the breakdown and the timeline stay consistent with the step time.
"""

from __future__ import annotations

from typing import Any

from simdist.spec.profile import CalibrationProfile, busy_ranks


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
    busy = max(0.0, full.step_time - full.breakdown.get("bubble", 0.0))
    if full.step_time <= 0:
        return profile.slowed(share), share
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


def competing_ranks(d: Any, step_s: float) -> float:
    """Ranks that compete for the cores at a sync point (simdist.analytic.cpu_syncs: a peer is
    descheduled with probability 1 - cores / these) of the busiest pipeline stage: its own ranks,
    and those of every other stage for the share of the step (``step_s``, at full speed) that
    stage computes, m x its time per micro-batch; the rest of its step it waits for its
    neighbours (the pipeline's fill and drain, a lighter stage's slack), blocked, off the cores.
    All the ranks without a pipeline; with many micro-batches, a stage's share tends to its time
    over the busiest's."""
    from simdist.analytic.steptime import stage_time

    plan = d.plan
    totals = [stage_time(d, s).total for s in d.stages]
    top = max(totals)
    if plan.pp == 1 or top <= 0 or step_s <= 0:
        return float(busy_ranks(d.scenario))
    shares = [min(1.0, plan.num_microbatches * t / step_s) for t in totals]
    return busy_ranks(d.scenario) / plan.pp * (1.0 + sum(shares) - max(shares))  # the busiest: all its step
