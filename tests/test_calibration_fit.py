"""Honest fits: repeated runs, layer-by-layer terms, refusals, the machine's cores, the error
band, and the profile's schema (no torch needed: executor runs are stood in for by measurements
made from a known profile)."""

import json
from dataclasses import replace

import pytest
import yaml
from conftest import measurement, run_cli
from test_calibration import local_scenario, synthetic_bench

from simdist.calibrate.fit import fit_profile
from simdist.calibrate.honesty import (
    FLOOR,
    HOST_DRIFT,
    Bound,
    FitCheck,
    model_limits,
    refusal,
)
from simdist.calibrate.repeat import (
    PlanFailed,
    Repeated,
    repeat_in_rounds,
    repeat_sized,
    sized_steps,
)
from simdist.calibrate.terms import FitRun, fit_checks, fit_terms, with_honesty
from simdist.errors import ScenarioError
from simdist.predict import predict
from simdist.spec.measurement import Measurement
from simdist.spec.profile import PROFILE_VERSION, CalibrationProfile, HostSpeed, load_profile
from simdist.spec.scenario import scenario_from_dict
from simdist.spec.software_layers import profile_layers


def m(step: float, **extra) -> Measurement:
    return Measurement.from_dict(measurement(step_time_s=step, step_times_s=[step], **extra))


# --- repeating runs ----------------------------------------------------------------------------------


def test_runs_repeat_until_the_median_settles():
    medians = iter([1.0, 1.3, 1.02, 1.01, 1.5, 1.0])
    rep = repeat_sized("x", lambda n: m(next(medians)), 5, min_runs=3, max_runs=6, tolerance=0.03)
    assert rep.stable and rep.stopped == "stable" and rep.medians == [1.0, 1.3, 1.02, 1.01]
    assert rep.median == pytest.approx(1.015) and rep.spread == pytest.approx(0.3 / 1.015)
    assert rep.representative.step_time_s == 1.01  # the lower middle run stands for the series


def test_noisy_runs_stop_at_the_run_limit_or_the_budget():
    noisy = iter([1.0, 2.0, 1.0, 2.5, 1.0, 3.0])
    rep = repeat_sized("x", lambda n: m(next(noisy)), 5, min_runs=3, max_runs=4, tolerance=0.03)
    assert not rep.stable and rep.stopped == "max runs" and len(rep.runs) == 4
    noisy, clock = iter([1.0, 2.0, 1.0, 2.5, 1.0, 3.0]), iter(range(0, 1000, 100))  # each run takes 100 s
    rep = repeat_sized("x", lambda n: m(next(noisy)), 5, budget_s=250, clock=lambda: next(clock))
    assert rep.stopped == "budget" and not rep.stable and len(rep.runs) == 3


def test_runs_of_short_steps_measure_about_a_second_of_steps():
    assert sized_steps(0.5, 5) == 5  # 2.5 s of steps already
    assert sized_steps(0.04, 5) == 25 and sized_steps(0.012, 5) == 60  # 84 asked, held at 60
    assert sized_steps(0.04, 30) == 30 and sized_steps(0.0, 5) == 5  # never fewer than asked; no step: as asked
    asked, kept = [], []

    def run(n: int) -> Measurement:  # a 20 ms step, the same every run
        asked.append(n)
        return m(0.02)

    rep = repeat_sized("x", run, 5, keep=kept.append, min_runs=3, max_runs=6)
    assert asked == [5, 50, 50, 50] and len(rep.runs) == 3 and len(kept) == 3  # the first, of 5 steps, set aside
    assert all(r is k for r, k in zip(rep.runs, kept, strict=True)) and "50 steps a run" in rep.notes[0]
    asked.clear(), kept.clear()
    long = repeat_sized("y", lambda n: asked.append(n) or m(0.4), 5, keep=kept.append, min_runs=3)
    assert asked == [5, 5, 5] and len(long.runs) == 3 == len(kept) and not long.notes  # the first counts


def at(step: float, gemm: float, ops: float, before: tuple[float, float] | None = None) -> Measurement:
    """A run whose reference workloads took ``gemm`` and ``ops`` seconds of CPU between its steps
    (``before`` its first step, where given; executor.hostspeed)."""
    first = before or (gemm, ops)
    return m(step, environment={"reference_cpu_s": max(gemm, first[0]), "reference_ops_cpu_s": max(ops, first[1]),
                                "reference_between": {"reference_cpu_s": gemm, "reference_ops_cpu_s": ops}})


def test_a_run_made_while_the_host_ran_slower_is_set_aside_and_another_run_replaces_it():
    """q45 (2026-11-29): fit-pp-zb's first run took 31.3 ms a step while the workloads timed between
    its steps took 1.7x and 1.9x their CPU time (the timings around the run at the host's usual), the
    second 20.6 ms at the usual speed. A run whose workloads took more than HOST_DRIFT over the
    series' fastest timing of each does not count towards the median, and another run is made."""
    runs = iter([at(20.6e-3, 3.18e-3, 5.32e-3), at(21.0e-3, 3.15e-3, 5.25e-3), at(31.3e-3, 5.39e-3, 9.90e-3),
                 at(20.8e-3, 3.20e-3, 5.30e-3), at(20.7e-3, 3.16e-3, 5.20e-3)])
    rep = repeat_sized("fit-pp-zb", lambda n: next(runs), 60, min_runs=3, max_runs=6, tolerance=0.03)
    assert len(rep.runs) == 4 and rep.stopped == "stable"  # the slow third run counted, it would stop at three
    kept = rep.at_host_speed
    assert [r.step_time_s for r in kept.runs] == [20.6e-3, 21.0e-3, 20.8e-3]
    assert "1 of 4 run(s) set aside, the host up to 89% slower during them" in kept.notes[-1]
    assert rep.undisturbed.runs == kept.runs  # their compute agrees: nothing more set aside
    # within HOST_DRIFT of the fastest: every run counts, the series itself
    alike = Repeated("x", (at(1.0, 3.1e-3, 5.2e-3), at(1.02, 3.1e-3 * (1 + HOST_DRIFT * 0.9), 5.2e-3)), True, "stable")
    assert alike.at_host_speed is alike
    unknown = Repeated("x", (m(1.0), at(1.3, 5e-3, 9e-3)), True, "stable")  # a run without the workloads counts
    assert unknown.at_host_speed is unknown
    # slow before its first step only (q41: the run at the machine's speed, its small ops 22% slow
    # before it): the timings amid the steps decide
    started = Repeated("x", (at(1.0, 3.1e-3, 5.2e-3, before=(3.3e-3, 6.37e-3)), at(1.28, 3.1e-3, 5.2e-3)), True, "stable")
    assert started.at_host_speed is started


def test_runs_each_slow_in_another_workload_keep_the_one_nearest_the_hosts_speed():
    """q48 (2026-11-29) stopped on a plan whose runs were each more than 10% over the least CPU time
    of one workload or the other: against the least of each, every run was set aside. Runs are
    held against the one run nearest those least times, which stays."""
    a, b = at(1.0, 3.1e-3, 5.8e-3), at(1.1, 3.5e-3, 5.2e-3)  # 12% slow on small ops; 13% on GEMMs
    crossed = Repeated("x", (a, b), True, "stable")
    assert crossed.at_host_speed.runs == (a,)
    runs = iter([a, b, at(1.02, 3.12e-3, 5.75e-3), at(1.01, 3.1e-3, 5.8e-3)])
    rep = repeat_sized("x", lambda n: next(runs), 60, min_runs=3, max_runs=4, tolerance=0.03)
    assert len(rep.runs) == 4 and len(rep.at_host_speed.runs) == 3


def test_a_runs_host_speed_is_read_between_its_steps_where_it_has_them():
    """q47: local-tp-fit's runs timed the workloads at the usual between their steps and up to 27%
    and 38% slow before the first; the fit's host check reads the timings amid the steps, and a
    run stored before they existed, the slowest of its timings around the steps."""
    from simdist.calibrate.repeat import host_speed

    assert host_speed(at(1.0, 3.14e-3, 5.23e-3, before=(3.97e-3, 7.18e-3))) == HostSpeed(3.14e-3, 5.23e-3)
    older = m(1.0, environment={"reference_cpu_s": 3.97e-3, "reference_ops_cpu_s": 7.18e-3})
    assert host_speed(older) == HostSpeed(3.97e-3, 7.18e-3)


def test_plans_take_turns_so_a_slow_phase_moves_one_run_of_each():
    """One run of every plan not done yet, then the next round: a phase that slows the machine
    for a while lands on one run of several plans, which their spreads show, rather than on every
    run of one plan, which its spread would not."""
    order: list[str] = []
    slow = {3, 4}  # the machine is slow for the 4th and 5th runs made (by index)

    def plan(name: str, step: float):
        def run(n: int) -> Measurement:
            order.append(name)
            return m(step * (1.3 if len(order) - 1 in slow else 1.0))
        return name, run, kept.append

    kept: list[Measurement] = []
    a, b = repeat_in_rounds([plan("a", 0.5), plan("b", 0.4)], 5, min_runs=3, max_runs=5)
    assert order == ["a", "b"] * 3 + ["b"]  # first runs (of 5 half-second steps: they count), then rounds
    assert a.medians == [0.5, 0.5, 0.65] and a.stable  # the slow phase: one run of each
    assert b.medians == [0.4, 0.52, 0.4, 0.4] and b.stable and len(kept) == 7  # b settles a round later
    assert (a.median, b.median) == (0.5, 0.4)
    order.clear()  # back to back, two runs of one plan fall in such a phase: it becomes their median
    slow.clear(), slow.update({1, 2})
    assert repeat_sized("a", plan("a", 0.5)[1], 5, min_runs=3, max_runs=3).median == 0.65


def test_a_plan_whose_run_fails_leaves_the_rounds_and_the_others_go_on():
    """PlanFailed (a held-out plan the executor could not run) ends that plan's series with the
    reason and the runs it made; another error ends every series."""
    calls: list[str] = []

    def plan(name: str, fail_at: int | None = None, error: type[Exception] = PlanFailed):
        def run(n: int) -> Measurement:
            calls.append(name)
            if calls.count(name) == fail_at:
                raise error(f"{name}: simdist run exited 1")
            return m(0.5)
        return name, run, lambda _m: None

    ok, late, early = repeat_in_rounds([plan("ok"), plan("late", fail_at=2), plan("early", fail_at=1)], 5,
                                       min_runs=3, max_runs=3)
    assert calls == ["ok", "late", "early", "ok", "late", "ok"]
    assert ok.stopped == "stable" and len(ok.runs) == 3
    assert late.stopped == "failed" and len(late.runs) == 1 and late.notes[-1] == "late: simdist run exited 1"
    assert early.stopped == "failed" and early.runs == () and early.notes == ("early: simdist run exited 1",)
    with pytest.raises(RuntimeError, match="fit"):
        repeat_in_rounds([plan("ok"), plan("fit", fail_at=1, error=RuntimeError)], 5, min_runs=3, max_runs=3)


def test_a_run_says_how_busy_the_machine_was():
    busy = m(1.0, host={"cores": 2, "others_cores": 0.9, "loadavg": [3.1, 2.0, 1.5]})
    busy = Measurement.from_dict({**busy.to_dict(), "phases_s": {"forward": 0.2, "core_wait": 0.3}})
    rep = Repeated("x", (busy, m(1.1)), True, "stable")
    assert rep.others_cores == 0.9 and rep.core_wait == pytest.approx(0.3) and rep.loadavg == [3.1, 2.0, 1.5]


# --- refusals ----------------------------------------------------------------------------------------


def test_a_parameter_on_its_bound_refuses_the_fit():
    assert Bound("overhead", 5e-3, 1e-7, 5e-3).hit == "upper"
    assert Bound("overhead", 1e-7, 1e-7, 5e-3).hit is None  # "none needed" is an answer
    assert Bound("factor", 0.3, 0.3, 1.6, upper_only=False).hit == "lower"
    lines = refusal([], [Bound("the per-op overhead (s)", 5e-3, 1e-7, 5e-3)], cores=2)
    assert lines[0] == "calibration refused, no profile written:"
    assert "the per-op overhead (s) came out at its upper bound" in lines[1]
    assert lines[-1].startswith("what to do: calibrate again when the machine is quiet")


def test_a_fit_that_misses_its_own_runs_names_the_noisiest_run():
    quiet = FitCheck("local-dp", measured=1.0, predicted=1.02, spread=0.03, runs=3, cores=2, others_cores=0.05)
    noisy = FitCheck("local-tp-fit", measured=2.0, predicted=1.4, spread=0.12, runs=5, core_wait=0.38,
                     others_cores=0.9, cores=2, loadavg=(3.6, 2.2, 1.9))
    lines = refusal([quiet, noisy], [], cores=2)
    text = "\n".join(lines)
    assert "local-tp-fit: the fitted profile predicts 1.4000 s against a measured median of 2.0000 s (-30%)" in text
    assert "local-tp-fit: other processes used 0.9 of the 2 cores" in text
    assert "the noisiest run was local-tp-fit" in text and "load average 3.60, 2.20, 1.90" in text
    assert "waited 38% of a step for a core" in text and "local-dp" not in text.split("noisiest")[0]
    # a residual inside the run's spread (or the floor) stands
    assert refusal([replace(quiet, predicted=1.0 + FLOOR * 0.9)], [], cores=2) == []


def test_a_quiet_repeatable_run_the_fit_misses_is_named_a_model_limit_not_noise():
    """Runs that agree with each other on a quiet machine yet are missed are the model's limit: the
    message says so and does not send the user to a quieter machine."""
    limit = FitCheck("fit-fsdp3", measured=0.050, predicted=0.042, spread=0.03, runs=3, cores=2, others_cores=0.01)
    lines = refusal([limit], [], cores=2)
    text = "\n".join(lines)
    assert "fit-fsdp3: measured on a quiet machine and repeatable" in text and "a limit of the model" in text
    assert "noisiest" not in text and "calibrate again when the machine is quiet" not in text
    noisy = replace(limit, spread=0.12)  # its repeats disagree by more than half the miss: noise is possible
    text = "\n".join(refusal([noisy], [], cores=2))
    assert "a limit of the model" not in text and "calibrate again when the machine is quiet" in text


def test_a_fit_run_made_while_the_host_ran_slower_refuses_the_fit_and_is_not_called_a_model_limit():
    """The host's speed (two fixed workloads' CPU time, executor.hostspeed.reference_cpu_s) is
    compared across the fit runs: in run G of 2026-11-28 (benchmarks/README.md) fit-hsdp's
    compute took 40% more CPU time, with no other process, and its profile predicted the 2-rank
    plans up to 48% too slow. A run whose small-op workload took HOST_DRIFT more than the runs'
    median refuses the fit and is named, even when its repeats agree (which would otherwise read
    as the model's limit); within it the fit stands; runs that did not measure it are not judged."""
    quiet = [FitCheck(f"fit-{k}", measured=0.05, predicted=0.051, spread=0.03, runs=3, cores=2, others_cores=0.01,
                      reference=HostSpeed(2.7e-3, 3.0e-3 + 0.02e-3 * k)) for k in range(4)]
    slow = FitCheck("fit-hsdp", measured=0.148, predicted=0.095, spread=0.04, runs=3, cores=2, others_cores=0.02,
                    reference=HostSpeed(2.72e-3, 4.2e-3))
    text = "\n".join(refusal([*quiet, slow], [], cores=2))
    assert "fit-hsdp: the host ran 38% slower during it than during the other fit runs" in text
    assert "GEMMs 2.72 ms, small ops 4.20 ms of CPU time per rank, their median GEMMs 2.70 ms, small ops 3.04 ms" in text
    assert "a limit of the model" not in text and "calibrate again when the machine is quiet" in text
    assert model_limits([*quiet, slow]) == []  # repeatable, quiet, missed: yet the host explains it
    assert model_limits([*quiet, replace(slow, reference=HostSpeed(2.7e-3, 3.0e-3))]) != []  # at the host's speed
    fine = replace(slow, reference=HostSpeed(2.7e-3, 3.04e-3 * (1 + 0.9 * HOST_DRIFT)), predicted=0.149)
    assert refusal([*quiet, fine], [], cores=2) == []
    unknown = [replace(c, reference=HostSpeed()) for c in [*quiet, slow]]  # runs from before the executor measured it
    assert "host ran" not in "\n".join(refusal(unknown, [], cores=2))


def test_the_profile_keeps_the_hosts_speed_and_held_out_runs_at_another_speed_are_in_doubt(capsys):
    """with_honesty stores the fit runs' median of each reference workload (profile v6); a
    held-out series whose workload moved by more than HOST_DRIFT (either one: GEMMs or small ops)
    is in doubt, naming how much slower or faster; within it, or unknown on either side, not."""
    profile = fit_profile(synthetic_bench())
    checks = [FitCheck(f"r{k}", measured=1.0, predicted=1.0, spread=0.01, runs=3, reference=HostSpeed(g, o))
              for k, (g, o) in enumerate(((2.8e-3, 3.1e-3), (2.6e-3, 2.9e-3), (2.7e-3, 3.0e-3), (0.0, 0.0)))]
    honest = with_honesty(profile, checks)
    assert (honest.reference_cpu_s, honest.reference_ops_cpu_s) == (2.7e-3, 3.0e-3)  # the medians of those measured
    assert CalibrationProfile.from_dict(json.loads(json.dumps(honest.to_dict()))).host_speed == HostSpeed(2.7e-3, 3.0e-3)
    from simdist.cli.calibrate import _summary

    _summary(honest)  # simdist calibrate's summary names it
    assert "host speed during the fitted runs: reference GEMMs 2.70 ms, small ops 3.00 ms" in capsys.readouterr().out

    def series(gemm: float, ops: float) -> Repeated:
        env = {"environment": {"reference_cpu_s": gemm, "reference_ops_cpu_s": ops}}
        return Repeated("h", (m(0.05, **env), m(0.051, **env), m(0.049, **env)), True, "stable")

    note = series(2.7e-3, 3.75e-3).doubt(cores=2, baseline=honest.host_speed)
    assert note is not None and note.startswith("the host ran 25% slower than during the fit runs")
    assert "faster" in (series(2.1e-3, 3.0e-3).doubt(cores=2, baseline=honest.host_speed) or "")
    assert series(2.7e-3 * (1 + 0.9 * HOST_DRIFT), 3.0e-3).doubt(cores=2, baseline=honest.host_speed) is None
    assert series(2.7e-3, 3.75e-3).doubt(cores=2) is None  # a profile that did not record it


def test_a_run_is_held_against_the_fit_runs_of_its_own_process_count(capsys, tmp_path):
    """Ranks that time-share the cores take more CPU time for the reference workloads (q46,
    2026-11-29: 3.15 / 5.2 ms at 2 ranks on 2 cores, 3.2 / 5.4 at 4, 3.48 / 5.8 at 8): with_honesty
    keeps the fit runs' speed by process count (profile v12), and an 8-rank held-out run is held
    against the nearest count recorded (4), not against the 2-rank runs that would call its host
    10% slower. A profile without the counts (v11) holds every run against the fit runs' median."""
    def check(name: str, processes: int, gemm: float, ops: float) -> FitCheck:
        return FitCheck(name, measured=1.0, predicted=1.0, spread=0.01, runs=3, processes=processes,
                        reference=HostSpeed(gemm, ops))

    checks = [check("a", 2, 3.15e-3, 5.20e-3), check("b", 2, 3.13e-3, 5.22e-3), check("c", 2, 3.17e-3, 5.18e-3),
              check("hsdp", 4, 3.22e-3, 5.40e-3), check("cp", 4, 3.20e-3, 5.44e-3), check("ps", 3, 0.0, 0.0)]
    honest = with_honesty(fit_profile(synthetic_bench()), checks)
    assert set(honest.reference_by_processes) == {"2", "4"}  # the 3-process run measured nothing
    again = CalibrationProfile.from_dict(json.loads(json.dumps(honest.to_dict())))
    assert again.reference_by_processes == honest.reference_by_processes
    assert again.host_speed_for(2) == HostSpeed(3.15e-3, 5.20e-3)  # the 2-rank runs' medians
    assert again.host_speed_for(8) == again.host_speed_for(3) == HostSpeed(3.20e-3, 5.40e-3)  # nearest by ratio: 4
    eight = HostSpeed(3.48e-3, 5.80e-3)  # tiny-3d's runs in q46
    assert eight.drift(honest.host_speed_for(2)) > HOST_DRIFT >= eight.drift(honest.host_speed_for(8))
    older = replace(honest, reference_by_processes={})
    assert older.host_speed_for(8) == older.host_speed
    spread_out = replace(honest, reference_by_processes={"2": (3.1e-3, 5.2e-3), "8": (3.5e-3, 5.8e-3)})
    assert spread_out.host_speed_for(4) == HostSpeed(3.5e-3, 5.8e-3)  # a tie by ratio: the larger count
    from simdist.calibrate.compare import compare_one

    d = local_scenario()  # 2 processes: simdist compare holds its run against the 2-process fit runs
    timed = measurement(scenario_hash=scenario_from_dict(d).hash(), environment={"reference_between": {
        "reference_cpu_s": 3.15e-3, "reference_ops_cpu_s": 5.20e-3}})
    assert compare_one(timed, yaml.safe_dump(d), replace(honest, reference_cpu_s=3.6e-3)).host_drift == 0.0
    from simdist.cli.calibrate import _summary

    _summary(honest)
    assert "4: GEMMs 3.20 ms, small ops 5.40 ms" in capsys.readouterr().out
    bad = {**honest.to_dict(), "reference_by_processes": {"eight": [3e-3, 5e-3]}}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ScenarioError, match=r"reference_by_processes\.eight"):
        load_profile(path)


# --- fitting each software layer from its own runs ----------------------------------------------------


def fit_run(profile: CalibrationProfile, name: str, spread: float = 0.02, **plan) -> FitRun:
    """A FitRun whose 'measured' steps are the known profile's prediction, within +-spread/2."""
    d = {**local_scenario(**plan), "name": name}
    sc = scenario_from_dict(d)
    t = predict(sc, profile=profile, engine="analytic").step_time_s
    runs = tuple(m(t * (1 + k * spread / 2), scenario_hash=sc.hash(), name=name) for k in (-1, 0, 1))
    return FitRun(name, yaml.safe_dump(d), ".", Repeated(name, runs, True, "stable"))


def test_each_layer_is_fitted_from_the_runs_that_add_it():
    truth = replace(fit_profile(synthetic_bench()), kernel_overhead_s=3e-4,
                    framework_overheads_s={"tp": 2e-4, "zero1": 5e-5})
    runs = [fit_run(truth, "dp"), fit_run(truth, "tp", tp=2), fit_run(truth, "zero1", zero_stage=1)]
    fitted, bounds, unusable = fit_terms(fit_profile(synthetic_bench()), runs)
    assert unusable == [] and not [b for b in bounds if b.hit]
    assert fitted.kernel_overhead_s == pytest.approx(3e-4, rel=0.05)
    assert fitted.framework_overheads_s["tp"] == pytest.approx(2e-4, rel=0.1)
    assert fitted.terms_from == {"per-op": "dp", "tp": "tp", "zero1": "zero1"}
    checks = fit_checks(fitted, runs)
    assert refusal(checks, bounds, cores=2) == []
    honest = with_honesty(fitted, checks)
    assert honest.spreads == {"dp": pytest.approx(0.02), "tp": pytest.approx(0.02), "zero1": pytest.approx(0.02)}
    assert 0.02 <= honest.error_band < 0.05


def test_a_run_adding_two_unfitted_layers_is_named():
    truth = replace(fit_profile(synthetic_bench()), kernel_overhead_s=3e-4)
    runs = [fit_run(truth, "dp"), fit_run(truth, "tp-zero3", tp=2, zero_stage=3)]
    _, _, unusable = fit_terms(fit_profile(synthetic_bench()), runs)
    assert unusable == ["tp-zero3: its plan runs through tp and zero3 at once, which one run cannot tell "
                        "apart: fit each from a run that adds only one of them"]


def test_every_plan_kind_has_its_layers():
    sc = lambda **plan: scenario_from_dict(local_scenario(**plan)).plan  # noqa: E731
    assert profile_layers(sc()) == ()
    assert profile_layers(sc(zero_stage=1)) == ("zero1",)
    assert profile_layers(sc(zero_stage=2)) == ("zero2",)
    assert profile_layers(sc(pp=2, global_batch_size=8)) == ("pipeline",)
    assert profile_layers(sc(pp=2, schedule="zero-bubble")) == ("pipeline", "split_backward")
    assert profile_layers(sc(pp=2, virtual_pipeline_stages=2, global_batch_size=8)) == ("pipeline", "multichunk")
    assert profile_layers(sc(grad_compression={"method": "fp16"})) == ("compression",)
    assert profile_layers(sc(gradient_sync="parameter-server")) == ("ps",)
    assert profile_layers(sc(cp=2)) == ("cp",)
    assert profile_layers(sc(gradient_sync="async-parameter-server")) == ("ps", "async")
    hsdp = scenario_from_dict({**local_scenario(zero_stage=3, dp_shard=2),
                               "cluster": {"preset": "local", "num_nodes": 1, "gpus_per_node": 4}}).plan
    assert profile_layers(hsdp) == ("zero3", "hsdp")


def test_plans_the_executor_replicates_with_fsdp2_pay_its_terms():
    """DDP cannot run several chunks or a split backward per rank, so the executor replicates
    with FSDP2 (DTensor parameters, per-block hooks): such plans pay the "zero2" layer's terms."""
    pytest.importorskip("torch")
    from executor.parallelize import data_parallel_kind

    four = {"cluster": {"preset": "local", "num_nodes": 1, "gpus_per_node": 4}}
    for plan in ({"pp": 2, "schedule": "zero-bubble"}, {"pp": 2, "virtual_pipeline_stages": 2},
                 {"pp": 2, "schedule": "1f1b"}, {"pp": 2, "schedule": "zero-bubble", "zero_stage": 3},
                 {"pp": 4, "schedule": "zero-bubble"}):
        p = scenario_from_dict({**local_scenario(global_batch_size=8, **plan), **four}).plan
        layers = profile_layers(p)
        assert (data_parallel_kind(p) == "replicate") == ("zero2" in layers and p.zero_stage == 0), (plan, layers)
    zb = scenario_from_dict({**local_scenario(global_batch_size=8, pp=2, schedule="zero-bubble"), **four}).plan
    assert profile_layers(zb) == ("pipeline", "split_backward", "zero2")


# --- the machine's cores -----------------------------------------------------------------------------


def test_ranks_beyond_the_cores_time_share_them():
    prof = replace(fit_profile(synthetic_bench()), cores=2, ranks=2, kernel_overhead_s=1e-4)
    assert prof.time_share(2) == prof.time_share(1) == 1.0 and prof.time_share(8) == 4.0
    assert replace(prof, ranks=4).time_share(8) == 2.0  # the microbenchmarks already shared 2:1
    assert replace(prof, cores=0).time_share(8) == 1.0  # a GPU profile knows no cores
    two = scenario_from_dict(local_scenario())
    eight = scenario_from_dict({**local_scenario(global_batch_size=32),
                                "cluster": {"preset": "local", "num_nodes": 1, "gpus_per_node": 8}})
    shared, alone = predict(eight, profile=prof, engine="analytic"), predict(eight, profile=replace(prof, cores=0),
                                                                             engine="analytic")
    from simdist.analytic.timeshare import time_shared

    factor = time_shared(eight, prof)[1]
    assert alone.breakdown_s.get("bubble", 0.0) == 0 and factor == pytest.approx(4.0)  # all of the step is CPU work
    assert shared.breakdown_s["compute"] == pytest.approx(factor * alone.breakdown_s["compute"])
    assert shared.breakdown_s["dp_comm"] > 3 * alone.breakdown_s["dp_comm"]  # gloo's copies share the cores too
    assert any("8 ranks time-share the profiled machine's 2 cores (4x its share" in a for a in shared.assumptions)
    assert predict(two, profile=prof, engine="des").step_time_s == pytest.approx(
        predict(two, profile=replace(prof, cores=0), engine="des").step_time_s)


def test_a_pipeline_bubble_of_time_shared_ranks_fills_with_other_stages_work():
    """A pipeline's bubble is not stretched: 8 ranks on 2 cores take 4x the step less the bubble;
    the waits at sync points are CPU work on gloo (transfers, reductions) and stretch with it."""
    from simdist.analytic.timeshare import time_shared

    prof = replace(fit_profile(synthetic_bench()), cores=2, ranks=2, kernel_overhead_s=1e-4)
    pipe = scenario_from_dict({**local_scenario(pp=2, global_batch_size=8),
                               "cluster": {"preset": "local", "num_nodes": 1, "gpus_per_node": 8}})
    for p in (prof, replace(prof, sync_wait_fractions={"pipeline": 0.5})):
        full = predict(pipe, profile=replace(p, cores=0), engine="analytic")
        busy = full.step_time_s - full.breakdown_s["bubble"]
        assert full.breakdown_s["bubble"] > 0 and time_shared(pipe, p)[1] == pytest.approx(4 * busy / full.step_time_s)
        assert predict(pipe, profile=p, engine="analytic").step_time_s == pytest.approx(4 * busy, rel=1e-6)


# --- the profile file --------------------------------------------------------------------------------


def test_version_1_profiles_still_load_and_version_2_round_trips(tmp_path):
    old = {"version": 1, "device": "cpu", "peak_flops": 1e10, "links": {}, "compute_curves": {}}
    (tmp_path / "v1.json").write_text(json.dumps(old))
    v1 = load_profile(tmp_path / "v1.json")
    assert v1.version == PROFILE_VERSION and v1.cores == 0 and v1.error_band == 0.0 and v1.sync_point_waits_s == {}
    v4 = {**old, "version": 4, "sync_point_waits_s": {"tp": 3e-4}}  # before the gradient-sync wait (v5)
    (tmp_path / "v4.json").write_text(json.dumps(v4))
    assert load_profile(tmp_path / "v4.json").dp_step_wait_s == 0.0
    (tmp_path / "v5.json").write_text(json.dumps({**old, "version": 5, "dp_step_wait_s": 2e-3}))
    assert load_profile(tmp_path / "v5.json").reference_cpu_s == 0.0  # before the host's speed was kept (v6)
    (tmp_path / "v6.json").write_text(json.dumps({**old, "version": 6, "reference_cpu_s": 2.6e-3}))
    assert load_profile(tmp_path / "v6.json").sleep_shares == {}  # before the sleep shares (v7)
    v2 = replace(fit_profile({**synthetic_bench(), "cores": 2}), spreads={"dp": 0.05}, error_band=0.08,
                 sleep_shares={"tp": 0.4})
    v2.save(tmp_path / "v2.json")
    assert load_profile(tmp_path / "v2.json") == v2 and v2.cores == 2 and v2.ranks == 2


def test_a_sleep_share_above_one_is_refused_naming_it(tmp_path):
    path = tmp_path / "p.json"
    replace(fit_profile({**synthetic_bench(), "cores": 2}), sleep_shares={"tp": 1.4}).save(path)
    with pytest.raises(ScenarioError, match=r"--profile\.sleep_shares\.tp: must be a share"):
        load_profile(path)


def test_a_gpu_benchmark_gives_a_gpu_profile():
    """The schema of a profile fitted on CUDA/NCCL microbenchmarks (executor.bench on a GPU)."""
    bench = {**synthetic_bench(), "device": "cuda", "backend": "nccl", "gpu": "NVIDIA H100 80GB HBM3",
             "dtype": "bf16", "cores": 32, "world_size": 8, "local_ranks": 8}
    for r in bench["collectives"]:
        r["ranks"] = 8
    prof = fit_profile(bench)
    assert prof.device == "NVIDIA H100 80GB HBM3 (bf16, 8 GPUs)" and prof.backend == "nccl"
    assert prof.cores == 0 and prof.time_share(64) == 1.0  # GPUs do not time-share cores
    assert [s[:3] for s in prof.gemm_shapes] == [(64, 64, 64), (256, 256, 256), (1024, 1024, 1024)]
    assert prof.gemm_shapes[-1][3] == pytest.approx(1.0) and prof.gemm_shapes[0][3] < 0.6
    allreduce = prof.bus_bandwidth["allreduce"]
    assert [b for b, _ in allreduce] == [4096.0, 2.0**20, 2.0**26]
    assert allreduce[-1][1] > allreduce[0][1]  # bus bandwidth grows with the message size


def test_predict_prints_the_profiles_error_band(tmp_path):
    prof = replace(fit_profile(synthetic_bench()), error_band=0.12, spreads={"a": 0.05, "b": 0.12})
    prof.save(tmp_path / "p.json")
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(local_scenario()))
    r = run_cli("predict", str(tmp_path / "s.yaml"), "--profile", str(tmp_path / "p.json"), "--no-store")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("error band:"))
    assert "+/-12%" in line and "of the 2 run(s) the profile was fitted on" in line
    r = run_cli("predict", str(tmp_path / "s.yaml"), "--profile", str(tmp_path / "p.json"), "--no-store", "--json")
    assert "error band" not in r.stdout  # the contract's JSON is unchanged


def test_the_fitted_runs_table_checks_the_medians_the_fit_reads_against_predict():
    """simdist calibrate's table and refusal check (fit_checks) read a run's measured step as the
    fit does (FitRun.measured: the median over the repeated runs, not the representative run's
    own step) and its prediction as `simdist predict --profile` gives it (the event engine, on
    the plan as it ran; on tiny-fsdp3 it prices the gathers apart from the closed form):
    benchmarks/local_calibration.py's fitted rows are these checks."""
    from pathlib import Path

    from simdist.spec.scenario import load_scenario

    profile = replace(fit_profile({**synthetic_bench(), "cores": 2}), kernel_overhead_s=3e-5,
                      framework_overheads_s={"zero3": 1e-4}, sync_wait_fractions={"base": 0.03, "zero3": 0.2})
    path = Path(__file__).resolve().parent.parent / "scenarios" / "tiny-fsdp3.yaml"
    sc = load_scenario(path)
    runs = tuple(m(t, scenario_hash=sc.hash(), name="z3") for t in (0.050, 0.070, 0.061, 0.090))
    run = FitRun("z3", path.read_text(), str(path.parent), Repeated("z3", runs, True, "stable"))
    assert run.repeated.representative.step_time_s == 0.061  # the lower middle of four
    (check,) = fit_checks(profile, [run])
    assert check.measured == run.measured()["step_time_s"] == pytest.approx(0.0655)  # the median
    des = predict(sc, profile=profile, engine="des", keep_spans=False).step_time_s
    assert check.predicted == des == run.predicted_step(profile)
    assert abs(des / run.predicted(profile)["step_time_s"] - 1) > 1e-3  # the closed form's step is not the one checked


def test_runs_whose_compute_falls_in_two_groups_on_a_quiet_machine_put_the_measurement_in_doubt():
    """Repeated.doubt: five runs of the same work, two of them computing 1.6x longer while other
    processes used 0.01 cores, are flagged (the median is one of the two groups by chance); the
    same runs on a busy machine are the busy check's business, and runs whose compute spreads
    evenly or within the gap are not flagged."""
    from simdist.calibrate.repeat import COMPUTE_GAP

    def run(compute: float, others: float = 0.01) -> Measurement:
        phases = {"forward": compute / 3, "backward": 2 * compute / 3, "optimizer": 0.01, "comm": 0.02,
                  "other": 0.0}
        return m(compute + 0.03, phases_s=phases, host={"others_cores": others})

    def rep(*runs: Measurement) -> Repeated:
        return Repeated("r", runs, True, "stable")

    bimodal = rep(run(0.70), run(0.44), run(0.71), run(0.42), run(0.43))
    assert bimodal.compute_gap == pytest.approx(0.70 / 0.44 - 1)
    note = bimodal.doubt(cores=2)
    assert note is not None and "1.59x" in note and "2 of 5 slow" in note
    busy = rep(run(0.70, others=1.0), run(0.44), run(0.42))
    assert busy.doubt(cores=2) is None  # another process explains it
    even = rep(*(run(0.40 * (1 + 0.9 * COMPUTE_GAP) ** k) for k in range(4)))  # 65% overall, no gap
    assert even.compute_gap == pytest.approx(0.9 * COMPUTE_GAP) and even.doubt(cores=2) is None
    assert rep(run(0.40)).doubt(cores=2) is None  # one run: nothing to compare
    no_phases = rep(m(0.5), m(0.8))  # a GPU run's phases are not separated: no doubt read from them
    assert no_phases.compute_gap == 0.0 and no_phases.doubt(cores=2) is None
