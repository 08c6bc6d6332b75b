"""How busy a local run keeps the machine's cores: the evidence behind simdist.analytic.timeshare.

    python tools/cores_busy.py scenarios/tiny-hsdp.yaml [--steps 150] [--after 7] [--window 3]

Starts ``simdist run FILE`` (as many processes as the plan has), waits ``--after`` seconds
for start-up and the first steps, then reads ``/proc/stat`` over ``--window`` seconds of steady
steps and prints the share of that time the cores were busy (user, nice, system, irq, softirq,
steal) and idle. Compare it with the training threads' own share (the measurement's forward +
backward + optimizer + other CPU time per rank, x ranks / (cores x step)): what lies between is
CPU work of other threads and of the kernel (gloo's transport, loopback TCP), what lies above
is time no rank could use. Linux only; run it on a quiet machine, nothing else running.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def cpu_times() -> dict[str, int]:
    """The machine's CPU time so far, in ticks, by kind (the ``cpu`` line of /proc/stat)."""
    values = Path("/proc/stat").read_text().splitlines()[0].split()[1:1 + len(FIELDS)]
    return dict(zip(FIELDS, map(int, values), strict=True))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario")
    ap.add_argument("--steps", type=int, default=150, help="steps of the run: enough to outlast --after + --window")
    ap.add_argument("--after", type=float, default=7.0, help="seconds to wait before reading (start-up)")
    ap.add_argument("--window", type=float, default=3.0, help="seconds of steady steps to read")
    args = ap.parse_args()
    from executor.launch import total_processes
    from simdist.spec.scenario import load_scenario

    nproc = total_processes(load_scenario(args.scenario))
    with tempfile.TemporaryDirectory() as tmp:
        run = subprocess.Popen([sys.executable, "-m", "simdist.cli", "run", args.scenario, "--nproc", str(nproc),
                                "--steps", str(args.steps),
                                "--out", str(Path(tmp) / "run.json"), "--no-store"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(args.after)
        before = cpu_times()
        time.sleep(args.window)
        after = cpu_times()
        finished = run.poll() is not None
        run.wait()
    if finished:
        print(f"{args.scenario}: the run ended before the window closed; give it more --steps", file=sys.stderr)
        return 1
    d = {k: after[k] - before[k] for k in FIELDS}
    total = sum(d.values()) or 1
    idle = (d["idle"] + d["iowait"]) / total
    print(f"{args.scenario}: cores busy {1 - idle:.2f} (user {d['user'] / total:.2f}, system {d['system'] / total:.2f}, "
          f"softirq {d['softirq'] / total:.2f}), idle {idle:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
