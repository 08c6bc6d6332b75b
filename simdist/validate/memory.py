"""The memory report: predicted against published per-GPU memory, like with like, per source
group, in-sample and cross-validated.

What each source measures, and what it is compared with:
- torchtitan's Llama 3.1 H100 benchmarks (training_runs.csv rows with ``measured_peak_mem_gib``)
  log ``torch.cuda.memory_stats()["reserved_bytes.all.peak"]`` (torchtitan metrics.py,
  ``max_reserved_gib``, at the benchmark's commit 9dec370), the maximum over GPUs: the caching
  allocator's reserved peak, without the CUDA context and NCCL's buffers (allocated outside it).
  Compared with the busiest stage's ``reserved_gib`` minus those two.
- The ZeRO paper's Figure 1 (memory.csv M001-M004): model states per GPU in GB (10^9 B).
  Compared with params + grads + optimizer.
- DeepSpeed's memory estimator (memory.csv M005-M015): model states per GPU (its "GB" and "MB"
  are 2^30 and 2^20 B), including ZeRO-3's gathered largest layer and no buffers in flight.
  Compared with the same states under ``framework: deepspeed``.

What is fitted: nothing is fitted to these rows. The allocator replay has two structural
counts (temporaries alive at once in a forward that does not save them, activation gradients
alive at once in backward, simdist.analytic.allocation_trace); :func:`cross_validate` picks them
on every torchtitan table but one and scores the one left out, so the cross-validated column
says what choosing them costs.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from simdist.analytic.allocation_trace import FORWARD_WINDOW, GRAD_WINDOW, stage_gaps
from simdist.analytic.memory import memory_per_stage, model_state_bytes
from simdist.analytic.params import total_params
from simdist.frozen import frozen
from simdist.spec.scenario import Scenario, scenario_from_dict
from simdist.units import GiB
from simdist.validate.rows import cell_int, data_dir, error_summary, read_csv

TORCHTITAN_GPU = {"like": "h100-sxm", "name": "h100-96gb-hbm2e", "memory": "96 GiB",
                  "memory_bandwidth": "2.4 TB/s"}  # the benchmark doc: 96 GB HBM2e, 2.4 TB/s
TORCHTITAN_SEQ = 8192  # train_configs/llama3_{8b,70b,405b}.toml seq_len
WINDOW_CHOICES = tuple(itertools.product((1, 2, 3, 4), (1, 2, 3, 4, 6)))


@frozen
class MemoryCase:
    row_id: str
    group: str
    fold: str  # cross-validation fold inside the group (the source's table)
    label: str
    measured_gib: float
    quantity: str  # "allocator reserved" | "model states"
    scenario: Scenario
    scale: float = 1.0  # states per parameter x published parameters / simdist's count
    extra_bytes: float = 0.0


@frozen
class MemoryResult:
    case: MemoryCase
    predicted_gib: float

    @property
    def error(self) -> float:
        return self.predicted_gib / self.case.measured_gib - 1.0


def torchtitan_scenario_dict(row: dict[str, str]) -> dict[str, Any]:
    """A torchtitan benchmark row as a scenario: FSDP2 over dp (x cp), TP with sequence-parallel
    norms, the pipeline's micro-batches = its degree (``pipeline_parallel_microbatches``
    default), two stages per rank for the interleaved schedule (``generate_split_points``),
    ``selective`` = the per-op policy, Float8 = torchao tensorwise with float8 all-gather."""
    tp, pp, dp, cp = (cell_int(row[k]) or 1 for k in ("tp", "pp", "dp", "cp"))
    text = " ".join((row["notes"], row["source_detail"]))
    local = cell_int(row["micro_batch"]) or int(re.search(r"local batch (?:size )?(\d+)", text).group(1))
    plan: dict[str, Any] = {
        "tp": tp, "pp": pp, "dp": dp, "cp": cp, "zero_stage": 3, "sequence_parallel": tp > 1,
        "recompute": "full" if row["recompute"].startswith("full") else "selective",
        "micro_batch_size": local // pp, "global_batch_size": local * dp, "framework": "torchtitan",
        "precision": "fp8" if "fp8" in row["precision"].lower() else "bf16",
    }
    if "Interleaved" in row["notes"]:
        plan.update(schedule="interleaved-1f1b", virtual_pipeline_stages=2)
    model = {"num_layers": int(row["layers"]), "hidden_size": int(row["hidden"]),
             "num_attention_heads": int(row["heads"]), "num_kv_heads": int(row["kv_heads"]),
             "ffn_hidden_size": int(row["ffn_hidden"]), "vocab_size": int(row["vocab"]),
             "seq_length": cell_int(row["seq_len"]) or TORCHTITAN_SEQ, "mlp": "swiglu", "norm": "rmsnorm",
             "bias": False, "position_embedding": "rope", "tie_embeddings": False}
    gpus = int(row["num_gpus"])
    cluster = {"preset": "dgx-h100", "num_nodes": gpus // 8, "gpus_per_node": 8, "gpu": dict(TORCHTITAN_GPU)}
    return {"name": f"{row['run_id']} {row['model_name']}", "model": model, "cluster": cluster, "plan": plan}


def _torchtitan_cases(rows: list[dict[str, str]]) -> list[MemoryCase]:
    out = []
    for row in rows:
        if not row.get("measured_peak_mem_gib", "").strip() or row["framework"] != "torchtitan":
            continue
        table = re.search(r"Table \d+", row["source_detail"])
        out.append(MemoryCase(row["run_id"], row["source"], table.group(0) if table else row["run_id"],
                              f"{row['model_name']} {row['notes'].split(';')[0]}", float(row["measured_peak_mem_gib"]),
                              "allocator reserved", scenario_from_dict(torchtitan_scenario_dict(row))))
    return out


def _states_scenario(params_b: float, zero: int, dp: int, framework: str | None = None,
                     offload: tuple[str, str] = ("none", "none"), vocab: int = 51200,
                     hidden: int = 4096) -> Scenario:
    plan: dict[str, Any] = {"zero_stage": zero, "dp": dp, "global_batch_size": dp, "precision": "fp16",
                            "offload": {"optimizer": offload[0], "params": offload[1]}}
    if framework:
        plan["framework"] = framework
    model = {"num_layers": 2, "hidden_size": hidden, "num_attention_heads": 16, "vocab_size": vocab,
             "seq_length": 512, "ffn_hidden_size": 4 * hidden}
    nodes, gpn = (dp + 7) // 8, min(dp, 8)
    return scenario_from_dict({"name": f"states {params_b}B", "model": model, "plan": plan,
                               "cluster": {"preset": "dgx-a100-80gb", "num_nodes": nodes, "gpus_per_node": gpn}})


def _memory_csv_cases(rows: list[dict[str, str]]) -> list[MemoryCase]:
    """ZeRO paper Figure 1 and DeepSpeed estimator outputs, per parameter x their parameter count."""
    out = []
    for row in rows:
        rid = row["id"]
        if rid in ("M001", "M002", "M003", "M004"):
            p = float(row["params"])
            sc = _states_scenario(p / 1e9, int(rid[-1]) - 1, 64)
            out.append(MemoryCase(rid, "ZeRO paper Figure 1", rid, row["zero_stage"], float(row["value"]) * 1e9 / GiB,
                                  "model states", sc, scale=p / total_params(sc.model)))
        elif rid.startswith("M0") and "estimator" in row["source"].lower() and row["unit"].startswith(("GB", "MB")):
            out.append(_estimator_case(row))
    return out


def _estimator_case(row: dict[str, str]) -> MemoryCase:
    config = row["config"]
    p = float(re.match(r"([\d.]+)M", row["params"]).group(1)) * 1e6
    largest = float(re.search(r"largest layer ([\d.]+)M", row["params"]).group(1)) * 1e6 if "largest" in row["params"] else 0.0
    zero = int(row["zero_stage"])
    optim = "cpu" if ("cpu_offload=1" in config or "offload params+optim" in config or "offload optim" in config) else "none"
    params = "cpu" if ("cpu_offload_params=1" in config or "offload params" in config) else "none"
    dp = cell_int(row["num_gpus"]) or 8
    sc = _states_scenario(p / 1e9, zero, dp, "deepspeed", (optim, params), vocab=32128, hidden=1024)
    unit = 2**20 if row["unit"].startswith("MB") else 2**30
    extra = 4.0 * largest if zero == 3 else 0.0
    return MemoryCase(row["id"], "DeepSpeed memory estimator", row["id"], config, float(row["value"]) * unit / GiB,
                      "model states", sc, scale=p / total_params(sc.model), extra_bytes=extra)


def memory_cases(data: str | Path | None = None) -> list[MemoryCase]:
    folder = data_dir(data)
    return _torchtitan_cases(read_csv(folder / "training_runs.csv")) + _memory_csv_cases(read_csv(folder / "memory.csv"))


def predicted_gib(case: MemoryCase, windows: tuple[int, int] = (FORWARD_WINDOW, GRAD_WINDOW)) -> float:
    sc = case.scenario
    m, plan, cluster = sc.model, sc.plan, sc.cluster
    if case.quantity == "model states":
        s = model_state_bytes(m, plan, 0, cluster)
        grads = 0.0 if plan.offload.optimizer != "none" else s["grads"]  # the estimator counts no buckets in flight
        return (case.scale * (s["params"] + grads + s["optimizer"]) + case.extra_bytes) / GiB
    stages = memory_per_stage(m, plan, cluster)
    gaps = stage_gaps(m, plan, cluster, windows)
    return max(s.allocator_peak + g for s, g in zip(stages, gaps, strict=True)) / GiB


def run_memory(data: str | Path | None = None, windows: tuple[int, int] = (FORWARD_WINDOW, GRAD_WINDOW)
               ) -> list[MemoryResult]:
    return [MemoryResult(c, predicted_gib(c, windows)) for c in memory_cases(data)]


def cross_validate(results: list[MemoryResult]) -> list[MemoryResult]:
    """Leave one torchtitan table out: the allocator's two windows chosen (lowest mean |error|)
    on the other tables, the left-out table predicted with them. Other groups fit nothing."""
    titan = [r for r in results if r.case.quantity == "allocator reserved"]
    folds = sorted({r.case.fold for r in titan})
    cache: dict[tuple[str, tuple[int, int]], float] = {}

    def pred(r: MemoryResult, w: tuple[int, int]) -> float:
        key = (r.case.row_id, w)
        if key not in cache:
            cache[key] = r.predicted_gib if w == (FORWARD_WINDOW, GRAD_WINDOW) else predicted_gib(r.case, w)
        return cache[key]

    out = {id(r): r for r in results}
    for fold in folds:
        train = [r for r in titan if r.case.fold != fold]
        best = min(WINDOW_CHOICES, key=lambda w: sum(abs(pred(r, w) / r.case.measured_gib - 1) for r in train))
        for r in titan:
            if r.case.fold == fold:
                out[id(r)] = replace(r, predicted_gib=pred(r, best))
    return [out[id(r)] for r in results]


def memory_summary(results: list[MemoryResult], cv: list[MemoryResult] | None = None) -> dict[str, dict[str, float]]:
    """Per group and overall: rows, in-sample mean |error| (``mae``), bias, max, and the
    cross-validated mean |error| (``cv_mae``)."""
    summary = error_summary((r.case.group, r.error) for r in results)
    for g, s in error_summary((r.case.group, r.error) for r in (cv or cross_validate(results))).items():
        summary[g]["cv_mae"] = s["mae"]
    return summary


def memory_table(results: list[MemoryResult], rows: bool = True) -> str:
    cv = cross_validate(results)
    lines = []
    if rows:
        lines.append(f"{'row':6} {'group / fold':44} {'measured':>9} {'predicted':>9} {'error':>7} {'cv':>7}")
        for r, c in zip(results, cv, strict=True):
            lines.append(f"{r.case.row_id:6} {(r.case.group[:32] + ' / ' + r.case.fold)[:44]:44} "
                         f"{r.case.measured_gib:9.2f} {r.predicted_gib:9.2f} {r.error:+7.1%} {c.error:+7.1%}")
        lines.append("")
    lines.append(f"{'group':44} {'rows':>4} {'in-sample':>9} {'CV':>7}")
    for g, s in memory_summary(results, cv).items():
        lines.append(f"{g[:44]:44} {s['n']:4d} {s['mae']:9.1%} {s['cv_mae']:7.1%}")
    return "\n".join(lines)


def memory_columns(run_ids: list[str], data: str | Path | None = None) -> dict[str, dict[str, float]]:
    """For the cross-validated report of simdist.validate.training: per run id that publishes
    memory, {"measured_gib", "predicted_gib", "error", "cv_error"} (like with like)."""
    results = [r for r in run_memory(data) if r.case.row_id in set(run_ids)]
    cv = cross_validate(results)
    return {r.case.row_id: {"measured_gib": r.case.measured_gib, "predicted_gib": r.predicted_gib,
                            "error": r.error, "cv_error": c.error} for r, c in zip(results, cv, strict=True)}


__all__ = ["MemoryCase", "MemoryResult", "cross_validate", "memory_cases",
           "memory_columns", "memory_summary", "memory_table", "predicted_gib", "run_memory",
           "torchtitan_scenario_dict"]

if __name__ == "__main__":
    print(memory_table(run_memory()))
