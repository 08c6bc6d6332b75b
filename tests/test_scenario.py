"""Scenario loading and validation (docs/scenario-format.md: presets + overrides, units, bad input)."""

import json

import pytest
from conftest import DATA, base_scenario, run_cli

from simdist.analytic.params import total_params
from simdist.errors import ScenarioError
from simdist.spec.plan import rank_coord, rank_of
from simdist.spec.scenario import load_scenario, scenario_from_dict


def problems(d, base_dir=".") -> list[str]:
    with pytest.raises(ScenarioError) as exc:
        scenario_from_dict(d, base_dir)
    return [str(p) for p in exc.value.problems]


def test_preset_with_overrides_fields_win():
    d = base_scenario()
    d["model"]["seq_length"] = 4096
    d["cluster"]["intra_node"] = {"bandwidth": "600 GB/s"}
    sc = scenario_from_dict(d)
    assert sc.model.seq_length == 4096 and sc.model.hidden_size == 2048
    assert sc.cluster.intra_node.bandwidth_bytes_per_s == 600e9
    assert sc.cluster.intra_node.kind == "nvswitch"  # kept from the preset
    assert sc.plan.dp == 8  # derived: 8 GPUs / (tp*pp*cp)


def test_gpu_as_mapping_like_a_catalog_gpu():
    """Issue 15 item 8: a custom GPU takes the efficiencies (and unstated figures) of the catalog
    GPU it names with like:, never silent defaults."""
    d = base_scenario()
    d["cluster"]["gpu"] = {"name": "my-gpu", "like": "h100-sxm", "memory": "96 GiB", "memory_bandwidth": "3 TB/s",
                           "peak_tflops": {"bf16": 500, "fp32": 50}, "efficiency": {"attention": 0.5}}
    gpu = scenario_from_dict(d).cluster.gpu
    assert gpu.memory_bytes == 96 * 2**30 and gpu.peak("bf16") == 500e12
    assert "fp8" not in gpu.peak_flops  # a stated peak table replaces the like GPU's whole
    h100 = scenario_from_dict({**base_scenario(), "cluster": {"preset": "dgx-h100", "num_nodes": 1}}).cluster.gpu
    assert gpu.efficiency == {**h100.efficiency, "attention": 0.5} and gpu.sms == h100.sms


def test_gpu_as_mapping_without_like_states_its_efficiencies():
    d = base_scenario()
    gpu = {"name": "my-gpu", "memory": "96 GiB", "memory_bandwidth": "3 TB/s", "peak_tflops": {"bf16": 500}}
    d["cluster"]["gpu"] = gpu
    assert any(m.startswith("cluster.gpu.efficiency: is required for a GPU given as a mapping") for m in problems(d))
    d["cluster"]["gpu"] = {**gpu, "sms": 100, "efficiency": {"gemm": 0.6}}
    assert any(m.startswith("cluster.gpu.efficiency: needs attention, memory") for m in problems(d))
    d["cluster"]["gpu"] = {**gpu, "sms": 100, "efficiency": {"gemm": 0.6, "attention": 0.4, "memory": 0.8}}
    assert scenario_from_dict(d).cluster.gpu.efficiency["gemm"] == 0.6


def test_contract_bad_inputs_each_named():
    d = base_scenario(tp=3, micro_batch_size=0)
    d["cluster"]["inter_node"] = {"bandwidth": 200}
    d["model"]["preset"] = "nope"
    msgs = problems(d)
    assert any(m.startswith("model.preset: unknown model preset 'nope'") for m in msgs)
    assert any(m.startswith("cluster.inter_node.bandwidth: 200 has no unit") for m in msgs)
    assert any(m.startswith("plan.micro_batch_size: must be a positive whole number") for m in msgs)


def test_tp_must_divide_heads_and_world_size():
    msgs = problems(base_scenario(tp=5))
    assert "plan.tp: tp*pp*cp = 5 does not divide the cluster's 8 GPUs" in msgs
    assert "plan.tp: 5 does not divide model.num_attention_heads (16)" in msgs


def test_dp_given_must_match():
    assert any(m.startswith("plan.dp: tp*pp*cp*dp = 16 but the cluster has 8 GPUs")
               for m in problems(base_scenario(dp=16)))


def test_batch_must_split_into_microbatches():
    assert "plan.global_batch_size: 60 is not a multiple of micro_batch_size*dp = 1*8 = 8" in problems(
        {**base_scenario(), "plan": {"global_batch_size": 60}})


def test_missing_sections_and_unknown_fields():
    msgs = problems({"name": "x", "model": {"preset": "gpt3-1.3b"}, "plan": {"global_batch_size": 8}, "extra": 1})
    assert "cluster: is required and must be a mapping" in msgs and any(m.startswith("extra: unknown") for m in msgs)


def test_interleaved_needs_microbatches_multiple_of_pp():
    d = base_scenario(pp=4, virtual_pipeline_stages=2, global_batch_size=6)
    d["cluster"]["num_nodes"] = 3
    assert any("multiple of pp" in m for m in problems(d))


def test_fp8_needs_fp8_gpu():
    assert any(m.startswith("plan.precision: fp8 needs FP8") for m in problems(base_scenario(precision="fp8")))


def test_hash_stable_and_sensitive(tmp_path):
    a = scenario_from_dict(base_scenario())
    b = scenario_from_dict({**base_scenario(), "name": "other"})
    c = scenario_from_dict(base_scenario(micro_batch_size=2))
    assert a.hash() == b.hash() != c.hash()


def test_hash_kept_per_object_equals_a_fresh_one():
    """The content hash is worked out once per scenario and kept (predict reports it every call);
    a changed copy and a pickled round trip answer the hash of their own fields."""
    import copy
    import pickle

    a = scenario_from_dict(base_scenario())
    first = a.hash()
    assert a.hash() is first  # kept, not worked out again
    assert a._content_hash() == first == scenario_from_dict(base_scenario()).hash()
    changed = a.with_plan(micro_batch_size=2)
    assert changed.hash() == scenario_from_dict(base_scenario(micro_batch_size=2)).hash() != first
    assert pickle.loads(pickle.dumps(a)).hash() == copy.deepcopy(a).hash() == first
    assert a.kept("hash", lambda sc: "other") == first  # the kept value answers


@pytest.mark.parametrize(
    ("config", "params", "expect"),
    [("llama3-8b.json", 8.03e9, {"num_kv_heads": 8, "mlp": "swiglu", "norm": "rmsnorm"}),
     ("mistral-7b.json", 7.24e9, {"num_kv_heads": 8}),
     ("mixtral-8x7b.json", 46.7e9, {"num_experts": 8, "experts_per_token": 2}),
     ("gpt2-xl.json", 1.558e9, {"mlp": "gelu", "tie_embeddings": True, "ffn_hidden_size": 6400}),
     ("pythia-1.4b.json", 1.4146e9, {"position_embedding": "rope", "bias": True})],
)
def test_hf_config_import(tmp_path, config, params, expect):
    (tmp_path / "c.json").write_text((DATA / "hf" / config).read_text())
    d = base_scenario()
    d["model"] = {"hf_config": "c.json", "seq_length": 2048}
    d["plan"]["global_batch_size"] = 8
    sc = scenario_from_dict(d, tmp_path)
    for k, v in expect.items():
        assert getattr(sc.model, k) == v, k
    assert total_params(sc.model) == pytest.approx(params, rel=0.01)


def test_hf_unsupported_architecture_named(tmp_path):
    (tmp_path / "c.json").write_text((DATA / "hf" / "unknown.json").read_text())
    d = base_scenario()
    d["model"] = {"hf_config": "c.json"}
    msgs = problems(d, tmp_path)
    assert any(m.startswith("model.hf_config.model_type: t5 is not a supported architecture") for m in msgs)


def test_rank_grid_tp_innermost():
    sc = scenario_from_dict({**base_scenario(tp=2, pp=2), "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 2}})
    plan = sc.plan
    assert plan.dp == 4
    coords = [rank_coord(r, plan) for r in range(16)]
    assert coords[1] == (0, 0, 0, 1) and coords[2] == (0, 1, 0, 0) and coords[4] == (1, 0, 0, 0)
    assert all(rank_of(c, plan) == r for r, c in enumerate(coords))


@pytest.mark.parametrize(
    ("plan_fields", "expected"),
    [({"tp": 3}, "plan.tp: 3 does not divide model.num_attention_heads (16)"),
     ({"pp": 0}, "plan.pp: must be a positive whole number, got 0"),
     ({"schedule": "magic"}, "plan.schedule: 'magic' is not one of gpipe, 1f1b, interleaved-1f1b, zero-bubble")],
)
def test_cli_bad_input_exit_2_field_named_no_traceback(tmp_path, plan_fields, expected):
    import yaml

    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(base_scenario(**plan_fields)))
    r = run_cli("predict", str(f))
    assert r.returncode == 2
    assert expected in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_cli_missing_file_and_bad_yaml(tmp_path):
    r = run_cli("predict", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2 and "file:" in r.stderr and "Traceback" not in r.stderr
    f = tmp_path / "x.yaml"
    f.write_text("name: [unclosed")
    r = run_cli("predict", str(f))
    assert r.returncode == 2 and "not valid YAML" in r.stderr
    assert r.stderr.count("\n") == 1 and f"{f}:2:1:" in r.stderr  # one line: file, line, column


def test_load_scenario_from_file(tmp_path):
    import yaml

    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(base_scenario()))
    sc = load_scenario(f)
    assert sc.source_path == str(f) and json.dumps(sc.to_dict(), default=str)
