"""Real runs of every plan kind with torchrun on gloo (2, 4 and 8 CPU processes).

Correctness is the test: each run's per-step losses equal those of a one-process run of the same
scenario (same model, same global batch) within 1e-4 relative in fp32, and each rank's model
states equal what simdist.analytic.memory predicts. Every scenario is launched once per session
(warm-up 1 step, 2 measured steps) and its measurement shared by the tests below.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from executor.launch import run_command
from executor.train import reference_losses
from simdist.analytic.dp_groups import data_parallel_traffic
from simdist.analytic.memory import model_state_bytes
from simdist.analytic.params import stage_num_layers
from simdist.spec.plan import rank_coord
from simdist.spec.scenario import Scenario, load_scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
WARMUP, STEPS = 1, 2

# (scenario, processes): every plan kind once, then 2D and 3D combinations; the default test run
# launches only QUICK (one plain, one sharded, one pipelined 4-rank plan), the rest is `slow`
QUICK = ("tiny-ddp", "tiny-fsdp3", "tiny-2d-pp-fsdp")
RUNS = {
    "tiny-ddp": 2,  # DDP (zero_stage 0)
    "tiny-zero1": 2,  # DDP + ZeroRedundancyOptimizer
    "tiny-fsdp2": 2,  # FSDP2 reshard_after_forward=False
    "tiny-fsdp3": 2,  # FSDP2 reshard_after_forward=True + full recompute
    "tiny-llama-tp": 2,  # TP + sequence parallel + selective recompute, GQA/RoPE/SwiGLU/RMSNorm
    "tiny-pp-gpipe": 2,
    "tiny-pp-1f1b": 2,
    "tiny-pp-interleaved": 2,
    "tiny-pp-zb": 2,
    "tiny-bf16": 2,  # bf16 autocast with FSDP2
    "tiny-2d-pp-fsdp": 4,  # pp x FSDP
    "tiny-2d-tp-dp": 4,  # TP x DDP
    "tiny-2d-pp-tp": 4,  # pp x TP (+SP)
    "tiny-2d-pp-dp-zb": 4,  # zero-bubble pp x replicated DP
    "tiny-3d": 8,  # interleaved pp x TP (+SP) x FSDP
}

_measured: dict[str, dict[str, Any]] = {}
TRACED = "tiny-ddp"  # this run also records torch.profiler traces (test_a_traced_run_...)


def each(names: list[str]) -> list[Any]:
    """The scenario names as parameters, those outside QUICK marked slow."""
    return [pytest.param(n, marks=() if n in QUICK else pytest.mark.slow) for n in names]


@pytest.fixture(scope="session")
def measure(tmp_path_factory: pytest.TempPathFactory):
    def run(name: str) -> tuple[Scenario, dict[str, Any]]:
        scenario = load_scenario(SCENARIOS / f"{name}.yaml")
        if name not in _measured:
            out = tmp_path_factory.mktemp(name) / "measurement.json"
            trace = {"trace": str(out.parent.parent / f"{name}-trace")} if name == TRACED else {}
            code = run_command(file=str(SCENARIOS / f"{name}.yaml"), nproc=RUNS[name], steps=STEPS,
                               warmup=WARMUP, out=str(out), pg_timeout=60, **trace)
            assert code == 0, f"simdist run {name} exited {code}"
            _measured[name] = json.loads(out.read_text())
            _measured[name]["_out"] = str(out)
        return scenario, _measured[name]

    return run


@pytest.mark.distributed
@pytest.mark.parametrize("name", each(list(RUNS)))
def test_losses_match_one_process(measure, name):
    scenario, m = measure(name)
    ref = reference_losses(scenario.model, scenario.plan, STEPS, WARMUP, seed=m["seed"])
    assert len(m["losses"]) == STEPS
    for got, want in zip(m["losses"], ref, strict=True):  # bf16 against a one-process bf16 run
        assert math.isclose(got, want, rel_tol=1e-4), (m["losses"], ref)


@pytest.mark.distributed
@pytest.mark.parametrize("name", each(list(RUNS)))
def test_model_states_match_analytic_memory(measure, name):
    """Per rank: params, grads and Adam states equal simdist.analytic.memory.model_state_bytes.

    Two documented differences: ZeroRedundancyOptimizer partitions whole tensors, so only the sum
    over a DP group is exact (it is the ZeRO paper's total); FSDP2 has no exact ZeRO-2: with
    reshard_after_forward=False a rank keeps its 1/dp parameter shard between steps and holds the
    whole parameters from forward to the end of backward, which is the ZeRO-2 figure. With bf16
    autocast the parameters and gradients stay fp32 and Adam keeps no separate master copy:
    4 + 4 + 8 B per parameter, the same 16 B as Megatron's 2 + 2 + 12 B.
    """
    scenario, m = measure(name)
    plan = scenario.plan
    by_rank = {r["rank"]: r for r in m["model_state_bytes"]}
    assert sorted(by_rank) == list(range(plan.world_size))
    for rank, got in by_rank.items():
        want = model_state_bytes(scenario.model, plan, rank_coord(rank, plan).pp)
        if plan.precision != "fp32":
            assert got["total"] == want["params"] + want["grads"] + want["optimizer"]
            continue
        assert got["grads"] == want["grads"], rank
        if plan.zero_stage == 2:
            assert got["params"] * plan.dp == want["params"], rank
            assert got["params_gathered"] == want["params"], rank
        else:
            assert got["params"] == want["params"], rank
        if plan.zero_stage != 1:
            assert got["optimizer"] == want["optimizer"], rank
    if plan.zero_stage == 1 and plan.precision == "fp32":
        for rank in by_rank:
            group = [r for r in by_rank if rank_coord(r, plan)._replace(dp=0) == rank_coord(rank, plan)._replace(dp=0)]
            want = model_state_bytes(scenario.model, plan, rank_coord(rank, plan).pp)["optimizer"]
            assert sum(by_rank[r]["optimizer"] for r in group) == want * plan.dp


@pytest.mark.distributed
@pytest.mark.parametrize("name", each(["tiny-ddp", "tiny-3d"]))
def test_measurement_follows_the_contract(measure, name):
    scenario, m = measure(name)
    assert m["name"] == scenario.name
    assert m["scenario_hash"] == scenario.hash()
    assert m["world_size"] == RUNS[name]
    assert (m["device"], m["backend"]) == ("cpu", "gloo")
    assert m["torch_version"].startswith("2.")
    assert m["steps"] == STEPS == len(m["step_times_s"]) == len(m["losses"])
    assert m["step_time_s"] == statistics.median(m["step_times_s"]) > 0
    assert set(m["phases_s"]) >= {"forward", "backward", "optimizer", "comm"}
    assert all(v >= 0 for v in m["phases_s"].values())
    phases = sum(m["phases_s"][k] or 0.0 for k in ("forward", "backward", "optimizer", "comm", "core_wait", "other"))
    assert phases == pytest.approx(sorted(m["step_times_s"])[(STEPS - 1) // 2], rel=0.5)
    per_rank = m["memory"]["per_rank"]
    assert [r["rank"] for r in per_rank] == list(range(RUNS[name]))
    assert m["memory"]["peak_gib"] == max(r["peak_gib"] for r in per_rank)
    for r in per_rank:
        assert 0 < r["model_state_gib"] < r["peak_gib"]
        assert r["activations_gib"] > 0
    assert len(m["activation_bytes"]) == RUNS[name] and all(isinstance(b, int) for b in m["activation_bytes"])
    assert m["collectives"] and m["environment"]["cpu_count"]
    out_dir = Path(m["_out"]).parent
    assert [p.name for p in out_dir.iterdir()] == ["measurement.json"]  # no temporary files left


@pytest.mark.distributed
def test_collective_census(measure):
    """Bytes of the collectives of one step, per kind, against what each plan must send."""
    scenario, ddp = measure("tiny-ddp")
    params = model_state_bytes(scenario.model, scenario.plan)["params"]
    assert ddp["collectives"]["all_reduce"]["bytes"] == 2 * params  # one bucket per rank
    fsdp_scenario, fsdp = measure("tiny-fsdp3")
    n = fsdp_scenario.plan.num_microbatches
    assert n > 1  # ZeRO-3 reduce-scatters every micro-batch's gradients (both ranks counted)
    assert fsdp["collectives"]["reduce_scatter"]["bytes"] == 2 * n * params
    assert fsdp["collectives"]["all_gather"]["bytes"] >= 2 * 2 * params  # forward and backward


@pytest.mark.distributed
@pytest.mark.parametrize("name", each(["tiny-fsdp3", "tiny-2d-pp-fsdp", "tiny-fsdp2"]))
def test_fsdp2_gathers_and_reductions_are_the_simulated_ones(measure, name):
    """Each rank's FSDP2 all-gathers and reduce-scatters of a step, counted by the executor, are
    the bytes of the simulator's traffic for that plan as FSDP2 runs it: ZeRO-3 gathers every
    micro-batch's forward and backward, ZeRO-2 its forward (resharded after backward), and in a
    pipeline (torch.distributed.pipelining holds the reduction to the last micro-batch; the
    executor leaves reshard_after_forward off there, as torchtitan) once a step."""
    scenario, m = measure(name)
    plan = scenario.plan
    n = plan.num_microbatches
    assert n > 1
    for census in m["collectives_per_rank"]:
        stage = rank_coord(census["rank"], plan).pp
        tr = data_parallel_traffic(scenario.model, plan, stage, fsdp2=True)
        gathers = n * _bytes(tr.fwd_gathers + tr.bwd_gathers) + _bytes(tr.post_step_gathers)
        assert census["all_gather"]["bytes"] == gathers
        assert census["reduce_scatter"]["bytes"] == n * _bytes(tr.microbatch_grad_sync) + _bytes(tr.step_grad_sync)
        if plan.pp > 1:  # each module (the stage's layers and its root) once
            assert census["all_gather"]["count"] == stage_num_layers(scenario.model, plan, stage) + 1


def _bytes(calls: tuple[Any, ...]) -> float:
    return sum(c.bytes * c.calls for c in calls)


@pytest.mark.distributed
@pytest.mark.slow
def test_collective_census_of_pipelines_and_tensor_parallel(measure):
    pp_scenario, pp = measure("tiny-pp-1f1b")
    act = pp_scenario.plan.micro_batch_size * pp_scenario.model.seq_length * pp_scenario.model.hidden_size * 4
    n = pp_scenario.plan.num_microbatches
    assert pp["collectives"]["send"] == {"count": 2 * n, "bytes": 2 * n * act}  # activations + grads
    _, tp = measure("tiny-llama-tp")
    assert {"all_gather", "reduce_scatter"} <= set(tp["collectives"])  # sequence parallel


@pytest.mark.distributed
def test_a_measurement_keeps_its_timeline_core_waits_and_the_machines_load(measure):
    """Every run keeps the median step's phase spans per rank (seconds from the step's start,
    inside the step), splits what is not CPU time into the wait for a core and the wait for
    peers, counts the CPU time of the process's other threads, and says how busy the machine was."""
    scenario, m = measure("tiny-fsdp3")
    timeline = m["timeline"]
    assert timeline["step_time_s"] == m["step_times_s"][timeline["step"]]
    assert [r["rank"] for r in timeline["ranks"]] == [0, 1]
    for r in timeline["ranks"]:
        names = [name for name, _, _ in r["spans"]]
        n = scenario.plan.num_microbatches
        assert names.count("forward") == n and names.count("backward") == n and names.count("optimizer") == 1
        assert all(0 <= a <= b <= timeline["step_time_s"] * 1.01 for _, a, b in r["spans"])
        assert r["epoch"] > 1.6e9  # the step's start on the wall clock
    assert m["phases_s"]["core_wait"] is not None and m["phases_s"]["core_wait"] >= 0
    for r in m["phases_per_rank_s"]:  # gloo's threads moved the parameters' gathers: CPU beside the training thread's
        assert 0 < r["helper_threads"] < m["step_times_s"][timeline["step"]] * 2
    host = m["host"]
    assert host["cores"] >= 1 and host["ours_cores"] > 0 and host["others_cores"] >= 0
    assert m["as_run"] == {}  # fp32: every plan field ran as written
    cpus = m["environment"]["training_thread_cpus"]  # rank 0's training thread, bound to a core of its own
    assert len(cpus) == 1 or host["cores"] < 2
    transport = m["environment"]["gloo_transport_threads"]  # and gloo's transport under the idle policy
    assert transport["threads"] >= 1 and transport["idle"] == transport["threads"]
    # the host's speed: two fixed workloads' CPU time (median over the ranks), each a few ms
    env = m["environment"]
    assert 0 < env["reference_cpu_s"] < 0.1 and 0 < env["reference_ops_cpu_s"] < 0.1
    after = env["reference_after"]  # timed again after the last step and between steps: the slowest counts
    between = env["reference_between"]
    assert 0 < after["reference_ops_cpu_s"] <= env["reference_ops_cpu_s"]
    assert 0 < between["reference_ops_cpu_s"] <= env["reference_ops_cpu_s"]
    assert 0 < between["allreduce_s"] < m["step_time_s"]  # a one-float all-reduce between steps


@pytest.mark.distributed
def test_a_traced_run_gives_both_timelines(measure, tmp_path):
    """`simdist run --trace` writes one Kineto trace per rank; compare --trace sets the
    collectives it saw (gloo's all-reduce of DDP's bucket) beside the predicted timeline."""
    from simdist.calibrate.timelines import measured_spans, phase_totals, two_timelines
    from simdist.spec.measurement import Measurement

    _, m = measure(TRACED)
    assert m["traced"] and sorted(p.name for p in Path(m["trace_dir"]).iterdir()) == [
        "trace-rank0.json", "trace-rank1.json"]
    spans = measured_spans(Measurement.from_dict(m), m["trace_dir"])
    assert {s.rank for s in spans} == {0, 1}
    totals = phase_totals(spans)
    assert totals["allreduce"] > 0 and totals["forward"] > 0 and totals["backward"] > 0
    trace = two_timelines([], spans)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {"rank 0 measured", "rank 1 measured"}


@pytest.mark.distributed
def test_one_rank_computes_on_one_thread_bound_to_its_core(tmp_path):
    """A 1-rank run (torchrun leaves OMP_NUM_THREADS unset for one process a node) computes on one
    thread, as every rank of a larger run does and as the local cluster prices a rank, its
    training thread bound to a core: on 2 threads bound to one core, its OpenMP workers spun
    on it and the step took 300x its time (2026-11-30). It trains as one process does."""
    import yaml

    d = yaml.safe_load((SCENARIOS / "tiny-ddp.yaml").read_text())
    d["cluster"]["gpus_per_node"] = 1
    path, out = tmp_path / "one-rank.yaml", tmp_path / "m.json"
    path.write_text(yaml.safe_dump(d))
    assert run_command(file=str(path), nproc=1, steps=STEPS, warmup=WARMUP, out=str(out), pg_timeout=60) == 0
    m = json.loads(out.read_text())
    env = m["environment"]
    assert env["torch_num_threads"] == 1 and env["omp_num_threads"] == "1"
    assert len(env["training_thread_cpus"]) == 1 or m["host"]["cores"] < 2
    scenario = load_scenario(path)
    ref = reference_losses(scenario.model, scenario.plan, STEPS, WARMUP, seed=m["seed"])
    assert m["losses"] == pytest.approx(ref, rel=1e-4)
