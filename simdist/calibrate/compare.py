"""Predicted vs measured: step time, phases and memory for each measured scenario.

Measurements are read as :class:`simdist.spec.measurement.Measurement` (validated: a stored
payload that is not a measurement is reported, never half-used).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import yaml

from simdist.errors import ScenarioError
from simdist.frozen import frozen
from simdist.spec.measurement import Measurement
from simdist.spec.profile import CalibrationProfile, local_processes
from simdist.units import GiB

if TYPE_CHECKING:
    from simdist.calibrate.store import RunStore


@frozen
class Comparison:
    name: str
    scenario_hash: str
    measured: dict[str, float]  # quantity -> value (seconds or GiB)
    predicted: dict[str, float]
    spread: float  # relative run-to-run spread of the measured step times (max-min)/median
    host_drift: float = 0.0  # how much slower (> 0) the host ran than when the profile was fitted (honesty.HostSpeed)

    def error(self, key: str) -> float | None:
        m, p = self.measured.get(key), self.predicted.get(key)
        if m is None or p is None or m == 0:
            return None
        return p / m - 1.0


def predicted_quantities(scenario, profile: CalibrationProfile | None) -> dict[str, float]:
    """Step time, phases and per-rank memory the model predicts, in the measurement's terms."""
    from simdist.analytic.cache_residency import resident
    from simdist.analytic.collectives import Network
    from simdist.analytic.cost import CostModel
    from simdist.analytic.fsdp2 import input_copies_s
    from simdist.analytic.memory import activation_bytes, model_state_bytes
    from simdist.analytic.stage import describe
    from simdist.analytic.steptime import reduce_step, stage_time
    from simdist.analytic.timeshare import time_shared
    from simdist.predict import predict

    pred = predict(scenario, profile=profile, engine="analytic", keep_spans=False)
    plan, model = scenario.plan, scenario.model
    shared, _ = time_shared(scenario, resident(scenario, profile))  # as predict() prices them
    cost = CostModel(scenario.cluster.gpu, plan.precision, shared)
    d = describe(scenario, cost, Network.of(scenario.cluster, shared))
    st = [stage_time(d, s) for s in d.stages]
    busiest = max(range(plan.pp), key=lambda s: st[s].total)
    m = plan.num_microbatches
    b = pred.breakdown_s
    # a parameter-server worker waits for the servers' update between its push and its pull
    server = reduce_step(d).server_update_s if plan.uses_parameter_servers else 0.0
    states = [model_state_bytes(model, plan, s) for s in range(plan.pp)]
    waited = server + sum(b.get(k, 0.0) for k in ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm", "bubble"))
    copies = min(waited, m * input_copies_s(d.stages[busiest].dp, cost))  # the training thread's own work
    return {
        "step_time_s": pred.step_time_s,
        "forward_s": m * st[busiest].fwd.compute,
        "backward_s": m * (st[busiest].bwd.compute + st[busiest].recompute.compute) + copies,
        "optimizer_s": b["optimizer"] - server,
        # the executor sees only waiting: for peers' collectives (the experts' all-to-alls and the
        # context-parallel exchanges too), in a pipeline the bubble, and the parameter servers' update
        "comm_s": waited - copies,
        "model_state_gib": max(s["params"] + s["grads"] + s["optimizer"] for s in states) / GiB,
        "activations_gib": max(activation_bytes(model, plan, s) for s in range(plan.pp)) / GiB,
        **predicted_traffic(scenario),
    }


def predicted_traffic(scenario) -> dict[str, float]:
    """Bytes the executor counts (gradient-sync bytes per rank and step with compression, bytes
    per parameter server and step) and the restart time, as the model has them."""
    from simdist.analytic.data_parallel import dp_traffic
    from simdist.analytic.param_server import ps_traffic

    plan, out = scenario.plan, {}
    if plan.uses_parameter_servers:
        out["ps_bytes_per_server"] = ps_traffic(scenario.model, plan, scenario.cluster).per_server_bytes
    elif plan.grad_compression.enabled:
        out["dp_bytes_per_step"] = dp_traffic(scenario.model, plan, 0).step_bytes(plan.num_microbatches)
    if scenario.reliability is not None:
        out["restart_s"] = scenario.reliability.restart_time_s
    return out


def measured_quantities(m: Measurement) -> dict[str, float]:
    """The measurement's step time, phases, per-rank memory maxima, traffic and restarts."""
    out = {"step_time_s": m.step_time_s}
    for k in ("forward", "backward", "optimizer", "comm"):
        value = m.phase(k)  # None: the executor could not separate this phase
        if value is not None:
            out[f"{k}_s"] = value
    if m.per_rank:
        out["model_state_gib"] = max(r.model_state_gib for r in m.per_rank)
        out["activations_gib"] = max(r.activations_gib for r in m.per_rank)
    x = m.extras
    if (x.get("compression") or {}).get("dp_bytes_per_step") is not None:
        out["dp_bytes_per_step"] = float(x["compression"]["dp_bytes_per_step"])
    if x.get("ps"):
        out["ps_bytes_per_server"] = float(x["ps"]["bytes_per_server_per_step"])
    if x.get("restarts"):
        out["restarts"] = float(x["restarts"])
        if x.get("restart_s") is not None:
            out["restart_s"] = float(x["restart_s"])
    return out


def compare_one(meas: Measurement | Mapping[str, Any], scenario_yaml: str, profile: CalibrationProfile | None,
                base_dir: str = ".") -> Comparison:
    """One measurement (or its JSON object, validated here) against the prediction of its scenario."""
    from simdist.calibrate.repeat import host_speed
    from simdist.spec.scenario import scenario_from_dict

    m = meas if isinstance(meas, Measurement) else Measurement.from_dict(meas)
    sc = scenario_from_dict(as_run_dict(yaml.safe_load(scenario_yaml), m.extras.get("as_run") or {}), base_dir)
    drift = host_speed(m).drift(profile.host_speed_for(local_processes(sc))) if profile is not None else 0.0
    return Comparison(m.name, m.scenario_hash, measured_quantities(m), predicted_quantities(sc, profile), m.spread,
                      drift)


def as_run_dict(scenario: dict[str, Any], as_run: Mapping[str, Any]) -> dict[str, Any]:
    """The scenario dict with the plan fields the executor ran another way set to what ran
    (the measurement's ``as_run``, ``plan.overlap_grad_reduce`` -> True), so that the
    comparison predicts the plan that actually ran."""
    if not as_run or not isinstance(scenario, dict):
        return scenario
    plan = dict(scenario.get("plan") or {})
    for key, value in as_run.items():
        section, _, name = str(key).partition(".")
        if section == "plan" and name and "." not in name:
            plan[name] = value
    return {**scenario, "plan": plan}


def compare_stored(store: RunStore, profile: CalibrationProfile | None, scenario_hash: str | None = None
                   ) -> tuple[list[Comparison], list[str]]:
    """The newest stored measurement of each scenario against its prediction, and one line per
    stored measurement that could not be compared (naming it and the problem)."""
    latest = {}
    skipped = []
    for r in store.runs("measurement", scenario_hash):
        if r.scenario_yaml:
            latest[r.scenario_hash] = r
        else:
            skipped.append(f"{r.name} (run {r.id}): stored without its scenario's text, so it cannot be predicted")
    comparisons = []
    for r in latest.values():
        try:
            comparisons.append(compare_one(r.payload, r.scenario_yaml or "", profile))
        except ScenarioError as exc:
            skipped.append(f"{r.name} (run {r.id}): {exc.problems[0]}")
    return comparisons, skipped


def comparison_figure(rows: list[Comparison]):
    """A plotly figure: predicted vs measured step time per scenario, with the y=x line."""
    import plotly.graph_objects as go

    x = [r.measured["step_time_s"] for r in rows]
    y = [r.predicted["step_time_s"] for r in rows]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=y, mode="markers+text", text=[r.name for r in rows],
                             textposition="top center", name="scenarios",
                             error_x={"type": "data", "array": [r.spread * r.measured["step_time_s"] / 2 for r in rows]}))
    hi = max(x + y) * 1.1 if rows else 1.0
    fig.add_trace(go.Scatter(x=[0, hi], y=[0, hi], mode="lines", name="predicted = measured",
                             line={"dash": "dash"}))
    fig.update_layout(title="simdist: predicted vs measured step time", xaxis_title="measured step time (s)",
                      yaxis_title="predicted step time (s)")
    return fig
