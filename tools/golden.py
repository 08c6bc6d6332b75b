"""Write the golden predictions that tests/test_golden.py compares against.

    python tools/golden.py            # rewrite tests/data/golden/predictions.json.gz

Every bundled scenario and every public validation row that maps to a scenario, predicted by
both engines: the input (a scenario file or the scenario dict a row maps to) next to the
`predict --json` object. A change to simdist that moves any of these numbers shows in the test;
regenerate only when the change is an intended, documented fix.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "data" / "golden" / "predictions.json.gz"

# A fixed calibration profile for the `local` scenarios (their speed only comes from a profile).
LOCAL_PROFILE = {
    "version": 1, "device": "golden cpu", "backend": "gloo", "peak_flops": 5.0e10,
    "memory_bandwidth_bytes_per_s": 1.0e10,
    "compute_curves": {"gemm": [[1e5, 0.2], [1e9, 0.6]], "attention": [[1e5, 0.1], [1e9, 0.4]],
                       "memory": [[1e3, 0.3], [1e8, 0.7]]},
    "kernel_overhead_s": 2e-4, "framework_overheads_s": {"tp": 1e-4, "zero3": 5e-5},
    "sync_wait_fractions": {"tp": 0.2, "zero3": 0.1},
    "links": {"intra": {"latency_s": 5e-5, "bandwidth_bytes_per_s": 2e9},
              "intra.allreduce": {"latency_s": 8e-5, "bandwidth_bytes_per_s": 1.5e9}},
}
ENGINES = ("analytic", "des")


def cases() -> list[dict]:
    """[{"id", "kind": "file" | "dict", "input"}] in a stable order."""
    from simdist.validate import moe_cp
    from simdist.validate.rows import packaged_data_dir
    from simdist.validate.training import candidates, row_to_scenario_dict, unsupported

    out = [{"id": f"scenario:{p.name}", "kind": "file", "input": str(p.relative_to(REPO))}
           for p in sorted((REPO / "scenarios").glob("*.yaml"))]
    import csv

    data = packaged_data_dir() / "training_runs.csv"
    with open(data, newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            if moe_cp.handles(row):  # experts and context parallelism: the first candidate
                if not moe_cp.unsupported(row):
                    out.append({"id": f"row:{row['run_id']}", "kind": "dict", "input": moe_cp.candidates(row)[0][0]})
                continue
            if [why for why in unsupported(row) if why != "plan (tp/pp) not stated"]:
                continue  # rows that do not map to a scenario yet (MoE, CP, FP8 recipes, ...)
            base = row_to_scenario_dict(row)
            ov = candidates(row, base)[0]
            out.append({"id": f"row:{row['run_id']}", "kind": "dict", "input": row_to_scenario_dict(row, ov)})
    return out


def predict_case(case: dict, engine: str) -> dict | str:
    """The prediction's JSON object, or the error text when the input is refused."""
    from simdist.errors import ScenarioError
    from simdist.predict import predict
    from simdist.spec.profile import CalibrationProfile
    from simdist.spec.scenario import load_scenario, scenario_from_dict

    try:
        sc = load_scenario(REPO / case["input"]) if case["kind"] == "file" else scenario_from_dict(case["input"])
        profile = CalibrationProfile.from_dict(LOCAL_PROFILE) if sc.requires_profile else None
        return predict(sc, profile=profile, engine=engine, keep_spans=False).to_dict()
    except ScenarioError as exc:
        return "refused: " + "; ".join(str(p) for p in exc.problems)


def main() -> int:
    entries = []
    for case in cases():
        entries.append({**case, "predictions": {e: predict_case(case, e) for e in ENGINES}})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_bytes(gzip.compress(json.dumps({"cases": entries}, sort_keys=True).encode(), mtime=0))
    print(f"wrote {len(entries)} cases x {len(ENGINES)} engines to {OUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
