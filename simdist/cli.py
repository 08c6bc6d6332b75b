"""The `simdist` command. Heavy modules are imported inside each subcommand so that
`simdist predict` starts fast."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence

from simdist.errors import ScenarioError

EXIT_BAD_INPUT = 2


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(requested=next((a for a in argv if not a.startswith("-")), None))
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return EXIT_BAD_INPUT
    try:
        return int(args.func(args) or 0)
    except ScenarioError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own exit code 2 matches ours
        self.print_usage(sys.stderr)
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def build_parser(requested: str | None = None) -> argparse.ArgumentParser:
    p = _Parser(prog="simdist", description="Predict distributed LLM training step time, memory and the best plan.")
    from simdist import __version__

    p.add_argument("--version", action="version", version=f"simdist {__version__}")
    sub = p.add_subparsers(title="commands", parser_class=_Parser)

    pr = sub.add_parser("predict", help="predict one step of a scenario")
    pr.add_argument("file")
    pr.add_argument("--json", action="store_true", help="print the contract's JSON object")
    pr.add_argument("--engine", default="des", choices=("des", "analytic"))
    pr.add_argument("--fidelity", default="symmetric", choices=("symmetric", "full"),
                    help="symmetric: one representative rank per equivalent group; full: every rank")
    pr.add_argument("--profile", help="calibration profile JSON from `simdist calibrate`")
    pr.add_argument("--straggler", action="append", default=[], metavar="RANK:FACTOR",
                    help="slow one GPU (RANK:FACTOR) or a node (node:N:FACTOR); full fidelity")
    pr.add_argument("--db", help="run store (SQLite) to record the prediction in")
    pr.add_argument("--no-store", action="store_true", help="do not record the prediction")
    pr.set_defaults(func=_cmd_predict)

    ls = sub.add_parser("list", help="list catalog entries")
    ls.add_argument("what", choices=("gpus", "clusters", "models"))
    ls.set_defaults(func=_cmd_list)

    for name, helptext, target in EXTRA_COMMANDS:
        sp = sub.add_parser(name, help=helptext)
        if name == requested:  # import a subcommand's module only when it is the one asked for
            _attach(sp, target)
    return p


# Subcommands implemented in their own modules: (name, help, "module:add_arguments:main").
# The module's add_arguments(parser) declares its options; main(args) -> exit code runs it.
EXTRA_COMMANDS: list[tuple[str, str, str]] = [
    ("trace", "write a Chrome/Perfetto trace of one simulated step", "simdist.trace.cli:add_arguments:main"),
    ("validate", "predict the public validation runs and report the error", "simdist.validation:add_arguments:main"),
    ("search", "find the fastest plan that fits", "simdist.search_cli:add_arguments:main"),
    ("run", "run a scenario for real with torchrun and measure it", "executor.cli:add_arguments:main"),
    ("calibrate", "microbenchmark this machine and fit a calibration profile", "simdist.calibrate.cli:add_calibrate_arguments:calibrate_main"),
    ("runs", "list stored measurements and predictions", "simdist.calibrate.cli:add_runs_arguments:runs_main"),
    ("compare", "predicted vs measured for stored runs", "simdist.calibrate.cli:add_compare_arguments:compare_main"),
    ("goodput", "goodput against the checkpoint interval", "simdist.reliability_cli:add_arguments:main"),
    ("import", "turn a DeepSpeed or Accelerate config into a scenario", "simdist.importers:add_arguments:main"),
]


def _attach(sp: argparse.ArgumentParser, target: str) -> None:
    import importlib

    module_name, add_name, main_name = target.split(":")
    module = importlib.import_module(module_name)
    getattr(module, add_name)(sp)
    func: Callable[[argparse.Namespace], int] = getattr(module, main_name)
    sp.set_defaults(func=func)


def parse_stragglers(items: list[str]) -> dict[int, float]:
    from simdist.errors import Problem

    out: dict[int, float] = {}
    for item in items:
        parts = item.split(":")
        try:
            if parts[0] == "node" and len(parts) == 3:
                out[-1 - int(parts[1])] = float(parts[2])  # negative keys name nodes
            elif len(parts) == 2:
                out[int(parts[0])] = float(parts[1])
            else:
                raise ValueError
        except ValueError:
            raise ScenarioError(Problem("--straggler", f"{item!r} is not RANK:FACTOR or node:N:FACTOR")) from None
        if float(parts[-1]) < 1:
            raise ScenarioError(Problem("--straggler", f"{item!r}: the slow-down factor must be >= 1"))
    return out


def load_inputs(args: argparse.Namespace):
    """The scenario, profile, stragglers and fidelity that `predict` and `trace` share."""
    from simdist.spec.scenario import load_scenario

    scenario = load_scenario(args.file)
    profile = None
    if args.profile:
        from simdist.spec.profile import load_profile

        profile = load_profile(args.profile)
    stragglers = parse_stragglers(args.straggler)
    fidelity = "full" if stragglers else args.fidelity
    return scenario, profile, stragglers, fidelity


def _cmd_predict(args: argparse.Namespace) -> int:
    from simdist.predict import predict

    scenario, profile, stragglers, fidelity = load_inputs(args)
    pred = predict(scenario, profile=profile, engine=args.engine, fidelity=fidelity,
                   keep_spans=False, stragglers=stragglers)
    if args.json:
        print(json.dumps(pred.to_dict(), indent=2))
    else:
        from simdist.table import prediction_report

        print(prediction_report(pred))
    if not args.no_store:
        _store_prediction(args, pred)
    return 0


def _store_prediction(args: argparse.Namespace, pred) -> None:
    """Keep every prediction in the run store; a store problem never fails the prediction."""
    import sqlite3
    from pathlib import Path

    from simdist.calibrate.store import RunStore

    try:
        RunStore(args.db).add("prediction", pred.to_dict(), Path(args.file).read_text(encoding="utf-8"),
                              engine=pred.engine, profile=pred.profile)
    except (OSError, sqlite3.Error) as exc:
        print(f"warning: prediction not stored ({exc})", file=sys.stderr)


def _cmd_list(args: argparse.Namespace) -> int:
    from simdist import catalog
    from simdist.table import table

    if args.what == "gpus":
        rows = []
        for name, e in catalog.gpus().items():
            peaks = e["peak_tflops"]
            rows.append([name, e["memory"], e["memory_bandwidth"], peaks.get("bf16", peaks.get("fp16", "")),
                         peaks.get("fp8", "-"), peaks.get("fp32", "")])
        print(table(["gpu", "memory", "HBM bandwidth", "bf16 TFLOP/s", "fp8", "fp32"], rows, align="llrrrr"))
    elif args.what == "clusters":
        rows = []
        for name, e in catalog.clusters().items():
            intra, inter = e["intra_node"], e["inter_node"]
            rows.append([name, e["gpu"], e["gpus_per_node"], f"{intra['kind']} {intra['bandwidth']}",
                         f"{inter.get('nics_per_node', 1)}x {inter['kind']} {inter['bandwidth']}",
                         "yes" if e.get("in_switch_reduction") else "no"])
        print(table(["cluster", "gpu", "gpus/node", "intra-node (per GPU)", "inter-node (per node)",
                     "in-switch reduce"], rows, align="llrlll"))
    else:
        from simdist.analytic.params import total_params
        from simdist.spec.model import ModelSpec

        rows = []
        for name, e in catalog.models().items():
            m = ModelSpec(name=name, **{k: v for k, v in e.items() if k != "published_params"})
            rows.append([name, f"{total_params(m) / 1e9:.2f}B", m.num_layers, m.hidden_size,
                         f"{m.num_attention_heads}/{m.num_kv_heads}", m.ffn_hidden_size, m.mlp,
                         m.vocab_size, m.seq_length])
        print(table(["model", "params", "layers", "hidden", "heads/kv", "ffn", "mlp", "vocab", "seq"],
                    rows, align="lrrrrrlrr"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
