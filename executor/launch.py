"""``simdist run FILE --nproc N``: check the plan, start torchrun, watch it, write the measurement.

No torch import here: a plan the executor cannot run is refused (exit 2, one line per problem
naming its field) before anything starts. Then

- torchrun (``python -m torch.distributed.run --standalone``) starts in its own session, its
  output goes to a log file in a temporary run directory, and the workers' progress lines are
  echoed to stderr;
- a rank that crashes stops the group (torchrun ends the others); a rank that hangs makes its
  peers' collectives fail after the process-group timeout (``--pg-timeout``, 30 s); a run in
  which no rank starts a new step for ``--stall-timeout`` seconds (300 s; at least 120 s
  before every rank has started its first step) is killed as a backstop;
- on any failure the launcher kills torchrun's process group and every worker pid it recorded
  (workers outlive a SIGKILLed torchrun in their own sessions), prints one line
  per rank saying what happened, and exits 1 without writing the measurement;
- on success rank 0's ``result.json`` becomes a :class:`simdist.spec.measurement.Measurement`
  (validated), written to ``--out`` atomically (temporary file in the same directory, then
  ``os.replace``), and a summary goes to stdout. Recording it in the run store is the
  ``simdist run`` command's job (simdist.cli.run), not the executor's.

Checkpoints and restarts: ``--checkpoint-every C [--checkpoint-dir D]`` saves every C steps
(executor.checkpoint); ``--max-restarts R`` lets torchrun restart the whole group up to R times after a failure, and
the restarted workers resume from the newest checkpoint; ``--fault RANK:STEP:crash|hang`` (may
be repeated: the i-th fires on attempt i) injects the failure. In the parameter-server modes the
servers run as extra processes beside the ``--nproc`` workers. After a failed run the launcher
removes unfinished checkpoint directories (complete ones stay) and names the restarts it took.
``--print-launch --nnodes M`` prints the multi-node commands instead (executor.multinode).

The public entry points are :func:`execute` (the exit code and the measurement) and
:func:`run_command` (the exit code only); :func:`add_run_arguments` declares their options on an
argparse parser. :func:`microbenchmarks` starts the calibration microbenchmarks
(:mod:`executor.bench`) through the same launcher (:mod:`executor.torchrun`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from executor.checks import run_problems
from executor.devices import device_problems
from executor.faults import (
    diagnose,
    parse_fault,
    read_events,
    read_json,
    remove_partial_checkpoints,
    result_path,
)
from executor.multinode import copy_scenario, launch_problems, launch_text, worker_args
from executor.torchrun import launch
from simdist.errors import ScenarioError
from simdist.spec.measurement import Measurement
from simdist.spec.scenario import load_scenario

DEFAULTS: dict[str, Any] = {
    "nproc": None,
    "steps": 10,
    "warmup": 2,
    "out": None,
    "fault": None,
    "pg_timeout": 30.0,
    "stall_timeout": 300.0,
    "seed": 1234,
    "device": "auto",
    "verbose": False,
    "checkpoint_every": None,
    "checkpoint_dir": None,
    "max_restarts": 0,
    "print_launch": False,
    "nnodes": 1,
    "rdzv_endpoint": None,
    "run_dir": None,
    "trace": None,
    "quiet": False,  # no summary on stdout (simdist calibrate runs many)
}


def add_run_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of ``simdist run`` (FILE, --nproc, --steps, --out, --warmup, ...)."""
    p.add_argument("file", help="scenario YAML file")
    p.add_argument("--nproc", type=int, default=None,
                   help="local processes (the plan's degrees must multiply to it; required unless --print-launch)")
    p.add_argument("--steps", type=int, default=DEFAULTS["steps"], help="measured steps (default 10)")
    p.add_argument("--warmup", type=int, default=DEFAULTS["warmup"], help="warm-up steps before them (default 2)")
    p.add_argument("--out", default=None, help="measurement JSON to write (default: none, summary only)")
    p.add_argument("--pg-timeout", type=float, default=DEFAULTS["pg_timeout"],
                   help="process-group timeout in seconds: a hung rank fails its peers after this (default 30)")
    p.add_argument("--stall-timeout", type=float, default=DEFAULTS["stall_timeout"],
                   help="kill the run when no rank shows progress for this many seconds (default 300)")
    p.add_argument("--seed", type=int, default=DEFAULTS["seed"], help="model and data seed (default 1234)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default=DEFAULTS["device"],
                   help="auto: CUDA with nccl when there are enough GPUs, else CPU with gloo")
    p.add_argument("--verbose", action="store_true", help="echo all torchrun output, not only progress")
    p.add_argument("--fault", action="append", default=None,
                   help="RANK:STEP:crash|hang: make RANK crash or hang at STEP (0-based, warm-up included); "
                        "given several times, the i-th fires on attempt i (to test restarts)")
    p.add_argument("--checkpoint-every", type=int, default=None,
                   help="save model and optimizer with torch.distributed.checkpoint every C steps")
    p.add_argument("--checkpoint-dir", default=None,
                   help="where checkpoints go (default: the run's temporary directory); a run resumes "
                        "from the newest one there")
    p.add_argument("--max-restarts", type=int, default=0,
                   help="torchrun restarts the group up to R times after a rank fails (default 0)")
    p.add_argument("--print-launch", action="store_true",
                   help="print the per-node torchrun commands (c10d rendezvous) and a SLURM script instead of running")
    p.add_argument("--nnodes", type=int, default=1, help="nodes for --print-launch (default 1)")
    p.add_argument("--rdzv-endpoint", default=None,
                   help="HOST:PORT of the c10d rendezvous for --print-launch (default: this host, port 29500)")
    p.add_argument("--run-dir", default=None,
                   help="the run directory (heartbeats, events, the measurement); with --print-launch put it on "
                        "storage every node mounts: the scenario is copied there and the commands name that copy")
    p.add_argument("--trace", default=None, metavar="DIR",
                   help="record the measured steps with torch.profiler: one Chrome trace per rank in DIR, beside "
                        "the phase spans every measurement keeps (the profiler slows the steps a little)")
    return p


def _options(args: argparse.Namespace | Mapping[str, Any] | None, kwargs: dict[str, Any]) -> dict[str, Any]:
    given = vars(args) if isinstance(args, argparse.Namespace) else dict(args or {})
    opts = {**DEFAULTS, **given, **kwargs}
    if "file" not in opts:
        raise TypeError("run_command needs the scenario file (file=...)")
    return opts


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_command(args: argparse.Namespace | Mapping[str, Any] | None = None, /, **kwargs: Any) -> int:
    """Run a scenario with torchrun and write its measurement; returns the exit code.

    ``args`` is the argparse namespace of :func:`add_run_arguments` (or a mapping); keyword
    arguments override it: ``run_command(file="s.yaml", nproc=2, steps=3, out="m.json")``.
    Exit codes: 0 done, 1 the run failed (a rank crashed, hung or timed out), 2 bad input.
    """
    return execute(args, **kwargs).code


def execute(args: argparse.Namespace | Mapping[str, Any] | None = None, /, **kwargs: Any) -> RunOutcome:
    """:func:`run_command`, returning the measurement of a successful run too."""
    o = _options(args, kwargs)
    o["faults"] = _fault_list(o.get("fault"))
    try:
        scenario = load_scenario(o["file"])
    except ScenarioError as exc:
        for problem in exc.problems:
            _err(str(problem))
        return RunOutcome(2)
    if o["print_launch"]:
        return RunOutcome(_print_launch(scenario, o))
    if o["nproc"] is None:
        _err("--nproc: required (the number of local processes), unless --print-launch")
        return RunOutcome(2)
    problems = [str(p) for p in run_problems(scenario, int(o["nproc"]))]
    problems += option_problems(scenario, o, total_processes(scenario))
    if not problems:
        problems += [str(p) for p in device_problems(str(o["device"]), int(o["nproc"]))]
    if problems:
        for line in problems:
            _err(line)
        return RunOutcome(2)
    for line in run_warnings(scenario, o):
        _err(f"warning: {line}")
    if o.get("trace"):
        o = {**o, "trace": str(Path(o["trace"]).resolve())}
    return _launch(scenario.source_path or o["file"], total_processes(scenario), o)


def run_warnings(scenario: Any, o: Mapping[str, Any]) -> list[str]:
    """What the user should know before the run starts: plan fields the executor runs another
    way than the scenario says (executor.fields), and more processes than this machine's cores."""
    from executor.checks import field_warnings
    from executor.hostload import cores

    out = [str(p) for p in field_warnings(scenario, str(o.get("device") or "auto"))]
    n, c = total_processes(scenario), cores()
    if n > c and str(o.get("device")) != "cuda":
        out.append(f"{n} processes on {c} CPU core(s): the ranks time-share the cores, so the step time "
                   f"measures that sharing too (about {n / c:.2g}x each rank's compute); a profile fitted with at "
                   f"most {c} ranks predicts it (`simdist predict FILE --profile P`), or run with fewer ranks")
    return out


def _fault_list(fault: Any) -> list[str]:
    if not fault:
        return []
    return [fault] if isinstance(fault, str) else [str(f) for f in fault]


def total_processes(scenario: Any) -> int:
    """The plan's ranks, plus the parameter servers in the parameter-server modes."""
    plan = scenario.plan
    if not plan.uses_parameter_servers:
        return plan.world_size
    return plan.world_size + (plan.parameter_servers or scenario.cluster.num_nodes)


def option_problems(scenario: Any, o: Mapping[str, Any], processes: int) -> list[str]:
    """Problems with the run options (steps, faults, checkpoints, restarts), one line each."""
    problems = []
    plan = scenario.plan
    if int(o["steps"]) < 1:
        problems.append(f"--steps: must be at least 1, got {o['steps']}")
    if int(o["warmup"]) < 0:
        problems.append(f"--warmup: must be 0 or more, got {o['warmup']}")
    if float(o["pg_timeout"]) <= 0:
        problems.append(f"--pg-timeout: must be positive, got {o['pg_timeout']}")
    for spec in o["faults"]:
        try:
            fault = parse_fault(spec)
            if fault.rank >= processes:
                problems.append(f"--fault: rank {fault.rank} does not exist with {processes} processes")
        except ValueError as exc:
            problems.append(f"--fault: {exc}")
    if int(o["max_restarts"] or 0) < 0:
        problems.append(f"--max-restarts: must be 0 or more, got {o['max_restarts']}")
    every = o.get("checkpoint_every")
    if every is not None:
        if int(every) < 1:
            problems.append(f"--checkpoint-every: must be at least 1, got {every}")
        if plan.async_parameter_servers:
            problems.append("--checkpoint-every: an asynchronous parameter server has no step at which "
                            "workers and servers agree, so it cannot be checkpointed consistently")
        if plan.zero_stage == 1 and plan.dp > 1:
            problems.append("--checkpoint-every: checkpointing ZeroRedundancyOptimizer (zero_stage 1) is "
                            "not implemented (torch.distributed.checkpoint.state_dict does not handle it); "
                            "use zero_stage 0, 2 or 3")
    elif o.get("checkpoint_dir"):
        problems.append("--checkpoint-dir: needs --checkpoint-every")
    if o.get("checkpoint_dir") and Path(o["checkpoint_dir"]).exists() and not Path(o["checkpoint_dir"]).is_dir():
        problems.append(f"--checkpoint-dir: {o['checkpoint_dir']} is not a directory")
    if o["out"] and not Path(o["out"]).resolve().parent.is_dir():
        problems.append(f"--out: the directory {Path(o['out']).resolve().parent} does not exist")
    return problems


def _print_launch(scenario: Any, o: dict[str, Any]) -> int:
    nnodes = int(o["nnodes"])
    problems = [str(p) for p in launch_problems(scenario, nnodes)]
    problems += [str(p) for p in run_problems(scenario, scenario.plan.world_size) if not str(p).startswith("--nproc")]
    problems += option_problems(scenario, o, total_processes(scenario))
    if problems:
        for line in problems:
            _err(line)
        return 2
    file = str(scenario.source_path or o["file"])
    if o.get("run_dir"):
        try:
            file = str(copy_scenario(file, o["run_dir"]))
        except OSError as exc:
            _err(f"--run-dir: cannot copy the scenario into {o['run_dir']}: {exc}")
            return 2
    print(launch_text(scenario, file, nnodes, o))
    return 0


# --- the run ---------------------------------------------------------------------------------


@dataclass
class RunOutcome:
    """What ``simdist run`` did: the exit code and, on success, the measurement."""

    code: int
    measurement: Measurement | None = None


def _launch(file: str, world: int, o: dict[str, Any]) -> RunOutcome:
    """Start torchrun with ``world`` local processes, watch it, and report (module docstring)."""
    run_dir = Path(tempfile.mkdtemp(prefix="simdist-run-"))
    if o.get("checkpoint_every") and not o.get("checkpoint_dir"):
        o = {**o, "checkpoint_dir": str(run_dir / "checkpoints")}
    done = launch(worker_args(file, str(run_dir), o), world, run_dir, max_restarts=int(o.get("max_restarts") or 0),
                  verbose=bool(o["verbose"]), heartbeats=world, stall_timeout=float(o["stall_timeout"]))
    if done.interrupted:
        _remove_partial_checkpoints(o)
        _err(f"simdist run: interrupted; torchrun and its workers were stopped (log: {done.log_path})")
        return RunOutcome(130)
    result = read_json(result_path(run_dir))
    if done.ok and result is not None:
        extra = {"host": done.host, **({"trace_dir": o["trace"]} if o.get("trace") else {})}
        measurement = Measurement.from_dict({**result, **extra})
        if o["out"]:
            measurement.save(Path(o["out"]))
        if not o.get("quiet"):
            print(summary(measurement, o["out"]))
        shutil.rmtree(run_dir, ignore_errors=True)
        return RunOutcome(0, measurement)
    _remove_partial_checkpoints(o)
    restarts = _attempts(run_dir)
    tried = (f" after {restarts} restart(s) (--max-restarts {int(o.get('max_restarts') or 0)})"
             if int(o.get("max_restarts") or 0) > 0 else "")
    _err(f"simdist run: the run failed{tried} (torchrun exit code {done.returncode}); no measurement written")
    if done.stalled:
        _err(f"no rank made progress for {float(o['stall_timeout']):g} s; the run was killed")
    for line in diagnose(run_dir, world, float(o["pg_timeout"])):
        _err(line)
    if done.leftovers:
        _err(f"killed {len(done.leftovers)} worker process(es) left behind: {done.leftovers}")
    _err(f"full log: {done.log_path}")
    return RunOutcome(1)


def _attempts(run_dir: Path) -> int:
    """Restarts torchrun made (the highest attempt number a worker logged)."""
    return max((int(e.get("attempt", 0)) for e in read_events(run_dir)), default=0)


def _remove_partial_checkpoints(o: Mapping[str, Any]) -> None:
    """A failed or interrupted run leaves no half-written checkpoint (complete ones stay)."""
    if o.get("checkpoint_dir"):
        for path in remove_partial_checkpoints(Path(o["checkpoint_dir"])):
            _err(f"removed the unfinished checkpoint {path}")


def summary(m: Measurement, out: str | None) -> str:
    """A short human-readable summary of a measurement."""
    fmt = lambda v: "-" if v is None else f"{v:.4f}"  # noqa: E731
    lines = [
        f"{m.name}: {m.world_size} ranks on {m.device} ({m.backend}, torch {m.torch_version}), "
        f"{m.steps} measured steps",
        f"  step time     {m.step_time_s:.4f} s (median)",
        "  phases        " + "  ".join(f"{k} {fmt(m.phase(k))}" for k in ("forward", "backward", "optimizer", "comm"))
        + " s" + ("" if m.phase("core_wait") is None else f"  (waiting for a CPU core {fmt(m.phase('core_wait'))} s)")
        + ("" if m.phase("helper_threads") is None else f"; gloo's threads' CPU {fmt(m.phase('helper_threads'))} s"),
        f"  losses        {', '.join(f'{x:.4f}' for x in m.losses)}",
        f"  memory peak   {m.peak_gib * 1024:.2f} MiB",
    ]
    x = m.extras
    if x.get("compression"):
        c = x["compression"]
        lines.append(f"  compression   {c['method']}: {c['dp_bytes_per_step'] / 2**20:.3f} MiB per rank and step")
    if x.get("ps"):
        p = x["ps"]
        lines.append(f"  param server  {p['mode']}, {p['workers']} workers, {p['servers']} servers: "
                     f"{p['bytes_per_server_per_step'] / 2**20:.3f} MiB per server and step, "
                     f"staleness mean {p['staleness']['mean']:.2f} max {p['staleness']['max']}")
    if x.get("restarts"):
        shown = "-" if x.get("restart_s") is None else f"{x['restart_s']:.2f} s"
        lines.append(f"  restarts      {x['restarts']} (restart time {shown}, {x.get('lost_steps', 0)} steps redone)")
    host = x.get("host") or {}
    if host.get("others_cores") is not None:
        lines.append(f"  machine       {host['cores']} cores; other processes used {host['others_cores']:.2f} of them "
                     f"during the run (load average {', '.join(f'{v:.2f}' for v in host.get('loadavg') or [])})"
                     + (f"; the host's speed: reference GEMMs {env['reference_cpu_s'] * 1e3:.2f} ms, small ops "
                        f"{env['reference_ops_cpu_s'] * 1e3:.2f} ms of CPU per rank"
                        if (env := x.get("environment") or {}).get("reference_ops_cpu_s") else ""))
    if out:
        lines.append(f"  measurement   {out}")
    return "\n".join(lines)


# --- calibration microbenchmarks ---------------------------------------------------------------


def microbenchmarks(nproc: int, quick: bool = False, timeout: float = 1800.0, device: str = "auto") -> dict[str, Any]:
    """Run :mod:`executor.bench` on ``nproc`` ranks (at least 2, for the collectives) through the
    launcher and return rank 0's raw timings; RuntimeError (with the log's path) if it fails."""
    run_dir = Path(tempfile.mkdtemp(prefix="simdist-bench-"))
    out = run_dir / "bench.json"
    worker = ["-m", "executor.bench", "--run-dir", str(run_dir), "--out", str(out), "--device", device,
              *(["--quick"] if quick else [])]
    done = launch(worker, max(2, nproc), run_dir, verbose=True, timeout=timeout)
    if not done.ok or not out.exists():
        why = "interrupted" if done.interrupted else "timed out" if done.timed_out else f"exit code {done.returncode}"
        raise RuntimeError(f"the microbenchmarks failed ({why}); log: {done.log_path}")
    data = json.loads(out.read_text(encoding="utf-8"))
    shutil.rmtree(run_dir, ignore_errors=True)
    return data


def main(argv: list[str] | None = None) -> int:
    parser = add_run_arguments(argparse.ArgumentParser(prog="python -m executor", description=__doc__))
    return run_command(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())

