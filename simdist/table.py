"""Plain-text tables and the human-readable prediction report (no heavy imports)."""

from __future__ import annotations

from collections.abc import Sequence

from simdist.results import Prediction
from simdist.units import fmt_seconds


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], align: str | None = None) -> str:
    """Columns padded to width; ``align`` holds 'l' or 'r' per column (numbers right)."""
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    align = align or "".join("r" if _is_num(rows[0][i]) else "l" for i in range(len(headers))) if rows else "l" * len(headers)
    lines = []
    for j, r in enumerate(cells):
        parts = [c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(r, widths, align, strict=True)]
        lines.append("  ".join(parts).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _is_num(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _fmt(v: object) -> str:
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 1e5 or abs(v) < 1e-3:
            return f"{v:.3g}"
        return f"{v:,.3f}" if abs(v) < 100 else f"{v:,.1f}"
    return str(v)


def prediction_report(p: Prediction) -> str:
    out = [f"{p.name}: {p.world_size} GPUs, engine {p.engine}" + (f", profile {p.profile}" if p.profile else "")]
    out.append("")
    out.append(table(
        ["step time", "tokens/s", "TFLOP/s/GPU", "MFU", "bubble"],
        [[fmt_seconds(p.step_time_s), f"{p.tokens_per_s:,.0f}", f"{p.model_tflops_per_gpu:.1f}",
          f"{p.mfu:.1%}", f"{p.bubble_fraction:.1%}"]], align="rrrrr"))
    out.append("")
    rows = [[k, fmt_seconds(v), f"{v / p.step_time_s:.1%}"] for k, v in p.breakdown_s.items()]
    out.append(table(["where the time goes", "seconds", "share"], rows, align="lrr"))
    out.append("")
    rows = [[s.stage, f"{s.params_gib:.2f}", f"{s.grads_gib:.2f}", f"{s.optimizer_gib:.2f}",
             f"{s.activations_gib:.2f}", f"{s.other_gib:.2f}", f"{s.peak_gib:.2f}",
             f"{s.reserved_gib:.2f}",
             "ok" if s.peak_gib <= p.capacity_gib else "OOM"] for s in p.per_stage]
    out.append(table(["stage", "params", "grads", "optim", "activ", "other", "peak GiB", "reserved", ""], rows,
                     align="rrrrrrrrl"))
    gpu_fits = p.peak_gib <= p.capacity_gib
    verdict = "fits" if p.fits else ("DOES NOT FIT (host memory)" if gpu_fits else "DOES NOT FIT")
    out.append(f"\nmemory: peak {p.peak_gib:.1f} GiB (caching allocator reserves {p.reserved_gib:.1f}) of "
               f"{p.capacity_gib:.0f} GiB per GPU -> {verdict}")
    if p.host_capacity_gib is not None and p.host_peak_gib > 0:
        host_ok = p.host_peak_gib <= p.host_capacity_gib
        out.append(f"host memory (offloaded / server states): {p.host_peak_gib:.1f} GiB per GPU of "
                   f"{p.host_capacity_gib:.0f} GiB host share per GPU -> "
                   + ("fits" if host_ok else "DOES NOT FIT"))
    g = p.extras.get("goodput")
    if isinstance(g, dict):
        ttt = g.get("time_to_train_days")
        out.append(
            f"goodput: checkpoint {g['checkpoint_gib']:,.0f} GiB, write {fmt_seconds(g['checkpoint_write_s'])}"
            f"{' (async: blocks ' + fmt_seconds(g['checkpoint_blocking_s']) + ')' if g.get('async_checkpoint') else ''}"
            f", every {fmt_seconds(g['checkpoint_interval_s'])} ({g['checkpoint_interval_steps']} steps), "
            f"job MTBF {fmt_seconds(g['job_mtbf_s'])} -> expected goodput {g['expected_goodput']:.1%}"
            + (f", time to train {ttt:.1f} days" if ttt is not None else ""))
    for key, value in p.extras.items():
        if key == "goodput":
            continue
        if isinstance(value, dict):
            out.append(f"{key}: " + ", ".join(f"{k}={_fmt(v)}" for k, v in value.items()))
        else:
            out.append(f"{key}: {_fmt(value)}")
    if p.assumptions:
        out.append("\nassumptions:")
        out += [f"  - {a}" for a in p.assumptions]
    return "\n".join(out)
