"""Phase-by-phase fitting of a profile's executor terms (simdist.calibrate.phases), the CPU
optimizer's per-tensor cost (simdist.analytic.cpu_optimizer) and refitting from the run store
(simdist.calibrate.refit, `simdist calibrate --refit`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from conftest import measurement, run_cli
from test_calibration import local_scenario, synthetic_bench

from simdist.analytic.cpu_optimizer import block_tensors, per_tensor_optimizer_time, stage_tensors
from simdist.calibrate.compare import predicted_quantities
from simdist.calibrate.fit import fit_profile
from simdist.calibrate.phases import one_term, two_terms
from simdist.calibrate.refit import microbenchmark_part
from simdist.calibrate.repeat import Repeated
from simdist.calibrate.store import RunStore
from simdist.calibrate.terms import FitRun, fit_checks, fit_terms
from simdist.predict import predict
from simdist.spec.measurement import Measurement
from simdist.spec.profile import load_profile
from simdist.spec.scenario import scenario_from_dict
from simdist.spec.software_layers import BASE_TERMS


def truth():
    """A machine whose executor runs 0.8x the microbenchmarks' rate, with known terms."""
    base = fit_profile({**synthetic_bench(), "cores": 2})
    return replace(base, peak_flops=base.peak_flops * 0.8,
                   memory_bandwidth_bytes_per_s=base.memory_bandwidth_bytes_per_s * 0.8, compute_scale=0.8,
                   kernel_overhead_s=3e-5, optimizer_tensor_s=2e-5, framework_overheads_s={"tp": 1e-4},
                   optimizer_layer_tensor_s={"tp": 5e-5}, sync_wait_fractions={BASE_TERMS: 0.05, "tp": 0.3})


def phased(profile, name: str, cluster: dict | None = None, helper_share: float | None = None,
           model: dict | None = None, **plan) -> tuple[dict, FitRun]:
    """A run whose phases and step are ``profile``'s prediction (as the executor reports them);
    with ``helper_share``, its other threads' CPU time is that share of its exposed communication."""
    d = {**local_scenario(**plan), "name": name, **({"cluster": cluster} if cluster else {}),
         **({"model": model} if model else {})}
    q = predicted_quantities(scenario_from_dict(d), profile)
    cpu = predicted_quantities(scenario_from_dict(d), replace(profile, cores=0))  # CPU time: never stretched
    phases = {"forward": cpu["forward_s"], "backward": cpu["backward_s"], "optimizer": cpu["optimizer_s"],
              "comm": q["comm_s"], "core_wait": 0.0, "other": 0.0,
              **({} if helper_share is None else {"helper_threads": helper_share * q["comm_s"]})}
    payload = measurement(name=name, scenario_hash=scenario_from_dict(d).hash(), step_time_s=q["step_time_s"],
                          phases_s=phases)
    runs = (Measurement.from_dict(payload),)
    return payload, FitRun(name, yaml.safe_dump(d), ".", Repeated(name, runs, True, "stable"))


def test_the_phases_give_back_the_rate_the_overheads_and_the_waits():
    t = truth()
    runs = [phased(t, "small")[1], phased(t, "large", micro_batch_size=8, global_batch_size=16)[1],
            phased(t, "tp", tp=2)[1]]
    fitted, bounds, unusable = fit_terms(microbenchmark_part(t), runs)
    assert unusable == [] and not [b for b in bounds if b.hit]
    assert fitted.compute_scale == pytest.approx(0.8, rel=0.02)
    assert fitted.peak_flops == pytest.approx(t.peak_flops, rel=0.02)
    assert fitted.kernel_overhead_s == pytest.approx(3e-5, rel=0.05)
    assert fitted.optimizer_tensor_s == pytest.approx(2e-5, rel=0.05)
    assert fitted.framework_overheads_s["tp"] == pytest.approx(1e-4, rel=0.05)
    assert fitted.optimizer_layer_tensor_s["tp"] == pytest.approx(5e-5, rel=0.05)
    assert fitted.sync_wait_fractions[BASE_TERMS] == pytest.approx(0.05, rel=0.05, abs=1e-3)
    assert fitted.sync_wait_fractions["tp"] == pytest.approx(0.3, rel=0.05)
    assert fitted.sleep_shares == {}  # runs without their other threads' CPU time cannot tell what they slept
    assert all(abs(c.error) < 0.01 for c in fit_checks(fitted, runs))


def test_the_plain_runs_tell_the_fixed_wait_at_the_gradient_sync_from_the_share_of_compute():
    """Profile v5: a tiny DDP plan and a large one pay the same fixed wait once a step at the
    gradient sync beside a share of their compute; the two plain runs give both back, and the
    wait is on the step's last gradient-sync calls in both engines."""
    from simdist.predict import predict

    t = replace(truth(), dp_step_wait_s=2e-3)
    runs = [phased(t, "small")[1], phased(t, "large", micro_batch_size=8, global_batch_size=16)[1]]
    fitted, bounds, _ = fit_terms(microbenchmark_part(t), runs)
    assert not [b for b in bounds if b.hit]
    assert fitted.dp_step_wait_s == pytest.approx(2e-3, rel=0.05)
    assert fitted.sync_wait_fractions[BASE_TERMS] == pytest.approx(0.05, rel=0.05, abs=1e-3)
    sc = scenario_from_dict(local_scenario())
    without = replace(t, dp_step_wait_s=0.0)
    for engine in ("analytic", "des"):
        added = predict(sc, profile=t, engine=engine).step_time_s - predict(sc, profile=without, engine=engine).step_time_s
        assert added == pytest.approx(2e-3, rel=0.01)
    pipe = scenario_from_dict(local_scenario(pp=2))  # no data parallelism: no gradient sync to wait at
    assert predict(pipe, profile=t, engine="analytic").step_time_s == predict(pipe, profile=without,
                                                                              engine="analytic").step_time_s


def test_a_fit_reads_each_phase_as_its_median_over_the_repeated_runs():
    """The run whose step is the median need not have median phases: the fit takes each phase's
    median over the runs (one run's comm far off moves nothing), and the median step."""
    d = {**local_scenario(), "name": "rep"}
    def run(step: float, comm: float, forward: float) -> Measurement:
        phases = {"forward": forward, "backward": 0.02, "optimizer": 0.003, "comm": comm, "core_wait": 0.0,
                  "other": 0.001}
        return Measurement.from_dict(measurement(name="rep", step_time_s=step, phases_s=phases))
    runs = (run(0.030, 0.004, 0.010), run(0.031, 0.020, 0.011), run(0.040, 0.005, 0.009))
    got = FitRun("rep", yaml.safe_dump(d), ".", Repeated("rep", runs, True, "stable")).measured()
    assert got["step_time_s"] == 0.031  # the median step; its run's comm (0.020) is the outlier
    assert got["comm_s"] == 0.005 and got["forward_s"] == 0.010 and got["other_s"] == 0.001


def test_the_slowest_ranks_step_counts_as_waits_where_the_ranks_are_alike():
    """The executor's step is its slowest rank's, its phases the ranks' means: without a
    pipeline the step left beyond the computing phases is waiting (for the others' jitter); a
    pipeline's stages differ by design, so there only the measured waits count."""
    from simdist.calibrate.phases import measured_waits

    m = {"forward_s": 0.004, "backward_s": 0.007, "other_s": 0.001, "optimizer_s": 0.003, "comm_s": 0.003,
         "core_wait_s": 0.001, "step_time_s": 0.021}
    assert measured_waits(m, symmetric=True) == pytest.approx(0.006)
    assert measured_waits(m, symmetric=False) == pytest.approx(0.004)
    assert measured_waits({**m, "step_time_s": 0.018}, symmetric=True) == pytest.approx(0.004)  # never below


def test_least_squares_on_relative_error():
    assert one_term([(3.0, 1.0, 2.0), (5.0, 1.0, 4.0)]) == pytest.approx(1.0)
    assert one_term([(1.0, 2.0, 1.0)]) == 0.0  # never below zero: the model already overprices
    assert two_terms([(3.0, 2.0, 1.0), (9.0, 8.0, 1.0)]) == pytest.approx((1.0, 1.0))
    assert two_terms([(3.0, 2.0, 1.0)]) == pytest.approx((1.0, 1.0))  # one run: the rate stays


def test_the_optimizer_pays_per_tensor_on_a_cpu_profile_only():
    d = local_scenario()
    sc = scenario_from_dict(d)
    n = stage_tensors(sc.model, sc.plan, 0)
    layers = sc.model.num_layers * block_tensors(sc.model, 0)
    assert n > layers  # plus the embeddings, the final norm and the head
    base = fit_profile(synthetic_bench())
    without = predicted_quantities(sc, base)["optimizer_s"]
    zero = predicted_quantities(sc, replace(base, optimizer_tensor_s=0.0))["optimizer_s"]
    with_term = predicted_quantities(sc, replace(base, optimizer_tensor_s=1e-4))["optimizer_s"]
    assert with_term - zero == pytest.approx(n * 1e-4) and without > zero  # the old 20 kernels are gone
    pp = scenario_from_dict(local_scenario(pp=2))
    assert stage_tensors(pp.model, pp.plan, 0) + stage_tensors(pp.model, pp.plan, 1) == n + (1 if sc.model.tie_embeddings else 0)


def test_a_tensor_parallel_optimizer_pays_dtensor_dispatch_unless_ddp_hands_it_local_shards():
    """Under TP the executor's optimizer steps DTensors (the TP layer's per-tensor term), except
    under DDP and ZeRO-1, where torch's TP x DDP bridge swaps the parameters for their local
    shards (measured: 1.7 against 9.1 ms of optimizer CPU per step on the tiny model at TP 2);
    FSDP2, and the FSDP2 replicate a multi-chunk pipeline runs, keep DTensors."""
    p = replace(truth(), optimizer_layer_tensor_s={"tp": 5e-5, "zero1": 0.0, "zero3": 0.0, "zero2": 0.0})

    def per_tensor(**plan) -> float:
        d = local_scenario(**plan)
        d["cluster"] = {**d["cluster"], "gpus_per_node": plan.get("tp", 1) * plan.get("dp", 1) * plan.get("pp", 1)
                        * plan.get("cp", 1)}
        sc = scenario_from_dict(d)
        return per_tensor_optimizer_time(sc, p, 0) / stage_tensors(sc.model, sc.plan, 0)

    assert per_tensor(tp=2) == pytest.approx(7e-5)  # DTensors, no data parallelism
    assert per_tensor(tp=2, dp=2) == pytest.approx(2e-5)  # DDP: local shards
    assert per_tensor(tp=2, dp=2, zero_stage=1) == pytest.approx(2e-5)  # ZeRO-1 is DDP + a sharded optimizer
    assert per_tensor(tp=2, dp=2, zero_stage=3) == pytest.approx(7e-5)  # FSDP2 on DTensors
    assert per_tensor(tp=2, dp=2, pp=2, virtual_pipeline_stages=2, schedule="interleaved-1f1b",
                      micro_batch_size=1) == pytest.approx(7e-5)  # FSDP2's replicate
    assert per_tensor(tp=2, cp=2, zero_stage=2) == pytest.approx(7e-5)  # FSDP2 over the context ranks
    assert per_tensor(tp=2, cp=2) == pytest.approx(2e-5)  # DDP over them
    assert per_tensor(dp=2) == pytest.approx(2e-5)  # no TP: nothing to localize


def test_a_parameter_sharded_by_tp_and_fsdp2_pays_one_dtensor_dispatch():
    """FSDP2 over TP (a 2-D mesh) still makes each parameter one DTensor: its optimizer ops pay the
    dearer of the TP and ZeRO-3 per-tensor terms, not their sum; a layer that is not DTensor's
    dispatch on the parameters (a pipeline's) adds to it (simdist.analytic.cpu_optimizer.layer_tensor_s)."""
    p = replace(truth(), optimizer_layer_tensor_s={"tp": 5e-5, "zero3": 3e-5, "pipeline": 1e-5})
    d = local_scenario(tp=2, dp=2, pp=2, zero_stage=3, micro_batch_size=1)
    sc = scenario_from_dict({**d, "cluster": {**d["cluster"], "gpus_per_node": 8}})
    per = per_tensor_optimizer_time(sc, p, 0) / stage_tensors(sc.model, sc.plan, 0)
    assert per == pytest.approx(p.optimizer_tensor_s + 5e-5 + 1e-5)
    dearer = replace(p, optimizer_layer_tensor_s={"tp": 5e-5, "zero3": 8e-5, "pipeline": 1e-5})
    assert per_tensor_optimizer_time(sc, dearer, 0) / stage_tensors(sc.model, sc.plan, 0) == pytest.approx(
        p.optimizer_tensor_s + 8e-5 + 1e-5)


def test_refit_from_the_run_store_keeps_the_microbenchmarks(tmp_path):
    t = truth()
    store = RunStore(tmp_path / "runs.db")
    files = []
    for name, plan in (("small", {}), ("large", {"micro_batch_size": 8, "global_batch_size": 16})):
        payload, run = phased(t, name, **plan)
        store.add("measurement", payload, run.scenario_yaml)
        (tmp_path / f"{name}.yaml").write_text(run.scenario_yaml)
        files.append(str(tmp_path / f"{name}.yaml"))
    t.save(tmp_path / "old.json")
    r = run_cli("calibrate", "--refit", str(tmp_path / "old.json"), "--db", str(tmp_path / "runs.db"),
                "--out", str(tmp_path / "new.json"), *files)
    assert r.returncode == 0, r.stderr
    new = load_profile(tmp_path / "new.json")
    assert new.compute_curves == t.compute_curves and new.links == t.links
    assert new.kernel_overhead_s == pytest.approx(3e-5, rel=0.05) and new.compute_scale == pytest.approx(0.8, rel=0.02)
    assert new.fitted_from == ["microbenchmarks", "small", "large"]
    missing = run_cli("calibrate", "--refit", str(tmp_path / "old.json"), "--db", str(tmp_path / "runs.db"),
                      "--out", str(tmp_path / "x.json"), "scenarios/tiny-ddp.yaml")
    assert missing.returncode == 2 and "holds no measurement of it" in missing.stderr


def test_a_refused_fit_is_kept_beside_the_profile_and_refit_with_force_writes_it(tmp_path):
    """A refused fit writes nothing at --out but keeps the fit beside it (PROFILE.refused.json)
    and prints the command that accepts it from there without measuring again; that command,
    run as printed, writes the profile. The runs here are refused because one of them took 40%
    longer a step than its phases say (a slow phase of the machine the terms cannot follow)."""
    import shlex

    t = truth()
    store = RunStore(tmp_path / "runs.db")
    files = []
    for name, plan in (("small", {}), ("large", {"micro_batch_size": 8, "global_batch_size": 16})):
        payload, run = phased(t, name, **plan)
        if name == "large":
            payload = {**payload, "step_time_s": payload["step_time_s"] * 1.4}
        store.add("measurement", payload, run.scenario_yaml)
        (tmp_path / f"{name}.yaml").write_text(run.scenario_yaml)
        files.append(str(tmp_path / f"{name}.yaml"))
    t.save(tmp_path / "old.json")
    out = tmp_path / "new.json"
    r = run_cli("calibrate", "--refit", str(tmp_path / "old.json"), "--db", str(tmp_path / "runs.db"),
                "--out", str(out), *files)
    assert r.returncode == 1 and "calibration refused" in r.stderr
    assert not out.exists() and (tmp_path / "new.refused.json").is_file()
    hint = next(line for line in r.stderr.splitlines() if line.startswith("the refused fit is kept in"))
    command = shlex.split(hint.split("`")[1])
    assert command[:2] == ["simdist", "calibrate"] and "--force" in command
    accepted = run_cli(*command[1:])
    assert accepted.returncode == 0, accepted.stderr
    assert load_profile(out).fitted_from == ["microbenchmarks", "small", "large"]


def test_held_out_runs_are_not_fitted_and_are_checked_against_the_new_profile(tmp_path):
    """`simdist calibrate --held-out`: the plans are measured with the fitted ones (here: stored,
    --refit) but left out of the fit; once the profile is written each is predicted with it, its
    error printed beside its spread. A plan given both ways is refused, naming --held-out."""
    t = truth()
    store = RunStore(tmp_path / "runs.db")
    files = {}
    for name, plan in (("small", {}), ("large", {"micro_batch_size": 8, "global_batch_size": 16}),
                       ("mid", {"micro_batch_size": 4, "global_batch_size": 8})):
        payload, run = phased(t, name, **plan)
        store.add("measurement", payload, run.scenario_yaml)
        files[name] = tmp_path / f"{name}.yaml"
        files[name].write_text(run.scenario_yaml)
    t.save(tmp_path / "old.json")
    r = run_cli("calibrate", "--refit", str(tmp_path / "old.json"), "--db", str(tmp_path / "runs.db"),
                "--out", str(tmp_path / "new.json"), str(files["small"]), str(files["large"]),
                "--held-out", str(files["mid"]))
    assert r.returncode == 0, r.stderr
    assert load_profile(tmp_path / "new.json").fitted_from == ["microbenchmarks", "small", "large"]
    table = r.stdout[r.stdout.index("held-out run"):].splitlines()
    row = next(line for line in table if line.startswith("mid "))
    error = float(row.split()[5].rstrip("%"))
    assert abs(error) < 2.0  # the machine the runs came from: the refitted terms predict it
    assert "1 of 1 held-out plans within 15% of their measured median" in r.stdout
    both = run_cli("calibrate", "--refit", str(tmp_path / "old.json"), "--db", str(tmp_path / "runs.db"),
                   "--out", str(tmp_path / "x.json"), str(files["small"]), "--held-out", str(files["small"]))
    assert both.returncode == 2 and "--held-out" in both.stderr and "held out of its own fit" in both.stderr


def test_sync_points_follow_the_executors_calls():
    """The counts the executor measured on the bundled plans (collectives_per_rank, 2026-11-28:
    every collective, and of a pipeline's transfers the receives, which wait for the peer to run;
    gloo sends a small message without it). Its ZeRO-3 is FSDP2: a root module besides the
    layers, every micro-batch's gradients reduce-scattered, no gather for a recomputed forward;
    in a pipeline each module gathered and reduced once a step (tiny-2d-pp-fsdp, 2026-11-29)."""
    from simdist.analytic.cpu_syncs import sync_points
    from simdist.spec.scenario import load_scenario

    for name, measured in (("tiny-ddp", 1), ("tiny-pp-1f1b", 4), ("tiny-pp-interleaved", 12), ("tiny-hsdp", 41),
                           ("tiny-fsdp3", 30), ("tiny-2d-pp-fsdp", 8)):
        sc = load_scenario(f"scenarios/{name}.yaml")
        got = max(sync_points(sc, s, fsdp2=True) for s in range(sc.plan.pp))
        assert got == pytest.approx(measured, rel=0.05), name


def test_time_shared_ranks_wait_at_sync_points_and_the_fit_finds_it():
    from simdist.analytic.cpu_syncs import sync_points
    from simdist.analytic.timeshare import time_shared

    four = {"cluster": {"preset": "local", "num_nodes": 1, "gpus_per_node": 4}}
    t = replace(truth(), coschedule_wait_s=1.5e-3)
    sc = scenario_from_dict({**local_scenario(zero_stage=3, global_batch_size=8), **four})
    points = sync_points(sc, 0, fsdp2=True)  # a gloo profile prices the executor: its ZeRO-3 is FSDP2
    waited = time_shared(sc, t)[1] - time_shared(sc, replace(t, coschedule_wait_s=0.0))[1]
    full = predicted_quantities(sc, replace(t, cores=0))["step_time_s"]
    assert waited * full == pytest.approx(points * 0.5 * 1.5e-3, rel=1e-6)  # half the peers descheduled
    shared = phased(t, "four", four["cluster"], global_batch_size=8)[1]
    runs = [phased(t, "small")[1], phased(t, "large", micro_batch_size=8, global_batch_size=16)[1], shared]
    fitted, bounds, _ = fit_terms(microbenchmark_part(t), runs)
    assert not [b for b in bounds if b.hit]
    assert fitted.coschedule_wait_s == pytest.approx(1.5e-3, rel=0.05) and fitted.terms_from["coschedule"] == "four"


def test_a_pipeline_stage_competes_for_the_cores_for_its_share_of_the_step():
    """With more ranks than cores, a peer at a sync point is descheduled with probability
    1 - cores / competing ranks: all ranks without a pipeline; with one, the busiest stage's ranks
    and every other stage's for the share of the step it computes (m x its time per micro-batch):
    the rest of its step (the fill and drain, a lighter stage's slack) it waits off the cores."""
    from simdist.analytic.collectives import Network
    from simdist.analytic.cost import CostModel
    from simdist.analytic.stage import describe
    from simdist.analytic.steptime import reduce_step, stage_time
    from simdist.analytic.timeshare import competing_ranks, time_shared
    from simdist.spec.scenario import load_scenario

    t = replace(truth(), coschedule_wait_s=1.5e-3)
    for name, pipelined in (("tiny-moe-ep-dp", False), ("tiny-moe-ep-pp", True), ("tiny-2d-pp-tp", True)):
        sc = load_scenario(f"scenarios/{name}.yaml")
        d = describe(sc, CostModel(sc.cluster.gpu, sc.plan.precision, t), Network.of(sc.cluster, t))
        totals = [stage_time(d, s).total for s in d.stages]
        step = reduce_step(d).step_time
        ranks = competing_ranks(d, step)
        if not pipelined:
            assert ranks == sc.plan.world_size
            continue
        other = min(totals) * sc.plan.num_microbatches / step  # two stages: the other one's share
        assert 0 < other < 1 and ranks == pytest.approx(2 * (1 + other)) and ranks < sc.plan.world_size
        # many micro-batches: the fill and drain vanish, a stage's share tends to its time over the busiest's
        assert competing_ranks(d, sc.plan.num_microbatches * max(totals)) == pytest.approx(2 + 2 * min(totals) / max(totals))
        lighter = time_shared(sc, t)[1]
        assert lighter > time_shared(sc, replace(t, coschedule_wait_s=0.0))[1]  # still waits, less


def test_the_fit_finds_the_share_of_their_communication_the_ranks_sleep():
    """Profile v7: the wall time a run's process spent off the cores (exposed communication less
    its other threads' CPU time), over the communication the fitted profile prices: for the TP
    layer on its run and, since 2026-12-07, for the plain plans on theirs (``base``)."""
    t = truth()
    runs = [phased(t, "small", helper_share=0.6)[1], phased(t, "large", micro_batch_size=8, global_batch_size=16)[1],
            phased(t, "tp", helper_share=0.3, tp=2)[1]]
    fitted, bounds, _ = fit_terms(microbenchmark_part(t), runs)
    assert not [b for b in bounds if b.hit]
    # "large" measured no other threads' time: the plain share is "small"'s alone
    assert fitted.sleep_shares == {BASE_TERMS: pytest.approx(0.4, rel=0.02), "tp": pytest.approx(0.7, rel=0.02)}


@pytest.mark.parametrize(("shares", "name", "sleeps"), [
    ({"tp": 0.5}, "tiny-2d-tp-dp", {"tp_comm": 0.5}),  # the TP group's data-parallel replica fills
    ({"tp": 0.5}, "tiny-2d-pp-tp", {"tp_comm": 0.5}),  # a stage of one TP group: its own peer fills
    ({"tp": 0.5, "zero3": 0.2}, "tiny-3d", {"tp_comm": 0.5, "dp_comm": 0.2}),
    ({"zero3": 0.5, BASE_TERMS: 0.1}, "tiny-hsdp", {"dp_comm": 0.5}),  # the layer's own share first
    ({"ep": 0.5, BASE_TERMS: 0.4}, "tiny-moe-ep-dp", {"ep_comm": 0.5, "dp_comm": 0.4}),  # plain DDP's for its all-reduce
    ({"ep": 0.5, BASE_TERMS: 0.4}, "tiny-moe-ep-pp", {"ep_comm": 0.5, "dp_comm": 0.4, "pp_comm": 0.4}),
    ({"ep": 0.5}, "tiny-cp", {}),  # a plan without the layer
])
def test_a_ranks_sleep_fills_with_other_ranks_when_the_cores_are_shared(shares, name, sleeps):
    """Ranks beyond the cores: the share of each kind of its communication a rank sleeps (its
    layer's, else the plain plans') leaves its busy time, whoever fills it: the layer's other
    groups in the stage or the rank's own peers, which it waits for."""
    from simdist.analytic.timeshare import filled, slept, time_share_note, time_shared
    from simdist.spec.scenario import load_scenario

    t = truth()
    sleeping = replace(t, sleep_shares=shares)
    sc = load_scenario(f"scenarios/{name}.yaml")
    assert filled(sc.plan, sleeping) == sleeps
    full = predict(sc, profile=replace(t, cores=0), engine="analytic")
    assert slept(sc, full.breakdown_s, sleeping) == pytest.approx(sum(v * full.breakdown_s[k] for k, v in sleeps.items()))
    before, after = time_shared(sc, t)[1], time_shared(sc, sleeping)[1]
    assert (after < before) if sleeps else (after == before)
    note = time_share_note(sc, sleeping, after)
    for entry, share in sleeps.items():
        assert f"{share:.0%} of its {entry.removesuffix('_comm')} communication it sleeps" in note


def test_a_stage_that_fits_the_cores_fills_its_in_layer_sleep_only_while_another_stage_computes():
    """A pipeline stage of no more ranks than cores: its TP/EP collectives hold all of its ranks,
    so only another stage fills their sleep, for the share of the step it computes (none in the
    fill and drain); its data-parallel and pipeline transfers' sleep is filled whole. A stage of
    more ranks than cores (tiny-3d: 4 on 2) or no pipeline: filled whole."""
    from simdist.analytic.collectives import Network
    from simdist.analytic.cost import CostModel
    from simdist.analytic.stage import describe
    from simdist.analytic.steptime import reduce_step, stage_time
    from simdist.analytic.timeshare import (
        IN_LAYER,
        filled,
        filling,
        slept,
        time_share_note,
        time_shared,
    )
    from simdist.spec.profile import busy_ranks
    from simdist.spec.scenario import load_scenario

    t = replace(truth(), sleep_shares={"tp": 0.5, "ep": 0.5, BASE_TERMS: 0.4}, coschedule_wait_s=0.0)
    for name, fits in (("tiny-2d-pp-tp", True), ("tiny-moe-ep-pp", True), ("tiny-3d", False), ("tiny-2d-tp-dp", False)):
        sc = load_scenario(f"scenarios/{name}.yaml")
        full = replace(t, cores=0)
        d = describe(sc, CostModel(sc.cluster.gpu, sc.plan.precision, full), Network.of(sc.cluster, full))
        step = reduce_step(d)
        fill = filling(d, step.step_time, t.cores)
        note = time_share_note(sc, t, 2.0)
        if not fits:
            assert fill == 1.0 and "only while another pipeline stage computes" not in note
            continue
        other = min(stage_time(d, s).total for s in d.stages) * sc.plan.num_microbatches / step.step_time
        assert 0 < fill < 1 and fill == pytest.approx(other)
        shares = filled(sc.plan, t)
        assert any(e in IN_LAYER for e in shares) and any(e not in IN_LAYER for e in shares)
        assert slept(sc, step.breakdown, t, fill) == pytest.approx(
            sum(v * step.breakdown[e] * (fill if e in IN_LAYER else 1.0) for e, v in shares.items()))
        busy = step.step_time - step.breakdown.get("bubble", 0.0) - slept(sc, step.breakdown, t, fill)
        factor = max(1.0, t.time_share(busy_ranks(sc)) * busy / step.step_time)
        assert time_shared(sc, t)[1] == pytest.approx(factor)
        assert "that of its in-layer collectives only while another pipeline stage computes" in note


def test_ops_below_the_smallest_benchmark_keep_their_fixed_cost():
    """t = fixed + size/rate through the two smallest points: 10 and 20 time units at sizes 1e3
    and 1e4 (efficiency 100 and 500 per unit) -> fixed 8.89, so a 1e2 op takes about 9, not 1."""
    prof = replace(fit_profile(synthetic_bench()), compute_curves={"memory": [(1e3, 100.0), (1e4, 500.0), (1e5, 900.0)]})
    time = lambda size: size / prof.efficiency("memory", size)  # noqa: E731
    assert time(1e3) == pytest.approx(10.0) and time(1e4) == pytest.approx(20.0)
    assert time(1e2) == pytest.approx(80 / 9 + 1e2 / 900, rel=1e-9)
    assert time(1.0) > 8.8  # never below the fixed part
    flat = replace(prof, compute_curves={"memory": [(1e3, 0.5), (1e4, 0.4)]})  # no fixed part: the old clamp
    assert flat.efficiency("memory", 10.0) == 0.5


def test_bf16_plans_use_the_cpus_bf16_gemms():
    """A CPU without bf16 instructions runs autocast GEMMs on a slow path: the profile keeps them apart."""
    bench = synthetic_bench()
    slow = [{**r, "seconds": 10 * r["seconds"]} for r in bench["gemm"]]
    prof = fit_profile({**bench, "gemm_bf16": slow})
    assert prof.efficiency("gemm.bf16", 2.0 * 256**3) == pytest.approx(prof.efficiency("gemm", 2.0 * 256**3) / 10)
    fp32 = scenario_from_dict(local_scenario())
    bf16 = scenario_from_dict(local_scenario(precision="bf16"))
    plain = fit_profile(bench)
    assert predicted_quantities(bf16, prof)["forward_s"] > 3 * predicted_quantities(bf16, plain)["forward_s"]
    assert predicted_quantities(fp32, prof)["forward_s"] == predicted_quantities(fp32, plain)["forward_s"]


def test_all_to_all_is_benchmarked_and_fitted_as_the_model_prices_it():
    """S bytes per rank, S/n to each of n - 1 peers: one latency and (n-1)/n S over the link."""
    from simdist.calibrate.fit import fit_alpha_beta, ring_terms
    from simdist.spec.scenario import load_scenario
    from simdist.spec.software_layers import profile_layers

    assert ring_terms("alltoall", 4, 4096.0) == (1, 3072.0)
    rows = [{"kind": "alltoall", "ranks": 2, "bytes": b, "seconds": 2e-4 + b / 2 / 1e9} for b in (4096.0, 2**20, 2**24)]
    alpha, beta, rms = fit_alpha_beta(rows)
    assert alpha == pytest.approx(2e-4, rel=1e-6) and beta == pytest.approx(1e9, rel=1e-6) and rms < 1e-9
    assert profile_layers(load_scenario("scenarios/tiny-moe-ep.yaml").plan) == ("ep",)


def test_a_layer_may_cost_less_per_op_than_plain_ddp_never_less_than_nothing():
    t = replace(truth(), framework_overheads_s={"compression": -1e-5}, optimizer_layer_tensor_s={"compression": -5e-6})
    runs = [phased(t, "small")[1], phased(t, "large", micro_batch_size=8, global_batch_size=16)[1],
            phased(t, "fp16", grad_compression={"method": "fp16"})[1]]
    fitted, _, _ = fit_terms(microbenchmark_part(t), runs)
    assert fitted.framework_overheads_s["compression"] == pytest.approx(-1e-5, rel=0.05)
    assert fitted.optimizer_layer_tensor_s["compression"] == pytest.approx(-5e-6, rel=0.05)
    far = replace(fitted, framework_overheads_s={"compression": -1.0}, optimizer_layer_tensor_s={"compression": -1.0})
    q = predicted_quantities(scenario_from_dict(local_scenario(grad_compression={"method": "fp16"})), far)
    assert q["forward_s"] > 0 and q["optimizer_s"] > 0  # clamped where used


def test_an_attention_op_is_its_share_of_the_benchmarked_pair():
    """The attention benchmark times forward + backward (3x the forward's FLOPs): a forward of F
    FLOPs costs F/3F of a pair of 3F, its backward (2.5 F) 2.5/3 of it, together the pair."""
    from simdist.analytic.cost import CostModel
    from simdist.analytic.ops import Compute

    prof = replace(fit_profile(synthetic_bench()), compute_curves={"attention": [(3e6, 0.1), (3e7, 0.4), (3e8, 0.5)]})
    sc = scenario_from_dict(local_scenario())
    cm = CostModel(sc.cluster.gpu, "fp32", prof)
    f = 1e7
    fwd = Compute("flash attention", "attention", f, m=64, n=64, k=16, batch=4)
    bwd = Compute("flash attention bwd", "attention", 2.5 * f, m=64, n=64, k=16, batch=4)
    assert cm.attention_efficiency(fwd) == cm.attention_efficiency(bwd) == prof.efficiency("attention", 3 * f)


def test_tp_waits_split_into_a_share_of_compute_and_a_wait_per_call():
    """Two TP runs, few large collectives and many small ones, give back both parts of the TP
    waits (profile v4's ``sync_point_waits_s``), which one share of compute could not serve."""
    t = replace(truth(), sync_point_waits_s={"tp": 4e-4})
    runs = [phased(t, "small")[1], phased(t, "large", micro_batch_size=8, global_batch_size=16)[1],
            phased(t, "tp", tp=2)[1], phased(t, "tp-large", tp=2, micro_batch_size=16, global_batch_size=16)[1]]
    fitted, bounds, unusable = fit_terms(microbenchmark_part(t), runs)
    assert unusable == [] and not [b for b in bounds if b.hit]
    assert fitted.sync_wait_fractions["tp"] == pytest.approx(0.3, rel=0.05)
    assert fitted.sync_point_waits_s["tp"] == pytest.approx(4e-4, rel=0.05)
    assert BASE_TERMS not in fitted.sync_point_waits_s  # plain runs call no collective in their layers
    assert all(abs(c.error) < 0.01 for c in fit_checks(fitted, runs))
    share_only, _, _ = fit_terms(microbenchmark_part(t), runs[:3])  # one TP run: the share alone
    assert "tp" not in share_only.sync_point_waits_s


def test_the_wait_per_call_counts_the_layers_collectives():
    sc = scenario_from_dict(local_scenario(tp=2))
    t = truth()
    per_call = predicted_quantities(sc, replace(t, sync_point_waits_s={"tp": 1e-3}))["comm_s"]
    calls = (per_call - predicted_quantities(sc, t)["comm_s"]) / 1e-3
    m = sc.model
    # Megatron TP: an all-reduce after attention and after the MLP, forward and backward, per layer
    # and micro-batch, the embedding's and the head's (vocab-parallel) beside them
    assert calls >= 4 * m.num_layers * sc.plan.num_microbatches and calls == pytest.approx(round(calls))
    plain = scenario_from_dict(local_scenario())
    assert predicted_quantities(plain, replace(t, sync_point_waits_s={"tp": 1e-3})) == predicted_quantities(plain, t)


def test_a_pipeline_pays_its_wait_per_transfer_in_both_engines_and_the_fit_finds_it():
    """The pipeline's entry of ``sync_point_waits_s`` is a wait per transfer between stages (gloo's
    receiving rank woken), not per collective call of the layers: each engine adds it after every
    send; a pipeline run of few transfers beside much compute and one of many beside little tell
    it from a share of compute, which a tiny plan alone would price a large plan's step by."""
    sc = scenario_from_dict(local_scenario(pp=2, global_batch_size=8))
    t = truth()
    waited = replace(t, sync_point_waits_s={"pipeline": 1e-3})
    for engine in ("analytic", "des"):
        added = predict(sc, profile=waited, engine=engine).step_time_s - predict(sc, profile=t, engine=engine).step_time_s
        # 8 micro-batches on 2 stages, 1F1B: the step is m + p - 1 = 9 slots of a forward, a backward
        # and a stage's one transfer between them (its send or its receive)
        assert added == pytest.approx(1e-3 * (sc.plan.num_microbatches + 1)), engine
    tp = scenario_from_dict(local_scenario(tp=2))
    assert predicted_quantities(tp, waited) == predicted_quantities(tp, t)  # no pipeline: no transfer waits it
    truth_pp = replace(t, sync_wait_fractions={**t.sync_wait_fractions, "pipeline": 0.1},
                       sync_point_waits_s={"pipeline": 2e-3})
    runs = [phased(truth_pp, "small")[1], phased(truth_pp, "large", micro_batch_size=8, global_batch_size=16)[1],
            phased(truth_pp, "pp", pp=2, global_batch_size=8)[1],
            phased(truth_pp, "pp-large", pp=2, micro_batch_size=16, global_batch_size=32)[1]]
    fitted, bounds, unusable = fit_terms(microbenchmark_part(truth_pp), runs)
    assert unusable == [] and not [b for b in bounds if b.hit]
    assert fitted.sync_point_waits_s["pipeline"] == pytest.approx(2e-3, rel=0.05)
    assert fitted.sync_wait_fractions["pipeline"] == pytest.approx(0.1, rel=0.05, abs=5e-3)


def test_waits_smaller_than_the_runs_noise_are_not_fitted():
    """A layer's waits that add less to each of its runs than the uncertainty of that run's median
    (a median's standard error, from the runs' median absolute deviation) are fitted to noise, not
    measured: the fit keeps none (and a run whose waits stand above its noise keeps them, however
    far one outlying run of several lies)."""
    t = truth()
    plain = [phased(t, "small")[1], phased(t, "large", micro_batch_size=8, global_batch_size=16)[1]]
    _, run = phased(t, "tp", tp=2)
    quiet, _, _ = fit_terms(microbenchmark_part(t), [*plain, run])
    assert quiet.sync_wait_fractions["tp"] == pytest.approx(0.3, rel=0.05)
    measured = run.repeated.runs[0]
    noisy_runs = (measured, replace(measured, step_time_s=measured.step_time_s * 3))  # spread 2 (200%)
    noisy = replace(run, repeated=Repeated("tp", noisy_runs, False, "max runs"))
    fitted, _, _ = fit_terms(microbenchmark_part(t), [*plain, noisy])
    assert fitted.sync_wait_fractions["tp"] == 0.0 and "tp" not in fitted.sync_point_waits_s
    # four runs, one of them slower by 1.5x the waits' share of the step: the spread exceeds the
    # waits, the median's uncertainty (spread / 2) does not, so they are measured
    no_waits = replace(quiet, sync_wait_fractions={**quiet.sync_wait_fractions, "tp": 0.0}, sync_point_waits_s={})
    share = 1 - run.predicted(no_waits)["step_time_s"] / run.predicted(quiet)["step_time_s"]
    four = (measured,) * 3 + (replace(measured, step_time_s=measured.step_time_s * (1 + 1.5 * share)),)
    kept, _, _ = fit_terms(microbenchmark_part(t), [*plain, replace(run, repeated=Repeated("tp", four, True, "stable"))])
    assert replace(run, repeated=Repeated("tp", four, True, "stable")).repeated.spread > share
    assert kept.sync_wait_fractions["tp"] == pytest.approx(0.3, rel=0.05)
    # one run of four 50% slow (q40's fit-fsdp3): the spread over the square root of the runs (25%)
    # would call the waits noise; the median's standard error, near the three close runs', does not
    close = [measured.step_time_s * f for f in (1.0, 1.01, 0.99)]
    outlier = tuple(replace(measured, step_time_s=t) for t in [*close, 1.5 * close[0]])
    series = Repeated("tp", outlier, True, "stable")
    assert series.median_error / series.median < 0.02 < share < series.spread / 2
    kept, _, _ = fit_terms(microbenchmark_part(t), [*plain, replace(run, repeated=series)])
    assert kept.sync_wait_fractions["tp"] == pytest.approx(0.3, rel=0.1)
    # one run (the others set aside) of 24 steps, one of them 40% slow (q69's fit-fsdp2): its
    # steps' spread exceeds the waits, its median's standard error does not
    steps = (*(measured.step_time_s * (1 + 0.01 * (i % 5 - 2)) for i in range(23)), 1.4 * measured.step_time_s)
    one = Repeated("tp", (replace(measured, step_times_s=steps),), True, "stable")
    assert one.median_error / one.median < 0.02 < share < one.spread / 2
    kept, _, _ = fit_terms(microbenchmark_part(t), [*plain, replace(run, repeated=one)])
    assert kept.sync_wait_fractions["tp"] == pytest.approx(0.3, rel=0.1)


def test_recomputed_ops_skip_fsdp2s_hooks_but_not_dtensors_dispatch():
    """FSDP2's per-op terms are the cost of its hooks around each module's forward, which the
    forward run again inside backward skips; DTensor's (tp) is paid by every op, recomputed too."""
    from simdist.analytic.collectives import Network
    from simdist.analytic.cost import CostModel
    from simdist.analytic.passes import OpTimer
    from simdist.analytic.stage import layer_passes

    def recompute_s(profile, **plan) -> float:
        sc = scenario_from_dict(local_scenario(recompute="full", **plan))
        cost = CostModel(sc.cluster.gpu, sc.plan.precision, profile)
        return layer_passes(OpTimer(sc, cost, Network.of(sc.cluster, profile))).recompute.total

    t = truth()
    hooks = replace(t, framework_overheads_s={**t.framework_overheads_s, "zero3": 5e-4})
    assert recompute_s(hooks, zero_stage=3) == pytest.approx(recompute_s(t, zero_stage=3))
    dispatch = replace(t, framework_overheads_s={**t.framework_overheads_s, "tp": 5e-4})
    assert recompute_s(dispatch, tp=2) > recompute_s(t, tp=2) + 5e-4 * 4  # several ops, each 0.4 ms dearer
    sc = scenario_from_dict(local_scenario(recompute="full", zero_stage=3))
    assert predict(sc, profile=hooks).step_time_s > predict(sc, profile=t).step_time_s  # forward and backward pay


def test_the_comm_phase_holds_every_exposed_collective_experts_and_context_parallel_too():
    """The executor's comm phase is its waiting for peers, all-to-alls and ring exchanges included:
    the prediction it is set against holds them too (else a fit prices them twice, as waits)."""
    t = truth()
    for plan in ({"ep": 2}, {"cp": 2}):
        d = {**local_scenario(**plan), "model": {"preset": "tiny-moe" if "ep" in plan else "tiny"}}
        sc = scenario_from_dict(d)
        b = predict(sc, profile=t, engine="analytic").breakdown_s
        part = "ep_comm" if "ep" in plan else "cp_comm"
        assert b[part] > 0
        assert predicted_quantities(sc, t)["comm_s"] == pytest.approx(
            sum(b.get(k, 0.0) for k in ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm", "bubble")))


def test_two_slopes_least_squares_never_below_zero():
    from simdist.calibrate.phases import two_slopes

    rows = [(1.0 + 2 * 0.3 + 10 * 0.1, 1.0, 2.0, 10.0), (1.0 + 20 * 0.3 + 1 * 0.1, 1.0, 20.0, 1.0)]
    assert two_slopes(rows) == pytest.approx((0.3, 0.1))
    assert two_slopes(rows[:1])[1] == 0.0  # one row: the share alone
    assert two_slopes([(2.0, 1.0, 1.0, 0.0), (3.0, 1.0, 2.0, 0.0)])[1] == 0.0  # nothing depends on b
    assert min(two_slopes([(1.0, 1.0, 1.0, 1.0), (5.0, 1.0, 0.1, 4.0)])) >= 0.0


def test_a_parameter_server_worker_copies_per_tensor_and_the_fit_finds_it():
    """No optimizer runs on a worker, but the executor's client gathers the gradients and copies
    the pulled values back tensor by tensor (executor.ps.PSClient.step): the ps layers'
    per-tensor terms price it, also where the synchronous layer's own is below zero."""
    from simdist.calibrate.phases import fit_layer

    bundled = yaml.safe_load(Path("scenarios/tiny-ps-async.yaml").read_text())["plan"]
    plan = {k: v for k, v in bundled.items() if k != "precision"}
    sc = scenario_from_dict(local_scenario(**plan))
    assert sc.plan.uses_parameter_servers and not sc.plan.sync_parameter_servers
    n = stage_tensors(sc.model, sc.plan, 0)
    t = replace(truth(), optimizer_layer_tensor_s={"ps": -1e-5, "async": 4e-5})
    assert predicted_quantities(sc, t)["optimizer_s"] == pytest.approx(n * 3e-5, rel=1e-6)
    assert predicted_quantities(sc, replace(t, optimizer_tensor_s=None))["optimizer_s"] == 0.0  # no CPU term
    start = replace(t, optimizer_layer_tensor_s={"ps": -1e-5})
    fitted = fit_layer(start, "async", [phased(t, "async", **plan)[1]])
    assert fitted.optimizer_layer_tensor_s["async"] == pytest.approx(4e-5, rel=0.02)  # through the kink at 0


def test_powersgd_pays_its_hooks_ops_per_matrix_of_the_executors_model():
    """PowerSGD's hook runs products and orthogonalizations per matrix (torch's powerSGD_hook);
    the model counts the matrices the executor's model holds (every 2-D parameter) and prices
    each op at the profile's per-op cost."""
    pytest.importorskip("torch")
    from executor.model import build_model
    from simdist.analytic.compression import (
        POWERSGD_BUCKET_OPS,
        POWERSGD_PRODUCTS,
        hook_ops,
        orthogonalize_ops,
        powersgd_elements,
    )

    sc = scenario_from_dict(local_scenario(grad_compression={"method": "powersgd", "rank": 4}))
    params = list(build_model(sc.model, seed=0).parameters())
    assert powersgd_elements(sc.model, sc.plan, 0).count == sum(p.dim() >= 2 for p in params)
    assert stage_tensors(sc.model, sc.plan, 0) == len(params)
    matrices = sum(p.dim() >= 2 for p in params)
    assert hook_ops(sc.model, sc.plan, 0, 1) == POWERSGD_BUCKET_OPS + (POWERSGD_PRODUCTS + 2) * matrices + (
        len(params) - matrices)  # rank 4: one QR per orthogonalization
    assert orthogonalize_ops(1) == 2 and orthogonalize_ops(2) == 8  # Gram-Schmidt: 2 per column, 4 per pair
    t = truth()
    slower = replace(t, kernel_overhead_s=2 * t.kernel_overhead_s)
    q = lambda p: predicted_quantities(sc, p)["step_time_s"]  # noqa: E731
    fp16 = scenario_from_dict(local_scenario(grad_compression={"method": "fp16"}))
    # the per-op cost weighs on PowerSGD by its hook's ops more than on a dense cast's four
    assert q(slower) - q(t) > predicted_quantities(fp16, slower)["step_time_s"] - predicted_quantities(fp16, t)["step_time_s"] \
        + 0.9 * hook_ops(sc.model, sc.plan, 0, 1) * t.kernel_overhead_s


def test_a_fit_run_is_fitted_on_its_runs_that_did_the_work_at_the_machines_speed():
    """Interference only adds CPU time: runs of one plan whose compute falls in two groups (more
    than 25% apart) did the same work, so the fit keeps the faster group (q41: two of three
    fit-pp-1f1b runs 1.28x the third); runs within 25% of each other are all kept."""
    _, run = phased(truth(), "plain")
    m = run.repeated.runs[0]

    def slowed(f: float):
        return replace(m, step_time_s=m.step_time_s * f, phases_s={k: v * f for k, v in m.phases_s.items()})

    split = Repeated("x", (slowed(1.30), m, slowed(1.28)), True, "stable")
    kept = split.undisturbed
    assert kept.runs == (m,) and kept.median == m.step_time_s and "2 of 3 run(s) set aside" in kept.notes[-1]
    close = Repeated("x", (slowed(1.2), m, slowed(1.1)), True, "stable")
    assert close.undisturbed is close
