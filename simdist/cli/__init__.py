"""The `simdist` command: one module per command in this package.

Each command module declares ``add_arguments(parser)`` and runs ``main(args) -> exit code``.
Only the module of the command asked for is imported (``simdist predict`` never imports the
search, the executor or plotly), so the command starts fast.

Exit codes: 0 done; 1 the command ran and says it failed (no plan fits, a run failed);
2 bad input, one line per problem naming the field or flag, never a traceback.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import importlib
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from simdist.errors import ScenarioError

EXIT_BAD_INPUT = 2

# (command, help, module): the module holds add_arguments(parser) and main(args)
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("predict", "predict one step of a scenario", "simdist.cli.predict"),
    ("list", "list catalog entries", "simdist.cli.catalogs"),
    ("trace", "write a Chrome/Perfetto trace of one simulated step", "simdist.cli.trace"),
    ("validate", "predict the public validation runs and report the error", "simdist.cli.validate"),
    ("search", "find the fastest plan that fits", "simdist.cli.search"),
    ("run", "run a scenario for real with torchrun and measure it", "simdist.cli.run"),
    ("calibrate", "microbenchmark this machine and fit a calibration profile", "simdist.cli.calibrate"),
    ("runs", "list stored measurements and predictions", "simdist.cli.runs"),
    ("compare", "predicted vs measured for stored runs", "simdist.cli.compare"),
    ("sweep", "predict or search every point of a sweep over scenario fields", "simdist.cli.sweep"),
    ("goodput", "goodput against the checkpoint interval", "simdist.cli.goodput"),
    ("import", "turn a DeepSpeed or Accelerate config into a scenario", "simdist.cli.import_config"),
)


def program() -> None:
    """The program (the ``simdist`` script, ``python -m simdist.cli``): :func:`main`, and for a
    command that allows it, the process ended as soon as its output is written."""
    sys.exit(main(exit_when_done=True))


def main(argv: Sequence[str] | None = None, *, exit_when_done: bool = False) -> int:
    """Run one command; its exit code. ``exit_when_done``: a command whose module sets
    ``EXIT_WHEN_DONE`` ends the process once it returns (:func:`exit_now`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    requested = next((a for a in argv if not a.startswith("-")), None)
    with gc_paused():  # importing the command's modules makes long-lived objects only
        parser = build_parser(requested, alone=bool(argv) and argv[0] == requested)
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return EXIT_BAD_INPUT
    code = _run(args)
    if exit_when_done and args.exit_when_done:
        exit_now(code)
    return code


def exit_now(code: int) -> None:
    """End the process with ``code`` without tearing down the interpreter: the exit handlers
    run and the output is flushed, but the final garbage collection and the freeing of every
    object and module (some 30 ms after a prediction, for nothing) are skipped. Returns (and
    the caller exits normally) when a flush fails or another thread still runs."""
    threading = sys.modules.get("threading")
    if threading is not None and threading.active_count() > 1:
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return  # the normal exit reports it as Python does
    run_handlers = getattr(atexit, "_run_exitfuncs", None)
    if run_handlers is None:
        return
    run_handlers()
    os._exit(code)


def _run(args: argparse.Namespace) -> int:
    try:
        if args.pause_gc:
            with gc_paused():
                return int(args.func(args) or 0)
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


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector paused inside, its previous state restored after. A
    collection walks every live object; while modules are imported (classes, functions, the
    catalogs) or a short command runs, almost nothing dies in a cycle, so it would find nothing."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own exit code 2 matches ours
        self.print_usage(sys.stderr)
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def build_parser(requested: str | None = None, alone: bool = False) -> argparse.ArgumentParser:
    """The parser; only the ``requested`` command's module is imported and declares its options.
    ``alone``: the command line starts with that command, so the other commands' parsers are
    left out (argparse's sub-parsers cost a few milliseconds each); an unknown name gets them
    all, for the message that lists them."""
    from simdist import __version__

    p = _Parser(prog="simdist", description="Predict distributed LLM training step time, memory and the best plan.")
    p.add_argument("--version", action="version", version=f"simdist {__version__}")
    sub = p.add_subparsers(title="commands", parser_class=_Parser)
    known = any(name == requested for name, _, _ in COMMANDS)
    for name, helptext, module_name in COMMANDS:
        if alone and known and name != requested:
            continue
        sp = sub.add_parser(name, help=helptext)
        if name == requested:
            module = importlib.import_module(module_name)
            module.add_arguments(sp)
            # PAUSE_GC: a short command (its work bounded, its garbage gone at exit) runs with
            # the collector paused
            sp.set_defaults(func=module.main, pause_gc=getattr(module, "PAUSE_GC", False),
                            exit_when_done=getattr(module, "EXIT_WHEN_DONE", False))
    return p


if __name__ == "__main__":
    sys.exit(main())
