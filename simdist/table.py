"""Tables (rich: colour on a terminal, plain text on a pipe) and the human-readable prediction
report. ``--json`` output never comes through here."""

from __future__ import annotations

import io
import re
import shutil
import sys
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

from simdist.units import fmt_seconds

if TYPE_CHECKING:
    from simdist.results import Prediction
STATUS_STYLES = {"ok": "green", "fits": "green", "OOM": "bold red", "DOES NOT FIT": "bold red"}
PIPE_WIDTH = 400  # a pipe gets whole lines, never wrapped


def is_terminal() -> bool:
    return sys.stdout.isatty()


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], align: str | None = None) -> str:
    """Columns padded to width; ``align`` holds 'l' or 'r' per column (numbers right). On a
    terminal the header is bold and status cells (ok, OOM, fits) coloured; on a pipe, plain ASCII."""
    if align is None:
        align = "".join("r" if rows and _is_num(rows[0][i]) else "l" for i in range(len(headers)))
    tty = is_terminal()
    if not tty and (plain := plain_table(headers, rows, align)) is not None:
        return plain
    from rich.table import Table
    from rich.text import Text

    t = Table(box=_plain_head(), show_edge=False, pad_edge=False, padding=(0, 1), collapse_padding=True,
              header_style="bold" if tty else "", expand=False)
    for h, a in zip(headers, align, strict=True):
        t.add_column(str(h), justify="right" if a == "r" else "left", no_wrap=not tty)
    for r in rows:
        t.add_row(*(Text(_fmt(c), style=STATUS_STYLES.get(_fmt(c), "") if tty else "") for c in r))
    return render(t, tty)


@lru_cache(maxsize=1)
def _plain_head() -> object:
    """The header rule in ASCII, a gap between columns (rich.box.SIMPLE_HEAD with '-' for '─')."""
    from rich import box

    return box.Box("    \n    \n -  \n    \n    \n    \n    \n    \n", ascii=True)


def plain_table(headers: Sequence[str], rows: Sequence[Sequence[object]], align: str) -> str | None:
    """:func:`table` on a pipe without rich (whose import is a tenth of ``simdist predict``): the
    same text, character for character (tests/test_table_plain.py holds it to rich's), or None
    where rich would do more than pad the cells (markup in a header, a cell that is not
    printable ASCII, a missing cell, an empty column, a line past the pipe's width)."""
    head = [str(h) for h in headers]
    body = [[_fmt(c) for c in r] for r in rows]
    if any("[" in h for h in head) or any(len(r) != len(head) for r in body):
        return None
    if not all(c.isascii() and c.isprintable() for c in [*head, *(c for r in body for c in r)]):
        return None
    widths = [max(len(c) for c in col) for col in zip(head, *body, strict=True)]
    if not head or 0 in widths or sum(widths) + 2 * len(widths) > PIPE_WIDTH:
        return None
    last = len(widths) - 1  # every column but the last is padded by one space on its right

    def line(cells: Sequence[str]) -> str:
        return " ".join((c.rjust(w) if a == "r" else c.ljust(w)) + (" " if i < last else "")
                        for i, (c, w, a) in enumerate(zip(cells, widths, align, strict=True))).rstrip()

    rule = " ".join("-" * (w + (i < last)) for i, w in enumerate(widths))
    return "\n".join([line(head), rule, *(line(r) for r in body)])


def render(renderable: object, tty: bool | None = None) -> str:
    """What rich prints for ``renderable``: ANSI colour on a terminal, plain text otherwise."""
    from rich.console import Console

    tty = is_terminal() if tty is None else tty
    buf = io.StringIO()
    width = shutil.get_terminal_size((120, 40)).columns if tty else PIPE_WIDTH
    Console(file=buf, force_terminal=tty, no_color=not tty, color_system="auto" if tty else None,
            width=width, highlight=False, soft_wrap=False, emoji=False).print(renderable)
    return "\n".join(line.rstrip() for line in buf.getvalue().rstrip("\n").split("\n"))


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


# --- the prediction report ------------------------------------------------------------------

ENGINES = {"des": "des (discrete-event)", "analytic": "analytic (closed form)"}
UNITS = (("h", 3600.0), ("min", 60.0), ("s", 1.0), ("ms", 1e-3), ("us", 1e-6))


def time_unit(largest_s: float) -> tuple[str, float]:
    """One unit for a column of times: the largest that keeps its biggest value >= 1."""
    return next(((u, f) for u, f in UNITS if largest_s >= f), UNITS[-1])


def prediction_report(p: Prediction, more: Sequence[str] = ()) -> str:
    """The report of ``simdist predict``; ``more`` lines (cost, energy) go before the assumptions."""
    out = [f"{p.name}: {p.world_size:,} GPUs, engine {ENGINES.get(p.engine, p.engine)}"
           + (f", profile {p.profile}" if p.profile else ""), ""]
    hfu = p.mfu * (1 + p.recompute_flops_per_step / p.model_flops_per_step) if p.model_flops_per_step else 0.0
    unit, f = time_unit(p.step_time_s)
    out.append(table(
        [f"step time ({unit})", "tokens/s", "TFLOP/s/GPU (model FLOPs)", "MFU", "HFU (with recompute)",
         "bubble (% of step)"],
        [[f"{p.step_time_s / f:,.3f}", f"{p.tokens_per_s:,.0f}", f"{p.model_tflops_per_gpu:.1f}",
          f"{p.mfu:.1%}", f"{hfu:.1%}", f"{p.bubble_fraction:.1%}"]], align="rrrrrr"))
    out.append("")
    unit, f = time_unit(max(p.breakdown_s.values(), default=0.0))
    rows = [[k, f"{v / f:,.3f}", f"{v / p.step_time_s:.1%}"] for k, v in p.breakdown_s.items()]
    out.append(table(["where the time goes", f"time ({unit})", "share of step"], rows, align="lrr"))
    out.append("")
    rows = [[s.stage, f"{s.params_gib:.2f}", f"{s.grads_gib:.2f}", f"{s.optimizer_gib:.2f}",
             f"{s.activations_gib:.2f}", f"{s.other_gib:.2f}", f"{s.peak_gib:.2f}",
             f"{s.reserved_gib:.2f}",
             "ok" if s.peak_gib <= p.capacity_gib else "OOM"] for s in p.per_stage]
    out.append(table(["stage", "params (GiB)", "grads (GiB)", "optimizer (GiB)", "activations (GiB)",
                      "other (GiB)", "peak (GiB)", "reserved (GiB)", "fits GPU"], rows, align="rrrrrrrrl"))
    gpu_fits = p.peak_gib <= p.capacity_gib
    verdict = "fits" if p.fits else ("DOES NOT FIT (host memory)" if gpu_fits else "DOES NOT FIT")
    out.append(f"\nmemory: peak {p.peak_gib:.1f} GiB (caching allocator reserves {p.reserved_gib:.1f} GiB) of "
               f"{p.capacity_gib:.0f} GiB per GPU -> {verdict}")
    if p.host_capacity_gib is not None and p.host_peak_gib > 0:
        host_ok = p.host_peak_gib <= p.host_capacity_gib
        out.append(f"host memory (offloaded / server states): {p.host_peak_gib:.1f} GiB per GPU of "
                   f"{p.host_capacity_gib:.0f} GiB host share per GPU -> "
                   + ("fits" if host_ok else "DOES NOT FIT"))
    out += extras_lines(p.extras)
    out += list(more)
    if p.assumptions:
        out.append("\nassumptions:")
        out += [f"  - {a}" for a in p.assumptions]
    return "\n".join(out)


def extras_lines(extras: dict[str, object]) -> list[str]:
    """The prediction's extensions in words (goodput, offload, parameter servers, the rest as keys)."""
    out = []
    for key, value in extras.items():
        if key == "goodput" and isinstance(value, dict):
            out.append(_goodput_line(value))
        elif key == "offload" and isinstance(value, dict):
            out.append(offload_line(value))
        elif isinstance(value, dict):
            out.append(f"{key}: " + ", ".join(f"{k}={link_words(v) if 'link' in k else _fmt(v)}"
                                              for k, v in value.items()))
        else:
            out.append(f"{key}: {_fmt(value)}")
    return out


def _goodput_line(g: dict) -> str:
    ttt = g.get("time_to_train_days")
    return (f"goodput: checkpoint {g['checkpoint_gib']:,.0f} GiB, write {fmt_seconds(g['checkpoint_write_s'])}"
            f"{' (async: blocks ' + fmt_seconds(g['checkpoint_blocking_s']) + ')' if g.get('async_checkpoint') else ''}"
            f", every {fmt_seconds(g['checkpoint_interval_s'])} ({g['checkpoint_interval_steps']} steps), "
            f"job MTBF {fmt_seconds(g['job_mtbf_s'])} -> expected goodput {g['expected_goodput']:.1%}"
            + (f", time to train {ttt:.1f} days" if ttt is not None else ""))


_PLACES = {"cpu": "in host memory", "nvme": "on NVMe", "none": "on the GPU"}


def offload_line(o: dict) -> str:
    """The offload extension as a sentence (keys: simdist/analytic/offload.py)."""
    parts = [f"optimizer states {_PLACES.get(str(o.get('optimizer')), o.get('optimizer'))}",
             f"parameters {_PLACES.get(str(o.get('params')), o.get('params'))}"]
    if "pcie_gib_per_step_per_gpu" in o:
        parts.append(f"{o['pcie_gib_per_step_per_gpu']:,.1f} GiB over PCIe per GPU and step "
                     f"(busy {fmt_seconds(o.get('pcie_down_busy_s', 0.0))} to the GPU, "
                     f"{fmt_seconds(o.get('pcie_up_busy_s', 0.0))} to the host)")
    if o.get("nvme_gib_per_node"):
        parts.append(f"{o['nvme_gib_per_node']:,.1f} GiB on NVMe per node (busy {fmt_seconds(o.get('nvme_busy_s', 0.0))})")
    if o.get("cpu_busy_s"):
        parts.append(f"CPU optimizer step {fmt_seconds(o['cpu_busy_s'])}")
    return "offload: " + "; ".join(parts)


_ENDS = ((r"gpu(\d+)", "GPU {}"), (r"nic(\d+)\.(\d+)", "node {}'s NIC {}"), (r"leaf(\d+)", "leaf switch {}"),
         (r"nvswitch(\d+)", "node {}'s NVSwitch"), (r"host(\d+)", "node {}'s host"), (r"spine", "the spine"))


def link_words(link: object) -> str:
    """``nic0.0~leaf0 down`` -> ``node 0's NIC 0 -> leaf switch 0 (down)``; other values as they are."""
    text = str(link)
    m = re.fullmatch(r"(\S+)~(\S+)(?: (up|down))?", text)
    if not m:
        return _fmt(link)
    ends = []
    for end in m.group(1, 2):
        words = next((fmt.format(*mm.groups()) for pat, fmt in _ENDS if (mm := re.fullmatch(pat, end))), end)
        ends.append(words)
    low, high = ends
    if m.group(3) == "down":
        return f"{high} -> {low} (downlink, {text})"
    if m.group(3) == "up":
        return f"{low} -> {high} (uplink, {text})"
    return f"{low} <-> {high} ({text})"
