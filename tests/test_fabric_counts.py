"""The O(1) count of a pipeline stage's ranks in a range of ranks (simdist.analytic.fabric.members)
equals the rank-by-rank count, in both rank orders (pp before dp, and pp outermost with experts)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from simdist.analytic.fabric import SameStage, members
from simdist.spec.plan import rank_coord
from simdist.spec.scenario import load_scenario


@pytest.mark.parametrize("scenario,ep", [("tiny-pp-1f1b.yaml", 1), ("tiny-moe-ep-pp.yaml", 2)])
def test_stage_members_counted_in_constant_time(scenario, ep):
    base = load_scenario(f"scenarios/{scenario}").plan
    for tp, cp, pp, dp in itertools.product((1, 2, 4), (1, 2), (1, 3, 4), (2, 4)):
        plan = replace(base, tp=tp, cp=cp, pp=pp, dp=dp, dp_shard=dp, virtual_pipeline_stages=1, ep=ep)
        assert plan.pipeline_outermost == (ep > 1)
        world = tp * cp * pp * dp
        for s in range(pp):
            for first in range(0, world + 1, 3):
                for last in range(first, world + 1, 5):
                    expected = sum(1 for r in range(first, last) if rank_coord(r, plan).pp == s)
                    assert members(plan, first, last, SameStage(s)) == expected
                    assert members(plan, first, last, lambda c, s=s: c.pp == s) == expected
