"""What the executor runs of contract v1.2's model and plan fields, checked before launch (no
torch import here; :mod:`executor.checks` calls :func:`v12_problems`).

Runs: mixture-of-experts layers (routed top-k experts, shared experts, leading dense layers)
with expert parallelism over the data-parallel ranks (all-to-all dispatch on gloo), alone or
with data parallelism (DDP) and a one-chunk pipeline; context parallelism (ring, all-gather or
Ulysses) on a dense model with data parallelism. Everything else of 1.2 is refused by name.
"""

from __future__ import annotations

from simdist.errors import Problem
from simdist.spec.scenario import Scenario


def v12_problems(scenario: Scenario) -> list[Problem]:
    m, plan = scenario.model, scenario.plan
    out: list[Problem] = []

    def add(f: str, msg: str) -> None:
        out.append(Problem(f, msg))

    if m.attention == "mla":
        add("model.attention", "multi-head latent attention is not implemented by the executor (mha)")
    if m.num_attention_heads * m.head_dim != m.hidden_size:
        add("model.head_dim", "the executor's attention projects to hidden_size: head_dim must be "
            "hidden_size / num_attention_heads")
    if m.sliding_window is not None and m.sliding_window < m.seq_length:
        add("model.sliding_window", "sliding-window attention is not implemented by the executor")
    if m.mtp_layers:
        add("model.mtp_layers", "multi-token prediction is not implemented by the executor")
    if plan.dualpipe:
        add("plan.schedule", f"{plan.schedule} is not implemented by the executor (gpipe, 1f1b, "
            "interleaved-1f1b, zero-bubble)")
    if m.is_moe:
        _moe(scenario, add)
    if plan.cp > 1:
        _context(scenario, add)
    if (plan.ep > 1 or plan.cp > 1) and plan.hybrid_sharding:
        add("plan.dp_shard", "hybrid sharding with expert or context parallelism is not implemented by the executor")
    return out


def _moe(sc: Scenario, add) -> None:
    m, plan = sc.model, sc.plan
    if m.moe_capacity_factor is not None:
        add("model.moe_capacity_factor", "the executor routes dropless (no capacity factor)")
    if m.moe_router_group_topk < m.moe_router_groups:
        add("model.moe_router_group_topk", "the executor routes top-k over all experts (no group-limited routing)")
    if plan.tp > 1 or plan.etp > 1:
        add("plan.tp", "the executor's tensor-parallel plan splits dense FFNs, not experts: use tp 1 "
            "(and etp 1) with a mixture-of-experts model")
    if plan.cp > 1:
        add("plan.cp", "context parallelism with experts is not implemented by the executor")
    if plan.ep > 1:
        if plan.moe_dispatcher != "alltoall":
            add("plan.moe_dispatcher", f"the executor dispatches with all_to_all_single (alltoall), not "
                f"{plan.moe_dispatcher}")
        if plan.zero_stage != 0:
            add("plan.zero_stage", "expert parallelism runs with DDP in the executor (zero_stage 0): the "
                "experts' gradients are reduced over their own group, outside DDP")
        if plan.pp > 1 and (plan.virtual_pipeline_stages > 1 or plan.schedule == "zero-bubble"):
            add("plan.schedule", "expert parallelism runs with one-chunk pipelines (gpipe, 1f1b) in the executor")


def _context(sc: Scenario, add) -> None:
    m, plan = sc.model, sc.plan
    if plan.tp > 1 or plan.pp > 1:
        add("plan.cp", "context parallelism runs with data parallelism only in the executor (tp 1, pp 1)")
    if plan.zero_stage != 0:
        add("plan.zero_stage", "context parallelism runs with DDP over dp*cp in the executor (zero_stage 0)")
    if m.seq_length % (2 * plan.cp):
        add("model.seq_length", f"{m.seq_length} does not split into 2*cp = {2 * plan.cp} chunks (the "
            "load-balanced causal layout)")
    if plan.recompute == "selective":
        add("plan.recompute", "selective recompute with context parallelism is not implemented by the executor")
