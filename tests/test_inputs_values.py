"""Issue 20 item 2: values that used to pass validation and crash, hang or mislead later are
refused where they are read, each naming its field."""

from __future__ import annotations

import copy

import pytest
import yaml
from conftest import base_scenario, run_cli

from simdist.errors import ScenarioError
from simdist.spec.scenario import scenario_from_dict

GPU = {"name": "g", "like": "a100-80gb"}

# (section, patch, field, message start)
CASES = [
    ("cluster", {"gpu": {**GPU, "efficiency": {"gemm": 0}}}, "cluster.gpu.efficiency.gemm", "must be a fraction in (0, 1]"),
    ("cluster", {"gpu": {**GPU, "efficiency": {"gemm": -0.5}}}, "cluster.gpu.efficiency.gemm", "must be a fraction"),
    ("cluster", {"gpu": {**GPU, "efficiency": {"gemm": 1.5}}}, "cluster.gpu.efficiency.gemm", "must be a fraction"),
    ("cluster", {"gpu": {**GPU, "efficiency": 0.5}}, "cluster.gpu.efficiency", "must be a mapping, got 0.5"),
    ("cluster", {"gpu": {**GPU, "efficiency": {"tensor": 0.5}}}, "cluster.gpu.efficiency.tensor", "unknown key"),
    ("cluster", {"gpu": {**GPU, "sms": 0}}, "cluster.gpu.sms", "must be a positive whole number, got 0"),
    ("cluster", {"gpu": {**GPU, "sms": "many"}}, "cluster.gpu.sms", "must be a positive whole number, got 'many'"),
    ("cluster", {"gpu": {**GPU, "peak_tflops": {"bf16": float("nan")}}}, "cluster.gpu.peak_tflops.bf16", "must be a positive number, got nan"),
    ("cluster", {"gpu": {**GPU, "peak_tflops": {"bf16": 1e300}}}, "cluster.gpu.peak_tflops.bf16", "must be a positive number"),
    ("cluster", {"gpu": {**GPU, "peak_tflops": {"int8": 600}}}, "cluster.gpu.peak_tflops.int8", "unknown key"),
    ("cluster", {"gpu": {**GPU, "memory": "1e400 GiB"}}, "cluster.gpu.memory", "'1e400 GiB': the number is too large"),
    ("cluster", {"gpu": ["a100-80gb"]}, "cluster.gpu", "must be a catalog name"),
    ("cluster", {"spine_oversubscription": float("inf")}, "cluster.spine_oversubscription", "must be a finite number, got inf"),
    ("cluster", {"spine_oversubscription": 0.5}, "cluster.spine_oversubscription", "must be a number >= 1, got 0.5"),
    ("cluster", {"nodes_per_leaf": None}, "cluster.nodes_per_leaf", "must be a positive whole number, got null"),
    ("cluster", {"inter_node": "fast"}, "cluster.inter_node", "must be a mapping, got 'fast'"),
    ("cluster", {"inter_node": {"kind": "carrier-pigeon"}}, "cluster.inter_node.kind", "'carrier-pigeon' is not one of"),
    ("cluster", {"intra_node": {"kind": "ethernet"}}, "cluster.intra_node.kind", "ethernet is not a link of this kind"),
    ("cluster", {"intra_node": {"bandwidth": "３００ GB/s"}}, "cluster.intra_node.bandwidth", "'３００ GB/s' is not a bandwidth"),
    ("cluster", {"intra_node": {"bandwidth": "1e400 GB/s"}}, "cluster.intra_node.bandwidth", "'1e400 GB/s': the number is too large"),
    ("cluster", {"intra_node": {"latency": "-3 us"}}, "cluster.intra_node.latency", "'-3 us': a duration must be positive"),
    ("cluster", {"inter_node": {"nics_per_node": 0}}, "cluster.inter_node.nics_per_node", "must be a positive whole number"),
    ("cluster", {"num_nodes": 2**60}, "cluster.num_nodes", "1152921504606846976 is too large (the limit is 2^53)"),
    ("cluster", {"preset": ["dgx-h100"]}, "cluster.preset", "must be a cluster preset name"),
    ("model", {"name": ["x"]}, "model.name", "must be text, got ['x']"),
    ("model", {"preset": ["tiny"]}, "model.preset", "must be a model preset name, got ['tiny']"),
    ("model", {"num_layers": 10**400}, "model.num_layers", "a 1329-bit integer is too large"),
    ("model", {"num_layers": 2.0}, "model.num_layers", "must be a positive whole number, got 2.0"),
    ("model", {"hf_config": 5}, "model.hf_config", "must be a file path, got 5"),
    ("plan", {"deepspeed_config": ["x"]}, "plan.deepspeed_config", "must be a file path"),
    ("plan", {"offload": "cpu"}, "plan.offload", "must be a mapping, got 'cpu'"),
    ("plan", {1: 2}, "plan.1", "unknown field (field names are text)"),
    (None, {"reliability": [1]}, "reliability", "must be a mapping, got [1]"),
    (None, {"reliability": {"gpu_mtbf": "nan h", "checkpoint_bandwidth": "1 GB/s"}}, "reliability.gpu_mtbf", "'nan h' is not a duration"),
    (None, {"reliability": {"gpu_mtbf": "5 h", "checkpoint_bandwidth": "1 GB/s", "train_tokens": "lots"}},
     "reliability.train_tokens", "must be a number, got 'lots'"),
    (None, {"description": ["x"]}, "description", "must be text"),
    (None, {"name": "   "}, "name", "is required"),
]


@pytest.mark.parametrize(("section", "patch", "field", "start"), CASES, ids=[c[2] + ":" + c[3][:20] for c in CASES])
def test_refused_where_read(section, patch, field, start):
    d = copy.deepcopy(base_scenario())
    (d[section] if section else d).update(patch)
    with pytest.raises(ScenarioError) as exc:
        scenario_from_dict(d)
    assert any(p.field == field and p.message.startswith(start) for p in exc.value.problems), exc.value.problems


def test_vocab_smaller_than_tp_is_refused_and_a_tiny_vocab_is_handled():
    d = base_scenario(tp=2)
    d["model"] = {"preset": "gpt3-1.3b", "vocab_size": 1}
    with pytest.raises(ScenarioError) as exc:
        scenario_from_dict(d)
    assert [str(p) for p in exc.value.problems] == [
        "plan.tp: 2 is more than model.vocab_size (1): the vocabulary is split over the tensor-parallel ranks"]
    d["plan"]["tp"] = 1
    from simdist.predict import predict

    p = predict(scenario_from_dict(d), engine="analytic")
    assert 0 < p.step_time_s < float("inf") and 0 < p.mfu < 1


def test_every_problem_of_a_bad_file_in_one_run_from_the_cli(tmp_path):
    d = base_scenario(tp="two")
    d["cluster"]["gpu"] = {"name": "x", "like": "a100-80gb", "sms": 0}
    d["model"]["name"] = ["x"]
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(d))
    r = run_cli("predict", str(f), "--engine", "analytic")
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert sorted(line.split(":")[1].strip() for line in lines) == ["cluster.gpu.sms", "model.name", "plan.tp"]
