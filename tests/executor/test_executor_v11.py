"""The systems beyond 3D parallelism in the executor: hybrid sharding, compression, parameter
servers, LAMB/LARS, checkpoints, restarts after a crash or a hang, and the multi-node launch.

Every torchrun start costs seconds on a small CPU host, so the runs combine checks: the HSDP run
uses LAMB, checkpoints and survives a crash; the synchronous parameter-server run uses LARS on
two servers, checkpoints and survives a hang; one torchrun start trains every optimizer on eight
4-rank plan kinds (tests/executor/optim_sweep.py).
"""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from executor.launch import run_command  # noqa: E402
from executor.train import reference_losses  # noqa: E402
from simdist.analytic.data_parallel import dp_traffic  # noqa: E402
from simdist.analytic.memory import model_state_bytes  # noqa: E402
from simdist.analytic.param_server import ps_traffic  # noqa: E402
from simdist.spec.scenario import Scenario, load_scenario  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SCENARIOS = REPO / "scenarios"
LOSS_RTOL = 1e-4  # fp32 against a one-process run (the brief's bound)


def run(tmp_path: Path, name: str, nproc: int, **opts: Any) -> tuple[Scenario, dict[str, Any]]:
    out = tmp_path / f"{name}.json"
    code = run_command(file=str(SCENARIOS / f"{name}.yaml"), nproc=nproc, out=str(out), **opts)
    assert code == 0, f"simdist run {name} exited {code}"
    return load_scenario(SCENARIOS / f"{name}.yaml"), json.loads(out.read_text())


def assert_losses_match(scenario: Scenario, m: dict[str, Any], rtol: float = LOSS_RTOL) -> None:
    ref = reference_losses(scenario.model, scenario.plan, m["steps"], m["warmup_steps"], seed=m["seed"])
    assert len(m["losses"]) == m["steps"]
    for got, want in zip(m["losses"], ref, strict=True):
        assert math.isclose(got, want, rel_tol=rtol), (m["losses"], ref)


def live_processes(needle: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if needle.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


# --- optimizers on every plan kind -----------------------------------------------------------


@pytest.mark.distributed
@pytest.mark.slow
def test_every_optimizer_matches_one_process_on_every_plan_kind(tmp_path):
    """LAMB, LARS, SGD and AdamW on DDP, ZeRO-1, FSDP, HSDP, TP x DDP, TP x FSDP, PP x DDP and
    PP x TP equal the one-process run. The bound is 1e-6 (all measured <= 1.1e-7): a missed
    shard in a LAMB/LARS norm showed as 1.6e-5 after 3 steps, inside the brief's 1e-4."""
    from tests.executor.optim_sweep import PLANS, scenario

    out = tmp_path / "sweep.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
           str(HERE / "optim_sweep.py"), str(out), "lamb,lars,sgd,adamw", "3"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert len(results) == len(PLANS) * 4
    refs: dict[str, list[float]] = {}
    for key, losses in results.items():
        plan, opt = key.split("/")
        sc = scenario(PLANS[plan], opt)
        refs.setdefault(opt, reference_losses(sc.model, sc.plan, 3))  # type: ignore[attr-defined]
        for got, want in zip(losses, refs[opt], strict=True):
            assert math.isclose(got, want, rel_tol=1e-6), (key, losses, refs[opt])


# --- HSDP + LAMB + checkpoint + crash ----------------------------------------------------------


@pytest.mark.distributed
@pytest.mark.slow
def test_hsdp_with_lamb_resumes_after_a_crash(tmp_path):
    ckpt = tmp_path / "ckpt"
    start = time.monotonic()
    scenario, m = run(tmp_path, "tiny-hsdp", 4, steps=4, warmup=1, checkpoint_every=2,
                      checkpoint_dir=str(ckpt), max_restarts=1, fault="1:3:crash")
    took = time.monotonic() - start
    plan = scenario.plan
    assert (plan.dp, plan.dp_shard, m["plan"]["data_parallel"]) == (4, 2, "fsdp")
    assert_losses_match(scenario, m)  # each step once, steps 2.. recomputed after the restart
    assert m["restarts"] == 1 and m["lost_steps"] == 1
    assert 0 < m["restart_s"] < took and m["restart_s_each"] == [m["restart_s"]]
    assert m["checkpoint"]["saves"] == 2
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-00000004"]  # complete, no temporary left
    for r in m["model_state_bytes"]:  # HSDP shards inside groups of dp_shard
        want = model_state_bytes(scenario.model, plan, 0)
        assert (r["params"], r["grads"], r["optimizer"]) == (want["params"], want["grads"], want["optimizer"])
    # every micro-batch's gradient of each shard is all-reduced across the 2 replicas (+ LAMB's norm
    # all-reduces): ZeRO-3 reduces each micro-batch's gradients
    replica = plan.num_microbatches * sum(c.total_bytes for c in dp_traffic(scenario.model, plan, 0).microbatch_grad_sync
                                          if c.kind == "allreduce")
    assert plan.num_microbatches > 1
    assert replica == pytest.approx(m["comm_bytes_per_step"]["all_reduce"], rel=0.05)


# --- parameter servers -------------------------------------------------------------------------


@pytest.mark.distributed
@pytest.mark.slow
def test_synchronous_parameter_server_with_lars_resumes_after_a_hang(tmp_path):
    scenario, m = run(tmp_path, "tiny-ps", 2, steps=5, warmup=1, checkpoint_every=2, max_restarts=1,
                      fault="1:3:hang", pg_timeout=4)
    assert_losses_match(scenario, m)
    assert m["restarts"] == 1 and m["restart_s"] >= 4  # the process-group timeout detects the hang
    ps = m["ps"]
    want = ps_traffic(scenario.model, scenario.plan, scenario.cluster)
    assert (ps["workers"], ps["servers"]) == (2, 2)
    assert ps["bytes_per_server_per_step"] == pytest.approx(want.per_server_bytes, rel=0.05)
    assert ps["worker_bytes_per_step"] == pytest.approx(want.worker_bytes, rel=0.05)
    assert ps["staleness"]["max"] == 0
    for r in m["model_state_bytes"]:  # workers hold parameters and gradients, no optimizer states
        sim = model_state_bytes(scenario.model, scenario.plan, 0, scenario.cluster)
        assert (r["params"], r["grads"], r["optimizer"]) == (sim["params"], sim["grads"], 0)


@pytest.mark.distributed
@pytest.mark.slow
def test_asynchronous_parameter_server_reports_staleness(tmp_path):
    scenario, m = run(tmp_path, "tiny-ps-async", 2, steps=20, warmup=1)
    ps = m["ps"]
    assert ps["mode"] == "async-parameter-server" and ps["servers"] == 1
    assert 0 < ps["staleness"]["mean"] <= 2 and sum(ps["staleness"]["histogram"].values()) == 2 * 22
    want = ps_traffic(scenario.model, scenario.plan, scenario.cluster).per_server_bytes
    assert ps["bytes_per_server_per_step"] == pytest.approx(want, rel=0.05)
    losses = m["losses"]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.1


# --- gradient compression ----------------------------------------------------------------------


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("method", ["fp16", "bf16", "topk", "powersgd"])
def test_compressed_training_learns_and_sends_what_the_simulator_predicts(tmp_path, method):
    scenario, m = run(tmp_path, f"tiny-compress-{method}", 2, steps=20, warmup=1)
    sent = m["compression"]["dp_bytes_per_step"]
    want = dp_traffic(scenario.model, scenario.plan, 0).step_bytes(scenario.plan.num_microbatches)
    assert sent == pytest.approx(want, rel=0.05), (sent, want)
    losses = m["losses"]
    assert losses[-1] < losses[0] - 0.2
    ref = reference_losses(scenario.model, scenario.plan, 20, 1, seed=m["seed"])
    gap = max(abs(a - b) / b for a, b in zip(losses, ref, strict=True))
    assert gap < 0.05, f"{method}: compressed training left the uncompressed run by {gap:.2e}"


# --- restarts exhausted ------------------------------------------------------------------------


@pytest.mark.distributed
@pytest.mark.slow
def test_past_max_restarts_the_run_fails_cleanly(tmp_path, capsys):
    path = SCENARIOS / "tiny-ddp.yaml"
    ckpt, out = tmp_path / "ckpt", tmp_path / "m.json"
    code = run_command(file=str(path), nproc=2, steps=3, warmup=1, out=str(out),
                       checkpoint_every=1, checkpoint_dir=str(ckpt), max_restarts=1,
                       fault=["1:2:crash", "0:3:crash"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "the run failed after 1 restart(s) (--max-restarts 1)" in err
    assert "rank 0: failed at step 3: RuntimeError: injected crash (--fault 0:3:crash)" in err
    assert not out.exists() and list(tmp_path.glob("*.tmp")) == []
    assert [p.name for p in ckpt.iterdir()] == ["step-00000003"]  # complete, nothing half-written
    assert live_processes(str(path)) == []
    log = next(line.split("full log: ")[1] for line in err.splitlines() if "full log: " in line)
    shutil.rmtree(Path(log).parent, ignore_errors=True)  # the run directory kept for diagnosis


def test_a_crash_during_a_save_leaves_the_previous_checkpoint(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(HERE / "ckpt_crash.py"), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r["crashed"] and r["latest"] == 2
    assert r["entries"] == [".tmp-step-00000004", "step-00000002"] and r["removed"] == [".tmp-step-00000004"]
    assert r["resumed_step"] == 2 and r["records"] == {"1": {"loss": 1.0}}
    assert r["weights_equal"] and r["state_equal"]


# --- multi-node ----------------------------------------------------------------------------------


def print_launch(capsys: pytest.CaptureFixture[str], name: str, **opts: Any) -> tuple[int, str, str]:
    code = run_command(file=str(SCENARIOS / f"{name}.yaml"), print_launch=True, **opts)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_print_launch_writes_torchrun_commands_and_a_slurm_script(capsys):
    code, out, _ = print_launch(capsys, "tiny-2node", nnodes=2, rdzv_endpoint="head:1234", max_restarts=2)
    assert code == 0
    commands = [line for line in out.splitlines() if "torchrun " in line and not line.startswith("srun")]
    assert len(commands) == 2 and commands[0] == commands[1]
    args = shlex.split(commands[0])
    for flag, value in (("--nnodes", "2"), ("--nproc-per-node", "1"), ("--rdzv-backend", "c10d"),
                        ("--rdzv-endpoint", "head:1234"), ("--max-restarts", "2")):
        assert args[args.index(flag) + 1] == value
    assert "--rdzv-id" in args and "executor.worker" in args
    assert "#SBATCH --nodes=2" in out and 'srun --kill-on-bad-exit=1 torchrun' in out
    assert '--rdzv-endpoint "$head_node:1234"' in out
    # parameter servers run beside the workers: 2 workers + 2 servers on one node
    code, out, _ = print_launch(capsys, "tiny-ps", nnodes=1)
    assert code == 0 and "--nproc-per-node 4" in out
    code, _, err = print_launch(capsys, "tiny-2node", nnodes=3)
    assert code == 2 and "--nnodes: 3 nodes, but the scenario's cluster has 2" in err


@pytest.mark.distributed
@pytest.mark.slow
def test_two_torchrun_agents_on_loopback_act_as_two_nodes(tmp_path, capsys):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "m.json"
    code, text, _ = print_launch(capsys, "tiny-2node", nnodes=2, rdzv_endpoint=f"127.0.0.1:{port}",
                                 steps=3, warmup=1, out=str(out), run_dir=str(tmp_path / "run"))
    assert code == 0
    command = next(line for line in text.splitlines() if line.startswith("TORCH_DISABLE"))
    command = command.replace(" torchrun ", f" {shlex.quote(sys.executable)} -m torch.distributed.run ", 1)
    agents = [subprocess.Popen(["bash", "-c", command], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               cwd=tmp_path, start_new_session=True) for _ in range(2)]
    deadline = time.monotonic() + 180
    for a in agents:
        try:
            a.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for b in agents:
                os.killpg(b.pid, 9)
            raise
    assert [a.returncode for a in agents] == [0, 0], [a.stderr.read()[-2000:] for a in agents if a.stderr]
    m = json.loads(out.read_text())
    assert m["world_size"] == 2
    assert_losses_match(load_scenario(SCENARIOS / "tiny-2node.yaml"), m)


# --- one process: optimizers, layout, restart bookkeeping, refusals ---------------------------------


def test_lamb_and_lars_follow_the_papers():
    """One step of each against the formulas of You et al. 2020 (Alg. 2) and 2017 (Alg. 1)."""
    from executor.optim import Lamb, Lars

    gen = torch.Generator().manual_seed(0)
    w0 = torch.randn(5, 3, generator=gen)
    g = torch.randn(5, 3, generator=gen)
    for cls, kwargs in ((Lamb, {"lr": 0.1, "weight_decay": 0.01}), (Lars, {"lr": 2.0, "weight_decay": 5e-4})):
        p = torch.nn.Parameter(w0.clone())
        opt = cls([p], **kwargs)
        for _ in range(2):
            p.grad = g.clone()
            opt.step()
        w = w0.clone()
        if cls is Lamb:
            m = v = torch.zeros_like(w)
            for t in (1, 2):
                m = 0.9 * m + 0.1 * g
                v = 0.999 * v + 0.001 * g * g
                r = (m / (1 - 0.9**t)) / ((v / (1 - 0.999**t)).sqrt() + 1e-6) + 0.01 * w
                w = w - 0.1 * (w.norm() / r.norm()) * r
        else:
            buf = torch.zeros_like(w)
            for _ in (1, 2):
                local_lr = 0.001 * w.norm() / (g.norm() + 5e-4 * w.norm())
                buf = 0.9 * buf + 2.0 * local_lr * (g + 5e-4 * w)
                w = w - buf
        torch.testing.assert_close(p.detach(), w, rtol=1e-6, atol=1e-7)


def test_parameter_server_layout_and_slices():
    from executor.ps import Layout, pieces, slice_bounds

    one_node = Layout(workers=2, servers=2, workers_per_node=2, servers_per_node=2)
    assert [one_node.role(r) for r in range(4)] == [("worker", 0), ("worker", 1), ("server", 0), ("server", 1)]
    two_nodes = Layout(workers=4, servers=2, workers_per_node=2, servers_per_node=1)
    assert [two_nodes.role(r) for r in range(6)] == [("worker", 0), ("worker", 1), ("server", 0),
                                                     ("worker", 2), ("worker", 3), ("server", 1)]
    assert [two_nodes.server_rank(k) for k in range(2)] == [2, 5]
    assert [two_nodes.worker_rank(w) for w in range(4)] == [0, 1, 3, 4]
    assert slice_bounds(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert list(pieces([4, 4, 2], 3, 6)) == [(0, 3, 1), (1, 4, 2)]


def test_restart_time_is_failure_to_resumed():
    from executor.report import restart_history

    events = [{"event": "start", "attempt": 0, "time": 0.0, "step": -1},
              {"event": "failed", "attempt": 0, "time": 10.0, "step": 5},
              {"event": "hang", "attempt": 0, "time": 9.0, "step": 5},
              {"event": "start", "attempt": 1, "time": 12.0, "step": -1},
              {"event": "resumed", "attempt": 1, "time": 14.0, "step": 4},
              {"event": "resumed", "attempt": 1, "time": 14.5, "step": 4}]
    h = restart_history(events, 1)
    assert h["restarts"] == 1 and h["restart_s"] == pytest.approx(5.5) and h["lost_steps"] == 1
    assert restart_history([], 0)["restart_s"] == 0.0


def refusals(capsys: pytest.CaptureFixture[str], tmp_path: Path, base: str, nproc: int, plan: dict[str, Any],
             **opts: Any) -> list[str]:
    import yaml

    data = yaml.safe_load((SCENARIOS / f"{base}.yaml").read_text())
    data["plan"].update(plan)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    assert run_command(file=str(path), nproc=nproc, **opts) == 2
    return capsys.readouterr().err.splitlines()


@pytest.mark.parametrize("base,nproc,plan,opts,field", [
    ("tiny-ddp", 2, {"grad_compression": {"method": "int8"}}, {}, "plan.grad_compression.method"),
    ("tiny-ddp", 2, {"zero_stage": 3, "grad_compression": {"method": "fp16"}}, {}, "plan.grad_compression"),
    ("tiny-ps", 2, {"parameter_servers": 2, "gradient_sync": "async-parameter-server", "optimizer": "lamb"},
     {}, "plan.optimizer"),
    ("tiny-ps", 2, {"gradient_sync": "async-parameter-server"}, {"checkpoint_every": 2}, "--checkpoint-every"),
    ("tiny-zero1", 2, {}, {"checkpoint_every": 2}, "--checkpoint-every"),
    ("tiny-ddp", 2, {}, {"fault": ["1:2:crash", "5:1:hang"]}, "--fault"),
    ("tiny-ddp", 2, {}, {"checkpoint_dir": "/tmp"}, "--checkpoint-dir"),
])
def test_what_the_executor_cannot_run_is_refused(capsys, tmp_path, base, nproc, plan, opts, field):
    lines = refusals(capsys, tmp_path, base, nproc, plan, **opts)
    assert any(line.startswith(f"{field}: ") for line in lines), lines
