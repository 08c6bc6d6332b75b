"""Catalogs as data files: GPUs, cluster presets, model presets and link generations, each
figure with its source."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml

CATALOG_DIR = Path(__file__).parent

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@cache
def _load(name: str) -> dict[str, dict[str, Any]]:
    with open(CATALOG_DIR / f"{name}.yaml", encoding="utf-8") as fh:
        data = yaml.load(fh, Loader=_Loader) or {}
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
