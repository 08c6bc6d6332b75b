"""Plan search (`simdist search`): enumeration, grouping, ranking, constraints, CLI and quality."""

from __future__ import annotations

import csv
import itertools
import json
from dataclasses import replace

import pytest
import yaml
from conftest import REPO, run_cli

from simdist.analytic.memory import memory_per_stage
from simdist.errors import ScenarioError
from simdist.predict import predict
from simdist.search import (
    PLAN_FIELD,
    Candidate,
    Constraints,
    Evaluator,
    canonical,
    enumerate_plans,
    peak_memory,
    rerank_count,
    search,
)
from simdist.spec.plan import Offload
from simdist.spec.scenario import load_scenario, scenario_from_dict

GPT3_175B = REPO / "scenarios" / "gpt3-175b-1024xa100.yaml"
SMALL = {  # GPT-3 13B on 64 A100 (8 DGX nodes): big enough to need a plan, small enough to be fast
    "name": "gpt3-13b-64xa100",
    "model": {"preset": "gpt3-13b"},
    "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 8},
    "plan": {"tp": 2, "pp": 4, "global_batch_size": 512, "precision": "bf16"},
}
FAST = {"engine": "analytic"}  # the closed form only: unit tests stay fast


@pytest.fixture(scope="module")
def small():
    return scenario_from_dict(SMALL)


@pytest.fixture(scope="module")
def small_result(small):
    return search(small, Constraints(memory_headroom=0.1, top=15, **FAST), workers=1)


@pytest.fixture
def small_file(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    return str(path)


def _scenario_dict(base: dict, plan: dict) -> dict:
    return {**base, "plan": {**base["plan"], **plan}}


# --- enumeration --------------------------------------------------------------------------


def test_grid_points_are_invalid_equivalent_or_evaluated(small, small_result):
    r = small_result
    assert r.grid == r.rejected["invalid"] + r.rejected["equivalent"] + r.evaluated
    assert r.evaluated == r.rejected["does_not_fit"] + r.feasible
    ranked = [p for p in r.evaluated_plans if p.status == "ranked"]
    assert len(ranked) + r.rejected["dominated"] == r.feasible
    assert r.evaluated > 1000 and r.feasible > 100


def test_enumerated_plans_respect_the_rules(small):
    m, world = small.model, small.world_size
    enum = enumerate_plans(m, small.cluster, 512, Constraints())
    for c in enum.groups:
        assert c.tp * c.pp * c.dp * c.cp == world
        assert m.num_attention_heads % c.tp == 0 and m.ffn_hidden_size % c.tp == 0 and c.tp <= 8
        assert m.num_layers % c.pp == 0  # even stages unless asked otherwise
        assert 512 % (c.mbs * c.dp) == 0 and c.mbs <= 8
        if c.schedule == "interleaved-1f1b":
            assert c.v > 1 and m.num_layers % (c.pp * c.v) == 0 and (512 // (c.mbs * c.dp)) % c.pp == 0
        else:
            assert c.v == 1


def test_uneven_and_explicit_pp(small):
    m, cl = small.model, small.cluster  # 40 layers on 64 GPUs: pp 16 and 32 split unevenly
    even = {c.pp for c in enumerate_plans(m, cl, 512, Constraints()).groups}
    uneven = {c.pp for c in enumerate_plans(m, cl, 512, Constraints(uneven_pp=True)).groups}
    assert even == {1, 2, 4, 8} and uneven == {1, 2, 4, 8, 16, 32}
    assert {c.pp for c in enumerate_plans(m, cl, 512, Constraints(pp=(16,))).groups} == {16}


def test_every_returned_plan_is_valid_and_fits_with_headroom(small_result):
    assert small_result.plans
    for p in small_result.plans:
        sc = scenario_from_dict(_scenario_dict(SMALL, p.plan))  # raises if the plan is invalid
        pred = predict(sc, engine="analytic", keep_spans=False)
        assert pred.peak_gib == pytest.approx(p.peak_gib, rel=1e-9)
        assert p.peak_gib <= 0.9 * 80 and p.fits and p.feasible
        assert pred.step_time_s == pytest.approx(p.step_time_s, rel=1e-9)
        assert pred.mfu == pytest.approx(p.mfu, rel=1e-9)


def test_results_sorted_fastest_first(small_result):
    times = [p.step_time_s for p in small_result.plans]
    assert times == sorted(times)
    assert [p.rank for p in small_result.plans] == list(range(1, len(times) + 1))


def test_no_listed_plan_is_dominated(small_result):
    for a, b in itertools.permutations(small_result.plans, 2):
        assert not (a.step_time_s <= b.step_time_s and a.peak_gib <= b.peak_gib
                    and (a.step_time_s, a.peak_gib) != (b.step_time_s, b.peak_gib))


def test_keep_dominated_lists_them(small):
    r = search(small, Constraints(keep_dominated=True, top=50, **FAST), workers=1)
    assert r.rejected["dominated"] == 0
    assert any(p.status == "dominated" for p in r.plans)


# --- grouping -----------------------------------------------------------------------------


def test_grouping_collapses_equivalent_variants(small_result):
    plans = small_result.evaluated_plans
    keys = [p.candidate for p in plans]
    assert len(keys) == len(set(keys))
    pp1 = [p for p in plans if p.candidate.pp == 1]
    assert pp1 and all(p.candidate.schedule == "1f1b" and "schedule" in p.equivalent for p in pp1)
    assert not any(p.candidate.tp == 1 and p.candidate.sp for p in plans)
    # FlashAttention is on: selective recompute is the same plan as none
    assert not any(p.candidate.recompute == "selective" for p in plans)
    assert all(p.variants >= 2 and "recompute" in p.equivalent for p in plans if p.candidate.recompute == "none")


def test_grouped_variants_really_are_the_same_to_the_model(small):
    """Every rule of ``canonical`` against the model itself: same step time, same memory."""
    ev = Evaluator(small)
    c = Constraints()
    variants = [
        Candidate(2, 1, 32, 1, 1, "gpipe", 1, True, "selective", 2),  # pp=1: schedule
        Candidate(2, 1, 32, 1, 1, "zero-bubble", 0, False, "full", 1),
        Candidate(1, 4, 16, 1, 1, "1f1b", 1, True, "full", 1),  # tp=1: sequence parallel
        Candidate(8, 4, 2, 1, 1, "1f1b", 0, True, "selective", 1),  # flash: selective = none
        Candidate(8, 8, 1, 1, 1, "1f1b", 2, False, "none", 1),  # dp=1: ZeRO 0-2
    ]
    for cand in variants:
        rep = canonical(cand, flash_attention=True, c=c)
        assert rep != cand
        a, b = ev.plan(cand), ev.plan(rep)
        assert ev.memory(a) == ev.memory(b)
        assert ev.analytic_time(a) == pytest.approx(ev.analytic_time(b), rel=1e-12)


def test_fast_peak_memory_matches_every_stage(small):
    ev = Evaluator(small)
    plans = [Candidate(8, 8, 1, 1, 5, "interleaved-1f1b", 0, True, "none", 1),
             Candidate(2, 16, 2, 1, 1, "1f1b", 1, True, "full", 2),  # 40 layers / 16: uneven
             Candidate(1, 32, 2, 1, 1, "gpipe", 3, False, "none", 1),
             Candidate(4, 8, 2, 1, 1, "zero-bubble", 2, True, "selective", 4),
             Candidate(2, 5, 1, 1, 1, "1f1b", 0, False, "none", 1)]
    extras = [{}, {"offload": Offload(optimizer="cpu")}, {"gradient_sync": "parameter-server", "zero_stage": 0}]
    for cand, extra in itertools.product(plans, extras):
        dp = 64 // (cand.tp * cand.pp)
        plan = replace(ev.plan(cand), dp=dp, dp_shard=dp, **extra)
        stages = memory_per_stage(small.model, plan, small.cluster)
        expected = (max(s.peak for s in stages), max(s.host for s in stages))
        assert peak_memory(small.model, plan, small.cluster) == expected


# --- constraints --------------------------------------------------------------------------


def test_max_tp_is_honoured(small):
    r = search(small, Constraints(max_tp=4, keep_dominated=True, **FAST), workers=1)
    assert r.evaluated_plans and max(p.candidate.tp for p in r.evaluated_plans) == 4


def test_fixed_pp_is_honoured(small):
    r = search(small, Constraints(pp=(8,), **FAST), workers=1)
    assert r.plans and {p.candidate.pp for p in r.evaluated_plans} == {8}


def test_schedules_zero_and_recompute_are_honoured(small):
    c = Constraints(schedules=("interleaved-1f1b",), zero_stages=(1,), recompute=("full",), **FAST)
    r = search(small, c, workers=1)
    assert r.evaluated_plans
    for p in r.evaluated_plans:
        assert p.candidate.schedule == "interleaved-1f1b" and p.candidate.pp > 1
        assert p.candidate.zero == 1 and p.candidate.recompute == "full"


def test_headroom_tightens_the_memory_limit(small):
    loose = search(small, Constraints(**FAST), workers=1)
    tight = search(small, Constraints(memory_headroom=0.5, **FAST), workers=1)
    assert tight.feasible < loose.feasible
    assert all(p.peak_gib <= 40 for p in tight.plans)


@pytest.mark.parametrize(("constraints", "field"), [
    (Constraints(max_tp=0), "--max-tp"),
    (Constraints(pp=(7,)), "--pp"),
    (Constraints(memory_headroom=1.5), "--memory-headroom"),
    (Constraints(schedules=("pipedream",)), "--schedules"),
    (Constraints(top=0), "--top"),
])
def test_bad_constraints_name_their_flag(small, constraints, field):
    with pytest.raises(ScenarioError) as err:
        search(small, constraints, workers=1)
    assert [p.field for p in err.value.problems] == [field]


def test_workers_give_the_same_answer(small):
    c = Constraints(top=5, **FAST)
    one, two = search(small, c, workers=1), search(small, c, workers=2)
    assert [p.to_dict() for p in one.plans] == [p.to_dict() for p in two.plans]
    assert one.rejected == two.rejected


def test_progress_reports_every_plan(small):
    seen: list[tuple[str, int, int]] = []
    r = search(small, Constraints(**FAST), progress=lambda *a: seen.append(a), workers=1)
    assert seen[-1] == ("analytic", r.evaluated, r.evaluated)


def test_rows_for_the_dashboard(small_result):
    rows = small_result.to_rows()
    assert len(rows) == small_result.evaluated
    assert {"step_time_s", "peak_gib", "tp", "pp", "status", "variants"} <= rows[0].keys()
    assert len(small_result.to_rows("top")) == len(small_result.plans)


def test_apply_gives_a_valid_scenario(small, small_result):
    best = small_result.best
    sc = best.apply(small)
    assert sc.plan.tp == best.candidate.tp and sc.plan.dp_shard == best.candidate.dp


# --- the discrete-event re-ranking --------------------------------------------------------


def test_rerank_uses_the_discrete_event_engine(small):
    # rerank_exact=3: each of the top 3 re-timed (the 4th only if its lower bound lets it in)
    r = search(small, Constraints(top=3, rerank=4, rerank_window=10.0, rerank_exact=3), workers=1)
    assert r.engine == "des" and 3 <= r.counts_by_engine["des"] <= 4
    assert all(p.engine == "des" for p in r.plans)
    assert [p.step_time_s for p in r.plans] == sorted(p.step_time_s for p in r.plans)
    best = predict(r.best.apply(small), engine="des", keep_spans=False)
    assert best.step_time_s == pytest.approx(r.best.step_time_s, rel=1e-9)


# --- quality ------------------------------------------------------------------------------


def test_gpt3_175b_best_plan_is_at_least_as_fast_as_the_papers():
    """Megatron-LM's own plan for GPT-3 175B on 1,024 A100 (TP8 PP16, interleaved, the scenario
    file's plan) is in the search space; the best plan found is predicted at least as fast."""
    sc = load_scenario(GPT3_175B)
    r = search(sc)
    paper = r.baseline
    assert (paper.candidate.tp, paper.candidate.pp, paper.candidate.v) == (8, 16, 2)
    assert r.best is not None and paper.step_time_s is not None
    assert r.best.step_time_s <= paper.step_time_s, (
        f"best {r.best.candidate.label()}: {r.best.step_time_s:.2f} s (MFU {r.best.mfu:.1%}); "
        f"paper {paper.candidate.label()}: {paper.step_time_s:.2f} s (MFU {paper.mfu:.1%})")
    assert r.best.engine == paper.engine
    in_space = [p for p in r.evaluated_plans if p.candidate == paper.candidate]
    assert len(in_space) == 1 and in_space[0].analytic_step_time_s == pytest.approx(paper.analytic_step_time_s)


# --- the command line ---------------------------------------------------------------------


def test_cli_json_follows_the_contract(small_file, tmp_path):
    out = tmp_path / "all.csv"
    res = run_cli("search", small_file, "--json", "--top", "4", "--engine", "analytic", "--csv", str(out))
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert {"evaluated", "feasible", "seconds", "plans"} <= d.keys()
    assert isinstance(d["evaluated"], int) and d["feasible"] <= d["evaluated"] and d["seconds"] > 0
    assert {"invalid", "does_not_fit", "dominated", "equivalent"} == d["rejected"].keys()
    assert 1 <= len(d["plans"]) <= 4
    for p in d["plans"]:
        assert {"plan", "step_time_s", "mfu", "peak_gib", "fits"} <= p.keys() and p["fits"] is True
        assert set(PLAN_FIELD.values()) | {"global_batch_size", "precision"} == p["plan"].keys()
        assert p["plan"]["global_batch_size"] == 512 and p["plan"]["precision"] == "bf16"
    times = [p["step_time_s"] for p in d["plans"]]
    assert times == sorted(times)
    with open(out, newline="") as f:
        assert len(list(csv.DictReader(f))) == d["evaluated"]


def test_cli_table(small_file):
    res = run_cli("search", small_file, "--top", "3", "--engine", "analytic", "--max-tp", "4")
    assert res.returncode == 0, res.stderr
    for word in ("step time", "MFU", "peak (GiB)", "rejected", "dominated", "the plan in"):
        assert word in res.stdout


@pytest.mark.parametrize(("args", "flag"), [
    (["--max-tp", "0"], "--max-tp"),
    (["--pp", "8,x"], "--pp"),
    (["--memory-headroom", "2"], "--memory-headroom"),
    (["--schedules", "1f1b,pipedream"], "--schedules"),
    (["--engine", "magic"], "--engine"),
])
def test_cli_bad_constraint_exits_2_naming_the_flag(small_file, args, flag):
    res = run_cli("search", small_file, *args)
    assert res.returncode == 2
    assert f"error: {flag}:" in res.stderr and "Traceback" not in res.stderr


def test_cli_no_plan_fits_exits_1(tmp_path):
    tiny_cluster = {**SMALL, "model": {"preset": "gpt3-175b"},
                    "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1},
                    "plan": {"global_batch_size": 8}}
    path = tmp_path / "huge.yaml"
    path.write_text(yaml.safe_dump(tiny_cluster))
    res = run_cli("search", str(path), "--engine", "analytic")
    assert res.returncode == 1 and "no plan fits" in res.stdout



def test_rerank_window_limits_the_des_work(small):
    ranked = search(small, Constraints(top=2, keep_dominated=True, **FAST), workers=1).evaluated_plans
    assert rerank_count(ranked, Constraints(top=2, rerank=30, rerank_window=0.0)) == 2 + sum(
        1 for p in ranked[2:30] if p.analytic_step_time_s <= ranked[1].analytic_step_time_s)
    assert rerank_count(ranked, Constraints(top=2, rerank=30, rerank_window=100.0)) == 30
    assert rerank_count([], Constraints()) == 0
