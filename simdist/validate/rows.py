"""What both validation reports share: where the data is, reading its CSV rows, the numbers in
their cells, and the error summary per group.

The public CSVs ship inside the package (simdist/validate/data/, with a README that names every
column's meaning and source); ``--data DIR`` or the ``SIMDIST_VALIDATION_DIR`` environment
variable points the reports at another copy with the same file names.
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Iterable
from importlib import resources
from pathlib import Path

from simdist.errors import Problem, ScenarioError

ENV_VAR = "SIMDIST_VALIDATION_DIR"
FILES = ("training_runs.csv", "breadth.csv")


def packaged_data_dir() -> Path:
    """The copy of the public validation data shipped with simdist."""
    return Path(str(resources.files("simdist.validate") / "data"))


def data_dir(override: str | Path | None = None) -> Path:
    """``override`` (``--data``), else $SIMDIST_VALIDATION_DIR, else the packaged data; a folder
    without the CSVs is bad input naming where it came from."""
    if override:
        where, path = "--data", Path(override)
    elif os.environ.get(ENV_VAR):
        where, path = ENV_VAR, Path(os.environ[ENV_VAR])
    else:
        return packaged_data_dir()
    missing = [f for f in FILES if not (path / f).is_file()]
    if missing:
        raise ScenarioError(Problem(where, f"{path} has no {' or '.join(missing)}"))
    return path


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def cell_int(v: str | None) -> int | None:
    """A whole number from a cell ("8", "8.0"), None when the cell is empty."""
    v = (v or "").strip()
    return int(float(v)) if v else None


def cell_float(v: str | None) -> float | None:
    """The leading number of a cell ("137", "56.5 (est.)"), None when there is none."""
    m = re.match(r"\s*([-+]?\d+(?:\.\d+)?)", v or "")
    return float(m.group(1)) if m else None


def first_number(text: str) -> float | None:
    """The first number anywhere in ``text``, thousands separators ignored ("~1,200 tokens/s")."""
    m = re.search(r"[-+]?\d+(?:\.\d+)?", text.replace(",", ""))
    return float(m.group(0)) if m else None


def error_summary(errors: Iterable[tuple[str, float]], overall: bool = True) -> dict[str, dict[str, float]]:
    """Per group (and overall): rows, mean |error|, mean error (bias) and max |error|."""
    groups: dict[str, list[float]] = {}
    every: list[float] = []
    for group, e in errors:
        groups.setdefault(group, []).append(e)
        every.append(e)
    if overall:
        groups["overall"] = every
    return {g: {"n": len(e), "mae": sum(abs(x) for x in e) / len(e), "bias": sum(e) / len(e),
                "max": max(abs(x) for x in e)} for g, e in groups.items() if e}
