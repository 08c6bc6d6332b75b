"""What a GPU process holds beyond its tensors (simdist.analytic.runtime_memory) and how
``predict --json`` reports it: other_gib's parts, reserved_gib, the assumption line."""

from __future__ import annotations

import sys

import pytest
from conftest import REPO, base_scenario

from simdist.analytic.memory import stage_memory
from simdist.analytic.runtime_memory import (
    CUDA_CONTEXT_BYTES,
    NCCL_CONNECTION_BYTES,
    communicator_count,
    runtime_memory,
)
from simdist.predict import predict
from simdist.spec.profile import CalibrationProfile
from simdist.spec.scenario import load_scenario, scenario_from_dict

MB = 1e6
MiB = 2**20


def sc_of(cluster: dict | None = None, **plan):
    d = base_scenario(**plan)
    d["cluster"].update(cluster or {})
    return scenario_from_dict(d)


def test_cuda_context_is_the_lazy_loading_figure():
    """pytorch/pytorch#86509: 287,047,680 B with lazy module loading (666,632,192 eager)."""
    rt = runtime_memory(sc_of().plan, sc_of().cluster)
    assert rt.cuda_context == 287_047_680 == CUDA_CONTEXT_BYTES


def test_one_a100_communicator_matches_the_measured_688_mb():
    """NVIDIA/nccl#964: a communicator of more than two A100s (NVLink) took 688 MB per GPU."""
    sc = sc_of(tp=4)  # 8 GPUs: tp 4, dp 2 -> tp, dp and the default group
    rt = runtime_memory(sc.plan, sc.cluster)
    assert rt.communicators == 3
    assert rt.nccl / rt.communicators == pytest.approx(688 * MB, rel=0.05)


@pytest.mark.parametrize(("plan", "comms", "peers"), [
    ({}, 2, 0),  # dp 8 + default group
    ({"tp": 8}, 2, 0),  # dp 1: tp + default
    ({"tp": 2, "pp": 2, "global_batch_size": 64}, 3, 1),  # tp, dp, default; one pipeline neighbour
    ({"tp": 2, "pp": 4, "global_batch_size": 64}, 2, 2),  # dp 1; two neighbours
    ({"zero_stage": 3, "dp_shard": 4}, 3, 0),  # HSDP: shard group, replica group, default
])
def test_communicators_follow_the_process_groups(plan, comms, peers):
    sc = sc_of(**plan)
    assert communicator_count(sc.plan, sc.cluster.world_size) == (comms, peers)


def test_one_gpu_has_no_communicator_but_a_context():
    sc = sc_of(cluster={"gpus_per_node": 1}, global_batch_size=8)
    rt = runtime_memory(sc.plan, sc.cluster)
    assert rt.nccl == 0 and rt.cuda_context > 0 and rt.cublas > 0


def test_hopper_gets_the_larger_cublas_workspaces():
    """cuBLAS reference / pytorch#120925: 32 MiB workspaces on Hopper, less before."""
    a100 = runtime_memory(sc_of().plan, sc_of().cluster).cublas
    h100 = sc_of(cluster={"preset": "dgx-h100"})
    assert runtime_memory(h100.plan, h100.cluster).cublas == 64 * MiB > a100


def test_no_overheads_without_a_cluster_or_on_host_processes():
    sc = load_scenario(REPO / "scenarios" / "local-dp.yaml")
    assert runtime_memory(sc.plan, sc.cluster).total == 0
    assert runtime_memory(sc.plan, None).total == 0
    s = stage_memory(sc.model, sc.plan, 0, sc.cluster)
    assert s.runtime.total == 0 and s.allocator_peak == s.peak


def test_predict_reports_other_parts_and_reserved():
    p = predict(sc_of(zero_stage=3), engine="analytic")
    d = p.to_dict()["memory"]
    s = d["per_stage"][0]
    parts = s["other_parts_gib"]
    assert {"cuda_context", "nccl_buffers", "cublas_workspace", "gathered_weights"} <= parts.keys()
    assert sum(parts.values()) == pytest.approx(s["other_gib"], rel=1e-9)
    assert parts["nccl_buffers"] == pytest.approx(2 * 24 * 3 * NCCL_CONNECTION_BYTES / 2**30)  # dp + default
    total = s["params_gib"] + s["grads_gib"] + s["optimizer_gib"] + s["activations_gib"] + s["other_gib"]
    assert total == pytest.approx(s["peak_gib"], rel=1e-12)
    assert s["reserved_gib"] >= s["peak_gib"] and d["reserved_gib"] == max(x["reserved_gib"] for x in d["per_stage"])
    line = next(a for a in p.assumptions if a.startswith("memory overheads:"))
    assert "CUDA context" in line and "NCCL buffers" in line and "reserved_gib" in line


def test_local_predictions_hold_no_runtime_and_reserve_what_they_allocate():
    sys.path.insert(0, str(REPO / "tools"))
    import golden

    sc = load_scenario(REPO / "scenarios" / "local-zero3.yaml")
    p = predict(sc, profile=CalibrationProfile.from_dict(golden.LOCAL_PROFILE), engine="analytic")
    for s in p.per_stage:
        names = dict(s.other_parts_gib)
        assert not {"cuda_context", "nccl_buffers", "cublas_workspace"} & names.keys()
        assert s.reserved_gib == s.peak_gib
    assert "no CUDA context" in next(a for a in p.assumptions if a.startswith("memory overheads:"))


def test_fits_still_compares_the_peak_with_the_capacity():
    """Contract v1: fits = peak_gib <= capacity_gib (reserved is reported beside it)."""
    p = predict(sc_of(), engine="analytic")
    assert p.fits == (p.peak_gib <= p.capacity_gib)



def test_memory_buckets_follow_the_framework_bucket_rule():
    """DeepSpeed's reduce bucket is reduce_bucket_size = 5e8 elements of gradients (its framework
    rule, simdist.analytic.overlap.bucket_bytes), not the DDP 25 MiB default; a set size wins."""
    from simdist.analytic.transients import bucket_parts

    ds = sc_of(framework="deepspeed", zero_stage=2)
    assert ds.plan.dp > 1
    assert dict(bucket_parts(ds.plan))["reduce_bucket"] == pytest.approx(5e8 * ds.plan.grad_buffer_bytes)
    own = sc_of(framework="deepspeed", zero_stage=2, ddp_bucket_size="100 MiB")
    assert dict(bucket_parts(own.plan))["reduce_bucket"] == 100 * MiB
