"""Rank 0's measurement (a :class:`simdist.spec.measurement.Measurement`): the contract's keys
from every rank's report, plus extras.

Each training rank reports its per-step records (loss, wall time, phases) of the measured
steps, its model-state and activation bytes and its collectives of the instrumented step; with
gradient compression the bytes its hooks put on the wire; in the parameter-server modes each
server reports its traffic, memory and the staleness it saw. The restart history comes from the
run directory's ``events.jsonl`` (:func:`restart_history`).

Extra keys (beyond the contract's measurement):

- ``comm_bytes_per_step``: per kind, the mean over ranks of the bytes (buffer sizes, the S of
  nccl-tests) of the collectives of one step, as simdist.analytic.data_parallel counts them;
- ``compression``: method and ``dp_bytes_per_step`` (mean over ranks, per kind and in total) of
  the gradient sync the hooks did (executor.compression);
- ``ps``: workers, servers, ``bytes_per_server_per_step`` (in + out, mean over servers, the
  ``per_server_bytes`` of simdist.analytic.param_server.ps_traffic), ``worker_bytes_per_step`` (one
  push), the staleness histogram (async) and each server's report;
- ``restarts``, ``restart_s`` (mean seconds from a failure to the restarted group being ready
  to train again: detection, restart, re-initialisation and checkpoint load, the goodput model's
  ``restart_time``), ``restart_s_each``, ``lost_steps`` (steps computed again after a restart) and
  ``checkpoint`` (saves and their seconds).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from executor.checks import as_run
from executor.faults import read_events
from executor.hostload import training_thread_cpus, transport_threads
from executor.timeline import timeline_of
from simdist.spec.measurement import Measurement
from simdist.spec.scenario import Scenario

GIB = 2**30


def _median_index(values: list[float]) -> int:
    """Index of the median (the lower middle one for an even count)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    return order[(len(order) - 1) // 2]


def restart_history(events: list[dict[str, Any]], attempts: int) -> dict[str, Any]:
    """restart_s of each restart: from the first failure (a rank's exception, or the moment a
    rank hung) of attempt a-1 to the last rank of attempt a being ready to train (resumed)."""
    each: list[float] = []
    lost = 0
    for a in range(1, attempts + 1):
        failed = [e for e in events if e.get("attempt") == a - 1 and e.get("event") in ("failed", "hang")]
        resumed = [e for e in events if e.get("attempt") == a and e.get("event") == "resumed"]
        started = [e for e in events if e.get("attempt") == a and e.get("event") == "start"]
        if not resumed:
            continue
        t_fail = min(e["time"] for e in failed) if failed else min((e["time"] for e in started), default=None)
        if t_fail is None:
            continue
        each.append(max(e["time"] for e in resumed) - t_fail)
        if failed:
            lost += max(0, max(int(e.get("step", 0)) for e in failed) - min(int(e.get("step", 0)) for e in resumed))
    return {"restarts": attempts, "restart_s": statistics.mean(each) if each else (0.0 if attempts == 0 else None),
            "restart_s_each": each, "lost_steps": lost}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def assemble(scenario: Scenario, ranks: list[dict[str, Any]], servers: list[dict[str, Any]],
             device: torch.device, backend: str, args: argparse.Namespace, attempt: int,
             run_dir: Path) -> Measurement:
    """The contract's measurement (plus extras) from every training rank's and server's report,
    validated (a malformed measurement fails here, before it is written)."""
    plan = scenario.plan
    ranks = sorted(ranks, key=lambda r: r["rank"])
    steps = args.steps
    # a step lasts until its slowest rank finishes (all start together after a barrier)
    step_times = [max(r["step_walls"][i] for r in ranks) for i in range(steps)]
    # one loss per data-parallel replica: the last stage's tp-rank 0 (tp ranks hold the same)
    replicas = [r for r in ranks if r["losses"] is not None and r["coord"][3] == 0]
    losses = [sum(r["losses"][i] for r in replicas) / len(replicas) for i in range(steps)]
    mid = _median_index(step_times)
    phases: dict[str, float | None] = {}
    for key in ("forward", "backward", "optimizer", "comm", "core_wait", "other", "helper_threads"):
        vals = [r["phases"][mid].get(key) for r in ranks]
        phases[key] = None if any(v is None for v in vals) else sum(vals) / len(vals)
    per_rank = []
    for r in ranks:
        ms = r["model_state"]
        state = ms.get("total", 0)
        if r["cuda_peak_bytes"] is not None:
            peak = r["cuda_peak_bytes"]
        else:  # CPU: states + gathered parameters + saved activations at their peak
            peak = state + ms.get("params_gathered", 0) + r["activation_bytes"]
        per_rank.append({"rank": r["rank"], "model_state_gib": state / GIB,
                         "activations_gib": r["activation_bytes"] / GIB, "peak_gib": peak / GIB})
    collectives: dict[str, dict[str, int]] = {}
    for r in ranks:
        for kind, c in r["collectives"].items():
            entry = collectives.setdefault(kind, {"count": 0, "bytes": 0})
            entry["count"] += c["count"]
            entry["bytes"] += c["bytes"]
    out: dict[str, Any] = {
        "name": scenario.name,
        "scenario_hash": scenario.hash(),
        "world_size": len(ranks),
        "device": device.type,
        "backend": backend,
        "torch_version": torch.__version__.split("+")[0],
        "steps": steps,
        "step_time_s": statistics.median(step_times),
        "step_times_s": step_times,
        "losses": losses,
        "phases_s": phases,
        "memory": {"peak_gib": max(p["peak_gib"] for p in per_rank), "per_rank": per_rank},
        # extras
        "warmup_steps": args.warmup,
        "seed": args.seed,
        "plan": {"tp": plan.tp, "pp": plan.pp, "dp": plan.dp, "cp": plan.cp, "dp_shard": plan.dp_shard,
                 "virtual_pipeline_stages": plan.virtual_pipeline_stages, "schedule": plan.schedule,
                 "zero_stage": plan.zero_stage, "sequence_parallel": plan.sequence_parallel,
                 "recompute": plan.recompute, "precision": plan.precision, "optimizer": plan.optimizer,
                 "gradient_sync": plan.gradient_sync, "grad_compression": plan.grad_compression.method,
                 "micro_batch_size": plan.micro_batch_size, "global_batch_size": plan.global_batch_size,
                 "num_microbatches": plan.num_microbatches, "data_parallel": ranks[0]["data_parallel"]},
        "model_state_bytes": [{"rank": r["rank"], **r["model_state"]} for r in ranks],
        "activation_bytes": [r["activation_bytes"] for r in ranks],
        "collectives": collectives,
        "comm_bytes_per_step": {k: v["bytes"] / len(ranks) for k, v in collectives.items()},
        "collectives_per_rank": [{"rank": r["rank"], **r["collectives"]} for r in ranks],
        "phases_per_rank_s": [{"rank": r["rank"], **r["phases"][mid]} for r in ranks],
        "max_rss_gib_per_rank": [r["max_rss_bytes"] / GIB for r in ranks],
        "environment": {**environment(device), **reference_speed(ranks)},
        "timeline": timeline_of(ranks, mid, step_times),
        "as_run": as_run(scenario, device.type),  # plan fields run another way (executor.fields)
    }
    if getattr(args, "trace", None):
        out["traced"] = True  # the profiler ran during the measured steps: they are slower
    wire = [r["dp_wire_bytes"] for r in ranks if r.get("dp_wire_bytes") is not None]
    if wire:
        kinds = sorted({k for w in wire for k in w})
        by_kind = {k: _mean([w.get(k, 0) for w in wire]) for k in kinds}
        c = plan.grad_compression
        out["compression"] = {"method": c.method, "rank": c.rank, "ratio": c.ratio,
                              "error_feedback": c.error_feedback, "dp_bytes_per_step": sum(by_kind.values()),
                              "dp_bytes_per_step_by_kind": by_kind}
    if servers:
        out["ps"] = ps_summary(plan, ranks, servers)
    events = read_events(run_dir)
    out.update(restart_history(events, attempt))
    saves = [r.get("checkpoint") for r in ranks if r.get("checkpoint")]
    if saves:
        out["checkpoint"] = {"every": args.checkpoint_every, "saves": saves[0]["saves"],
                             "save_s": max(s["save_s"] for s in saves)}
    return Measurement.from_dict(out)


def ps_summary(plan: Any, ranks: list[dict[str, Any]], servers: list[dict[str, Any]]) -> dict[str, Any]:
    servers = sorted(servers, key=lambda s: s["server"])
    per_step = [(s["bytes_sent"] + s["bytes_received"]) / max(1, s["steps_served"]) for s in servers]
    staleness: Counter[int] = Counter()
    for s in servers:
        staleness.update({int(k): v for k, v in s["staleness"].items()})
    pushes = sum(staleness.values())
    pushed = [r["ps_worker"]["bytes_sent"] / max(1, r["ps_worker"]["steps"]) for r in ranks if r.get("ps_worker")]
    return {
        "mode": plan.gradient_sync,
        "workers": plan.dp,
        "servers": len(servers),
        "bytes_per_server_per_step": _mean(per_step),
        "worker_bytes_per_step": _mean(pushed),
        "staleness": {"mean": sum(k * v for k, v in staleness.items()) / pushes if pushes else 0.0,
                      "max": max(staleness) if staleness else 0,
                      "histogram": {str(k): v for k, v in sorted(staleness.items())}},
        "per_server": servers,
    }


def reference_speed(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The host's speed during the run (executor.hostspeed): each reference workload's CPU time on
    each rank, the slowest of its timings before the first step, between the measured steps and
    after the last (a slow phase of the host that begins or ends inside the run, or lasts through
    its steps only, shows in one of them), its median over the ranks; the medians of the timings
    after the last step alone (``reference_after``) and between the steps alone
    (``reference_between``, with the one-element all-reduce's latency, ``allreduce_s``). {} on a
    GPU."""
    def median(refs: list[dict[str, float]]) -> dict[str, float]:
        return {key: statistics.median(x[key] for x in refs) for key in refs[0]} if refs else {}

    def slowest(r: dict[str, Any]) -> dict[str, float]:
        timings = [r["reference_cpu_s"], *(r[w] for w in ("reference_after_cpu_s", "reference_between") if r.get(w))]
        return {k: max(t[k] for t in timings) for k in r["reference_cpu_s"]}

    timed = [r for r in ranks if r.get("reference_cpu_s")]
    out: dict[str, Any] = median([slowest(r) for r in timed])
    for key, when in (("reference_after", "reference_after_cpu_s"), ("reference_between", "reference_between")):
        seen = [r[when] for r in timed if r.get(when)]
        if seen:
            out[key] = median(seen)
    return out


def environment(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": platform.node(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "torch_num_threads": torch.get_num_threads(),
        "training_thread_cpus": training_thread_cpus(),  # executor.hostload.pin_training_thread
        "gloo_transport_threads": transport_threads(),  # executor.hostload.idle_transport_threads
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return env
