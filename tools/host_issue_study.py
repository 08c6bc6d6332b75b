"""Would a host-bound eager pass explain the GPT-OSS 120B rows? A study, not part of the model.

    PYTHONPATH=$PWD python tools/host_issue_study.py

Outside CUDA graphs one host thread issues every kernel; a pass whose kernels the GPU runs
faster than the host issues them takes the host's time, max(GPU time, host time). This script
prices that for one MoE layer's forward and backward (one micro-batch) with a host cost ``h``:

- ``kernel``: ``h`` per kernel the op list launches (simdist.analytic.passes.OpTimer._kernels);
- ``module``: ``h`` per op (a Python-level call: a TE module, a collective, a PyTorch op), the
  per-expert GEMMs and casts that Transformer Engine's GroupedLinear loops over in C++ at
  host.HOST_ISSUE_S each, and the experts' per-expert bias loop (eager Python) ``h`` per kernel.

It fits ``h`` on Megatron-Bridge's eager/CUDA-graph pairs (H100, Transformer Engine graphs of
``attn + moe_router + moe_preprocess``; docs/training/cuda-graphs.md at NVIDIA-NeMo/
Megatron-Bridge#2960, 2026-03-31), whose graphed modules each cost one launch, and prints what
that ``h`` adds to GPT-OSS 120B (R0105) and to the Qwen3-30B run that Bridge profiled with
Nsight (GPU idle 616 us per MoE forward in all, drain included: simdist.analytic.host).
"""

from __future__ import annotations

from typing import Any

from simdist.analytic.collectives import Network
from simdist.analytic.cost import CostModel
from simdist.analytic.host import HOST_ISSUE_S
from simdist.analytic.ops import Op
from simdist.analytic.passes import OpTimer
from simdist.analytic.variants import layer_ops
from simdist.spec.layers import model_kind_counts
from simdist.spec.scenario import scenario_from_dict
from simdist.validate import moe_cp
from simdist.validate.rows import data_dir, read_csv

# what TE-scoped graphs of attn, moe_router and moe_preprocess capture, by simdist op name
GRAPHED = {"norm1", "allgather tp attn in", "qkv", "rope", "flash attention", "attn out",
           "reducescatter tp attn out", "bias dropout add", "norm2", "router", "router top-k", "permute",
           "router top-k bwd", "router dgrad", "router wgrad", "allgather tp attn out", "attn out dgrad",
           "attn out wgrad", "flash attention bwd", "qkv dgrad", "qkv wgrad", "reducescatter tp attn in",
           "allgather tp attn in (wgrad input)", "permute bwd"}
GRAPH_LAUNCHES = 3  # one replay per graphed module


def _sc(preset: str, nodes: int, plan: dict[str, Any]) -> Any:
    return scenario_from_dict({"name": "study", "model": {"preset": preset, "seq_length": 4096},
                               "cluster": {"preset": "dgx-h100", "num_nodes": nodes, "gpus_per_node": 8},
                               "plan": {"framework": "nemo", "precision": "bf16", "micro_batch_size": 1,
                                        "moe_dispatcher": "alltoall", **plan}})


def _row(run_id: str, **plan: Any) -> Any:
    row = next(r for r in read_csv(data_dir(None) / "training_runs.csv") if r["run_id"] == run_id)
    d = moe_cp.moe_scenario(row)
    d["plan"].update(plan)
    if d["plan"].get("precision") != "fp8":
        d["plan"].pop("fp8_recipe", None)
    return scenario_from_dict(d)


def host_time(timer: OpTimer, ops: tuple[Op, ...], h: float, unit: str, graphed: bool) -> float:
    total = GRAPH_LAUNCHES * h if graphed else 0.0
    for op in ops:
        if graphed and op.name in GRAPHED:
            continue
        n = len(timer._kernels((op,)))
        if unit == "kernel" or op.name.startswith("experts fc2 bias"):
            total += n * h
        else:  # one Python call; TE's GroupedLinear issues its per-expert kernels from C++
            total += h + (n - 1) * HOST_ISSUE_S
    return total


def excess(sc: Any, h: float, unit: str, graphed: bool = False) -> float:
    """Host time beyond GPU time of one MoE layer's forward + backward, one micro-batch."""
    timer = OpTimer(sc, CostModel(sc.cluster.gpu, sc.plan.precision, None), Network.of(sc.cluster, None))
    kind = model_kind_counts(sc.model)[-1][0]
    out = 0.0
    for phase in ("fwd", "bwd"):
        ops = layer_ops(sc.model, sc.plan, phase, kind)
        out += max(0.0, host_time(timer, ops, h, unit, graphed) - sum(timer._kernels(ops)))
    return out


# (scenario, layer-passes on the critical path = layers per stage x (micro-batches + pp - 1),
#  published eager - graph seconds: low, middle, high of the published ranges)
PAIRS = {
    "GPT-OSS-20B TP2 PP4 EP4, GBS 4 (467-520 -> 391-399 ms)":
        (_sc("gpt-oss-20b", 2, {"tp": 2, "pp": 4, "ep": 4, "global_batch_size": 4}), 6 * 5, (0.068, 0.0985, 0.129)),
    "Qwen3-30B-A3B TP2 PP2 EP4, GBS 8 (623 -> 484 ms)":
        (_sc("qwen3-30b-a3b", 2, {"tp": 2, "pp": 2, "ep": 4, "global_batch_size": 8}), 24 * 3, (0.139,)),
}


def fit(sc: Any, passes: int, target: float, unit: str) -> float:
    lo, hi = 1e-6, 1e-3
    for _ in range(50):
        mid = (lo + hi) / 2
        saved = (excess(sc, mid, unit) - excess(sc, mid, unit, graphed=True)) * passes
        lo, hi = (mid, hi) if saved < target else (lo, mid)
    return (lo + hi) / 2


def main() -> None:
    oss = _row("R0105")
    nsight = _row("R0099", precision="bf16", ep_comm_overlap=False)
    for unit in ("kernel", "module"):
        print(f"host cost per {unit}")
        for name, (sc, passes, targets) in PAIRS.items():
            for target in targets:
                h = fit(sc, passes, target, unit)
                print(f"  {name}: saving {target * 1e3:.0f} ms -> h = {h * 1e6:.0f} us; then per MoE layer and "
                      f"micro-batch GPT-OSS-120B +{excess(oss, h, unit) * 1e3:.2f} ms (about 3 ms missing), "
                      f"Qwen3-30B Nsight run +{excess(nsight, h, unit) * 1e3:.2f} ms (at most 0.62 ms)")
    print("every MoE row, host cost per module at the Qwen3 pair's fit: host time beyond GPU time "
          "per MoE layer and micro-batch (were its recipe eager)")
    h = fit(*PAIRS["Qwen3-30B-A3B TP2 PP2 EP4, GBS 8 (623 -> 484 ms)"][:2], 0.139, "module")
    print(f"  (h = {h * 1e6:.0f} us)")
    for row in read_csv(data_dir(None) / "training_runs.csv"):
        if not moe_cp.handles(row) or moe_cp.group(row) != moe_cp.GROUP_MOE:
            continue
        built = moe_cp.build(row)
        if isinstance(built, str):
            continue
        sc = built[0]
        print(f"  {row['run_id']} {row['model_name']:24s} mbs {sc.plan.micro_batch_size}: "
              f"+{excess(sc, h, 'module') * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
