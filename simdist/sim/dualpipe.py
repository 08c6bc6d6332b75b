"""DualPipe and DualPipeV (DeepSeek-V3, arXiv:2412.19437 sec 3.2.1; deepseek-ai/DualPipe): the
placement of their model chunks and the order each rank runs its actions.

- DualPipe: the model is cut into pp stages; rank r holds stage r for the micro-batches fed
  from the first rank (chunk 0) and stage pp-1-r for those fed from the last rank (chunk 1), so
  every rank keeps two copies' worth of stages (twice 1F1B's parameters). Micro-batches
  0 .. m/2-1 go one way, m/2 .. m-1 the other.
- DualPipeV ("cut in half", PyTorch's ScheduleDualPipeV): the model is cut into 2*pp stages;
  rank r holds stage r (chunk 0) and stage 2pp-1-r (chunk 1), so a micro-batch goes down the
  ranks and back up (a V), and a rank holds 1/pp of the model.

The order: each rank runs, whenever it is free, the backward that is ready (the earliest
micro-batch first), else the next forward, alternating the two directions (DualPipe) or the
two chunks (DualPipeV), with at most pp + 1 micro-batch chunks in flight (the DualPipe README's
activation figure). The ranks are list-scheduled with unit times (forward 1, backward 2), which
gives DualPipe's bidirectional warm-up, a steady phase in which a forward and a backward of two
micro-batches alternate (the pairs whose all-to-all hides behind each other's compute), and the
cool-down; the engine then runs this order with real times.
"""

from __future__ import annotations

from simdist.sim.schedules import Action


def stages_of(name: str, p: int) -> int:
    """Model stages (virtual stages) of the schedule."""
    return 2 * p if name == "dualpipev" else p


def place(name: str, p: int, mb: int, m: int, vs: int) -> tuple[int, int]:
    """(rank, chunk) that runs virtual stage ``vs`` of micro-batch ``mb``."""
    if name == "dualpipev":
        return (vs, 0) if vs < p else (2 * p - 1 - vs, 1)
    if mb < m // 2:
        return vs, 0
    return p - 1 - vs, 1


def position(name: str, p: int, mb: int, m: int, rank: int, chunk: int) -> int:
    """The virtual stage that ``chunk`` of ``rank`` is for micro-batch ``mb``."""
    if name == "dualpipev":
        return rank if chunk == 0 else 2 * p - 1 - rank
    return rank if chunk == 0 else p - 1 - rank


def chunk_of(name: str, mb: int, m: int, vs: int, p: int) -> int:
    return place(name, p, mb, m, vs)[1]


def dependencies(name: str, action: Action, rank: int, p: int, m: int, split: bool) -> list[tuple[int, Action]]:
    """The (rank, action) pairs that must finish before ``action`` starts on ``rank``."""
    mb = action.microbatch
    vs = position(name, p, mb, m, rank, action.chunk)
    last = stages_of(name, p) - 1

    def at(kind: str, k: int) -> tuple[int, Action]:
        r, c = place(name, p, mb, m, k)
        return r, Action(kind, mb, c)  # type: ignore[arg-type]

    if action.kind == "F":
        return [at("F", vs - 1)] if vs > 0 else []
    if action.kind == "B":
        return [at("B", vs + 1)] if vs < last else [at("F", vs)]
    if not split:
        raise ValueError(f"{action} is a weight-grad pass but the schedule does not split backward")
    return [(rank, Action("B", mb, action.chunk))]


def neighbour(name: str, action: Action, rank: int, p: int, m: int) -> int:
    """The rank that receives ``action``'s output (its activation for a forward, its input
    gradient for a backward); ``rank`` itself when the next stage lives there."""
    vs = position(name, p, action.microbatch, m, rank, action.chunk)
    nxt = vs + 1 if action.kind == "F" else vs - 1
    if nxt < 0 or nxt >= stages_of(name, p):
        return rank
    return place(name, p, action.microbatch, m, nxt)[0]


def schedule(name: str, p: int, m: int) -> list[list[Action]]:
    """The actions of every rank, in the order it runs them (see the module docstring)."""
    if p < 1 or m < 1:
        raise ValueError(f"pipeline schedule: p and m must be >= 1, got p={p}, m={m}")
    if name == "dualpipe" and (p % 2 or m % 2 or m < 2 * p):
        raise ValueError(f"dualpipe needs an even pp and an even number of at least 2*pp micro-batches, "
                         f"got p={p}, m={m}")
    if name == "dualpipev" and m < 2 * p:
        raise ValueError(f"dualpipev needs at least 2*pp micro-batches, got p={p}, m={m}")
    return [_rank_order(name, p, m, r) for r in range(p)]


def _rank_order(name: str, p: int, m: int, r: int) -> list[Action]:
    """One rank's phases (the DualPipe README's figure; DualPipeV as PyTorch runs it), with
    backward whole: F0 and B0 are the rank's "near" chunk (DualPipe: the direction whose first
    rank is nearer; DualPipeV: the way down the V), F1 and B1 the other.

      1 warm-up        F0 x 2(n - h - 1)
      2 both ways      (F0 F1) x (h + 1)
      3 first returns  (B1 F1) x (n - h - 1)
      4 steady         (F0 B1 F1 B0) x (k - 2n + h + 1)   forward and backward pairs
      5 drain          (B1 F1 B0) x (n - h - 1)
      6                (B1 B0) x (h + 1)
      7                B0 x (n - h - 1)

    with n = pp/2, h = min(r, pp-1-r) and k = m/2 micro-batches each way (DualPipe), or n = pp,
    h = r and k = m (DualPipeV)."""
    if name == "dualpipe":
        n, h, k = p // 2, min(r, p - 1 - r), m // 2
        near = 0 if r < n else 1  # the direction entering at the nearer end
        chunk = {0: near, 1: 1 - near}
        mbs = {c: [mb for mb in range(m) if place(name, p, mb, m, position(name, p, mb, m, r, c)) == (r, c)]
               for c in (0, 1)}
    else:
        n, h, k = p, r, m
        chunk = {0: 0, 1: 1}
        mbs = {0: list(range(m)), 1: list(range(m))}
    nxt = {("F", 0): 0, ("F", 1): 0, ("B", 0): 0, ("B", 1): 0}
    out: list[Action] = []

    def run(code: str) -> None:
        kind, phase = code[0], int(code[1])
        c = chunk[phase]
        i = nxt[(kind, phase)]
        nxt[(kind, phase)] = i + 1
        out.append(Action(kind, mbs[c][i], c))  # type: ignore[arg-type]

    phases = ((("F0",), 2 * (n - h - 1)), (("F0", "F1"), h + 1), (("B1", "F1"), n - h - 1),
              (("F0", "B1", "F1", "B0"), k - 2 * n + h + 1), (("B1", "F1", "B0"), n - h - 1),
              (("B1", "B0"), h + 1), (("B0",), n - h - 1))
    for codes, times in phases:
        for _ in range(times):
            for code in codes:
                run(code)
    return out
