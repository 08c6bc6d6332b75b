"""Sweeps in the run store: two tables beside ``runs`` in the same SQLite file (``--db``).

``sweeps`` holds one row per sweep id (its definition, the keys of its points in order, the
columns of its table); ``sweep_points`` one row per finished point, keyed by the sweep id and
the point's key (a hash of the point's overrides and of everything the points share), written
one transaction per finished chunk. A rerun of the same sweep id skips the points whose key is
there; a changed base scenario or option changes every key, and the points are run again.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from simdist.calibrate.store import RunStore
from simdist.frozen import frozen

SCHEMA = """
CREATE TABLE IF NOT EXISTS sweeps (
    sweep_id TEXT PRIMARY KEY,
    created TEXT NOT NULL,
    updated TEXT NOT NULL,
    points INTEGER NOT NULL,
    columns TEXT NOT NULL,
    point_keys TEXT NOT NULL,
    definition TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS sweep_points (
    sweep_id TEXT NOT NULL,
    point_key TEXT NOT NULL,
    idx INTEGER NOT NULL,
    row TEXT NOT NULL,
    created TEXT NOT NULL,
    PRIMARY KEY (sweep_id, point_key)
);
"""


@frozen
class StoredSweep:
    sweep_id: str
    created: str
    updated: str
    points: int
    done: int


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class SweepStore:
    """The sweep tables of the run store at ``path`` (default: the user's, or $SIMDIST_DB)."""

    def __init__(self, path: str | Path | None = None, create: bool = True):
        """``create=False`` (a reader such as the dashboard) adds no tables to the file."""
        self.runs = RunStore(path)
        self.path = self.runs.path
        if create:
            with self.runs.transaction() as conn:
                conn.executescript(SCHEMA)

    def begin(self, sweep_id: str, definition: dict[str, Any], columns: list[str], keys: list[str]) -> None:
        """Record (or update) the sweep's definition and its points' keys, in order."""
        now = _now()
        with self.runs.transaction() as conn:
            conn.execute(
                "INSERT INTO sweeps (sweep_id, created, updated, points, columns, point_keys, definition)"
                " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (sweep_id) DO UPDATE SET updated = excluded.updated,"
                " points = excluded.points, columns = excluded.columns, point_keys = excluded.point_keys,"
                " definition = excluded.definition",
                (sweep_id, now, now, len(keys), json.dumps(columns), json.dumps(keys),
                 json.dumps(definition, default=str)))

    def done_keys(self, sweep_id: str) -> set[str]:
        with self.runs.transaction() as conn:
            return {r[0] for r in conn.execute("SELECT point_key FROM sweep_points WHERE sweep_id = ?", (sweep_id,))}

    def save(self, sweep_id: str, rows: Iterable[tuple[str, int, dict[str, Any]]]) -> None:
        """Finished points ``(key, index, row)``, in one transaction."""
        now = _now()
        with self.runs.transaction() as conn:
            conn.executemany(
                "INSERT OR REPLACE INTO sweep_points (sweep_id, point_key, idx, row, created) VALUES (?, ?, ?, ?, ?)",
                [(sweep_id, key, idx, json.dumps(row), now) for key, idx, row in rows])

    def rows(self, sweep_id: str) -> tuple[list[str], list[dict[str, Any]]]:
        """The columns and the rows of the sweep's current points, in point order (points not
        finished yet are left out)."""
        with self.runs.transaction() as conn:
            head = conn.execute("SELECT columns, point_keys FROM sweeps WHERE sweep_id = ?", (sweep_id,)).fetchone()
            if head is None:
                raise KeyError(sweep_id)
            stored = dict(conn.execute("SELECT point_key, row FROM sweep_points WHERE sweep_id = ?", (sweep_id,)))
        columns, keys = json.loads(head[0]), json.loads(head[1])
        return columns, [json.loads(stored[k]) for k in keys if k in stored]

    def sweeps(self) -> list[StoredSweep]:
        with self.runs.transaction() as conn:
            if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'sweeps'").fetchone() is None:
                return []  # a store no sweep has written to
            heads = conn.execute("SELECT sweep_id, created, updated, points, point_keys FROM sweeps"
                                 " ORDER BY updated DESC, sweep_id").fetchall()
            out = []
            for sweep_id, created, updated, points, keys in heads:
                stored = {r[0] for r in conn.execute(
                    "SELECT point_key FROM sweep_points WHERE sweep_id = ?", (sweep_id,))}
                out.append(StoredSweep(sweep_id, created, updated, points,
                                       sum(k in stored for k in json.loads(keys))))
        return out
