"""`simdist search FILE`: the fastest plans that fit, as a table, the contract's JSON or a CSV.

Exit codes: 0 with at least one plan that fits, 1 when none fits (the report still prints),
2 for bad input (each problem on standard error, naming the flag or the scenario field).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from typing import TYPE_CHECKING, Any

from simdist.cli.inputs import (
    add_profile_argument,
    add_set_argument,
    load_profile_arg,
    load_scenario_arg,
)
from simdist.errors import Collector, Problem, ScenarioError
from simdist.spec.plan import RECOMPUTE, SCHEDULES

if TYPE_CHECKING:
    from simdist.search import Constraints, PlanResult, SearchResult

EXIT_NONE_FITS = 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Declare the options of `simdist search` (values are checked in ``constraints_from_args``
    so that a bad one gets a message naming its flag and exit code 2)."""
    p.description = ("Keep the model, the cluster, the global batch and the precision of FILE and "
                     "search the rest of the plan for the fastest one that fits.")
    p.epilog = "Exit code 0: plans found; 1: no plan fits; 2: bad input."
    p.add_argument("file", help="scenario YAML file")
    add_set_argument(p)
    p.add_argument("--top", default="10", metavar="K", help="plans to show (default 10)")
    p.add_argument("--json", action="store_true", help="print the contract's JSON object")
    p.add_argument("--csv", metavar="FILE", help="write every evaluated plan to FILE")
    p.add_argument("--max-tp", metavar="N", help="largest tensor-parallel size (default: GPUs per node)")
    p.add_argument("--pp", metavar="LIST", help="pipeline sizes to try, e.g. 8 or 4,8,16 (uneven splits allowed)")
    p.add_argument("--max-cp", metavar="N", help="largest context-parallel size, powers of 2 (default 8 for "
                   "sequences of 16K tokens or more, else 1)")
    p.add_argument("--max-ep", metavar="N", help="largest expert-parallel size (default: all; models with experts)")
    p.add_argument("--max-etp", default="1", metavar="N", help="largest expert tensor-parallel size (default 1)")
    p.add_argument("--uneven-pp", action="store_true", help="also try pp that does not divide the layers")
    p.add_argument("--max-virtual-stages", default="8", metavar="N",
                   help="most interleaved chunks per stage (default 8)")
    p.add_argument("--max-micro-batch", default="8", metavar="N", help="largest micro-batch size (default 8)")
    p.add_argument("--schedules", metavar="LIST", help=f"allowed schedules (default all: {','.join(SCHEDULES)})")
    p.add_argument("--zero-stages", metavar="LIST", help="allowed ZeRO stages (default 0,1,2,3)")
    p.add_argument("--recompute", metavar="LIST", help=f"allowed recompute modes (default {','.join(RECOMPUTE)})")
    p.add_argument("--memory-headroom", default="0", metavar="F",
                   help="fraction of GPU memory to keep free, e.g. 0.1 (default 0)")
    p.add_argument("--rerank", metavar="N",
                   help="most plans the discrete-event engine may re-time (default max(20, top); 0: none); "
                        "it skips those that cannot reach the top --rerank-exact places, which keep their "
                        "closed-form time (engine column: analytic)")
    p.add_argument("--rerank-exact", metavar="N",
                   help="the top N places are provably those that re-timing every candidate with the "
                        "discrete-event engine gives (default 1: the winner; N = --top: the whole table)")
    p.add_argument("--rerank-window", default="0.2", metavar="F",
                   help="beyond the top K, re-time only plans within this fraction of the K-th's time (default 0.2)")
    p.add_argument("--engine", default="auto",
                   help="re-ranking engine: auto or des (the discrete-event engine re-ranks the top plans), "
                        "analytic (the closed form alone)")
    p.add_argument("--keep-dominated", action="store_true",
                   help="also rank plans another plan beats on both step time and memory")
    p.add_argument("--rank-by", default="time", choices=("time", "cost"),
                   help="order the plans by step time or by dollars per step (cluster.usd_per_gpu_hour; the "
                        "search keeps the cluster, so the two orders agree and cost adds the dollars)")
    p.add_argument("--tokens", metavar="N", help="also price a run to N tokens per plan (300e9, 300B, 15T)")
    p.add_argument("--workers", metavar="N", help="worker processes (default: the CPUs available)")
    add_profile_argument(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar on standard error")


def _int(c: Collector, flag: str, text: str | None, minimum: int = 1) -> int | None:
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        what = "a positive whole number" if minimum == 1 else f"a whole number >= {minimum}"
        c.add(flag, f"must be {what}, got {text!r}")
        return None
    return value


def _list(c: Collector, flag: str, text: str | None, allowed: tuple[Any, ...], cast: type = str
          ) -> tuple[Any, ...] | None:
    if text is None:
        return None
    items = [t.strip() for t in text.split(",") if t.strip()]
    out = []
    for item in items:
        try:
            value = cast(item)
        except ValueError:
            value = item
        if value not in allowed:
            c.add(flag, f"{item!r} is not one of {', '.join(map(str, allowed))}")
        else:
            out.append(value)
    if not items:
        c.add(flag, f"needs at least one of {', '.join(map(str, allowed))}")
    return tuple(dict.fromkeys(out))


def _pp_list(c: Collector, text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    values = [_int(c, "--pp", t.strip()) for t in text.split(",")]
    return tuple(v for v in values if v is not None)


def _fraction(c: Collector, flag: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        c.add(flag, f"must be a fraction in [0, 1), e.g. 0.1, got {text!r}")
        return 0.0
    return value


def _nonnegative(c: Collector, flag: str, text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        c.add(flag, f"must be a number >= 0, got {text!r}")
        return None
    return value


def constraints_from_args(args: argparse.Namespace) -> tuple[Constraints, int | None, list[Problem]]:
    """(Constraints, workers, problems) from the command line: each problem names its flag, and
    a bad value is left at its default so that the other flags can still be checked."""
    from simdist.search import Constraints

    c = Collector()
    values: dict[str, Any] = {
        "top": _int(c, "--top", args.top),
        "max_tp": _int(c, "--max-tp", args.max_tp),
        "pp": _pp_list(c, args.pp),
        "max_cp": _int(c, "--max-cp", args.max_cp),
        "max_ep": _int(c, "--max-ep", args.max_ep),
        "max_etp": _int(c, "--max-etp", args.max_etp),
        "uneven_pp": args.uneven_pp,
        "max_virtual_stages": _int(c, "--max-virtual-stages", args.max_virtual_stages),
        "max_micro_batch": _int(c, "--max-micro-batch", args.max_micro_batch),
        "schedules": _list(c, "--schedules", args.schedules, SCHEDULES),
        "zero_stages": _list(c, "--zero-stages", args.zero_stages, (0, 1, 2, 3), int),
        "recompute": _list(c, "--recompute", args.recompute, RECOMPUTE),
        "memory_headroom": _fraction(c, "--memory-headroom", args.memory_headroom),
        "rerank": _int(c, "--rerank", args.rerank, minimum=0),
        "rerank_window": _nonnegative(c, "--rerank-window", args.rerank_window),
        "rerank_exact": _int(c, "--rerank-exact", args.rerank_exact),
        "keep_dominated": args.keep_dominated,
    }
    if args.engine not in ("auto", "des", "analytic"):
        c.add("--engine", f"{args.engine!r} is not one of auto, des, analytic")
    else:
        values["engine"] = args.engine
    workers = _int(c, "--workers", args.workers)
    return Constraints(**{k: v for k, v in values.items() if v is not None}), workers, c.problems


def main(args: argparse.Namespace) -> int:
    from simdist.economics import parse_tokens
    from simdist.search import search

    constraints, workers, problems = constraints_from_args(args)
    tokens = None
    if args.tokens:
        try:
            tokens = parse_tokens(args.tokens)
        except ScenarioError as exc:
            problems += exc.problems
    scenario = load_scenario_arg(args)
    flagged = {p.field for p in problems}
    problems += [p for p in constraints.problems(scenario) if p.field not in flagged]
    if problems:
        raise ScenarioError(problems)
    bars = ProgressBars(enabled=not args.no_progress)
    try:
        result = search(scenario, constraints, progress=bars, profile=load_profile_arg(args.profile),
                        workers=workers)
    finally:
        bars.close()
    price = scenario.cluster.usd_per_gpu_hour
    per_step = scenario.plan.global_batch_size * scenario.model.seq_length  # tokens per step
    if args.rank_by == "cost":
        if price is None:
            raise ScenarioError(Problem("--rank-by", "cost needs cluster.usd_per_gpu_hour (the cluster "
                                        "preset has no price: give one with --set cluster.usd_per_gpu_hour=2.5)"))
        rank_by_cost(result, price)
    if args.csv:
        write_csv(args.csv, result.to_rows("all"))
    for note in result.notes:
        print(f"note: {note}", file=sys.stderr)
    if args.json:  # the contract's object plus "cost" (new keys only)
        print(json.dumps({**result.to_dict(), "cost": cost_dict(result, price, tokens, args.rank_by, per_step)}, indent=2))
    else:
        print(report(result, args.file, price, tokens, per_step, exact=constraints.rerank_exact))
    return 0 if result.plans else EXIT_NONE_FITS


class ProgressBars:
    """tqdm bars on standard error, one per stage; tqdm hides them when stderr is not a terminal."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.bars: dict[str, Any] = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        bar = self.bars.get(stage)
        if bar is None:
            from tqdm import tqdm

            desc = {"analytic": "closed form", "des": "discrete-event"}.get(stage, stage)
            bar = self.bars[stage] = tqdm(total=total, desc=desc, unit="plan", file=sys.stderr,
                                          disable=None, leave=False)
        bar.update(done - bar.n)

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()


def write_csv(path: str, rows: list[dict[str, Any]]) -> None:
    """Every evaluated plan, one row each (``SearchResult.to_rows``)."""
    from simdist.search import ROW_FIELDS

    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(ROW_FIELDS))
        writer.writeheader()
        writer.writerows(rows)


# --- cost -------------------------------------------------------------------------------------


def usd_per_step(p: PlanResult, world_size: int, price: float | None) -> float | None:
    """Dollars per step: world_size x step time / 3600 x price (simdist.economics)."""
    if price is None or not p.step_time_s:
        return None
    return world_size * p.step_time_s / 3600 * price


def rank_by_cost(result: SearchResult, price: float) -> None:
    """Order the top plans by dollars per step (ties: step time) and number them again."""
    ordered = sorted(result.plans, key=lambda p: (usd_per_step(p, result.world_size, price) or float("inf"),
                                                  p.step_time_s or float("inf")))
    for i, p in enumerate(ordered, 1):
        p.rank = i
    result.plans[:] = ordered


def cost_dict(result: SearchResult, price: float | None, tokens: float | None, rank_by: str,
              tokens_per_step: int) -> dict[str, Any]:
    """Per ranked plan: dollars per step and, with ``tokens``, to train to that many tokens."""
    plans = []
    for p in result.plans:
        step = usd_per_step(p, result.world_size, price)
        row: dict[str, Any] = {"rank": p.rank, "usd_per_step": step}
        if tokens is not None:
            row["usd_to_tokens"] = step * tokens / tokens_per_step if step is not None else None
            row["days_to_tokens"] = (p.step_time_s or 0.0) * tokens / tokens_per_step / 86400
        plans.append(row)
    return {"rank_by": rank_by, "usd_per_gpu_hour": price, "tokens": tokens, "plans": plans}


# --- the table ----------------------------------------------------------------------------

_HEADERS = ["#", "step time", "MFU", "peak (GiB)", "tp", "pp", "dp", "cp", "ep", "v", "schedule", "zero", "sp",
            "recompute", "mbs", "engine", "variants"]


def _row(rank: int | None, p: PlanResult, dollars: list[str], seconds_per_unit: float) -> list[Any]:
    c = p.candidate
    variants = f"{p.variants} ({', '.join(p.equivalent)})" if p.variants > 1 else "1"
    return [rank, f"{p.step_time_s / seconds_per_unit:,.3f}" if p.step_time_s else "-", *dollars,
            f"{p.mfu:.1%}" if p.mfu is not None else "-", f"{p.peak_gib:.1f}", c.tp, c.pp, c.dp, c.cp, c.ep, c.v,
            c.schedule, c.zero, "yes" if c.sp else "no", c.recompute, c.mbs, p.engine or "-", variants]


def report(result: SearchResult, source: str = "FILE", price: float | None = None,
           tokens: float | None = None, tokens_per_step: int = 0, exact: int = 1) -> str:
    """The human-readable search report: header, top plans, rejections, the file's own plan.
    ``exact``: the constraints' rerank_exact (the places the event engine orders for certain)."""
    from simdist.table import table

    r = result
    usable = r.capacity_gib * (1 - r.memory_headroom)
    lines = [f"{r.name}: {r.world_size:,} GPUs, global batch {r.global_batch_size}, {r.precision}, "
             f"{r.capacity_gib:.0f} GiB per GPU" + (f" (plans must fit in {usable:.1f} GiB)" if r.memory_headroom else ""),
             f"{r.grid:,} grid points -> {r.evaluated:,} plans evaluated in {r.seconds:.1f} s "
             f"({r.plans_per_s:,.0f} plans/s); {r.feasible:,} fit; " + _ranked_by(r, exact), ""]
    if r.plans:
        from simdist.table import time_unit

        unit, per = time_unit(max(p.step_time_s or 0.0 for p in r.plans))
        headers, rows = list(_HEADERS), []
        headers[1] = f"step time ({unit})"
        if price is not None:
            headers[2:2] = ["$ per step"] + ([f"$ to {tokens:,.3g} tokens"] if tokens else [])
        for p in r.plans:
            dollars = []
            step = usd_per_step(p, r.world_size, price)
            if price is not None:
                dollars.append(f"{step:,.4g}" if step is not None else "-")
                if tokens:
                    dollars.append(f"{step * tokens / tokens_per_step:,.0f}" if step is not None else "-")
            rows.append(_row(p.rank, p, dollars, per))
        lines.append(table(headers, rows, align="rr" + "r" * (len(headers) - len(_HEADERS)) + "rrrrrrrrlrlrrll"))
    else:
        lines.append("no plan fits: try a larger --memory-headroom margin, more pipeline stages, or recompute")
    rej = r.rejected
    lines += ["", f"rejected: {rej['invalid']:,} invalid, {rej['does_not_fit']:,} do not fit, "
              f"{rej['dominated']:,} dominated (another plan is faster and no bigger); "
              f"{rej['equivalent']:,} equivalent variants grouped"]
    if r.invalid_by_rule:
        lines.append("invalid grid points, by reason:")
        lines += [f"  {n:>12,}  {why}" for why, n in sorted(r.invalid_by_rule.items(), key=lambda kv: -kv[1])]
    if price is not None:
        lines.append(f"cost at ${price:,.2f} per GPU-hour (cluster.usd_per_gpu_hour): GPUs x step time x price")
    lines += _baseline_lines(r, source)
    return "\n".join(lines)


def _ranked_by(r: SearchResult, exact: int) -> str:
    """What ordered the table: the closed form, or the event engine for the top ``exact`` places
    (the plans the bound ruled out of them keep their closed-form time, simdist.search.driver)."""
    if r.engine != "des":
        return "plans timed by the closed-form engine"
    places = "the winner is" if exact == 1 else f"the top {exact} places are"
    return (f"ranked by the discrete-event engine: {places} exact (as if it re-timed every candidate); "
            f"{r.counts_by_engine.get('des', 0):,} plans re-timed, the others keep their closed-form "
            "time (engine column: analytic)")


def _baseline_lines(r: SearchResult, source: str) -> list[str]:
    b = r.baseline
    if b is None or b.step_time_s is None:
        return []
    fits = "fits" if b.feasible else "does NOT fit"
    out = [f"the plan in {source}: {b.candidate.label()}: {b.step_time_s:.3f} s, MFU {b.mfu:.1%}, "
           f"{b.peak_gib:.1f} GiB ({fits})"]
    if r.best is not None and r.best.step_time_s:
        out.append(f"  -> the best plan found is {b.step_time_s / r.best.step_time_s:.2f}x as fast")
    return out
