"""Inputs several commands share: the scenario file, a calibration profile, stragglers."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from simdist.errors import Problem, ScenarioError

if TYPE_CHECKING:
    from simdist.spec.profile import CalibrationProfile
    from simdist.spec.scenario import Scenario


SET_HELP = ("set one scenario field, e.g. --set plan.tp=4 --set cluster.num_nodes=32 (repeatable; "
            "VALUE is read as YAML: 4, true, '300 GB/s'; checked like the file)")


def add_set_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="set", help=SET_HELP)


def load_scenario_arg(args: argparse.Namespace) -> Scenario:
    """The scenario named by ``args.file`` with its ``--set`` fields applied."""
    import sys

    from simdist.spec.overrides import load_scenario_with

    scenario = load_scenario_with(args.file, getattr(args, "set", None) or ())
    for note in scenario.notes:  # e.g. the DeepSpeed config keys that are not simulated
        print(f"note: {note}", file=sys.stderr)
    return scenario


def scenario_text(args: argparse.Namespace) -> str:
    """The scenario's text as it ran: the file's, or with ``--set`` the merged YAML."""
    from pathlib import Path

    sets = getattr(args, "set", None) or ()
    if not sets:
        return Path(args.file).read_text(encoding="utf-8")
    import yaml

    from simdist.spec.overrides import scenario_data

    return yaml.safe_dump(scenario_data(args.file, sets), sort_keys=False)


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


MAX_SLOWDOWN = 1000.0  # a GPU a thousand times slower has failed; larger factors only break the arithmetic


def parse_stragglers(items: list[str]) -> dict[int, float]:
    """``RANK:FACTOR`` and ``node:N:FACTOR`` items -> {rank: factor}, nodes as negative keys."""
    out: dict[int, float] = {}
    for item in items:
        parts = item.split(":")
        try:
            if parts[0] == "node" and len(parts) == 3:
                where, key = int(parts[1]), -1 - int(parts[1])  # negative keys name nodes
            elif len(parts) == 2:
                where = key = int(parts[0])
            else:
                raise ValueError
            factor = float(parts[-1])
        except ValueError:
            raise ScenarioError(Problem("--straggler", f"{item!r} is not RANK:FACTOR or node:N:FACTOR")) from None
        if where < 0:
            raise ScenarioError(Problem("--straggler", f"{item!r}: ranks and nodes count from 0"))
        if not 1 <= factor <= MAX_SLOWDOWN:  # also refuses nan and inf
            raise ScenarioError(Problem("--straggler", f"{item!r}: the slow-down factor must be a number "
                                        f"from 1 to {MAX_SLOWDOWN:g}"))
        out[key] = factor
    return out


def check_stragglers(stragglers: dict[int, float], scenario: Scenario) -> None:
    """Every straggler names a rank (or node) of the scenario's cluster."""
    cluster = scenario.cluster
    for key in stragglers:
        if key >= 0 and key >= cluster.world_size:
            raise ScenarioError(Problem("--straggler", f"rank {key} is not one of the cluster's "
                                        f"{cluster.world_size:,} GPUs (0 to {cluster.world_size - 1:,})"))
        if key < 0 and -1 - key >= cluster.num_nodes:
            raise ScenarioError(Problem("--straggler", f"node {-1 - key} is not one of the cluster's "
                                        f"{cluster.num_nodes:,} nodes"))


def load_inputs(args: argparse.Namespace) -> tuple[Scenario, CalibrationProfile | None, dict[int, float], str]:
    """The scenario, profile, stragglers and fidelity that `predict` and `trace` share."""
    scenario = load_scenario_arg(args)
    profile = load_profile_arg(args.profile)
    stragglers = parse_stragglers(args.straggler)
    check_stragglers(stragglers, scenario)
    fidelity = "full" if stragglers else args.fidelity
    return scenario, profile, stragglers, fidelity
