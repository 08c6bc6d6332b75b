"""Pipeline-parallel schedules: the ordered compute actions of one optimizer step, per stage.

Pure functions (no events). A schedule is ``sched[stage] -> [Action, ...]``, run strictly in
order by that stage. Cross-stage ordering comes from :func:`dependencies`;
:func:`simulate_unit_times` is a tiny zero-communication evaluator used by the tests and as a
cross-check of the discrete-event engine.

Sources: GPipe (Huang et al. 2019); 1F1B / PipeDream-flush and the interleaved schedule
(Narayanan et al., SC'21, sec 2.2 and 2.2.2, and Megatron-LM's
``forward_backward_pipelining_with_interleaving``); ZB-H1 (Qi et al. 2024, "Zero Bubble
Pipeline Parallelism", arXiv:2401.10241, sec 2.1).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from simdist.spec.plan import SCHEDULES  # the one list of schedule names (ParallelPlan.schedule)

__all__ = [
    "SCHEDULES",
    "Action",
    "DeadlockError",
    "dependencies",
    "gpipe",
    "in_flight_peak",
    "interleaved_1f1b",
    "one_f_one_b",
    "schedule",
    "simulate_unit_times",
    "virtual_stage",
    "zero_bubble",
]


class Action(NamedTuple):  # a tuple: hashed and compared in C (the engine keys its arrivals by it)
    kind: Literal["F", "B", "W"]  # forward; backward (input grad, or whole backward); weight grad
    microbatch: int  # 0..m-1
    chunk: int = 0  # model chunk on this stage (virtual stage), 0..v-1


class DeadlockError(RuntimeError):
    """No stage can start its next action: the schedule's orders contradict its dependencies."""


def _check(p: int, m: int, v: int = 1) -> None:
    for name, val in (("p", p), ("m", m), ("v", v)):
        if not isinstance(val, int) or val < 1:
            raise ValueError(f"pipeline schedule: {name} must be an integer >= 1, got {val!r}")


def gpipe(p: int, m: int) -> list[list[Action]]:
    """GPipe (Huang et al. 2019): all m forwards, then all m backwards, on every stage."""
    _check(p, m)
    per_stage = [Action("F", i) for i in range(m)]  # fill: every forward first
    per_stage += [Action("B", i) for i in range(m)]  # drain: backwards in the same order
    return [list(per_stage) for _ in range(p)]


def one_f_one_b(p: int, m: int) -> list[list[Action]]:
    """1F1B / PipeDream-flush (Narayanan et al. SC'21, sec 2.2)."""
    _check(p, m)
    fwd = [Action("F", i) for i in range(m)]  # made once, shared by the stages
    bwd = [Action("B", i) for i in range(m)]
    sched = []
    for s in range(p):
        warmup = min(p - s - 1, m)  # forwards in flight before the first backward reaches s
        acts = fwd[:warmup]  # warm-up
        for i in range(m - warmup):  # steady state: one forward, then one backward
            acts += (fwd[warmup + i], bwd[i])
        acts += bwd[m - warmup:]  # cool-down: drain backwards
        sched.append(acts)
    return sched


def interleaved_1f1b(p: int, m: int, v: int) -> list[list[Action]]:
    """Interleaved 1F1B (Narayanan et al. SC'21, sec 2.2.2; Megatron-LM's
    ``forward_backward_pipelining_with_interleaving``). Stage s holds v chunks, chunk c being
    virtual stage c*p + s. With v == 1 this is plain 1F1B (Megatron runs the non-interleaved
    schedule then)."""
    _check(p, m, v)
    if v == 1:
        return one_f_one_b(p, m)
    if m % p != 0:
        raise ValueError(
            f"interleaved-1f1b needs the number of microbatches (m={m}) to be a multiple of "
            f"the pipeline size (p={p}) when v={v} > 1 (Megatron-LM's rule)"
        )
    total = m * v  # one (microbatch, chunk) unit of work per forward / backward

    def unit(k: int, forward: bool) -> tuple[int, int]:
        # Megatron order: groups of p microbatches go through chunk 0, then chunk 1, ...;
        # backwards walk the chunks in reverse (last chunk first).
        group, r = divmod(k, p * v)
        chunk = r // p if forward else v - 1 - r // p
        return group * p + r % p, chunk

    fwd = [Action("F", *unit(k, True)) for k in range(total)]  # the k-th forward of every stage
    bwd = [Action("B", *unit(k, False)) for k in range(total)]  # (made once, shared by the stages)
    sched = []
    for s in range(p):
        warmup = min((p - s - 1) * 2 + (v - 1) * p, total)  # Megatron's warm-up count
        acts = fwd[:warmup]  # warm-up
        for i in range(total - warmup):  # steady state: forward k+warmup, then backward k
            acts += (fwd[warmup + i], bwd[i])
        acts += bwd[total - warmup:]  # cool-down
        sched.append(acts)
    return sched


def zero_bubble(p: int, m: int) -> list[list[Action]]:
    """ZB-H1 (Qi et al. 2024, sec 2.1): 1F1B's F/B order, the backward split into B (input
    grad, critical path) and W (weight grad). Stage s defers its W passes by s microbatches,
    so B reaches early stages sooner and the deferred W fill the cool-down bubbles.

    Memory (paper's per-worker formula (p-i+1)*M_B + (i-1)*M_W, worker i = s+1): stage s holds
    at most p - s full activations (F done, B not) -- 1F1B's count -- plus s weight-grad stashes
    (B done, W not). So ``in_flight_peak`` (W frees) is p on every stage when m >= p, while
    ``in_flight_peak(..., freed_by="B")`` is 1F1B's p - s; the first stage's peak equals 1F1B's.
    """
    _check(p, m)
    sched = []
    for s in range(p):
        warmup = min(p - s - 1, m)  # warm-up: as 1F1B
        acts = [Action("F", i) for i in range(warmup)]
        for i in range(m - warmup):  # steady state: F, B, then the W deferred by s microbatches
            acts += [Action("F", warmup + i), Action("B", i)]
            if i >= s:
                acts.append(Action("W", i - s))
        for i in range(m - warmup, m):  # cool-down: remaining B, each with its deferred W
            acts.append(Action("B", i))
            if i >= s:
                acts.append(Action("W", i - s))
        acts += [Action("W", i) for i in range(max(m - s, 0), m)]  # tail: flush deferred W
        sched.append(acts)
    return sched


def schedule(name: str, p: int, m: int, v: int = 1) -> list[list[Action]]:
    """Dispatch on the schedule's name; v (chunks per stage) only for interleaved-1f1b."""
    if name == "interleaved-1f1b":
        return interleaved_1f1b(p, m, v)
    builders = {"gpipe": gpipe, "1f1b": one_f_one_b, "zero-bubble": zero_bubble}
    if name not in builders:
        raise ValueError(f"unknown pipeline schedule {name!r}; choose one of {SCHEDULES}")
    if v != 1:
        raise ValueError(f"pipeline schedule {name!r} has one chunk per stage; got v={v}")
    return builders[name](p, m)


def virtual_stage(stage: int, chunk: int, p: int) -> int:
    """Global position of (stage, chunk) in the model (Megatron's interleaved layer layout)."""
    return chunk * p + stage


def dependencies(
    action: Action, stage: int, p: int, v: int, split_backward: bool
) -> list[tuple[int, Action]]:
    """The (stage, action) pairs that must finish before ``action`` may start on ``stage``."""
    mb, k = action.microbatch, virtual_stage(stage, action.chunk, p)
    last = p * v - 1

    def at(kind: Literal["F", "B"], vs: int) -> tuple[int, Action]:
        return vs % p, Action(kind, mb, vs // p)

    if action.kind == "F":
        return [at("F", k - 1)] if k > 0 else []
    if action.kind == "B":
        return [at("B", k + 1)] if k < last else [at("F", k)]
    if not split_backward:
        raise ValueError(f"{action} is a weight-grad pass but split_backward is False")
    return [(stage, Action("B", mb, action.chunk))]


def in_flight_peak(actions: list[Action], freed_by: Literal["B", "W"] | None = None) -> int:
    """Peak number of (microbatch, chunk) whose activations are alive at once on a stage.

    F adds one; it is freed by B when the backward is not split and by W when it is (the
    default, ``freed_by=None``, picks W iff the list has W actions). ``freed_by="B"`` counts
    only the full activations (the paper's M_B), ignoring the weight-grad stash kept until W.
    """
    release = freed_by or ("W" if any(a.kind == "W" for a in actions) else "B")
    alive: set[tuple[int, int]] = set()
    peak = 0
    for a in actions:
        if a.kind == "F":
            alive.add((a.microbatch, a.chunk))
            peak = max(peak, len(alive))
        elif a.kind == release:
            alive.discard((a.microbatch, a.chunk))
    return peak


def simulate_unit_times(
    sched: list[list[Action]],
    p: int,
    v: int,
    t_f: float = 1.0,
    t_b: float = 2.0,
    t_w: float = 0.0,
) -> tuple[float, list[float]]:
    """List-schedule ``sched`` with zero communication; returns (makespan, busy time per stage).

    Times are per stage for the whole stage (all v chunks), so one chunk's F takes t_f/v,
    B takes t_b/v and W takes t_w/v. B always costs t_b: for a schedule without W it is the
    whole backward (pass e.g. t_b=2); with W actions pass the two halves (e.g. t_b=1, t_w=1).
    Each stage runs its actions strictly in order; an action starts once the previous one on
    its stage and all its :func:`dependencies` have finished. Raises DeadlockError if stuck.
    """
    if len(sched) != p:
        raise ValueError(f"schedule has {len(sched)} stages, expected p={p}")
    split = any(a.kind == "W" for acts in sched for a in acts)
    cost = {"F": t_f / v, "B": t_b / v, "W": t_w / v}
    done: dict[tuple[int, Action], float] = {}
    clock = [0.0] * p  # when each stage's last started action finishes
    busy = [0.0] * p
    pos = [0] * p  # index of each stage's next action
    progressed = True
    while progressed:
        progressed = False
        for s in range(p):
            while pos[s] < len(sched[s]):
                a = sched[s][pos[s]]
                deps = dependencies(a, s, p, v, split)
                if any(d not in done for d in deps):
                    break
                start = max([clock[s], *(done[d] for d in deps)])
                clock[s] = done[(s, a)] = start + cost[a.kind]
                busy[s] += cost[a.kind]
                pos[s] += 1
                progressed = True
    stuck = [(s, sched[s][pos[s]]) for s in range(p) if pos[s] < len(sched[s])]
    if stuck:
        raise DeadlockError(f"pipeline schedule deadlocks; stages waiting at {stuck}")
    return max(clock, default=0.0), busy
