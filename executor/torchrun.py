"""The one launcher: start torchrun on this machine, watch it, and stop everything it started.

``launch(worker, nproc, run_dir)`` runs ``python -m torch.distributed.run --standalone
--nproc-per-node N <worker args>`` in its own session, copies its output to
``run_dir/torchrun.log`` (echoing the workers' ``[rank N]`` progress lines to stderr, or every
line with ``verbose``), and returns when it ends. Both the training run (``simdist run``,
worker ``executor.worker``) and the calibration microbenchmarks (``simdist calibrate``, worker
``executor.bench``) start through it.

Watching: when ``heartbeats`` ranks write heartbeat files (:mod:`executor.faults`), a run in
which no rank starts a new step for ``stall_timeout`` seconds (at least STARTUP_GRACE_S before
every rank has started its first step) is killed; ``timeout`` bounds the whole run. On a stall, a timeout
or Ctrl-C the launcher SIGTERMs torchrun's process group, then SIGKILLs it and every worker pid
recorded in the run directory (workers outlive a SIGKILLed torchrun in their own sessions).
While it watches, it samples how much CPU the rest of the machine used (:mod:`executor.hostload`),
which the measurement keeps. No torch import here.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from executor.faults import heartbeat_path, pid_path, read_json
from executor.hostload import HostUsage, read_pids

REPO_ROOT = Path(__file__).resolve().parent.parent
STARTUP_GRACE_S = 120.0  # before every rank has started its first step (imports, rendezvous, build)
# heartbeat phases (executor.worker) before the first step of an attempt
SETUP_PHASES = frozenset({"start", "init_process_group", "build", "resume"})


@dataclass
class Launched:
    """How a torchrun launch ended."""

    returncode: int | None
    log_path: Path
    stalled: bool = False  # killed: no heartbeat progress for the stall timeout
    timed_out: bool = False  # killed: the whole run took longer than the timeout
    interrupted: bool = False  # killed: Ctrl-C
    leftovers: list[int] = field(default_factory=list)  # worker pids killed after torchrun ended
    host: dict[str, Any] = field(default_factory=dict)  # executor.hostload.HostUsage.result()

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not (self.stalled or self.timed_out or self.interrupted)


def torchrun_command(worker: list[str], nproc: int, max_restarts: int = 0) -> list[str]:
    """``python -m torch.distributed.run --standalone`` with ``nproc`` local workers."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            f"--max-restarts={max_restarts}", "--monitor-interval=0.2", *worker]


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    # torchrun otherwise shares its rendezvous store with the workers, which breaks restarts
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("PYTHONUNBUFFERED", "1")
    # one intra-op thread a rank, what the local cluster prices (a rank is a core): torchrun sets
    # it only for more than one process a node, so a 1-rank run would otherwise use every core
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def launch(worker: list[str], nproc: int, run_dir: Path, *, max_restarts: int = 0, verbose: bool = False,
           heartbeats: int = 0, stall_timeout: float = 300.0, timeout: float | None = None) -> Launched:
    """Run ``worker`` (``["-m", module, *args]``) on ``nproc`` local ranks; see the module docstring."""
    log_path = run_dir / "torchrun.log"
    started = time.time()
    proc = subprocess.Popen(torchrun_command(worker, nproc, max_restarts), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=worker_env(),
                            start_new_session=True)
    pump = _Pump(proc.stdout, log_path, verbose)
    pump.start()
    out = Launched(returncode=None, log_path=log_path)
    ranks = max(heartbeats, nproc)
    usage = HostUsage()
    try:
        while proc.poll() is None:
            time.sleep(0.2)
            usage.sample([proc.pid, *read_pids(run_dir, ranks)])
            if heartbeats:
                idle, floor = _stalled_for(run_dir, heartbeats, started)
                if idle > max(floor, stall_timeout):
                    out.stalled = True
                    _kill_everything(proc, run_dir, ranks)
            if timeout is not None and time.time() - started > timeout:
                out.timed_out = True
                _kill_everything(proc, run_dir, ranks)
    except KeyboardInterrupt:
        out.interrupted = True
        _kill_everything(proc, run_dir, ranks)
    pump.join(timeout=5)
    out.returncode = proc.returncode
    out.host = usage.result()
    out.leftovers = _reap_workers(run_dir, ranks)
    return out


class _Pump(threading.Thread):
    """Copies torchrun's output to the log file; echoes progress lines (or all, verbose)."""

    def __init__(self, stream: Any, log_path: Path, verbose: bool):
        super().__init__(daemon=True)
        self.stream, self.log_path, self.verbose = stream, log_path, verbose

    def run(self) -> None:
        with open(self.log_path, "w", encoding="utf-8", errors="replace") as log:
            for raw in iter(self.stream.readline, b""):
                line = raw.decode("utf-8", errors="replace")
                log.write(line)
                log.flush()
                if self.verbose or line.startswith("[rank "):
                    sys.stderr.write(line)
                    sys.stderr.flush()


def _stalled_for(run_dir: Path, world: int, started: float) -> tuple[float, float]:
    """(seconds since the last heartbeat of any rank, the stall limit that applies now): until
    every rank has written a heartbeat, the clock runs from the launch; until every rank has
    left the set-up phases (:data:`SETUP_PHASES`: imports, rendezvous, building and wrapping the
    model, loading a checkpoint), the limit is at least STARTUP_GRACE_S. So a slow start on a
    loaded host is not taken for a stall: a set-up phase writes one heartbeat and may take
    several seconds there (measured: a 2-rank DDP run on a loaded 2-core machine was killed by a
    3 s ``--stall-timeout`` before its first step), where a step beats at every step."""
    times, setup = [], False
    for r in range(world):
        beat = read_json(heartbeat_path(run_dir, r))
        if beat:
            times.append(float(beat.get("time", started)))
            setup = setup or beat.get("phase") in SETUP_PHASES
    if len(times) < world:
        return time.time() - started, STARTUP_GRACE_S
    return time.time() - max(times), STARTUP_GRACE_S if setup else 0.0


def _is_our_worker(pid: int, run_dir: Path) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return "executor." in cmdline and str(run_dir) in cmdline


def _kill_everything(proc: subprocess.Popen[bytes], run_dir: Path, world: int) -> None:
    """SIGTERM torchrun's process group, then SIGKILL it and any recorded worker left behind."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    _reap_workers(run_dir, world)


def _reap_workers(run_dir: Path, world: int) -> list[int]:
    """SIGKILL recorded workers still alive (checked by their command line); returns their pids."""
    killed = []
    for r in range(world):
        try:
            pid = int(pid_path(run_dir, r).read_text())
        except (OSError, ValueError):
            continue
        if _is_our_worker(pid, run_dir):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed
