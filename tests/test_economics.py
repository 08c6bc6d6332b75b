"""Cost and energy: the catalog's prices and board powers, the formulas, predict and search."""

import json

import pytest
import yaml
from conftest import base_scenario

from simdist.cli import main
from simdist.economics import parse_tokens, run_cost, utilisation
from simdist.errors import ScenarioError
from simdist.predict import predict
from simdist.spec.scenario import load_scenario, scenario_from_dict

GPT3 = "scenarios/gpt3-175b-1024xa100.yaml"


def test_catalog_prices_and_powers_reach_the_scenario_and_a_scenario_overrides_them():
    sc = load_scenario(GPT3)  # dgx-a100-80gb
    assert sc.cluster.usd_per_gpu_hour == pytest.approx(1.99) and sc.cluster.gpu.board_power_w == 400
    d = base_scenario()
    d["cluster"]["usd_per_gpu_hour"] = 1.25
    assert scenario_from_dict(d).cluster.usd_per_gpu_hour == 1.25
    d["cluster"]["usd_per_gpu_hour"] = -1
    with pytest.raises(ScenarioError) as e:
        scenario_from_dict(d)
    assert e.value.problems[0].field == "cluster.usd_per_gpu_hour"


def test_price_and_power_leave_the_scenario_hash_alone():
    d = base_scenario()
    h = scenario_from_dict(d).hash()
    d["cluster"]["usd_per_gpu_hour"] = 9.0
    d["cluster"]["gpu"] = {"name": "a100-80gb", "like": "a100-80gb", "board_power_w": 123}
    assert scenario_from_dict(d).hash() == h


def test_cost_and_energy_follow_the_stated_formulas():
    sc = load_scenario(GPT3)
    pred = predict(sc, engine="analytic", keep_spans=False)
    c = run_cost(sc, pred, tokens=300e9)
    n, t = pred.world_size, pred.step_time_s
    busy = sum(pred.breakdown_s.get(k, 0.0) for k in ("compute", "recompute", "optimizer", "compression"))
    assert 0 < c.utilisation < 1 and c.utilisation == pytest.approx(busy / t)
    assert c.usd_per_step == pytest.approx(n * t / 3600 * 1.99)
    assert c.energy_kwh_per_step == pytest.approx(n * 400 * busy / 3.6e6)
    tokens_per_step = sc.plan.global_batch_size * sc.model.seq_length
    assert c.steps_to_tokens == pytest.approx(300e9 / tokens_per_step)
    assert c.usd_to_tokens == pytest.approx(c.usd_per_step * c.steps_to_tokens)
    assert c.energy_mwh_to_tokens == pytest.approx(c.energy_kwh_per_step * c.steps_to_tokens / 1000)


def test_no_price_no_dollars():
    d = base_scenario()
    d["cluster"]["preset"] = "dgx-a100-40gb"  # no list price in the catalog
    sc = scenario_from_dict(d)
    c = run_cost(sc, predict(sc, engine="analytic", keep_spans=False), tokens=1e9)
    assert c.usd_per_step is None and c.usd_to_tokens is None and c.energy_kwh_per_step > 0


def test_utilisation_counts_only_the_gpus_own_kernels():
    assert utilisation({"compute": 6.0, "dp_comm": 2.0, "bubble": 2.0}, 10.0) == pytest.approx(0.6)
    assert utilisation({"compute": 6.0, "optimizer": 1.0, "compression": 1.0, "bubble": 2.0}, 10.0) == pytest.approx(0.8)


@pytest.mark.parametrize("text, value", [("300e9", 300e9), ("300B", 300e9), ("15T", 15e12), ("2,000,000", 2e6),
                                         ("1.5k", 1500.0)])
def test_token_counts(text, value):
    assert parse_tokens(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["", "-5", "lots", "1e30", "5X"])
def test_bad_token_counts_name_the_flag(text):
    with pytest.raises(ScenarioError) as e:
        parse_tokens(text)
    assert e.value.problems[0].field == "--tokens"


def test_predict_json_adds_cost_and_keeps_every_other_key(capsys):
    assert main(["predict", GPT3, "--engine", "analytic", "--json", "--no-store"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(["predict", GPT3, "--engine", "analytic", "--json", "--no-store", "--tokens", "300B"]) == 0
    d = json.loads(capsys.readouterr().out)
    sc = load_scenario(GPT3)
    assert {k: v for k, v in d.items() if k != "cost"} == predict(sc, engine="analytic", keep_spans=False).to_dict()
    assert plain["cost"]["tokens"] is None and d["cost"]["tokens"] == 300e9 and d["cost"]["usd_to_tokens"] > 0
    assert main(["predict", GPT3, "--engine", "analytic", "--no-store", "--tokens", "300B"]) == 0
    out = capsys.readouterr().out
    assert "per step" in out and "GPU-hours" in out and "kWh per step" in out and "to 3e+11 tokens" in out
    assert main(["predict", GPT3, "--no-store", "--tokens", "many"]) == 2


def test_search_ranks_by_cost_and_shows_dollars(capsys):
    args = ["search", "scenarios/llama3-8b-fsdp-8xh100.yaml", "--top", "3", "--no-progress", "--engine", "analytic",
            "--zero-stages", "3", "--schedules", "1f1b", "--workers", "1"]
    assert main([*args, "--rank-by", "cost", "--tokens", "1T", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    cost = d["cost"]
    assert cost["rank_by"] == "cost" and cost["usd_per_gpu_hour"] == pytest.approx(3.24)
    dollars = [p["usd_per_step"] for p in cost["plans"]]
    assert dollars == sorted(dollars) and len(dollars) == 3
    for plan, row in zip(d["plans"], cost["plans"], strict=True):
        assert row["usd_per_step"] == pytest.approx(8 * plan["step_time_s"] / 3600 * 3.24)
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "$ per step" in out and "invalid grid points, by reason:" in out
    assert main([*args, "--rank-by", "cost", "--set", "cluster.preset=dgx-a100-40gb"]) == 2
    assert "--rank-by" in capsys.readouterr().err


def test_dashboard_shows_the_cost_of_a_step(tmp_path, monkeypatch):
    pytest.importorskip("streamlit")
    from conftest import REPO
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("SIMDIST_DB", str(tmp_path / "runs.db"))
    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=120)
    at.run()
    assert not at.exception, at.exception
    shown = next(m for m in at.metric if m.label == "Cost per step")
    assert shown.value.startswith("$") and "kWh per step" in (shown.help or "")



def test_an_absurd_but_finite_step_has_a_finite_cost_and_an_overflowing_run_names_the_input(tmp_path, capsys):
    """A GPU of 1e-300 TFLOP/s (a fuzz case: DeepSeek-V3 on 1,024 GPUs) gives a step of ~1e304 s,
    which the prediction accepts: its energy (GPUs x power x utilisation x time) is finite, though
    the product's first factors once overflowed to Infinity; a run to 1e15 tokens at that pace is
    past any float, refused naming the input behind it."""
    d = {"name": "t", "model": {"preset": "deepseek-v3"},
         "cluster": {"preset": "dgx-h100", "num_nodes": 128,
                     "gpu": {"name": "g", "like": "h100-sxm", "peak_tflops": {"bf16": 1e-300}}},
         "plan": {"tp": 2, "pp": 8, "virtual_pipeline_stages": 4, "schedule": "interleaved-1f1b", "ep": 64,
                  "sequence_parallel": True, "zero_stage": 1, "global_batch_size": 8192, "precision": "bf16"}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(d))  # 1.0e-300 (YAML reads JSON's 1e-300 as a string)
    assert main(["predict", str(path), "--json", "--no-store", "--engine", "analytic"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["step_time_s"] > 1e300 and 1e300 < out["cost"]["energy_kwh_per_step"] < float("inf")
    sc = scenario_from_dict(d)
    with pytest.raises(ScenarioError) as err:
        run_cost(sc, predict(sc, engine="analytic"), tokens=1e15)
    (problem,) = err.value.problems
    assert problem.field == "cluster.gpu.peak_tflops.bf16" and "not a finite number" in problem.message
