"""The ``simdist run`` subcommand as simdist.cli loads it (``executor.cli:add_arguments:main``)."""

from __future__ import annotations

import argparse

from executor.launch import add_run_arguments, run_command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare ``simdist run``'s options: FILE, --nproc, --steps, --warmup, --out, ..."""
    add_run_arguments(parser)


def main(args: argparse.Namespace) -> int:
    """Run it; the exit code is 0 (measured), 1 (the run failed) or 2 (refused before launch)."""
    return run_command(args)
