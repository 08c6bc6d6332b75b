"""The run store: every measurement and prediction in one SQLite file, keyed by the scenario's
hash, with the profile and versions used. Each write is one transaction, so a crash loses
nothing already stored. Default file: the user's data directory (SIMDIST_DB overrides)."""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL CHECK (kind IN ('measurement', 'prediction')),
    scenario_hash TEXT NOT NULL,
    name TEXT NOT NULL,
    created TEXT NOT NULL,
    engine TEXT,
    profile TEXT,
    simdist_version TEXT,
    torch_version TEXT,
    world_size INTEGER,
    step_time_s REAL,
    scenario_yaml TEXT,
    payload TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_by_hash ON runs (scenario_hash, kind);
"""


def default_db_path() -> Path:
    env = os.environ.get("SIMDIST_DB")
    if env:
        return Path(env)
    from platformdirs import user_data_dir

    return Path(user_data_dir("simdist")) / "runs.db"


@dataclass(frozen=True)
class StoredRun:
    id: int
    kind: str
    scenario_hash: str
    name: str
    created: str
    engine: str | None
    profile: str | None
    world_size: int | None
    step_time_s: float | None
    scenario_yaml: str | None
    payload: dict[str, Any]


class RunStore:
    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else default_db_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as conn:
            conn.executescript(SCHEMA)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self.path, timeout=30)
        try:
            with conn:  # one transaction: committed on success, rolled back on error
                yield conn
        finally:
            conn.close()

    def add(self, kind: str, payload: dict[str, Any], scenario_yaml: str | None = None,
            engine: str | None = None, profile: str | None = None) -> int:
        from simdist import __version__

        row = (
            kind, payload.get("scenario_hash", ""), payload.get("name", ""),
            datetime.now(UTC).isoformat(timespec="seconds"), engine, profile, __version__,
            payload.get("torch_version"), payload.get("world_size"), payload.get("step_time_s"),
            scenario_yaml, json.dumps(payload, default=str),
        )
        with self._connect() as conn:
            cur = conn.execute(
                "INSERT INTO runs (kind, scenario_hash, name, created, engine, profile, simdist_version,"
                " torch_version, world_size, step_time_s, scenario_yaml, payload)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
            return int(cur.lastrowid or 0)

    def runs(self, kind: str | None = None, scenario_hash: str | None = None) -> list[StoredRun]:
        query, args = "SELECT id, kind, scenario_hash, name, created, engine, profile, world_size," \
                      " step_time_s, scenario_yaml, payload FROM runs WHERE 1=1", []
        if kind:
            query += " AND kind = ?"
            args.append(kind)
        if scenario_hash:
            query += " AND scenario_hash LIKE ?"
            args.append(scenario_hash + "%")
        with self._connect() as conn:
            rows = conn.execute(query + " ORDER BY id", args).fetchall()
        return [StoredRun(*r[:10], payload=json.loads(r[10])) for r in rows]
