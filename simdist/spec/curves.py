"""Interpolation in log-size over measured (size, value) points: a profile's efficiency curves
(simdist.spec.profile) and its top-k rates (simdist.spec.selection)."""

from __future__ import annotations

import bisect
import math


def log_interpolated(points: list[tuple[float, float]], size: float) -> float:
    """The value at ``size`` of (size, value) points, linear in log-size between them and the
    nearest end's outside them."""
    xs = [math.log(max(p[0], 1.0)) for p in points]
    i = bisect.bisect_left(xs, math.log(max(size, 1.0)))
    if i == 0 or i >= len(points):
        return points[min(i, len(points) - 1)][1]
    w = (math.log(max(size, 1.0)) - xs[i - 1]) / (xs[i] - xs[i - 1])
    return points[i - 1][1] * (1 - w) + points[i][1] * w
