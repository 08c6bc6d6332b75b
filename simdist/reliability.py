"""Failures, checkpoints and goodput: how much of the wall-clock time advances training.

Checkpoint: the whole job's training state, written once per interval: every parameter's 16-bit
(or fp32) weight, its fp32 master copy and its optimizer states (not activations, not
gradients). Synchronous checkpointing stops training for size / checkpoint_bandwidth;
asynchronous checkpointing (PyTorch DCP async_save, Nebula, CheckFreq's snapshot/persist split,
Mohan et al. FAST'21) only pays the copy of each GPU's states to host memory over PCIe, and the
write proceeds in the background.

Failures: independent GPUs with exponential lifetimes, so the job's mean time between failures
is gpu_mtbf / number of GPUs (the series-system rule Kokolis et al. HPCA'25 use for their MTTF
projections, tests/data/validation/breadth.csv BR-E31..E35).

Optimal checkpoint interval (time computed between checkpoints):
  Young 1974 (CACM 17(9)):        tau = sqrt(2 C M)                       (breadth.csv BR-E37)
  Daly 2006 (FGCS 22(3), eq. 37): tau = sqrt(2 C M) [1 + sqrt(C/2M)/3 + (C/2M)/9] - C, C < 2M
                                   tau = M otherwise                       (breadth.csv BR-E38)
with C the time a checkpoint costs the run and M the job MTBF.

Expected goodput (Daly 2006, eq. 13, exponential failures, restart time R):
  T_wall / T_solve = M e^{R/M} (e^{(tau + C)/M} - 1) / tau,   goodput = T_solve / T_wall.
To first order this is (1 - C/tau)(1 - (R + tau/2)/M): the checkpoint overhead, then per
failure the restart and, on average, half an interval of lost work. With asynchronous
checkpoints the last checkpoint is durable only after its background write W, so a failure
loses W more on average: R is taken as R + W.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict

from simdist.analytic.memory import memory_per_stage, state_bytes
from simdist.analytic.offload import PCIE_EFFICIENCY
from simdist.analytic.params import total_params
from simdist.frozen import frozen
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan
from simdist.spec.scenario import Reliability, Scenario

DEFAULT_PCIE_BYTES_PER_S = 32e9  # PCIe Gen4 x16 per direction, when the cluster has no host spec
SECONDS_PER_DAY = 86400.0


def checkpoint_bytes(m: ModelSpec, plan: ParallelPlan, fp32_master: bool = True) -> float:
    """Bytes of one full checkpoint of the job: parameters + fp32 master copy + optimizer
    states, for every parameter once (replicas are deduplicated). Mixed-precision Adam gives
    2 + 4 + 8 = 14 B per parameter (ZeRO paper sec 3.1 without the gradients).
    ``fp32_master=False`` drops the master copy (OPT-175B kept fp16 weights and fp32 Adam
    states, Zhang et al. 2022 sec 2.4)."""
    b = state_bytes(m, plan)
    per_param = b.params + b.optimizer
    if not fp32_master and plan.mixed_precision:
        per_param -= 4.0
    return total_params(m) * per_param


def job_mtbf(gpu_mtbf_s: float, gpus: int) -> float:
    """Mean time between failures of a job on ``gpus`` GPUs that each fail independently."""
    return gpu_mtbf_s / max(1, gpus)


def young_interval(c: float, mtbf: float) -> float:
    """Young 1974: the first-order optimum tau = sqrt(2 C M)."""
    return math.sqrt(2.0 * c * mtbf)


def daly_interval(c: float, mtbf: float) -> float:
    """Daly 2006 eq. 37: the higher-order optimum; M itself when C >= 2M."""
    if c >= 2.0 * mtbf:
        return mtbf
    x = c / (2.0 * mtbf)
    return math.sqrt(2.0 * c * mtbf) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - c


def expected_goodput(tau: float, c: float, mtbf: float, restart: float) -> float:
    """Fraction of wall-clock time that advances training (Daly 2006 eq. 13)."""
    if tau <= 0 or mtbf <= 0:
        return 0.0
    # evaluated in log space: e^{R/M} and e^{(tau+C)/M} overflow for tiny M
    a = (tau + c) / mtbf
    # log(e^a - 1) = a + log(1 - e^-a), with 1 - e^-a as -expm1(-a): log1p(-exp(-a)) hit log1p(-1)
    # (a domain error) once e^-a rounded to 1, for an MTBF 10^20 times the interval
    log_wall = math.log(mtbf) + restart / mtbf + (a + math.log(-math.expm1(-a)) if a > 0 else -math.inf)
    return min(1.0, math.exp(math.log(tau) - log_wall))


@frozen
class CheckpointCost:
    nbytes: float
    write_s: float  # the write to checkpoint storage
    blocking_s: float  # what the training run pays per checkpoint
    lost_extra_s: float  # extra work lost per failure (async: the write in flight)
    minimum_interval_s: float  # async: the next checkpoint waits for the previous write


def checkpoint_cost(sc: Scenario, rel: Reliability) -> CheckpointCost:
    """Size and time of one checkpoint of ``sc`` (sync or async, see the module docstring)."""
    nbytes = checkpoint_bytes(sc.model, sc.plan)
    write = nbytes / rel.checkpoint_bandwidth_bytes_per_s
    if not rel.async_checkpoint:
        return CheckpointCost(nbytes, write, write, 0.0, 0.0)
    host = sc.cluster.host
    pcie = (host.pcie_bandwidth_bytes_per_s if host else DEFAULT_PCIE_BYTES_PER_S) * PCIE_EFFICIENCY
    per_gpu = max(s.params + s.optimizer for s in memory_per_stage(sc.model, sc.plan))
    return CheckpointCost(nbytes, write, per_gpu / pcie, write, write)


@frozen
class Goodput:
    """The contract's ``goodput`` object plus the figures behind it."""

    checkpoint_gib: float
    checkpoint_write_s: float
    checkpoint_interval_s: float
    job_mtbf_s: float
    expected_goodput: float
    time_to_train_days: float | None
    checkpoint_blocking_s: float = 0.0
    checkpoint_interval_steps: int = 0
    young_interval_s: float = 0.0
    daly_interval_s: float = 0.0
    async_checkpoint: bool = False

    def to_dict(self) -> dict[str, float | int | bool | None]:
        return asdict(self)


def goodput_at(tau: float, cost: CheckpointCost, mtbf: float, rel: Reliability) -> float:
    """Goodput with checkpoints every ``tau`` seconds of training."""
    return expected_goodput(tau, cost.blocking_s, mtbf, rel.restart_time_s + cost.lost_extra_s)


def _steps(tau: float, step_s: float) -> int:
    return max(1, round(tau / step_s))


def goodput(sc: Scenario, step_time_s: float, tokens_per_s: float) -> Goodput:
    """Checkpoint size and time, job MTBF, the checkpoint interval (the scenario's, or Daly's
    optimum when ``auto``) rounded to whole steps, the expected goodput and the time to train."""
    rel = sc.reliability
    if rel is None:
        raise ValueError("scenario has no reliability section")
    cost = checkpoint_cost(sc, rel)
    mtbf = job_mtbf(rel.gpu_mtbf_s, sc.world_size)
    young = young_interval(cost.blocking_s, mtbf)
    daly = daly_interval(cost.blocking_s, mtbf)
    if rel.checkpoint_interval_s is None:
        target = max(daly, cost.minimum_interval_s)
        lo = max(1, math.floor(target / step_time_s))
        candidates = [s for s in (lo, lo + 1) if s * step_time_s >= cost.minimum_interval_s] or [lo + 1]
        steps = max(candidates, key=lambda s: goodput_at(s * step_time_s, cost, mtbf, rel))
    else:
        steps = _steps(max(rel.checkpoint_interval_s, cost.minimum_interval_s), step_time_s)
    tau = steps * step_time_s
    g = goodput_at(tau, cost, mtbf, rel)
    days = None
    if rel.train_tokens is not None and g > 0:
        days = rel.train_tokens / tokens_per_s / g / SECONDS_PER_DAY
    return Goodput(
        checkpoint_gib=cost.nbytes / 2**30, checkpoint_write_s=cost.write_s, checkpoint_interval_s=tau,
        job_mtbf_s=mtbf, expected_goodput=g, time_to_train_days=days,
        checkpoint_blocking_s=cost.blocking_s, checkpoint_interval_steps=steps,
        young_interval_s=young, daly_interval_s=daly, async_checkpoint=rel.async_checkpoint,
    )


def goodput_curve(sc: Scenario, step_time_s: float, intervals_s: Iterable[float]) -> list[tuple[float, float]]:
    """(interval, goodput) for each checkpoint interval in seconds (rounded to whole steps)."""
    rel = sc.reliability
    if rel is None:
        raise ValueError("scenario has no reliability section")
    cost = checkpoint_cost(sc, rel)
    mtbf = job_mtbf(rel.gpu_mtbf_s, sc.world_size)
    out = []
    for t in intervals_s:
        tau = _steps(max(t, cost.minimum_interval_s), step_time_s) * step_time_s
        out.append((tau, goodput_at(tau, cost, mtbf, rel)))
    return out
