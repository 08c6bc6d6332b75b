"""The training-runs report: predict the published training runs of training_runs.csv and
compare the step time, per row, per source and overall.

A report, not a gate. Rows that leave part of the plan unstated (micro-batch size, interleaving)
are predicted with the fastest setting that fits among the usual choices, as the authors tuned
their runs; the row says so. Step time is measured directly where the source gives it, else
derived from the reported TFLOP/s with the source's own FLOP formula (see each group's notes).

Rows the simulator cannot express yet are skipped, each with its reasons (:func:`unsupported`):
mixture-of-experts rows, context-parallel rows, FP8-recipe rows, rows whose plan, batch or
model dimensions are unstated, GPUs without a cluster preset, and frameworks whose defaults are
not mapped to a scenario (only Megatron-LM, Megatron-Core and MosaicML llm-foundry are).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simdist.analytic.flops import megatron_flops_per_step, model_flops_per_step
from simdist.errors import ScenarioError
from simdist.spec.scenario import Scenario, scenario_from_dict
from simdist.validate.rows import cell_float, cell_int, data_dir, error_summary, read_csv

# --- mapping a published row to a scenario ------------------------------------------------

_GPU_CLUSTER = {
    "a100-sxm4-80gb": "dgx-a100-80gb", "a100": "dgx-a100-80gb", "a100_80gb": "dgx-a100-80gb",
    "a100 (dgx-a100)": "dgx-a100-40gb",  # 2020: only the 40 GB A100 existed
    "a100_40gb": "dgx-a100-40gb", "h100": "dgx-h100", "h100_80gb": "dgx-h100",
    "v100 (dgx-2h)": "dgx-2",
}


# frameworks whose defaults row_to_scenario_dict maps (by the start of the row's framework)
MAPPED_FRAMEWORKS = ("MosaicML", "Megatron-LM", "Megatron-Core")


def unsupported(row: dict[str, str]) -> list[str]:
    """Why a row cannot be predicted yet (empty: it can), one "kind: detail" reason each."""
    why = []
    if not all(row[k].strip() for k in ("layers", "hidden", "heads")):
        why.append("model dimensions not stated: the row names the model only")
    ep, cp = cell_int(row.get("ep")) or 1, cell_int(row.get("cp")) or 1
    if ep > 1:
        why.append(f"mixture of experts: ep={ep}, experts are not in the simulator yet")
    if cp > 1:
        why.append(f"context parallel: cp={cp}, the row mapping does not carry cp yet")
    precision = row["precision"].strip()
    if "fp8" in precision.lower() and precision.lower() != "amp_fp8":
        why.append(f"FP8 recipe: {precision!r}, the simulator has no FP8 recipes yet")
    if row["num_gpus"] and int(row["num_gpus"]) > 8 and not row["tp"].strip() and not row["dp"].strip():
        why.append("plan (tp/pp) not stated")
    unstated = [k for k in ("num_gpus", "seq_len", "global_batch") if not row[k].strip()]
    if unstated:
        why.append(f"cells not stated: {', '.join(unstated)}")
    if row["gpu_type"].strip().lower() not in _GPU_CLUSTER:
        why.append(f"GPU not mapped: {row['gpu_type']!r} is not in the row mapping's GPU table")
    if not row["framework"].startswith(MAPPED_FRAMEWORKS):
        why.append(f"framework not mapped: {row['framework']!r} (only the defaults of "
                   f"{', '.join(MAPPED_FRAMEWORKS)} are)")
    return why


@dataclass
class Case:
    """A predictable row: its scenario and what was measured."""

    run_id: str
    group: str
    label: str
    measured_step_s: float
    measured_from: str  # "step time" | "TFLOP/s (Megatron eq. 3)" | "TFLOP/s (model)"
    scenario: Scenario
    tuned: list[str]  # unstated plan fields chosen as the fastest that fits
    # the runner-up choices of the unstated fields (fitting, fastest first, ``scenario`` among
    # them): cross-validation picks among them again with its refitted constants
    options: tuple[tuple[Scenario, tuple[str, ...]], ...] = ()
    measured_peak_gib: float | None = None  # the row's published peak memory per GPU, if any

    @property
    def gpu_generation(self) -> str:
        """The GPU generation whose fitted efficiencies this row informs (a100, h100, ...)."""
        return generation(self.scenario.cluster.gpu.name)


def generation(gpu_name: str) -> str:
    """A catalog GPU's generation: the efficiencies are fitted per generation, never per SKU."""
    return gpu_name.split("-")[0]


def row_to_scenario_dict(row: dict[str, str], plan_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    framework = row["framework"]
    mosaic = framework.startswith("MosaicML")
    megatron_2021 = framework.startswith("Megatron-LM") and "2020" not in framework
    mcore = framework.startswith("Megatron-Core")
    h = int(row["hidden"])
    model: dict[str, Any] = {
        "num_layers": int(row["layers"]), "hidden_size": h, "num_attention_heads": int(row["heads"]),
        "num_kv_heads": cell_int(row["kv_heads"]) or int(row["heads"]),
        "ffn_hidden_size": cell_int(row["ffn_hidden"]) or 4 * h,
        "vocab_size": cell_int(row["vocab"]) or 51200, "seq_length": int(row["seq_len"]),
        "mlp": "gelu",
    }
    if mosaic:  # MPT: no biases, ALiBi, tied embeddings, no dropout (llm-foundry yamls)
        model.update(bias=False, position_embedding="alibi", tie_embeddings=True, dropout=False)
    else:  # Megatron GPT: biases, learned positions, tied embeddings, dropout 0.1
        model.update(bias=True, position_embedding="learned", tie_embeddings=True,
                     dropout=not mcore)
    gpus = int(row["num_gpus"])
    gpn = min(gpus, cell_int(row["gpus_per_node"]) or 8)
    preset = _GPU_CLUSTER[row["gpu_type"].strip().lower()]
    if preset == "dgx-2":
        gpn = min(gpus, 16)
    cluster: dict[str, Any] = {"preset": preset, "num_nodes": max(1, gpus // gpn), "gpus_per_node": gpn}
    link = row["inter_node_link"]
    if "RoCE" in link and (gbps := cell_float(link)):
        cluster["inter_node"] = {"kind": "roce", "nics_per_node": 8, "bandwidth": f"{gbps / 8:g} Gb/s"}
    zero_text = row["zero_stage_fsdp"]
    zero = 3 if ("ZeRO-3" in zero_text or "FULL_SHARD" in zero_text) else 2 if "SHARD_GRAD_OP" in zero_text else 0
    prec = row["precision"].lower()
    precision = "fp8" if "fp8" in prec else ("fp16" if (megatron_2021 or "2020" in framework) else "bf16")
    if "V100" in row["gpu_type"]:
        precision = "fp16"
    tp, pp = cell_int(row["tp"]) or 1, cell_int(row["pp"]) or 1
    recompute = "full" if row["recompute"].startswith("full") else "none"
    if "includes recompute" in row["measured_hfu"]:  # the FLOP count the source reports says so
        recompute = "full"
    if "2020" in framework:  # Megatron-LM v1's GPT-2 scripts ran with --checkpoint-activations
        recompute = "full"
    if "ZeRO-3" in zero_text and not row["recompute"]:
        recompute = "full"  # 175B/530B without model parallelism cannot fit without it
    plan: dict[str, Any] = {
        "tp": tp, "pp": pp, "zero_stage": zero, "recompute": recompute,
        "global_batch_size": int(row["global_batch"]), "precision": precision,
        "micro_batch_size": cell_int(row["micro_batch"]) or 1,
        "flash_attention": mosaic or mcore,
        "sequence_parallel": mcore and tp > 1,
        "overlap_grad_reduce": not megatron_2021 and "2020" not in framework,
        "fp32_grad_accumulation": megatron_2021 or mcore,
    }
    if "DeepSpeed" in framework and zero == 3:
        plan["zero3_fetch"] = "module"  # DeepSpeed gathers each submodule's parameters on its own
    if mcore:  # --overlap-grad-reduce --overlap-param-gather --tp-comm-overlap, distributed optimizer
        plan.update(zero_stage=1, tp_comm_overlap=True)
        # Megatron-Core's default DDP bucket: max(40M, 1M x dp) parameters of fp32 main grads
        plan["ddp_bucket_size"] = f"{4 * max(40_000_000, 1_000_000 * (gpus // (tp * pp)))} B"
    plan.update(plan_overrides or {})
    return {"name": f"{row['run_id']} {row['model_name']}", "model": model, "cluster": cluster, "plan": plan}


def _measured(row: dict[str, str], sc: Scenario) -> tuple[float, str] | None:
    step = cell_float(row["measured_step_s"]) or cell_float(row["derived_step_s"])
    if step:
        return step, "step time"
    tflops = cell_float(row["measured_tflops_per_gpu"])
    if not tflops:
        return None
    n = sc.world_size
    if "eq.3" in row["recompute"] or row["source"].startswith("Megatron-LM SC'21"):
        return megatron_flops_per_step(sc.model, sc.plan) / (tflops * 1e12 * n), "TFLOP/s (Megatron eq. 3)"
    return model_flops_per_step(sc.model, sc.plan) / (tflops * 1e12 * n), "TFLOP/s (model FLOPs)"


def candidates(row: dict[str, str], base: dict[str, Any]) -> list[dict[str, Any]]:
    """Unstated micro-batch size and interleaving: the usual choices."""
    mbs = [None] if row["micro_batch"].strip() else [1, 2, 4, 8]
    pp, layers = base["plan"]["pp"], base["model"]["num_layers"]
    # Megatron-LM's interleaved schedule needs the layers to split evenly into pp*v chunks
    # (chunks per stage: the divisors of the layers per stage, up to 24)
    vs = [1] if pp == 1 or layers % pp else [v for v in range(1, 25) if (layers // pp) % v == 0]
    out = []
    for mb in mbs:
        for v in vs:
            ov: dict[str, Any] = {}
            if mb is not None:
                ov["micro_batch_size"] = mb
            if v > 1:
                ov["virtual_pipeline_stages"] = v
            out.append(ov)
    return out


OPTIONS_KEPT = 3  # runner-up choices of unstated fields kept for cross-validation


def build_cases(data: str | Path | None = None) -> tuple[list[Case], list[tuple[str, str]]]:
    """The predictable rows of training_runs.csv as cases, and (run_id, reasons) of the rest."""
    from simdist.predict import predict

    cases: list[Case] = []
    skipped: list[tuple[str, str]] = []
    for row in read_csv(data_dir(data) / "training_runs.csv"):
        rid = row["run_id"]
        why = unsupported(row)
        if why:
            skipped.append((rid, "; ".join(why)))
            continue
        base = row_to_scenario_dict(row)
        ranked: list[tuple[tuple[bool, float], int, Scenario, tuple[str, ...]]] = []
        for i, ov in enumerate(candidates(row, base)):
            try:
                sc = scenario_from_dict(row_to_scenario_dict(row, ov))
            except ScenarioError:
                continue
            p = predict(sc, engine="analytic", keep_spans=False)
            # fitting plans first, then the fastest
            ranked.append(((not p.fits, p.step_time_s), i, sc, tuple(f"{k}={v}" for k, v in ov.items())))
        if not ranked:
            skipped.append((rid, "no valid plan"))
            continue
        ranked.sort(key=lambda r: r[:2])
        options = tuple((r[2], r[3]) for r in ranked[:OPTIONS_KEPT] if r[0][0] == ranked[0][0][0])
        sc, tuned = options[0][0], list(options[0][1])
        meas = _measured(row, sc)
        if meas is None:
            skipped.append((rid, "no step time or TFLOP/s"))
            continue
        cases.append(Case(rid, row["source"], row["model_name"], meas[0], meas[1], sc, tuned, options,
                          cell_float(row.get("measured_peak_mem_gib"))))
    return cases, skipped


# --- report ---------------------------------------------------------------------------------


@dataclass
class Result:
    case: Case
    predicted_s: float

    @property
    def error(self) -> float:
        return self.predicted_s / self.case.measured_step_s - 1.0


def run_training(data: str | Path | None = None, engine: str = "analytic"
                 ) -> tuple[list[Result], list[tuple[str, str]]]:
    """Every predictable row predicted by ``engine``, and (run_id, reasons) of the skipped rows."""
    from simdist.predict import predict

    cases, skipped = build_cases(data)
    results = [Result(c, predict(c.scenario, engine=engine, keep_spans=False).step_time_s) for c in cases]
    return results, skipped


def summarize(results: list[Result]) -> dict[str, dict[str, float]]:
    """Rows, mean |error|, bias and max |error| per source group and overall."""
    return error_summary((r.case.group, r.error) for r in results)
