"""FSDP2's copies around its collectives (simdist.analytic.fsdp2) and its gathers under recompute."""

from dataclasses import replace
from pathlib import Path

import pytest

from simdist.analytic.collectives import Network
from simdist.analytic.cost import CostModel
from simdist.analytic.data_parallel import dp_traffic, param_gathers_per_microbatch
from simdist.analytic.fsdp2 import copy_ops, layer_params_on_rank, root_params_on_rank, runs_fsdp2
from simdist.analytic.offload import offload_traffic
from simdist.analytic.params import layer_params, params_per_rank
from simdist.analytic.passes import OpTimer
from simdist.predict import predict
from simdist.spec.profile import CalibrationProfile
from simdist.spec.scenario import load_scenario

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


def llama(framework: str | None, **plan):
    sc = load_scenario(SCENARIOS / "llama3-8b-fsdp-8xh100.yaml")
    return replace(sc, plan=replace(sc.plan, framework=framework, **plan))


def gloo_profile() -> CalibrationProfile:
    return CalibrationProfile(device="cpu", backend="gloo")


def test_who_runs_fsdp2():
    assert runs_fsdp2(llama("torchtitan").plan, None)
    # FSDP1, DeepSpeed and Megatron-FSDP gather into the buffer their parameters are views of
    for framework in (None, "pytorch", "deepspeed", "megatron"):
        assert not runs_fsdp2(llama(framework).plan, None), framework
    assert runs_fsdp2(llama(None).plan, gloo_profile())  # the executor's CPU runs
    assert not runs_fsdp2(llama("torchtitan", zero_stage=1).plan, None)
    # context-parallel ranks hold the same weights: FSDP shards over dp x cp (memory.shard_group)
    assert runs_fsdp2(llama("torchtitan", dp=1, cp=8).plan, None)


def test_copies_read_and_write_the_module_once_each():
    plan = llama("torchtitan").plan
    n = layer_params_on_rank(llama("torchtitan").model, plan, moe=False)
    assert n == layer_params(llama("torchtitan").model).total  # tp 1: the whole layer
    fwd, bwd = copy_ops(plan, n, on_cpu=False)  # a GPU: only the copy-out is on the compute stream
    assert [op.name for op in fwd] == [op.name for op in bwd] == ["fsdp2 copy-out"]
    assert fwd[0].bytes == 2 * n * 2  # bf16 parameters, read and written
    fwd, bwd = copy_ops(plan, n, on_cpu=True)  # a CPU: every copy on the training thread
    assert [op.name for op in bwd] == ["fsdp2 copy-in", "fsdp2 copy-out", "fsdp2 grad copy-in"]
    assert fwd[0].bytes == pytest.approx(2 * n * 2 / plan.dp)  # the rank's shard


def test_copy_out_joins_the_compute_of_torchtitan_fsdp():
    def passes(framework):
        sc = llama(framework)
        timer = OpTimer(sc, CostModel(sc.cluster.gpu, sc.plan.precision), Network.of(sc.cluster))
        return timer.fsdp2_copies(layer_params_on_rank(sc.model, sc.plan, moe=False))

    fwd, bwd = passes("torchtitan")
    sc = llama("torchtitan")
    cost = CostModel(sc.cluster.gpu, sc.plan.precision)
    assert fwd.compute == pytest.approx(cost.time(copy_ops(sc.plan, layer_params_on_rank(
        sc.model, sc.plan, moe=False), on_cpu=False)[0][0]))
    assert 1e-4 < fwd.compute == bwd.compute < 1e-3  # 0.44 GB read and written at H100's HBM speed
    assert passes("pytorch")[0].compute == 0.0
    # the step's compute grows by two copy-outs per layer and micro-batch (and the root module's),
    # in both engines; ZeRO-2 gathers once per step after the optimizer, into the same buffers
    copy = fwd.compute + bwd.compute
    timer = OpTimer(sc, cost, Network.of(sc.cluster))
    assert sc.plan.pp == 1  # one chunk: its root module holds the embedding and the LM head,
    # gathered, and copied, once before the forward and once before the backward
    root = sum(p.compute for p in timer.fsdp2_copies(root_params_on_rank(sc.model, sc.plan, first=True, last=True)))
    for engine in ("analytic", "des"):
        without = predict(llama("torchtitan", zero_stage=2), engine=engine).breakdown_s["compute"]
        with_copies = predict(llama("torchtitan"), engine=engine).breakdown_s["compute"]
        expected = sc.plan.num_microbatches * (sc.model.num_layers * copy + root)
        assert with_copies - without == pytest.approx(expected, rel=1e-6), engine


def test_fsdp2_does_not_gather_again_for_the_recomputed_forward():
    plan = llama("torchtitan").plan
    assert plan.recompute == "full"
    assert param_gathers_per_microbatch(plan, runs_fsdp2(plan, None)) == 2
    assert param_gathers_per_microbatch(llama(None).plan, runs_fsdp2(llama(None).plan, None)) == 3
    offloaded = load_scenario(SCENARIOS / "llama2-70b-zero3-offload-2xa100.yaml")  # full recompute
    for framework, gathers in (("torchtitan", 2), (None, 3)):  # parameter offload fetches as often
        plan = replace(offloaded.plan, framework=framework)
        assert offload_traffic(offloaded.model, plan, offloaded.cluster, 0).gathers == gathers, framework
    sc = llama(None)
    once = dp_traffic(sc.model, sc.plan, 0, fsdp2=True).step_bytes(sc.plan.num_microbatches)
    twice = dp_traffic(sc.model, sc.plan, 0).step_bytes(sc.plan.num_microbatches)
    one_gather = params_per_rank(sc.model, sc.plan, 0) * sc.plan.element_bytes  # every layer's, once
    assert twice - once == pytest.approx(sc.plan.num_microbatches * one_gather)
