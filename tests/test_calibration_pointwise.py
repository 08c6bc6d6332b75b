"""A CPU's pointwise ops priced by the elements they compute (profile v13 ``pointwise_s``,
executor.bench.bench_pointwise): one thread evaluates GELU's erf, the loss's exp and the norms'
reductions at 0.3-1 ns an element, several times what streaming their bytes costs, so the
memory-bound price missed most of what they add as a micro-batch grows."""

import json
from dataclasses import replace

import pytest
from test_calibration import local_scenario, synthetic_bench
from test_calibration_phases import phased, truth

from simdist.analytic.cost import CostModel
from simdist.analytic.ops import head_ops, layer_ops
from simdist.calibrate.fit import fit_profile, pointwise_rates
from simdist.calibrate.refit import microbenchmark_part
from simdist.calibrate.terms import fit_terms
from simdist.errors import ScenarioError
from simdist.predict import predict
from simdist.spec.profile import load_profile
from simdist.spec.scenario import scenario_from_dict

# this guest's pointwise ops, 2 ranks at once, 256 wide (executor.bench.bench_pointwise, 2026-11-30):
# (elements, microseconds) forward and backward
MEASURED = {"gelu": [(4096, 13.6, 68.7), (32768, 42.3, 158.9), (262144, 189.0, 645.3)],
            "layernorm": [(4096, 9.4, 42.0), (32768, 19.3, 62.5), (262144, 103.9, 200.1)],
            "rmsnorm": [(4096, 21.3, 99.4), (32768, 31.0, 151.5), (262144, 112.4, 2028.0)],
            "cross_entropy": [(4096, 7.0, 37.6), (32768, 23.2, 54.7), (262144, 153.2, 214.1)]}
ROWS = [{"op": f"{op} {p}", "elements": float(n), "seconds": t * 1e-6}
        for op, points in MEASURED.items() for n, fwd, bwd in points for p, t in (("fwd", fwd), ("bwd", bwd))]


def with_pointwise(bench_rows=ROWS):
    return fit_profile({**synthetic_bench(), "cores": 2, "pointwise": bench_rows})


def test_the_fit_keeps_each_sizes_time_per_element_less_the_calls_fixed_part():
    rates = pointwise_rates(ROWS)
    assert sorted(rates) == sorted(f"{op} {p}" for op in MEASURED for p in ("fwd", "bwd"))
    # the two smallest sizes give the slope; the fixed part of a call is not a rate
    slope = (42.3 - 13.6) / (32768 - 4096) * 1e-6
    assert rates["gelu fwd"][:2] == [(4096.0, pytest.approx(slope)), (32768.0, pytest.approx(slope))]
    fixed = 13.6e-6 - 4096 * slope
    assert rates["gelu fwd"][2] == (262144.0, pytest.approx((189.0e-6 - fixed) / 262144))
    # a time growing faster than its elements out of the L2 (RMSNorm's backward) is kept by size
    assert rates["rmsnorm bwd"][2][1] > 2.5 * rates["rmsnorm bwd"][0][1]
    assert all(0.1e-9 < r < 10e-9 for points in rates.values() for _, r in points)
    # a single size cannot tell the fixed part from the rate: left out; rows of every rank merged
    assert pointwise_rates(ROWS[:2]) == {}
    two_ranks = pointwise_rates(ROWS + [{**r, "seconds": r["seconds"] * 1.1} for r in ROWS])
    assert two_ranks["gelu fwd"][0][1] == pytest.approx(1.05 * slope)  # each size at the mean of the ranks


def test_a_gelu_costs_its_elements_at_the_measured_rate_where_that_exceeds_its_bytes():
    profile = with_pointwise()
    plain = replace(profile, pointwise_s={})
    sc = scenario_from_dict(local_scenario())
    m, plan = sc.model, sc.plan
    gelu = next(op for op in layer_ops(m, plan, "fwd") if op.name == "gelu")
    tokens = m.seq_length * plan.micro_batch_size
    assert (gelu.pointwise, gelu.elements) == ("gelu fwd", tokens * m.ffn_hidden_size)
    cost, streamed = CostModel(sc.cluster.gpu, "fp32", profile), CostModel(sc.cluster.gpu, "fp32", plain)
    assert cost.time(gelu) == pytest.approx(cost.kernel_overhead + profile.pointwise_time("gelu fwd", gelu.elements))
    assert cost.time(gelu) > streamed.time(gelu) + 1e-6
    # an op that streams its bytes (the residual add) is priced as before
    add = next(op for op in layer_ops(m, plan, "fwd") if op.name == "bias dropout add")
    assert add.pointwise == "" and cost.time(add) == streamed.time(add)
    # the backward at its own rate, the loss by its logits, the norm by the hidden size it normalises
    bwd = {op.name: op for op in layer_ops(m, plan, "bwd") + head_ops(m, plan, "bwd")}
    assert bwd["gelu"].pointwise == "gelu bwd" and bwd["norm1"].pointwise == "layernorm bwd"
    assert bwd["cross entropy bwd"].elements == tokens * m.vocab_size
    assert bwd["norm1"].elements == tokens * m.hidden_size
    # a GPU (no profile's rates) streams them all
    assert CostModel(sc.cluster.gpu, "fp32", None).pointwise_time(gelu) == 0.0


def test_sequence_and_tensor_parallelism_split_what_each_rank_computes():
    sc = scenario_from_dict({**local_scenario(tp=2, sequence_parallel=True),
                             "cluster": {"preset": "local", "num_nodes": 1, "gpus_per_node": 2}})
    m, plan = sc.model, sc.plan
    ops = {op.name: op for op in layer_ops(m, plan, "fwd")}
    tokens = m.seq_length * plan.micro_batch_size
    assert ops["gelu"].elements == tokens * m.ffn_hidden_size / 2
    assert ops["norm1"].elements == tokens * m.hidden_size / 2


def test_a_micro_batch_twice_as_large_costs_more_by_what_its_pointwise_ops_compute():
    """What the model missed: the executor's step grew more from one micro-batch size to the next
    (as many micro-batches, each twice as large) than the memory-bound price of these ops let the
    model's grow. Each step rises by exactly what its pointwise ops compute beyond streaming their
    bytes, in each of the rank's micro-batches, so the growth rises by the difference."""
    profile, plain = with_pointwise(), replace(with_pointwise(), pointwise_s={})

    def scenario(b):
        return scenario_from_dict(local_scenario(micro_batch_size=b, global_batch_size=4 * b))  # 2 a rank

    def step(p, b):
        return predict(scenario(b), profile=p, engine="analytic").step_time_s

    def computed(b):  # the pointwise ops' time beyond their streamed bytes, a step of the rank
        sc = scenario(b)
        m, plan = sc.model, sc.plan
        with_rates, streamed = (CostModel(sc.cluster.gpu, "fp32", p) for p in (profile, plain))
        ops = [(m.num_layers, op) for ph in ("fwd", "bwd") for op in layer_ops(m, plan, ph)]
        ops += [(1, op) for ph in ("fwd", "bwd") for op in head_ops(m, plan, ph)]
        return 2 * sum(n * (with_rates.time(op) - streamed.time(op)) for n, op in ops if getattr(op, "pointwise", ""))

    assert computed(1) > 0 and computed(2) > computed(1)
    for b in (1, 2):
        assert step(profile, b) - step(plain, b) == pytest.approx(computed(b), rel=1e-9)
    assert (step(profile, 2) - step(profile, 1)) - (step(plain, 2) - step(plain, 1)) == \
        pytest.approx(computed(2) - computed(1), rel=1e-6)


def test_the_rates_move_with_the_training_loops_compute_scale_and_back():
    t = replace(truth(), pointwise_s={k: [(n, r / 0.8) for n, r in v] for k, v in with_pointwise().pointwise_s.items()})
    def rates(p, op):
        return [r for _, r in p.pointwise_s[op]]

    bench_only = microbenchmark_part(t)
    assert rates(bench_only, "gelu fwd") == pytest.approx(rates(with_pointwise(), "gelu fwd"))
    runs = [phased(t, "small")[1], phased(t, "large", micro_batch_size=8, global_batch_size=16)[1]]
    fitted, _, _ = fit_terms(bench_only, runs)
    assert fitted.compute_scale == pytest.approx(0.8, rel=0.02)
    assert rates(fitted, "gelu bwd") == pytest.approx(rates(t, "gelu bwd"), rel=0.02)
    # ranks that time-share the cores take longer for them, as for every kernel
    assert t.slowed(2.0).pointwise_time("gelu fwd", 1e5) == pytest.approx(2 * t.pointwise_time("gelu fwd", 1e5))


def test_profiles_keep_the_rates_and_refuse_bad_ones_naming_the_field(tmp_path):
    profile = with_pointwise()
    profile.save(tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json").pointwise_s == profile.pointwise_s
    d = json.loads((tmp_path / "p.json").read_text())
    old = {k: v for k, v in d.items() if k != "pointwise_s"}
    (tmp_path / "v12.json").write_text(json.dumps({**old, "version": 12}))
    assert load_profile(tmp_path / "v12.json").pointwise_s == {}
    for bad in ({"gelu": [[4096, 1e-9]]}, {"gelu fwd": []}, {"gelu fwd": [[4096, 1e-9, 3]]}):
        (tmp_path / "bad.json").write_text(json.dumps({**d, "pointwise_s": bad}))
        with pytest.raises(ScenarioError, match=r"--profile\.pointwise_s\.gelu"):
            load_profile(tmp_path / "bad.json")
    (tmp_path / "neg.json").write_text(json.dumps({**d, "pointwise_s": {"gelu fwd": [[4096, -1e-9]]}}))
    with pytest.raises(ScenarioError, match=r"pointwise_s\.gelu fwd\.0\.1"):
        load_profile(tmp_path / "neg.json")
