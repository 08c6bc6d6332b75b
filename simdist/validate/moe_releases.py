"""The Megatron-Bridge release each MoE row of the performance summaries ran, and what its
performance recipe set that later releases changed.

A row names its NeMo container ("Megatron-Bridge/NeMo 25.09 NeMo Container"); the summary of a
container is published with the Megatron-Bridge release whose scripts/performance produced it
(docs/performance-summary.md of the release lists it as the newest section): 25.09 with r0.1.0
(v0.1.0rc4, v0.2.0), 25.11 with v0.2.x, 26.02 and 26.02.01 with v0.3.x, 26.04.01 with v0.4.2,
26.06 with v0.5.0. Only the recipe fields that simdist prices and that differ from
:data:`simdist.validate.moe_cp.MOE_MODELS` (the recipes from 26.04 on) are listed, and the parallelism
of a row whose section repeats the previous section's columns over a run of another recipe.

- 25.09 (scripts/performance/run_script.py @v0.1.0rc4): the Qwen3 recipes are built with
  ``CommOverlapConfig(tp_comm_overlap=True)`` and token dropping; only DeepSeek-V3 sets
  ``overlap_moe_expert_parallel_comm`` (its ``A2A_1F1B`` on H100), so the Qwen3 runs have no
  all-to-all overlap; no flex backend is applied, so the dispatcher is Qwen3MoEModelProvider's
  default ``alltoall`` (src/megatron/bridge/models/qwen/qwen_provider.py @v0.1.0rc4).
  The same script runs DeepSeek-V3 on H100 with DeepEP and ``A2A_1F1B``:
  ``overlap_moe_expert_parallel_comm`` and ``delay_wgrad_compute`` on, the shared-expert overlap
  off (its later H100 recipe, DEEPSEEK_V3_PRETRAIN_CONFIG_H100_V1, runs HybridEP without it); the
  recompute of [mla_up_proj, mlp], overlap_grad_reduce off and the "Et|(tt|)*30mL" layout are
  the same in both.
- 25.11 (scripts/performance/configs/qwen3/workload_base_configs.py @v0.2.0 and @v0.2.2):
  QWEN3_30B_A3B_H100_FP8_CS_BASE_CONFIG sets ``moe_a2a_overlap=True`` and no flex backend
  (WorkloadBaseConfig's default None: the ``alltoall`` dispatcher).
- 26.02 (scripts/performance/configs/qwen/qwen3_workload_base_configs.py @v0.3.0, the section
  published 2026-02-25, #2492): QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1 is PP2 VP12 EP8 with
  ``moe_a2a_overlap=True`` and ``moe_flex_dispatcher_backend="deepep"`` (the flex dispatcher).
- 26.02.01: the patch container was measured with the r0.3.0 branch in March 2026 (the section's
  numbers: "patch container numbers", 2026-03-19, #2872), and that branch had already replaced the
  H100 recipe: "Update Qwen3 30B H100 Base Configs with HybridEP" (#2477, on r0.3.0 as f29a269f8,
  2026-02-24) makes it PP1 EP16, HybridEP, no all-to-all overlap, as v0.3.1 (2026-03-20) ships it
  and every later release keeps it (what MOE_MODELS maps). The section's parallelism columns repeat
  the 26.02 section's (PP2 VP12 EP8); its 9,058 tokens/s/GPU is within 2% of the PP1 EP16 recipe's
  in 26.04, 26.04.01 and 26.06 (8,826-8,960) and 1.77x the 26.02 run's 5,113. Megatron-Core
  (core_r0.16.0 b0cc2706 -> 55ac7082: CI, docs, a checkpoint worker and a Mamba fix) and
  Transformer Engine (5671fd36 in both) did not change between the two releases.

``moe_a2a_overlap`` turns on Megatron-Core's combined 1F1B all-to-all overlap
(``overlap_moe_expert_parallel_comm``, with ``delay_wgrad_compute``: set_moe_a2a_overlap_overrides
in scripts/performance/utils/helpers.py @v0.2.0), simdist's ``ep_comm_overlap``.
"""

from __future__ import annotations

import re
from typing import Any

_CONTAINER = re.compile(r"(\d\d\.\d\d(?:\.\d+)?) NeMo Container")

# (model key as moe_cp keys it, container) -> plan fields of that release's H100 recipe
RELEASE_RECIPES: dict[tuple[str, str], dict[str, Any]] = {
    ("qwen3_30b_a3b", "25.09"): {"moe_dispatcher": "alltoall", "ep_comm_overlap": False},
    ("qwen3_235b_a22b", "25.09"): {"moe_dispatcher": "alltoall", "ep_comm_overlap": False, "tp_comm_overlap": True},
    ("deepseekv3", "25.09"): {"moe_dispatcher": "flex", "ep_comm_overlap": True},
    ("qwen3_30b_a3b", "25.11"): {"moe_dispatcher": "alltoall", "ep_comm_overlap": True},
    ("qwen3_30b_a3b", "26.02"): {"moe_dispatcher": "flex", "ep_comm_overlap": True},
    # the PP1 EP16 recipe of #2477, not the PP2 VP12 EP8 that the section's columns repeat
    ("qwen3_30b_a3b", "26.02.01"): {"moe_dispatcher": "flex", "ep_comm_overlap": False, "pp": 1, "ep": 16,
                                    "virtual_pipeline_stages": 1, "schedule": "1f1b"},
}


def container(row: dict[str, str]) -> str | None:
    """The NeMo container a performance-summary row ran in ("25.09"), from its framework cell."""
    m = _CONTAINER.search(row.get("framework", ""))
    return m.group(1) if m else None


def release_plan(model_key: str, row: dict[str, str]) -> dict[str, Any]:
    """Plan fields the row's own release set differently from the current recipe (empty when none)."""
    return dict(RELEASE_RECIPES.get((model_key, container(row) or ""), {}))
