"""`simdist list gpus|clusters|models`: the catalog entries, one table each."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("what", choices=("gpus", "clusters", "models"))


def main(args: argparse.Namespace) -> int:
    print({"gpus": gpus_table, "clusters": clusters_table, "models": models_table}[args.what]())
    return 0


def gpus_table() -> str:
    from simdist import catalog
    from simdist.table import table

    rows = []
    for name, e in catalog.gpus().items():
        peaks = e["peak_tflops"]
        rows.append([name, e["memory"], e["memory_bandwidth"], peaks.get("bf16", peaks.get("fp16", "")),
                     peaks.get("fp8", "-"), peaks.get("fp32", "")])
    return table(["gpu", "memory", "HBM bandwidth", "bf16 TFLOP/s", "fp8", "fp32"], rows, align="llrrrr")


def clusters_table() -> str:
    from simdist import catalog
    from simdist.table import table

    rows = []
    for name, e in catalog.clusters().items():
        intra, inter = e["intra_node"], e["inter_node"]
        rows.append([name, e["gpu"], e["gpus_per_node"], f"{intra['kind']} {intra['bandwidth']}",
                     f"{inter.get('nics_per_node', 1)}x {inter['kind']} {inter['bandwidth']}",
                     "yes" if e.get("in_switch_reduction") else "no"])
    return table(["cluster", "gpu", "gpus/node", "intra-node (per GPU)", "inter-node (per node)",
                  "in-switch reduce"], rows, align="llrlll")


def models_table() -> str:
    from simdist import catalog
    from simdist.analytic.params import total_params
    from simdist.spec.model import ModelSpec
    from simdist.table import table

    rows = []
    for name, e in catalog.models().items():
        m = ModelSpec(name=name, **{k: v for k, v in e.items() if k != "published_params"})
        rows.append([name, f"{total_params(m) / 1e9:.2f}B", m.num_layers, m.hidden_size,
                     f"{m.num_attention_heads}/{m.num_kv_heads}", m.ffn_hidden_size, m.mlp,
                     m.vocab_size, m.seq_length])
    return table(["model", "params", "layers", "hidden", "heads/kv", "ffn", "mlp", "vocab", "seq"],
                 rows, align="lrrrrrlrr")
