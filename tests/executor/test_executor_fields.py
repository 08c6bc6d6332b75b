"""No silent fields: every plan field is read by the executor or listed as simulator-only; the
knobs that change a prediction run with PyTorch's own mechanisms; what runs another way is said
before launch and kept in the measurement. Also the device choice, the machine's load, and the
multi-node launch on shared storage (no torchrun started here)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from executor.checks import as_run, field_warnings
from executor.fields import EXECUTOR_READS, SIMULATOR_ONLY, attribute, plan_field_keys
from simdist.spec.scenario import load_scenario, scenario_from_dict

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO / "scenarios"
EXECUTOR_SOURCE = "\n".join(p.read_text() for p in sorted((REPO / "executor").glob("*.py")) if p.name != "fields.py")


def test_every_plan_field_is_read_by_the_executor_or_listed_as_simulator_only():
    keys = plan_field_keys()
    assert len(keys) == len(set(keys)) > 30
    assert set(EXECUTOR_READS).isdisjoint(SIMULATOR_ONLY)
    assert sorted(set(EXECUTOR_READS) | set(SIMULATOR_ONLY)) == sorted(keys)  # no field missing, none stale
    unread = [k for k in EXECUTOR_READS if not re.search(rf"\.{attribute(k)}\b", EXECUTOR_SOURCE)]
    assert unread == []  # each field the list claims is read by the executor's code


def scenario(base: str = "tiny-ddp", nproc: int = 2, **plan):
    d = yaml.safe_load((SCENARIOS / f"{base}.yaml").read_text())
    d["plan"].update(plan)
    d["cluster"] = {"preset": "local", "num_nodes": 1, "gpus_per_node": nproc}
    return scenario_from_dict(d)


@pytest.mark.parametrize("base,nproc,plan,field", [
    ("tiny-llama-tp", 2, {"tp_comm_overlap": True}, "plan.tp_comm_overlap"),
    ("tiny-ddp", 2, {"zero_hpz_partition_size": 2, "zero_stage": 3}, "plan.zero_hpz_partition_size"),
    ("tiny-pp-1f1b", 2, {"schedule": "dualpipev"}, "plan.schedule"),
    ("tiny-pp-1f1b", 2, {"pipeline_layout": "Et*2|t*2L"}, "plan.pipeline_layout"),
    ("tiny-ddp", 2, {"zero_quantized_weights": True, "zero_stage": 3}, "plan.zero_quantized_weights"),
    ("tiny-ddp", 2, {"precision": "fp16"}, "plan.precision"),
])
def test_fields_the_executor_cannot_run_are_refused_naming_them(base, nproc, plan, field):
    from executor.checks import run_problems

    problems = run_problems(scenario(base, nproc, **plan), nproc)
    assert field in {p.field for p in problems}, problems


def test_fields_run_another_way_are_said_before_launch_and_kept():
    fsdp = scenario("tiny-fsdp3", overlap_grad_reduce=False)
    assert as_run(fsdp) == {"plan.overlap_grad_reduce": True}
    (warning,) = field_warnings(fsdp)
    assert warning.field == "plan.overlap_grad_reduce" and "runs as true in the executor" in str(warning)
    assert as_run(scenario("tiny-ddp", overlap_grad_reduce=False)) == {}  # DDP defers its buckets
    assert as_run(scenario("tiny-bf16")) == {"plan.fp32_grad_accumulation": True}
    assert as_run(scenario("tiny-ddp")) == {}
    # eager PyTorch: RMSNorm / RoPE / SwiGLU run unfused, LayerNorm and GELU are one kernel either way
    assert as_run(scenario("tiny-llama-tp")) == {"plan.fused_elementwise": False}
    assert as_run(scenario("tiny-llama-tp", fused_elementwise=False)) == {}
    (warning,) = field_warnings(scenario("tiny-llama-tp"))
    assert warning.field == "plan.fused_elementwise" and "runs as false in the executor" in str(warning)
    # autograd adds each later micro-batch's gradients: what the bundled scenarios state
    assert as_run(scenario("tiny-ddp", grad_accumulation_fusion=True)) == {"plan.grad_accumulation_fusion": False}
    assert as_run(scenario("tiny-ddp", grad_accumulation_fusion=True, global_batch_size=2)) == {}  # 1 micro-batch


def test_compare_predicts_the_plan_that_ran():
    from simdist.calibrate.compare import as_run_dict

    d = {"name": "x", "plan": {"zero_stage": 3, "overlap_grad_reduce": False}}
    assert as_run_dict(d, {"plan.overlap_grad_reduce": True})["plan"] == {"zero_stage": 3, "overlap_grad_reduce": True}
    assert as_run_dict(d, {}) is d


# --- the knobs, with PyTorch's mechanisms ----------------------------------------------------------


def test_flash_attention_chooses_the_sdpa_backend():
    torch = pytest.importorskip("torch")
    from executor.knobs import attention_kernels

    q = torch.randn(1, 2, 16, 8, requires_grad=True)
    for flash, fused in ((True, True), (False, False)):
        with attention_kernels(scenario(flash_attention=flash).plan):
            out = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        assert ("Flash" in type(out.grad_fn).__name__) is fused


def test_ddp_without_overlap_reduces_every_bucket_after_the_last(tmp_path):
    """The deferred hook holds each bucket's future until the last bucket is ready."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    from executor.knobs import DeferredAllReduce

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        class Bucket:
            def __init__(self, value: float, last: bool):
                self.buf, self.last = torch.full((3,), value), last

            def buffer(self):
                return self.buf

            def is_last(self):
                return self.last

        hook = DeferredAllReduce(dist.group.WORLD)
        first = hook(None, Bucket(2.0, False))
        assert not first.done()  # nothing reduced while backward goes on
        last = hook(None, Bucket(4.0, True))
        assert first.done() and last.done() and first.value().tolist() == [2.0] * 3
    finally:
        dist.destroy_process_group()


# --- devices ------------------------------------------------------------------------------------------


def test_the_device_follows_the_gpus_of_the_node():
    from executor.devices import choose, device_problems

    assert choose("auto", gpus=8, local_rank=3, local_ranks=8) == ("cuda", "nccl")
    assert choose("auto", gpus=4, local_rank=1, local_ranks=8) == ("cpu", "gloo")  # not one GPU per rank
    assert choose("auto", gpus=0, local_rank=0, local_ranks=2) == ("cpu", "gloo")
    assert choose("cuda", gpus=8, local_rank=0, local_ranks=8, cpu_only=True) == ("cpu", "gloo")  # servers
    assert choose("cpu", gpus=8, local_rank=0, local_ranks=8) == ("cpu", "gloo")
    (problem,) = device_problems("cuda", local_ranks=2, gpus=0)
    assert problem.field == "--device" and "this machine has 0" in problem.message
    assert device_problems("cuda", local_ranks=8, gpus=8) == [] and device_problems("auto", 64, gpus=0) == []


def test_run_refuses_cuda_without_gpus_before_launch(capsys, monkeypatch):
    from executor import devices
    from executor.launch import run_command

    monkeypatch.setattr(devices, "visible_gpus", lambda: 0)
    assert run_command(file=str(SCENARIOS / "tiny-ddp.yaml"), nproc=2, device="cuda") == 2
    assert "--device: cuda needs a GPU for each of the 2 local ranks" in capsys.readouterr().err


# --- the machine ----------------------------------------------------------------------------------------


def test_other_processes_on_the_cores_are_seen():
    from executor.hostload import HostUsage, cores, process_seconds

    assert cores() >= 1 and process_seconds(subprocess.os.getpid()) > 0
    usage = HostUsage()
    burner = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 1.5: pass"])
    time.sleep(1.0)
    usage.sample([])  # the burner is not ours
    burner.wait()
    assert usage.result()["others_cores"] > 0.5  # at least the burner's core (and whatever else runs)


def test_more_ranks_than_cores_warn_before_launch(monkeypatch):
    from executor import hostload
    from executor.launch import run_warnings

    monkeypatch.setattr(hostload, "cores", lambda: 2)
    lines = run_warnings(load_scenario(SCENARIOS / "tiny-3d.yaml"), {"device": "auto"})
    assert any(line.startswith("8 processes on 2 CPU core(s): the ranks time-share the cores") for line in lines)
    assert run_warnings(load_scenario(SCENARIOS / "tiny-ddp.yaml"), {"device": "auto"}) == []


# --- multi-node launch ------------------------------------------------------------------------------------


def test_print_launch_copies_the_scenario_to_the_shared_run_directory(tmp_path, capsys):
    from executor.launch import run_command

    shared = tmp_path / "shared"
    assert run_command(file=str(SCENARIOS / "tiny-2node.yaml"), print_launch=True, nnodes=2,
                       run_dir=str(shared), rdzv_endpoint="head:1234") == 0
    out = capsys.readouterr().out
    copy = shared / "tiny-2node.yaml"
    assert copy.read_text() == (SCENARIOS / "tiny-2node.yaml").read_text()
    assert f"the scenario was copied to {copy} in the run directory {shared}" in out
    command = next(line for line in out.splitlines() if line.startswith("TORCH_DISABLE"))
    args = shlex.split(command)
    assert args[args.index("--scenario") + 1] == str(copy) and args[args.index("--run-dir") + 1] == str(shared)
    assert args[args.index("--out") + 1] == str(shared / "measurement.json")
    run_command(file=str(SCENARIOS / "tiny-2node.yaml"), print_launch=True, nnodes=2)
    assert "are paths on this machine: each node needs them at the same path" in capsys.readouterr().out
