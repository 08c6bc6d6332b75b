"""Input specifications: model, hardware, cluster, plan and the scenario that joins them.

``docs/scenario-format.md`` is the field reference; each dataclass describes its own fields
(:mod:`simdist.spec.fields`), which :mod:`simdist.spec.parse` reads from YAML.
"""

from simdist.spec.cluster import ClusterSpec, GpuSpec, HostSpec, LinkSpec
from simdist.spec.consistency import check_consistency
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan, RankCoord, rank_coord, rank_of
from simdist.spec.reliability import Reliability
from simdist.spec.scenario import Scenario, load_scenario, scenario_from_dict
from simdist.spec.unsimulated import NOT_SIMULATED_YET, not_simulated

__all__ = [
    "NOT_SIMULATED_YET",
    "ClusterSpec",
    "GpuSpec",
    "HostSpec",
    "LinkSpec",
    "ModelSpec",
    "ParallelPlan",
    "RankCoord",
    "Reliability",
    "Scenario",
    "check_consistency",
    "load_scenario",
    "not_simulated",
    "rank_coord",
    "rank_of",
    "scenario_from_dict",
]
