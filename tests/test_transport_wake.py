"""A pipeline's isends on a CPU whose cores all compute: they leave when their stage next blocks
or the scheduler's tick lets the transport thread run (simdist.analytic.transport_wake), priced
alike by the closed form and the event engine, and the tick counted on the host."""

import random
from dataclasses import replace

import pytest
from test_calibration import local_scenario, synthetic_bench

from executor.hostload import kernel_jiffies, local_timer_interrupts, nearest_hz
from simdist.analytic.collectives import Network
from simdist.analytic.cost import CostModel
from simdist.analytic.stage import describe
from simdist.analytic.transport_wake import wake_lag_s, wake_tick_s
from simdist.calibrate.fit import fit_profile
from simdist.predict import predict
from simdist.spec.profile import CalibrationProfile
from simdist.spec.scenario import scenario_from_dict

TICK = 0.004  # 250 Hz, the 2-core guest's kernel

# The first transfer each way of a step, from the sender's post to the receiver's receive, the
# receiver waiting (torch.profiler traces of `simdist run scenarios/tiny-pp-gpipe.yaml --nproc 2
# --steps 12 --trace DIR` and of tiny-pp-1f1b, 2026-11-29, steps 2-12): (the sender's compute
# from the post until it blocks, median; the transfer's mean wait), seconds
TRACED = {
    "gpipe first forward": (0.0025, 0.00169),
    "gpipe first backward": (0.0047, 0.00173),
    "1f1b first forward": (0.00085, 0.00098),
}


def test_the_wait_is_the_expected_earlier_of_the_tick_and_the_block():
    rng = random.Random(7)
    for busy in (0.0005, 0.002, 0.0039, 0.006):
        draws = [min(rng.uniform(0, TICK), busy) for _ in range(40000)]
        assert wake_lag_s(busy, TICK) == pytest.approx(sum(draws) / len(draws), rel=0.02)
    assert wake_lag_s(0.0, TICK) == 0.0 and wake_lag_s(0.01, 0.0) == 0.0  # no compute after, or no tick
    assert wake_lag_s(TICK, TICK) == pytest.approx(TICK / 2) == wake_lag_s(10 * TICK, TICK)
    lags = [wake_lag_s(t * 1e-4, TICK) for t in range(60)]
    assert lags == sorted(lags)


@pytest.mark.parametrize("case", sorted(TRACED))
def test_the_traced_waits_are_priced_within_a_third(case):
    busy, measured = TRACED[case]
    assert wake_lag_s(busy, TICK) == pytest.approx(measured, rel=0.33)


def cpu_profile(tick: float = TICK, cores: int = 2) -> CalibrationProfile:
    return replace(fit_profile(synthetic_bench()), backend="gloo", cores=cores, scheduler_tick_s=tick)


def scenario(**plan):
    return scenario_from_dict(local_scenario(**plan))


def test_only_pipelines_of_ranks_with_a_core_each_on_one_agent_wait_so():
    pp = {"pp": 2, "global_batch_size": 8, "schedule": "gpipe"}
    assert wake_tick_s(scenario(**pp), cpu_profile()) == TICK
    assert wake_tick_s(scenario(), cpu_profile()) == 0.0  # no pipeline
    assert wake_tick_s(scenario(**pp), cpu_profile(cores=1)) == 0.0  # ranks time-share the core
    assert wake_tick_s(scenario(**pp), replace(cpu_profile(), backend="nccl")) == 0.0  # a GPU's streams
    assert wake_tick_s(scenario(**pp), None) == 0.0
    two_agents = scenario_from_dict({**local_scenario(**pp), "cluster": {"preset": "local", "num_nodes": 2,
                                                                         "gpus_per_node": 1}})
    assert wake_tick_s(two_agents, cpu_profile()) == 0.0  # torchrun agents: threads left unbound


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_both_engines_add_the_first_sends_waits(schedule, monkeypatch):
    sc, profile = scenario(pp=2, global_batch_size=8, schedule=schedule), cpu_profile()
    d = describe(sc, CostModel(sc.cluster.gpu, sc.plan.precision, profile), Network.of(sc.cluster, profile))
    m, f0, b1 = sc.plan.num_microbatches, d.stages[0].fwd.total, d.stages[1].bwd.total
    steps = {}
    for lagging in (True, False):
        for engine in ("analytic", "des"):
            steps[lagging, engine] = predict(sc, profile, engine=engine)
        # the same isends leaving at once
        monkeypatch.setattr("simdist.sim.engine.step.wake_lag_s", lambda busy, tick: 0.0)
        monkeypatch.setattr("simdist.analytic.steptime.wake_lag_s", lambda busy, tick: 0.0)
    added = {e: steps[True, e].step_time_s - steps[False, e].step_time_s for e in ("analytic", "des")}
    if schedule == "gpipe":  # the fill waits for stage 0's first send, posted m - 1 forwards early,
        # and the turnaround for stage 1's, posted m - 1 backwards early, as far as stage 0 cannot make it up
        assert wake_lag_s((m - 1) * f0, TICK) < added["analytic"] <= wake_lag_s((m - 1) * f0, TICK) + wake_lag_s(
            (m - 1) * b1, TICK)
    else:  # only the warm-up's first forward send, posted a forward early
        assert added["analytic"] == pytest.approx(wake_lag_s(f0, TICK), rel=1e-6)
    assert added["des"] == pytest.approx(added["analytic"], rel=0.01)  # the event engine runs the dependencies
    for engine in ("analytic", "des"):
        assert steps[True, engine].breakdown_s["pp_comm"] > steps[False, engine].breakdown_s["pp_comm"], engine


def test_the_tick_is_counted_from_the_local_timer_row():
    text = ("           CPU0       CPU1       \n"
            "  0:         44          0   IO-APIC   2-edge      timer\n"
            "LOC:     617006     636836   Local timer interrupts\n"
            "SPU:          0          0   Spurious interrupts\n")
    assert local_timer_interrupts(text, 0) == 617006 and local_timer_interrupts(text, 1) == 636836
    assert local_timer_interrupts(text, 2) is None and local_timer_interrupts("", 0) is None
    # a busy core's count a second: the tick plus a few other timers (278 measured here over 1.05 s)
    assert nearest_hz(265) == 250 and nearest_hz(1012) == 1000 and nearest_hz(104) == 100
    assert nearest_hz(40) is None and nearest_hz(0) is None
    # the kernel's own count, where root may read it (/proc/timer_list)
    timers = "Timer List Version: v0.10\nHRTIMER_MAX_CLOCK_BASES: 8\nnow at 5377461372079 nsecs\n\n" \
             "  .idle_jiffies   : 4296816360\njiffies: 4296816497\n"
    assert kernel_jiffies(timers) == 4296816497 and kernel_jiffies("jiffies: x\n") is None


def test_the_profile_keeps_the_tick_the_microbenchmarks_counted():
    assert fit_profile({**synthetic_bench(), "scheduler_tick_s": TICK}).scheduler_tick_s == TICK
    assert fit_profile(synthetic_bench()).scheduler_tick_s == 0.0  # an older run's: not measured
    cuda = fit_profile({**synthetic_bench(), "device": "cuda", "scheduler_tick_s": TICK})
    assert cuda.scheduler_tick_s == 0.0
    again = CalibrationProfile.from_dict(cpu_profile().to_dict())
    assert again.scheduler_tick_s == TICK


def test_calibrate_says_which_tick_it_counted(capsys):
    from simdist.cli.calibrate import _summary

    _summary(cpu_profile())
    assert "scheduler tick 4 ms" in capsys.readouterr().out
    _summary(cpu_profile(tick=0.0))
    assert "scheduler tick" not in capsys.readouterr().out
