"""Predicted vs measured: step time, phases and memory for each measured scenario."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import yaml

from simdist.spec.profile import CalibrationProfile
from simdist.units import GiB


@dataclass(frozen=True)
class Comparison:
    name: str
    scenario_hash: str
    measured: dict[str, float]  # quantity -> value (seconds or GiB)
    predicted: dict[str, float]
    spread: float  # relative run-to-run spread of the measured step times (max-min)/median

    def error(self, key: str) -> float | None:
        m, p = self.measured.get(key), self.predicted.get(key)
        if m is None or p is None or m == 0:
            return None
        return p / m - 1.0


def predicted_quantities(scenario, profile: CalibrationProfile | None) -> dict[str, float]:
    """Step time, phases and per-rank memory the model predicts, in the measurement's terms."""
    from simdist.analytic.memory import activation_bytes, model_state_bytes
    from simdist.analytic.steptime import Timer, stage_time
    from simdist.cost import CostModel
    from simdist.predict import predict
    from simdist.sim.collectives import Network

    pred = predict(scenario, profile=profile, engine="analytic", keep_spans=False)
    plan, model = scenario.plan, scenario.model
    timer = Timer(scenario, CostModel(scenario.cluster.gpu, plan.precision, profile), Network.of(scenario.cluster, profile))
    st = [stage_time(timer, s) for s in range(plan.pp)]
    busiest = max(range(plan.pp), key=lambda s: st[s].total)
    m = plan.num_microbatches
    b = pred.breakdown_s
    states = [model_state_bytes(model, plan, s) for s in range(plan.pp)]
    return {
        "step_time_s": pred.step_time_s,
        "forward_s": m * st[busiest].fwd.compute,
        "backward_s": m * (st[busiest].bwd.compute + st[busiest].recompute.compute),
        "optimizer_s": b["optimizer"],
        "comm_s": b["tp_comm"] + b["pp_comm"] + b["dp_comm"],
        "model_state_gib": max(s["params"] + s["grads"] + s["optimizer"] for s in states) / GiB,
        "activations_gib": max(activation_bytes(model, plan, s) for s in range(plan.pp)) / GiB,
        **predicted_traffic(scenario),
    }


def predicted_traffic(scenario) -> dict[str, float]:
    """Bytes the executor counts (gradient-sync bytes per rank and step with compression, bytes
    per parameter server and step) and the restart time, as the model has them."""
    from simdist.analytic.systems import dp_traffic, ps_traffic

    plan, out = scenario.plan, {}
    if plan.uses_parameter_servers:
        out["ps_bytes_per_server"] = ps_traffic(scenario.model, plan, scenario.cluster).per_server_bytes
    elif plan.grad_compression.enabled:
        out["dp_bytes_per_step"] = dp_traffic(scenario.model, plan, 0).step_bytes(plan.num_microbatches)
    if scenario.reliability is not None:
        out["restart_s"] = scenario.reliability.restart_time_s
    return out


def measured_quantities(meas: dict[str, Any]) -> dict[str, float]:
    phases = meas.get("phases_s", {})
    ranks = meas.get("memory", {}).get("per_rank", [])
    out = {"step_time_s": float(meas["step_time_s"])}
    for k in ("forward", "backward", "optimizer", "comm"):
        if k in phases:
            out[f"{k}_s"] = float(phases[k])
    if ranks:
        out["model_state_gib"] = max(float(r.get("model_state_gib", 0)) for r in ranks)
        out["activations_gib"] = max(float(r.get("activations_gib", 0)) for r in ranks)
    if (meas.get("compression") or {}).get("dp_bytes_per_step") is not None:
        out["dp_bytes_per_step"] = float(meas["compression"]["dp_bytes_per_step"])
    if meas.get("ps"):
        out["ps_bytes_per_server"] = float(meas["ps"]["bytes_per_server_per_step"])
    if meas.get("restarts"):
        out["restarts"] = float(meas["restarts"])
        if meas.get("restart_s") is not None:
            out["restart_s"] = float(meas["restart_s"])
    return out


def spread(meas: dict[str, Any]) -> float:
    times = meas.get("step_times_s") or [meas["step_time_s"]]
    med = statistics.median(times)
    return (max(times) - min(times)) / med if med else 0.0


def compare_one(meas: dict[str, Any], scenario_yaml: str, profile: CalibrationProfile | None,
                base_dir: str = ".") -> Comparison:
    from simdist.spec.scenario import scenario_from_dict

    sc = scenario_from_dict(yaml.safe_load(scenario_yaml), base_dir)
    return Comparison(meas.get("name", sc.name), meas.get("scenario_hash", sc.hash()),
                      measured_quantities(meas), predicted_quantities(sc, profile), spread(meas))


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
