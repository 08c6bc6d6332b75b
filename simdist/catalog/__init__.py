"""Catalogs as data files: GPUs, cluster presets, model presets and link generations, each
figure with its source.

Read with the same YAML reader as scenario files (duplicate keys refused), so a typo in a
catalog fails loudly instead of silently keeping one of two entries; without its bounds on
nesting and aliases, which guard against hostile files, not the package's own (a second parse
of each catalog: about 3 ms of every command).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from simdist.io.text import parse_yaml

CATALOG_DIR = Path(__file__).parent


@cache
def _load(name: str) -> dict[str, dict[str, Any]]:
    path = CATALOG_DIR / f"{name}.yaml"
    data = parse_yaml(path.read_text(encoding="utf-8"), str(path), field=f"catalog.{name}", bounded=False) or {}
    # keys starting with "_" are YAML anchors shared by several entries, not presets
    return {k: v for k, v in data.items() if not k.startswith("_")}


def gpus() -> dict[str, dict[str, Any]]:
    return _load("gpus")


def clusters() -> dict[str, dict[str, Any]]:
    return _load("clusters")


def models() -> dict[str, dict[str, Any]]:
    return _load("models")


def links() -> dict[str, dict[str, Any]]:
    """Link generations by where they sit ("intra_node", "inter_node"): label -> bandwidth, source."""
    return _load("links")
