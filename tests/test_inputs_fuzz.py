"""Property: whatever a user or an attacker writes, ``scenario_from_dict`` returns a Scenario or
raises ScenarioError whose every problem names a field on one line; never another exception
(issue 20). Mutations of every bundled scenario: wrong types, non-finite and huge numbers,
malformed units, missing and unknown keys, known keys with hostile values; and mutations of
the YAML text itself. The default run keeps hypothesis's example count; ``-m slow`` runs more."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import SCENARIOS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simdist.errors import ScenarioError
from simdist.io.text import parse_yaml
from simdist.spec.cluster import ClusterSpec, GpuSpec, LinkSpec
from simdist.spec.fields import field_problems, yaml_keys
from simdist.spec.model import ModelSpec
from simdist.spec.plan import ParallelPlan
from simdist.spec.reliability import Reliability
from simdist.spec.scenario import Scenario, scenario_from_dict
from simdist.units import short_repr

BUNDLED = [(p, yaml.safe_load(p.read_text(encoding="utf-8"))) for p in SCENARIOS]
TOP = {"name", "description", "model", "cluster", "plan", "reliability", "file"}
KNOWN = {"model": [*yaml_keys(ModelSpec), "preset", "hf_config"],
         "cluster": [k.split(".")[0] for k in yaml_keys(ClusterSpec)] + ["preset"],
         "plan": [*yaml_keys(ParallelPlan), "deepspeed_config"],
         "reliability": yaml_keys(Reliability),
         "cluster.gpu": [*yaml_keys(GpuSpec), "like"],
         "cluster.intra_node": yaml_keys(LinkSpec),
         "cluster.inter_node": [*yaml_keys(LinkSpec), "nics_per_node"]}

HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 64), st.integers(2**53, 2**80), st.just(10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e308, -0.0, 0.5, 1.5]),
    st.text(max_size=10),
    st.sampled_from(["1e400 GB/s", "３００ GB/s", "300", "GB/s", "-5 GB/s", "nan GB/s", "80 GiB", "5 us", "1 B",
                     "2e9 params/s", "auto", "none", "cpu", "mla", "dualpipev", "a100-80gb", "h100-sxm", "tiny",
                     "gpt3-175b", "dgx-h100", "ring", "ulysses", "delayed", "megatron", "/dev/zero", "..",
                     "x" * 500]),
    st.lists(st.integers(-2, 9), max_size=3),
    st.dictionaries(st.sampled_from(["kind", "bandwidth", "gemm", "like", "name", "method", "x"]),
                    st.one_of(st.integers(-1, 9), st.text(max_size=6), st.floats()), max_size=3),
)


def _mappings(d: Any, path: tuple = ()) -> list[tuple]:
    out = [path] if isinstance(d, dict) else []
    if isinstance(d, dict):
        for k, v in d.items():
            out += _mappings(v, (*path, k))
    return out


def _at(d: dict, path: tuple) -> Any:
    for k in path:
        d = d[k]
    return d


@st.composite
def mutated(draw) -> tuple[Path, Any]:
    path, data = draw(st.sampled_from(BUNDLED))
    d = copy.deepcopy(data)
    for _ in range(draw(st.integers(1, 4))):
        if not isinstance(d, dict):
            break
        where = draw(st.sampled_from(_mappings(d)))
        target = _at(d, where)
        keys = list(target) + KNOWN.get(".".join(map(str, where)), []) + ["bogus", 7]
        key = draw(st.sampled_from(keys))
        op = draw(st.sampled_from(["set", "set", "set", "delete", "replace-section"]))
        if op == "delete":
            target.pop(key, None)
        elif op == "replace-section" and where:
            _at(d, where[:-1])[where[-1]] = draw(HOSTILE)
        else:
            target[key] = draw(HOSTILE)
    if draw(st.integers(0, 20)) == 0:
        d = draw(HOSTILE)  # the whole document
    return path, d


def check(d: Any, base_dir: Path) -> None:
    try:
        sc = scenario_from_dict(d, base_dir)
    except ScenarioError as exc:
        assert exc.problems
        for p in exc.problems:
            assert isinstance(p.field, str) and p.field, p
            # a known section, or an unknown top-level key (shown cut to 60 characters)
            assert p.field.split(".")[0] in TOP or not isinstance(d, dict) or any(
                p.field == short_repr(k, 60) or p.field == str(k)[:60] for k in d), p
            assert "\n" not in p.message and len(p.message) < 600, p
        return
    assert isinstance(sc, Scenario)
    for obj in (sc.model, sc.plan, sc.cluster, sc.cluster.gpu):
        assert field_problems(obj) == []


FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@FUZZ
@given(mutated())
def test_mutated_scenarios_parse_or_name_a_field(case):
    path, d = case
    check(d, path.parent)


@FUZZ
@given(st.data())
def test_mutated_yaml_text_parses_or_names_a_field(data):
    path, _ = data.draw(st.sampled_from(BUNDLED))
    text = path.read_text(encoding="utf-8")
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(text)))
        j = data.draw(st.integers(i, min(len(text), i + 20)))
        text = text[:i] + data.draw(st.sampled_from(["", ":", "- ", "&a ", "*a", "[", "{", "\t", "\x00", "\n  ",
                                                     "!!binary ", "? ", "<<: ", "'", "1e999", "９"])) + text[j:]
    try:
        d = parse_yaml(text, path.name)
    except ScenarioError as exc:
        assert [p.field for p in exc.problems] == ["file"]
        return
    check(d, path.parent)


@pytest.mark.slow
@settings(FUZZ, max_examples=2000)
@given(mutated())
def test_mutated_scenarios_many_more(case):
    path, d = case
    check(d, path.parent)
