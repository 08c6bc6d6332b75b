"""Published rows -> scenarios (simdist.validate.mapping) and plan.framework's defaults
(simdist.spec.frameworks): what a row leaves unstated takes the framework's documented default,
and a field the scenario writes always wins."""

import csv

import pytest

from simdist.spec.scenario import scenario_from_dict
from simdist.validate.mapping import candidates, row_to_scenario_dict, unsupported
from simdist.validate.rows import packaged_data_dir

with open(packaged_data_dir() / "training_runs.csv", encoding="utf-8", newline="") as _fh:
    ROWS = {r["run_id"]: r for r in csv.DictReader(_fh)}


def sc(run_id):
    row = ROWS[run_id]
    assert unsupported(row) == []
    return scenario_from_dict(row_to_scenario_dict(row, candidates(row, row_to_scenario_dict(row))[0]))


def test_torchtitan_rows_take_torchtitan_defaults():
    s = sc("R0145")  # 8B FSDP, seq length unstated: torchtitan's llama3_8b config, 8192
    assert s.model.seq_length == 8192 and s.plan.framework == "torchtitan"
    assert s.plan.zero_stage == 3 and s.plan.recompute == "selective" and s.plan.global_batch_size == 16
    assert s.cluster.gpu.name == "h100-sxm-96gb" and s.cluster.inter_node.kind == "roce"
    long = sc("R0148")  # local batch 1, no global batch: 1 x dp 8 (no gradient accumulation)
    assert long.model.seq_length == 32768 and long.plan.global_batch_size == 8
    assert long.plan.precision == "fp8" and long.plan.fp8_recipe is None  # torchtitan's own default applies
    pp = sc("R0157")  # local batch 32 split into pp = 8 micro-batches of 4
    assert pp.plan.micro_batch_size == 4 and pp.plan.global_batch_size == 256 and pp.plan.schedule == "1f1b"
    inter = sc("R0158")  # interleaved: torchtitan's default of two stages per rank
    assert inter.plan.virtual_pipeline_stages == 2 and inter.plan.schedule == "interleaved-1f1b"
    assert sc("R0156").plan.tp_comm_overlap and not sc("R0155").plan.tp_comm_overlap  # AsyncTP
    assert sc("R0155").plan.sequence_parallel  # torchtitan's TP plan always shards the norms


def test_nemo_rows_take_the_performance_recipe_defaults():
    s = sc("R0103")  # Llama 3 70B FP8, tp4 pp8 vpp5
    p = s.plan
    assert (p.framework, p.zero_stage, p.overlap_grad_reduce, p.overlap_param_gather) == ("nemo", 1, True, True)
    assert p.sequence_parallel and p.tp_comm_overlap and p.fp32_grad_accumulation
    assert p.precision == "fp8" and p.fp8_recipe is None and p.virtual_pipeline_stages == 5
    cs = sc("R0124")  # FP8-CS on Megatron-FSDP
    assert cs.plan.fp8_recipe == "tensorwise" and cs.plan.zero_stage == 3
    assert not cs.plan.sequence_parallel  # tp = 1
    llama2 = sc("R0080")  # LLAMA2-7B named only: its config's dimensions
    assert (llama2.model.num_layers, llama2.model.ffn_hidden_size, llama2.model.vocab_size) == (32, 11008, 32000)
    assert llama2.plan.micro_batch_size == 1  # NeMo's recipes; never tuned per row
    assert candidates(ROWS["R0080"], row_to_scenario_dict(ROWS["R0080"])) == [{}]


def test_llama3_405b_rows():
    s = sc("R0059")
    assert s.plan.global_batch_size == 2048  # 16M tokens of 8,192
    assert (s.plan.tp, s.plan.pp, s.plan.dp, s.plan.zero_stage) == (8, 16, 64, 2)
    assert s.cluster.spine_oversubscription == 7 and s.cluster.nodes_per_leaf == 384


@pytest.mark.parametrize(("given", "field", "value"), [
    ({}, "zero_stage", 1), ({"zero_stage": 0}, "zero_stage", 0),
    ({"tp": 2}, "sequence_parallel", True), ({"tp": 2, "sequence_parallel": False}, "sequence_parallel", False),
    ({}, "overlap_grad_reduce", True),
])
def test_nemo_framework_fills_only_unset_fields(given, field, value):
    plan = {"framework": "nemo", "global_batch_size": 64, **given}
    s = scenario_from_dict({"name": "t", "model": {"preset": "llama3-8b"},
                            "cluster": {"preset": "dgx-h100", "num_nodes": 1}, "plan": plan})
    assert getattr(s.plan, field) == value


def test_megatron_framework_is_megatron_lm_argument_defaults():
    base = {"name": "t", "model": {"preset": "gpt3-1.3b"}, "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1}}
    meg = scenario_from_dict({**base, "plan": {"framework": "megatron", "global_batch_size": 64}}).plan
    none = scenario_from_dict({**base, "plan": {"global_batch_size": 64}}).plan
    assert not meg.overlap_grad_reduce and none.overlap_grad_reduce  # --overlap-grad-reduce is opt-in
    assert meg.fp32_grad_accumulation and not none.fp32_grad_accumulation  # bf16 forces fp32 main grads
    ds = scenario_from_dict({**base, "plan": {"framework": "deepspeed", "zero_stage": 3, "global_batch_size": 64}})
    assert ds.plan.zero3_fetch == "module"


def test_megatron_core_weak_scaling_rows_untie_the_embeddings_their_counts_imply():
    """Megatron-Core's weak-scaling table (README @f2e5db40) states 1.7B .. 462B: the parameter
    counts of models whose output layer is apart from the input embedding, not tied."""
    from simdist.analytic.params import total_params

    for rid in ("R0048", "R0049", "R0052", "R0056"):
        s = sc(rid)
        assert not s.model.tie_embeddings, rid
        stated = float(ROWS[rid]["params_b"]) * 1e9
        untied = total_params(s.model)
        tied = untied - s.model.vocab_size * s.model.hidden_size
        assert abs(untied - stated) < abs(tied - stated), rid  # the tied count is 1-13% short
        assert abs(untied / stated - 1) < 0.04, rid  # the table rounds (1.75B -> 1.7B)
    assert sc("R0001").model.tie_embeddings  # SC'21's GPT (Megatron-LM 2021): tied, untouched
    # the table's percentage of peak over its TFLOP/s is H100 SXM's dense BF16 peak (989 TFLOP/s),
    # not FP8's twice that: BF16, as mapped
    r = ROWS["R0048"]
    assert abs(float(r["measured_tflops_per_gpu"]) / (float(r["measured_mfu"].rstrip("%")) / 100) - 989) < 15
    assert sc("R0048").plan.precision == "bf16"
