"""Top-k selection on a CPU, priced from the microbenchmark's rows (profile ``select_rates``).

torch's CPU top-k (aten/src/ATen/native/cpu/SortingKernel.cpp, ``topk_impl_loop``) copies the
tensor into (value, index) pairs and selects with one of two algorithms of the C++ library, by
the share it keeps (``use_partial_sort = k * 64 <= n``):

- ``std::partial_sort`` (k at most n/64): a heap of the k best so far. Every entry is compared
  with the heap's top; over a random order about k ln(n/k) of them beat it and are sifted in
  (log2 k steps each), and the heap is sorted at the end (k log2 k). Seconds per entry:
  ``a + b * r * log2(k) * (ln(1/r) + 1)``, r = k/n (:func:`heap_work`), ``a`` and ``b`` fitted
  per size on two kept shares;
- ``std::nth_element`` otherwise: introselect, linear in n whatever k: one rate per size.

Measured on the 2-core guest simdist was calibrated on (one thread, 2026-11-29, ns per entry):
at 64 Ki entries 1.27 (0.1% kept), 2.59 (0.5%), 4.19 (1%), 5.73 (1.5%), then 8.3-9.1 from 1.6%
to 10%; at 1 Mi 1.49, 3.6, 6.08, 8.39, then 6.7-7.1. Fitted on 0.1% and 1%, the heap's form gives
2.59 and 5.72 at 64 Ki, 3.66 and 8.29 at 1 Mi. Rows of profiles before version 9 were measured at
5% kept only: every share is priced at their rate (a heap selection of a small share too slowly).
"""

from __future__ import annotations

import functools
import math

from simdist.spec.curves import log_interpolated

PARTIAL_SORT_EVERY = 64  # torch heap-selects when k * 64 <= n
OLD_SHARE = 0.05  # the share kept by the rows of profiles before version 9


def heap_selects(elements: float, k: float) -> bool:
    return k * PARTIAL_SORT_EVERY <= elements


def heap_work(elements: float, k: float) -> float:
    """A heap selection's sift steps per entry beyond the comparison every entry gets (module
    docstring): r * log2(k) * (ln(1/r) + 1)."""
    r = min(1.0, k / elements)
    return r * math.log2(max(k, 2.0)) * (math.log(1.0 / r) + 1.0)


def select_seconds(rows: list[tuple[float, float, float]], elements: float, k: float) -> float | None:
    """Seconds to keep the top ``k`` of one ``elements``-long tensor, from (elements, share kept,
    seconds per entry) rows; None without rows."""
    if not rows or elements <= 0:
        return None
    k = min(max(1.0, k), elements)
    if heap_selects(elements, k):
        terms = _heap_terms(tuple(r for r in rows if heap_selects(r[0], r[1] * r[0])))
        if terms:
            a = log_interpolated([(n, t[0]) for n, t in terms], elements)
            b = log_interpolated([(n, t[1]) for n, t in terms], elements)
            return elements * (a + b * heap_work(elements, k))
    linear = [(n, s) for n, share, s in rows if not heap_selects(n, share * n)] or [(n, s) for n, _, s in rows]
    return elements * log_interpolated(linear, elements)


@functools.lru_cache(maxsize=64)  # a profile's rows give the same terms at every call
def _heap_terms(rows: tuple[tuple[float, float, float], ...]) -> tuple[tuple[float, tuple[float, float]], ...]:
    """(elements, (a, b)) for each size measured at two kept shares or more: the least-squares
    line of seconds per entry against :func:`heap_work`."""
    by_size: dict[float, list[tuple[float, float]]] = {}
    for n, share, s in rows:
        by_size.setdefault(n, []).append((heap_work(n, share * n), s))
    out = []
    for n, pts in sorted(by_size.items()):
        if len({x for x, _ in pts}) < 2:
            continue
        mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
        b = max(0.0, sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts))
        out.append((n, (max(0.0, my - b * mx), b)))
    return tuple(out)  # cached: shared by every call with these rows
