"""Top-k selection priced at the device's measured rates (profile ``select_rates``: v8 at 5% kept,
v9 by size and share kept, simdist.spec.selection)."""

import json
from dataclasses import replace

import pytest
from test_calibration import local_scenario, synthetic_bench
from test_calibration_phases import phased, truth

from simdist.analytic.compression import topk_elements, topk_selection_time
from simdist.analytic.params import params_per_rank
from simdist.calibrate.fit import fit_profile
from simdist.calibrate.refit import microbenchmark_part
from simdist.calibrate.terms import fit_terms
from simdist.predict import predict
from simdist.spec.profile import load_profile
from simdist.spec.scenario import scenario_from_dict
from simdist.spec.selection import select_seconds

# this guest's measured top-k (executor.bench.bench_select, one thread, 2026-11-29), ns an entry:
# the heap selection torch runs at k <= n/64 (0.1% and 1% kept) and nth_element (5%); at 1 Mi
# entries 0.5% took 3.6 ns and 1.5% 8.39 ns (the points the heap's form is checked on)
MEASURED = {2.0**16: {0.001: 1.27, 0.01: 4.19, 0.05: 8.8},
            2.0**20: {0.001: 1.49, 0.01: 6.08, 0.05: 7.13}}
SELECT_ROWS = [{"elements": n, "k": round(share * n), "seconds": n * ns * 1e-9}
               for n, by_share in MEASURED.items() for share, ns in by_share.items()]
SELECT_ROWS += [{"elements": 2.0**22, "k": round(0.05 * 2**22), "seconds": 2**22 * 12.5e-9},
                {"elements": 2.0**20, "k": round(0.05 * 2**20), "seconds": 2**20 * 7.33e-9}]  # a second rank


def profile_with_select():
    return fit_profile({**synthetic_bench(), "cores": 2, "select": SELECT_ROWS})


def test_the_fit_keeps_seconds_per_element_by_size_and_share_merging_the_ranks():
    rates = profile_with_select().select_rates
    assert [n for n, _, _ in rates] == [2.0**16] * 3 + [2.0**20] * 3 + [2.0**22]
    assert [s for _, s, _ in rates] == pytest.approx([0.001, 0.01, 0.05] * 2 + [0.05], rel=0.01)  # k / n as run
    assert rates[5][2] == pytest.approx(7.23e-9)  # the two ranks' 7.13 and 7.33 ns
    assert fit_profile(synthetic_bench()).select_rates == []  # microbenchmarks without it: none


def test_torch_heap_selects_small_shares_and_the_heaps_form_predicts_the_shares_between():
    rates = profile_with_select().select_rates
    n = 2.0**20
    per_entry = lambda share: select_seconds(rates, n, share * n) / n * 1e9  # noqa: E731
    assert per_entry(0.005) == pytest.approx(3.6, rel=0.05)  # measured, not fitted on
    assert per_entry(0.015) == pytest.approx(8.39, rel=0.05)  # still heap-selected (k <= n/64)
    assert per_entry(0.1) == pytest.approx(7.23)  # nth_element: one rate whatever the share
    assert per_entry(0.001) < per_entry(0.01) < per_entry(0.015)
    # halfway in log size between the measured sizes, and the ends held outside them
    assert select_seconds(rates, 2.0**18, 0.05 * 2**18) == pytest.approx(2**18 * (8.8e-9 + 7.23e-9) / 2)
    assert select_seconds(rates, 2.0**25, 0.05 * 2**25) == pytest.approx(2**25 * 12.5e-9)
    assert fit_profile(synthetic_bench()).select_time(1e5, 5e3) is None


def test_older_profiles_load_version_8s_rows_as_five_percent_kept(tmp_path):
    v7 = fit_profile(synthetic_bench()).to_dict()
    v7["version"] = 7
    del v7["select_rates"]
    (tmp_path / "v7.json").write_text(json.dumps(v7))
    assert load_profile(tmp_path / "v7.json").select_rates == []
    v8 = {**v7, "version": 8, "select_rates": [[2.0**16, 8.8e-9], [2.0**20, 7.1e-9]]}
    (tmp_path / "v8.json").write_text(json.dumps(v8))
    old = load_profile(tmp_path / "v8.json")
    assert old.select_rates == [(2.0**16, 0.05, 8.8e-9), (2.0**20, 0.05, 7.1e-9)]
    assert old.select_time(2.0**20, 0.001 * 2**20) == pytest.approx(2**20 * 7.1e-9)  # its one rate for any share
    prof = profile_with_select()
    prof.save(tmp_path / "v9.json")
    assert load_profile(tmp_path / "v9.json") == prof


def test_the_topk_hook_pays_its_selection_at_the_measured_rate():
    sc = scenario_from_dict(local_scenario(zero_stage=0, micro_batch_size=1,
                                           grad_compression={"method": "topk", "ratio": 0.05}))
    rate = profile_with_select()
    base = replace(rate, select_rates=[])
    n = params_per_rank(sc.model, sc.plan, 0)  # the tiny model: one DDP bucket
    with_rate = predict(sc, profile=rate, engine="analytic").breakdown_s["compression"]
    without = predict(sc, profile=base, engine="analytic").breakdown_s["compression"]
    # n x the rate at n comes in, the radix-select passes over memory leave
    assert rate.select_time(n, 0.05 * n) < with_rate < rate.select_time(n, 0.05 * n) + without
    said = predict(sc, profile=rate, engine="analytic").assumptions
    assert any("top-k selection at the profile's measured rate" in a for a in said)
    assert topk_selection_time(sc.model, sc.plan, 0, 4, rate.select_time) == \
        pytest.approx(4 * rate.select_time(n / 4, topk_elements(n / 4, sc.plan)))  # one selection per bucket
    small = scenario_from_dict(local_scenario(zero_stage=0, micro_batch_size=1,
                                              grad_compression={"method": "topk", "ratio": 0.001}))
    assert predict(small, profile=rate, engine="analytic").breakdown_s["compression"] < with_rate
    dense = scenario_from_dict(local_scenario(zero_stage=0, grad_compression={"method": "bf16"}))
    assert predict(dense, profile=rate, engine="analytic").breakdown_s["compression"] == \
        predict(dense, profile=base, engine="analytic").breakdown_s["compression"]


def test_the_rate_moves_with_the_training_loops_compute_scale_and_back():
    """The executor's loop runs its kernels at ``compute_scale`` x the microbenchmarks' rate
    (colder caches): the fit applies it to the selection rates as to the peaks, and taking the
    executor terms back out restores the microbenchmarks' rates."""
    t = truth()
    t = replace(t, select_rates=[(n, s, r / 0.8) for n, s, r in profile_with_select().select_rates])
    bench_only = microbenchmark_part(t)
    assert [r for _, _, r in bench_only.select_rates] == \
        pytest.approx([r for _, _, r in profile_with_select().select_rates])
    runs = [phased(t, "small")[1], phased(t, "large", micro_batch_size=8, global_batch_size=16)[1]]
    fitted, _, _ = fit_terms(bench_only, runs)
    assert fitted.compute_scale == pytest.approx(0.8, rel=0.02)
    assert [r for _, _, r in fitted.select_rates] == pytest.approx([r for _, _, r in t.select_rates], rel=0.02)
