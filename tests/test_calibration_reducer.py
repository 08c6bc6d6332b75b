"""DDP's reducer on a CPU's training thread (profile v14 ``ddp_reducer_tensor_s`` and
``ddp_reducer_byte_s``, executor.bench_reducer, simdist.analytic.reducer): the backward that
synchronises the gradients costs a hook and two copies per gradient tensor beyond the others, once a
step, which the plain plans' fit spread over their ops before."""

import json
from dataclasses import replace

import pytest
from test_calibration import local_scenario, synthetic_bench

from simdist.analytic.cpu_optimizer import stage_tensors
from simdist.analytic.params import params_per_rank
from simdist.calibrate.fit import fit_profile, reducer_rates
from simdist.errors import ScenarioError
from simdist.predict import predict
from simdist.spec.profile import load_profile
from simdist.spec.scenario import scenario_from_dict
from simdist.spec.software_layers import runs_ddp_reducer

# this guest's reducer, 2 ranks at once (executor.bench_reducer, 2026-11-30): (tensors, bytes, the
# synchronising backward's extra CPU seconds) of each rank
MEASURED = [(64, 34816, 366e-6), (8, 4202496, 722e-6), (64, 34816, 329e-6), (8, 4202496, 739e-6)]
ROWS = [{"tensors": t, "bytes": b, "extra_s": s} for t, b, s in MEASURED]
PER_TENSOR, PER_BYTE = 12e-6, 0.25e-3 / 2**20


def with_reducer(rows=ROWS):
    return fit_profile({**synthetic_bench(), "cores": 2, "reducer": rows})


def test_the_fit_splits_the_extra_time_into_a_cost_per_tensor_and_per_byte():
    synthetic = [{"tensors": t, "bytes": b, "extra_s": t * PER_TENSOR + b * PER_BYTE} for t, b, _ in MEASURED]
    assert reducer_rates(synthetic) == (pytest.approx(PER_TENSOR), pytest.approx(PER_BYTE))
    per_tensor, per_byte = reducer_rates(ROWS)  # the ranks' rows of a stack at their median
    assert 3e-6 < per_tensor < 10e-6 and 0.05e-3 / 2**20 < per_byte < 0.5e-3 / 2**20
    assert reducer_rates(ROWS[:1]) == (0.0, 0.0)  # one stack cannot tell the two apart
    # bytes that cost nothing measurable: all of it per tensor, never a negative rate
    flat = [{"tensors": 64, "bytes": 34816, "extra_s": 640e-6},
            {"tensors": 8, "bytes": 4202496, "extra_s": 60e-6}]
    per_tensor, per_byte = reducer_rates(flat)
    assert per_byte == 0.0 and per_tensor == pytest.approx((64 * 640e-6 + 8 * 60e-6) / (64**2 + 8**2))
    # and tensors that cost nothing: all of it per byte
    free = [{"tensors": 64, "bytes": 34816, "extra_s": 0.0}, {"tensors": 8, "bytes": 4202496, "extra_s": 700e-6}]
    assert reducer_rates(free) == (0.0, pytest.approx(4202496 * 700e-6 / (34816**2 + 4202496**2)))


@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_a_ddp_step_costs_its_tensors_and_bytes_once_more(engine):
    profile = replace(with_reducer(), ddp_reducer_tensor_s=PER_TENSOR, ddp_reducer_byte_s=PER_BYTE)
    plain = replace(profile, ddp_reducer_tensor_s=0.0, ddp_reducer_byte_s=0.0)
    for mb, n in ((1, 1), (1, 4), (2, 2)):  # once a step, however many micro-batches
        sc = scenario_from_dict(local_scenario(micro_batch_size=mb, global_batch_size=2 * mb * n))
        once = (stage_tensors(sc.model, sc.plan, 0) * PER_TENSOR
                + params_per_rank(sc.model, sc.plan, 0) * 4 * PER_BYTE)
        assert once > 0.3e-3
        paid, unpaid = (predict(sc, profile=p, engine=engine).step_time_s for p in (profile, plain))
        assert paid - unpaid == pytest.approx(once, rel=1e-6)


def test_only_plans_through_ddps_reducer_pay_it():
    profile = replace(with_reducer(), ddp_reducer_tensor_s=PER_TENSOR, ddp_reducer_byte_s=PER_BYTE)
    plain = replace(profile, ddp_reducer_tensor_s=0.0, ddp_reducer_byte_s=0.0)
    plans = {"ddp": {}, "zero1": {"zero_stage": 1}, "zero2": {"zero_stage": 2}, "zero3": {"zero_stage": 3},
             "one replica": {"tp": 2}, "1f1b": {"pp": 2}, "ps": {"gradient_sync": "parameter-server"},
             "compression": {"grad_compression": {"method": "fp16"}}}
    for name, plan in plans.items():
        sc = scenario_from_dict(local_scenario(**plan))
        paid = predict(sc, profile=profile, engine="analytic").step_time_s > \
            predict(sc, profile=plain, engine="analytic").step_time_s
        assert paid == runs_ddp_reducer(sc.plan) == (name in ("ddp", "zero1", "compression")), name


def test_profiles_keep_the_rates_scale_them_when_ranks_time_share_and_refuse_bad_ones(tmp_path):
    profile = with_reducer()
    assert profile.ddp_reducer_tensor_s > 0 and profile.ddp_reducer_byte_s > 0
    profile.save(tmp_path / "p.json")
    back = load_profile(tmp_path / "p.json")
    assert (back.ddp_reducer_tensor_s, back.ddp_reducer_byte_s) == (profile.ddp_reducer_tensor_s,
                                                                     profile.ddp_reducer_byte_s)
    d = json.loads((tmp_path / "p.json").read_text())
    old = {k: v for k, v in d.items() if not k.startswith("ddp_reducer")}
    (tmp_path / "v13.json").write_text(json.dumps({**old, "version": 13}))
    assert load_profile(tmp_path / "v13.json").ddp_reducer_tensor_s == 0.0
    slowed = profile.slowed(2.0)
    assert slowed.ddp_reducer_tensor_s == pytest.approx(2 * profile.ddp_reducer_tensor_s)
    assert slowed.ddp_reducer_byte_s == pytest.approx(2 * profile.ddp_reducer_byte_s)
    (tmp_path / "neg.json").write_text(json.dumps({**d, "ddp_reducer_tensor_s": -1e-6}))
    with pytest.raises(ScenarioError, match=r"--profile\.ddp_reducer_tensor_s"):
        load_profile(tmp_path / "neg.json")
