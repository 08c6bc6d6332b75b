"""The executor's pieces on one process: model, batches, reference run, counters, plan checks."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from executor.data import first_sample, replica_batch, sample_tokens, token_batch  # noqa: E402
from executor.hostspeed import reference_cpu_s  # noqa: E402
from executor.measure import SavedActivations, collective_kind  # noqa: E402
from executor.model import Transformer, build_model, lm_loss, stage_module  # noqa: E402
from executor.parallelize import chunk_layers  # noqa: E402
from executor.train import reference_losses  # noqa: E402
from simdist.analytic.params import stage_params, total_params  # noqa: E402
from simdist.spec.scenario import scenario_from_dict  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def tiny(preset: str = "tiny", n: int = 1, model: dict | None = None, **plan) -> object:
    return scenario_from_dict({
        "name": "t", "model": {"preset": preset, **(model or {})},
        "cluster": {"preset": "local", "num_nodes": 1, "gpus_per_node": n},
        "plan": {"global_batch_size": 4, "precision": "fp32", **plan},
    })


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("preset,extra", [
    ("tiny", {}),
    ("tiny-llama", {}),
    ("tiny", {"tie_embeddings": True}),
    ("tiny", {"bias": False, "norm": "rmsnorm", "position_embedding": "rope"}),
    ("tiny-llama", {"mlp": "gelu", "num_kv_heads": 1}),
])
def test_parameter_count_matches_the_analytic_model(preset, extra):
    sc = tiny(preset, model=extra)
    assert n_params(build_model(sc.model, seed=0)) == total_params(sc.model)


def test_pipeline_chunks_follow_stage_layer_ranges_and_count_like_simdist():
    sc = tiny(n=2, pp=2, virtual_pipeline_stages=2)
    full = build_model(sc.model, seed=0)
    assert [k for k, _ in chunk_layers(sc.model, sc.plan, 0)] == [0, 2]
    assert [ids for _, ids in chunk_layers(sc.model, sc.plan, 0)] == [[0], [2]]
    assert [ids for _, ids in chunk_layers(sc.model, sc.plan, 1)] == [[1], [3]]
    for stage in range(2):
        chunks = [stage_module(full, ids, first=k == 0, last=k == 3)
                  for k, ids in chunk_layers(sc.model, sc.plan, stage)]
        assert sum(n_params(c) for c in chunks) == stage_params(sc.model, sc.plan, stage).total


def test_chunks_chained_equal_the_full_model():
    sc = tiny(n=2, pp=2)
    full = build_model(sc.model, seed=3)
    x, _ = token_batch(3, 0, 2, sc.model.seq_length, sc.model.vocab_size)
    first = stage_module(full, [0, 1], first=True, last=False)
    last = stage_module(full, [2, 3], first=False, last=True)
    torch.testing.assert_close(last(first(x)), full(x), rtol=0, atol=0)
    assert next(iter(dict(last.named_parameters()))).startswith("layers.2.")


def test_initialisation_depends_only_on_the_seed():
    sc = tiny("tiny-llama")
    a, b = build_model(sc.model, seed=7), build_model(sc.model, seed=7)
    c = build_model(sc.model, seed=8)
    for (na, pa), (_, pb), (_, pc) in zip(a.named_parameters(), b.named_parameters(), c.named_parameters(), strict=True):
        assert torch.equal(pa, pb), na
        if "norm" not in na and not na.endswith("bias"):
            assert not torch.equal(pa, pc), na


def test_samples_are_a_function_of_the_global_index_only():
    assert torch.equal(sample_tokens(1, 5, 32, 256), sample_tokens(1, 5, 32, 256))
    assert not torch.equal(sample_tokens(1, 5, 32, 256), sample_tokens(1, 6, 32, 256))
    assert not torch.equal(sample_tokens(1, 5, 32, 256), sample_tokens(2, 5, 32, 256))
    whole_x, whole_y = replica_batch(1, step=3, global_batch_size=8, dp=1, dp_rank=0, seq_length=32, vocab_size=256)
    parts = [replica_batch(1, 3, 8, 4, d, 32, 256) for d in range(4)]
    assert torch.equal(torch.cat([x for x, _ in parts]), whole_x)
    assert torch.equal(torch.cat([y for _, y in parts]), whole_y)
    assert torch.equal(whole_x[:, 1:], whole_y[:, :-1])  # targets are the next tokens
    assert first_sample(3, 8, 4, 2) == 28


def test_loss_starts_near_uniform_and_training_lowers_it():
    sc = tiny("tiny", global_batch_size=8, micro_batch_size=8)
    losses = reference_losses(sc.model, replace(sc.plan, global_batch_size=8), steps=20)
    assert abs(losses[0] - torch.log(torch.tensor(256.0)).item()) < 0.1
    assert losses[-1] < losses[0] - 0.3


@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_recompute_changes_no_gradient(recompute):
    sc = tiny("tiny-llama")
    x, y = token_batch(0, 0, 2, sc.model.seq_length, sc.model.vocab_size)
    grads = []
    for mode in ("none", recompute):
        model = build_model(sc.model, seed=0, recompute=mode)
        lm_loss(model(x), y).backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_micro_batch_split_does_not_change_the_losses():
    sc = tiny(global_batch_size=4)
    one = reference_losses(sc.model, replace(sc.plan, micro_batch_size=4), steps=3)
    four = reference_losses(sc.model, replace(sc.plan, micro_batch_size=1), steps=3)
    assert one == pytest.approx(four, rel=1e-5)


def test_saved_activations_skip_parameters_and_follow_backward():
    lin = torch.nn.Linear(64, 64, bias=False)
    counter = SavedActivations()
    x = torch.randn(8, 64, requires_grad=True)
    with counter.counting():
        h = torch.relu(lin(x))  # saves x (8*64*4 B) for the weight grad, and relu's output
        loss = (h * h).sum()  # saves h twice (one storage)
    assert counter.current == 2 * 8 * 64 * 4
    loss.backward()
    del loss, h
    assert counter.current == 0
    assert counter.peak == 2 * 8 * 64 * 4


def test_full_recompute_keeps_only_layer_inputs():
    sc = tiny()
    x, y = token_batch(0, 0, 1, sc.model.seq_length, sc.model.vocab_size)
    peaks = {}
    for mode in ("none", "full"):
        model = build_model(sc.model, seed=0, recompute=mode)
        counter = SavedActivations()
        with counter.counting():
            loss = lm_loss(model(x), y)
        loss.backward()
        peaks[mode] = counter.peak
    layer_input = sc.model.seq_length * sc.model.hidden_size * 4
    assert peaks["full"] < peaks["none"] / 3
    assert peaks["full"] >= sc.model.num_layers * layer_input


@pytest.mark.parametrize("op,kind", [
    ("c10d.allreduce_.default", "all_reduce"),
    ("c10d._allgather_base_.default", "all_gather"),
    ("c10d._reduce_scatter_base_.default", "reduce_scatter"),
    ("_c10d_functional.all_gather_into_tensor.default", "all_gather"),
    ("_c10d_functional.reduce_scatter_tensor.default", "reduce_scatter"),
    ("_c10d_functional.all_reduce.default", "all_reduce"),
    ("c10d.broadcast_.default", "broadcast"),
    ("c10d.send.default", "send"),
    ("c10d.recv_.default", "recv"),
    ("_c10d_functional.wait_tensor.default", None),
    ("aten.mm.default", None),
])
def test_collective_kinds(op, kind):
    assert collective_kind(op) == kind


def test_launcher_and_checks_import_no_torch():
    code = ("import sys, executor.launch, executor.checks, executor.faults; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_module_layout_is_what_parallelize_addresses():
    names = {n for n, _ in Transformer(tiny("tiny-llama").model).named_modules()}
    for name in ("embed.tok", "layers.0.attn.q", "layers.0.attn.k", "layers.0.attn.v", "layers.0.attn.o",
                 "layers.0.mlp.gate", "layers.0.mlp.up", "layers.0.mlp.down", "layers.0.attn_norm",
                 "layers.0.mlp_norm", "final_norm", "lm_head"):
        assert name in names


def test_a_ranks_training_thread_gets_a_core_of_its_own_on_one_machine(monkeypatch):
    """executor.hostload.pin_training_thread: local rank i on the i-th allowed core, only when the
    job runs on this machine alone with no more ranks than cores, and the rank computes on one
    thread; the calling thread only."""
    import os
    import threading

    from executor.hostload import pin_training_thread

    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("one core: nothing to pin to")

    def in_thread(rank: int, local_world: int, world: int, threads: int = 1) -> tuple[int | None, list[int]]:
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_world))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        out: list = []
        t = threading.Thread(target=lambda: out.extend([pin_training_thread(threads),
                                                        sorted(os.sched_getaffinity(0))]))
        t.start()
        t.join()
        return out[0], out[1]

    assert in_thread(1, 2, 2) == (allowed[1], [allowed[1]])
    assert in_thread(0, 2, 4) == (None, allowed)  # several nodes: their local ranks share cores here
    assert in_thread(0, len(allowed) + 1, len(allowed) + 1) == (None, allowed)  # they time-share
    assert in_thread(0, 1, 1, threads=2) == (None, allowed)  # its OpenMP workers would share its core
    assert in_thread(0, 1, 1) == (allowed[0], [allowed[0]])
    assert sorted(os.sched_getaffinity(0)) == allowed  # this thread left as it was


def test_gloos_transport_threads_yield_to_the_training_threads():
    """executor.hostload.idle_transport_threads: a thread named as gloo's TCP loop gets the idle
    policy, other threads keep theirs, and transport_threads counts both (what the measurement
    records)."""
    import ctypes
    import ctypes.util
    import os
    import threading

    from executor.hostload import GLOO_TRANSPORT_THREAD, idle_transport_threads, transport_threads

    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if not hasattr(os, "SCHED_IDLE") or not os.path.isdir("/proc/self/task"):
        pytest.skip("no Linux scheduling policies here")
    ready, stop, tids = threading.Event(), threading.Event(), {}

    def named(name: str) -> None:
        libc.prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME: the thread's comm, as gloo names its loop
        tids[name] = threading.get_native_id()
        if len(tids) == 2:
            ready.set()
        stop.wait(10)

    threads = [threading.Thread(target=named, args=(n,)) for n in (GLOO_TRANSPORT_THREAD, "pt_gloo_runloop")]
    for t in threads:
        t.start()
    try:
        assert ready.wait(10)
        before = transport_threads()
        assert before["threads"] >= 1 and before["idle"] < before["threads"]
        assert os.sched_getscheduler(tids[GLOO_TRANSPORT_THREAD]) == os.SCHED_OTHER
        assert idle_transport_threads() == before["threads"]
        assert os.sched_getscheduler(tids[GLOO_TRANSPORT_THREAD]) == os.SCHED_IDLE
        assert os.sched_getscheduler(tids["pt_gloo_runloop"]) == os.SCHED_OTHER
        assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the caller (the training thread) untouched
        after = transport_threads()
        assert after == {"threads": before["threads"], "idle": before["threads"]}
    finally:
        stop.set()
        for t in threads:
            t.join()


def test_the_hosts_reference_workloads_leave_the_runs_random_state_alone():
    """reference_cpu_s times its two fixed workloads by CPU time with its own generator: the
    global RNG, which seeds a run's initialisation and data, is where it was, so a run's losses do
    not depend on it."""
    import torch

    torch.manual_seed(7)
    state = torch.get_rng_state()
    times = reference_cpu_s(reps=1)
    assert torch.equal(torch.get_rng_state(), state)
    assert set(times) == {"reference_cpu_s", "reference_ops_cpu_s"} and all(0 < t < 5.0 for t in times.values())


def test_the_hosts_speed_is_the_slowest_of_its_timings_before_between_and_after_the_steps():
    """A slow phase of the host that starts inside a run shows only in the reference workloads
    timed after its last step, one that lasts through the steps only in those timed between them:
    each rank's slowest timing counts, then the median over the ranks."""
    from executor.report import reference_speed

    pair = lambda t: {"reference_cpu_s": t[0], "reference_ops_cpu_s": t[1]}  # noqa: E731

    def rank(before: tuple[float, float], after: tuple[float, float] | None,
             between: tuple[float, float, float] | None = None) -> dict:
        return {"reference_cpu_s": pair(before), "reference_after_cpu_s": pair(after) if after else None,
                "reference_between": {**pair(between), "allreduce_s": between[2]} if between else None}

    ranks = [rank((2.6e-3, 2.8e-3), (2.7e-3, 3.5e-3)), rank((2.7e-3, 2.9e-3), (2.6e-3, 3.6e-3)),
             rank((2.8e-3, 3.0e-3), (2.8e-3, 2.9e-3))]
    got = reference_speed(ranks)
    assert got["reference_cpu_s"] == pytest.approx(2.7e-3)  # per rank 2.7, 2.7, 2.8
    assert got["reference_ops_cpu_s"] == pytest.approx(3.5e-3)  # per rank 3.5, 3.6, 3.0: the slow phase
    assert got["reference_after"]["reference_ops_cpu_s"] == pytest.approx(3.5e-3)
    older = reference_speed([rank((2.6e-3, 2.8e-3), None)])  # a rank that timed it before only
    assert older == {"reference_cpu_s": 2.6e-3, "reference_ops_cpu_s": 2.8e-3}
    # slow between the steps only (q41's fit-pp-1f1b): the GEMMs 30% slower there on two ranks of three
    amid = reference_speed([rank((2.6e-3, 2.8e-3), (2.6e-3, 2.8e-3), (3.4e-3, 2.9e-3, 90e-6)),
                            rank((2.7e-3, 2.8e-3), (2.6e-3, 2.8e-3), (3.5e-3, 2.8e-3, 80e-6)),
                            rank((2.6e-3, 2.8e-3), (2.6e-3, 2.8e-3), (2.6e-3, 2.8e-3, 70e-6))])
    assert amid["reference_cpu_s"] == pytest.approx(3.4e-3) and amid["reference_ops_cpu_s"] == pytest.approx(2.8e-3)
    assert amid["reference_between"]["allreduce_s"] == pytest.approx(80e-6)
    assert amid["reference_after"]["reference_cpu_s"] == pytest.approx(2.6e-3)
    assert reference_speed([{"reference_cpu_s": None}]) == {}  # a GPU run


def test_the_hosts_speed_is_timed_after_a_few_measured_steps_spread_over_the_run(monkeypatch):
    """Between measured steps every rank first waits for the others (no rank still computes a
    step), then times the workloads; after at most eight steps of a run, spread evenly, and the
    median of each figure counts (one slow sample does not)."""
    import itertools

    import executor.hostspeed as hs

    times = itertools.cycle([2.6e-3, 2.7e-3, 9.0e-3, 2.8e-3, 2.6e-3, 2.7e-3, 2.9e-3, 2.7e-3])
    monkeypatch.setattr(hs, "reference_cpu_s", lambda reps: {"reference_cpu_s": next(times), "reps": reps})
    monkeypatch.setattr(hs, "allreduce_latency_s", lambda group: 1e-4)
    synced: list[int] = []
    probe = hs.BetweenSteps(steps=60)
    assert probe.result() is None  # nothing timed yet
    for i in range(60):
        probe.after(i, lambda i=i: synced.append(i))
    assert synced == list(range(0, 60, 8))  # 60 steps: after every 8th, 8 samples
    assert probe.result() == {"reference_cpu_s": pytest.approx(2.7e-3), "reps": hs.BETWEEN_REPS, "allreduce_s": 1e-4}
    short = hs.BetweenSteps(steps=5)
    for i in range(5):
        short.after(i, lambda: None)
    assert len(short.samples) == 5  # a short run: after every step


def test_every_launch_runs_one_intra_op_thread_a_rank_unless_the_user_says_otherwise(monkeypatch):
    """executor.torchrun.worker_env: OMP_NUM_THREADS=1 for every launch (torchrun sets it only for
    several processes a node; a 1-rank run then used every core, its threads bound to one), and a
    value the user set is kept."""
    from executor.torchrun import worker_env

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert worker_env()["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert worker_env()["OMP_NUM_THREADS"] == "4"

