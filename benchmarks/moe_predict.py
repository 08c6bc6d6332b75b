"""Time `predict` of the DeepSeek-V3 671B scenario on 1,024 H100 (TP2 PP8 VPP4 EP64), both
engines: wall-clock and CPU seconds of this process (the CPU time is what a busy shared machine
does not inflate). Run: python benchmarks/moe_predict.py [SCENARIO]"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from simdist.predict import predict
from simdist.spec.scenario import load_scenario

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "scenarios" / "deepseek-v3-1024xh100.yaml"
    sc = load_scenario(path)
    for engine, spans in (("analytic", False), ("des", False), ("des", True)):
        wall, cpu = time.perf_counter(), time.process_time()
        p = predict(sc, engine=engine, keep_spans=spans)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(f"{engine:8s} spans={spans!s:5s} {wall:6.2f} s wall {cpu:6.2f} s CPU  step {p.step_time_s:.2f} s")


if __name__ == "__main__":
    main()
