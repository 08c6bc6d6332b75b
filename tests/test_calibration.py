"""Calibration: fitting, the profile file, the run store and the comparison (no torch needed)."""

import json
import math
import sqlite3

import pytest
import yaml
from conftest import measurement, run_cli

from simdist.calibrate.fit import fit_alpha_beta, fit_profile, ring_terms
from simdist.calibrate.store import RunStore
from simdist.errors import ScenarioError
from simdist.predict import predict
from simdist.spec.profile import CalibrationProfile, load_profile
from simdist.spec.scenario import scenario_from_dict


def synthetic_bench(alpha=50e-6, beta=2e9, peak=100e9, bw=20e9) -> dict:
    """Timings generated from known parameters: the fit must recover them."""
    gemm = []
    for n in (64, 256, 1024):
        flops = 2.0 * n**3
        eff = n / (n + 64)  # small GEMMs run below peak
        gemm.append({"m": n, "n": n, "k": n, "flops": flops, "seconds": flops / (peak * eff)})
    memory = [{"bytes": b, "seconds": b / bw} for b in (1e5, 1e7)]
    attention = [{"flops": 1e9, "seconds": 1e9 / (0.5 * peak * 1024 / 1088)}]
    coll = []
    for kind in ("allreduce", "allgather", "sendrecv"):
        for nbytes in (4096.0, 2**20, 2**26):
            steps, wire = ring_terms(kind, 2, nbytes)
            coll.append({"kind": kind, "ranks": 2, "bytes": nbytes, "seconds": steps * alpha + wire / beta})
    return {"gemm": gemm, "memory": memory, "attention": attention, "collectives": coll,
            "world_size": 2, "threads": 1, "device": "cpu", "torch_version": "x"}


def test_fit_recovers_known_link_and_compute_parameters():
    prof = fit_profile(synthetic_bench())
    link = prof.links["intra.allreduce"]
    assert link.latency_s == pytest.approx(50e-6, rel=1e-6)
    assert link.bandwidth_bytes_per_s == pytest.approx(2e9, rel=1e-6)
    assert prof.residuals["link intra.allreduce"] < 1e-9
    assert prof.peak_flops == pytest.approx(100e9 * 1024 / 1088)
    assert prof.efficiency("gemm", 2.0 * 64**3) == pytest.approx((64 / 128) / (1024 / 1088))
    assert prof.efficiency("gemm", 1e20) == pytest.approx(1.0)  # clamped beyond the largest point


def test_alpha_beta_residual_reports_a_bad_fit():
    rows = [{"kind": "allreduce", "ranks": 2, "bytes": b, "seconds": t}
            for b, t in ((1e3, 1e-3), (1e6, 1e-6), (1e8, 1.0))]
    *_, rms = fit_alpha_beta(rows)
    assert rms > 0.1


def test_profile_roundtrip_and_version_check(tmp_path):
    prof = fit_profile(synthetic_bench())
    path = tmp_path / "p.json"
    prof.save(path)
    again = load_profile(path)
    assert again == prof
    data = json.loads(path.read_text())
    data["version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(ScenarioError, match=r"profile\.version"):
        load_profile(path)


def local_scenario(**plan) -> dict:
    return {"name": "local", "model": {"preset": "tiny"},
            "cluster": {"preset": "local", "num_nodes": 1, "gpus_per_node": 2},
            "plan": {"global_batch_size": 8, "precision": "fp32", **plan}}


def test_local_cluster_needs_a_profile():
    sc = scenario_from_dict(local_scenario())
    with pytest.raises(ScenarioError, match="calibration profile"):
        predict(sc, engine="analytic")


def test_profile_drives_local_predictions():
    sc = scenario_from_dict(local_scenario())
    slow = fit_profile(synthetic_bench(peak=10e9, bw=2e9, beta=2e8))
    fast = fit_profile(synthetic_bench())
    t_slow = predict(sc, profile=slow, engine="analytic").step_time_s
    t_fast = predict(sc, profile=fast, engine="analytic").step_time_s
    assert t_slow > 3 * t_fast


def test_store_is_transactional_and_keyed_by_hash(tmp_path):
    store = RunStore(tmp_path / "runs.db")
    store.add("measurement", {"name": "a", "scenario_hash": "abc123", "step_time_s": 1.0}, "name: a")
    store.add("prediction", {"name": "a", "scenario_hash": "abc123", "step_time_s": 1.1}, engine="des")
    with pytest.raises(sqlite3.IntegrityError):
        store.add("bogus", {"name": "b", "scenario_hash": "x"})  # rejected whole
    assert [r.kind for r in store.runs(scenario_hash="abc")] == ["measurement", "prediction"]
    assert len(RunStore(tmp_path / "runs.db").runs()) == 2  # persisted, nothing half-written


def test_compare_reports_errors_per_quantity(tmp_path):
    from simdist.calibrate.compare import compare_one, predicted_quantities

    prof = fit_profile(synthetic_bench())
    d = local_scenario()
    sc = scenario_from_dict(d)
    pred = predicted_quantities(sc, prof)
    meas = measurement(scenario_hash=sc.hash(), step_time_s=pred["step_time_s"] * 1.25,
                       step_times_s=[pred["step_time_s"] * x for x in (1.2, 1.25, 1.3)])
    meas["phases_s"] = {"forward": pred["forward_s"], "backward": None}
    meas["memory"]["per_rank"] = [{"rank": 0, "model_state_gib": pred["model_state_gib"], "activations_gib": 0.0,
                                   "peak_gib": pred["model_state_gib"]}]
    c = compare_one(meas, yaml.safe_dump(d), prof)
    assert c.error("step_time_s") == pytest.approx(1 / 1.25 - 1)
    assert c.error("model_state_gib") == pytest.approx(0.0)
    assert c.spread == pytest.approx(0.1 / 1.25)
    assert math.isfinite(c.predicted["backward_s"])
    assert "backward_s" not in c.measured  # a phase the executor could not separate is not compared


def test_runs_and_compare_cli(tmp_path):
    db = tmp_path / "runs.db"
    from dataclasses import replace

    prof = replace(fit_profile(synthetic_bench()), reference_cpu_s=2.7e-3, reference_ops_cpu_s=3e-3)  # at the fit
    prof.save(tmp_path / "p.json")
    d = local_scenario()
    sc = scenario_from_dict(d)
    slower = {"environment": {"reference_cpu_s": 2.7e-3, "reference_ops_cpu_s": 3.75e-3}}  # small ops 25% slower
    RunStore(db).add("measurement", measurement(scenario_hash=sc.hash(), **slower), yaml.safe_dump(d))
    RunStore(db).add("measurement", measurement(name="broken", scenario_hash="bad", step_time_s=-1.0), yaml.safe_dump(d))
    r = run_cli("runs", "--db", str(db))
    assert r.returncode == 0 and sc.hash() in r.stdout
    r = run_cli("compare", "--db", str(db), "--profile", str(tmp_path / "p.json"), "--html", str(tmp_path / "c.html"))
    assert r.returncode == 0, r.stderr
    assert "step_time_s" in r.stdout and (tmp_path / "c.html").stat().st_size > 1000
    assert "the host ran 25% slower than during the fit runs" in r.stdout
    # a stored payload that is not a measurement is named and skipped, never half-used
    assert "skipped broken (run 2): measurement.step_time_s: must be a positive number of seconds" in r.stderr


def test_calibrate_from_saved_benchmarks(tmp_path):
    (tmp_path / "bench.json").write_text(json.dumps(synthetic_bench()))
    r = run_cli("calibrate", "--nproc", "2", "--out", str(tmp_path / "p.json"), "--bench", str(tmp_path / "bench.json"))
    assert r.returncode == 0, r.stderr
    prof = CalibrationProfile.from_dict(json.loads((tmp_path / "p.json").read_text()))
    assert prof.links["intra.sendrecv"].latency_s == pytest.approx(50e-6, rel=1e-6)


def test_framework_overhead_applies_only_to_its_software_layer():
    from dataclasses import replace

    prof = fit_profile(synthetic_bench())
    slow_tp = replace(prof, framework_overheads_s={"tp": 1e-3})
    dp = scenario_from_dict(local_scenario())
    tp = scenario_from_dict(local_scenario(tp=2))
    assert predict(dp, profile=slow_tp, engine="analytic").step_time_s == pytest.approx(
        predict(dp, profile=prof, engine="analytic").step_time_s)
    assert predict(tp, profile=slow_tp, engine="analytic").step_time_s > 1.5 * predict(
        tp, profile=prof, engine="analytic").step_time_s


@pytest.mark.parametrize("preset, linears", [("tiny", 6), ("tiny-llama", 7)])
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_tp_dispatch_cost_is_paid_per_dtensor_op_the_executor_runs(sequence_parallel, preset, linears):
    """DTensor TP's per-op term prices what the executor runs on DTensors: one op per split linear
    of executor/model.py (the GPT's q, k, v, o, fc1, fc2; the Llama's q, k, v, o, gate, up, down:
    the op lists' fused qkv and SwiGLU fc1 stand for 3 and 2) forward, two backward, and with
    sequence parallelism the 2 norms; the attention, activations and residual adds run on local
    tensors and pay nothing (simdist.analytic.profile_terms.dtensor_ops)."""
    from dataclasses import replace

    from simdist.analytic.collectives import Network
    from simdist.analytic.cost import CostModel
    from simdist.analytic.ops import layer_ops
    from simdist.analytic.passes import OpTimer

    prof = fit_profile(synthetic_bench())
    d = local_scenario(tp=2, sequence_parallel=sequence_parallel)
    sc = scenario_from_dict({**d, "model": {"preset": preset}})

    def compute(p: CalibrationProfile, phase: str) -> float:
        timer = OpTimer(sc, CostModel(sc.cluster.gpu, sc.plan.precision, p), Network.of(sc.cluster, p))
        return timer.passes(layer_ops(sc.model, sc.plan, phase)).compute

    dear = replace(prof, framework_overheads_s={"tp": 1e-3})
    for phase, per_linear in (("fwd", 1), ("bwd", 2)):
        paying = linears * per_linear + (2 if sequence_parallel else 0)
        assert compute(dear, phase) - compute(prof, phase) == pytest.approx(paying * 1e-3, rel=1e-9)


@pytest.mark.parametrize("pp, paying", [(1, 2), (2, 0)])
def test_the_loss_runs_on_dtensors_only_where_the_executor_keeps_the_logits_sharded(pp, paying):
    """Without a pipeline the executor computes the loss vocabulary-parallel (DTensor's
    loss_parallel: two handlers a pass); a pipeline's last stage gathers the logits and computes
    it on local tensors (simdist.analytic.profile_terms.dtensor_ops)."""
    from simdist.analytic.ops import Compute, head_ops
    from simdist.analytic.profile_terms import dtensor_ops

    d = local_scenario(tp=2, pp=pp)
    sc = scenario_from_dict({**d, "cluster": {**d["cluster"], "gpus_per_node": 4}})
    for phase in ("fwd", "bwd"):
        loss = [op for op in head_ops(sc.model, sc.plan, phase) if isinstance(op, Compute)
                and op.name.startswith("cross entropy")]
        assert len(loss) == 1 and dtensor_ops(loss[0], sc.model, sc.plan) == paying


def test_sync_wait_fraction_is_the_unexplained_comm_over_compute():
    from simdist.calibrate.fit import fit_sync_wait

    prof = fit_profile(synthetic_bench())
    runs = [({"forward_s": 0.1, "backward_s": 0.3, "comm_s": 0.25}, {"comm_s": 0.05}),  # 0.2 / 0.4
            ({"forward_s": 0.2, "backward_s": 0.2, "comm_s": 0.12}, {"comm_s": 0.04})]  # 0.08 / 0.4
    fitted = fit_sync_wait(prof, "zero3", runs)
    assert fitted.sync_wait_fractions == {"zero3": pytest.approx((0.5 + 0.2) / 2)}
    assert fitted.residuals["sync wait fraction spread (zero3 runs)"] == pytest.approx(0.3)
    assert fit_sync_wait(prof, "tp", [({"forward_s": 0.1, "backward_s": 0.1}, {"comm_s": 0.0})]) is prof


@pytest.mark.parametrize("plan, part", [({"tp": 2}, "tp_comm"), ({"zero_stage": 3}, "dp_comm")])
def test_sync_waits_add_a_fraction_of_compute_in_both_engines(plan, part):
    from dataclasses import replace

    prof = fit_profile(synthetic_bench())
    key = "tp" if "tp" in plan else "zero3"
    waits = replace(prof, sync_wait_fractions={key: 0.5})
    sc = scenario_from_dict(local_scenario(**plan))
    dp = scenario_from_dict(local_scenario())
    for engine in ("analytic", "des"):
        base, slow = (predict(sc, profile=p, engine=engine) for p in (prof, waits))
        added = slow.step_time_s - base.step_time_s
        compute = base.breakdown_s["compute"] + base.breakdown_s["recompute"]
        assert added == pytest.approx(0.5 * compute, rel=0.05), engine
        assert slow.breakdown_s[part] - base.breakdown_s[part] == pytest.approx(added, rel=0.05), engine
        # plans without the software layer have no such sync points
        assert predict(dp, profile=waits, engine=engine).step_time_s == pytest.approx(
            predict(dp, profile=prof, engine=engine).step_time_s)


# --- the measurement file ----------------------------------------------------------------------------


def test_measurement_round_trips_with_its_extras(tmp_path):
    from simdist.spec.measurement import Measurement, load_measurement

    d = measurement(step_time_s=0.2, step_times_s=[0.3, 0.2, 0.1], restarts=1, restart_s=2.5,
                    ps={"bytes_per_server_per_step": 10.0})
    m = Measurement.from_dict(d)
    assert m.step_times_s == (0.3, 0.2, 0.1) and m.per_rank[0].activations_gib == 0.002
    assert m.extras == {"restarts": 1, "restart_s": 2.5, "ps": {"bytes_per_server_per_step": 10.0}}
    assert m.spread == pytest.approx(1.0)
    assert list(m.to_dict()) == list(d) and m.to_dict() == d  # the same JSON, keys in order
    m.save(tmp_path / "m.json")
    assert load_measurement(tmp_path / "m.json") == m


def test_bad_measurement_names_every_field(tmp_path):
    from simdist.spec.measurement import Measurement, load_measurement

    d = measurement(step_times_s=[0.1, 0.1])
    d.update(steps=3, world_size=0, device=None, losses=[1.0, float("nan")])
    d["phases_s"]["comm"] = -1.0
    del d["memory"]["per_rank"][0]["peak_gib"]
    with pytest.raises(ScenarioError) as err:
        Measurement.from_dict(d)
    fields = {p.field for p in err.value.problems}
    assert fields == {"measurement.world_size", "measurement.device", "measurement.step_times_s",
                      "measurement.losses[1]", "measurement.phases_s.comm", "measurement.memory.per_rank[0].peak_gib"}
    (tmp_path / "m.json").write_text("{not json")
    with pytest.raises(ScenarioError, match="not valid JSON"):
        load_measurement(tmp_path / "m.json")
