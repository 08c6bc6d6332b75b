"""The search's shortcuts (grouping equivalent plans, work shared between plans, plans built
without the per-field checks) find what a brute-force walk finds: every point of a small grid
built with the checked ``with_plan``, sized stage by stage (``memory_per_stage``) and timed by
``predict(engine="analytic")``, nothing shared. The fastest plan that fits, its time, and the
number of plans that fit must be the same."""

from __future__ import annotations

import itertools

import pytest

from simdist.analytic.memory import memory_per_stage
from simdist.errors import ScenarioError
from simdist.predict import predict
from simdist.search import Candidate, Constraints, canonical, search
from simdist.search.space import (
    cp_grid,
    divisors,
    layout_problem,
    pipeline_grid,
    pp_grid,
    schedule_problem,
    tp_grid,
)
from simdist.spec.scenario import scenario_from_dict

SPACES = {
    # GPT-3 13B on 16 A100: tensor, pipeline (interleaved too) and data parallel, ZeRO 0-3
    "dense": ({"name": "gpt3-13b-16xa100", "model": {"preset": "gpt3-13b"},
               "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 2},
               "plan": {"tp": 2, "pp": 4, "global_batch_size": 64, "precision": "bf16"}},
              Constraints(engine="analytic", max_micro_batch=1, max_virtual_stages=2)),
    # a mixture of experts on 16 H100: expert parallelism beside the rest (and ZeRO sharding
    # the experts over their own data-parallel group when dp = 1)
    "experts": ({"name": "qwen3-30b-16xh100", "model": {"preset": "qwen3-30b-a3b"},
                 "cluster": {"preset": "dgx-h100", "num_nodes": 2},
                 "plan": {"tp": 1, "pp": 2, "ep": 8, "global_batch_size": 32, "precision": "bf16"}},
                Constraints(engine="analytic", max_micro_batch=1, max_virtual_stages=1, max_ep=8,
                            schedules=("1f1b", "zero-bubble"), recompute=("none", "full"))),
}


def _brute_force(sc, c: Constraints) -> dict[tuple, tuple[float, float]]:
    """Every valid grid point -> (step time, peak bytes) for those that fit: the grid's rules
    (``layout_problem``, ``schedule_problem``, simdist.search.space's docstring), then the
    validator (``with_plan``)."""
    m, cluster, world = sc.model, sc.cluster, sc.world_size
    cap = cluster.gpu.memory_bytes
    out = {}
    for tp in tp_grid(cluster, c):
        for cp in cp_grid(world // tp, c, m.seq_length):
            for pp in pp_grid(m, world // (tp * cp), c):
                dp = world // (tp * cp * pp)
                if layout_problem(m, tp, cp, pp, world // (tp * cp)):
                    continue
                eps = [e for e in divisors(tp * cp * dp) if not m.is_moe or (m.num_experts % e == 0
                                                                           and e <= (c.max_ep or e))]
                for (schedule, v), mbs, zero, sp, rc, ep in itertools.product(
                        pipeline_grid(m, pp, c), range(1, c.max_micro_batch + 1), c.zero_stages,
                        (False, True), c.recompute, eps if m.is_moe else [1]):
                    if sc.plan.global_batch_size % (mbs * dp) or schedule_problem(
                            schedule, pp, sc.plan.global_batch_size // (mbs * dp), m.num_layers):
                        continue
                    try:
                        one = sc.with_plan(tp=tp, pp=pp, dp=dp, cp=cp, virtual_pipeline_stages=v,
                                           schedule=schedule, zero_stage=zero, sequence_parallel=sp,
                                           recompute=rc, micro_batch_size=mbs, dp_shard=dp, ep=ep)
                    except (ScenarioError, ValueError):
                        continue
                    peak = max(s.peak for s in memory_per_stage(m, one.plan, cluster))
                    if peak <= cap:
                        t = predict(one, engine="analytic", keep_spans=False).step_time_s
                        out[(tp, pp, dp, cp, v, schedule, zero, sp, rc, mbs, ep)] = (t, peak)
    return out


@pytest.mark.parametrize("space", sorted(SPACES))
def test_search_finds_the_brute_force_winner(space):
    data, c = SPACES[space]
    sc = scenario_from_dict(data)
    every = _brute_force(sc, c)
    assert len(every) > 20  # a real choice
    result = search(sc, c, workers=1)
    # the grid points that fit: each representative stands for its equivalent variants
    assert sum(p.variants for p in result.evaluated_plans if p.feasible) == len(every)
    best_t = min(t for t, _ in every.values())
    best = result.best
    assert best is not None and best.step_time_s == pytest.approx(best_t, rel=1e-12)
    key = (*best.candidate[:10], best.candidate.ep)
    assert every[key][0] == pytest.approx(best.step_time_s, rel=1e-12)
    # every ranked plan's time is its brute-force time
    for p in result.evaluated_plans:
        if p.analytic_step_time_s is not None:
            k = (*p.candidate[:10], p.candidate.ep)
            assert every[k][0] == pytest.approx(p.analytic_step_time_s, rel=1e-12), p.candidate.label()


def test_zero_stages_group_only_where_nothing_is_sharded():
    """dp = 1 groups ZeRO 0-2, unless context parallelism or an expert data-parallel group of
    several ranks gives ZeRO something to shard."""
    c = Constraints()
    z1 = Candidate(4, 4, 1, 1, 1, "1f1b", 1, False, "none", 1)
    assert canonical(z1, False, c).zero == 0
    assert canonical(z1, False, c, experts=True).zero == 1  # experts over tp * dp / ep = 4 ranks
    assert canonical(z1._replace(ep=4), False, c, experts=True).zero == 0
    assert canonical(z1._replace(cp=2), False, c).zero == 1
