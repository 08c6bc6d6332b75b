"""How busy a local run keeps the machine's cores: the evidence behind simdist.analytic.timeshare.

    python tools/cores_busy.py scenarios/tiny-hsdp.yaml [--steps 150] [--after 7] [--window 3]

Starts ``simdist run FILE`` (as many processes as the plan has), waits ``--after`` seconds
for start-up and the first steps, then reads ``/proc/stat`` over ``--window`` seconds of steady
steps and prints the share of that time the cores were busy (user, nice, system, irq, softirq,
steal: executor.hostload.busy_seconds) and idle. Compare it with the training threads' own share (the measurement's forward +
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario")
    ap.add_argument("--steps", type=int, default=150, help="steps of the run: enough to outlast --after + --window")
    ap.add_argument("--after", type=float, default=7.0, help="seconds to wait before reading (start-up)")
    ap.add_argument("--window", type=float, default=3.0, help="seconds of steady steps to read")
    args = ap.parse_args()
    from executor.hostload import busy_seconds, machine_cpus
    from executor.launch import total_processes
    from simdist.spec.scenario import load_scenario

    nproc = total_processes(load_scenario(args.scenario))
    with tempfile.TemporaryDirectory() as tmp:
        run = subprocess.Popen([sys.executable, "-m", "simdist.cli", "run", args.scenario, "--nproc", str(nproc),
                                "--steps", str(args.steps),
                                "--out", str(Path(tmp) / "run.json"), "--no-store"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(args.after)
        busy0, wall0 = busy_seconds(), time.monotonic()
        time.sleep(args.window)
        busy1, wall1 = busy_seconds(), time.monotonic()
        finished = run.poll() is not None
        run.wait()
    if finished:
        print(f"{args.scenario}: the run ended before the window closed; give it more --steps", file=sys.stderr)
        return 1
    if busy0 is None or busy1 is None:
        print("no /proc/stat here: Linux only", file=sys.stderr)
        return 1
    busy = (busy1 - busy0) / ((wall1 - wall0) * machine_cpus())
    print(f"{args.scenario}: cores busy {busy:.2f}, idle {1 - busy:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
