"""The torchrun worker: ``python -m executor.worker --scenario FILE --run-dir DIR ...``.

Every training rank builds the full model from the seed, keeps and parallelises its part
(:mod:`executor.parallelize`, or a parameter-server worker, :mod:`executor.ps`), resumes from
the newest checkpoint if there is one (:mod:`executor.checkpoint`), runs ``warmup`` + ``steps``
timed steps and one more instrumented step (collective census, saved-activation and gathered-
parameter peaks, model-state bytes, compression wire bytes), saving a checkpoint every
``--checkpoint-every`` steps, then sends what it saw to rank 0 (``gather_object``), which writes
``result.json`` in the run directory atomically (and ``--out`` when given: a multi-node run has
no launcher to do it). Parameter servers (the extra ranks of the parameter-server modes) serve
the workers instead of training.

Rendezvous comes from the environment torchrun sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``, ``TORCHELASTIC_RESTART_COUNT``), one node
(``--standalone``) or several (c10d rendezvous, :mod:`executor.multinode`).

Restarts: torchrun restarts the whole group after a failure (``--max-restarts``); the attempt
number is ``TORCHELASTIC_RESTART_COUNT``. The i-th ``--fault`` fires on attempt i only. Every rank
appends its start, resume, failure and hang to ``events.jsonl`` in the run directory, from which
rank 0 measures the restart time (:func:`executor.report.restart_history`).

Timeouts: the process groups (the mesh's sub-groups too, :func:`executor.parallelize.build_mesh`)
get a generous timeout (:data:`SETUP_TIMEOUT_S`, or ``--pg-timeout`` if longer) for start-up,
resume and checkpoint saves, whose length depends on how busy the machine is; once every rank has
passed a barrier after them (so the first rank ready never waits on a slower one with the short
timeout), training steps hold ``--pg-timeout``, so that a hung peer is detected quickly (torchtitan
shortens its timeouts after the first step the same way). Process life (torch 2.13 on CPU/gloo,
measured): every worker ends with flush + ``destroy_process_group`` + ``os._exit`` (a plain
interpreter exit sometimes aborts after destroy_process_group on gloo, and torchrun then reports
the job failed).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from executor.checkpoint import Checkpointer, TrainState
from executor.devices import choose
from executor.faults import (
    Fault,
    append_event,
    classify_error,
    failure_path,
    heartbeat_path,
    parse_fault,
    pid_path,
    result_path,
)
from executor.hostload import settle_cpu_threads, start_cpu_rank
from executor.hostspeed import BetweenSteps, reference_cpu_s
from executor.measure import CollectiveCensus, StepProbe
from executor.report import assemble
from executor.timeline import Tracer
from executor.train import DEFAULT_SEED, train_step
from simdist.spec.files import write_json_atomic
from simdist.spec.plan import rank_coord
from simdist.spec.scenario import Scenario, load_scenario

SETUP_TIMEOUT_S = 120.0  # process-group timeout outside training steps (module docstring)


def set_timeouts(seconds: float) -> None:
    """Every process group of this rank waits at most ``seconds`` for a collective from now on."""
    from torch.distributed.distributed_c10d import _set_pg_timeout, _world

    for group in list(_world.pg_map):
        if group is not dist.GroupMember.NON_GROUP_MEMBER:
            _set_pg_timeout(timedelta(seconds=seconds), group)


class Worker:
    """One rank's run; ``phase`` and ``step`` say where it is for heartbeats and failure reports."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(self.world)))
        self.attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.run_dir = Path(args.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        faults = [parse_fault(f) for f in args.fault or []]
        self.fault: Fault | None = faults[self.attempt] if self.attempt < len(faults) else None
        self.step = -1
        self.phase = "start"
        self.reports_progress = False
        if self.attempt > 0:  # a report of the previous attempt would confuse the diagnosis
            failure_path(self.run_dir, self.rank).unlink(missing_ok=True)
        pid_path(self.run_dir, self.rank).write_text(str(os.getpid()))
        self.beat("start")
        self.event("start")

    def beat(self, phase: str, step: int | None = None) -> None:
        self.phase = phase
        if step is not None:
            self.step = step
        write_json_atomic(heartbeat_path(self.run_dir, self.rank), {"rank": self.rank, "step": self.step,
                          "phase": phase, "time": time.time(), "attempt": self.attempt})

    def event(self, name: str, **extra: Any) -> None:
        append_event(self.run_dir, {"event": name, "rank": self.rank, "attempt": self.attempt,
                                    "time": time.time(), "step": self.step, **extra})

    def log(self, msg: str) -> None:
        print(f"[rank {self.rank}] {msg}", file=sys.stderr, flush=True)

    # --- setup ----------------------------------------------------------------------------

    def device_and_backend(self, cpu_only: bool = False) -> tuple[torch.device, str]:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        kind, backend = choose(self.args.device, gpus, self.local_rank, self.local_world, cpu_only)
        if kind == "cuda":
            torch.cuda.set_device(self.local_rank)
            return torch.device("cuda", self.local_rank), backend
        return torch.device("cpu"), backend

    def run(self) -> None:
        scenario = load_scenario(self.args.scenario)
        plan = scenario.plan
        ps_mode = plan.uses_parameter_servers
        # parameter servers talk point-to-point on gloo (CPU processes, as servers usually are)
        device, backend = self.device_and_backend(cpu_only=ps_mode)
        timeout = timedelta(seconds=max(self.args.pg_timeout, SETUP_TIMEOUT_S))  # steps: set_timeouts
        self.beat("init_process_group")
        if device.type == "cuda":
            dist.init_process_group(backend, timeout=timeout, device_id=device)
        else:
            dist.init_process_group(backend, timeout=timeout)
        self.beat("build")
        if ps_mode:
            self.run_parameter_server_mode(scenario, device, backend, timeout)
        else:
            from executor.parallelize import build_mesh, build_parallel_model

            mesh = build_mesh(plan, device.type, backend, timeout)
            pm = build_parallel_model(scenario.model, plan, self.rank, mesh, device, self.args.seed)
            self.train(scenario, pm, self.rank, device, backend, group=None, servers=0)

    def run_parameter_server_mode(self, scenario: Scenario, device: torch.device, backend: str,
                                  timeout: timedelta) -> None:
        from executor import ps

        plan = scenario.plan
        nodes = max(1, self.world // self.local_world)
        layout = ps.make_layout(plan, scenario.cluster.num_nodes, nodes)
        if layout.world != self.world:
            raise RuntimeError(f"the parameter-server layout needs {layout.world} processes "
                               f"({layout.workers} workers + {layout.servers} servers), torchrun started {self.world}")
        role, index = layout.role(self.rank)
        # every rank creates every group, in the same order
        workers = dist.new_group([layout.worker_rank(w) for w in range(layout.workers)], timeout=timeout)
        server_group = (dist.new_group([layout.server_rank(k) for k in range(layout.servers)], timeout=timeout)
                        if layout.servers > 1 else None)
        if role == "worker":
            pm = ps.build_worker(scenario.model, plan, index, layout, device, self.args.seed)
            self.train(scenario, pm, index, device, backend, group=workers, servers=layout.servers)
        else:
            server = ps.build_server(scenario.model, plan, index, layout, self.args.seed, server_group)
            self.serve(scenario, server, index, device, backend)

    # --- training ---------------------------------------------------------------------------

    def total_steps(self) -> int:
        return self.args.warmup + self.args.steps + 1

    def checkpointer(self) -> Checkpointer | None:
        if not self.args.checkpoint_dir:
            return None
        return Checkpointer(self.args.checkpoint_dir, self.args.checkpoint_every or 0, self.rank)

    def resume(self, ckpt: Checkpointer | None, state: TrainState) -> tuple[int, dict[str, Any]]:
        start, records = 0, {}
        if ckpt is not None:
            self.beat("resume")
            found = ckpt.resume(state)
            if found is not None:
                start, progress = found
                records = progress.get("records", {})
                ckpt.saves, ckpt.save_s = int(progress.get("saves", 0)), float(progress.get("save_s", 0.0))
                self.log(f"resumed from {ckpt.directory} at step {start}")
        return start, records

    def train(self, scenario: Scenario, pm: Any, plan_rank: int, device: torch.device, backend: str,
              group: dist.ProcessGroup | None, servers: int) -> None:
        m, plan = scenario.model, scenario.plan
        self.reports_progress = plan_rank == plan.world_size - 1
        reference = start_cpu_rank() if device.type == "cpu" else None  # after every process group
        tracer = Tracer(self.args.trace, self.rank, cuda=device.type == "cuda")
        probe = StepProbe(pm, cuda=device.type == "cuda", tracer=tracer)
        warmup, steps, total = self.args.warmup, self.args.steps, self.total_steps()
        between = BetweenSteps(steps)
        ckpt = self.checkpointer()
        if servers:
            state = TrainState(self.rank)
        else:
            model = pm.chunks[0] if len(pm.chunks) == 1 else torch.nn.ModuleList(pm.chunks)
            state = TrainState(self.rank, model, pm.optimizer, local_shards=pm.local_shards,
                               param_names=pm.param_names)
        start, records = self.resume(ckpt, state)
        if servers:
            pm.optimizer.pull_initial()
        self.step = start
        self.event("resumed")
        self.all_ready(device)
        census = CollectiveCensus()
        wire: dict[str, int] | None = None
        for step in range(start, total):
            measured = warmup <= step < warmup + steps
            instrumented = step == total - 1
            self.beat("step", step)
            self.maybe_inject_fault(step)
            if measured:
                self.barrier(device, group)  # every rank starts a measured step together
                tracer.start()
            elif instrumented:
                tracer.stop()
            before = pm.compression.counter.snapshot() if pm.compression is not None else None
            with probe.step(instrument=instrumented):
                if instrumented:
                    with census:
                        loss = train_step(pm, m, plan, step, self.args.seed, device, probe)
                else:
                    loss = train_step(pm, m, plan, step, self.args.seed, device, probe)
            if instrumented and before is not None:
                after = pm.compression.counter.snapshot()
                wire = {k: after[k] - before.get(k, 0) for k in after}
            if measured:
                records[str(step)] = {"loss": loss, "wall": probe.times.wall, "phases": probe.phases(),
                                      "spans": probe.spans.record()}
                if reference is not None:  # the host's speed amid the steps (executor.hostspeed)
                    between.after(step - warmup, lambda: self.barrier(device, group), group)
            self.progress(step, warmup, steps, loss, probe.times.wall)
            if ckpt is not None and ckpt.due(step + 1, total):
                self.beat("checkpoint", step)
                set_timeouts(max(self.args.pg_timeout, SETUP_TIMEOUT_S))
                ckpt.save(step + 1, state, {"records": records, "saves": ckpt.saves + 1, "save_s": ckpt.save_s})
                self.all_ready(device)
        self.beat("report")
        after = reference_cpu_s() if reference is not None else None  # a slow phase begun in the run shows here
        saved = probe.saved.peak if probe.saved else 0
        gathered = probe.gathered.peak if probe.gathered else 0
        measured_steps = [str(s) for s in range(warmup, warmup + steps)]
        mine = {
            "role": "worker",
            "rank": plan_rank,
            "global_rank": self.rank,
            "coord": list(rank_coord(plan_rank, plan)),
            "losses": [records[s]["loss"] for s in measured_steps] if pm.holds_loss else None,
            "step_walls": [records[s]["wall"] for s in measured_steps],
            "phases": [records[s]["phases"] for s in measured_steps],
            "spans": [records[s].get("spans") or {"epoch": None, "spans": []} for s in measured_steps],
            "model_state": {**(probe.model_state or {}), "params_gathered": gathered},
            "activation_bytes": saved,
            "collectives": census.result(),
            "reference_cpu_s": reference, "reference_after_cpu_s": after, "reference_between": between.result(),
            "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "cuda_peak_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
            "data_parallel": pm.data_parallel,
            "dp_wire_bytes": wire,
            "checkpoint": {"saves": ckpt.saves, "save_s": ckpt.save_s} if ckpt is not None else None,
        }
        if servers:
            client = pm.optimizer
            mine["ps_worker"] = {"bytes_sent": client.traffic.sent, "bytes_received": client.traffic.received,
                                 "steps": client.step_index}
        self.finish(scenario, mine, device, backend)

    def serve(self, scenario: Scenario, server: Any, index: int, device: torch.device, backend: str) -> None:
        total = self.total_steps()
        ckpt = self.checkpointer()
        settle_cpu_threads(training=False)  # a server: a CPU process on gloo
        state = TrainState(self.rank, server.shard, server.optimizer, key=f"server{index}")
        start, _ = self.resume(ckpt, state)
        server.send_initial()
        self.step = start
        self.event("resumed")
        self.all_ready(device)
        if server.asynchronous:
            self.beat("serve", start)
            self.maybe_inject_fault(start)
            server.serve_async(server.layout.workers * (total - start))
        else:
            for step in range(start, total):
                self.beat("serve", step)
                self.maybe_inject_fault(step)
                server.serve_step()
                if ckpt is not None and ckpt.due(step + 1, total):
                    self.beat("checkpoint", step)
                    set_timeouts(max(self.args.pg_timeout, SETUP_TIMEOUT_S))
                    ckpt.save(step + 1, state, {})
                    self.all_ready(device)
        self.beat("report")
        self.finish(scenario, {"role": "server", "global_rank": self.rank, **server.report()}, device, backend)

    def finish(self, scenario: Scenario, mine: dict[str, Any], device: torch.device, backend: str) -> None:
        set_timeouts(max(self.args.pg_timeout, SETUP_TIMEOUT_S))  # rank 0 assembles the report
        everyone: list[Any] = [None] * self.world if self.rank == 0 else []
        dist.gather_object(mine, everyone if self.rank == 0 else None, dst=0)
        if self.rank == 0:
            ranks = [r for r in everyone if r["role"] == "worker"]
            servers = [r for r in everyone if r["role"] == "server"]
            measurement = assemble(scenario, ranks, servers, device, backend, self.args, self.attempt, self.run_dir)
            measurement.save(result_path(self.run_dir))
            if self.args.out:
                measurement.save(Path(self.args.out))
        self.beat("done")

    def all_ready(self, device: torch.device) -> None:
        """Every rank has resumed (or saved) before any shortens its timeouts to --pg-timeout: a
        peer slowed by a busy machine is waited for with the setup timeout, never taken for a hang."""
        self.barrier(device, None)
        set_timeouts(self.args.pg_timeout)

    def barrier(self, device: torch.device, group: dist.ProcessGroup | None) -> None:
        if device.type == "cuda":
            dist.barrier(group=group, device_ids=[device.index])
        else:
            dist.barrier(group=group)

    def maybe_inject_fault(self, step: int) -> None:
        f = self.fault
        if f is None or f.rank != self.rank or f.step != step:
            return
        if f.kind == "crash":
            raise RuntimeError(f"injected crash (--fault {f})")
        self.beat("hang")
        self.event("hang")
        self.log(f"hanging at step {step} (--fault {f})")
        while True:
            time.sleep(3600)

    def progress(self, step: int, warmup: int, steps: int, loss: float | None, wall: float) -> None:
        if not self.reports_progress:  # the last training rank always holds a loss (last stage)
            return
        label = (f"warm-up {step + 1}/{warmup}" if step < warmup
                 else f"step {step - warmup + 1}/{steps}" if step < warmup + steps else "instrumented step")
        shown = "-" if loss is None else f"{loss:.4f}"
        self.log(f"{label}  loss {shown}  {wall:.3f} s")

    def report_failure(self, exc: BaseException) -> None:
        message = f"{exc}".strip().splitlines()[0][:500] if str(exc).strip() else ""
        kind = classify_error(str(exc))
        write_json_atomic(failure_path(self.run_dir, self.rank), {
            "rank": self.rank, "step": self.step, "phase": self.phase, "attempt": self.attempt,
            "error": type(exc).__name__, "message": message, "kind": kind, "time": time.time(),
        })
        self.event("failed", kind=kind)


# --- entry ----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m executor.worker", description=__doc__)
    p.add_argument("--scenario", required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=DEFAULT_SEED)
    p.add_argument("--pg-timeout", type=float, default=30.0)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--fault", action="append", default=[], help="RANK:STEP:crash|hang; the i-th fires on attempt i")
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument("--out", default=None, help="rank 0 also writes the measurement here")
    p.add_argument("--trace", default=None, help="write each rank's torch.profiler trace of the measured steps here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    worker = Worker(args)
    code = 0
    try:
        worker.run()
    except BaseException as exc:  # report, then leave: torchrun stops the other ranks
        code = 1
        worker.report_failure(exc)
        traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    if dist.is_initialized() and code == 0:
        dist.destroy_process_group()
    os._exit(code)


if __name__ == "__main__":
    main()
