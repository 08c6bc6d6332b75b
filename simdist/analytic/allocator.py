"""A replay of PyTorch's CUDA caching allocator: how much device memory it reserves for a
sequence of tensor allocations and frees, and so the gap between reserved and allocated.

The rules are those of c10/cuda/CUDACachingAllocator.cpp (and the "Memory management" section
of PyTorch's CUDA semantics notes):
- every request is rounded up to a multiple of 512 B (kMinBlockSize);
- requests of at most 1 MiB come from the small pool, in 2 MiB segments (kSmallBuffer); larger
  ones from the large pool: a 20 MiB segment (kLargeBuffer) for requests under 10 MiB
  (kMinLargeAlloc), else a segment of the request rounded up to 2 MiB (kRoundLarge);
- a request takes the smallest cached free block that fits, of its own pool and stream (blocks
  never move between streams); the remainder is split off when it is more than 1 MiB (large
  pool) or at least 512 B (small pool);
- a freed block merges with free neighbours of its segment and stays cached (reserved);
- when a new segment would not fit on the device, the allocator releases its cached segments
  that are entirely free and tries again (``release_cached_blocks``).
So memory is reserved beyond what is allocated when cached blocks are too small for the
requests of a later phase (the logits after a forward pass of layer-sized temporaries), when
long-lived tensors land inside segments of short-lived ones, and in the pools of other streams.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
SMALL_BUFFER = 2 << 20
LARGE_BUFFER = 20 << 20
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20


def round_size(n: float) -> int:
    return max(MIN_BLOCK, -(-int(n) // MIN_BLOCK) * MIN_BLOCK)


def segment_size(size: int) -> int:
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


def _drop(free: list[tuple[int, int]], size: int, bid: int) -> None:
    """Remove (size, bid) from a sorted free list."""
    del free[bisect.bisect_left(free, (size, bid))]


@dataclass(slots=True)
class _Block:
    size: int
    pool: tuple[str, bool]
    prev: int | None = None
    next: int | None = None
    free: bool = True


@dataclass
class CachingAllocator:
    """Replays allocations (``malloc(key, nbytes, stream)``) and frees (``free(key)``) and keeps
    the peaks of allocated and reserved bytes. ``limit``: device bytes the allocator may reserve."""

    limit: float = float("inf")
    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    _blocks: dict[int, _Block] = field(default_factory=dict)
    _free: dict[tuple[str, bool], list[tuple[int, int]]] = field(default_factory=dict)
    _live: dict[object, int] = field(default_factory=dict)
    _next_id: int = 0

    def malloc(self, key: object, nbytes: float, stream: str = "compute") -> None:
        n = int(nbytes)  # round_size, inline (the replay's hottest line)
        size = -(-n // MIN_BLOCK) * MIN_BLOCK if n > MIN_BLOCK else MIN_BLOCK
        small = size <= SMALL_SIZE
        pool = (stream, small)
        free = self._free.get(pool)
        if free is None:
            free = self._free[pool] = []
        blocks = self._blocks
        i = bisect.bisect_left(free, (size, -1))
        if i < len(free):
            bid = free.pop(i)[1]
        else:
            bid = self._new_segment(pool, segment_size(size))
            _drop(free, blocks[bid].size, bid)
        block = blocks[bid]
        rest = block.size - size
        if (rest >= MIN_BLOCK) if small else (rest > SMALL_SIZE):
            nid = self._new_id()
            blocks[nid] = _Block(rest, pool, prev=bid, next=block.next)
            if block.next is not None:
                blocks[block.next].prev = nid
            block.next, block.size = nid, size
            bisect.insort(free, (rest, nid))
        block.free = False
        self.allocated += block.size
        if self.allocated > self.peak_allocated:
            self.peak_allocated = self.allocated
        self._live[key] = bid

    def free(self, key: object) -> None:
        bid = self._live.pop(key)
        blocks = self._blocks
        block = blocks[bid]
        block.free = True
        self.allocated -= block.size
        free = self._free[block.pool]
        prev_id = block.prev  # merge with a free block before it: that one grows
        if prev_id is not None and blocks[prev_id].free:
            _drop(free, blocks[prev_id].size, prev_id)
            self._absorb_next(prev_id)
            bid, block = prev_id, blocks[prev_id]
        next_id = block.next  # and with a free block after it: this one grows
        if next_id is not None and blocks[next_id].free:
            _drop(free, blocks[next_id].size, next_id)
            self._absorb_next(bid)
        bisect.insort(free, (block.size, bid))

    def _absorb_next(self, bid: int) -> None:
        """Block ``bid`` takes in the block after it (both free, of one segment)."""
        blocks = self._blocks
        block = blocks[bid]
        gone_id = block.next
        gone = blocks.pop(gone_id)
        block.size += gone.size
        block.next = gone.next
        if gone.next is not None:
            blocks[gone.next].prev = bid

    def live(self, key: object) -> bool:
        return key in self._live

    def live_keys(self) -> list[object]:
        return list(self._live)

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _new_segment(self, pool: tuple[str, bool], size: int) -> int:
        if self.reserved + size > self.limit:
            self._release_free_segments()
        bid = self._new_id()
        self._blocks[bid] = _Block(size, pool)
        bisect.insort(self._free[pool], (size, bid))
        self.reserved += size
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return bid

    def _release_free_segments(self) -> None:
        for free in self._free.values():
            keep = []
            for size, bid in free:
                b = self._blocks[bid]
                if b.prev is None and b.next is None:  # a whole segment, unused
                    self.reserved -= size
                    del self._blocks[bid]
                else:
                    keep.append((size, bid))
            free[:] = keep  # in place: callers hold the list
