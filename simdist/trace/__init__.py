"""Timeline traces: a Prediction's spans as Chrome / Perfetto trace JSON (`simdist trace`)."""

from simdist.trace.perfetto import chrome_trace, write_trace

__all__ = ["chrome_trace", "write_trace"]
