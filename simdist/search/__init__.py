"""Plan search (`simdist search`): every valid parallel plan for a model, a cluster and a global
batch, ranked by predicted step time among those that fit in memory.

The search keeps the model, the cluster and the plan's ``global_batch_size`` and ``precision``
(and every plan field it does not search, such as ``flash_attention`` or the overlap switches)
from the scenario, and varies the rest: tp, pp, dp, cp, virtual stages, schedule, ZeRO stage,
sequence parallelism, recompute and micro-batch size.

- :mod:`simdist.search.space`: Constraints, the grid, and ``canonical``: plans the model
  cannot tell apart are grouped before anything is timed, one representative per group with
  the number of variants it stands for;
- :mod:`simdist.search.evaluate`: memory and closed-form time per plan, the discrete-event
  re-timing, and the process pool;
- :mod:`simdist.search.results`: PlanResult, SearchResult, dominance and ranking (a plan that
  another fitting plan beats on both step time and memory is "dominated" and left out of the
  ranking, kept in ``SearchResult.evaluated_plans``);
- :mod:`simdist.search.bounds`: a lower bound on a plan's step time that holds in both engines,
  which spares the discrete-event engine the plans that cannot reach the top places;
- :mod:`simdist.search.driver`: ``search()``, the three passes.

Not searched: ZeRO sharding always spans all of dp (``dp_shard`` = dp: the scenario's HSDP
group is not kept), and offload, gradient compression and the parameter-server modes stay as
the scenario has them (plans they rule out count as invalid, "rejected by the validator").
"""

from simdist.search.driver import search
from simdist.search.evaluate import Evaluator, Progress, default_workers, peak_memory
from simdist.search.results import (
    ROW_FIELDS,
    PlanResult,
    SearchResult,
    mark_dominated,
    rerank_count,
)
from simdist.search.space import (
    PLAN_FIELD,
    Candidate,
    Constraints,
    Enumeration,
    canonical,
    enumerate_plans,
)

__all__ = [
    "PLAN_FIELD",
    "ROW_FIELDS",
    "Candidate",
    "Constraints",
    "Enumeration",
    "Evaluator",
    "PlanResult",
    "Progress",
    "SearchResult",
    "canonical",
    "default_workers",
    "enumerate_plans",
    "mark_dominated",
    "peak_memory",
    "rerank_count",
    "search",
]
