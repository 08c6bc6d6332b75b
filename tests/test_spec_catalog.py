"""Catalog presets: every entry builds, and each model's figures give its published size."""

from __future__ import annotations

import pytest
from conftest import base_scenario
from param_count import total_params

from simdist import catalog
from simdist.spec.cluster import REQUIRED_EFFICIENCIES
from simdist.spec.scenario import scenario_from_dict

MOE = ("mixtral-8x7b", "mixtral-8x22b", "deepseek-v3", "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-20b",
       "gpt-oss-120b")


@pytest.mark.parametrize("name", list(catalog.models()))
def test_every_model_preset_builds(name):
    d = {**base_scenario(), "model": {"preset": name, "seq_length": 32}}
    d["cluster"] = {"preset": "dgx-h100", "num_nodes": 1}
    assert scenario_from_dict(d).model.name == name


@pytest.mark.parametrize("name", [n for n, e in catalog.models().items() if "published_params" in e])
def test_model_presets_give_their_published_parameter_count(name):
    """Counted independently (tests/param_count.py). The MoE presets' sources state totals to
    3-4 digits (671B, 30.5B, 116.83B): 0.5%; GPT-3's paper rounds its model names: 2.5%."""
    m = scenario_from_dict({**base_scenario(), "model": {"preset": name},
                            "cluster": {"preset": "dgx-h100", "num_nodes": 1}}).model
    published = float(catalog.models()[name]["published_params"])
    assert total_params(m) == pytest.approx(published, rel=0.005 if name in MOE else 0.025)


def test_moe_presets_carry_the_v12_fields():
    models = catalog.models()
    assert models["deepseek-v3"]["attention"] == "mla" and models["deepseek-v3"]["router"] == "sigmoid"
    assert all(models[n]["num_experts"] > 1 for n in MOE)
    assert models["gpt-oss-120b"]["sliding_window_layers"] == 18


@pytest.mark.parametrize("name", list(catalog.gpus()))
def test_catalog_gpus_state_their_efficiencies(name):
    assert set(REQUIRED_EFFICIENCIES) <= set(catalog.gpus()[name]["efficiency"])


@pytest.mark.parametrize("name", list(catalog.clusters()))
def test_every_cluster_preset_builds(name):
    sc = scenario_from_dict({**base_scenario(global_batch_size=16), "cluster": {"preset": name, "num_nodes": 1},
                             "model": {"preset": "tiny"}})
    assert sc.cluster.name == name and sc.requires_profile == (name == "local")
