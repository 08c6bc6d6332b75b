"""A sweep's table as a pandas DataFrame: ``point`` (the point's index), one column per swept
field (named by its dotted key, the only columns with a dot), then the results
(:data:`simdist.sweep.points.RESULT_COLUMNS`). Written whole or not at all: CSV or Parquet
(by the file's suffix; Parquet needs pyarrow), into a temporary file renamed over the target.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simdist.errors import Problem, ScenarioError
from simdist.spec.files import write_text_atomic

if TYPE_CHECKING:
    import pandas as pd

FORMATS = (".csv", ".parquet")


def axis_columns(columns: list[str] | Any) -> list[str]:
    """The swept fields among a table's columns (dotted keys)."""
    return [c for c in columns if "." in str(c)]


def to_frame(columns: list[str], rows: list[dict[str, Any]]) -> pd.DataFrame:
    import pandas as pd

    frame = pd.DataFrame([[r.get(c) for c in columns] for r in rows], columns=columns)
    return normalized(frame)


def normalized(frame: pd.DataFrame) -> pd.DataFrame:
    """The same table whether built from rows or read back from a CSV: ``problem`` holds ""
    for none, a missing number is NaN (a column with one is of floats)."""
    frame = frame.copy()
    if "problem" in frame:
        frame["problem"] = frame["problem"].fillna("").astype(str)
    from pandas.api.types import is_object_dtype

    for column in [c for c in frame.columns if is_object_dtype(frame[c])]:  # booleans with a gap: NaN, as a CSV reads it
        frame[column] = frame[column].where(frame[column].notna(), float("nan"))
        if frame[column].isna().all():
            frame[column] = frame[column].astype(float)
    return frame.reset_index(drop=True)


def out_problems(path: str | Path | None, flag: str = "--out") -> list[Problem]:
    """What is wrong with an output path, before anything runs."""
    if path is None:
        return []
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        return [Problem(flag, f"{path}: name a .csv or .parquet file")]
    if suffix == ".parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            return [Problem(flag, "writing Parquet needs pyarrow (pip install pyarrow), or name a .csv file")]
    return []


def write_table(frame: pd.DataFrame, path: str | Path) -> None:
    problems = out_problems(path)
    if problems:
        raise ScenarioError(problems)
    p = Path(path)
    if p.suffix.lower() == ".csv":
        write_text_atomic(p, frame.to_csv(index=False))
        return
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    os.close(fd)
    try:
        frame.to_parquet(tmp, index=False)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_table(path: str | Path) -> pd.DataFrame:
    """A table written by :func:`write_table` (or by ``simdist sweep --out``)."""
    import pandas as pd

    p = Path(path)
    if p.suffix.lower() == ".parquet":
        return normalized(pd.read_parquet(p))
    return normalized(pd.read_csv(p))
