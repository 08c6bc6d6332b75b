"""A CPU's GEMMs fetch their weights from memory where the ranks' working sets overflow the
last-level cache (simdist.analytic.cache_residency; profile v11's weight fetch)."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
from test_calibration import synthetic_bench

from simdist.analytic.cache_residency import (
    fetch_note,
    fetches_weights,
    resident,
    working_set_bytes,
)
from simdist.analytic.cost import CostModel
from simdist.analytic.ops import _gemm
from simdist.calibrate.fit import fit_profile, weight_fetch
from simdist.calibrate.phases import at_rate
from simdist.errors import ScenarioError
from simdist.predict import predict
from simdist.spec.profile import CalibrationProfile, load_profile
from simdist.spec.scenario import load_scenario

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
MIB = 2**20
# this guest's cold-GEMM microbenchmark, both ranks at once (2026-11-29, four runs' means): seconds
# a GEMM paid to fetch a weight of 0.25-4 MiB
FETCH = [(0.25 * MIB, 0.052e-3), (0.75 * MIB, 0.127e-3), (1 * MIB, 0.103e-3), (2 * MIB, 0.180e-3), (4 * MIB, 0.126e-3)]


def cpu_profile(llc: float = 32 * MIB, fetch=FETCH) -> CalibrationProfile:
    prof = fit_profile(synthetic_bench())
    return replace(prof, backend="gloo", cores=2, ranks=2, llc_bytes=llc, weight_fetch_s=list(fetch))


def test_the_fetch_is_the_cold_gemm_less_the_hot_one_by_weight_size():
    rows = [{"weight_bytes": MIB, "hot_s": 1.0e-3, "cold_s": 1.2e-3, "fetch_s": 0.15e-3},
            {"weight_bytes": MIB, "hot_s": 1.0e-3, "cold_s": 1.1e-3, "fetch_s": 0.05e-3},
            {"weight_bytes": 4 * MIB, "hot_s": 2.0e-3, "cold_s": 1.9e-3},  # no pairs: the medians; never < 0
            {"weight_bytes": 0.25 * MIB, "hot_s": 1.0e-3, "cold_s": 1.04e-3}]
    fitted = weight_fetch(rows)
    assert [b for b, _ in fitted] == [0.25 * MIB, MIB, 4 * MIB]
    assert [t for _, t in fitted] == pytest.approx([0.04e-3, 0.1e-3, 0.0])
    prof = fit_profile({**synthetic_bench(), "cold_gemm": rows, "llc_bytes": 32 * MIB})
    assert prof.llc_bytes == 32 * MIB
    assert prof.weight_fetch(2 * MIB) == pytest.approx(0.05e-3)  # halfway in log-size from 1 to 4 MiB
    assert fit_profile(synthetic_bench()).weight_fetch(MIB) == 0.0


def test_a_layers_gemms_pay_the_fetch_of_their_weight_and_nothing_else_does():
    sc = load_scenario(SCENARIOS / "local-pp-fit.yaml")
    prof, plain = cpu_profile(), replace(cpu_profile(), weight_fetch_s=[])
    cm, cm_plain = CostModel(sc.cluster.gpu, "fp32", prof), CostModel(sc.cluster.gpu, "fp32", plain)
    fwd, = _gemm("fc1", 256, 1024, 256, backward=False)
    wgrad, dgrad = _gemm("fc1", 256, 1024, 256, backward=True)
    for op in (fwd, wgrad, dgrad):  # the forward and the data grad read the weight, the weight grad writes it
        assert op.weight == 256 * 1024
        assert cm.time(op) - cm_plain.time(op) == pytest.approx(prof.weight_fetch(4 * 256 * 1024))
    experts = replace(fwd, name="experts fc1", batch=4, weight=4 * fwd.weight)  # a round of 4 experts' GEMMs
    assert cm.weight_fetch_time(experts) == pytest.approx(4 * cm.weight_fetch_time(fwd))
    scores = replace(fwd, name="QK^T", weight=0.0)
    assert cm.time(scores) == cm_plain.time(scores)
    assert CostModel(sc.cluster.gpu, "bf16", prof).weight_fetch_time(fwd) == pytest.approx(prof.weight_fetch(2 * 256 * 1024))


def test_the_fetch_is_paid_only_where_the_ranks_working_sets_overflow_the_cache():
    """The local GPT's 2-rank plans (58-210 MiB together) overflow a 32 MiB cache; the tiny
    plans (2-11 MiB) do not."""
    local, tiny = load_scenario(SCENARIOS / "local-pp-fit.yaml"), load_scenario(SCENARIOS / "tiny-ddp.yaml")
    prof = cpu_profile()
    assert working_set_bytes(local) > 32 * MIB > 3 * working_set_bytes(tiny)
    assert fetches_weights(local, prof) and not fetches_weights(tiny, prof)
    assert resident(local, prof) is prof and resident(tiny, prof).weight_fetch_s == []
    assert not fetches_weights(local, cpu_profile(llc=working_set_bytes(local)))  # it fits exactly
    assert not fetches_weights(local, cpu_profile(llc=0.0))  # the cache not measured: the profile as fitted
    assert resident(local, None) is None
    gpu = CalibrationProfile(device="H100", backend="nccl")
    assert resident(local, gpu) is gpu
    assert "overflow the 32 MiB last-level cache" in fetch_note(local, prof)
    assert fetch_note(tiny, prof) is None


def test_more_smaller_micro_batches_fetch_the_weights_more_often():
    """local-pp-fit (8 micro-batches of 2) and local-pp-1f1b (4 of 4) compute the same tokens; the
    first fetches every weight twice as often, so the fetch adds twice the compute (measured in
    the real 2-rank pipeline: the last stage 21 ms slower at 8 x 2 than at 4 x 4)."""
    prof, plain = cpu_profile(llc=1 * MIB), replace(cpu_profile(), weight_fetch_s=[])

    def compute(name: str, p: CalibrationProfile) -> float:
        return predict(load_scenario(SCENARIOS / f"{name}.yaml"), profile=p, engine="analytic").breakdown_s["compute"]

    added = {n: compute(n, prof) - compute(n, plain) for n in ("local-pp-fit", "local-pp-1f1b")}
    assert added["local-pp-1f1b"] > 0
    assert added["local-pp-fit"] == pytest.approx(2 * added["local-pp-1f1b"], rel=0.01)


def test_a_search_prices_each_plans_fetch_by_its_own_working_set_as_predict_does():
    """With a cache between two candidates' working sets (local-pp-fit at micro-batches of 2 and
    of 8: 65 and 161 MiB), the search's closed form fetches the weights for the larger alone, each
    candidate timed as ``predict`` times it, whichever the scenario's own plan does."""
    from simdist.search.evaluate import Evaluator
    from simdist.search.space import candidate_of

    sc = load_scenario(SCENARIOS / "local-pp-fit.yaml")
    small, large = (replace(sc.plan, micro_batch_size=mbs) for mbs in (2, 8))
    prof = cpu_profile(llc=100 * MIB)
    assert not fetches_weights(replace(sc, plan=small), prof) and fetches_weights(replace(sc, plan=large), prof)
    for base in (small, large):
        ev = Evaluator(replace(sc, plan=base), prof)
        for plan in (small, large, small):  # the second visit of a plan hits the memo
            got = ev.analytic_time(ev.plan(candidate_of(plan)))
            assert got == pytest.approx(predict(replace(sc, plan=plan), profile=prof, engine="analytic").step_time_s,
                                        rel=1e-9)
    ev = Evaluator(replace(sc, plan=small), prof)
    fetched = ev.analytic_time(ev.plan(candidate_of(large)))
    cached = Evaluator(replace(sc, plan=large), replace(prof, weight_fetch_s=[])).analytic_time(large)
    assert fetched > cached * 1.01  # the fetch is there to tell apart


def test_profile_v11_keeps_the_fetch_and_scales_it_with_the_machines_speed(tmp_path):
    prof = cpu_profile()
    path = tmp_path / "p.json"
    prof.save(path)
    back = load_profile(path)
    assert back.weight_fetch_s == prof.weight_fetch_s and back.llc_bytes == 32 * MIB
    assert prof.slowed(2.0).weight_fetch(MIB) == pytest.approx(2 * prof.weight_fetch(MIB))  # a shared core
    assert at_rate(prof, 2.0).weight_fetch(MIB) == pytest.approx(prof.weight_fetch(MIB) / 2)  # the executor's rate
    old = prof.to_dict()
    del old["weight_fetch_s"], old["llc_bytes"]
    old["version"] = 10
    (tmp_path / "v10.json").write_text(json.dumps(old))
    assert load_profile(tmp_path / "v10.json").weight_fetch_s == []
    bad = {**prof.to_dict(), "weight_fetch_s": [[MIB, -1e-4]]}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ScenarioError, match="weight_fetch_s"):
        load_profile(tmp_path / "bad.json")


def test_the_last_level_cache_is_the_highest_levels_instances_the_ranks_cores_share(tmp_path, monkeypatch):
    from executor import hostload

    def cache(cpu: int, index: int, level: int, kind: str, size: str, shared: str) -> None:
        d = tmp_path / f"cpu{cpu}" / "cache" / f"index{index}"
        d.mkdir(parents=True)
        for name, text in (("level", str(level)), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
            (d / name).write_text(text + "\n")

    for cpu in (0, 1, 2):  # private L1s and L2s; cpus 0-1 share one L3, cpu 2 has another
        cache(cpu, 0, 1, "Data", "32K", str(cpu))
        cache(cpu, 1, 1, "Instruction", "32K", str(cpu))
        cache(cpu, 2, 2, "Unified", "2048K", str(cpu))
        cache(cpu, 3, 3, "Unified", "32768K" if cpu < 2 else "16M", "0-1" if cpu < 2 else "2")
    monkeypatch.setattr(hostload.os, "sched_getaffinity", lambda pid: {0, 1})
    assert hostload.last_level_cache_bytes(str(tmp_path)) == 32 * MIB
    monkeypatch.setattr(hostload.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    assert hostload.last_level_cache_bytes(str(tmp_path)) == 48 * MIB
    assert hostload.last_level_cache_bytes(str(tmp_path / "absent")) == 0

