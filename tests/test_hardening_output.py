"""Issue 20 item 3: `predict --json` never holds Infinity or NaN, and a prediction with an MFU
above 1, an infinite or non-positive step or non-finite memory is an error (exit 2) naming the
input behind it."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest
import yaml
from conftest import REPO, base_scenario

from simdist.cli import main
from simdist.errors import ScenarioError
from simdist.predict import check_prediction, predict
from simdist.spec.profile import PROFILE_VERSION, CalibrationProfile
from simdist.spec.scenario import load_scenario, scenario_from_dict
from simdist.spec.suspects import suspect


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def _strict(text: str) -> dict:
    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in the JSON")

    return json.loads(text, parse_constant=refuse)


def _write(tmp_path, d: dict) -> str:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(d))
    return str(path)


@pytest.mark.parametrize(("cluster", "field"), [
    ({"inter_node": {"bandwidth": "1e-300 GB/s"}}, "cluster.inter_node.bandwidth"),
    ({"inter_node": {"latency": "1e300 s"}}, "cluster.inter_node.latency"),
    ({"gpu": {"name": "g", "like": "a100-80gb", "memory_bandwidth": "1e-300 B/s"}}, "cluster.gpu.memory_bandwidth"),
    ({"gpu": {"name": "g", "like": "a100-80gb", "efficiency": {"gemm": 1e-300}}}, "cluster.gpu.efficiency.gemm"),
])
@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_an_absurd_input_is_named_not_printed_as_infinity(tmp_path, capsys, cluster, field, engine):
    d = base_scenario()
    d["cluster"] = {**d["cluster"], "num_nodes": 2, **cluster}
    rc, out, err = _cli(capsys, "predict", _write(tmp_path, d), "--json", "--no-store", "--engine", engine)
    assert rc == 2 and out == "", out
    assert err.startswith(f"error: {field}: "), err
    assert "Infinity" not in out + err and "Traceback" not in err


def _profile(tmp_path, eff: float) -> str:
    """A profile of an A100-like device whose fitted efficiencies are all ``eff``."""
    curve = [[1.0, eff], [1e15, eff]]
    profile = {"version": PROFILE_VERSION, "device": "gpu (test)", "peak_flops": 312e12,
               "memory_bandwidth_bytes_per_s": 2e12, "kernel_overhead_s": 1e-6,
               "compute_curves": {"gemm": curve, "attention": curve, "memory": curve}}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile))
    return str(path)


@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_a_step_time_that_is_not_a_number_is_named_before_the_goodput_reads_it(engine):
    """A GPU of 1e-300 TFLOP/s and a 2^40-token vocabulary make the step NaN (infinite compute
    beside infinite compute); the goodput's checkpoint interval (whole steps) used to fail on it
    with a bare ValueError (the slow fuzz test's case, 2026-11-29)."""
    d = yaml.safe_load((REPO / "scenarios" / "llama3.1-405b-16384xh100.yaml").read_text())
    d["model"]["vocab_size"] = 2**40
    d["cluster"]["gpu"] = {"name": "g", "like": "h100-sxm", "peak_tflops": {"bf16": 1e-300}}
    with pytest.raises(ScenarioError, match=r"cluster\.gpu\.peak_tflops\.bf16: .*a step time of nan s"):
        predict(scenario_from_dict(d), engine=engine)


def test_an_mfu_above_1_names_the_profile_efficiency_behind_it(tmp_path, capsys):
    scenario = str(REPO / "scenarios" / "llama2-7b-1xa100.yaml")
    rc, out, _ = _cli(capsys, "predict", scenario, "--json", "--no-store", "--profile", _profile(tmp_path, 0.5))
    assert rc == 0 and 0 < _strict(out)["mfu"] <= 1
    rc, out, err = _cli(capsys, "predict", scenario, "--json", "--no-store", "--profile", _profile(tmp_path, 4.0))
    assert rc == 2 and out == ""
    assert err.startswith("error: --profile.compute_curves.gemm.0: leads to an absurd prediction: an MFU of"), err


def test_a_zero_efficiency_in_a_profile_is_named_not_a_zero_division(tmp_path, capsys):
    rc, _, err = _cli(capsys, "predict", str(REPO / "scenarios" / "tiny-ddp.yaml"), "--no-store",
                      "--profile", _profile(tmp_path, 0.0))
    assert rc == 2 and err.startswith("error: --profile.compute_curves.gemm.0: "), err
    assert "Traceback" not in err


@pytest.mark.parametrize("path", sorted((REPO / "scenarios").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_bundled_prediction_passes_the_output_checks(path):
    sc = load_scenario(path)
    profile = CalibrationProfile(device="cpu (test)", peak_flops=1e11, memory_bandwidth_bytes_per_s=1e10) \
        if sc.requires_profile else None
    pred = predict(sc, profile=profile, engine="analytic", keep_spans=False)  # check_prediction ran inside
    json.dumps(pred.to_dict(), allow_nan=False)
    assert 0 < pred.mfu <= 1


@pytest.fixture(scope="module")
def sane():
    sc = scenario_from_dict(base_scenario())
    return sc, predict(sc, engine="analytic", keep_spans=False)


@pytest.mark.parametrize(("change", "says"), [
    ({"step_time_s": float("inf")}, "a step time of inf s"),
    ({"step_time_s": 0.0}, "a step time of 0.0 s"),
    ({"step_time_s": float("nan")}, "a step time of nan s"),
    ({"mfu": 1.06}, "an MFU of 1.06"),
    ({"mfu": 0.0}, "an MFU of 0"),
    ({"tokens_per_s": float("inf")}, "tokens_per_s is not a finite number"),
    ({"extras": {"goodput": {"expected_goodput": float("nan")}}}, "goodput.expected_goodput is not a finite number"),
])
def test_check_prediction_refuses_each_absurd_figure(sane, change, says):
    sc, pred = sane
    with pytest.raises(ScenarioError) as exc:
        check_prediction(replace(pred, **change), sc)
    (problem,) = exc.value.problems
    assert says in problem.message and problem.field.split(".")[0] in ("cluster", "plan", "model", "reliability")


def test_check_prediction_refuses_non_finite_memory_and_breakdown(sane):
    sc, pred = sane
    stages = (replace(pred.per_stage[0], activations_gib=float("inf")), *pred.per_stage[1:])
    with pytest.raises(ScenarioError, match="a memory figure that is not a finite size"):
        check_prediction(replace(pred, per_stage=stages), sc)
    with pytest.raises(ScenarioError, match=r"breakdown dp_comm = inf") as exc:
        check_prediction(replace(pred, breakdown_s={**pred.breakdown_s, "dp_comm": float("inf")}), sc)
    assert exc.value.problems[0].field.startswith(("cluster.", "plan."))


def test_the_suspect_is_the_input_furthest_from_typical_in_the_right_direction():
    d = base_scenario()
    d["cluster"]["intra_node"] = {"bandwidth": "1e-9 GB/s"}
    d["cluster"]["gpu"] = {"name": "g", "like": "a100-80gb", "peak_tflops": {"bf16": 1e15}}
    sc = scenario_from_dict(copy.deepcopy(d))
    assert suspect(sc, None, "links", "slow") == "cluster.intra_node.bandwidth"
    assert suspect(sc, None, "compute", "slow") != "cluster.gpu.peak_tflops.bf16"  # a huge peak is fast
    assert suspect(sc, None, "any", "any") == "cluster.gpu.peak_tflops.bf16"  # 1e15 TFLOP/s: furthest off
    profile = CalibrationProfile(device="x", peak_flops=1e11, compute_curves={"gemm": [(1e6, 1.4)]})
    assert suspect(sc, profile, "compute", "fast") == "--profile.compute_curves.gemm.0"
