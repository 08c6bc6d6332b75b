"""Fit a profile's executor terms phase by phase, from what each run measured per phase.

A run's step time mixes compute, the optimizer and communication; one per-op overhead fitted
to the step has to absorb all three, so it prices large ops and small ops, plain and DTensor
ones, wrongly (a fit that hits its own runs misses the next shape). The executor measures the
phases (forward, backward, optimizer, exposed communication), and each depends linearly on one
group of terms, so each is fitted on its own phase by least squares on relative error:

- forward + backward of the plain runs: ``rate / s + ops x overhead``, the kernels' rate
  relative to the microbenchmarks' (``compute_scale`` s: a training loop's caches are colder
  and its ops interleave) and the per-op dispatch cost (``kernel_overhead_s``). Runs of large
  ops pin s, runs of small ops the overhead;
- the optimizer phase: ``bytes / bandwidth + tensors x per-tensor cost`` (simdist.analytic.
  cpu_optimizer: PyTorch's CPU optimizers loop over tensors);
- each software layer then adds its own per-op cost to forward + backward and its own
  per-tensor cost to the optimizer (DTensor dispatch), fitted on that layer's runs with the
  plain terms held, and its own waits (comm + core wait) from those of its runs whose ranks
  have a core each;
- the same runs (and the plain ones) give the share of the layer's communication during which
  the rank sleeps (``sleep_shares``: neither its training thread nor its other threads on a
  core), which ranks that time-share the cores give to each other (simdist.analytic.timeshare);
- last, runs with more ranks than cores fit the wait at a sync point whose peers are
  descheduled (simdist.analytic.cpu_syncs) on their step times.

Each model quantity's dependence on a term is found by probing: the prediction with the term
at 0 and at a small value (the model is linear in each of them), so the fit needs no second
copy of the cost model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from simdist.analytic.profile_terms import SPLIT_LAYER
from simdist.spec.profile import CalibrationProfile
from simdist.spec.software_layers import BASE_TERMS

PROBE_S = 1e-4  # the probe value of a per-op or per-tensor term (s)
SCALE_RANGE = (0.2, 5.0)  # executor rate / microbenchmark rate a fit may find


def compute_s(predicted: dict[str, float]) -> float:
    return predicted.get("forward_s", 0.0) + predicted.get("backward_s", 0.0)


def comm_s(predicted: dict[str, float]) -> float:
    return predicted.get("comm_s", 0.0)


def measured_compute(m: dict[str, float]) -> float:
    """The training thread's CPU time outside the optimizer step: forward, backward and the rest
    of the step around them (the loss, data, zero_grad: ``other``), which the model prices as
    forward and backward."""
    return m.get("forward_s", 0.0) + m.get("backward_s", 0.0) + m.get("other_s", 0.0)


def measured_waits(m: dict[str, float], symmetric: bool = False) -> float | None:
    """The step's wall time the training thread did not compute: waiting for peers (``comm``)
    and for a core (``core_wait``: on gloo, the collectives' own threads take the cores). The
    executor's step is its slowest rank's while the phases are the ranks' means, so where the
    ranks do the same work (``symmetric``: no pipeline) the waits are what the step leaves beyond
    the computing phases, when that is more: the slowest rank waited for the others' jitter too.
    (A pipeline's ranks differ by design, and the model prices its busiest stage and the bubble
    itself: its step less the stages' mean phases is not a wait.)"""
    if m.get("comm_s") is None:
        return None
    waited = m["comm_s"] + m.get("core_wait_s", 0.0)
    if m.get("step_time_s") is None or not symmetric:
        return waited
    return max(waited, m["step_time_s"] - measured_compute(m) - m.get("optimizer_s", 0.0))


def optimizer_s(predicted: dict[str, float]) -> float:
    return predicted.get("optimizer_s", 0.0)


def probe(run: Any, profile: CalibrationProfile, quantity: Callable[[dict[str, float]], float],
          setting: Callable[[CalibrationProfile, float], CalibrationProfile]) -> tuple[float, float]:
    """(``quantity`` predicted with the term at 0, its growth per second of the term), from two
    probes above 0: a layer's term sums with the others' before the model holds the sum at or
    above zero (a layer may be cheaper than plain DDP), so the line through two positive probes,
    extended to 0, is the linear model the fit solves even where another layer's term is below
    zero (the model is linear in each term above that kink)."""
    at1 = quantity(run.predicted(setting(profile, PROBE_S)))
    at2 = quantity(run.predicted(setting(profile, 2 * PROBE_S)))
    slope = (at2 - at1) / PROBE_S
    return at1 - slope * PROBE_S, slope


def cpu_time(setting: Callable[[CalibrationProfile, float], CalibrationProfile]
             ) -> Callable[[CalibrationProfile, float], CalibrationProfile]:
    """``setting`` on the profile without its cores: the forward, backward and optimizer phases
    are the training thread's CPU time, which time-sharing the cores does not stretch (the wait
    for a core is measured apart), so they are compared with the unshared prediction."""
    return lambda p, v: replace(setting(p, v), cores=0)


def one_term(rows: Sequence[tuple[float, float, float]], low: float = 0.0) -> float:
    """The value v >= ``low`` minimising sum(((a + k v) / m - 1)^2) over rows (measured m, model
    at v = 0 a, slope k): least squares on relative error."""
    num = sum(k * (m - a) / m ** 2 for m, a, k in rows if m > 0)
    den = sum((k / m) ** 2 for m, a, k in rows if m > 0)
    return max(low, num / den) if den > 0 else 0.0


def two_terms(rows: Sequence[tuple[float, float, float]]) -> tuple[float, float]:
    """(x, v) minimising sum(((x r + k v) / m - 1)^2) over rows (measured m, rate part r, slope k),
    both >= 0; one row, or rows that cannot tell x from v, keep x = 1."""
    import numpy as np

    good = [(m, r, k) for m, r, k in rows if m > 0]
    if len(good) >= 2:
        design = np.array([[r / m, k / m] for m, r, k in good])
        (x, v), *_ = np.linalg.lstsq(design, np.ones(len(good)), rcond=None)
        if x > 0 and v >= 0 and np.linalg.matrix_rank(design) == 2:
            return float(x), float(v)
    return 1.0, one_term([(m, r, k) for m, r, k in good])


def _overhead(p: CalibrationProfile, v: float) -> CalibrationProfile:
    return replace(p, kernel_overhead_s=v)


def _optimizer(p: CalibrationProfile, v: float) -> CalibrationProfile:
    return replace(p, optimizer_tensor_s=v)


def at_rate(profile: CalibrationProfile, s: float) -> CalibrationProfile:
    """``profile`` with its kernels ``s`` times as fast (:meth:`CalibrationProfile.kernels_at`),
    with ``compute_scale`` recording it (``at_rate(p, 1 / p.compute_scale)`` is the
    microbenchmarks' own rate)."""
    return replace(profile.kernels_at(s), compute_scale=profile.compute_scale * s)


def fit_plain(profile: CalibrationProfile, runs: Sequence[Any]) -> CalibrationProfile:
    """The compute scale and per-op overhead (forward + backward) and the per-tensor optimizer
    cost (optimizer phase) from runs through no software layer."""
    rows = []
    for r in runs:
        rate, ops = probe(r, profile, compute_s, cpu_time(_overhead))
        rows.append((measured_compute(r.measured()), rate, ops))
    x, overhead = two_terms(rows)
    s = min(max(1.0 / x, SCALE_RANGE[0]), SCALE_RANGE[1])
    profile = replace(at_rate(profile, s), kernel_overhead_s=overhead)
    opt = [(r.measured().get("optimizer_s", 0.0), *probe(r, profile, optimizer_s, cpu_time(_optimizer))) for r in runs
           if r.measured().get("optimizer_s") is not None]
    return replace(profile, optimizer_tensor_s=one_term(opt))


def fit_layer(profile: CalibrationProfile, layer: str, runs: Sequence[Any]) -> CalibrationProfile:
    """A software layer's extra per-op cost (forward + backward) and per-tensor optimizer cost
    from runs that add only that layer to the terms fitted so far."""
    def op(p: CalibrationProfile, v: float) -> CalibrationProfile:
        return replace(p, framework_overheads_s={**p.framework_overheads_s, layer: v})

    def tensor(p: CalibrationProfile, v: float) -> CalibrationProfile:
        return replace(p, optimizer_layer_tensor_s={**p.optimizer_layer_tensor_s, layer: v})

    # a layer may cost less per op than plain DDP (a communication hook or a parameter server
    # takes over the work DDP's reducer does on the training thread), never less than nothing;
    # the split backward's traversals only add work (simdist.analytic.profile_terms.split_weight_pass_s)
    measured = [r.measured() for r in runs]
    rows = [(measured_compute(m), *probe(r, profile, compute_s, cpu_time(op)))
            for r, m in zip(runs, measured, strict=True)]
    low = 0.0 if layer == SPLIT_LAYER else -_sum_others(profile.kernel_overhead_s, profile.framework_overheads_s,
                                                        layer, runs)
    profile = op(profile, one_term(rows, low=low))
    if profile.optimizer_tensor_s is not None:
        rows = [(m["optimizer_s"], *probe(r, profile, optimizer_s, cpu_time(tensor)))
                for r, m in zip(runs, measured, strict=True) if m.get("optimizer_s") is not None]
        profile = tensor(profile, one_term(rows, low=-_sum_others(profile.optimizer_tensor_s,
                                                                   profile.optimizer_layer_tensor_s, layer, runs)))
    return profile


def _sum_others(base: float | None, per_layer: dict[str, float], layer: str, runs: Sequence[Any]) -> float:
    """The smallest per-op (or per-tensor) cost the runs' other terms give: how far below zero
    ``layer``'s own term may go."""
    others = [(base or 0.0) + sum(per_layer.get(k, 0.0) for k in r.layers if k != layer) for r in runs]
    return max(0.0, min(others, default=0.0))


def fit_waits(profile: CalibrationProfile, key: str, runs: Sequence[Any]) -> CalibrationProfile:
    """The waits at the sync points of ``key``'s plans beyond what the model already prices
    (collectives, bubbles, the waits fitted before), from the wall time the runs did not
    compute: a share of the compute since the previous sync point (``sync_wait_fractions[key]``)
    and a fixed wait per collective call of the layer's op lists (``sync_point_waits_s[key]``;
    for the plain plans' key, :data:`BASE_TERMS`, once a step at the gradient sync:
    ``dp_step_wait_s``).
    Runs of few large collectives and of many small ones tell the two apart; runs that cannot
    (one run, or a layer without collectives in its op lists) fit the share alone."""
    def setting(fraction: float, per_call: float) -> CalibrationProfile:
        p = replace(profile, sync_wait_fractions={**profile.sync_wait_fractions, key: fraction})
        if key == BASE_TERMS:  # the plain plans' collectives are the gradient sync's (profile v5)
            return replace(p, dp_step_wait_s=per_call)
        return replace(p, sync_point_waits_s={**profile.sync_point_waits_s, key: per_call})

    rows, noise = [], []
    for r in runs:
        measured = r.measured()
        m = measured_waits(measured, symmetric=r.scenario.plan.pp == 1 or r.busiest_rank_phases)
        if m is not None:
            at0 = comm_s(r.predicted(setting(0.0, 0.0)))
            rows.append((m, at0, (comm_s(r.predicted(setting(PROBE_S, 0.0))) - at0) / PROBE_S,
                         (comm_s(r.predicted(setting(0.0, PROBE_S))) - at0) / PROBE_S))
            noise.append(r.repeated.median_error)
    if not rows:
        return profile
    fraction, per_call = two_slopes(rows)
    if not measured_beyond_noise(rows, noise, fraction, per_call):
        fraction = per_call = 0.0
    profile = setting(fraction, per_call)
    if not per_call and key != BASE_TERMS:  # keep the profile's dict to the layers that have a per-call wait
        profile = replace(profile, sync_point_waits_s={k: v for k, v in profile.sync_point_waits_s.items() if k != key})
    return profile


def measured_beyond_noise(rows: Sequence[tuple[float, float, float, float]], noise: Sequence[float],
                          fraction: float, per_call: float) -> bool:
    """Whether the waits fitted add more to some run than that run's own noise, the uncertainty
    of its median step (:meth:`simdist.calibrate.repeat.Repeated.median_error`): a term smaller
    than every run's noise is not measured, only fitted to the noise, and it would carry that
    noise to plans of other sizes (a share of compute fitted on a 10 ms step that jitters by half
    of itself priced a 0.4 s pipeline step 25% slow). The whole spread would be too strict: one
    noisy plain run of four dropped the 0.9 ms gradient-sync wait that a 10 ms DDP step pays
    (tiny-ddp -17% held out, -5% with it). Rows as :func:`two_slopes`'s."""
    return any(j * fraction + k * per_call > n for (_, _, j, k), n in zip(rows, noise, strict=True))


def two_slopes(rows: Sequence[tuple[float, float, float, float]]) -> tuple[float, float]:
    """(a, b) >= 0 minimising sum(((c + j a + k b) / m - 1)^2) over rows (measured m, model at
    a = b = 0 c, slopes j and k): least squares on relative error; b = 0 where the rows cannot
    tell a from b (one row, or no row depends on b)."""
    import numpy as np

    good = [(m, c, j, k) for m, c, j, k in rows if m > 0]
    alone = one_term([(m, c, j) for m, c, j, _ in good])

    def cost(a: float, b: float) -> float:
        return sum(((c + j * a + k * b) / m - 1) ** 2 for m, c, j, k in good)

    design = np.array([[j / m, k / m] for m, _, j, k in good]) if good else np.zeros((0, 2))
    if len(good) < 2 or np.linalg.matrix_rank(design) < 2:
        return alone, 0.0
    (a, b), *_ = np.linalg.lstsq(design, np.array([(m - c) / m for m, c, _, _ in good]), rcond=None)
    options = [(alone, 0.0), (0.0, one_term([(m, c, k) for m, c, _, k in good]))]
    if a >= 0 and b >= 0:
        options.append((float(a), float(b)))
    return min(options, key=lambda o: cost(*o))


def fit_sleep(profile: CalibrationProfile, layer: str, runs: Sequence[Any]) -> CalibrationProfile:
    """The share of ``layer``'s communication a rank sleeps at full speed (``sleep_shares``),
    from runs whose ranks have a core each: the wall time that neither the training thread
    (``comm`` already leaves out its CPU time and its wait for a core) nor the process's other
    threads (``helper_threads``: gloo's, moving the collectives' data) spent on a core, over the
    communication the fitted profile prices for the runs, summed over the runs. Runs measured
    before the executor recorded the other threads' CPU time leave it unfitted."""
    slept = priced = 0.0
    for r in runs:
        m = r.measured()
        if m.get("comm_s") is None or m.get("helper_threads_s") is None:
            continue
        slept += max(0.0, m["comm_s"] - m["helper_threads_s"])
        priced += comm_s(r.predicted(profile))
    if priced <= 0:
        return profile
    return replace(profile, sleep_shares={**profile.sleep_shares, layer: min(1.0, slept / priced)})


def fit_coschedule(profile: CalibrationProfile, runs: Sequence[Any]) -> CalibrationProfile:
    """The wait at a sync point whose peers are descheduled (``coschedule_wait_s``,
    simdist.analytic.cpu_syncs), from the step times of runs with more ranks than cores, every
    other term held."""
    def wait(p: CalibrationProfile, v: float) -> CalibrationProfile:
        return replace(p, coschedule_wait_s=v)

    rows = [(r.repeated.median, *probe(r, profile, lambda q: q["step_time_s"], wait)) for r in runs]
    return wait(profile, one_term(rows))
