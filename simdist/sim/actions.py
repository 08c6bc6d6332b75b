"""The schedule's actions as the event engine runs them: per stage, each action with three small
ints worked out once per schedule shape and kept (:func:`stage_actions`):

- its *task*: its chunk, its kind and whether it is the last micro-batch's, the three things its
  task depends on (:meth:`simdist.sim.work.ChunkWork.task`), as one index (:func:`task_index`);
- its *code*: the (stage, action) pair as one int, distinct among a step's actions
  (:func:`code`), by which the step driver keys the arrival of the action's output at the stage
  that needs it;
- its *input*: the code of the other stage's action it waits for, or -1 (the schedule's
  dependencies: at most one on another stage in every schedule; those on its own stage are met
  by the order of its actions).

Ints because the driver looks them up at every action: an int hashes at no cost and indexes a
list, where a tuple of tuples is hashed anew at every lookup.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import NamedTuple

from simdist.sim import dualpipe
from simdist.sim.schedules import Action, schedule

KINDS = ("F", "B", "W")
KIND = {kind: i for i, kind in enumerate(KINDS)}


class StageActions(NamedTuple):
    """One stage's actions in order, and per action its task index, its code and its input."""

    actions: tuple[Action, ...]
    tasks: tuple[int, ...]
    codes: tuple[int, ...]
    inputs: tuple[int, ...]


def chunks_per_stage(v: int, dual: bool) -> int:
    """Model chunks a stage holds: the plan's virtual stages, two under DualPipe (one per way)."""
    return 2 if dual else v


def task_index(action: Action, m: int) -> int:
    """The action's chunk, kind and whether it is micro-batch ``m - 1``'s, as one index below
    6 x the chunks per stage."""
    kind, mb, chunk = action
    return (chunk * 3 + KIND[kind]) * 2 + (mb == m - 1)


def code(stage: int, action: Action, p: int, chunks: int) -> int:
    """``action`` of ``stage`` as one int, distinct among a step's actions (``chunks`` per stage)."""
    kind, mb, chunk = action
    return ((mb * chunks + chunk) * 3 + KIND[kind]) * p + stage


def decode(c: int, p: int, chunks: int) -> tuple[int, Action]:
    """The (stage, action) of :func:`code` ``c``."""
    rest, stage = divmod(c, p)
    rest, kind = divmod(rest, 3)
    mb, chunk = divmod(rest, chunks)
    return stage, Action(KINDS[kind], mb, chunk)  # type: ignore[arg-type]


@lru_cache(maxsize=4)
def stage_actions(name: str, p: int, m: int, v: int, split: bool, dual: bool) -> tuple[StageActions, ...]:
    """Per stage: its actions and their task indices, codes and inputs. A pure function of the
    schedule's shape, kept for the next lowering of that shape (immutable: a prediction's short
    step and the plans of a search share a few shapes)."""
    if dual:  # DeepSeek-V3's bidirectional schedules (simdist.sim.dualpipe)
        c = chunks_per_stage(v, dual)
        return tuple(_listed(acts, s, p, m, c, lambda a, s=s: dualpipe.dependencies(name, a, s, p, m, split))
                     for s, acts in enumerate(dualpipe.schedule(name, p, m)))
    return tuple(_stage(acts, s, p, m, v, split) for s, acts in enumerate(schedule(name, p, m, v)))


def _listed(actions: list[Action], stage: int, p: int, m: int, chunks: int,
            deps: Callable[[Action], list[tuple[int, Action]]]) -> StageActions:
    """:class:`StageActions` of one stage from each action's dependencies, one by one."""
    inputs = []
    for a in actions:
        needs = [code(s, d, p, chunks) for s, d in deps(a) if s != stage]
        assert len(needs) <= 1, f"{a} waits for more than one other stage"
        inputs.append(needs[0] if needs else -1)
    return StageActions(tuple(actions), tuple(task_index(a, m) for a in actions),
                        tuple(code(stage, a, p, chunks) for a in actions), tuple(inputs))


def _stage(actions: list[Action], stage: int, p: int, m: int, v: int, split: bool) -> StageActions:
    """:class:`StageActions` of one stage of a one-way schedule, in one loop (the lowering's hot
    spot: every action of every stage), from a table per kind and chunk of the stage of
    :func:`simdist.sim.schedules.dependencies` (the same input for every micro-batch)."""
    last, stride = p * v - 1, 3 * v * p  # stride: the codes of one micro-batch
    # per kind and chunk: (task index / 2, the code less the micro-batch's part, what the input's
    # code adds to the action's, None: no input from another stage)
    rows: dict[str, list[tuple[int, int, int | None]]] = {}
    for kind in KINDS if split else KINDS[:2]:
        k = KIND[kind]
        row: list[tuple[int, int, int | None]] = []
        for chunk in range(v):
            vs, own = chunk * p + stage, (chunk * 3 + k) * p + stage
            # F: the previous virtual stage's F; B: the next one's B (the last turns around on its
            # own F); W: its own B
            j = vs - 1 if kind == "F" else vs + 1 if kind == "B" and vs < last else -1
            delta = None if j < 0 or j % p == stage else ((j // p) * 3 + k) * p + j % p - own
            row.append((chunk * 3 + k, own, delta))
        rows[kind] = row
    tasks, codes, inputs, end = [], [], [], m - 1
    for a in actions:
        kind, mb, chunk = a
        kept = rows.get(kind)
        if kept is None:
            raise ValueError(f"{a} is a weight-grad pass but split_backward is False")
        task, own, delta = kept[chunk]
        tasks.append(2 * task + (mb == end))
        c = mb * stride + own
        codes.append(c)
        inputs.append(-1 if delta is None else c + delta)
    return StageActions(tuple(actions), tuple(tasks), tuple(codes), tuple(inputs))
