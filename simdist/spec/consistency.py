"""The checks that need model, cluster and plan together, in one function that reports every
problem at once, each naming its field (``plan.tp: 12 does not divide
model.num_attention_heads (96)``). Each object's own checks are its ``problems()`` method."""

from __future__ import annotations

from collections.abc import Callable

from simdist.errors import Problem
from simdist.spec.cluster import ClusterSpec
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan
from simdist.spec.stages import layout_model_problems

# the expert and data-with-context groups of a stage (simdist.spec.groups) are walked rank by
# rank: a 2**45-node cluster with experts ran the fuzz test out of memory there
MAX_GROUP_RANKS = 2**20


def check_consistency(model: ModelSpec, cluster: ClusterSpec, plan: ParallelPlan,
                      dp_given: bool = True, own: tuple[Problem, ...] | None = None) -> list[Problem]:
    """Every problem of the three objects, alone and together. ``dp_given``: the file wrote
    plan.dp (else it was derived from the world size, and a mismatch is tp's fault). ``own``:
    the model's and the cluster's own problems when the caller has them (a search checks many
    plans against one model and cluster)."""
    if own is None:
        own = own_problems(model, cluster)
    out = [*own, *(Problem(f"plan.{p.field}", p.message) for p in plan.problems())]

    def add(f: str, msg: str) -> None:
        out.append(Problem(f, msg))

    _tensor_parallel(model, plan, add)
    chunks = plan.pp * (2 if plan.schedule == "dualpipev" else plan.virtual_pipeline_stages)
    if plan.pipeline_layout is not None:
        for msg in layout_model_problems(plan.pipeline_layout, model.num_layers, model.mtp_layers):
            add("plan.pipeline_layout", msg)
    elif chunks > model.num_layers:
        what = "2*pp (dualpipev: two stages per rank)" if plan.schedule == "dualpipev" else "pp*virtual_pipeline_stages"
        add("plan.pp", f"{what} = {chunks} is more than model.num_layers ({model.num_layers})")
    if model.seq_length % plan.cp:
        add("plan.cp", f"{plan.cp} does not divide model.seq_length ({model.seq_length})")
    elif plan.cp > 1 and plan.cp_method == "ulysses" and (model.num_attention_heads // plan.tp) % plan.cp:
        add("plan.cp", f"ulysses splits the attention heads: {plan.cp} does not divide the "
            f"{model.num_attention_heads // plan.tp} heads per tensor-parallel rank")
    world = cluster.world_size
    if plan.world_size != world:
        if dp_given:
            add("plan.dp", f"tp*pp*cp*dp = {plan.world_size} but the cluster has {world} GPUs")
        else:
            add("plan.tp", f"tp*pp*cp = {plan.model_parallel_size} does not divide the cluster's {world} GPUs")
    if plan.precision == "fp8" and "fp8" not in cluster.gpu.peak_flops:
        add("plan.precision", f"fp8 needs FP8 tensor cores, which {cluster.gpu.name} does not have")
    else:
        try:
            cluster.gpu.peak(plan.precision)
        except KeyError:  # a GPU mapping whose peak_tflops leaves out the plan's precision
            add("cluster.gpu.peak_tflops", f"has no peak for plan.precision {plan.precision} "
                f"(it gives {', '.join(sorted(cluster.gpu.peak_flops))})")
    if plan.uses_parameter_servers and (plan.parameter_servers or 0) > world:
        add("plan.parameter_servers", f"{plan.parameter_servers} servers is more than the {world} GPUs")
    _experts(model, plan, add)
    if plan.world_size == world and (model.is_moe or plan.cp > 1) and world // plan.pp > MAX_GROUP_RANKS:
        add("cluster.num_nodes", f"{world:,} GPUs in {plan.pp} pipeline stage(s): with experts or context "
            f"parallelism simdist models at most {MAX_GROUP_RANKS:,} GPUs per stage (their groups are "
            "walked rank by rank); Llama 3 405B trained on up to 16K H100 (Dubey et al. 2024, "
            "arXiv:2407.21783, section 3.3)")
    return out


def own_problems(model: ModelSpec, cluster: ClusterSpec) -> tuple[Problem, ...]:
    """The model's and the cluster's own problems, named as :func:`check_consistency` names them."""
    return tuple(Problem(f"{where}.{p.field}", p.message)
                 for where, obj in (("model", model), ("cluster", cluster)) for p in obj.problems())


def _tensor_parallel(model: ModelSpec, plan: ParallelPlan, add: Callable[[str, str], None]) -> None:
    tp = plan.tp
    if model.num_attention_heads % tp:
        add("plan.tp", f"{tp} does not divide model.num_attention_heads ({model.num_attention_heads})")
    elif model.num_kv_heads % tp and tp % model.num_kv_heads:
        # more TP ranks than KV heads replicate each KV head over tp / kv_heads ranks (Megatron-Core)
        add("plan.tp", f"{tp} and model.num_kv_heads ({model.num_kv_heads}): neither divides the other")
    if model.ffn_hidden_size % tp:
        add("plan.tp", f"{tp} does not divide model.ffn_hidden_size ({model.ffn_hidden_size})")
    if model.vocab_size < tp:
        add("plan.tp", f"{tp} is more than model.vocab_size ({model.vocab_size}): the vocabulary is "
            "split over the tensor-parallel ranks")


def _experts(model: ModelSpec, plan: ParallelPlan, add: Callable[[str, str], None]) -> None:
    """Megatron-Core's expert layout: the experts of a layer are split over ``ep`` ranks, each
    expert's FFN over ``etp`` ranks (core/transformer/moe: num_moe_experts % ep == 0)."""
    for name in ("ep", "etp"):
        if getattr(plan, name) > 1 and not model.is_moe:
            add(f"plan.{name}", "needs a mixture-of-experts model (model.num_experts > 1)")
    if not model.is_moe:
        return
    if model.num_experts % plan.ep:
        add("plan.ep", f"{plan.ep} does not divide model.num_experts ({model.num_experts})")
    if model.moe_ffn_hidden_size % plan.etp:
        add("plan.etp", f"{plan.etp} does not divide model.moe_ffn_hidden_size ({model.moe_ffn_hidden_size})")
