"""Fit the catalog's starting efficiencies (large-GEMM and fused-attention fractions of peak)
per GPU to the public validation runs, and print them with the fit's residuals.

This is the calibration step the catalog's `efficiency` figures come from: one pair of numbers
per GPU generation, fitted over every public run on that GPU (dozens of runs, several
frameworks, model sizes and sequence lengths), never per run. Run it after changing the cost
model, then copy the printed figures into simdist/catalog/gpus.yaml by hand.

    python tools/fit_efficiencies.py [--data DIR]
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace

from simdist.predict import predict
from simdist.validate import build_cases

GEMM = [round(0.40 + 0.025 * i, 3) for i in range(23)]
ATTN = [round(0.10 + 0.025 * i, 3) for i in range(27)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", help="validation data folder (default: the copy shipped with simdist)")
    args = ap.parse_args()
    cases, _ = build_cases(args.data)
    by_gpu: dict[str, list] = {}
    for c in cases:
        by_gpu.setdefault(c.scenario.cluster.gpu.name, []).append(c)
    for gpu, group in sorted(by_gpu.items()):
        best = None
        for g in GEMM:
            for a in ATTN:
                errs = []
                for c in group:
                    sc = c.scenario
                    eff = {**sc.cluster.gpu.efficiency, "gemm": g, "attention": a}
                    if "fp8_gemm" in eff:
                        eff["fp8_gemm"] = g * sc.cluster.gpu.efficiency["fp8_gemm"] / sc.cluster.gpu.efficiency["gemm"]
                    gpu_spec = replace(sc.cluster.gpu, efficiency=eff)
                    sc2 = replace(sc, cluster=replace(sc.cluster, gpu=gpu_spec))
                    t = predict(sc2, engine="analytic", keep_spans=False).step_time_s
                    errs.append(math.log(t / c.measured_step_s))
                score = sum(abs(e) for e in errs) / len(errs)
                if best is None or score < best[0]:
                    best = (score, g, a, sum(errs) / len(errs))
        assert best
        print(f"{gpu}: gemm {best[1]}, attention {best[2]}  ({len(group)} runs, mean |log err| {best[0]:.3f}, bias {best[3]:+.3f})")


if __name__ == "__main__":
    main()
