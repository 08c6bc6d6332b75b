"""What the event engine's work limits mean in seconds and memory (simdist.sim.engine.budget).

    python benchmarks/engine_budget.py [--quick]

For scenarios grown along each input that drives the work (micro-batches, layers under ZeRO-3,
gradient buckets, pipeline stages, GPUs, parameter-server workers), each in a fresh process:
the estimate (events, spans, rank scans, link updates, as a fraction of its limit), the simpy
events the engine processed, the wall-clock seconds of ``simulate`` and the peak RSS. A run
past the limits is not simulated (its estimate is printed with "refused"). The limits were set
from this table: at a load of 1, about a minute and under a gigabyte on one core.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

CASES: dict[str, tuple[dict, dict, dict]] = {  # name -> (model, cluster, plan) changes
    "micro-batches x 25,000": ({}, {}, {"pp": 2, "global_batch_size": 100_000}),
    "micro-batches x 100,000": ({}, {}, {"pp": 2, "global_batch_size": 400_000}),
    "ZeRO-3, 2,000 layers": ({"num_layers": 2_000}, {}, {"zero_stage": 3}),
    "buckets of 64 KiB": ({}, {"num_nodes": 2}, {"ddp_bucket_size": "64 KiB"}),
    "pp 512": ({"num_layers": 512}, {"num_nodes": 64}, {"pp": 512, "global_batch_size": 1024}),
    "2^22 GPUs": ({}, {"num_nodes": 2**19}, {"global_batch_size": 2**22}),
    "2^25 GPUs": ({}, {"num_nodes": 2**22}, {"global_batch_size": 2**25}),
}

CHILD = """
import json, resource, sys, time
import simpy
from simdist.analytic.collectives import Network
from simdist.analytic.cost import CostModel
from simdist.analytic.stage import describe
from simdist.sim.engine import budget, simulate
from simdist.spec.scenario import scenario_from_dict

class Counting(simpy.Environment):
    processed = 0
    def step(self):
        Counting.processed += 1
        super().step()

import simdist.sim.engine.state as state
state.simpy.Environment = Counting
sc = scenario_from_dict(json.loads(sys.argv[1]))
d = describe(sc, CostModel(sc.cluster.gpu, sc.plan.precision), Network.of(sc.cluster))
est = budget.estimate_work(d)
out = {"load": est.load, "events": est.events, "rank_scans": est.rank_scans,
       "link_updates": est.link_updates, "driver": est.driver}
if est.within_limits:
    t = time.perf_counter()
    simulate(d, keep_spans=False)
    out.update(seconds=time.perf_counter() - t, processed=Counting.processed,
               rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
print(json.dumps(out))
"""


def scenario(model: dict, cluster: dict, plan: dict) -> dict:
    return {"name": "budget", "model": {"preset": "gpt3-1.3b", **model},
            "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1, **cluster},
            "plan": {"global_batch_size": 64, "micro_batch_size": 1, **plan}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="only the cases that take a few seconds")
    args = ap.parse_args()
    print(f"{'case':26s} {'load':>7s} {'est. events':>12s} {'processed':>11s} {'seconds':>8s} {'RSS MB':>7s}  driver")
    for name, parts in CASES.items():
        if args.quick and ("100,000" in name or "2^25" in name):
            continue
        t = time.perf_counter()
        r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(scenario(*parts))], capture_output=True,
                           text=True, timeout=900)
        if r.returncode:
            print(f"{name:26s} failed: {r.stderr.strip().splitlines()[-1]}")
            continue
        o = json.loads(r.stdout)
        ran = "seconds" in o
        print(f"{name:26s} {o['load']:7.3f} {o['events']:12,} {o.get('processed', 0):11,} "
              f"{o.get('seconds', 0.0):8.2f} {o.get('rss_mb', 0.0):7.0f}  {o['driver']}"
              + ("" if ran else f"  refused ({time.perf_counter() - t:.1f} s to say so)"))


if __name__ == "__main__":
    main()
