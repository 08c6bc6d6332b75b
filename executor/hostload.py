"""How busy this machine was while a run measured it, and what the ranks' threads run on (how
fast the host ran: executor.hostspeed).

A CPU run's step time is only as good as the cores its ranks got. Two numbers say how good:

- ``cores``: the CPUs this process may run on (``os.sched_getaffinity``, which honours taskset
  and cpusets; ``os.cpu_count`` where it is missing);
- ``others_cores``: the CPU the *rest* of the machine used meanwhile, in cores: the busy time of
  every CPU (``/proc/stat``: user + nice + system + irq + softirq + steal) minus the CPU time of
  the run's own processes (``/proc/PID/stat`` utime + stime of torchrun and its workers), over
  the run's wall time. 0 on a quiet machine; 1.0 means another process kept one core busy.

The launcher samples both while it watches torchrun (:class:`HostUsage`), and the measurement
keeps them (``host``), so that a calibration can say which run was noisy and why
(simdist.calibrate.honesty). Linux only; elsewhere the figures are None.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cores() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# the name of the thread gloo's TCP transport runs its epoll loop in (its comm in /proc)
GLOO_TRANSPORT_THREAD = "gloo_tcp_loop"


def pin_training_thread(intra_op_threads: int = 1) -> int | None:
    """Bind the calling thread, a rank's training thread, to a core of its own (the local rank's
    among the cores the process may use) when the job runs on this machine alone and its ranks
    do not outnumber those cores, as CPU launchers bind each instance to its cores (PyTorch's
    ``torch.backends.xeon.run_cpu``, Intel's launcher). Unbound, Linux places the training threads
    itself and, as they wake each other at every sync point, now and then on the same core (on 2
    cores, 2026-11-28: tiny-zero1 29-34 ms a step unbound, 12-15 ms bound). Threads made before
    (gloo's, at init_process_group and new_group) keep every core. Returns the core, or None
    when the thread is left unbound (more ranks than cores, several nodes, one core, or a rank
    that runs ``intra_op_threads`` > 1: its OpenMP workers, made at its first parallel op, would
    inherit the one core and spin on it, each waiting for the other; tiny-ddp on one rank with
    2 threads, 2026-11-30: 2.96 s a step bound, against about 10 ms with one thread)."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        world = int(os.environ.get("WORLD_SIZE", str(local_world)))
        if len(allowed) < 2 or world != local_world or local_world > len(allowed) or intra_op_threads > 1:
            return None
        core = allowed[local_rank]
        os.sched_setaffinity(0, {core})  # pid 0: the calling thread only
    except (AttributeError, OSError, ValueError, IndexError):
        return None
    return core


def idle_transport_threads() -> int:
    """Give this process's gloo transport threads the idle scheduling policy; returns how many.

    Gloo's TCP transport reads and writes in one epoll thread per device. Its event handler
    only try-locks the pair it serves and returns when the lock is held elsewhere
    (``Pair::handleEvents``, gloo/transport/tcp/pair.cc: "skip handling the events until the
    next tick"), and the level-triggered event fires again at once: the thread spins while the
    training thread holds the pair's lock to post a send or a receive. When the spinning thread
    has taken the core of the training thread that holds the lock, the spin lasts until the
    scheduler preempts it, milliseconds later. Measured per step on 2 cores (tiny-pp-1f1b,
    2026-11-28): the process's other threads' CPU time equalled the training thread's wait for
    its core (``core_wait``) step by step, 0.3-10.8 ms, and the steps spread 8-19 ms. Under
    ``SCHED_IDLE`` the transport thread runs only where no training thread is runnable, so the
    lock holder always runs first; it still gets a core as soon as a rank waits, which is when a
    transfer's data is needed. A/B on 2 cores (2026-11-28, two runs each): with the training
    threads bound, tiny-pp-1f1b median 8.1-14.1 -> 8.4-8.6 ms a step, tiny-pp-interleaved
    20.1-21.5 -> 12.5-13.4 ms, tiny-llama-tp 115-148 -> 110-115 ms; with ranks time-sharing the
    cores, tiny-cp (4 ranks) 84 -> 43 ms, tiny-moe-ep-dp 67-69 -> 47-50 ms, tiny-hsdp 105 -> 79 ms,
    tiny-2d-pp-tp 174-176 -> 112-132 ms, tiny-3d (8 ranks) 358 -> 294 ms; tiny-ddp, tiny-fsdp3,
    tiny-moe-ep, tiny-pp-gpipe, tiny-zero1 and the parameter-server plans within their spread.
    Called by every CPU process once its process groups exist (:func:`settle_cpu_threads`)."""
    count = 0
    for tid in _transport_tids():
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        except (AttributeError, OSError):
            continue
        count += 1
    return count


def _transport_tids() -> list[int]:
    """The thread ids of this process's gloo transport threads (none where /proc is missing)."""
    out = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            if Path(f"/proc/self/task/{tid}/comm").read_text().strip() == GLOO_TRANSPORT_THREAD:
                out.append(int(tid))
        except (OSError, ValueError):
            continue
    return out


def settle_cpu_threads(training: bool = True, intra_op_threads: int = 1) -> None:
    """Once a CPU process's process groups exist: its training thread on a core of its own when
    it trains (:func:`pin_training_thread`), gloo's transport threads under the idle policy
    (:func:`idle_transport_threads`)."""
    if training:
        pin_training_thread(intra_op_threads)
    idle_transport_threads()


def start_cpu_rank() -> dict[str, float]:
    """What a CPU training rank does once its process groups exist (gloo's threads keep every
    core), before its first step: settle its threads, then time the host's speed
    (executor.hostspeed.reference_cpu_s, which it returns)."""
    import torch

    from executor.hostspeed import reference_cpu_s

    settle_cpu_threads(intra_op_threads=torch.get_num_threads())
    return reference_cpu_s()


def transport_threads() -> dict[str, int]:
    """This process's gloo transport threads: how many, and how many under the idle policy
    (:func:`idle_transport_threads`); zeros where /proc is missing."""
    tids = _transport_tids()
    idle = 0
    for tid in tids:
        try:
            idle += os.sched_getscheduler(tid) == os.SCHED_IDLE
        except (AttributeError, OSError):
            continue
    return {"threads": len(tids), "idle": idle}


def training_thread_cpus() -> list[int] | None:
    """The cores the calling thread may run on (one when :func:`pin_training_thread` bound it)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def machine_cpus() -> int:
    """CPUs /proc/stat sums over (the whole machine)."""
    return os.cpu_count() or 1


def busy_seconds() -> float | None:
    """Busy CPU seconds of the whole machine since boot (all CPUs together)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    # cpu user nice system idle iowait irq softirq steal guest guest_nice
    values = [int(x) for x in fields[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = values
    return (user + nice + system + irq + softirq + steal) / _TICK


def process_seconds(pid: int) -> float | None:
    """CPU seconds (user + system, all threads) of a live process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = text.rpartition(")")[2].split()  # after "pid (comm)": state is rest[0]
    try:
        return (int(rest[11]) + int(rest[12])) / _TICK  # fields 14 and 15: utime, stime
    except (IndexError, ValueError):
        return None


class HostUsage:
    """Samples the machine's and the run's CPU use while a run goes (see the module docstring)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.busy0 = busy_seconds()
        self.ours: dict[int, float] = {}  # pid -> last CPU seconds seen (kept after it exits)
        self.t1, self.busy1 = self.t0, self.busy0

    def sample(self, pids: list[int]) -> None:
        for pid in pids:
            seconds = process_seconds(pid)
            if seconds is not None:
                self.ours[pid] = max(seconds, self.ours.get(pid, 0.0))
        self.t1, self.busy1 = time.monotonic(), busy_seconds()

    def result(self) -> dict[str, Any]:
        wall = self.t1 - self.t0
        out: dict[str, Any] = {"cores": cores(), "machine_cpus": machine_cpus(), "seconds": wall,
                               "ours_cores": None, "others_cores": None, "loadavg": _loadavg()}
        if self.busy0 is None or self.busy1 is None or wall <= 0:
            return out
        ours = sum(self.ours.values())
        out["ours_cores"] = ours / wall
        out["others_cores"] = max(0.0, (self.busy1 - self.busy0 - ours) / wall)
        return out


def _loadavg() -> list[float] | None:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except (OSError, ValueError):
        return None


def read_pids(run_dir: Path, ranks: int) -> list[int]:
    """The worker pids recorded in the run directory (``pid-<rank>``)."""
    from executor.faults import pid_path

    out = []
    for r in range(ranks):
        try:
            out.append(int(pid_path(run_dir, r).read_text()))
        except (OSError, ValueError):
            continue
    return out


# the tick rates Linux is built with (CONFIG_HZ_100 / 250 / 300 / 1000)
KERNEL_HZ = (100, 250, 300, 1000)


def local_timer_interrupts(text: str, cpu: int) -> int | None:
    """The local timer interrupts CPU ``cpu`` has taken, from /proc/interrupts' text (its
    ``LOC`` row; the header names the columns CPU0, CPU1, ...)."""
    lines = text.splitlines()
    if not lines:
        return None
    columns = lines[0].split()
    try:
        column = columns.index(f"CPU{cpu}")
    except ValueError:
        return None
    for line in lines[1:]:
        fields = line.split()
        if fields and fields[0] == "LOC:" and len(fields) > column + 1:
            try:
                return int(fields[column + 1])
            except ValueError:
                return None
    return None


def nearest_hz(rate: float) -> int | None:
    """The kernel tick rate nearest (by ratio) to ``rate`` ticks a second counted on a busy
    core (other timers add a few), or None when none is within a factor 1.5."""
    if rate <= 0:
        return None
    hz = min(KERNEL_HZ, key=lambda h: abs(math.log(rate / h)))
    return hz if abs(math.log(rate / hz)) < math.log(1.5) else None


def kernel_jiffies(text: str) -> int | None:
    """The kernel's tick count, from /proc/timer_list's text (its ``jiffies:`` line)."""
    for line in text.splitlines():
        if line.startswith("jiffies:"):
            try:
                return int(line.split()[1])
            except (IndexError, ValueError):
                return None
    return None


def scheduler_tick_s(busy_s: float = 0.25) -> float:
    """The kernel's scheduler tick (1 / HZ), counted while the calling thread computes
    ``busy_s``: the kernel's tick count (``jiffies`` in /proc/timer_list, which only root may
    read), else the local timer interrupts of the one core the thread is bound to for the while
    (a busy core ticks at HZ; other timers add a few, so the fewest over several windows counts).
    0.0 where neither can be read or the count matches no kernel's rate
    (simdist.analytic.transport_wake uses it)."""
    try:
        allowed = os.sched_getaffinity(0)
        cpu = min(allowed)
        os.sched_setaffinity(0, {cpu})
    except (AttributeError, OSError, ValueError):
        return 0.0
    try:
        jiffies = _tick_rate(kernel_jiffies, "/proc/timer_list", busy_s)
        count = functools.partial(local_timer_interrupts, cpu=cpu)
        rates = [jiffies] if jiffies else [
            r for _ in range(4) if (r := _tick_rate(count, "/proc/interrupts", busy_s / 4))]
    finally:
        os.sched_setaffinity(0, allowed)
    hz = nearest_hz(min(rates)) if rates else None
    return 1.0 / hz if hz else 0.0


def _tick_rate(count: Callable[[str], int | None], path: str, busy_s: float) -> float | None:
    """Ticks a second by ``count`` of ``path``'s text, before and after ``busy_s`` of compute."""
    try:
        before = count(Path(path).read_text())
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < busy_s:
            pass
        after = count(Path(path).read_text())
        elapsed = time.perf_counter() - t0
    except OSError:
        return None
    if before is None or after is None or after <= before:
        return None
    return (after - before) / elapsed


def last_level_cache_bytes(root: str = "/sys/devices/system/cpu") -> int:
    """The last-level cache the ranks' cores share (sysfs' cache entries of the cores this
    process may run on: the highest level's distinct instances, summed); 0 where it cannot be
    read (simdist.analytic.cache_residency)."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = list(range(os.cpu_count() or 1))
    instances: dict[tuple[int, str], int] = {}
    for cpu in allowed:
        for entry in Path(root, f"cpu{cpu}", "cache").glob("index*"):
            try:
                if (entry / "type").read_text().strip() == "Instruction":
                    continue
                level, shared = int((entry / "level").read_text()), (entry / "shared_cpu_list").read_text().strip()
                instances[(level, shared)] = _cache_size((entry / "size").read_text().strip())
            except (OSError, ValueError):
                continue
    top = max((level for level, _ in instances), default=0)
    return sum(size for (level, _), size in instances.items() if level == top)


def _cache_size(text: str) -> int:
    """sysfs' cache size ("32768K", "2M") in bytes."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    return int(text[:-1]) * units[text[-1]] if text[-1:] in units else int(text)
