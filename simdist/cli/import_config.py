"""`simdist import`: a DeepSpeed config (ds_config.json) or an Accelerate config (YAML) plus a
model and a cluster preset -> a scenario file that `simdist predict` loads.

The command line only: the conversions are simdist.io.deepspeed and simdist.io.accelerate,
the reading, validation and rendering simdist.spec.imported. The scenario is written
atomically, and only once it loads.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from simdist.io.text import parse_yaml
from simdist.spec.files import write_text_atomic
from simdist.spec.imported import import_config, render
from simdist.spec.scenario import scenario_from_dict

__all__ = ["add_arguments", "main"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="ds_config.json (DeepSpeed) or an Accelerate config YAML")
    p.add_argument("--model", required=True, help="model preset (see `simdist list models`)")
    p.add_argument("--cluster", required=True, help="cluster preset (see `simdist list clusters`)")
    p.add_argument("--nodes", type=int, help="nodes (default: from the Accelerate config, else 1)")
    p.add_argument("--gpus-per-node", type=int, help="GPUs per node (default: the preset's)")
    p.add_argument("--global-batch-size", type=int, help="sequences per step, where the config says auto "
                   "or nothing (Accelerate configs never say)")
    p.add_argument("--micro-batch-size", type=int, help="sequences per GPU per micro-batch")
    p.add_argument("--name", help="scenario name (default: from the config's file name)")
    p.add_argument("--out", help="scenario YAML to write (default: print it)")


def main(args: argparse.Namespace) -> int:
    path = Path(args.config)
    d, notes = import_config(path, args.model, args.cluster, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                             global_batch_size=args.global_batch_size, micro_batch_size=args.micro_batch_size,
                             name=args.name)
    text = render(d, notes, path)
    scenario_from_dict(parse_yaml(text, "the imported scenario"))  # what is written must load as it stands
    if args.out:
        write_text_atomic(args.out, text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(text, end="")
    return 0
