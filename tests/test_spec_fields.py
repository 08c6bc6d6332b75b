"""The spec dataclasses describe their own fields (simdist/spec/fields.py): one parser and one
validator read type, Literal choices, YAML key, unit and range from them."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from conftest import REPO, SCENARIOS, base_scenario

from simdist.errors import Collector, ScenarioError
from simdist.spec.cluster import ClusterSpec, GpuSpec, HostSpec, LinkSpec
from simdist.spec.fields import field_problems, spec_fields
from simdist.spec.model import ModelSpec
from simdist.spec.parse import parse_fields
from simdist.spec.plan import SCHEDULES, GradCompression, Offload, ParallelPlan
from simdist.spec.reliability import Reliability
from simdist.spec.scenario import load_scenario, scenario_from_dict

SPECS = (ModelSpec, ParallelPlan, Offload, GradCompression, ClusterSpec, GpuSpec, LinkSpec, HostSpec, Reliability)
DOC = (REPO / "docs" / "scenario-format.md").read_text(encoding="utf-8")


def problems(d) -> list[str]:
    with pytest.raises(ScenarioError) as exc:
        scenario_from_dict(d)
    return [str(p) for p in exc.value.problems]


@pytest.mark.parametrize("cls", SPECS, ids=lambda c: c.__name__)
def test_every_field_is_documented_in_code_and_in_the_field_reference(cls):
    for fs in spec_fields(cls):
        assert fs.meta.get("doc"), f"{cls.__name__}.{fs.name} has no doc"
        if fs.key:
            word = re.escape(fs.key.split(".")[-1])
            assert re.search(rf"`[^`\n]*\b{word}\b[^`\n]*`", DOC), f"{fs.key} missing from the docs"


def test_literal_types_are_the_allowed_values():
    """The message lists exactly the Literal's values (here the schedules, v1.2 included)."""
    msgs = problems(base_scenario(schedule="magic"))
    assert f"plan.schedule: 'magic' is not one of {', '.join(SCHEDULES)}" in msgs
    assert "dualpipev" in SCHEDULES


@pytest.mark.parametrize(("plan", "expected"), [
    ({"tp": "2"}, "plan.tp: must be a positive whole number, got '2'"),
    ({"tp": True}, "plan.tp: must be a positive whole number, got True"),
    ({"zero_stage": True}, "plan.zero_stage: True is not one of 0, 1, 2, 3"),
    ({"zero_stage": 1.0}, "plan.zero_stage: 1.0 is not one of 0, 1, 2, 3"),
    ({"sequence_parallel": "yes"}, "plan.sequence_parallel: must be true or false, got 'yes'"),
    ({"dp": None}, "plan.dp: must be a positive whole number, got null"),
    ({"ddp_bucket_size": 25}, "plan.ddp_bucket_size: 25 has no unit"),
    ({"grad_compression": {"ratio": 0.1}}, "plan.grad_compression.method: is required"),
    ({"grad_compression": {"method": "topk", "ratio": 1.5}}, "plan.grad_compression.ratio: must be a fraction in (0, 1], got 1.5"),
    ({"global_batch_siz": 8}, "plan.global_batch_siz: unknown field; did you mean global_batch_size?"),
])
def test_type_unit_and_range_messages_name_the_field(plan, expected):
    msgs = problems(base_scenario(**plan))
    assert any(m.startswith(expected) for m in msgs), msgs


def test_yaml_keys_differ_from_attributes_where_the_metadata_says():
    sc = scenario_from_dict(base_scenario(ddp_bucket_size="50 MiB"))
    assert sc.plan.ddp_bucket_size_bytes == 50 * 2**20
    assert sc.cluster.nics_per_node == 8  # read from cluster.inter_node.nics_per_node
    assert "ddp_bucket_size_bytes" in {m.split(":")[0].split(".")[-1] for m in problems(
        base_scenario(ddp_bucket_size_bytes=1))}


@pytest.mark.parametrize(("cls", "kwargs", "field"), [
    (ParallelPlan, {"global_batch_size": 8, "tp": 0}, "tp"),
    (ParallelPlan, {"global_batch_size": 8, "schedule": "magic"}, "schedule"),
    (ModelSpec, {"num_layers": 2, "hidden_size": 8, "num_attention_heads": 2, "vocab_size": 8, "seq_length": 4,
                 "moe_load_imbalance": float("nan")}, "moe_load_imbalance"),
    (GradCompression, {"ratio": 0.0}, "ratio"),
    (LinkSpec, {"kind": "infiniband", "bandwidth_bytes_per_s": float("inf"), "latency_s": 0.0}, "bandwidth"),
])
def test_specs_built_in_code_are_held_to_the_same_rules(cls, kwargs, field):
    with pytest.raises(ScenarioError) as exc:
        cls(**kwargs)
    assert [p.field for p in exc.value.problems] == [field]


def test_field_problems_pass_every_bundled_scenario():
    for path in SCENARIOS:
        sc = load_scenario(path)
        for obj in (sc.model, sc.plan, sc.cluster, sc.cluster.gpu, sc.cluster.intra_node):
            assert field_problems(obj) == [], (path.name, obj)


def test_parse_fields_reports_every_problem_of_a_section_at_once():
    c = Collector("plan")
    parse_fields(ParallelPlan, {"tp": 0, "pp": "x", "bogus": 1, "offload": {"params": "disk"}}, c)
    assert sorted(p.field for p in c.problems) == ["plan.bogus", "plan.global_batch_size", "plan.offload.params",
                                                   "plan.pp", "plan.tp"]


def test_a_v11_scenario_keeps_its_hash_and_a_v12_field_changes_it():
    """Fields newer than contract 1.1 count in the hash only when set: stored measurements of
    older files still match (tests/test_golden.py records every bundled scenario's hash)."""
    plain = scenario_from_dict(base_scenario())
    assert scenario_from_dict(base_scenario(cp_method="ring")).hash() == plain.hash()  # the default, written
    assert scenario_from_dict(base_scenario(cp_method="ulysses")).hash() != plain.hash()
    assert dataclasses.replace(plain.plan, framework="megatron") != plain.plan


def test_docs_name_only_files_inside_the_repository():
    for path in [*Path(REPO / "simdist" / "spec").glob("*.py"), *Path(REPO / "simdist" / "io").glob("*.py"),
                 REPO / "docs" / "scenario-format.md"]:
        text = path.read_text(encoding="utf-8")
        assert "shared/" not in text and "CONTRACT" not in text, path
