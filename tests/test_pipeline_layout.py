"""plan.pipeline_layout: Megatron-Core's --pipeline-model-parallel-layout, read, checked and
followed by both engines and the memory model (simdist.spec.stages)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import base_scenario

from simdist.analytic.activations import in_flight, layers_held
from simdist.analytic.memory import memory_per_stage
from simdist.analytic.params import layer_params, params_per_rank, stage_layers
from simdist.errors import ScenarioError
from simdist.predict import predict
from simdist.spec.scenario import load_scenario, scenario_from_dict
from simdist.spec.stages import parse_layout, stage_layer_ranges
from simdist.validate.moe_cp import moe_scenario
from simdist.validate.rows import packaged_data_dir, read_csv

ROOT = Path(__file__).resolve().parents[1]
DEEPSEEK = ROOT / "scenarios" / "deepseek-v3-1024xh100.yaml"
# Megatron-Bridge DEEPSEEK_V3_PRETRAIN_CONFIG_H100_V1 (PP8 VPP4): pp_layout
DS_LAYOUT = "Et|(tt|)*30mL"


def sc_of(layout: str | None = None, **plan):
    d = base_scenario(**plan)  # GPT-3 1.3B (24 layers) on 8 A100
    if layout is not None:
        d["plan"]["pipeline_layout"] = layout
    return scenario_from_dict(d)


def test_deepseek_layout_expands_to_32_virtual_stages():
    parts = parse_layout(DS_LAYOUT)
    assert len(parts) == 32
    assert [p.count("t") for p in parts] == [1] + [2] * 30 + [0]
    assert parts[0] == "Et" and parts[-1] == "mL"
    ranges = stage_layer_ranges(61, 8, 4, DS_LAYOUT)
    # virtual stage k = chunk*pp + stage, contiguous over the 61 layers in order
    flat = [ranges[k % 8][k // 8] for k in range(32)]
    assert [i for r in flat for i in r] == list(range(61))
    assert len(ranges[7][3]) == 0 and len(ranges[0][0]) == 1


def test_grammar_commas_groups_and_letter_repeats():
    # Megatron-Core's own documented example (PP16 VPP2, MTP standalone)
    parts = parse_layout("Et*3|(tt|)*29,m|L")
    assert [p.count("t") for p in parts] == [3] + [2] * 29 + [0, 0]
    assert parse_layout("E(t*2|)*2tL") == ("Ett", "tt", "tL")
    with pytest.raises(ValueError, match="'x'"):
        parse_layout("Etx|L")
    with pytest.raises(ValueError, match="expands past"):
        parse_layout("Et*99999999|L")


@pytest.mark.parametrize(("layout", "plan", "says"), [
    ("Et*12|t*12L", {"pp": 4}, "2 virtual stages, but pp * virtual_pipeline_stages = 4"),
    ("Et*12|t*11L", {"pp": 2}, "23 transformer layers t, but model.num_layers = 24"),
    ("Et*12|t*12mL", {"pp": 2}, "1 MTP layers m, but model.mtp_layers = 0"),
    ("t*12|Et*12L", {"pp": 2}, "the embedding E must appear exactly once, first"),
    ("Et*12L|t*12", {"pp": 2}, "the loss L must appear exactly once, last"),
    ("Et*12|t*1?L", {"pp": 2}, "cannot read '?'"),
    ("Et*12|t*12L", {"pp": 2, "schedule": "dualpipev", "global_batch_size": 64}, "not with dualpipe/dualpipev"),
])
def test_bad_layouts_are_refused_naming_the_field(layout, plan, says):
    with pytest.raises(ScenarioError) as err:
        sc_of(layout, **plan)
    text = str(err.value)
    assert "plan.pipeline_layout" in text and says in text


def test_standalone_mtp_stage_is_refused():
    d = {"name": "t", "model": {"preset": "deepseek-v3"}, "cluster": {"preset": "dgx-h100", "num_nodes": 128},
         "plan": {"tp": 2, "pp": 8, "virtual_pipeline_stages": 4, "schedule": "interleaved-1f1b", "ep": 64,
                  "global_batch_size": 8192, "pipeline_layout": "Et|(tt|)*29,t|m|L"}}
    with pytest.raises(ScenarioError, match=r"plan\.pipeline_layout: .*standalone MTP"):
        scenario_from_dict(d)


@pytest.mark.parametrize(("layout", "plan"), [
    ("Et*6|t*6|t*6|t*6L", {"pp": 2, "virtual_pipeline_stages": 2, "schedule": "interleaved-1f1b"}),
    ("Et*6|t*6|t*6|t*6L", {"pp": 4, "zero_stage": 1}),
])
@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_even_layout_written_out_predicts_exactly_as_no_layout(layout, plan, engine):
    a = predict(sc_of(None, **plan), engine=engine)
    b = predict(sc_of(layout, **plan), engine=engine)
    assert b.step_time_s == a.step_time_s
    assert b.breakdown_s == a.breakdown_s
    assert b.per_stage == a.per_stage


def test_memory_per_stage_follows_the_layout():
    even, uneven = sc_of(None, pp=2), sc_of("Et*20|t*4L", pp=2)
    m = even.model
    assert stage_layers(m, uneven.plan, 0) == tuple(range(20))
    assert stage_layers(m, uneven.plan, 1) == tuple(range(20, 24))
    one = layer_params(m).per_tp_rank(1)
    for s, moved in ((0, 8), (1, -8)):  # the even split holds 12 + 12
        assert params_per_rank(m, uneven.plan, s) - params_per_rank(m, even.plan, s) == moved * one
        assert layers_held(m, uneven.plan, s) == in_flight(uneven.plan, s) * (20, 4)[s]
    mem_even, mem = memory_per_stage(m, even.plan, even.cluster), memory_per_stage(m, uneven.plan, uneven.cluster)
    assert mem[0].peak > mem_even[0].peak and mem[1].peak < mem_even[1].peak


@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_a_stage_without_layers_runs_the_head_alone(engine):
    sc = sc_of("Et*24|L", pp=2)
    p = predict(sc, engine=engine)
    assert p.step_time_s > 0
    assert stage_layers(sc.model, sc.plan, 1) == ()
    mem = memory_per_stage(sc.model, sc.plan, sc.cluster)
    assert mem[1].peak < mem[0].peak


def test_engines_agree_on_the_uneven_deepseek_plan():
    sc = load_scenario(DEEPSEEK)
    assert sc.plan.pipeline_layout == DS_LAYOUT
    a, d = predict(sc, engine="analytic"), predict(sc, engine="des")
    assert d.engine == "des"
    assert abs(d.step_time_s / a.step_time_s - 1) < 0.02
    # the last stage (the MTP layer and the head, two layers fewer) no longer paces the pipeline:
    # the even split is slower
    even = scenario_from_dict({**_raw(DEEPSEEK), "plan": {**_raw(DEEPSEEK)["plan"], "pipeline_layout": None}})
    assert predict(even, engine="analytic").step_time_s > a.step_time_s


def _raw(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text())


def test_validation_row_r0133_gets_the_recipe_layout():
    rows = {r["run_id"]: r for r in read_csv(packaged_data_dir() / "training_runs.csv")}
    assert moe_scenario(rows["R0133"])["plan"]["pipeline_layout"] == DS_LAYOUT


def test_search_keeps_the_layout_at_its_depth_and_splits_other_depths_evenly():
    from simdist.search.driver import search
    from simdist.search.evaluate import Evaluator
    from simdist.search.space import Constraints

    d = _raw(ROOT / "scenarios" / "llama3-70b-tp8-pp4-64xh100.yaml")
    d["plan"]["pipeline_layout"] = "Et*3|(t*4|)*18t*5L"  # 20 virtual stages, 3 + 4 x 18 + 5 layers
    sc = scenario_from_dict(d)
    res = search(sc, Constraints(engine="analytic"), workers=1)
    assert not any("pipeline_layout" in rule for rule in res.invalid_by_rule)
    depths = {p.candidate.pp * p.candidate.v for p in res.evaluated_plans}
    assert 20 in depths and len(depths) > 1  # the layout's depth and others
    ev = Evaluator(sc)
    for p in res.evaluated_plans:
        plan = ev.plan(p.candidate)
        uneven = p.candidate.pp * p.candidate.v == 20 and p.candidate.schedule not in ("dualpipe", "dualpipev")
        assert plan.pipeline_layout == (d["plan"]["pipeline_layout"] if uneven else None)
