"""Failures, checkpoints and goodput (simdist.reliability, `simdist goodput`), against the
formulas (simdist/validate/data/breadth.csv BR-E37, BR-E38) and published fleet figures."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from conftest import REPO, base_scenario, run_cli

from simdist.analytic.params import total_params
from simdist.errors import ScenarioError
from simdist.predict import predict
from simdist.reliability import (
    checkpoint_bytes,
    daly_interval,
    expected_goodput,
    goodput,
    job_mtbf,
    young_interval,
)
from simdist.spec.scenario import load_scenario, scenario_from_dict

HOUR, DAY = 3600.0, 86400.0

# Published figures, as data (source, value, tolerance of the comparison)
LLAMA3 = {  # Dubey et al. 2024 (arXiv:2407.21783) sec 3.3.4 / Table 5; breadth.csv BR-E01, BR-E02, BR-E03
    "gpus": 16384, "days": 54, "interruptions": 466, "unexpected": 419, "effective_training_time_min": 0.90,
}
BLOOM = {  # BigScience tr11 chronicles (breadth.csv BR-E24): "2.3TB checkpoint size and 40 secs to save"
    "params": 176e9, "checkpoint_bytes": 2.3e12, "save_s": 40.0, "tolerance": 0.10,
}
OPT = {  # metaseq OPT-175B logbook (breadth.csv BR-E20): "1.6TB of a single model checkpoint"
    "checkpoint_bytes": 1.6e12, "tolerance": 0.10,
}


def rel_scenario(**rel):
    d = base_scenario(global_batch_size=64)
    d["reliability"] = {"gpu_mtbf": "50000 h", "checkpoint_bandwidth": "20 GB/s", **rel}
    return scenario_from_dict(d)


def test_job_mtbf_is_gpu_mtbf_over_gpus():
    assert job_mtbf(50000 * HOUR, 8) == pytest.approx(6250 * HOUR)


def test_young_and_daly_formulas():
    c, m = 60.0, 10 * HOUR
    assert young_interval(c, m) == pytest.approx(math.sqrt(2 * c * m))
    x = c / (2 * m)
    assert daly_interval(c, m) == pytest.approx(math.sqrt(2 * c * m) * (1 + math.sqrt(x) / 3 + x / 9) - c)
    assert daly_interval(3 * HOUR, HOUR) == HOUR  # C >= 2M: checkpoint every MTBF


def test_daly_interval_is_near_the_true_optimum_of_the_goodput_model():
    c, m, r = 120.0, 3 * HOUR, 600.0
    taus = [10 * 1.01**i for i in range(900)]
    best = max(taus, key=lambda t: expected_goodput(t, c, m, r))
    assert daly_interval(c, m) == pytest.approx(best, rel=0.02)


def test_goodput_first_order_form():
    """For C, R, tau << M: goodput ~ (1 - C/tau)(1 - (R + tau/2)/M)."""
    c, m, r, tau = 10.0, 100 * HOUR, 300.0, 900.0
    approx = (1 - c / (tau + c)) * (1 - (r + (tau + c) / 2) / m)
    assert expected_goodput(tau, c, m, r) == pytest.approx(approx, rel=1e-3)


@pytest.mark.parametrize("mtbf", [1e20, 1e300, 3.6e294])  # 3.6e294 s: "1e+291 h", a fuzz case
def test_goodput_with_a_vanishing_failure_rate_is_the_checkpoint_overhead_alone(mtbf):
    """With failures vanishingly rare, Daly's goodput is tau / (tau + C): e^-a rounds to 1 there,
    where log1p(-e^-a) was a math domain error."""
    tau, c, r = 3600.0, 60.0, 600.0
    assert expected_goodput(tau, c, mtbf, r) == pytest.approx(tau / (tau + c), rel=1e-9)


def test_auto_interval_is_youngs_where_it_applies():
    """C = 17 GiB / 20 GB/s ~ 0.9 s << M = 6250 h: the chosen interval (whole steps) is
    sqrt(2 C M) within a step and 1 %."""
    sc = rel_scenario()
    p = predict(sc, engine="analytic")
    g = p.extras["goodput"]
    c = checkpoint_bytes(sc.model, sc.plan) / 20e9
    m = 50000 * HOUR / 8
    assert g["checkpoint_write_s"] == pytest.approx(c)
    assert g["job_mtbf_s"] == pytest.approx(m)
    assert abs(g["checkpoint_interval_s"] - math.sqrt(2 * c * m)) <= max(p.step_time_s, 0.01 * math.sqrt(2 * c * m))
    assert set(g) >= {"checkpoint_gib", "checkpoint_write_s", "checkpoint_interval_s", "job_mtbf_s",
                      "expected_goodput", "time_to_train_days"}
    assert g["time_to_train_days"] is None  # no train_tokens


def test_checkpoint_is_params_master_and_optimizer_states():
    sc = rel_scenario()
    assert checkpoint_bytes(sc.model, sc.plan) == pytest.approx(14 * total_params(sc.model))  # 2 + 4 + 8
    sgd = scenario_from_dict({**base_scenario(optimizer="sgd")})
    assert checkpoint_bytes(sgd.model, sgd.plan) == pytest.approx(10 * total_params(sgd.model))


def test_fixed_interval_and_time_to_train():
    sc = rel_scenario(checkpoint_interval="30 min", train_tokens=1e11, restart_time="5 min")
    p = predict(sc, engine="analytic")
    g = p.extras["goodput"]
    assert abs(g["checkpoint_interval_s"] - 1800) <= p.step_time_s
    assert g["time_to_train_days"] == pytest.approx(1e11 / p.tokens_per_s / g["expected_goodput"] / DAY)


def test_async_checkpoint_blocks_only_for_the_copy_to_host():
    sync = predict(rel_scenario(checkpoint_bandwidth="1 GB/s"), engine="analytic").extras["goodput"]
    asyn = predict(rel_scenario(checkpoint_bandwidth="1 GB/s", async_checkpoint=True), engine="analytic").extras["goodput"]
    assert asyn["checkpoint_blocking_s"] < sync["checkpoint_blocking_s"] / 10
    assert asyn["checkpoint_interval_s"] >= asyn["checkpoint_write_s"]  # one write in flight at a time
    assert asyn["expected_goodput"] > sync["expected_goodput"]


# --- published fleet figures -----------------------------------------------------------------


def test_llama3_interruptions_give_a_per_gpu_mtbf_and_goodput_above_90_percent():
    """466 interruptions in 54 days on 16,384 GPUs: per-GPU MTBF = 54 d x 16384 / 466 = 45,600 h.
    With it, the 405B scenario (2 TB/s checkpoint storage, 10 min restart: assumed) must clear
    the paper's '> 90 % effective training time'."""
    per_gpu = LLAMA3["days"] * DAY * LLAMA3["gpus"] / LLAMA3["interruptions"]
    assert per_gpu / HOUR == pytest.approx(45_567, rel=1e-3)
    assert LLAMA3["days"] * DAY / job_mtbf(per_gpu, LLAMA3["gpus"]) == pytest.approx(466)
    sc = load_scenario(REPO / "scenarios" / "llama3.1-405b-16384xh100.yaml")
    from dataclasses import replace

    sc = replace(sc, reliability=replace(sc.reliability, gpu_mtbf_s=per_gpu))
    g = predict(sc, engine="analytic", keep_spans=False).extras["goodput"]
    assert g["job_mtbf_s"] / HOUR == pytest.approx(54 * 24 / 466, rel=1e-6)  # 2.78 h
    assert g["expected_goodput"] > LLAMA3["effective_training_time_min"]


def test_bloom_checkpoint_size_and_save_time():
    """BLOOM-176B: 2.3 TB in 40 s. The size follows from 14 B per parameter within 10 %; at the
    implied 57.5 GB/s the save time follows from the size."""
    sc = scenario_from_dict({
        "name": "bloom", "model": {"num_layers": 70, "hidden_size": 14336, "num_attention_heads": 112,
                                   "vocab_size": 250880, "seq_length": 2048, "position_embedding": "alibi",
                                   "tie_embeddings": True},
        "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 48},
        "plan": {"tp": 4, "pp": 12, "global_batch_size": 2048},
        "reliability": {"gpu_mtbf": "64500 h", "checkpoint_bandwidth": "57.5 GB/s"},
    })
    assert total_params(sc.model) == pytest.approx(BLOOM["params"], rel=0.01)
    size = checkpoint_bytes(sc.model, sc.plan)
    assert size == pytest.approx(BLOOM["checkpoint_bytes"], rel=BLOOM["tolerance"])
    g = goodput(sc, step_time_s=100.0, tokens_per_s=2048 * 2048 / 100.0)
    assert g.checkpoint_write_s == pytest.approx(BLOOM["save_s"], rel=BLOOM["tolerance"])


def test_opt175b_checkpoint_without_master_weights():
    """OPT-175B kept fp16 weights and fp32 Adam states (Zhang et al. 2022 sec 2.4): 10 B/param."""
    sc = scenario_from_dict({"name": "opt", "model": {"preset": "gpt3-175b"},
                             "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 124},
                             "plan": {"tp": 8, "global_batch_size": 992, "precision": "fp16"}})
    size = checkpoint_bytes(sc.model, sc.plan, fp32_master=False)
    assert size == pytest.approx(OPT["checkpoint_bytes"], rel=OPT["tolerance"])


# --- CLI and validation -----------------------------------------------------------------------------


def test_goodput_cli_table_and_html(tmp_path):
    out = tmp_path / "g.html"
    r = run_cli("goodput", "scenarios/llama3.1-405b-16384xh100.yaml", "--html", str(out))
    assert r.returncode == 0, r.stderr
    assert "goodput" in r.stdout and "<- chosen" in r.stdout and "Daly" in r.stdout
    assert out.is_file() and "plotly" in out.read_text()[:5000].lower()
    r = run_cli("goodput", "scenarios/llama3.1-405b-16384xh100.yaml", "--json")
    d = json.loads(r.stdout)
    gs = [row["goodput"] for row in d["rows"]]
    assert max(gs) == pytest.approx(d["goodput"]["expected_goodput"], abs=2e-3)


def test_goodput_cli_without_reliability_exits_2():
    r = run_cli("goodput", "scenarios/llama3-8b-fsdp-8xh100.yaml")
    assert r.returncode == 2 and "reliability" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize(("rel", "field"), [
    ({"gpu_mtbf": 50000}, "reliability.gpu_mtbf"),
    ({"checkpoint_bandwidth": "fast"}, "reliability.checkpoint_bandwidth"),
    ({"checkpoint_interval": "0 s"}, "reliability.checkpoint_interval"),
    ({"async_checkpoint": "yes"}, "reliability.async_checkpoint"),
    ({"train_tokens": -5}, "reliability.train_tokens"),
    ({"restart": "10 min"}, "reliability.restart"),
])
def test_bad_reliability_fields_are_named(rel, field):
    d = base_scenario()
    d["reliability"] = {"gpu_mtbf": "50000 h", "checkpoint_bandwidth": "20 GB/s", **rel}
    with pytest.raises(ScenarioError) as exc:
        scenario_from_dict(d)
    assert field in {p.field for p in exc.value.problems}, exc.value


def test_bad_reliability_exits_2_from_the_cli(tmp_path):
    d = base_scenario()
    d["reliability"] = {"gpu_mtbf": "50000 h"}  # checkpoint_bandwidth missing
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(d))
    r = run_cli("predict", str(f), "--engine", "analytic")
    assert r.returncode == 2 and "reliability.checkpoint_bandwidth" in r.stderr


def test_breadth_validation_runs_and_reports_every_row():
    from simdist.validate import breadth_table, run_breadth

    results = run_breadth()
    ids = {r.row_id for r in results}
    assert {"BR-A23", "BR-A26", "BR-D01", "BR-D16", "BR-D44", "BR-D51", "BR-E24", "BR-E02", "BR-E03"} <= ids
    assert all(math.isfinite(r.predicted) and r.predicted > 0 for r in results)
    by = {r.row_id: r for r in results}
    assert abs(by["BR-A23"].error) < 0.15  # ZeRO-3 + CPU offload, 175B on 256 A100
    assert abs(by["BR-E24"].error) < 0.10  # BLOOM checkpoint size
    assert by["BR-E03"].error == 0  # goodput clears Llama 3's 90 %
    assert "mean |error|" in breadth_table(results)
