"""When a pipeline send leaves on a CPU whose cores all run a training thread.

The executor binds each rank's training thread to a core of its own and gives gloo's transport
threads the idle scheduling policy (executor.hostload), so that a transport thread never takes a
core from a computing rank. The price: a transfer whose progress needs a transport thread that
the kernel queued on the core of a rank that goes on computing waits until that rank blocks (it
then runs at once on the freed core) or until the idle core's load balancer pulls it there,
which the busy core's scheduler tick sets off (``nohz_balancer_kick`` in kernel/sched/fair.c).
torch.distributed.pipelining's sends are ``isend``s: the stage goes on with its next action and
waits for its sends only when it next blocks (GPipe: after all its forwards; 1F1B: after the
next forward in the warm-up, at once in the steady state, where each send is batched with the
next receive).

Measured with torch.profiler on 2 cores (``simdist run scenarios/tiny-pp-gpipe.yaml --nproc 2
--trace DIR``, and tiny-pp-1f1b, 2026-11-29, 11 steps each), from the first send's post to the
receiver's receive, the receiver waiting: GPipe's first forward transfer 0.11-2.76 ms, mean 1.69,
in 5 of 11 steps exactly when the sender blocked (2.3-2.8 ms after the post); its first backward
transfer 0.07-5.47 ms, mean 1.73 (the sender blocked 4.6-7.2 ms after); 1F1B's first forward
transfer 0.08-4.07 ms, mean 0.98 (0.67 without the one step at 4.07), in 7 of 11 steps when the
sender blocked (0.8-1.2 ms after). The balancer's pull comes at a uniform point of a tick (4 ms, the
kernel's 250 Hz here), so with the sender blocking ``T`` after its post the transfer waits
E[min(U(0, tick), T)]: 1.72, 2.0 and 0.76 ms for the three cases above (measured 1.69, 1.73 and
0.98). The step's later transfers left at once, the sender computing on or not (132 of them over
the two traces, means by position in the step 0.06-0.37 ms): only the first send of a step to
each neighbour waits so, after its transport thread slept since the step before (that a process
woken by a busy core's socket write reaches an idle core in 0.1 ms here, and that a bare gloo
transfer between two such ranks takes 0.07-0.2 ms, leaves what puts the first one to sleep open).
Why a send needs its transport thread at all is gloo's protocol (gloo/transport/tcp/pair.cc,
``Pair::send``): the calling thread writes the data itself only when this side's transport thread
has already handled the receiver's recv-ready notification; else the send is queued and that
thread writes it when it handles the notification (``handleRemotePendingRecv``). A lead for the
first-send rule, not checked: after it the thread last ran on the receiver's core, which idles
whenever the receiver waits for the next transfer.

Only ranks that have a core each are bound so (:func:`wake_tick_s`); time-shared ranks wait at
their sync points instead (simdist.analytic.cpu_syncs).
"""

from __future__ import annotations

from typing import Any

from simdist.spec.profile import local_processes, on_cpu


def wake_lag_s(busy_s: float, tick_s: float) -> float:
    """Expected wait of a transfer posted by a rank that blocks ``busy_s`` later, its transport
    thread pulled to the idle core at a uniform point of a scheduler tick: E[min(U(0, tick), T)]
    = T - T^2 / (2 tick) below a tick, half a tick beyond it."""
    if tick_s <= 0.0 or busy_s <= 0.0:
        return 0.0
    if busy_s >= tick_s:
        return tick_s / 2
    return busy_s - busy_s * busy_s / (2 * tick_s)


def wake_tick_s(scenario: Any, profile: Any) -> float:
    """The scheduler tick that delays ``scenario``'s pipeline sends, or 0 where it does not: a
    profile measured on a CPU with its tick known, a pipeline, and every process on a core of
    its own, one torchrun agent (the executor binds its training threads only then,
    executor.hostload.pin_training_thread)."""
    if not on_cpu(profile) or scenario.plan.pp == 1 or profile.cores <= 0:
        return 0.0
    if scenario.cluster.num_nodes > 1 or local_processes(scenario) > profile.cores:
        return 0.0
    return profile.scheduler_tick_s


def wake_note(tick_s: float) -> str:
    """The assumption line of a prediction whose pipeline sends wait so."""
    return (f"pipeline sends on a CPU whose cores all compute: a step's first send to each neighbour leaves "
            f"when its stage next blocks or at the scheduler's tick ({tick_s * 1e3:g} ms), whichever comes first "
            "(the mean over the tick)")
