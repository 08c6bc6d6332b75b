"""More ranks than cores: the profile a time-shared run sees (a CPU calibration profile only).

Ranks beyond the cores share them; each waits for a core while the others compute. When every
rank is runnable, each gets cores/ranks of one, and everything it does on the CPU stretches by
ranks/cores (:meth:`simdist.spec.profile.CalibrationProfile.time_share`, relative to the share
the profile was fitted at). But a rank that waits (a pipeline bubble, the wait at a sync point
for a slower peer) blocks and gives its core to the others, so idle time is not stretched: it
fills with other ranks' work. So the step takes the larger of

- the full-speed step (a prediction with the profile as fitted), and
- the work that has to share the cores: ranks/cores x each rank's busy time, where busy is the
  full-speed step less its idle parts (the pipeline bubble and the sync-point waits; on gloo
  the collectives themselves are CPU work, copies and reductions, so they count as busy).

(The processor-sharing view of a CPU-bound parallel program: the step is bounded below by its
total CPU demand over the cores and by its critical path.) To that come the waits at the sync
points whose peers the scheduler has not running (simdist.analytic.cpu_syncs), when the
profile fitted them, counting the ranks that compete for the cores (:func:`competing_ranks`: a
pipeline stage computes m x its time per micro-batch of the step and waits for its neighbours,
off the cores, the rest of it). The factor that maps the full-speed
step to that time is applied to the whole profile (:meth:`CalibrationProfile.slowed`), so the
breakdown and the timeline stay consistent with the step time.

Measured on the shared 2-core machine this was written on, 4- and 8-rank runs took 1.0-1.6 x
(the training threads' CPU time summed over ranks) / (the cores other processes left free): the
excess is what gloo's own threads compute, which the collectives' cost above accounts for. Much
of it was gloo's transport thread spinning on a connection's lock (executor.hostload.
idle_transport_threads); since the executor runs those threads under the idle policy the
time-shared plans run 20-50% faster, and a transfer progresses only while some rank blocks,
which the waits above, fitted per sync point, price only roughly (benchmarks/README.md).
"""

from __future__ import annotations

from typing import Any

from simdist.spec.profile import CalibrationProfile, busy_ranks, wait_keys


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
    b = full.breakdown
    waits = sum(profile.sync_wait_fractions.get(k, 0.0) for k in wait_keys(scenario.plan))
    idle = b.get("bubble", 0.0) + waits * (b.get("compute", 0.0) + b.get("recompute", 0.0))
    idle += latency_part(scenario, profile, full.step_time, b.get("bubble", 0.0))
    busy = max(0.0, full.step_time - idle)
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


def latency_part(scenario: Any, profile: CalibrationProfile, step_time: float, bubble: float) -> float:
    """The part of the full-speed step that is the links' latency and the profile's fixed wait
    per collective call (the step less the same step on links without latency, without those
    waits), outside the pipeline bubble (``bubble``: the full step's; the caller counts it
    whole, and the latencies lengthen it too): on gloo a rank sleeps in the transport for them,
    its core free for another rank, while the bandwidth part (copies, reductions) is CPU work."""
    from dataclasses import replace

    from simdist.analytic.collectives import Network
    from simdist.analytic.cost import CostModel
    from simdist.analytic.stage import describe
    from simdist.analytic.steptime import reduce_step
    from simdist.spec.profile import LinkFit

    quick = replace(profile, links={k: LinkFit(latency_s=0.0, bandwidth_bytes_per_s=v.bandwidth_bytes_per_s)
                                    for k, v in profile.links.items()}, sync_point_waits_s={},
                    dp_step_wait_s=0.0)
    cluster = scenario.cluster
    no_latency = reduce_step(describe(scenario, CostModel(cluster.gpu, scenario.plan.precision, quick),
                                      Network.of(cluster, quick)))
    # outside the bubble, which the caller counts whole (a shorter stage also shortens the bubble)
    return max(0.0, (step_time - bubble) - (no_latency.step_time - no_latency.breakdown.get("bubble", 0.0)))
