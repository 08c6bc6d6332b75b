"""The speed targets of issue 19, each printed as seconds and as a ratio to the target.

    python benchmarks/bench_speed.py [--repeat 3] [--full] [--search] [--json out.json]

Measured in one process (the in-process cases) and as subprocesses (the whole command):

- default event engine, one prediction in-process (``predict(..., keep_spans=False)``, the way
  ``simdist predict`` calls it): GPT-3 175B / 1,024 A100 (scenarios/gpt3-175b-1024xa100.yaml),
  target <= 30 ms; Megatron 1T / 3,072 A100, PP64 (scenarios/megatron-1t-3072xa100.yaml),
  target <= 100 ms; the closed form (``engine="analytic"``) on both for reference;
- the whole ``simdist predict scenarios/gpt3-175b-1024xa100.yaml`` command, target <= 0.3 s;
- ``--full``: full fidelity (every rank) at 16,384 and 65,536 GPUs (targets 5 s and 30 s,
  under 1 GB): minutes before issue 19, so only on request;
- ``--search``: ``simdist search`` on the GPT-3 175B and 530B spaces (targets >= 5,000 plans/s
  and < 5 s), one worker process.

A peer (Calculon's ``llm`` on the same case) is timed only where it is installed. The machine
these ran on is shared and noisy: compare the numbers of one run (``before`` is main's code run
by the same script with ``PYTHONPATH`` pointing at it), not numbers from different runs. The
table of benchmarks/README.md records the before/after of issue 19.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GPT3 = ROOT / "scenarios" / "gpt3-175b-1024xa100.yaml"
ONE_T = ROOT / "scenarios" / "megatron-1t-3072xa100.yaml"
GPT530 = ROOT / "scenarios" / "gpt-530b-2520xa100.yaml"


def best_of(repeat: int, fn) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def row(rows: list[dict], what: str, seconds: float, target: float | None, note: str = "",
        higher_is_better: bool = False, unit: str = "s") -> None:
    rows.append({"what": what, "value": seconds, "unit": unit, "target": target, "note": note,
                 "met": None if target is None else (seconds >= target if higher_is_better else seconds <= target)})
    shown = f"{seconds * 1e3:10.1f} ms" if unit == "s" and seconds < 1 else f"{seconds:10.3g} {unit}"
    goal = "" if target is None else (f"target {'>=' if higher_is_better else '<='} "
                                      + (f"{target * 1e3:g} ms" if unit == "s" and target < 1 else f"{target:g} {unit}"))
    met = "" if target is None else ("met" if rows[-1]["met"] else "NOT MET")
    print(f"{what:62s} {shown}  {goal:22s} {met:8s} {note}", flush=True)


def in_process(rows: list[dict], repeat: int) -> None:
    from simdist.predict import predict
    from simdist.spec.scenario import load_scenario

    for label, path, target in (("GPT-3 175B / 1,024 A100, event engine", GPT3, 0.030),
                                ("Megatron 1T / 3,072 A100 (PP64), event engine", ONE_T, 0.100)):
        sc = load_scenario(path)
        secs, p = best_of(repeat, lambda sc=sc: predict(sc, keep_spans=False))
        row(rows, label, secs, target, f"step {p.step_time_s:.4f} s")
        secs, p = best_of(repeat, lambda sc=sc: predict(sc, engine="analytic", keep_spans=False))
        row(rows, label.replace("event engine", "closed form"), secs, None, f"step {p.step_time_s:.4f} s")


def whole_command(rows: list[dict], repeat: int) -> None:
    cmd = [sys.executable, "-m", "simdist.cli", "predict", str(GPT3)]
    secs, _ = best_of(repeat, lambda: subprocess.run(cmd, check=True, capture_output=True))
    row(rows, "simdist predict gpt3-175b-1024xa100.yaml (whole command)", secs, 0.3)


FULL_CHILD = """
import resource, sys, time
from simdist.predict import predict
from simdist.spec.scenario import scenario_from_dict
nodes = int(sys.argv[1])
sc = scenario_from_dict({"name": "full", "model": {"preset": "llama3.1-405b"},
    "cluster": {"preset": "dgx-h100", "num_nodes": nodes},
    "plan": {"tp": 8, "pp": 16, "virtual_pipeline_stages": 2, "global_batch_size": 2048 * nodes // 2048,
             "sequence_parallel": True, "zero_stage": 1}})
t = time.perf_counter()
p = predict(sc, fidelity="full", keep_spans=False)
print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, p.step_time_s)
"""


def full_fidelity(rows: list[dict]) -> None:
    for gpus, target in ((16384, 5.0), (65536, 30.0)):
        out = subprocess.run([sys.executable, "-c", FULL_CHILD, str(gpus // 8)], check=True, capture_output=True,
                             text=True, cwd=ROOT).stdout.split()
        secs, gib, step = float(out[0]), float(out[1]), float(out[2])
        row(rows, f"full fidelity, Llama 3.1 405B / {gpus:,} H100", secs, target,
            f"peak RSS {gib:.2f} GiB (target < 1 GB), step {step:.3f} s")


def searches(rows: list[dict]) -> None:
    from simdist.search import Constraints, search
    from simdist.spec.scenario import load_scenario

    for label, path in (("GPT-3 175B space", GPT3), ("530B / 2,520 A100 space", GPT530)):
        res = search(load_scenario(path), Constraints(), workers=1)
        row(rows, f"search, {label}: plans/s", res.plans_per_s, 5000.0,
            f"{res.evaluated:,} plans", higher_is_better=True, unit="plans/s")
        row(rows, f"search, {label}: seconds", res.seconds, 5.0 if "530B" in label else None,
            f"best {res.best.candidate.label() if res.best else '-'}")


def peer(rows: list[dict]) -> None:
    if importlib.util.find_spec("calculon") is None:
        print("peer: Calculon is not installed here (pip install calculon from its repository); not timed")
        return
    cmd = [sys.executable, "-m", "calculon", "llm", "--help"]
    secs, _ = best_of(1, lambda: subprocess.run(cmd, capture_output=True))
    row(rows, "peer: Calculon (start-up, `calculon llm --help`)", secs, None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement; the best is kept")
    ap.add_argument("--full", action="store_true", help="also full fidelity at 16,384 and 65,536 GPUs")
    ap.add_argument("--search", action="store_true", help="also the two search spaces")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    args = ap.parse_args()
    rows: list[dict] = []
    in_process(rows, args.repeat)
    whole_command(rows, args.repeat)
    if args.full:
        full_fidelity(rows)
    if args.search:
        searches(rows)
    peer(rows)
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
