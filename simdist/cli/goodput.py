"""`simdist goodput FILE`: expected goodput against the checkpoint interval, as a table and,
with ``--html``, a plotly chart (written atomically).

The step time comes from `simdist predict` (analytic engine by default); the reliability model
is simdist.reliability (Young 1974 and Daly 2006 optima, Daly's expected wall-clock time).
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from simdist.cli.inputs import (
    add_profile_argument,
    add_set_argument,
    load_profile_arg,
    load_scenario_arg,
)
from simdist.errors import Problem, ScenarioError

# multiples of the optimum to tabulate, and round intervals users think in
_FACTORS = (0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0, 10.0)
_ROUND_S = (5 * 60, 15 * 60, 30 * 60, 3600, 3 * 3600, 6 * 3600, 24 * 3600)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="scenario YAML with a reliability section")
    p.add_argument("--engine", default="analytic", choices=("des", "analytic"))
    add_set_argument(p)
    add_profile_argument(p)
    p.add_argument("--html", help="write a plotly chart of goodput against the interval (HTML)")
    p.add_argument("--json", action="store_true", help="print the table as JSON")


def curve_intervals(optimum_s: float, step_s: float) -> list[float]:
    """Intervals to evaluate: multiples of the optimum and round durations, at least one step."""
    pts = {max(step_s, f * optimum_s) for f in _FACTORS} | {max(step_s, t) for t in _ROUND_S}
    return sorted(pts)


def goodput_table(sc: Any, pred: Any) -> dict[str, Any]:
    from simdist.reliability import goodput, goodput_curve

    g = goodput(sc, pred.step_time_s, pred.tokens_per_s)
    optimum = g.daly_interval_s
    rows = []
    for tau, gp in goodput_curve(sc, pred.step_time_s, curve_intervals(optimum, pred.step_time_s)):
        days = None
        if sc.reliability.train_tokens is not None and gp > 0:
            days = sc.reliability.train_tokens / pred.tokens_per_s / gp / 86400
        rows.append({"interval_s": tau, "interval_steps": round(tau / pred.step_time_s), "goodput": gp,
                     "time_to_train_days": days})
    dense = []
    lo, hi = max(pred.step_time_s, optimum / 30), max(optimum * 30, pred.step_time_s * 2)
    for i in range(121):
        t = lo * (hi / lo) ** (i / 120)
        dense.extend(goodput_curve(sc, pred.step_time_s, [t]))
    return {"name": sc.name, "step_time_s": pred.step_time_s, "goodput": g.to_dict(), "rows": rows,
            "curve": [{"interval_s": t, "goodput": v} for t, v in dense]}


def figure(data: dict[str, Any]) -> Any:
    import plotly.graph_objects as go

    g = data["goodput"]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[p["interval_s"] / 60 for p in data["curve"]],
                             y=[100 * p["goodput"] for p in data["curve"]], mode="lines",
                             name="expected goodput (Daly 2006)"))
    fig.add_trace(go.Scatter(x=[g["checkpoint_interval_s"] / 60], y=[100 * g["expected_goodput"]], mode="markers",
                             marker={"size": 11}, name="chosen interval"))
    for label, x in (("Young sqrt(2CM)", g["young_interval_s"]), ("Daly optimum", g["daly_interval_s"])):
        fig.add_vline(x=x / 60, line_dash="dot", annotation_text=label)
    fig.update_layout(title=f"{data['name']}: goodput against the checkpoint interval "
                            f"(job MTBF {g['job_mtbf_s'] / 3600:.2f} h, checkpoint {g['checkpoint_blocking_s']:.0f} s)",
                      xaxis_title="checkpoint interval (minutes)", yaxis_title="goodput (%)",
                      xaxis_type="log", template="plotly_white")
    return fig


def main(args: argparse.Namespace) -> int:
    from simdist.predict import predict
    from simdist.table import table
    from simdist.units import fmt_seconds

    sc = load_scenario_arg(args)
    if sc.reliability is None:
        raise ScenarioError(Problem("reliability", "is required for `simdist goodput` (gpu_mtbf, "
                                    "checkpoint_bandwidth, ...; see docs/scenario-format.md)"))
    pred = predict(sc, profile=load_profile_arg(args.profile), engine=args.engine, keep_spans=False)
    data = goodput_table(sc, pred)
    if args.html:
        from simdist.spec.files import write_text_atomic

        try:
            fig = figure(data)
        except ImportError:
            raise ScenarioError(Problem("--html", "needs plotly: pip install 'simdist[app]'")) from None
        write_text_atomic(args.html, fig.to_html(include_plotlyjs="cdn"))
    if args.json:
        print(json.dumps({k: v for k, v in data.items() if k != "curve"}, indent=2))
        return 0
    g = data["goodput"]
    print(f"{sc.name}: {sc.world_size} GPUs, step {fmt_seconds(pred.step_time_s)}, "
          f"job MTBF {fmt_seconds(g['job_mtbf_s'])}, checkpoint {g['checkpoint_gib']:,.0f} GiB "
          f"written in {fmt_seconds(g['checkpoint_write_s'])}"
          + (f" (async: blocks {fmt_seconds(g['checkpoint_blocking_s'])})" if g["async_checkpoint"] else ""))
    print(f"optimum interval: Young {fmt_seconds(g['young_interval_s'])}, Daly {fmt_seconds(g['daly_interval_s'])}; "
          f"chosen {fmt_seconds(g['checkpoint_interval_s'])} -> goodput {g['expected_goodput']:.2%}\n")
    rows = []
    for r in data["rows"]:
        mark = "<- chosen" if math.isclose(r["interval_s"], g["checkpoint_interval_s"], rel_tol=1e-9) else ""
        days = r["time_to_train_days"]
        rows.append([fmt_seconds(r["interval_s"]), r["interval_steps"], f"{r['goodput']:.2%}",
                     f"{days:.1f}" if days is not None else "-", mark])
    print(table(["interval", "steps", "goodput", "days to train", ""], rows, align="rrrrl"))
    if args.html:
        print(f"\nwrote {args.html}")
    return 0
