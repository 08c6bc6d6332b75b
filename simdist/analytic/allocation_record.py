"""The allocations and frees of a caching-allocator replay, recorded, then replayed at once.

:class:`Trace` takes ``malloc``, ``free`` and ``live`` as simdist.analytic.allocator's
``CachingAllocator`` does and gives, from :meth:`Trace.peaks`, the peaks that allocator gives
for the same calls. Which keys are live does not depend on where blocks land, so the calls can
be recorded first (keys as small ints, sizes rounded once) and replayed in one loop
(simdist.analytic.allocator.replay), several times faster than call by call.

A recorded stretch (a :class:`Segment`: one training step's forwards and backwards) is appended
again without being worked out again when everything its calls depended on is as it was: the
liveness of every key it freed or asked about before allocating it (``repeat``).
"""

from __future__ import annotations

from simdist.analytic.allocator import MIN_BLOCK, SMALL_SIZE, replay
from simdist.frozen import frozen


@frozen(slots=True)
class Segment:
    """Recorded calls: ``ops[start:end]``, and the liveness at its start of each key it
    depended on (freed or asked about before it allocated it there)."""

    start: int
    end: int
    depends: tuple[tuple[object, bool], ...]


class Trace:
    __slots__ = ("_keys", "_live", "_pools", "_queries", "_sizes", "_slots", "ops")

    def __init__(self) -> None:
        self.ops: list[tuple[int, int, int]] = []  # (slot, rounded size, pool); size 0: a free
        self._live: dict[object, int] = {}  # live key -> its slot (in allocation order)
        self._slots: dict[object, int] = {}  # every key seen -> its slot
        self._keys: list[object] = []  # slot -> key
        self._sizes: dict[tuple[float, str], tuple[int, int]] = {}  # (bytes, stream) -> (size, pool)
        self._pools: dict[tuple[str, bool], int] = {}
        self._queries: list[tuple[int, object, bool]] | None = None  # (op index, key, answer)

    def malloc(self, key: object, nbytes: float, stream: str = "compute") -> None:
        self.put(key, self.sized(nbytes, stream))

    def sized(self, nbytes: float, stream: str = "compute") -> tuple[int, int]:
        """(rounded size, pool) of a request, for :meth:`put` (the pool is numbered on first use,
        as by :meth:`malloc`)."""
        sized = self._sizes.get((nbytes, stream))
        if sized is None:
            sized = self._sizes[(nbytes, stream)] = self._size(nbytes, stream)
        return sized

    def put(self, key: object, sized: tuple[int, int]) -> None:
        """:meth:`malloc` of a request already :meth:`sized` (the replay's many repeated tensors)."""
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = len(self._keys)
            self._keys.append(key)
        self._live[key] = slot
        self.ops.append((slot, *sized))

    def _size(self, nbytes: float, stream: str) -> tuple[int, int]:
        n = int(nbytes)  # the allocator's round_size
        size = -(-n // MIN_BLOCK) * MIN_BLOCK if n > MIN_BLOCK else MIN_BLOCK
        return size, self._pools.setdefault((stream, size <= SMALL_SIZE), len(self._pools))

    def free(self, key: object) -> None:
        self.ops.append((self._live.pop(key), 0, 0))

    def live(self, key: object) -> bool:
        answer = key in self._live
        if self._queries is not None:
            self._queries.append((len(self.ops), key, answer))
        return answer

    def live_keys(self) -> list[object]:
        return list(self._live)

    def peaks(self, limit: float = float("inf")) -> tuple[int, int]:
        """(peak allocated, peak reserved) bytes of the trace under a device ``limit``."""
        return replay(self.ops, len(self._keys), len(self._pools), limit)

    # --- segments ---------------------------------------------------------------------------

    def begin(self) -> int:
        """Start recording a segment: its start, for :meth:`end`."""
        self._queries = []
        return len(self.ops)

    def end(self, start: int) -> Segment:
        queries, self._queries = self._queries or [], None
        ops, keys = self.ops, self._keys
        first: dict[int, int] = {}  # slot -> the op that first touched it in the segment
        depends: dict[object, bool] = {}
        for i in range(start, len(ops)):
            slot, size, _ = ops[i]
            if slot not in first:
                first[slot] = i
                if not size:  # freed before allocated here: it was live at the start
                    depends[keys[slot]] = True
        for at, key, answer in queries:
            slot = self._slots.get(key)
            if (slot is None or first.get(slot, at) >= at) and key not in depends:
                depends[key] = answer  # untouched before the question: the start's answer
        return Segment(start, len(ops), tuple(depends.items()))

    def repeat(self, seg: Segment) -> bool:
        """Append ``seg``'s calls again when every key it depended on is live or not as at its
        start (then the same calls would be made); False, and nothing appended, otherwise."""
        live = self._live
        if any((key in live) != was for key, was in seg.depends):
            return False
        keys, again = self._keys, self.ops[seg.start:seg.end]
        for slot, size, _ in again:  # the same liveness changes, in the same order
            if size:
                live[keys[slot]] = slot
            else:
                del live[keys[slot]]
        self.ops.extend(again)
        return True
