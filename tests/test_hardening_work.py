"""Issue 20 item 4: bounded work. The event engine's work is estimated before anything is
simulated; past its limits the closed form answers (saying so) or, where only the engine will
do (a trace, stragglers, the search's re-timing), the scenario is refused naming the input
that drives the work; a run that outgrows its estimate is stopped anyway; the closed form's
own loops are bounded (pp x virtual stages, never per bucket)."""

from __future__ import annotations

import itertools
import json

import pytest
from conftest import REPO, base_scenario

from simdist.analytic.collectives import Network
from simdist.analytic.cost import CostModel
from simdist.analytic.stage import describe
from simdist.cli import main
from simdist.errors import ScenarioError
from simdist.predict import MAX_VIRTUAL_STAGES, predict
from simdist.search import Constraints, search
from simdist.sim import kernel
from simdist.sim.engine import budget, simulate
from simdist.spec.scenario import load_scenario, scenario_from_dict
from simdist.spec.stages import stage_layer_ranges


def _scenario(model: dict | None = None, cluster: dict | None = None, **plan):
    d = base_scenario(**plan)
    d["model"].update(model or {})
    d["cluster"].update(cluster or {})
    return scenario_from_dict(d)


def _described(sc):
    return describe(sc, CostModel(sc.cluster.gpu, sc.plan.precision), Network.of(sc.cluster))


# the issue's examples: (scenario, the input named)
ISSUE = {
    "1 B buckets": (dict(cluster={"num_nodes": 2}, ddp_bucket_size="1 B"), "plan.ddp_bucket_size"),
    # the issue had 10**6 layers, now refused when the model is built (model.MAX_LAYERS)
    "1e5 layers, ZeRO-3": (dict(model={"num_layers": 10**5}, zero_stage=3), "model.num_layers"),
    "pp = 10,000": (dict(model={"num_layers": 10_000}, cluster={"num_nodes": 1250}, pp=10_000,
                         global_batch_size=20_000), "plan.pp"),
    "2^40 GPUs": (dict(cluster={"num_nodes": 2**37}, global_batch_size=2**40), "cluster.num_nodes"),
}


@pytest.mark.parametrize("case", sorted(ISSUE))
def test_the_issues_examples_are_answered_by_the_closed_form_saying_why(case):
    kwargs, field = ISSUE[case]
    sc = _scenario(**kwargs)
    est = budget.estimate_work(_described(sc))
    assert not est.within_limits and est.driver == field, est.message()
    pred = predict(sc, engine="des", keep_spans=False)
    assert pred.engine == "analytic"
    (why,) = [a for a in pred.assumptions if a.startswith("closed form used instead of the event engine")]
    assert f"({field} too large:" in why
    json.dumps(pred.to_dict(), allow_nan=False)
    with pytest.raises(ScenarioError) as exc:  # where only the engine will do
        predict(sc, engine="des", keep_spans=True, fallback=False)
    assert exc.value.problems[0].field == field
    assert "too large for the event engine" in exc.value.problems[0].message


def test_100_000_micro_batches_run_in_the_engine_but_not_past_its_limit(monkeypatch):
    sc = _scenario(pp=2, global_batch_size=400_000)  # 100,000 micro-batches per pipeline
    est = budget.estimate_work(_described(sc))
    assert est.within_limits and est.events > 1_000_000  # about a minute's work at most: allowed
    monkeypatch.setattr(budget, "MAX_EVENTS", est.events // 2)
    pred = predict(sc, engine="des", keep_spans=False)
    assert pred.engine == "analytic"
    assert any("(plan.global_batch_size too large:" in a for a in pred.assumptions)


def test_simulate_refuses_past_the_limits_before_building_anything(monkeypatch):
    d = _described(_scenario(cluster={"num_nodes": 2}, ddp_bucket_size="1 B"))

    def never(*args, **kwargs):
        raise AssertionError("lowered although too large")

    monkeypatch.setattr("simdist.sim.engine.simulation.lower", never)
    with pytest.raises(ScenarioError, match=r"plan\.ddp_bucket_size: too large for the event engine"):
        simulate(d, keep_spans=False)


def test_a_run_that_outgrows_its_estimate_is_stopped(monkeypatch):
    sc = load_scenario(REPO / "scenarios" / "gpt3-175b-1024xa100.yaml")
    monkeypatch.setattr(budget, "MAX_EVENTS", 300)  # the estimate (62,000 events) is over it ...
    real = budget.estimate_work
    monkeypatch.setattr(budget, "check_work", lambda *a, **k: real(*a, **k))  # ... but let it run
    monkeypatch.setattr("simdist.sim.engine.simulation.check_work", lambda *a, **k: real(*a, **k))
    with pytest.raises(ScenarioError, match=r"stopped after [\d,]+ events \(its limit is 3,000\)"):
        simulate(_described(sc), keep_spans=False)


def test_stragglers_past_the_limits_are_refused_not_dropped():
    sc = _scenario(cluster={"num_nodes": 2}, ddp_bucket_size="1 B")
    with pytest.raises(ScenarioError, match="too large for the event engine"):
        predict(sc, engine="des", keep_spans=False, stragglers={0: 2.0})


class _Counting(kernel.Environment):
    processed = 0

    def step(self) -> None:
        _Counting.processed += 1
        super().step()


@pytest.mark.parametrize("name", ["gpt3-175b-1024xa100", "llama3-70b-tp8-pp4-64xh100", "llama2-70b-zero3-4xa100",
                                  "llama2-70b-zero2-8xa100", "llama2-70b-zero3-offload-2xa100",
                                  "gpt3-1.3b-16x1gpu-25gbe-ps16", "llama3-8b-fsdp-8xh100"])
@pytest.mark.parametrize("fidelity", ["symmetric", "full"])
def test_the_estimate_follows_the_events_processed(monkeypatch, name, fidelity):
    """Within a small factor of what the engine does: the limits mean what they say."""
    sc = load_scenario(REPO / "scenarios" / f"{name}.yaml")
    d = _described(sc)
    est = budget.estimate_work(d, fidelity)
    monkeypatch.setattr("simdist.sim.engine.state.kernel.Environment", _Counting)
    # the estimate bounds the whole simulation, what runs when neither the periodic extension
    # nor rank grouping applies (both only ever shorten it)
    monkeypatch.setattr("simdist.sim.engine.periodic.short_count", lambda *a, **k: None)
    monkeypatch.setattr("simdist.sim.engine.grouping.simulated_fidelity", lambda d, fidelity, *a: fidelity)
    _Counting.processed = 0
    simulate(d, fidelity=fidelity, keep_spans=False)
    assert est.events / 4 <= _Counting.processed <= 3 * est.events, (est.events, _Counting.processed)


def test_the_closed_form_never_loops_per_bucket_or_past_the_stage_limit():
    sc = _scenario(cluster={"num_nodes": 2}, ddp_bucket_size="1 B")  # 2.6e9 buckets
    pred = predict(sc, engine="analytic", keep_spans=False)
    assert pred.breakdown_s["dp_comm"] > 0 and pred.engine == "analytic"
    big = _scenario(model={"num_layers": 40_000}, cluster={"num_nodes": 2_500}, pp=20_000, global_batch_size=20_000)
    for engine in ("analytic", "des"):
        with pytest.raises(ScenarioError, match=rf"plan\.pp: 20,000 stages x 1 virtual stages = 20,000 model "
                                                rf"chunks; simdist sizes at most {MAX_VIRTUAL_STAGES:,}"):
            predict(big, engine=engine, keep_spans=False)


def test_the_layer_split_is_linear_and_still_right():
    ranges = stage_layer_ranges(10**6, MAX_VIRTUAL_STAGES, 1)
    assert ranges[0][0].start == 0 and ranges[-1][-1].stop == 10**6
    flat = [r for stage in ranges for r in stage]
    assert all(a.stop == b.start for a, b in itertools.pairwise(flat))
    small = stage_layer_ranges(10, 2, 2)  # chunk c of stage s is virtual stage c*pp + s
    assert [[(r.start, r.stop) for r in s] for s in small] == [[(0, 2), (5, 8)], [(2, 5), (8, 10)]]


def test_trace_refuses_rather_than_drawing_the_closed_form(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(base_scenario(ddp_bucket_size="1 B")))
    out = tmp_path / "t.json"
    assert main(["trace", str(path), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: plan.ddp_bucket_size: too large for the event engine") and not out.exists()


def test_predict_says_when_the_closed_form_answered(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(base_scenario(ddp_bucket_size="1 B")))
    assert main(["predict", str(path), "--json", "--no-store"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["engine"] == "analytic"
    assert err.startswith("note: closed form used instead of the event engine (plan.ddp_bucket_size too large")
    with pytest.raises(SystemExit):
        main(["predict", "--help"])
    helptext = capsys.readouterr().out
    assert "Input limits:" in helptext and f"{budget.MAX_EVENTS:,} events" in helptext


@pytest.mark.parametrize(("args", "flag"), [(["--pp", "20000"], "--pp"),
                                            (["--max-virtual-stages", "1000000"], "--max-virtual-stages"),
                                            (["--max-micro-batch", "1000000000"], "--max-micro-batch")])
def test_search_flags_that_would_unbound_the_grid_are_refused(tmp_path, capsys, args, flag):
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(base_scenario()))
    assert main(["search", str(path), "--no-progress", "--workers", "1", *args]) == 2
    assert any(line.startswith(f"error: {flag}: ") for line in capsys.readouterr().err.splitlines())


def test_search_on_more_gpus_than_it_can_enumerate_is_refused():
    sc = _scenario(cluster={"num_nodes": 2**38}, global_batch_size=2**41)
    with pytest.raises(ScenarioError, match=r"cluster\.num_nodes: .* GPUs: the search handles at most"):
        search(sc, Constraints(engine="analytic"), workers=1)


def test_search_notes_plans_the_engine_cannot_retime(monkeypatch):
    monkeypatch.setattr(budget, "MAX_EVENTS", 10)
    sc = scenario_from_dict(base_scenario())
    result = search(sc, Constraints(top=3, rerank=3), workers=1)
    assert result.plans and any("too large for the event engine" in n for n in result.notes)


def test_the_documented_limits_are_the_code_s():
    from simdist.io.text import MAX_DEPTH, MAX_EXPANDED_NODES
    from simdist.search.space import MAX_MICRO_BATCH, MAX_SEARCH_GPUS
    from simdist.spec.consistency import MAX_GROUP_RANKS
    from simdist.spec.files import MAX_INPUT_BYTES
    from simdist.spec.model import MAX_LAYERS

    doc = (REPO / "docs" / "scenario-format.md").read_text(encoding="utf-8")
    section = doc[doc.index("## Input limits"):doc.index("## Top level")]
    for figure in (f"{budget.MAX_EVENTS:,} events", f"{budget.MAX_SPANS:,} timeline spans",
                   f"{budget.MAX_RANK_SCANS:,} ranks scanned", f"{budget.MAX_LINK_UPDATES:,} link updates",
                   f"{MAX_VIRTUAL_STAGES:,} (the closed form", f"at most {MAX_INPUT_BYTES // 2**20} MiB",
                   f"{MAX_DEPTH} levels", f"{MAX_EXPANDED_NODES:,} values", f"`--max-micro-batch` {MAX_MICRO_BATCH:,}",
                   f"2^{MAX_SEARCH_GPUS.bit_length() - 1} GPUs", f"| {MAX_GROUP_RANKS:,} (2^20;",
                   f"| {MAX_LAYERS:,} |", f"at {({10: 'ten'}).get(budget.HARD_FACTOR)} times the event limit"):
        assert figure in section, figure


def test_the_issues_663_byte_alias_bomb_is_one_line_naming_the_file_once(tmp_path, capsys):
    levels = "".join(f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + levels + "name: *i\nmodel: *i\n"
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb)
    assert main(["predict", str(path), "--no-store"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: file: {path}:") and line.count("file:") == 1 and "alias bomb" in line


@pytest.mark.parametrize(("item", "says"), [("0:nan", "the slow-down factor must be a number from 1 to 1000"),
                                            ("0:inf", "the slow-down factor must be a number from 1"),
                                            ("0:1e308", "the slow-down factor must be a number from 1"),
                                            ("99999:2", "rank 99999 is not one of the cluster's 8 GPUs"),
                                            ("node:7:2", "node 7 is not one of the cluster's 1 nodes"),
                                            ("-1:2", "ranks and nodes count from 0")])
def test_stragglers_are_checked_where_they_are_read(capsys, item, says):
    """A NaN or huge slow-down used to break the engine's clock; a rank outside the cluster was
    silently ignored."""
    scenario = str(REPO / "scenarios" / "llama3-8b-fsdp-8xh100.yaml")
    assert main(["predict", scenario, "--no-store", f"--straggler={item}"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: --straggler: ") and says in line, line
