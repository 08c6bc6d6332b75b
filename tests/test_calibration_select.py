"""Top-k selection priced at the device's measured rate (profile v8, ``select_rates``)."""

import json
from dataclasses import replace

import pytest
from test_calibration import local_scenario, synthetic_bench
from test_calibration_phases import phased, truth

from simdist.analytic.compression import topk_selection_time
from simdist.analytic.params import params_per_rank
from simdist.calibrate.fit import fit_profile
from simdist.calibrate.refit import microbenchmark_part
from simdist.calibrate.terms import fit_terms
from simdist.predict import predict
from simdist.spec.profile import load_profile
from simdist.spec.scenario import scenario_from_dict

# this guest's measured top-k of 5% (executor.bench.bench_select on both ranks at once, 2026-11-28):
# 6.8-8.9 ns an element from 16 Ki to 1 Mi entries, 12.5 ns at 4 Mi (the pairs leave the cache)
SELECT_ROWS = [{"elements": n, "k": round(0.05 * n), "seconds": n * r}
               for n, r in ((2.0**14, 8e-9), (2.0**18, 7e-9), (2.0**18, 9e-9), (2.0**22, 12.5e-9))]


def profile_with_select():
    return fit_profile({**synthetic_bench(), "cores": 2, "select": SELECT_ROWS})


def test_the_fit_keeps_seconds_per_element_by_size_merging_the_ranks():
    prof = profile_with_select()
    assert [n for n, _ in prof.select_rates] == [2.0**14, 2.0**18, 2.0**22]
    assert [r for _, r in prof.select_rates] == pytest.approx([8e-9, 8e-9, 12.5e-9])
    assert fit_profile(synthetic_bench()).select_rates == []  # microbenchmarks without it: none


def test_select_time_interpolates_in_log_size_and_holds_the_ends():
    prof = profile_with_select()
    assert prof.select_time(2.0**18) == pytest.approx(2.0**18 * 8e-9)
    assert prof.select_time(2.0**20) == pytest.approx(2.0**20 * 10.25e-9)  # halfway in log size
    assert prof.select_time(100.0) == pytest.approx(100 * 8e-9)
    assert prof.select_time(2.0**25) == pytest.approx(2.0**25 * 12.5e-9)
    assert fit_profile(synthetic_bench()).select_time(1e5) is None


def test_a_version_7_profile_loads_without_a_rate_and_version_8_round_trips(tmp_path):
    v7 = fit_profile(synthetic_bench()).to_dict()
    v7["version"] = 7
    del v7["select_rates"]
    (tmp_path / "v7.json").write_text(json.dumps(v7))
    assert load_profile(tmp_path / "v7.json").select_rates == []
    prof = profile_with_select()
    prof.save(tmp_path / "v8.json")
    assert load_profile(tmp_path / "v8.json") == prof


def test_the_topk_hook_pays_its_selection_at_the_measured_rate():
    sc = scenario_from_dict(local_scenario(zero_stage=0, micro_batch_size=1,
                                           grad_compression={"method": "topk", "ratio": 0.05}))
    rate = profile_with_select()
    base = replace(rate, select_rates=[])
    n = params_per_rank(sc.model, sc.plan, 0)  # the tiny model: one DDP bucket
    with_rate = predict(sc, profile=rate, engine="analytic").breakdown_s["compression"]
    without = predict(sc, profile=base, engine="analytic").breakdown_s["compression"]
    # n x the rate at n comes in, the radix-select passes over memory leave
    assert rate.select_time(n) < with_rate < rate.select_time(n) + without
    said = predict(sc, profile=rate, engine="analytic").assumptions
    assert any("top-k selection at the profile's measured rate" in a for a in said)
    assert topk_selection_time(sc.model, sc.plan, 0, 4, rate.select_time) == \
        pytest.approx(4 * rate.select_time(n / 4))  # one selection per bucket
    dense = scenario_from_dict(local_scenario(zero_stage=0, grad_compression={"method": "bf16"}))
    assert predict(dense, profile=rate, engine="analytic").breakdown_s["compression"] == \
        predict(dense, profile=base, engine="analytic").breakdown_s["compression"]


def test_the_rate_moves_with_the_training_loops_compute_scale_and_back():
    """The executor's loop runs its kernels at ``compute_scale`` x the microbenchmarks' rate
    (colder caches): the fit applies it to the selection rate as to the peaks, and taking the
    executor terms back out restores the microbenchmarks' rate."""
    t = truth()
    t = replace(t, select_rates=[(n, r / 0.8) for n, r in profile_with_select().select_rates])
    bench_only = microbenchmark_part(t)
    assert [r for _, r in bench_only.select_rates] == pytest.approx([r for _, r in profile_with_select().select_rates])
    runs = [phased(t, "small")[1], phased(t, "large", micro_batch_size=8, global_batch_size=16)[1]]
    fitted, _, _ = fit_terms(bench_only, runs)
    assert fitted.compute_scale == pytest.approx(0.8, rel=0.02)
    assert [r for _, r in fitted.select_rates] == pytest.approx([r for _, r in t.select_rates], rel=0.02)
