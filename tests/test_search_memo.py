"""The search's shared work gives every plan the answer it gets alone.

A search times thousands of plans of one scenario, and shares between them what each part of
the model reads of a plan: parameter counts and stage chunks by pipeline layout, group layouts
and fabric slow-downs by rank grid (simdist.analytic.collectives.grid), model states and runtime
buffers by everything but the activations' fields (simdist.search.evaluate.ACTIVATION_ONLY),
layer passes by everything but the schedule, the chunks and the ZeRO stage, each stage's
data-parallel traffic and optimizer step by everything but the micro-batch's shape, and builds its plans without the per-field checks. Here plans are evaluated in the search's
order, the shared answers warm, and some of them again with every memo emptied: the same
plan, memory and closed-form step time.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import REPO

from simdist.analytic import activations, collectives, fabric, params, stage
from simdist.analytic.memory_conventions import _conventions
from simdist.analytic.steptime import analytic_step
from simdist.search import Constraints, Evaluator, enumerate_plans, peak_memory
from simdist.spec.scenario import load_scenario, scenario_from_dict

SMALL = {"name": "gpt3-13b-64xa100", "model": {"preset": "gpt3-13b"},
         "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 8},
         "plan": {"tp": 2, "pp": 4, "global_batch_size": 512, "precision": "bf16"}}


def _forget() -> None:
    """Empty every memo shared between plans."""
    for d in (fabric._SLOWDOWN, fabric._WORST_P2P, collectives._LAYOUTS):
        d.clear()
    for f in (fabric.p2p_slowdown, collectives.collective_choice, _conventions, params._stage_layers,
              params._stage_params, params._stage_expert_params, params._params_per_rank,
              stage._stage_chunks, stage._stage_kinds, activations._interleaved_peak):
        f.cache_clear()


def _checked_plan(ev: Evaluator, cand) -> object:
    return replace(ev.base_plan, tp=cand.tp, pp=cand.pp, dp=cand.dp, cp=cand.cp, virtual_pipeline_stages=cand.v,
                   schedule=cand.schedule, zero_stage=cand.zero, sequence_parallel=cand.sp,
                   recompute=cand.recompute, micro_batch_size=cand.mbs, dp_shard=cand.dp, ep=cand.ep,
                   etp=cand.etp)


@pytest.mark.parametrize("source, every, check", [
    ("small", 1, 7),
    ("small-fp8", 1, 7),
    ("deepseek-v3-dualpipe-2048xh800.yaml", 5, 7),
    ("gpt3-175b-1024xa100.yaml", 3, 97),
    ("gpt-530b-2520xa100.yaml", 3, 101),
    # experts (and DualPipeV), context parallelism, offload, compression, parameter servers
    ("qwen3-30b-a3b-dualpipev-64xh100.yaml", 37, 13),
    ("llama3-8b-ulysses-64xh100.yaml", 7, 11),
    ("llama2-70b-zero3-offload-2xa100.yaml", 1, 5),
    ("gpt3-1.3b-16x1gpu-25gbe-powersgd.yaml", 1, 11),
    ("gpt3-1.3b-16x1gpu-25gbe-ps16.yaml", 1, 11),
])
def test_shared_work_gives_each_plan_its_own_answer(source, every, check):
    if source.startswith("small"):  # FP8: what a forward saves follows ZeRO-3's FP8 weight gathers
        fp8 = {"cluster": {"preset": "dgx-h100", "num_nodes": 8},
               "plan": {**SMALL["plan"], "precision": "fp8", "framework": "torchtitan"}}  # torchao tensorwise
        sc = scenario_from_dict({**SMALL, **(fp8 if source == "small-fp8" else {})})
    else:
        sc = load_scenario(REPO / "scenarios" / source)
    enum = enumerate_plans(sc.model, sc.cluster, sc.plan.global_batch_size, Constraints(), sc.plan.flash_attention)
    ev = Evaluator(sc)
    checked = 0
    for i, cand in enumerate(list(enum.groups)[::every]):
        plan = ev.plan(cand)
        if ev.problems(plan):
            continue
        peak, host = ev.memory(plan)
        t = ev.analytic_time(plan) if ev.fits(peak, host) else None
        if i % check:
            continue
        _forget()
        alone = _checked_plan(ev, cand)
        assert plan == alone and hash(plan) == hash(alone)
        assert (peak, host) == peak_memory(sc.model, alone, sc.cluster)
        if t is not None:
            assert t == Evaluator(sc).analytic_time(alone)
            assert t == analytic_step(replace(sc, plan=alone), ev.cost, ev.net).step_time  # no memo at all
        checked += 1
    assert checked >= 5
