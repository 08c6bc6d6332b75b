"""Experts and context parallelism in the executor: real torchrun runs on gloo, each checked
against a one-process run of the same model and data (dropless routing keeps MoE exact), the
simulator's model-state bytes per rank and its all-to-all bytes per step; and the layouts the
executor refuses before it launches anything.

One launch per plan kind, each checking several things: expert parallelism alone (2 ranks),
with data parallelism (4 ranks: 2 replicas of each expert), with a pipeline (4 ranks), and
context parallelism with ring attention (4 ranks); the all-gather and Ulysses methods run on
2 ranks.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from executor.checks import run_problems  # noqa: E402
from executor.launch import run_command  # noqa: E402
from executor.model import build_model  # noqa: E402
from executor.moe import MoE  # noqa: E402
from executor.train import reference_losses  # noqa: E402
from simdist.analytic.cpu_syncs import sync_points  # noqa: E402
from simdist.analytic.memory import model_state_bytes  # noqa: E402
from simdist.analytic.params import stage_layers, total_params  # noqa: E402
from simdist.analytic.variants import comm_bytes, layer_ops  # noqa: E402
from simdist.spec.groups import expert_data_parallel_size  # noqa: E402
from simdist.spec.layers import layer_kind  # noqa: E402
from simdist.spec.plan import rank_coord  # noqa: E402
from simdist.spec.scenario import Scenario, load_scenario, scenario_from_dict  # noqa: E402

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
RTOL = 1e-4  # fp32 against one process (measured: <= 1e-7)


def launch(tmp_path: Path, file: Path, nproc: int) -> tuple[Scenario, dict[str, Any]]:
    out = tmp_path / f"{file.stem}.json"
    code = run_command(file=str(file), nproc=nproc, steps=2, warmup=1, out=str(out), pg_timeout=60)
    assert code == 0, f"simdist run {file.name} exited {code}"
    return load_scenario(file), json.loads(out.read_text())


def assert_losses_match(sc: Scenario, m: dict[str, Any]) -> None:
    ref = reference_losses(sc.model, sc.plan, m["steps"], m["warmup_steps"], seed=m["seed"])
    assert len(m["losses"]) == m["steps"]
    for got, want in zip(m["losses"], ref, strict=True):
        assert math.isclose(got, want, rel_tol=RTOL), (m["losses"], ref)


def simulated_alltoall_bytes(sc: Scenario) -> float:
    """Dispatch and combine of every MoE layer of a stage, forward and backward, for every
    micro-batch of a step (balanced routing), averaged over the stages as the measurement
    averages over the ranks (every stage has as many)."""
    m, plan = sc.model, sc.plan
    per_stage = [sum(comm_bytes(layer_ops(m, plan, phase, layer_kind(m, i)), "ep", "alltoall")
                     for i in stage_layers(m, plan, s) for phase in ("fwd", "bwd")) for s in range(plan.pp)]
    return sum(per_stage) / plan.pp * plan.num_microbatches


@pytest.mark.distributed
@pytest.mark.parametrize(("name", "nproc"), [("tiny-moe-ep", 2), ("tiny-moe-ep-dp", 4),
                                             pytest.param("tiny-moe-ep-pp", 4, marks=pytest.mark.slow)])
def test_expert_parallel_runs_match_one_process_and_the_simulator(tmp_path, name, nproc):
    sc, m = launch(tmp_path, SCENARIOS / f"{name}.yaml", nproc)
    assert_losses_match(sc, m)
    for r in m["model_state_bytes"]:  # local experts + the dense weights, Adam in fp32
        want = model_state_bytes(sc.model, sc.plan, rank_coord(r["rank"], sc.plan).pp)
        assert (r["params"], r["grads"], r["optimizer"]) == (want["params"], want["grads"], want["optimizer"])
    # the mean over ranks of what each sends (uneven per rank, exact summed over the group)
    assert m["comm_bytes_per_step"]["all_to_all"] == pytest.approx(simulated_alltoall_bytes(sc), rel=1e-12)
    # the sync points of a rank without a pipeline, as the simulator counts them: per MoE layer and
    # micro-batch the token counts' all-gather, dispatch and combine forward and backward; the
    # dense gradients' bucket and the experts' (one flat buffer over their own group, when it has
    # more than one rank) once a step
    if sc.plan.pp == 1:
        (census,) = [c for c in m["collectives_per_rank"] if c["rank"] == 0]
        calls = sum(v["count"] for v in census.values() if isinstance(v, dict))
        assert calls == sync_points(sc, 0, fsdp2=True)
        assert census["all_reduce"]["count"] == 1 + (expert_data_parallel_size(sc.plan) > 1)


@pytest.mark.distributed
def test_context_parallel_ring_matches_one_process(tmp_path):
    sc, m = launch(tmp_path, SCENARIOS / "tiny-cp.yaml", 4)
    assert_losses_match(sc, m)
    assert m["collectives"]["send"]["count"] > 0  # K/V blocks around the ring, point to point
    for r in m["model_state_bytes"]:
        want = model_state_bytes(sc.model, sc.plan)
        assert (r["params"], r["optimizer"]) == (want["params"], want["optimizer"])


@pytest.mark.distributed
@pytest.mark.parametrize("method", ["allgather", "ulysses"])
def test_context_parallel_allgather_and_ulysses_match_one_process(tmp_path, method):
    text = (SCENARIOS / "tiny-cp.yaml").read_text()
    text = text.replace("cp_method: ring", f"cp_method: {method}").replace("gpus_per_node: 4", "gpus_per_node: 2")
    text = text.replace("global_batch_size: 4 ", "global_batch_size: 2 ")
    file = tmp_path / f"tiny-cp-{method}.yaml"
    file.write_text(text)
    sc, m = launch(tmp_path, file, 2)
    assert sc.plan.cp_method == method and sc.plan.dp == 1
    assert_losses_match(sc, m)


# --- one process, no launch -----------------------------------------------------------------


def test_moe_model_has_the_simulators_parameters():
    sc = load_scenario(SCENARIOS / "tiny-moe-ep.yaml")
    model = build_model(sc.model, seed=0)
    assert sum(p.numel() for p in model.parameters()) == total_params(sc.model)
    moes = [mod for mod in model.modules() if isinstance(mod, MoE)]
    assert len(moes) == sc.model.num_layers - sc.model.first_dense_layers


def test_experts_that_receive_no_token_stay_in_the_backward():
    """A rank whose local experts receive no routed token still runs the dispatch all-to-all's
    backward (the output depends on the received rows) and gives every expert weight a (zero)
    gradient: the collectives of a backward cannot depend on the routing, or a peer waits alone
    (the EP+PP deadlock, where shape inference routed every token of a stage to one rank)."""
    sc = load_scenario(SCENARIOS / "tiny-moe-ep.yaml")
    moe = next(mod for mod in build_model(sc.model, seed=0).modules() if isinstance(mod, MoE))
    for counts in (torch.zeros(2, moe.local_experts, dtype=torch.long),  # nothing received
                   torch.tensor([[3] + [0] * (moe.local_experts - 1), [0] * moe.local_experts])):
        rows = torch.randn(int(counts.sum()), sc.model.hidden_size, requires_grad=True)
        moe.zero_grad(set_to_none=True)
        out = moe._run_local(rows, counts)
        assert out.grad_fn is not None
        out.sum().backward()
        assert rows.grad is not None and rows.grad.shape == rows.shape
        for name in ("experts_w1", "experts_w2"):
            grad = getattr(moe, name).grad
            assert grad is not None, name
            assert bool((grad[1:] == 0).all()), name  # experts that received nothing: zero gradient
        if counts.sum():
            assert bool(moe.experts_w1.grad[0].abs().sum() > 0)


def _scenario(model: dict, n: int = 2, **plan) -> Scenario:
    return scenario_from_dict({"name": "t", "model": model, "cluster": {"preset": "local", "num_nodes": 1,
                                                                        "gpus_per_node": n},
                               "plan": {"global_batch_size": 4, "precision": "fp32", **plan}})


@pytest.mark.parametrize(("model", "plan", "field"), [
    ({"preset": "tiny-moe"}, {"ep": 2, "moe_dispatcher": "flex"}, "plan.moe_dispatcher"),
    ({"preset": "tiny-moe"}, {"ep": 2, "zero_stage": 2}, "plan.zero_stage"),
    ({"preset": "tiny-moe"}, {"tp": 2, "sequence_parallel": True}, "plan.tp"),
    ({"preset": "tiny-moe", "moe_capacity_factor": 1.0}, {}, "model.moe_capacity_factor"),
    ({"preset": "tiny-moe", "moe_router_groups": 2, "moe_router_group_topk": 1}, {}, "model.moe_router_group_topk"),
    ({"preset": "tiny-moe", "seq_length": 64}, {"cp": 2}, "plan.cp"),
    ({"preset": "tiny-llama", "seq_length": 30}, {"cp": 2}, "model.seq_length"),
    ({"preset": "tiny-llama", "seq_length": 64}, {"cp": 2, "pp": 1, "zero_stage": 3}, "plan.zero_stage"),
    ({"preset": "tiny-llama", "sliding_window": 8}, {}, "model.sliding_window"),
    ({"preset": "tiny-llama", "num_layers": 4}, {"pp": 2, "schedule": "dualpipev"}, "plan.schedule"),
])
def test_bad_layouts_are_refused_before_launch(model, plan, field):
    sc = _scenario(model, **plan)
    assert field in {p.field for p in run_problems(sc, sc.world_size)}
