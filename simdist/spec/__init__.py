"""Input specifications: model, hardware, cluster, plan and the scenario that joins them."""

from simdist.spec.cluster import ClusterSpec, GpuSpec, HostSpec, LinkSpec
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan, RankCoord, rank_coord, rank_of
from simdist.spec.scenario import Scenario, load_scenario, scenario_from_dict

__all__ = [
    "ClusterSpec",
    "GpuSpec",
    "HostSpec",
    "LinkSpec",
    "ModelSpec",
    "ParallelPlan",
    "RankCoord",
    "Scenario",
    "load_scenario",
    "rank_coord",
    "rank_of",
    "scenario_from_dict",
]
