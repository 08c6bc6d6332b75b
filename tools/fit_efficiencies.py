"""Fit the catalog's starting efficiencies (large-GEMM and fused-attention fractions of peak)
per GPU generation to the public validation runs, and print them with the fit's residuals.

This is the calibration step the catalog's `efficiency` figures come from: one pair of numbers
per GPU generation, fitted over every public run on it (dozens of runs, several frameworks,
model sizes and sequence lengths), never per run. Run it after changing the cost model, then
copy the printed figures into simdist/catalog/gpus.yaml by hand. The fit itself is
simdist.validate.fit (coarse grid, then compass search); `simdist validate --cv` refits it
without each source group to score what it does on runs it was not fitted to.

    python tools/fit_efficiencies.py [--data DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from simdist.validate.fit import fit, log_errors
    from simdist.validate.training import build_cases

    ap = argparse.ArgumentParser()
    ap.add_argument("--data", help="validation data folder (default: the copy shipped with simdist)")
    args = ap.parse_args()
    cases, _ = build_cases(args.data)
    result = fit(cases)
    for gen, eff in result.per_generation.items():
        rows = [c for c in cases if c.gpu_generation == gen]
        errs = log_errors(rows, eff)
        mean = sum(abs(e) for e in errs) / len(errs)
        bias = sum(errs) / len(errs)
        fp8 = sum(1 for c in rows if c.scenario.plan.precision == "fp8")
        fp8_text = f", fp8_gemm {eff['fp8_gemm']:.3f} ({fp8} FP8 runs)" if "fp8_gemm" in eff else ""
        print(f"{gen}: gemm {eff['gemm']:.3f}, attention {eff['attention']:.3f}{fp8_text}  ({len(rows)} runs, "
              f"mean |log err| {mean:.3f}, bias {bias:+.3f}, worst {max(abs(e) for e in errs):.3f})")
    if result.pooled:
        print(f"pooled (a generation without runs): gemm {result.pooled['gemm']:.3f}, "
              f"attention {result.pooled['attention']:.3f}")


if __name__ == "__main__":
    main()
