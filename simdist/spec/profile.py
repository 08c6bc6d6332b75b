"""CalibrationProfile: fitted compute efficiencies and link parameters (versioned JSON).

A profile replaces the catalog's starting efficiencies for the hardware it was measured on.
Compute curves give efficiency (fraction of the device's peak FLOP/s or memory bandwidth) as a
function of op size (FLOPs for GEMM/attention, bytes for memory-bound ops), interpolated in
log-size; link entries give latency and achieved bandwidth per link kind.

Version 2 adds what makes a profile honest about itself and about the machine it describes:

- ``cores`` and ``ranks``: the CPU cores the ranks could run on (``os.sched_getaffinity``) and
  how many ranks the microbenchmarks ran at once. Ranks beyond the cores time-share them
  (:meth:`CalibrationProfile.time_share`): a run of more ranks than cores is priced from a
  profile fitted with fewer (:mod:`simdist.analytic.timeshare`);
- ``spreads`` and ``core_waits`` of the executor runs it was fitted on (run-to-run spread of
  the step medians, and the fraction of each step the ranks waited for a core), and
  ``error_band``: the relative error band ``simdist predict --profile`` prints;
- ``gemm_shapes`` and ``bus_bandwidth``: a GPU's GEMM efficiency by (m, n, k) and the
  collectives' bus bandwidth by message size (``executor.bench`` on CUDA).

Version 3 adds what the executor runs measured beside the microbenchmarks, phase by phase
(simdist.calibrate.phases): ``compute_scale``, the rate the training loop's kernels achieved
relative to the microbenchmarks' (already applied to ``peak_flops`` and the memory bandwidth,
kept for the record), and the optimizer's cost per parameter tensor (``optimizer_tensor_s``,
plus ``optimizer_layer_tensor_s`` per software layer: DTensor's dispatch on TP and FSDP2
parameters), which replaces a fixed kernel count when set, and ``coschedule_wait_s``, the wait
at a sync point of ranks that time-share the cores (simdist.analytic.cpu_syncs).

Version 4 splits the waits at a layer's sync points in two (``sync_point_waits_s``): besides
the share of the compute since the previous sync point (``sync_wait_fractions``: the ranks'
compute jitters in proportion to its length), a fixed wait per collective call (on gloo the
caller sleeps until the process group's thread wakes it: Hoefler et al. SC'10's fixed part of
the noise). Many small TP collectives pay mostly the second, few large ones mostly the first.

Version 5 adds a fixed wait for the data-parallel gradient sync (``dp_step_wait_s``): once a
step, where the training thread blocks on the step's gradient synchronisation (DDP's reducer,
ZeRO-1's and the compression hooks' syncs), it waits a fixed time beyond the transfers: a tiny
model and a large one pay the same few milliseconds there (Hoefler et al. SC'10's fixed part).

Version 6 adds the host's speed during the fit runs (``reference_cpu_s`` and
``reference_ops_cpu_s``: the median over them of the CPU time two fixed workloads took on each
rank, executor.hostspeed.reference_cpu_s), so that a measurement made later on a slower or faster
host is told apart from a wrong prediction (:class:`HostSpeed`, simdist.calibrate.honesty).

Version 7 adds, per software layer, the share of its communication a rank sleeps at full speed
(``sleep_shares``): the part of the time the model prices for the layer's collectives during
which neither the rank's training thread nor its other threads (gloo's) run, measured on the
layer's fit runs with a core per rank (step - training-thread CPU - other threads' CPU - wait
for a core, over the model's communication time); since 2026-12-07 also for the plain plans
(``base``). Ranks that time-share the cores give that time to each other
(:mod:`simdist.analytic.timeshare`).

Version 8 gives zero-bubble's split backward its own layer, "split_backward" (an older file's
"multichunk" terms carry over to it), and adds a CPU's curve of copies out of the cache
(``compute_curves["memory.cold"]``, FSDP2's copies) and its top-k selection rate (``select_rates``:
:func:`simdist.analytic.compression.topk_selection_time`).

Version 9 times top-k at three kept shares (``select_rates`` rows of (elements, share, seconds
per element)): torch heap-selects a share of at most 1/64 (:mod:`simdist.spec.selection`).
Version 10 adds the host's scheduler tick (``scheduler_tick_s``, :mod:`simdist.analytic.transport_wake`).

Version 11 adds what a CPU's GEMM pays to fetch its weight from memory, by the weight's size
(``weight_fetch_s``: executor.bench.bench_cold_gemm), and the last-level cache the ranks share
(``llc_bytes``), which holds the weights while the ranks' working sets fit in it
(:mod:`simdist.analytic.cache_residency`).

Version 12 keeps the host's speed during the fit runs by how many processes ran at once
(``reference_by_processes``): ranks that time-share the cores take more CPU time for the same
work (the reference workloads took 3-4% more with 4 ranks on 2 cores, 9-11% more with 8, in the
calibrations of 2026-11-29; likely each switch between ranks on a core evicting the other's cached
data), so a measurement is held
against fit runs of its own process count, or the nearest (:meth:`CalibrationProfile.host_speed_for`).

Version 13 adds a CPU's rate for the pointwise ops that compute rather than stream
(``pointwise_s``: seconds per element of GELU, SwiGLU, LayerNorm, RMSNorm and the cross entropy,
forward and backward; executor.bench.bench_pointwise): one thread evaluates erf, exp and the
norms' reductions at 0.3-1 ns per element (2-core EPYC, 2026-11-30), several times what streaming
the bytes through the cache costs (:meth:`simdist.analytic.cost.CostModel.pointwise_time`).

Version 14 adds what DDP's reducer costs a CPU's training thread in the backward that synchronises
the gradients, per gradient tensor and per gradient byte (``ddp_reducer_tensor_s``,
``ddp_reducer_byte_s``: executor.bench_reducer; simdist.analytic.reducer).

Versions 1 to 13 still load (the new fields take their defaults: no cores known, no band, no optimizer
term, no per-call wait, no host speed, no sleep shares, no selection rate, no tick, no weight
fetch, no host speed by process count, no pointwise rates, no reducer cost; version 8's rows kept 5%).
"""

from __future__ import annotations

import math
from dataclasses import asdict, field, replace
from pathlib import Path
from typing import Any

from simdist.errors import Problem, ScenarioError
from simdist.frozen import frozen
from simdist.spec.curves import log_interpolated
from simdist.spec.files import read_json_object, write_json_atomic
from simdist.spec.selection import OLD_SHARE, select_seconds
from simdist.spec.software_layers import LAYER_TERMS, RELATIVE_TERMS

PROFILE_VERSION = 14
READABLE_VERSIONS = tuple(range(1, PROFILE_VERSION + 1))


@frozen
class HostSpeed:
    """The host's speed during runs: the CPU time (s) of the executor's two reference workloads
    (executor.hostspeed.reference_cpu_s): GEMMs, and many small ops with their autograd; 0 = not
    measured."""

    gemm: float = 0.0
    ops: float = 0.0

    def drift(self, baseline: HostSpeed) -> float:
        """How much slower (> 0) or faster (< 0) the host ran than at ``baseline``: the workload
        whose CPU time moved most, its ratio less 1; 0 when no workload was measured on both sides."""
        return max(self._ratios(baseline), key=abs, default=0.0)

    def slower_than(self, baseline: HostSpeed) -> float:
        """How much slower the host ran than at ``baseline`` by its slower workload (a ratio less 1,
        below 0 when both ran faster); 0 when no workload was measured on both sides."""
        return max(self._ratios(baseline), default=0.0)

    def _ratios(self, baseline: HostSpeed) -> list[float]:
        """Each workload measured on both sides: its CPU time here over ``baseline``'s, less 1."""
        return [a / b - 1.0 for a, b in ((self.gemm, baseline.gemm), (self.ops, baseline.ops)) if a > 0 and b > 0]

    def describe(self) -> str:
        return f"GEMMs {self.gemm * 1e3:.2f} ms, small ops {self.ops * 1e3:.2f} ms"


UNKNOWN_SPEED = HostSpeed()


@frozen(kw_only=True)
class LinkFit:
    latency_s: float
    bandwidth_bytes_per_s: float  # achieved bus bandwidth (nccl-tests' busbw sense)


@frozen(kw_only=True)
class CalibrationProfile:
    version: int = PROFILE_VERSION
    device: str  # e.g. "cpu (2 cores)", "NVIDIA H100 80GB HBM3"
    backend: str = ""
    peak_flops: float = 0.0  # per precision not needed: a profile is for one precision
    memory_bandwidth_bytes_per_s: float = 0.0
    # op kind -> sorted [(size, efficiency)] points; size = FLOPs (gemm, attention) or bytes
    compute_curves: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    kernel_overhead_s: float | None = None
    # extra framework time per compute op for plans that run through a software layer the
    # plain run does not ("tp": DTensor dispatch of tensor-parallel plans, "zero3": FSDP2's
    # sharded-parameter hooks), fitted from executor runs of such plans
    framework_overheads_s: dict[str, float] = field(default_factory=dict)
    # the same layers' waits at their per-layer synchronisation points (each TP collective, each
    # FSDP parameter gather), as a fraction of the compute since the previous one: the ranks'
    # compute jitters independently, and a collective starts when the last rank arrives
    # (Hoefler et al. SC'10, "Characterizing the influence of system noise"). Fitted from the
    # exposed-communication phase of executor runs; 0 (none) on profiles without such runs
    sync_wait_fractions: dict[str, float] = field(default_factory=dict)
    links: dict[str, LinkFit] = field(default_factory=dict)  # "intra" / "inter" / link kind
    fitted_from: list[str] = field(default_factory=list)
    residuals: dict[str, float] = field(default_factory=dict)  # e.g. rms relative error per fit
    created: str = ""
    torch_version: str = ""
    # v2: the machine and the honesty of the fit (module docstring)
    cores: int = 0  # CPU cores the ranks could use at calibration time; 0 = not a CPU profile / unknown
    ranks: int = 0  # ranks the microbenchmarks ran at once
    spreads: dict[str, float] = field(default_factory=dict)  # fitted run -> (max - min) / median of its medians
    core_waits: dict[str, float] = field(default_factory=dict)  # fitted run -> share of the step waiting for a core
    error_band: float = 0.0  # relative: the largest fitted-run spread or residual
    # program (plan kind) -> software-layer terms fitted from it, for the record ("tp": "local-tp-fit")
    terms_from: dict[str, str] = field(default_factory=dict)
    gemm_shapes: list[tuple[int, int, int, float]] = field(default_factory=list)  # (m, n, k, efficiency)
    bus_bandwidth: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # kind -> [(bytes, busbw)]
    # v3: phase-resolved executor terms (module docstring)
    compute_scale: float = 1.0  # executor kernels' rate / the microbenchmarks' (applied to the peaks)
    optimizer_tensor_s: float | None = None  # optimizer seconds per parameter tensor per step (None: not fitted)
    optimizer_layer_tensor_s: dict[str, float] = field(default_factory=dict)  # software layer -> extra s/tensor
    # wait at one sync point whose peers are descheduled, with more ranks than cores (simdist.analytic.cpu_syncs)
    coschedule_wait_s: float = 0.0
    # v4: software layer -> wait per collective call of its op lists (module docstring), beside the fraction
    sync_point_waits_s: dict[str, float] = field(default_factory=dict)
    # v5: wait once a step at the data-parallel gradient sync (module docstring), fitted on the plain plans
    dp_step_wait_s: float = 0.0
    # v6: the host's speed during the fit runs (module docstring): GEMMs, small ops; 0 = not measured
    reference_cpu_s: float = 0.0
    reference_ops_cpu_s: float = 0.0
    # v12: the same by the processes that ran at once: "4" -> (GEMMs, small ops) (module docstring)
    reference_by_processes: dict[str, tuple[float, float]] = field(default_factory=dict)
    # v7: software layer -> share of its communication a rank sleeps at full speed (module docstring)
    sleep_shares: dict[str, float] = field(default_factory=dict)
    # v8: top-k selection, (elements per call, share kept (v9), seconds per element) by size
    select_rates: list[tuple[float, float, float]] = field(default_factory=list)
    scheduler_tick_s: float = 0.0  # v10: the host kernel's tick (1 / HZ); 0 = not measured
    # v11: the last-level cache the ranks' cores share (0 = not measured), and what a GEMM pays to
    # fetch its weight from memory beyond it, [(weight bytes, seconds)] by size (none: not measured)
    llc_bytes: float = 0.0
    weight_fetch_s: list[tuple[float, float]] = field(default_factory=list)
    # v13: a CPU's pointwise ops by "<op> <pass>" ("gelu fwd", "layernorm bwd"): [(elements,
    # seconds per element)] by size
    pointwise_s: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    ddp_reducer_tensor_s: float = 0.0  # v14: DDP's reducer per gradient tensor (0 = not measured)
    ddp_reducer_byte_s: float = 0.0  # v14: and per gradient byte

    def pointwise_time(self, op: str, elements: float) -> float | None:
        """Seconds the pointwise ``op`` ("gelu fwd") computes ``elements`` in, at the measured rate
        of the nearest sizes (None where the profile has not measured it)."""
        points = self.pointwise_s.get(op)
        return elements * log_interpolated(points, elements) if points else None

    def weight_fetch(self, nbytes: float) -> float:
        """Seconds a GEMM pays to fetch a weight of ``nbytes`` from memory (0 if not measured)."""
        return log_interpolated(self.weight_fetch_s, nbytes) if self.weight_fetch_s else 0.0

    def select_time(self, elements: float, k: float) -> float | None:
        """Seconds to select the top ``k`` of one ``elements``-long tensor at the measured rates
        (simdist.spec.selection; None when the profile has none: fitted before version 8)."""
        return select_seconds(self.select_rates, elements, k)

    def efficiency(self, kind: str, size: float) -> float | None:
        """Interpolated efficiency for an op of ``kind`` and ``size``, or None if not fitted."""
        points = self.compute_curves.get(kind)
        if not points:
            return None
        if size <= points[0][0]:
            return _below_smallest(points, size)
        return log_interpolated(points, size)

    def time_share(self, processes: int) -> float:
        """How much slower each rank runs with ``processes`` ranks on the profiled machine than
        during calibration. Ranks beyond the cores share them: the scheduler gives each of R
        runnable single-threaded ranks C/R of a core (Linux CFS, "completely fair" by design),
        so a rank's CPU-bound work (compute, and on gloo its collectives' copies and reductions,
        which the CPU does) stretches by max(1, R/C); the microbenchmarks already ran at
        max(1, ranks/C). 1.0 when the profile does not know its cores (a GPU profile)."""
        if self.cores <= 0 or processes <= 0:
            return 1.0
        now = max(1.0, processes / self.cores)
        then = max(1.0, max(1, self.ranks) / self.cores)
        return now / then

    def kernels_at(self, speed: float) -> CalibrationProfile:
        """This profile with its kernels ``speed`` times as fast: the peaks and the memory
        bandwidth multiplied, the measured kernel times (a GEMM's weight fetch, top-k selection,
        the pointwise ops) divided. Every kernel rate is scaled here, once, for both readers: the
        executor's rate (simdist.calibrate.phases.at_rate) and time-shared cores (:meth:`slowed`)."""
        return replace(
            self,
            peak_flops=self.peak_flops * speed,
            memory_bandwidth_bytes_per_s=self.memory_bandwidth_bytes_per_s * speed,
            weight_fetch_s=[(b, t / speed) for b, t in self.weight_fetch_s],
            select_rates=[(n, share, r / speed) for n, share, r in self.select_rates],
            pointwise_s={k: [(n, r / speed) for n, r in v] for k, v in self.pointwise_s.items()},
        )

    def slowed(self, factor: float) -> CalibrationProfile:
        """This profile ``factor`` times slower: compute rates divided, per-op and latency terms
        multiplied, link bandwidths divided (how ranks that time-share the cores see it,
        :mod:`simdist.analytic.timeshare`). The sync-point waits are a fraction of compute, so
        they stretch with it; the per-call waits are times, and stretch like the latencies."""
        if factor == 1.0:
            return self
        s = factor
        return replace(
            self.kernels_at(1.0 / s),
            kernel_overhead_s=None if self.kernel_overhead_s is None else self.kernel_overhead_s * s,
            framework_overheads_s={k: v * s for k, v in self.framework_overheads_s.items()},
            optimizer_tensor_s=None if self.optimizer_tensor_s is None else self.optimizer_tensor_s * s,
            optimizer_layer_tensor_s={k: v * s for k, v in self.optimizer_layer_tensor_s.items()},
            ddp_reducer_tensor_s=self.ddp_reducer_tensor_s * s,
            ddp_reducer_byte_s=self.ddp_reducer_byte_s * s,
            sync_point_waits_s={k: v * s for k, v in self.sync_point_waits_s.items()},
            dp_step_wait_s=self.dp_step_wait_s * s,
            links={k: LinkFit(latency_s=v.latency_s * s, bandwidth_bytes_per_s=v.bandwidth_bytes_per_s / s)
                   for k, v in self.links.items()},
        )

    def band_text(self, step_time_s: float) -> str | None:
        """The error band of a step time predicted with this profile, as ``predict`` prints it
        (None when the profile has none: fitted before version 2, or from microbenchmarks only)."""
        if self.error_band <= 0:
            return None
        lo, hi = step_time_s * (1 - self.error_band), step_time_s * (1 + self.error_band)
        return (f"error band: step time {step_time_s:.4g} s +/-{self.error_band:.0%} ({lo:.4g} to {hi:.4g} s), the "
                f"largest run-to-run spread or fit residual of the {len(self.spreads)} run(s) the profile was fitted on")

    @property
    def host_speed(self) -> HostSpeed:
        """The host's speed during the fit runs."""
        return HostSpeed(self.reference_cpu_s, self.reference_ops_cpu_s)

    def host_speed_for(self, processes: int) -> HostSpeed:
        """The host's speed during the fit runs of ``processes`` processes at once, or of the
        recorded count nearest to it (by ratio; the larger on a tie); :attr:`host_speed` where
        the profile has none recorded (before version 12)."""
        if not self.reference_by_processes or processes <= 0:
            return self.host_speed
        near = min(self.reference_by_processes, key=lambda k: (abs(math.log(int(k) / processes)), -int(k)))
        return HostSpeed(*self.reference_by_processes[near])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CalibrationProfile:
        if d.get("version") not in READABLE_VERSIONS:
            raise ScenarioError(Problem("profile.version", f"{d.get('version')!r} is not supported "
                                        f"(this simdist reads versions {', '.join(map(str, READABLE_VERSIONS))})"))
        if d["version"] < 8:  # one "multichunk" layer priced zero-bubble's split backward too
            d = {**d, **{k: {**d[k], "split_backward": d[k]["multichunk"]} for k in LAYER_TERMS
                         if "multichunk" in (d.get(k) or {})}}
        d = {**d, "version": PROFILE_VERSION}
        d["links"] = {k: LinkFit(**v) for k, v in (d.get("links") or {}).items()}
        d["compute_curves"] = {k: [tuple(p) for p in v] for k, v in (d.get("compute_curves") or {}).items()}
        d["gemm_shapes"] = [tuple(p) for p in d.get("gemm_shapes") or []]
        d["weight_fetch_s"] = [tuple(p) for p in d.get("weight_fetch_s") or []]
        d["reference_by_processes"] = {k: tuple(v) for k, v in (d.get("reference_by_processes") or {}).items()}
        d["bus_bandwidth"] = {k: [tuple(p) for p in v] for k, v in (d.get("bus_bandwidth") or {}).items()}
        d["pointwise_s"] = {str(k): sorted(tuple(p) for p in v) for k, v in (d.get("pointwise_s") or {}).items()}
        d["select_rates"] = [(p[0], OLD_SHARE, p[1]) if len(p) == 2 else tuple(p) for p in d.get("select_rates") or []]
        return cls(**d)

    def save(self, path: str | Path) -> None:
        """Write atomically: whole or not at all."""
        write_json_atomic(path, self.to_dict())


def _below_smallest(points: list[tuple[float, float]], size: float) -> float:
    """Efficiency of an op smaller than the smallest measured: the op's time extrapolated along
    the line through the two smallest points (t = fixed + size / rate: below some size an op
    costs its launch and little else), not the smallest point's efficiency (which would make
    time shrink in proportion to size, to nothing)."""
    (s0, e0) = points[0]
    if len(points) < 2 or size >= s0 or e0 <= 0 or points[1][1] <= 0:
        return e0
    s1, e1 = points[1]
    t0, t1 = s0 / e0, s1 / e1  # times x peak
    slope = (t1 - t0) / (s1 - s0)
    fixed = t0 - slope * s0
    if slope <= 0 or fixed <= 0:
        return e0
    return max(size, 1.0) / (fixed + slope * max(size, 1.0))


def on_cpu(profile: CalibrationProfile | None) -> bool:
    """Whether ``profile`` was measured with gloo: the executor's CPU runs, one training thread
    per rank doing everything itself (no streams, no SMs, no queue of kernels)."""
    return profile is not None and profile.backend == "gloo"


def local_processes(scenario: Any) -> int:
    """Processes a run of ``scenario`` starts on one machine: every rank of a local cluster
    (its "nodes" are torchrun agents on this host), plus the parameter servers."""
    plan, cluster = scenario.plan, scenario.cluster
    servers = (plan.parameter_servers or cluster.num_nodes) if plan.uses_parameter_servers else 0
    return plan.world_size + servers


def busy_ranks(scenario: Any) -> int:
    """Processes of a run that compute at the same time, and so share the cores: every rank of
    the plan (in a pipeline the stages overlap in steady state). Parameter servers are left out:
    they update while their workers wait for the new parameters, and wait while they compute."""
    return scenario.plan.world_size


def load_profile(path: str | Path) -> CalibrationProfile:
    p = Path(path)
    data = read_json_object(p, "--profile")  # a regular file, bounded, a JSON object
    try:
        profile = CalibrationProfile.from_dict(data)
    except (TypeError, AttributeError, ValueError) as exc:  # a section of the wrong shape
        raise ScenarioError(Problem("--profile", f"{p} is not a calibration profile: {exc}")) from None
    bad = [f"--profile.{where}" for where, x in _numbers(profile.to_dict(), "")
           if isinstance(x, bool) or not math.isfinite(x) or (x < 0 and not where.startswith(RELATIVE_TERMS))]
    if bad:  # NaN or a negative speed would hang or invert the event engine
        raise ScenarioError([Problem(w, "must be a finite number >= 0") for w in bad[:10]])
    over = [f"--profile.sleep_shares.{k}" for k, v in profile.sleep_shares.items() if v > 1]
    if over:
        raise ScenarioError([Problem(w, "must be a share of the communication, at most 1") for w in over])
    bad = [f"--profile.reference_by_processes.{k}" for k, v in profile.reference_by_processes.items()
           if not (k.isdigit() and int(k) > 0 and len(v) == 2)]
    if bad:
        raise ScenarioError([Problem(w, "must be a process count (a whole number > 0) -> [GEMMs s, small ops s]")
                             for w in bad])
    bad = [f"--profile.pointwise_s.{k}" for k, v in profile.pointwise_s.items()
           if not (k.endswith((" fwd", " bwd")) and v and all(len(p) == 2 for p in v))]
    if bad:
        raise ScenarioError([Problem(w, "must be \"<op> fwd\" or \"<op> bwd\" -> [[elements, seconds per element], ...]")
                             for w in bad])
    return profile


def _numbers(x: Any, where: str) -> list[tuple[str, float]]:
    """Every number in a profile's dict, with its dotted place."""
    if isinstance(x, int | float):
        return [(where, x)]
    items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list | tuple) else ()
    return [n for k, v in items for n in _numbers(v, f"{where}.{k}" if where else str(k))]
