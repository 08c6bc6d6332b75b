"""The calibration check on this machine: fit on microbenchmarks, the DP run and
one TP and one ZeRO-3 run of another shape (micro-batch 2: the framework overheads of DTensor
and FSDP2), then predict plans that were NOT used for fitting (TP, PP 1F1B, PP GPipe, ZeRO-3,
all at micro-batch 4) at 2 ranks.

    python benchmarks/local_calibration.py [--out out/calibration] [--repeats 3] [--steps 5]

Writes the profile, the run store and an HTML comparison under --out, and prints the executor's
run-to-run spread next to the prediction errors. Run it on a quiet machine: other processes on
the two cores slow the executor but not the fitted profile.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

FIT = ["scenarios/local-dp.yaml", "scenarios/local-tp-fit.yaml", "scenarios/local-zero3-fit.yaml"]
HELD_OUT = ["scenarios/local-tp.yaml", "scenarios/local-pp-1f1b.yaml", "scenarios/local-pp-gpipe.yaml",
            "scenarios/local-zero3.yaml"]


def simdist(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simdist.cli", *args], check=True, text=True, capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out/calibration")
    ap.add_argument("--repeats", type=int, default=3, help="runs of the DP plan to measure the spread")
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    db, profile = str(out / "runs.db"), str(out / "profile.json")

    print(simdist("calibrate", "--nproc", "2", "--out", profile, "--steps", str(args.steps), "--db", db, *FIT).stdout)
    medians = []
    for i in range(args.repeats):
        m = out / f"spread-{i}.json"
        simdist("run", FIT[0], "--nproc", "2", "--steps", str(args.steps), "--out", str(m), "--no-store")
        medians.append(json.loads(m.read_text())["step_time_s"])
    mid = statistics.median(medians)
    print(f"executor run-to-run spread (local-dp, {args.repeats} runs of {args.steps} steps): "
          f"medians {', '.join(f'{t:.4f}' for t in medians)} s -> (max-min)/median = {(max(medians) - min(medians)) / mid:.1%}")
    for f in HELD_OUT:
        simdist("run", f, "--nproc", "2", "--steps", str(args.steps), "--out", str(out / (Path(f).stem + ".json")), "--db", db)
    print(simdist("compare", "--profile", profile, "--db", db, "--html", str(out / "compare.html")).stdout)


if __name__ == "__main__":
    main()
