"""What the launcher and the workers share about a run's life: fault injection, heartbeats,
failure reports and worker pids, as small JSON files in the run directory (no torch here).

A worker writes ``heartbeat-<rank>.json`` (its step and phase) at every phase change it makes,
``pid-<rank>`` at start, and ``failure-<rank>.json`` when it stops on an exception. The launcher
reads them to say which rank failed and why, and to kill any worker left behind. Every rank also
appends its start, resume, failure and hang, with the attempt (torchrun restart) number, to
``events.jsonl``, from which rank 0 measures restart times. The checkpoint directory's layout
(``step-<n>`` complete, ``.tmp-step-<n>`` being written) is here too, so that the launcher can
clean up after a failed run without importing torch.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FAULT_KINDS = ("crash", "hang")


@dataclass(frozen=True, slots=True)
class Fault:
    """``--fault RANK:STEP:crash|hang``: rank RANK crashes (raises) or hangs (sleeps forever) at the
    start of step STEP (0-based, warm-up steps included)."""

    rank: int
    step: int
    kind: str

    def __str__(self) -> str:
        return f"{self.rank}:{self.step}:{self.kind}"


def parse_fault(spec: str) -> Fault:
    """Parse ``RANK:STEP:KIND``; raises ValueError with a readable message."""
    parts = spec.split(":")
    if len(parts) != 3:
        raise ValueError(f"{spec!r} is not RANK:STEP:crash|hang")
    rank_s, step_s, kind = parts
    if not (rank_s.isdigit() and step_s.isdigit()):
        raise ValueError(f"{spec!r}: RANK and STEP must be whole numbers >= 0")
    if kind not in FAULT_KINDS:
        raise ValueError(f"{spec!r}: the kind must be crash or hang, not {kind!r}")
    return Fault(int(rank_s), int(step_s), kind)


def heartbeat_path(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / f"heartbeat-{rank}.json"


def failure_path(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / f"failure-{rank}.json"


def pid_path(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / f"pid-{rank}"


def result_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / "result.json"


def classify_error(message: str) -> str:
    """timeout (a collective waited past the process-group timeout), peer-lost (a peer's
    connection closed: it crashed or was killed), or error (this rank's own failure)."""
    low = message.lower()
    if "timed out" in low or "timeout" in low:
        return "timeout"
    peer_signs = ("connection closed by peer", "connection reset", "connection refused",
                  "broken pipe", "remote worker", "socket closed", "end of file")
    if any(sign in low for sign in peer_signs):
        return "peer-lost"
    return "error"


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def diagnose(run_dir: str | Path, world_size: int, pg_timeout_s: float) -> list[str]:
    """One line per rank that explains why the run stopped, root causes first."""
    failures = {r: read_json(failure_path(run_dir, r)) for r in range(world_size)}
    beats = {r: read_json(heartbeat_path(run_dir, r)) for r in range(world_size)}
    lines: list[str] = []
    own = [r for r, f in failures.items() if f and f.get("kind") == "error"]
    timeouts = [r for r, f in failures.items() if f and f.get("kind") == "timeout"]
    peers = [r for r, f in failures.items() if f and f.get("kind") == "peer-lost"]
    silent = [r for r, f in failures.items() if not f]
    for r in own:
        f = failures[r] or {}
        lines.append(f"rank {r}: failed {_where(f)}: {f.get('error')}: {f.get('message')}")
    hung = [r for r in silent if (beats[r] or {}).get("phase") == "hang"]
    for r in hung:
        lines.append(f"rank {r}: hung at step {(beats[r] or {}).get('step')} (injected by --fault)")
    for r in timeouts:
        f = failures[r] or {}
        lines.append(f"rank {r}: timed out after {pg_timeout_s:g} s {_where(f)} waiting for a "
                     f"collective: {f.get('message')}")
    for r in peers:
        f = failures[r] or {}
        lines.append(f"rank {r}: lost a peer {_where(f)}: {f.get('message')}")
    others = [r for r in silent if r not in hung]
    if others and (own or timeouts or peers or hung):
        where = ", ".join(f"{r} ({_where(beats[r] or {})})" for r in others)
        cause = ("hung or died without a report" if not own and not hung
                 else "stopped by torchrun after the failure above")
        lines.append(f"{'rank' if len(others) == 1 else 'ranks'} {where}: {cause}")
    return lines


def _where(report: dict[str, Any]) -> str:
    """"at step 3", or "in build" before the first step."""
    step, phase = report.get("step"), report.get("phase")
    if step is None or step < 0:
        return f"in {phase}"
    return f"at step {step}" if phase in (None, "step") else f"at step {step} ({phase})"


# --- events (restarts) ------------------------------------------------------------------------


def events_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / "events.jsonl"


def append_event(run_dir: str | Path, event: dict[str, Any]) -> None:
    """One JSON line, appended with one write (O_APPEND: lines of different ranks do not mix)."""
    data = (json.dumps(event) + "\n").encode()
    fd = os.open(events_path(run_dir), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def read_events(run_dir: str | Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    try:
        lines = events_path(run_dir).read_text(encoding="utf-8").splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line cut short by a crash
    return out


# --- checkpoint directory layout ---------------------------------------------------------------

CHECKPOINT_PREFIX, CHECKPOINT_TMP_PREFIX = "step-", ".tmp-step-"


def checkpoint_name(step: int) -> str:
    return f"{CHECKPOINT_PREFIX}{step:08d}"


def latest_checkpoint(directory: str | Path) -> tuple[int, Path] | None:
    """(next step, path) of the newest complete checkpoint in ``directory``, or None."""
    directory = Path(directory)
    best: tuple[int, Path] | None = None
    if not directory.is_dir():
        return None
    for entry in directory.iterdir():
        digits = entry.name[len(CHECKPOINT_PREFIX):]
        if entry.name.startswith(CHECKPOINT_PREFIX) and digits.isdigit() and (entry / ".metadata").exists():
            step = int(digits)
            if best is None or step > best[0]:
                best = (step, entry)
    return best


def remove_partial_checkpoints(directory: str | Path) -> list[Path]:
    """Remove ``.tmp-step-*`` directories (saves a crash interrupted); returns what it removed."""
    directory = Path(directory)
    gone = []
    if directory.is_dir():
        for entry in directory.iterdir():
            if entry.name.startswith(CHECKPOINT_TMP_PREFIX):
                shutil.rmtree(entry, ignore_errors=True)
                gone.append(entry)
    return gone
