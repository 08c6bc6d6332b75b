"""Speed of `simdist search` on the two Megatron-LM cases, pass by pass (issue 19's targets, on
one process: ``--workers 1``):

- GPT-3 175B on 1,024 A100, global batch 1536 (scenarios/gpt3-175b-1024xa100.yaml): >= 5,000 plans/s
- GPT 530B on 2,520 A100, global batch 2520 (scenarios/gpt-530b-2520xa100.yaml): < 5 s

Prints, per case, the wall-clock and CPU seconds at the end of each pass (the closed form over
the whole space, then the discrete-event re-rank of the top plans), the plans evaluated per
second, how many plans the event engine re-timed, the best plan and the paper's plan (the
scenario file's own) timed the same way. On a shared machine the CPU seconds compare better
than the wall clock.

    python benchmarks/search_speed.py [--workers N] [--engine auto|des|analytic] [--top K]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from simdist.search import Constraints, SearchResult, search  # noqa: E402
from simdist.spec.scenario import load_scenario  # noqa: E402

CASES = (  # (label, scenario, target seconds: 12,036 plans at 5,000 plans/s; 5 s)
    ("GPT-3 175B, 1,024 A100, batch 1536", "scenarios/gpt3-175b-1024xa100.yaml", 12036 / 5000),
    ("GPT 530B, 2,520 A100, batch 2520", "scenarios/gpt-530b-2520xa100.yaml", 5.0),
)


class PassClock:
    """Records when each pass of the search ends (from the progress callback)."""

    def __init__(self) -> None:
        self.start, self.cpu = time.perf_counter(), time.process_time()
        self.ends: dict[str, tuple[float, float]] = {}  # pass -> (wall, CPU) seconds at its end

    def __call__(self, stage: str, done: int, total: int) -> None:
        if done == total:
            self.ends[stage] = (time.perf_counter() - self.start, time.process_time() - self.cpu)


def run_case(label: str, path: str, target_s: float, constraints: Constraints, workers: int | None) -> bool:
    scenario = load_scenario(REPO / path)
    clock = PassClock()
    result = search(scenario, constraints, progress=clock, workers=workers)
    ok = result.seconds < target_s
    print(f"{label} ({path})")
    print(f"  {result.grid:,} grid points, {result.evaluated:,} plans evaluated, {result.feasible:,} fit")
    cpu = time.process_time() - clock.cpu
    print(f"  {result.seconds:.1f} s in all, cpu {cpu:.1f} s ({'within' if ok else 'OVER'} the {target_s:.1f} s "
          f"target), {result.plans_per_s:,.0f} plans/s; passes end at "
          + ", ".join(f"{k} {w:.1f} s (cpu {c:.1f} s)" for k, (w, c) in clock.ends.items()))
    des = result.counts_by_engine.get("des", 0)
    if result.engine == "des":
        print(f"  the event engine re-timed {des} of the top plans (and the paper's); the rest of the "
              "top keep their closed-form times (a lower bound rules them out: simdist.search.bounds)")
    _print_best(result)
    return ok


def _print_best(result: SearchResult) -> None:
    best, paper = result.best, result.baseline
    if best is not None:
        print(f"  best:  {best.candidate.label():52s} {best.step_time_s:8.2f} s  MFU {best.mfu:.1%}  "
              f"{best.peak_gib:.1f} GiB  ({best.engine})")
    if paper is not None and paper.step_time_s is not None:
        print(f"  paper: {paper.candidate.label():52s} {paper.step_time_s:8.2f} s  MFU {paper.mfu:.1%}  "
              f"{paper.peak_gib:.1f} GiB  ({paper.engine})")
    for note in result.notes:
        print(f"  note: {note}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: the CPUs)")
    p.add_argument("--engine", default="auto", choices=("auto", "des", "analytic"))
    p.add_argument("--top", type=int, default=10)
    args = p.parse_args(argv)
    constraints = Constraints(engine=args.engine, top=args.top)
    results = [run_case(label, path, target, constraints, args.workers) for label, path, target in CASES]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
