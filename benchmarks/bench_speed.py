"""The speed targets of issue 19, each measured on this code and, with ``--before``, on another
checkout of simdist (main's, before the change), alternately in one run so that the two see the
same machine load:

    python benchmarks/bench_speed.py [--before /path/to/old/checkout] [--repeat 3] [--full] [--search]
                                     [--peer-calculon /path/to/calculon/checkout]

- default event engine, one prediction in-process (``predict(..., keep_spans=False)``, the way
  ``simdist predict`` calls it), warm (the best of ``--repeat`` in one process): GPT-3 175B / 1,024 A100 (scenarios/gpt3-175b-1024xa100.yaml),
  target <= 30 ms; Megatron 1T / 3,072 A100, PP64 (scenarios/megatron-1t-3072xa100.yaml),
  target <= 100 ms; the closed form (``engine="analytic"``) on both for reference;
- the same GPT-3 and Megatron predictions as a process's first (``cold``): each repeat a fresh
  child process whose first ``predict`` is timed (the scenario loaded before the clock), nothing
  kept from an earlier prediction (the warm rows have the lowering's per-shape cache, the
  analytic model's memos and the scenario's kept hash filled); the least of the children. The event engine's modules are imported before the
  clock starts, their bytecode compiled once beforehand as for the whole command; that import
  is shown beside (``+ import``), it is part of the whole command's row;
- the whole ``simdist predict scenarios/gpt3-175b-1024xa100.yaml`` command, target <= 0.3 s,
  with its bytecode compiled once beforehand as an installed package has it (in a cache
  directory under the system's temporary directory, ``PYTHONPYCACHEPREFIX``, so that neither
  checkout gets ``__pycache__`` folders), and its table, which prints the allocator's reserved
  memory per stage (the lazy replay of simdist.analytic.allocation_trace runs for it);
- ``--full``: full fidelity (every rank) at 16,384 and 65,536 GPUs (targets 5 s and 30 s,
  under 1 GB; a checkout whose event engine would pass its work limits answers in closed form,
  the ``engine`` shown), and at 16,384 with the limits lifted (every rank simulated before
  issue 19: minutes, so only on request);
- ``--search``: ``simdist search`` on the GPT-3 175B and 530B spaces (targets >= 5,000 plans/s
  and < 5 s), one worker process.

Each in-process case runs in a child process (``--child CASE``) whose ``PYTHONPATH`` is the
checkout measured (a cold case: one child per run); the best of ``--repeat`` runs is kept, and beside the wall-clock seconds the
least CPU seconds of the runs (``cpu``: what a machine shared with other work disturbs least;
for the whole command, the CPU time of the child process). The table of benchmarks/README.md
records a run.

The peer, Calculon (github calculon-ai/calculon, an analytic model), where it can be imported
from a checkout (an editable install, or ``--peer-calculon PATH`` to the checkout, put on the
children's path; the system files come from its ``systems/`` folder; otherwise "peer: Calculon
is not installed here"): the same GPT-3 and Megatron plans, their application and execution JSON
written from our scenario by benchmarks/peer_calculon.py, as ``calculon llm`` runs them (compile
and run of its model) in-process, warm (best of ``--repeat`` in one child) and cold (a fresh
child per repeat, Calculon's import apart); with ``--search``, its ``llm-optimal-execution`` on
GPT-3 175B over 1,024 A100 (global batch at most 1,536, float16, one worker, ``-m``, no TP or
DP overlap, the system's offload tier at 0 GiB: peer_calculon.run_search; about 5 minutes). Each
peer row prints both tools' predicted step times beside their timings.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCEN = ROOT / "scenarios"
GPT3 = SCEN / "gpt3-175b-1024xa100.yaml"


def _full_scenario(gpus: int):  # Llama 3.1 405B, tp8 pp16 v2, dp = gpus / 128 (the Llama 3 paper's plan)
    from simdist.spec.scenario import scenario_from_dict

    return scenario_from_dict({"name": f"full-{gpus}", "model": {"preset": "llama3.1-405b"},
                               "cluster": {"preset": "dgx-h100", "num_nodes": gpus // 8},
                               "plan": {"tp": 8, "pp": 16, "virtual_pipeline_stages": 2, "zero_stage": 1,
                                        "global_batch_size": gpus // 8, "sequence_parallel": True}})


def child(case: str, repeat: int) -> dict[str, Any]:
    """One case in this process (its PYTHONPATH picks the checkout): best seconds and the answer."""
    from simdist.predict import predict
    from simdist.spec.scenario import load_scenario

    cpu = [float("inf")]  # the least CPU time of the runs (what a busy machine disturbs least)

    def best(fn) -> tuple[float, Any]:
        out, secs = None, float("inf")
        for _ in range(repeat):
            t, c = time.perf_counter(), time.process_time()
            out = fn()
            secs = min(secs, time.perf_counter() - t)
            cpu[0] = min(cpu[0], time.process_time() - c)
        return secs, out

    what, _, arg = case.partition(":")
    if what in ("des", "analytic"):
        sc = load_scenario(SCEN / arg)
        secs, p = best(lambda: predict(sc, engine=what, keep_spans=False))
        return {"s": secs, "cpu_s": cpu[0], "answer": p.step_time_s}
    if what == "first":  # a process's first prediction, the event engine's modules imported
        c = time.process_time()
        for mod in ("simdist.sim.engine", "simdist.sim.engine.budget", "simdist.sim.engine.grouping"):
            importlib.import_module(mod)  # what predict imports for engine="des"
        imp = time.process_time() - c
        sc = load_scenario(SCEN / arg)
        secs, p = best(lambda: predict(sc, keep_spans=False))
        return {"s": secs, "cpu_s": cpu[0], "import_cpu_s": imp, "answer": p.step_time_s}
    if what == "full":
        gpus, _, lifted = arg.partition(",")
        if lifted:  # the event engine's work limits lifted: every rank simulated, however long it takes
            from simdist.sim.engine import budget

            budget.MAX_EVENTS = budget.MAX_SPANS = budget.MAX_RANK_SCANS = budget.MAX_LINK_UPDATES = 10**12
        sc = _full_scenario(int(gpus))
        secs, p = best(lambda: predict(sc, fidelity="full", keep_spans=False, fallback=not lifted))
        return {"s": secs, "cpu_s": cpu[0], "answer": p.step_time_s, "engine": p.engine,
                "rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    if what == "search":
        from simdist.search import Constraints, search

        c = time.process_time()
        res = search(load_scenario(SCEN / arg), Constraints(), workers=1)
        return {"s": res.seconds, "cpu_s": time.process_time() - c,
                "answer": res.best.candidate.label() if res.best else "-",
                "step_s": res.best.step_time_s if res.best else None,
                "plans_per_s": res.plans_per_s, "plans": res.evaluated}
    if what.startswith("calculon"):  # the peer, from the checkout on this process's path
        import peer_calculon  # benchmarks/, this script's folder

        root, sc = _calculon_checkout(), load_scenario(SCEN / arg)
        assert root is not None
        if what == "calculon-search":
            return peer_calculon.run_search(sc, root)
        return peer_calculon.time_llm(sc, root, repeat, first=what == "calculon-first")
    raise SystemExit(f"unknown case {case}")


def _children_cpu() -> float:
    """CPU seconds (user + system) of the finished child processes so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _child(env: dict[str, str], case: str, repeat: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", case, "--repeat", str(repeat)], check=True,
                         capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def measure(tree: Path, case: str, repeat: int, peer_root: Path | None = None) -> dict[str, Any]:
    """``case`` in child processes whose path is ``tree`` (and Calculon's checkout, ``peer_root``)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in (tree, peer_root) if p)}
    if case == "cli" or case.startswith(("first:", "calculon-first:")):  # as installed: bytecode compiled once (kept outside the checkout)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(Path(tempfile.gettempdir()) / f"simdist-bench-pyc-{zlib.crc32(str(tree).encode()):08x}")
    if case.startswith(("first:", "calculon-first:")):  # one fresh process per repeat, its first prediction; the least of each
        _child(env, case, 1)  # warm-up: writes the bytecode
        runs = [_child(env, case, 1) for _ in range(repeat)]
        return {**min(runs, key=lambda r: r["s"]), "cpu_s": min(r["cpu_s"] for r in runs),
                "import_cpu_s": min(r["import_cpu_s"] for r in runs)}
    if case == "cli":
        cmd = [sys.executable, "-m", "simdist.cli", "predict", str(GPT3)]
        # run in the checkout measured: ``python -m`` puts the working directory first on the
        # path, so from another checkout it would import that one's simdist
        subprocess.run(cmd, check=True, capture_output=True, env=env, cwd=tree)  # warm-up: writes the bytecode
        secs = cpu = float("inf")
        for _ in range(repeat):
            t, c = time.perf_counter(), _children_cpu()
            subprocess.run(cmd, check=True, capture_output=True, env=env, cwd=tree)
            secs, cpu = min(secs, time.perf_counter() - t), min(cpu, _children_cpu() - c)
        return {"s": secs, "cpu_s": cpu, "answer": ""}
    return _child(env, case, repeat)


CASES: list[tuple[str, str, float | None, str]] = [
    # (case, what, target, unit of the target)
    ("des:gpt3-175b-1024xa100.yaml", "GPT-3 175B / 1,024 A100, event engine (warm)", 0.030, "s"),
    ("des:megatron-1t-3072xa100.yaml", "Megatron 1T / 3,072 A100 (PP64), event engine (warm)", 0.100, "s"),
    ("first:gpt3-175b-1024xa100.yaml", "GPT-3 175B, a process's first prediction (cold)", 0.030, "s"),
    ("first:megatron-1t-3072xa100.yaml", "Megatron 1T, a process's first prediction (cold)", 0.100, "s"),
    ("analytic:gpt3-175b-1024xa100.yaml", "GPT-3 175B / 1,024 A100, closed form", None, "s"),
    ("analytic:megatron-1t-3072xa100.yaml", "Megatron 1T / 3,072 A100, closed form", None, "s"),
    ("cli", "simdist predict gpt3-175b-1024xa100.yaml (whole command)", 0.3, "s"),
]
FULL = [("full:16384", "full fidelity, Llama 3.1 405B / 16,384 H100", 5.0, "s"),
        ("full:65536", "full fidelity, Llama 3.1 405B / 65,536 H100", 30.0, "s"),
        ("full:16384,lifted", "the same at 16,384, the engine's work limits lifted", 5.0, "s")]
SEARCH = [("search:gpt3-175b-1024xa100.yaml", "search, GPT-3 175B space", 5000.0, "plans/s"),
          ("search:gpt-530b-2520xa100.yaml", "search, 530B / 2,520 A100 space", 5.0, "s")]


def _ms(secs: float) -> str:
    return f"{secs * 1e3:.2f} ms" if secs < 0.01 else f"{secs * 1e3:.0f} ms"


def shown(r: dict[str, Any] | None, unit: str) -> str:
    if r is None:
        return "-"
    if unit == "plans/s":
        cpu = f", cpu {r['cpu_s']:.1f} s" if "cpu_s" in r else ""
        return f"{r['plans_per_s']:,.0f} plans/s ({r['s']:.1f} s{cpu})"
    v = r["s"]
    extra = f", {r['rss_gib']:.2f} GiB" if "rss_gib" in r else ""
    if "cpu_s" in r and unit != "plans/s":
        c = r["cpu_s"]
        extra += f" (cpu {_ms(c)})" if c < 1 else f" (cpu {c:.2f} s)"
    if "import_cpu_s" in r:
        extra += f" + import {r['import_cpu_s'] * 1e3:.0f} ms"
    return (_ms(v) if v < 1 else f"{v:.2f} s") + extra


def met(r: dict[str, Any], target: float | None, unit: str) -> str:
    if target is None:
        return ""
    ok = r["plans_per_s"] >= target if unit == "plans/s" else r["s"] <= target
    return "met" if ok else "NOT MET"


def same(a: Any, b: Any) -> bool:
    """The same answer (step times to 1e-9 relative, as the golden predictions)."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-9 * max(abs(a), abs(b))
    return a == b


# the peer's cases: (Calculon's case, simdist's row beside it, what)
PEER = [("calculon:gpt3-175b-1024xa100.yaml", "des:gpt3-175b-1024xa100.yaml", "GPT-3 175B / 1,024 A100 (warm)"),
        ("calculon:megatron-1t-3072xa100.yaml", "des:megatron-1t-3072xa100.yaml", "Megatron 1T / 3,072 A100 (warm)"),
        ("calculon-first:gpt3-175b-1024xa100.yaml", "first:gpt3-175b-1024xa100.yaml", "GPT-3 175B (cold)"),
        ("calculon-first:megatron-1t-3072xa100.yaml", "first:megatron-1t-3072xa100.yaml", "Megatron 1T (cold)")]
PEER_SEARCH = ("calculon-search:gpt3-175b-1024xa100.yaml", "search:gpt3-175b-1024xa100.yaml",
               "search, GPT-3 175B on 1,024 A100, one process")


def _calculon_checkout() -> Path | None:
    """The folder above the importable ``calculon`` package (its checkout, for an editable install)."""
    spec = importlib.util.find_spec("calculon")
    return None if spec is None or spec.origin is None else Path(spec.origin).resolve().parents[1]


def calculon_root(given: Path | None) -> Path | None:
    """The Calculon checkout to run: ``given``, or the one an importable ``calculon`` comes from;
    None (said why) where there is none."""
    if given is not None:
        if not (given / "calculon" / "__init__.py").is_file():
            raise SystemExit(f"--peer-calculon {given}: no calculon package there")
        return given.resolve()
    root = _calculon_checkout()
    if root is None:
        print("peer: Calculon is not installed here, so no peer is timed")
        return None
    if not (root / "systems").is_dir():
        print("peer: Calculon is installed, but not from a checkout (no systems/ beside it), "
              "so no peer is timed: give --peer-calculon PATH")
        return None
    return root


def _step(r: dict[str, Any], key: str = "answer") -> str:
    return "" if r.get(key) is None else f", step {r[key]:.2f} s"


def peer(root: Path | None, rows: list[dict[str, Any]], repeat: int, search: bool) -> None:
    """Calculon on simdist's cases, each row beside simdist's (this checkout's) timing and answer."""
    if root is None:
        return
    found = re.search(r"__version__ = '([^']+)'", (root / "calculon" / "__init__.py").read_text())
    commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    print(f"\npeer: Calculon {found.group(1) if found else '?'} ({commit or 'no git'}) at {root}: "
          "analytic; simdist: its default event engine")
    print(f"{'':40s} {'simdist':>50s} {'Calculon':>50s}")
    ours = {row["case"]: row["after"] for row in rows}
    for case, mine, what in PEER + ([PEER_SEARCH] if search else []):
        unit = "plans/s" if "search" in case else "s"
        try:
            r = measure(ROOT, case, 1 if unit == "plans/s" else repeat, root)
        except subprocess.CalledProcessError as e:
            print(f"{what:40s} Calculon failed: {(e.stderr or '').strip().splitlines()[-1:]}")
            continue
        if unit == "s":
            print(f"{what:40s} {shown(ours[mine], unit) + _step(ours[mine]):>50s} "
                  f"{shown(r, unit) + _step(r):>50s}", flush=True)
            continue
        cell = f"{r['plans_per_s']:,.0f} plans/s ({r['s']:.1f} s; the command {r['command_s']:.1f} s)"
        print(f"{what:40s} {shown(ours[mine], unit):>50s} {cell:>50s}")
        print(f"    simdist: {ours[mine]['plans']:,} plans, best {ours[mine]['answer']}{_step(ours[mine], 'step_s')}")
        print(f"    Calculon: {r['plans']:,.0f} executions ({r['good']:,.0f} valid), best {r['label']}{_step(r)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, help="another simdist checkout to measure alongside")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement; the best is kept")
    ap.add_argument("--full", action="store_true", help="also full fidelity at 16,384 and 65,536 GPUs")
    ap.add_argument("--search", action="store_true", help="also the two search spaces")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    ap.add_argument("--peer-calculon", type=Path, help="a Calculon checkout to time beside simdist "
                    "(default: the checkout an importable calculon comes from)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.repeat)))
        return 0
    root = calculon_root(args.peer_calculon)  # said first: a missing peer is known before the run
    cases = CASES + (FULL if args.full else []) + (SEARCH if args.search else [])
    rows = []
    print(f"{'':58s} {'before':>34s} {'after':>34s}  target")
    for case, what, target, unit in cases:
        rep = 1 if case.startswith(("full", "search")) else args.repeat
        before = measure(args.before, case, rep) if args.before else None
        after = measure(ROOT, case, rep)
        goal = "" if target is None else (f">= {target:,.0f} {unit}" if unit == "plans/s" else
                                          f"<= {target * 1e3:.0f} ms" if target < 1 else f"<= {target:g} s")
        ratio = f"x{before['s'] / after['s']:.1f}" if before else ""
        if before and "cpu_s" in before and "cpu_s" in after:
            ratio += f" (cpu x{before['cpu_s'] / after['cpu_s']:.1f})"
        print(f"{what:58s} {shown(before, unit):>34s} {shown(after, unit):>34s}  {goal:14s} "
              f"{met(after, target, unit):8s} {ratio}", flush=True)
        if before and not same(before["answer"], after["answer"]):
            print(f"    answers differ: before {before['answer']} ({before.get('engine', '')}), "
                  f"after {after['answer']} ({after.get('engine', '')})")
        rows.append({"case": case, "what": what, "target": target, "unit": unit, "before": before, "after": after})
    peer(root, rows, args.repeat, args.search)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
