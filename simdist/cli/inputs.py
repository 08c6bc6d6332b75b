"""Inputs several commands share: the scenario file, a calibration profile, stragglers."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from simdist.errors import Problem, ScenarioError

if TYPE_CHECKING:
    from simdist.spec.profile import CalibrationProfile
    from simdist.spec.scenario import Scenario


def add_profile_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", help="calibration profile JSON from `simdist calibrate`")


def add_db_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", help="run store (SQLite); default: the user's data directory or $SIMDIST_DB")


def add_straggler_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fidelity", default="symmetric", choices=("symmetric", "full"),
                   help="symmetric: one representative rank per equivalent group; full: every rank")
    p.add_argument("--straggler", action="append", default=[], metavar="RANK:FACTOR",
                   help="slow one GPU (RANK:FACTOR) or a node (node:N:FACTOR); full fidelity")


def load_profile_arg(path: str | None) -> CalibrationProfile | None:
    """The profile named by ``--profile``, or None."""
    if not path:
        return None
    from simdist.spec.profile import load_profile

    return load_profile(path)


def parse_stragglers(items: list[str]) -> dict[int, float]:
    """``RANK:FACTOR`` and ``node:N:FACTOR`` items -> {rank: factor}, nodes as negative keys."""
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


def load_inputs(args: argparse.Namespace) -> tuple[Scenario, CalibrationProfile | None, dict[int, float], str]:
    """The scenario, profile, stragglers and fidelity that `predict` and `trace` share."""
    from simdist.spec.scenario import load_scenario

    scenario = load_scenario(args.file)
    profile = load_profile_arg(args.profile)
    stragglers = parse_stragglers(args.straggler)
    fidelity = "full" if stragglers else args.fidelity
    return scenario, profile, stragglers, fidelity
