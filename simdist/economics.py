"""What a step and a training run cost, in dollars and in GPU energy (nothing here is simulated).

Cost: a GPU-hour's price (``cluster.usd_per_gpu_hour``: the cluster preset's list price, see
``simdist/catalog/clusters.yaml``, or the scenario's own) times the GPU-hours used::

    usd_per_step = world_size x step_time_s / 3600 x usd_per_gpu_hour
    usd_to_tokens = world_size x (tokens / tokens_per_s) / 3600 x usd_per_gpu_hour

Energy: GPU board energy from the datasheet's maximum board power (``gpu.board_power_w``, TDP,
``simdist/catalog/gpus.yaml``) and the step's utilisation, the fraction of the step the GPU runs
its own kernels (the breakdown's compute, recompute, optimizer and compression)::

    utilisation = (compute + recompute + optimizer + compression) / step_time_s
    energy_kwh_per_step = world_size x board_power_w x utilisation x step_time_s / 3.6e6

Dense training kernels hold a GPU near its power limit (NVIDIA's H100 and A100 datasheets give
the maximum board power as the sustained limit; MLPerf Training power submissions report
accelerators near it), and a GPU that waits for a transfer or a pipeline bubble is counted as
drawing nothing: the figure is the GPU boards' energy at full draw while busy, a lower bound of
what the boards use (idle draw, 60-100 W on these GPUs, is left out), without the hosts, the
network or cooling (multiply by the data centre's PUE for the facility's energy).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict
from typing import Any

from simdist.errors import Problem, ScenarioError
from simdist.frozen import frozen

BUSY_KEYS = ("compute", "recompute", "optimizer", "compression")
_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


@frozen
class RunCost:
    """Cost and energy of one step and, when a token count is given, of training to it."""

    usd_per_gpu_hour: float | None
    board_power_w: float | None
    utilisation: float
    gpu_hours_per_step: float
    usd_per_step: float | None
    energy_kwh_per_step: float | None
    tokens: float | None = None
    steps_to_tokens: float | None = None
    days_to_tokens: float | None = None
    usd_to_tokens: float | None = None
    energy_mwh_to_tokens: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def utilisation(breakdown_s: dict[str, float], step_time_s: float) -> float:
    """The fraction of the step the GPU runs its own kernels (see the module's formula)."""
    if step_time_s <= 0:
        return 0.0
    return min(1.0, sum(breakdown_s.get(k, 0.0) for k in BUSY_KEYS) / step_time_s)


def run_cost(scenario: Any, pred: Any, tokens: float | None = None) -> RunCost:
    """The cost of ``pred`` (a Prediction of ``scenario``), and of training to ``tokens`` tokens
    (default: the scenario's ``reliability.train_tokens`` when it has one)."""
    if tokens is None and scenario.reliability is not None:
        tokens = scenario.reliability.train_tokens
    price = scenario.cluster.usd_per_gpu_hour
    power = scenario.cluster.gpu.board_power_w
    n, t = pred.world_size, pred.step_time_s
    u = utilisation(pred.breakdown_s, t)
    gpu_hours = t / 3600 * n  # the step time first: n * t overflowed for a step near 1e306 s
    out: dict[str, Any] = {
        "usd_per_gpu_hour": price, "board_power_w": power, "utilisation": u,
        "gpu_hours_per_step": gpu_hours,
        "usd_per_step": gpu_hours * price if price is not None else None,
        "energy_kwh_per_step": t / 3.6e6 * u * power * n if power is not None else None,
    }
    if tokens is not None and pred.tokens_per_s > 0:
        seconds = tokens / pred.tokens_per_s
        steps = seconds / t
        out.update(tokens=tokens, steps_to_tokens=steps, days_to_tokens=seconds / 86400,
                   usd_to_tokens=seconds / 3600 * n * price if price is not None else None,
                   energy_mwh_to_tokens=(out["energy_kwh_per_step"] * steps / 1000
                                         if out["energy_kwh_per_step"] is not None else None))
    bad = next((k for k, v in out.items() if isinstance(v, float) and not math.isfinite(v)), None)
    if bad is not None:  # a run so long that its cost overflows (a peak of 1e-300 TFLOP/s, 1e15 tokens)
        from simdist.spec.suspects import suspect

        raise ScenarioError(Problem(suspect(scenario, None, "any", "slow"), f"leads to an absurd cost: {bad} "
                                    f"is not a finite number (a step of {t:.3g} s); is it a realistic value?"))
    return RunCost(**out)


def parse_tokens(text: str, flag: str = "--tokens") -> float:
    """``300e9``, ``300B``, ``15T``, ``2,000,000`` -> tokens; a problem naming ``flag`` otherwise."""
    m = re.fullmatch(r"\s*([0-9][0-9,_]*\.?[0-9]*(?:e[0-9]+)?)\s*([kmbgt]?)\s*", text.lower())
    value = None
    if m:
        try:
            value = float(m.group(1).replace(",", "").replace("_", "")) * _SUFFIX[m.group(2)]
        except ValueError:
            value = None
    if value is None or not 0 < value < 1e18:
        raise ScenarioError(Problem(flag, f"must be a positive token count such as 300e9, 300B or 15T, "
                                    f"got {text[:40]!r}"))
    return value


def cost_lines(c: RunCost) -> list[str]:
    """The cost and energy in words, for the predict report."""
    price = f"${c.usd_per_gpu_hour:,.2f} per GPU-hour" if c.usd_per_gpu_hour is not None else None
    step = (f"cost: ${c.usd_per_step:,.2f} per step ({c.gpu_hours_per_step:,.2f} GPU-hours at {price})"
            if c.usd_per_step is not None else
            f"cost: {c.gpu_hours_per_step:,.2f} GPU-hours per step (no price: set cluster.usd_per_gpu_hour)")
    lines = [step]
    if c.energy_kwh_per_step is not None:
        lines.append(f"energy: {c.energy_kwh_per_step:,.3g} kWh per step (GPU boards: {c.board_power_w:,.0f} W "
                     f"x {c.utilisation:.0%} busy; no hosts, network or cooling)")
    if c.tokens is not None and c.days_to_tokens is not None:
        run = f"to {c.tokens:,.3g} tokens: {c.steps_to_tokens:,.0f} steps, {c.days_to_tokens:,.1f} days"
        if c.usd_to_tokens is not None:
            run += f", ${c.usd_to_tokens:,.0f}"
        if c.energy_mwh_to_tokens is not None:
            run += f", {c.energy_mwh_to_tokens:,.1f} MWh"
        lines.append(run + " (no failures or restarts)")
    return lines
