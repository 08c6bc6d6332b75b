"""Issue 20 item 6: `simdist runs --db` on anything that is not a run store is one clean error
naming --db (exit 2), nothing is created or rewritten; an existing empty file is refused, not
turned into a database; concurrent writers and kill -9 lose or tear nothing."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, measurement, run_cli

from simdist.calibrate.store import RunStore, StoreError
from simdist.errors import ScenarioError


def _hostile(tmp_path: Path, kind: str) -> tuple[str, str]:
    """(the --db path, what the error says)."""
    if kind == "directory":
        (tmp_path / "d").mkdir()
        return str(tmp_path / "d"), "is a directory"
    if kind == "empty file":
        (tmp_path / "e.db").touch()
        return str(tmp_path / "e.db"), "is an empty file"
    if kind == "random bytes":
        (tmp_path / "r.db").write_bytes(os.urandom(8192))
        return str(tmp_path / "r.db"), "is not an SQLite database"
    if kind == "text file":
        (tmp_path / "t.db").write_text("name: not a database\n")
        return str(tmp_path / "t.db"), "is not an SQLite database"
    if kind == "fifo":
        os.mkfifo(tmp_path / "p.db")
        return str(tmp_path / "p.db"), "is a pipe (FIFO)"
    if kind == "device":
        return "/dev/zero", "is a device"
    if kind == "another program's database":
        conn = sqlite3.connect(tmp_path / "o.db")
        conn.execute("CREATE TABLE accounts (user TEXT)")
        conn.commit()
        conn.close()
        return str(tmp_path / "o.db"), "an SQLite database of something else"
    if kind == "a file as a folder":
        (tmp_path / "f").write_text("x")
        return str(tmp_path / "f" / "runs.db"), "a part of the path is not a directory"
    if kind == "symlink loop":
        (tmp_path / "l1").symlink_to(tmp_path / "l2")
        (tmp_path / "l2").symlink_to(tmp_path / "l1")
        return str(tmp_path / "l1"), "symbolic link loop"
    raise AssertionError(kind)


KINDS = ("directory", "empty file", "random bytes", "text file", "fifo", "device", "another program's database",
         "a file as a folder", "symlink loop")


def _snapshot(tmp_path: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in tmp_path.rglob("*")}


@pytest.mark.parametrize("kind", KINDS)
def test_runs_on_what_is_not_a_run_store_is_one_clean_error(tmp_path, kind):
    db, says = _hostile(tmp_path, kind)
    before = _snapshot(tmp_path)
    r = run_cli("runs", "--db", db)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --db: ") and says in lines[0], r.stderr
    assert _snapshot(tmp_path) == before  # nothing created, nothing rewritten


@pytest.mark.parametrize("kind", ["empty file", "random bytes", "directory"])
def test_a_prediction_is_printed_and_the_bad_store_only_warned_about(tmp_path, kind):
    db, says = _hostile(tmp_path, kind)
    r = run_cli("predict", str(REPO / "scenarios" / "llama2-7b-1xa100.yaml"), "--db", db, "--engine", "analytic")
    assert r.returncode == 0, r.stderr
    assert "step time" in r.stdout
    assert "warning: prediction not stored (--db: " in r.stderr and says in r.stderr
    if kind == "empty file":
        assert Path(db).stat().st_size == 0


def test_a_store_error_is_bad_input_and_a_database_error():
    exc = StoreError("x.db is not an SQLite database")
    assert isinstance(exc, ScenarioError) and isinstance(exc, sqlite3.DatabaseError)
    assert [str(p) for p in exc.problems] == ["--db: x.db is not an SQLite database"]


def test_a_new_store_appears_whole(tmp_path):
    db = tmp_path / "new" / "runs.db"
    store = RunStore(db)
    assert db.read_bytes()[:16] == b"SQLite format 3\x00"
    assert [p.name for p in db.parent.iterdir()] == ["runs.db"]  # no temporary file left
    store.add("measurement", measurement())
    assert len(RunStore(db).runs()) == 1


def test_a_payload_that_is_not_json_is_an_error(tmp_path):
    db = tmp_path / "runs.db"
    RunStore(db).add("measurement", measurement())
    conn = sqlite3.connect(db)
    conn.execute("UPDATE runs SET payload = 'not json'")
    conn.commit()
    conn.close()
    r = run_cli("runs", "--db", str(db))
    assert r.returncode == 2 and r.stderr.strip() == f"error: --db: {db}: run 1 holds a payload that is not JSON"


def _writer(db: str, n: int, start: float) -> None:
    while time.time() < start:  # all at once
        pass
    store = RunStore(db)
    for i in range(n):
        store.add("measurement", measurement(name=f"w{os.getpid()}-{i}"))


def test_concurrent_writers_on_a_new_store_lose_nothing(tmp_path):
    db = str(tmp_path / "fresh" / "runs.db")
    ctx = multiprocessing.get_context("fork")
    start = time.time() + 0.5
    procs = [ctx.Process(target=_writer, args=(db, 10, start)) for _ in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    runs = RunStore(db).runs()
    assert len(runs) == 80 and len({r.name for r in runs}) == 80
    assert sorted(p.name for p in Path(db).parent.iterdir()) == ["runs.db"]


KILLED = """
import sys
from simdist.calibrate.store import RunStore
store = RunStore(sys.argv[1])
i = 0
print("ready", flush=True)
while True:
    store.add("measurement", {"name": f"k{i}", "scenario_hash": "h", "step_time_s": 1.0, "pad": "x" * 20000})
    i += 1
"""


def test_kill_9_mid_insert_tears_nothing(tmp_path):
    db = tmp_path / "runs.db"
    RunStore(db)
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", KILLED, str(db)], stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(0.3)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    runs = RunStore(db).runs()  # every stored row reads back whole
    assert runs and all(r.payload["pad"] == "x" * 20000 for r in runs)
    assert sqlite3.connect(db).execute("PRAGMA integrity_check").fetchone() == ("ok",)
