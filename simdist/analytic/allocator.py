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


# A free list holds ``size << _ID_BITS | block id`` sorted: the order of (size, id) pairs, as
# plain ints (the smallest block that fits, the oldest of equal ones) that bisect compares fast.
_ID_BITS = 40
_ID_MASK = (1 << _ID_BITS) - 1


class CachingAllocator:
    """Replays allocations (``malloc(key, nbytes, stream)``) and frees (``free(key)``) and keeps
    the peaks of allocated and reserved bytes. ``limit``: device bytes the allocator may reserve.

    Blocks are ids into parallel lists (size, the block before and after it in its segment, 0
    for none, free or not, pool); a merged-away block's id is left unused."""

    __slots__ = ("_free", "_isfree", "_live", "_next", "_pool", "_prev", "_size", "allocated", "limit",
                 "peak_allocated", "peak_reserved", "reserved")

    def __init__(self, limit: float = float("inf")) -> None:
        self.limit = limit
        self.allocated = self.reserved = self.peak_allocated = self.peak_reserved = 0
        self._size: list[int] = [0]  # id 0: no block
        self._prev: list[int] = [0]
        self._next: list[int] = [0]
        self._isfree: list[bool] = [False]
        self._pool: list[list[int]] = [[]]  # each block's pool's free list
        self._free: dict[tuple[str, bool], list[int]] = {}
        self._live: dict[object, int] = {}

    def malloc(self, key: object, nbytes: float, stream: str = "compute") -> None:
        n = int(nbytes)  # round_size, inline (the replay's hottest line)
        size = -(-n // MIN_BLOCK) * MIN_BLOCK if n > MIN_BLOCK else MIN_BLOCK
        small = size <= SMALL_SIZE
        free = self._free.get((stream, small))
        if free is None:
            free = self._free[(stream, small)] = []
        i = bisect.bisect_left(free, size << _ID_BITS)
        if i < len(free):
            bid = free.pop(i) & _ID_MASK
        else:
            bid = self._new_segment(free, segment_size(size))
        sizes = self._size
        rest = sizes[bid] - size
        if (rest >= MIN_BLOCK) if small else (rest > SMALL_SIZE):
            nid = len(sizes)  # split: the remainder is a new free block after this one
            after = self._next[bid]
            sizes.append(rest)
            self._prev.append(bid)
            self._next.append(after)
            self._isfree.append(True)
            self._pool.append(free)
            if after:
                self._prev[after] = nid
            self._next[bid] = nid
            sizes[bid] = size
            bisect.insort(free, rest << _ID_BITS | nid)
        self._isfree[bid] = False
        self.allocated += sizes[bid]
        if self.allocated > self.peak_allocated:
            self.peak_allocated = self.allocated
        self._live[key] = bid

    def free(self, key: object) -> None:
        bid = self._live.pop(key)
        sizes, isfree, nxt = self._size, self._isfree, self._next
        isfree[bid] = True
        self.allocated -= sizes[bid]
        free = self._pool[bid]
        before = self._prev[bid]  # merge with a free block before it: that one grows
        if before and isfree[before]:
            _drop(free, sizes[before], before)
            self._absorb_next(before)
            bid = before
        after = nxt[bid]  # and with a free block after it: this one grows
        if after and isfree[after]:
            _drop(free, sizes[after], after)
            self._absorb_next(bid)
        bisect.insort(free, sizes[bid] << _ID_BITS | bid)

    def _absorb_next(self, bid: int) -> None:
        """Block ``bid`` takes in the block after it (both free, of one segment)."""
        nxt = self._next
        gone = nxt[bid]
        self._size[bid] += self._size[gone]
        self._isfree[gone] = False  # unused from now on
        after = nxt[bid] = nxt[gone]
        if after:
            self._prev[after] = bid

    def live(self, key: object) -> bool:
        return key in self._live

    def live_keys(self) -> list[object]:
        return list(self._live)

    def _new_segment(self, free: list[int], size: int) -> int:
        """A new segment of ``size`` bytes for the pool of free list ``free``: its block's id
        (not entered in the free list: the caller takes it at once)."""
        if self.reserved + size > self.limit:
            self._release_free_segments()
        bid = len(self._size)
        self._size.append(size)
        self._prev.append(0)
        self._next.append(0)
        self._isfree.append(True)
        self._pool.append(free)
        self.reserved += size
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return bid

    def _release_free_segments(self) -> None:
        for free in self._free.values():
            keep = []
            for item in free:
                bid = item & _ID_MASK
                if not self._prev[bid] and not self._next[bid]:  # a whole segment, unused
                    self.reserved -= self._size[bid]
                    self._isfree[bid] = False
                else:
                    keep.append(item)
            free[:] = keep  # in place: blocks hold the list


def _drop(free: list[int], size: int, bid: int) -> None:
    """Remove block ``bid`` of ``size`` bytes from a sorted free list."""
    del free[bisect.bisect_left(free, size << _ID_BITS | bid)]


def replay(ops: list[tuple[int, int, int]], slots: int, pools: int,
           limit: float = float("inf")) -> tuple[int, int]:
    """:class:`CachingAllocator`'s rules over a recorded trace (simdist.analytic.allocation_record) in one loop (its methods inlined,
    blocks as ids into parallel lists, keys as slots): (peak allocated, peak reserved)."""
    insort, bisect_left = bisect.insort, bisect.bisect_left
    id_bits, id_mask, min_block, small = _ID_BITS, _ID_MASK, MIN_BLOCK, SMALL_SIZE  # locals: faster
    sizes, prev, nxt, isfree, pool_of = [0], [0], [0], [False], [0]
    frees: list[list[int]] = [[] for _ in range(pools)]
    block_of = [0] * slots
    allocated = reserved = peak_allocated = peak_reserved = 0
    for slot, size, pool in ops:
        if size:  # malloc
            free = frees[pool]
            i = bisect_left(free, size << id_bits)
            if i < len(free):
                bid = free.pop(i) & id_mask
            else:  # a new segment
                seg = segment_size(size)
                if reserved + seg > limit:
                    reserved -= _release(frees, sizes, prev, nxt, isfree)
                bid = len(sizes)
                sizes.append(seg)
                prev.append(0)
                nxt.append(0)
                isfree.append(True)
                pool_of.append(pool)
                reserved += seg
                if reserved > peak_reserved:
                    peak_reserved = reserved
            rest = sizes[bid] - size
            if (rest >= min_block) if size <= small else (rest > small):
                nid = len(sizes)
                after = nxt[bid]
                sizes.append(rest)
                prev.append(bid)
                nxt.append(after)
                isfree.append(True)
                pool_of.append(pool)
                if after:
                    prev[after] = nid
                nxt[bid] = nid
                sizes[bid] = size
                insort(free, rest << id_bits | nid)
            isfree[bid] = False
            allocated += sizes[bid]
            if allocated > peak_allocated:
                peak_allocated = allocated
            block_of[slot] = bid
        else:  # free, merging with free neighbours of its segment
            bid = block_of[slot]
            isfree[bid] = True
            allocated -= sizes[bid]
            free = frees[pool_of[bid]]
            before = prev[bid]
            if before and isfree[before]:
                del free[bisect_left(free, sizes[before] << id_bits | before)]
                gone = bid
                sizes[before] += sizes[gone]
                isfree[gone] = False
                after = nxt[before] = nxt[gone]
                if after:
                    prev[after] = before
                bid = before
            after = nxt[bid]
            if after and isfree[after]:
                del free[bisect_left(free, sizes[after] << id_bits | after)]
                sizes[bid] += sizes[after]
                isfree[after] = False
                beyond = nxt[bid] = nxt[after]
                if beyond:
                    prev[beyond] = bid
            insort(free, sizes[bid] << id_bits | bid)
    return peak_allocated, peak_reserved


def _release(frees: list[list[int]], sizes: list[int], prev: list[int], nxt: list[int],
             isfree: list[bool]) -> int:
    """The cached segments that are entirely free go back to the device: their bytes."""
    released = 0
    for free in frees:
        keep = []
        for item in free:
            bid = item & _ID_MASK
            if not prev[bid] and not nxt[bid]:
                released += sizes[bid]
                isfree[bid] = False
            else:
                keep.append(item)
        free[:] = keep
    return released
