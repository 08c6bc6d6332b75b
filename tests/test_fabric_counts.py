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


def test_a_nics_member_ranks_are_counted_in_closed_form():
    """nic_load counts the ranks of a NIC's stage with members (a NIC serves consecutive local
    GPUs): the rank-by-rank count it replaced walked every GPU of the node, which the slow fuzz
    test found looping over a node of 2^40 GPUs (2026-11-29)."""
    from simdist.analytic.fabric import nic_load
    from simdist.spec import topology as topo
    from simdist.spec.scenario import scenario_from_dict

    def load(gpn: int, nics: int, **plan) -> tuple[float, float]:
        sc = scenario_from_dict({"name": "n", "model": {"preset": "gpt3-1.3b"},
                                 "cluster": {"preset": "dgx-h100", "num_nodes": 2, "gpus_per_node": gpn,
                                             "inter_node": {"kind": "infiniband", "nics_per_node": nics}},
                                 "plan": {"global_batch_size": 64, **plan}})
        c, p = sc.cluster, sc.plan
        for rank in range(0, sc.world_size, max(1, sc.world_size // 7)):
            first = c.node_of(rank) * gpn
            walked = sum(1 for local in topo.nic_locals(c, topo.nic_of(c, rank))
                         if rank_coord(first + local, p).pp == 1)
            assert nic_load(c, p, rank, SameStage(1), 1.0) == walked * nics / gpn
        return nic_load(c, p, 0, SameStage(1), 1.0), nic_load(c, p, sc.world_size - 1, SameStage(1), 1.0)

    assert load(8, 8, tp=2, pp=2, dp=4) == (0.0, 1.0)
    assert load(8, 2, tp=4, pp=4, dp=1)[0] == 0.0
    load(16, 4, tp=2, pp=2, dp=8)
