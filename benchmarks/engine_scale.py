"""How fast the discrete-event engine is from 64 to 16,384 GPUs.

    python benchmarks/engine_scale.py [--repeat 3] [--json out.json]

For each scenario (built in code from presets): the simulated step time (and the analytic
engine's, for reference), the wall-clock seconds of ``simulate`` and of the whole ``predict``
(lowering, simulation, memory, no spans), the simpy events processed and events per second;
then full fidelity at 64 GPUs, the topology graph of the largest cluster, and the whole
``simdist predict scenarios/gpt3-175b-1024xa100.yaml`` command as a subprocess.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from simdist.analytic.collectives import Network
from simdist.analytic.cost import CostModel
from simdist.analytic.stage import describe
from simdist.predict import predict
from simdist.sim.engine import simulate
from simdist.spec.scenario import Scenario, scenario_from_dict
from simdist.spec.topology import build_graph

ROOT = Path(__file__).resolve().parent.parent

CASES: list[tuple[str, str, str, int, dict[str, Any]]] = [
    # (label, model preset, cluster preset, nodes, plan)
    ("64 GPUs: GPT-3 13B, tp4 pp2 dp8", "gpt3-13b", "dgx-a100-80gb", 8,
     {"tp": 4, "pp": 2, "global_batch_size": 256, "sequence_parallel": True}),
    ("1,024 GPUs: GPT-3 175B, tp8 pp16 v2 dp8 (Megatron SC'21)", "gpt3-175b", "dgx-a100-80gb", 128,
     {"tp": 8, "pp": 16, "virtual_pipeline_stages": 2, "global_batch_size": 1536, "recompute": "full",
      "precision": "fp16", "flash_attention": False, "overlap_grad_reduce": False,
      "fp32_grad_accumulation": True}),
    ("4,096 GPUs: Llama 3.1 405B, tp8 pp16 v2 dp32", "llama3.1-405b", "dgx-h100", 512,
     {"tp": 8, "pp": 16, "virtual_pipeline_stages": 2, "global_batch_size": 2048, "sequence_parallel": True}),
    ("16,384 GPUs: Llama 3.1 405B, tp8 pp16 v2 dp128 (Llama 3 paper)", "llama3.1-405b", "dgx-h100", 2048,
     {"tp": 8, "pp": 16, "virtual_pipeline_stages": 2, "global_batch_size": 2048, "sequence_parallel": True,
      "zero_stage": 1}),
]


def scenario(model: str, cluster: str, nodes: int, plan: dict[str, Any]) -> Scenario:
    return scenario_from_dict({"name": f"{model}-{nodes * 8}", "model": {"preset": model},
                               "cluster": {"preset": cluster, "num_nodes": nodes}, "plan": plan})


def best_of(repeat: int, fn) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def bench_case(label: str, sc: Scenario, repeat: int, fidelity: str = "symmetric") -> dict[str, Any]:
    cost = CostModel(sc.cluster.gpu, sc.plan.precision)
    net = Network.of(sc.cluster)
    sim_s, res = best_of(repeat, lambda: simulate(describe(sc, cost, net), fidelity=fidelity, keep_spans=False))
    pred_s, _ = best_of(repeat, lambda: predict(sc, fidelity=fidelity, keep_spans=False))
    analytic = predict(sc, engine="analytic").step_time_s
    return {"case": label, "fidelity": fidelity, "gpus": sc.world_size, "microbatches": sc.plan.num_microbatches,
            "step_time_s": res.step_time, "analytic_step_time_s": analytic,
            "simulate_s": sim_s, "predict_s": pred_s, "events": res.events, "events_per_s": res.events / sim_s}


def cli_seconds(repeat: int) -> float:
    cmd = [sys.executable, "-m", "simdist.cli", "predict", str(ROOT / "scenarios/gpt3-175b-1024xa100.yaml")]
    return best_of(repeat, lambda: subprocess.run(cmd, check=True, capture_output=True))[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement; the best is kept")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    args = ap.parse_args()

    rows = []
    for label, model, cluster, nodes, plan in CASES:
        rows.append(bench_case(label, scenario(model, cluster, nodes, plan), args.repeat))
    label, model, cluster, nodes, plan = CASES[0]
    rows.append(bench_case(label + " [full fidelity]", scenario(model, cluster, nodes, plan), args.repeat, "full"))

    print(f"{'case':66s} {'mb':>4s} {'DES s':>8s} {'analytic':>8s} {'sim s':>7s} {'predict':>7s} "
          f"{'events':>8s} {'events/s':>9s}")
    for r in rows:
        print(f"{r['case']:66s} {r['microbatches']:4d} {r['step_time_s']:8.3f} {r['analytic_step_time_s']:8.3f} "
              f"{r['simulate_s']:7.3f} {r['predict_s']:7.3f} {r['events']:8d} {r['events_per_s']:9.0f}")

    largest = scenario(*CASES[-1][1:4], CASES[-1][4]).cluster
    build_graph.cache_clear()
    graph_s, g = best_of(1, lambda: build_graph(largest))
    print(f"\ntopology graph of {largest.num_nodes} nodes: {g.number_of_nodes()} vertices, "
          f"{g.number_of_edges()} links, built in {graph_s:.2f} s (the engine computes paths without it)")
    cmd_s = cli_seconds(args.repeat)
    print(f"`simdist predict scenarios/gpt3-175b-1024xa100.yaml` (whole command): {cmd_s:.2f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "graph_s": graph_s, "cli_1024_s": cmd_s}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
