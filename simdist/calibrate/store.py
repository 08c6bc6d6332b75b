"""The run store: every measurement and prediction in one SQLite file, keyed by the scenario's
hash, with the profile and versions used. Each write is one transaction, so a crash loses
nothing already stored. Default file: the user's data directory (SIMDIST_DB overrides).

The path (``--db``) is checked before SQLite touches it: a directory, a pipe, a device, an
existing empty file, a file that is not SQLite, or an SQLite database of something else is
refused with one :class:`StoreError` naming ``--db``; SQLite never creates or rewrites a file it
was not meant to. A new store is built in a temporary file and linked into place whole, so
no one ever sees it empty (which is why an empty file is always someone else's, and refused
rather than turned into a database); connections open the file read-write, never create it.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import stat
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from simdist.errors import Problem, ScenarioError
from simdist.frozen import frozen

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
COLUMNS = {"id", "kind", "scenario_hash", "name", "created", "engine", "profile", "world_size",
           "step_time_s", "scenario_yaml", "payload"}
SQLITE_HEADER = b"SQLite format 3\x00"


class StoreError(ScenarioError, sqlite3.DatabaseError):
    """A run store that cannot be used, naming ``--db``: bad input for the CLI (exit 2), and an
    ``sqlite3.DatabaseError`` for the callers that only warn when a result cannot be stored."""

    def __init__(self, message: str):
        ScenarioError.__init__(self, Problem("--db", message))


def default_db_path() -> Path:
    env = os.environ.get("SIMDIST_DB")
    if env:
        return Path(env)
    from platformdirs import user_data_dir

    return Path(user_data_dir("simdist")) / "runs.db"


@frozen
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
        if not _checked(self.path):
            _create(self.path)
        with self._connect() as conn:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if tables - {"sqlite_sequence"} and "runs" not in tables:
                raise StoreError(f"{_show(self.path)} is an SQLite database of something else (tables: "
                                 f"{', '.join(sorted(tables)[:5])}), not a simdist run store")
            columns = {r[1] for r in conn.execute("PRAGMA table_info(runs)")}
            if columns and not columns >= COLUMNS:
                raise StoreError(f"{_show(self.path)} has a runs table that is not a simdist run store's")
            conn.executescript(SCHEMA)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        try:  # mode=rw: SQLite never creates the file (a new store is made whole by _create)
            conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=rw", uri=True, timeout=30)
        except sqlite3.Error as exc:
            raise StoreError(f"{_show(self.path)} cannot be opened as a run store ({exc})") from None
        try:
            with conn:  # one transaction: committed on success, rolled back on error
                yield conn
        except (StoreError, sqlite3.IntegrityError, sqlite3.ProgrammingError, sqlite3.InterfaceError):
            raise  # a bad row or call is the program's error, not the file's
        except sqlite3.Error as exc:  # not a database, corrupt, locked for longer than the timeout
            raise StoreError(f"{_show(self.path)}: {exc}") from None
        finally:
            conn.close()

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        """One transaction on the store's file, for tables kept beside ``runs`` (sweeps)."""
        return self._connect()

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
        if scenario_hash:  # a hash prefix or the scenario's name
            query += " AND (scenario_hash LIKE ? ESCAPE '\\' OR name = ?)"
            args += [scenario_hash.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%",
                     scenario_hash]
        with self._connect() as conn:
            rows = conn.execute(query + " ORDER BY id", args).fetchall()
        out = []
        for r in rows:
            try:
                payload = json.loads(r[10])
            except (TypeError, ValueError):
                raise StoreError(f"{_show(self.path)}: run {r[0]} holds a payload that is not JSON") from None
            if not isinstance(payload, dict):
                raise StoreError(f"{_show(self.path)}: run {r[0]} holds a payload that is not a JSON object")
            out.append(StoredRun(*r[:10], payload=payload))
        return out

    def remove(self, ids: list[int]) -> list[int]:
        """Delete the runs with these ids (one transaction); returns the ids that were there."""
        with self._connect() as conn:
            found = [i for i in ids if conn.execute("SELECT 1 FROM runs WHERE id = ?", (i,)).fetchone()]
            conn.executemany("DELETE FROM runs WHERE id = ?", [(i,) for i in found])
        return found


# --- the path, checked before SQLite opens it -------------------------------------------------

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a pipe (FIFO)"), (stat.S_ISCHR, "a device"),
          (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))


def _checked(path: Path) -> bool:
    """True if ``path`` is an existing SQLite file; False if nothing is there yet; StoreError if
    something else is (a directory, a special file, an empty or a non-SQLite file)."""
    shown = _show(path)
    try:
        info = os.stat(path)
    except ValueError:  # a NUL in the path
        raise StoreError(f"{shown}: a path cannot contain a NUL character") from None
    except FileNotFoundError:
        return False
    except OSError as exc:
        why = {errno.ENOTDIR: "a part of the path is not a directory", errno.ELOOP: "a symbolic link loop",
               errno.EACCES: "permission denied", errno.ENAMETOOLONG: "too long a path"}
        raise StoreError(f"{shown} cannot be used ({why.get(exc.errno or 0, exc.strerror)})") from None
    for test, kind in _KINDS:
        if test(info.st_mode):
            raise StoreError(f"{shown} is {kind}, not a run store file")
    if info.st_size == 0:
        raise StoreError(f"{shown} is an empty file, not a run store: remove it, or name another --db")
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise StoreError(f"{shown} cannot be read ({exc.strerror})") from None
    if head != SQLITE_HEADER:
        raise StoreError(f"{shown} is not an SQLite database (a simdist run store)")
    return True


def _create(path: Path) -> None:
    """A new store with its schema, built in a temporary file and linked into place whole."""
    shown = _show(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        import tempfile  # here: only a new store needs it

        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".new", dir=path.parent)
    except (OSError, ValueError) as exc:
        raise StoreError(f"{shown} cannot be created ({getattr(exc, 'strerror', None) or exc})") from None
    os.close(fd)
    try:
        conn = sqlite3.connect(tmp)
        try:
            conn.executescript(SCHEMA)
            conn.commit()
        finally:
            conn.close()
        try:
            os.link(tmp, path)  # atomic, and never over an existing file
        except FileExistsError:
            pass  # another process made the store first: use theirs
        except OSError:  # a file system without hard links
            if not path.exists():
                os.replace(tmp, path)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(f"{shown} cannot be created ({exc})") from None
    finally:
        Path(tmp).unlink(missing_ok=True)
    _checked(path)


def _show(path: Path) -> str:
    text = str(path).replace("\x00", "\\0")
    return text if len(text) <= 200 else text[:197] + "..."
