"""The peer of benchmarks/bench_speed.py: Calculon (github calculon-ai/calculon, an analytic
model of LLM training), given the same cases as simdist.

Calculon reads three JSON inputs: an application (the model's shape), an execution (the
parallel plan) and a system (the machine). The first two are written here from our scenario
(``calculon_application``, ``calculon_execution``: pure, no Calculon needed, unit-tested in
tests/test_bench_peer.py); the system is Calculon's own file for the GPU, from the ``systems/``
folder of its checkout (``CALCULON_SYSTEMS``). What Calculon cannot express (context or expert
parallelism, ZeRO-2/3, offload, GQA, SwiGLU, fused attention, ...) raises ``ValueError`` rather
than being approximated.

``time_llm`` and ``run_search`` run Calculon; bench_speed.py calls them in child processes
whose path holds both simdist and Calculon.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simdist.spec.cluster import ClusterSpec
    from simdist.spec.model import ModelSpec
    from simdist.spec.scenario import Scenario

# (our catalog's GPU, GPUs per node) -> Calculon's system file (its NVLink network has 8 GPUs)
CALCULON_SYSTEMS: dict[tuple[str, int], str] = {("a100-80gb", 8): "a100_80g.json"}
CALCULON_DATATYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "fp8": "float8"}
CALCULON_RECOMPUTE = {"none": "none", "selective": "attn_only", "full": "full"}
# llm-optimal-execution's options in the bench: one worker process (as simdist's search row);
# -m: per plan, micro-batch sizes in rising order until one has no plan that runs (its README's
# example); TP and DP communication overlap left out (simdist's search takes them from the
# scenario rather than searching them)
CALCULON_SEARCH_FLAGS = ("-c", "1", "-m", "--no-tp-overlap", "--no-dp-overlap")


def calculon_application(model: ModelSpec) -> dict[str, int]:
    """Calculon's application JSON for ``model``: a dense GPT block of two-projection MLP and
    multi-head attention (the embedding and the LM head are not modelled by Calculon)."""
    if model.num_experts > 1:
        raise ValueError("Calculon models dense blocks only, not experts")
    if model.mlp != "gelu":
        raise ValueError(f"Calculon's MLP has two projections, not {model.mlp}'s three")
    if model.attention != "mha":
        raise ValueError(f"Calculon has no {model.attention} attention")
    return {"hidden": model.hidden_size, "feedforward": model.ffn_hidden_size,
            "seq_size": model.seq_length, "attn_heads": model.num_attention_heads,
            "attn_size": model.head_dim, "num_blocks": model.num_layers}


def _networks(tp: int, pp: int, dp: int, gpus_per_node: int) -> tuple[int, int, int]:
    """Calculon's network of each axis (0: the node's NVLink, 1: the network between nodes),
    ranks laid out tp innermost, then pp, then dp (simdist's grid without experts): an axis
    stays on NVLink while its group and those inside it fill a whole divisor of the node."""
    nets, inside = [], 1
    for size in (tp, pp, dp):
        inside *= size
        nets.append(0 if gpus_per_node % inside == 0 else 1)
    return nets[0], nets[1], nets[2]


def calculon_execution(sc: Scenario) -> dict[str, Any]:
    """Calculon's execution JSON for the scenario's plan, all 23 of its fields."""
    p, m, c = sc.plan, sc.model, sc.cluster
    unsupported = {"context parallelism": p.cp > 1, "expert parallelism": p.ep > 1,
                   "ZeRO-2/3 (Calculon shards the optimizer only)": p.zero_stage > 1,
                   "offload": p.offload.any, "fused (flash) attention": p.flash_attention,
                   "TP communication overlap": p.tp_comm_overlap,
                   "parameter servers": p.uses_parameter_servers,
                   "gradient compression": p.grad_compression.enabled,
                   f"the {p.schedule} schedule": p.schedule not in ("1f1b", "interleaved-1f1b"),
                   "grouped-query attention": m.num_kv_heads not in (1, m.num_attention_heads)}
    missing = [what for what, used in unsupported.items() if used]
    if missing:
        raise ValueError(f"Calculon cannot express {', '.join(missing)}")
    gpus = c.num_nodes * c.gpus_per_node
    if p.world_size != gpus:
        raise ValueError(f"the plan spans {p.world_size} GPUs, the cluster {gpus}")
    tp_net, pp_net, dp_net = _networks(p.tp, p.pp, p.dp, c.gpus_per_node)
    return {"num_procs": gpus, "tensor_par": p.tp, "pipeline_par": p.pp, "data_par": p.dp,
            "tensor_par_net": tp_net, "pipeline_par_net": pp_net, "data_par_net": dp_net,
            "batch_size": p.global_batch_size, "microbatch_size": p.micro_batch_size,
            "datatype": CALCULON_DATATYPES[p.precision],
            # bias + GeLU in one kernel: only where the plan says its elementwise ops are fused
            # (Calculon's own files for these 2021-22 Megatron runs leave it off)
            "fused_activation": p.fused_elementwise is True,
            "attention_type": "multihead" if m.num_kv_heads == m.num_attention_heads else "multiquery",
            "activation_recompute": CALCULON_RECOMPUTE[p.recompute],
            "pipeline_interleaving": p.virtual_pipeline_stages,
            "optimizer_sharding": p.zero_stage == 1 and p.dp > 1,
            # Megatron's sequence parallelism: reduce-scatter and all-gather instead of all-reduce
            "tensor_par_comm_type": "rs_ag" if p.sequence_parallel else "ar",
            "tensor_par_overlap": "none", "seq_par_ag_redo": False,
            "data_par_overlap": p.overlap_grad_reduce and p.dp > 1,
            "weight_offload": False, "activations_offload": False, "optimizer_offload": False,
            "training": True}


def calculon_system_file(cluster: ClusterSpec) -> str:
    """The file of Calculon's ``systems/`` folder that stands for ``cluster``."""
    key = (cluster.gpu.name, cluster.gpus_per_node)
    if key not in CALCULON_SYSTEMS:
        raise ValueError(f"no Calculon system for {key[1]} x {key[0]} per node")
    return CALCULON_SYSTEMS[key]


def calculon_label(exe: dict[str, Any]) -> str:
    """An execution in the form of simdist's plan labels, e.g. ``TP8 PP16 DP8 v2 Z0 full mb1``,
    with the batch and what only Calculon has (offload, the TP collectives' kind)."""
    parts = [f"TP{exe['tensor_par']}", f"PP{exe['pipeline_par']}", f"DP{exe['data_par']}"]
    parts += [f"v{exe['pipeline_interleaving']}"] if exe["pipeline_interleaving"] > 1 else []
    parts += ["Z1" if exe["optimizer_sharding"] else "Z0"]
    parts += {"rs_ag": ["SP"], "p2p_rs_ag": ["p2p_rs_ag"], "ar": []}[exe["tensor_par_comm_type"]]
    parts += [{"attn_only": "selective"}.get(exe["activation_recompute"], exe["activation_recompute"])]
    parts += [f"mb{exe['microbatch_size']}", f"batch {exe['batch_size']}"]
    offload = [k.removesuffix("_offload") for k in ("weight_offload", "activations_offload",
                                                     "optimizer_offload") if exe[k]]
    return " ".join(parts + ([f"offload {'+'.join(offload)}"] if offload else []))


def parse_search_log(text: str) -> dict[str, float]:
    """The counts and rate llm-optimal-execution logs (``Total executions: N`` ...)."""
    out: dict[str, float] = {}
    for key, pattern in (("plans", r"Total executions: (\d+)"), ("good", r"Good executions: (\d+)"),
                         ("plans_per_s", r"Calculation rate: ([\d.]+) calcs/sec")):
        found = re.search(pattern, text)
        if found is None:
            raise ValueError(f"llm-optimal-execution printed no {pattern.split(':')[0]!r}")
        out[key] = float(found.group(1))
    return out


# --- running Calculon (its package on the path) ----------------------------------------------


def _inputs(sc: Scenario, root: Path) -> tuple[dict[str, int], dict[str, Any], dict[str, Any]]:
    system = json.loads((root / "systems" / calculon_system_file(sc.cluster)).read_text())
    return calculon_application(sc.model), calculon_execution(sc), system


def time_llm(sc: Scenario, root: Path, repeat: int, first: bool) -> dict[str, Any]:
    """``calculon llm`` on the scenario's plan in this process, as its runner does it (compile
    and run a model of the application on the system): the best of ``repeat`` wall-clock and
    CPU seconds, the inputs built before the clock. ``first``: Calculon is imported here, its
    CPU time kept apart (``import_cpu_s``), as simdist's cold rows."""
    import importlib
    import logging

    app_json, exe_json, sys_json = _inputs(sc, root)
    c = time.process_time()
    calculon = importlib.import_module("calculon")
    imp = time.process_time() - c
    llm_cls, system_cls = calculon.llm.Llm, calculon.System
    app, exe, system = llm_cls.Application(app_json), llm_cls.Execution.from_json(exe_json), system_cls(sys_json)
    log = logging.getLogger("calculon-peer")
    secs = cpu = float("inf")
    step = 0.0
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        model = llm_cls(app, log)
        model.compile(system, exe)
        model.run(system)
        step = model.get_total_time()
        secs, cpu = min(secs, time.perf_counter() - t), min(cpu, time.process_time() - c)
    out = {"s": secs, "cpu_s": cpu, "answer": step, "label": calculon_label(exe_json)}
    return {**out, "import_cpu_s": imp} if first else out


def run_search(sc: Scenario, root: Path) -> dict[str, Any]:
    """Calculon's ``llm-optimal-execution`` (its command line, ``CALCULON_SEARCH_FLAGS``) for the
    scenario's model on its GPUs, the global batch at most the scenario's, its datatype: the
    plans it evaluated, its own rate (plans over the search's seconds, start-up and inputs
    left out), the whole command's wall clock, and the fastest plan it found.

    The system is Calculon's with its second memory tier (a100_80g.json: 512 GiB at 32 GB/s, for
    offload; a DGX A100 has none, and simdist's search has no offload) at 0 GiB, so that the
    search does not enumerate weight, activation and optimizer offload: on the shipped file the
    GPT-3 search ran past 15 minutes here, 5 minutes without the tier."""
    app_json, _, system = _inputs(sc, root)
    system["mem2"]["GiB"] = 0
    c = sc.cluster
    with tempfile.TemporaryDirectory() as tmp:
        app, syst, out = Path(tmp) / "application.json", Path(tmp) / "system.json", Path(tmp) / "best.json"
        app.write_text(json.dumps(app_json))
        syst.write_text(json.dumps(system))
        cmd = [sys.executable, str(root / "bin" / "calculon"), "llm-optimal-execution", str(app),
               str(c.num_nodes * c.gpus_per_node), str(sc.plan.global_batch_size),
               CALCULON_DATATYPES[sc.plan.precision], str(syst), str(out), *CALCULON_SEARCH_FLAGS]
        t = time.perf_counter()
        run = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
        wall = time.perf_counter() - t
        if run.returncode:
            raise RuntimeError(f"{' '.join(cmd[2:4])} failed: {(run.stdout + run.stderr)[-500:]}")
        best = json.loads(out.read_text())["0"]
    log = parse_search_log(run.stdout)
    return {**log, "s": log["plans"] / log["plans_per_s"], "command_s": wall,
            "answer": best["stats"]["total_time"], "label": calculon_label(best["execution"])}
