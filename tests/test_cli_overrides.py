"""`--set KEY=VALUE` on the scenario commands, and a Hugging Face config given as the scenario."""

import json
from pathlib import Path

import pytest
import yaml
from conftest import DATA

from simdist.cli import main
from simdist.errors import ScenarioError
from simdist.spec.overrides import (
    apply_sets,
    is_hf_config,
    load_scenario_with,
    parse_sets,
    write_merged,
)

GPT3 = "scenarios/gpt3-175b-1024xa100.yaml"


def test_set_changes_fields_and_is_checked_like_the_file():
    sc = load_scenario_with(GPT3, ["plan.tp=4", "cluster.num_nodes=64"])
    assert sc.plan.tp == 4 and sc.cluster.num_nodes == 64 and sc.world_size == 512
    assert sc.plan.dp == 512 // (4 * sc.plan.pp)  # dp is derived again from the new sizes
    with pytest.raises(ScenarioError) as e:
        load_scenario_with(GPT3, ["plan.tp=12"])
    assert "plan.tp" in [p.field for p in e.value.problems]
    with pytest.raises(ScenarioError) as e:
        load_scenario_with(GPT3, ["cluster.num_nodes=many"])
    assert e.value.problems[0].field == "cluster.num_nodes"


def test_set_values_are_yaml_scalars_and_the_last_one_wins():
    sets = parse_sets(["plan.tp=8", "plan.sp=true", "name='4'", "cluster.inter_node.bandwidth=100 Gb/s",
                       "plan.tp=2"])
    assert sets[0][1] == 8 and sets[1][1] is True and sets[2][1] == "4" and sets[3][1] == "100 Gb/s"
    out = apply_sets({"plan": {"tp": 1}}, sets)
    assert out["plan"] == {"tp": 2, "sp": True} and out["cluster"]["inter_node"]["bandwidth"] == "100 Gb/s"


@pytest.mark.parametrize("item, words", [("plan.tp", "KEY=VALUE"), ("=4", "KEY=VALUE"), ("plan..tp=4", "KEY=VALUE"),
                                         ("tp=4", "starts at one of"), ("plan.tp=[1, 2]", "one value")])
def test_bad_set_items_name_the_flag(item, words):
    with pytest.raises(ScenarioError) as e:
        parse_sets([item])
    assert e.value.problems[0].field == "--set" and words in e.value.problems[0].message


def test_set_inside_a_value_that_is_not_a_mapping_names_it():
    with pytest.raises(ScenarioError) as e:
        apply_sets({"model": {"preset": "x"}}, parse_sets(["model.preset.x=1"]))
    assert e.value.problems[0].field == "model.preset"


def test_predict_search_trace_goodput_take_set(capsys, tmp_path):
    assert main(["predict", GPT3, "--engine", "analytic", "--json", "--no-store", "--set", "plan.tp=4",
                 "--set", "cluster.num_nodes=64"]) == 0
    assert json.loads(capsys.readouterr().out)["world_size"] == 512
    assert main(["predict", GPT3, "--no-store", "--set", "plan.tp=12"]) == 2
    assert "plan.tp:" in capsys.readouterr().err
    out = tmp_path / "t.json"
    assert main(["trace", "scenarios/llama3-8b-fsdp-8xh100.yaml", "-o", str(out), "--set", "plan.micro_batch_size=1"]) == 0
    assert out.is_file()
    assert main(["search", "scenarios/llama3-8b-fsdp-8xh100.yaml", "--set", "plan.tp=3", "--no-progress"]) == 2
    assert "plan.tp" in capsys.readouterr().err
    assert main(["goodput", "scenarios/llama3.1-405b-16384xh100.yaml", "--json",
                 "--set", "reliability.gpu_mtbf=1000 h"]) == 0


def test_merged_file_for_the_executor_keeps_relative_paths(tmp_path):
    src = tmp_path / "s.yaml"
    (tmp_path / "config.json").write_text((DATA / "hf" / "llama3-8b.json").read_text())
    src.write_text(yaml.safe_dump({"name": "s", "model": {"hf_config": "config.json", "num_layers": 2},
                                   "cluster": {"preset": "dgx-h100", "num_nodes": 1},
                                   "plan": {"global_batch_size": 8}}))
    out = write_merged(src, ["plan.tp=8"], directory=tmp_path / "..")
    try:
        data = yaml.safe_load(out.read_text())
        assert data["plan"]["tp"] == 8 and Path(data["model"]["hf_config"]).is_absolute()
        assert load_scenario_with(out).plan.tp == 8
    finally:
        out.unlink()


def test_hf_config_as_scenario_says_how_to_use_it(capsys):
    path = str(DATA / "hf" / "llama3-8b.json")
    assert is_hf_config(json.loads(Path(path).read_text()))
    assert main(["predict", path, "--no-store"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model: {hf_config: llama3-8b.json}" in err[0] and "unknown field" not in err[0]


def test_hf_config_with_cluster_from_set_predicts(capsys):
    path = str(DATA / "hf" / "llama3-8b.json")
    assert main(["predict", path, "--engine", "analytic", "--json", "--no-store",
                 "--set", "cluster.preset=dgx-h100", "--set", "cluster.num_nodes=1", "--set", "plan.tp=8",
                 "--set", "plan.global_batch_size=64"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["world_size"] == 8 and d["name"] == "llama3-8b"


def test_run_takes_set_and_checks_it_before_launch(capsys):
    assert main(["run", "scenarios/tiny-3d.yaml", "--nproc", "8", "--set", "plan.tp=3", "--no-store"]) == 2
    assert "plan.tp" in capsys.readouterr().err
    assert main(["run", "scenarios/tiny-3d.yaml", "--print-launch", "--set", "plan.seed=7", "--no-store"]) == 2
    assert "plan.seed: unknown field" in capsys.readouterr().err
    assert main(["run", "scenarios/tiny-3d.yaml", "--print-launch", "--set", "name=renamed", "--no-store"]) == 0
    cap = capsys.readouterr()
    merged = Path(cap.err.split("--set applied is ")[1].strip())
    try:
        assert "torchrun" in cap.out and str(merged) in cap.out
        assert yaml.safe_load(merged.read_text())["name"] == "renamed"
    finally:
        merged.unlink()
