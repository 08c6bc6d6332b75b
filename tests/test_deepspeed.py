"""DeepSpeed configs (plan.deepspeed_config) and `simdist import` of DeepSpeed and Accelerate
configs (fixtures in tests/data/deepspeed)."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import DATA, run_cli

from simdist.errors import Collector, ScenarioError
from simdist.io.deepspeed import plan_fields
from simdist.spec.scenario import load_scenario, scenario_from_dict

DS = DATA / "deepspeed"


def scenario(cfg: str, nodes: int = 1, **plan):
    return scenario_from_dict({"name": "t", "model": {"preset": "llama2-7b"},
                               "cluster": {"preset": "dgx-a100-80gb", "num_nodes": nodes},
                               "plan": {"deepspeed_config": cfg, **plan}}, base_dir=DS)


def test_zero3_offload_with_auto_batch():
    """train_batch_size "auto" = micro 4 x accumulation 8 x dp 8 = 256, as DeepSpeed derives it."""
    p = scenario("ds_zero3_offload_auto.json").plan
    assert (p.zero_stage, p.offload.optimizer, p.offload.params) == (3, "cpu", "cpu")
    assert (p.precision, p.optimizer, p.zero3_fetch) == ("bf16", "adamw", "module")
    assert (p.micro_batch_size, p.global_batch_size, p.num_microbatches) == (4, 256, 8)
    assert p.overlap_grad_reduce is True


def test_auto_batch_follows_the_cluster():
    p = scenario("ds_zero3_offload_auto.json", nodes=4).plan
    assert p.global_batch_size == 4 * 8 * 32


def test_explicit_plan_fields_win():
    p = scenario("ds_zero3_offload_auto.json", zero_stage=2, offload="none", micro_batch_size=2,
                 global_batch_size=64).plan
    assert (p.zero_stage, p.offload.any, p.micro_batch_size, p.global_batch_size) == (2, False, 2, 64)


def test_contradictory_and_unknown_keys_are_named():
    with pytest.raises(ScenarioError) as exc:
        scenario("ds_contradiction.json")
    msgs = {str(p) for p in exc.value.problems}
    assert "plan.deepspeed_config.train_batch_size: 512 != micro 4 * accumulation 8 * dp 8" in msgs
    assert any(m.startswith("plan.deepspeed_config.zero_optimization.stagee:") for m in msgs)
    assert len(msgs) == 2  # nothing reported twice or as a knock-on


def test_bucket_sizes_are_elements_and_zero2_offload():
    """reduce_bucket_size 5e8 elements of 16-bit gradients = 1e9 bytes; train_batch_size 256 with
    accumulation 4 over dp 8: micro = 256 / (4 x 8) = 8."""
    p = scenario("ds_zero2_buckets.json").plan
    assert p.ddp_bucket_size_bytes == 1e9
    assert (p.zero_stage, p.micro_batch_size, p.global_batch_size) == (2, 8, 256)
    assert p.offload.optimizer == "cpu" and p.overlap_param_gather is False


def test_zeropp_keys():
    """hpZ is a secondary weight partition (contract 1.2 zero_hpz_partition_size), not HSDP:
    the optimizer states and gradients stay sharded over all of dp (issue 15 item 7)."""
    p = scenario("ds_zeropp.json", nodes=2).plan
    assert (p.zero_hpz_partition_size, p.dp_shard, p.dp) == (8, 16, 16)
    assert (p.zero_quantized_weights, p.grad_compression.method) == (True, "int8")
    assert p.global_batch_size == 16  # micro 1 x accumulation 1 x dp 16


@pytest.mark.parametrize(("cfg", "field"), [
    ({"bf16": {"enabled": True}, "fp16": {"enabled": True}}, "fp16.enabled"),
    ({"zero_optimization": {"stage": 4}}, "zero_optimization.stage"),
    ({"zero_optimization": {"offload_optimizer": {"device": "gpu"}}}, "zero_optimization.offload_optimizer.device"),
    ({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}, "zero_optimization.offload_param"),
    ({"train_micro_batch_size_per_gpu": 0}, "train_micro_batch_size_per_gpu"),
    ({"optimizer": {"type": "OneBitAdam"}}, "optimizer.type"),
    ({"train_batch_size": 100, "gradient_accumulation_steps": 3}, "train_batch_size"),
    ({"bogus": 1}, "bogus"),
])
def test_bad_values_are_named(cfg, field):
    c = Collector("plan.deepspeed_config")
    plan_fields(cfg, {}, scenario("ds_zeropp.json").world_size, c)
    assert f"plan.deepspeed_config.{field}" in {p.field for p in c.problems}, c.problems


def test_missing_config_file_is_named():
    with pytest.raises(ScenarioError) as exc:
        scenario("nope.json", global_batch_size=8)
    assert any(p.field == "plan.deepspeed_config" and "does not exist" in p.message for p in exc.value.problems)


def test_contradiction_exits_2_from_the_cli(tmp_path):
    (tmp_path / "ds.json").write_text((DS / "ds_contradiction.json").read_text())
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({
        "name": "t", "model": {"preset": "llama2-7b"}, "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1},
        "plan": {"deepspeed_config": "ds.json"}}))
    r = run_cli("predict", str(tmp_path / "s.yaml"), "--engine", "analytic")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "plan.deepspeed_config.train_batch_size: 512 != micro 4 * accumulation 8 * dp 8" in r.stderr


# --- simdist import ------------------------------------------------------------------------------


def test_import_deepspeed_writes_a_scenario_that_loads(tmp_path):
    out = tmp_path / "imported.yaml"
    r = run_cli("import", str(DS / "ds_zero3_offload_auto.json"), "--model", "llama2-7b",
                "--cluster", "dgx-a100-80gb", "--nodes", "2", "--out", str(out))
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert text.startswith("# Imported by `simdist import`") and "batch: 512 sequences" in text
    sc = load_scenario(out)
    p = sc.plan
    assert (sc.world_size, p.zero_stage, p.offload.params, p.global_batch_size) == (16, 3, "cpu", 512)
    r = run_cli("predict", str(out), "--json", "--engine", "analytic")
    assert r.returncode == 0 and "offload" in json.loads(r.stdout)["breakdown_s"]


def test_import_accelerate_hybrid_shard_with_offload(tmp_path):
    out = tmp_path / "acc.yaml"
    r = run_cli("import", str(DS / "accelerate_fsdp_hybrid.yaml"), "--model", "llama2-7b",
                "--cluster", "dgx-a100-80gb", "--global-batch-size", "64", "--out", str(out))
    assert r.returncode == 0, r.stderr
    p = load_scenario(out).plan
    assert (p.dp, p.dp_shard, p.zero_stage) == (16, 8, 3)  # 2 machines x 8 processes, sharded per node
    assert (p.offload.optimizer, p.offload.params, p.recompute, p.precision) == ("cpu", "cpu", "full", "bf16")
    assert p.global_batch_size == 64


@pytest.mark.parametrize(("strategy", "zero", "shard"), [
    ("FULL_SHARD", 3, 16), ("SHARD_GRAD_OP", 2, 16), ("NO_SHARD", 0, 16), ("HYBRID_SHARD_ZERO2", 2, 8), (2, 2, 16),
])
def test_import_accelerate_strategies(tmp_path, strategy, zero, shard):
    from simdist.spec.imported import import_config

    cfg = tmp_path / "a.yaml"
    cfg.write_text(yaml.safe_dump({"distributed_type": "FSDP", "num_machines": 2, "num_processes": 16,
                                   "mixed_precision": "fp16",
                                   "fsdp_config": {"fsdp_sharding_strategy": strategy}}))
    d, _ = import_config(cfg, "llama2-7b", "dgx-a100-80gb")
    assert (d["plan"]["zero_stage"], d["plan"].get("dp_shard", d["plan"]["dp"])) == (zero, shard)
    assert d["plan"]["precision"] == "fp16"


def test_import_bad_strategy_exits_2():
    r = run_cli("import", str(DS / "accelerate_bad_strategy.yaml"), "--model", "llama2-7b",
                "--cluster", "dgx-a100-80gb")
    assert r.returncode == 2 and "fsdp_sharding_strategy" in r.stderr and "Traceback" not in r.stderr


def test_import_accelerate_deepspeed_config_file_keeps_its_batch(tmp_path):
    from simdist.spec.imported import import_config

    cfg = tmp_path / "acc.yaml"
    cfg.write_text(yaml.safe_dump({"distributed_type": "DEEPSPEED", "num_machines": 1, "num_processes": 8,
                                   "deepspeed_config": {"deepspeed_config_file": str(DS / "ds_zero2_buckets.json")}}))
    d, _ = import_config(cfg, "llama2-7b", "dgx-a100-80gb")
    p = d["plan"]
    assert (p["global_batch_size"], p["micro_batch_size"], p["zero_stage"]) == (256, 8, 2)  # from the file
    assert p["ddp_bucket_size"] == "1000000000 B" and p["offload"]["optimizer"] == "cpu"


def test_activation_checkpointing_means_full_recompute_and_its_options_are_listed_as_ignored():
    sc = scenario("ds_activation_checkpointing.json")
    assert sc.plan.recompute == "full"
    assert scenario("ds_zero3_offload_auto.json").plan.recompute != "full"  # no section: the plan's default
    assert scenario("ds_activation_checkpointing.json", recompute="selective").plan.recompute == "selective"
    (note,) = sc.notes
    for key in ("activation_checkpointing.partition_activations", "activation_checkpointing.cpu_checkpointing",
                "activation_checkpointing.profile", "scheduler", "zero_optimization.stage3_max_live_parameters"):
        assert key in note
    assert "zero_optimization.stage," not in note and "bf16" not in note


def test_every_ignored_key_is_listed():
    from simdist.io.deepspeed import ignored_keys

    cfg = json.loads((DS / "ds_zero3_offload_auto.json").read_text())
    assert ignored_keys(cfg) == [
        "gradient_clipping", "optimizer.params", "zero_optimization.offload_optimizer.pin_memory",
        "zero_optimization.offload_param.pin_memory", "zero_optimization.contiguous_gradients",
        "zero_optimization.stage3_prefetch_bucket_size", "zero_optimization.stage3_param_persistence_threshold",
        "zero_optimization.stage3_gather_16bit_weights_on_model_save", "steps_per_print", "wall_clock_breakdown"]


def test_unknown_activation_checkpointing_key_is_named():
    c = Collector()
    plan_fields({"activation_checkpointing": {"partition_activation": True}}, {}, 8, c)
    assert [p.field for p in c.problems] == ["activation_checkpointing.partition_activation"]


def test_ignored_keys_reach_predict_and_import(tmp_path):
    d = {"name": "t", "model": {"preset": "llama2-7b"}, "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1},
         "plan": {"deepspeed_config": str(DS / "ds_activation_checkpointing.json")}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(d))
    r = run_cli("predict", str(tmp_path / "s.yaml"), "--engine", "analytic", "--no-store")
    assert r.returncode == 0 and "note: plan.deepspeed_config: not simulated, ignored:" in r.stderr
    r = run_cli("import", str(DS / "ds_activation_checkpointing.json"), "--model", "llama2-7b",
                "--cluster", "dgx-a100-80gb", "--global-batch-size", "32")
    assert r.returncode == 0, r.stderr
    assert "# plan.deepspeed_config: not simulated, ignored: " in r.stdout and "recompute: full" in r.stdout
