"""``simdist run FILE --print-launch --nnodes M``: torchrun commands for M nodes, and a SLURM script.

Each node runs one torchrun agent with the c10d rendezvous (PyTorch's elastic launch,
https://pytorch.org/docs/stable/elastic/run.html): ``--nnodes M --nproc-per-node N
--rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id ID``. The agents meet at HOST:PORT (the
first node; the c10d store is hosted by the agent that reaches it first there), agree on the ranks
(with c10d, arrival order decides the node ranks) and start N workers each; the
workers read RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT from the
environment torchrun sets (:mod:`executor.worker`). N is the plan's ranks per node, plus, in the
parameter-server modes, the servers placed on each node (``parameter_servers / M``).

Every node's command is the same; only the comment differs. Rank 0 writes the measurement to
``--out`` (on its own node) and the run directory holds heartbeats, pids and the events of each
node's ranks. Other nodes do not see this machine's files: with ``--run-dir DIR`` on storage
every node mounts, the scenario is copied into DIR and the commands name that copy (and the
measurement goes to DIR too); without it the commands say that the scenario path and the
default run directory (this machine's temp folder) must exist on every node. Checkpoints
(``--checkpoint-dir``) must be on a file system every node sees. No torch import here.
"""

from __future__ import annotations

import shlex
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from simdist.errors import Problem
from simdist.spec.scenario import Scenario

DEFAULT_PORT = 29500
REPO_ROOT = Path(__file__).resolve().parent.parent


def default_endpoint() -> str:
    return f"{socket.gethostname()}:{DEFAULT_PORT}"


def processes_per_node(scenario: Scenario, nnodes: int) -> int:
    """Workers per node, plus the servers per node in the parameter-server modes."""
    plan = scenario.plan
    per_node = plan.world_size // nnodes
    if plan.uses_parameter_servers:
        per_node += (plan.parameter_servers or scenario.cluster.num_nodes) // nnodes
    return per_node


def launch_problems(scenario: Scenario, nnodes: int) -> list[Problem]:
    out: list[Problem] = []
    if nnodes < 1:
        return [Problem("--nnodes", f"must be a positive whole number, got {nnodes}")]
    if scenario.cluster.num_nodes != nnodes:
        out.append(Problem("--nnodes", f"{nnodes} nodes, but the scenario's cluster has "
                           f"{scenario.cluster.num_nodes} (cluster.num_nodes)"))
    if scenario.plan.world_size % nnodes:
        out.append(Problem("--nnodes", f"{nnodes} does not divide the plan's {scenario.plan.world_size} ranks"))
    return out


def copy_scenario(file: str, run_dir: str) -> Path:
    """Copy the scenario into the shared run directory (created if needed); returns the copy."""
    import shutil

    target = Path(run_dir).resolve()
    target.mkdir(parents=True, exist_ok=True)
    copy = target / Path(file).name
    if Path(file).resolve() != copy:
        shutil.copyfile(file, copy)
    return copy


def rdzv_id(scenario: Scenario) -> str:
    return f"simdist-{scenario.hash()[:12]}"


def worker_args(file: str, run_dir: str, o: Mapping[str, Any]) -> list[str]:
    """``-m executor.worker`` and its options, as the local launcher passes them."""
    args = ["-m", "executor.worker", "--scenario", str(Path(file).resolve()), "--run-dir", run_dir,
            "--steps", str(o["steps"]), "--warmup", str(o["warmup"]), "--seed", str(o["seed"]),
            "--pg-timeout", str(o["pg_timeout"]), "--device", str(o["device"])]
    for f in o.get("faults") or []:
        args += ["--fault", f]
    if o.get("checkpoint_dir"):
        args += ["--checkpoint-dir", str(Path(o["checkpoint_dir"]).resolve()),
                 "--checkpoint-every", str(o.get("checkpoint_every") or 0)]
    if o.get("trace"):
        args += ["--trace", str(o["trace"])]
    return args


def torchrun_args(nnodes: int, nproc: int, endpoint: str, run_id: str, max_restarts: int) -> list[str]:
    return ["--nnodes", str(nnodes), "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", endpoint, "--rdzv-id", run_id, "--max-restarts", str(max_restarts),
            "--monitor-interval", "0.5"]


ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"  # restarts need it (see executor.torchrun.worker_env)


def launch_text(scenario: Scenario, file: str, nnodes: int, o: Mapping[str, Any]) -> str:
    """The per-node commands and the SLURM batch script (see the module docstring)."""
    nproc = processes_per_node(scenario, nnodes)
    run_id = rdzv_id(scenario)
    endpoint = o.get("rdzv_endpoint") or default_endpoint()
    shared = bool(o.get("run_dir"))
    run_dir = str(Path(o["run_dir"]).resolve()) if shared else f"/tmp/{run_id}"
    out = o.get("out") or f"{run_dir}/measurement.json"
    work = [*worker_args(file, run_dir, o), "--out", str(out)]
    restarts = int(o.get("max_restarts") or 0)
    env = f"{ENV} PYTHONPATH={shlex.quote(str(REPO_ROOT))}"
    command = shlex.join(["torchrun", *torchrun_args(nnodes, nproc, endpoint, run_id, restarts), *work])
    lines = [f"# {scenario.name}: {scenario.plan.world_size} ranks on {nnodes} node(s), {nproc} process(es) per node"]
    if shared:
        lines.append(f"# the scenario was copied to {file} in the run directory {run_dir}: it must be on storage "
                     "every node mounts (heartbeats, events and the measurement go there too)")
    else:
        lines.append(f"# the scenario {Path(file).resolve()} and the run directory {run_dir} are paths on this "
                     "machine: each node needs them at the same path (give --run-dir DIR on shared storage and "
                     "the scenario is copied there)")
    lines.append(f"# run on every node (c10d rendezvous at {endpoint}; rank 0 writes {out}):")
    for node in range(nnodes):
        lines += [f"# node {node}", f"{env} {command}"]
    port = endpoint.rpartition(":")[2]
    slurm_cmd = shlex.join(["torchrun", *torchrun_args(nnodes, nproc, "HEAD:PORT", "JOBID", restarts), *work])
    slurm_cmd = slurm_cmd.replace("HEAD:PORT", f'"$head_node:{port or DEFAULT_PORT}"').replace("JOBID", '"simdist-$SLURM_JOB_ID"')
    gpus = "" if scenario.cluster.gpu.name == "cpu" else f"#SBATCH --gpus-per-node={scenario.cluster.gpus_per_node}\n"
    lines += ["", "# --- SLURM batch script (sbatch FILE) ---", f"""#!/bin/bash
#SBATCH --job-name={run_id}
#SBATCH --nodes={nnodes}
#SBATCH --ntasks-per-node=1
{gpus}#SBATCH --output={run_id}-%j.log
set -euo pipefail
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
export PYTHONPATH={shlex.quote(str(REPO_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}
srun --kill-on-bad-exit=1 {slurm_cmd}"""]
    return "\n".join(lines)
