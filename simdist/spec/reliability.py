"""Reliability: failures and checkpoints (the scenario's optional ``reliability`` section)."""

from __future__ import annotations

from simdist.frozen import frozen
from simdist.spec.fields import spec_field, validate


@frozen(kw_only=True)
class Reliability:
    """Failures and checkpoints, which turn a step time into goodput and time to train."""

    gpu_mtbf_s: float = spec_field(key="gpu_mtbf", unit="duration", check="positive",
                                   doc="mean time between failures of one GPU")
    checkpoint_bandwidth_bytes_per_s: float = spec_field(key="checkpoint_bandwidth", unit="bandwidth",
                                                         check="positive",
                                                         doc="aggregate write bandwidth to checkpoint storage")
    checkpoint_interval_s: float | None = spec_field(None, key="checkpoint_interval", unit="duration",
                                                     check="positive", auto="auto",
                                                     doc="auto = the optimum for this MTBF, or a duration")
    async_checkpoint: bool = spec_field(False, doc="the step only pays the copy to host memory")
    restart_time_s: float = spec_field(600.0, key="restart_time", unit="duration", check="nonneg",
                                       doc="detect, reschedule, reload")
    train_tokens: float | None = spec_field(None, check="positive", numeric_text=True,
                                            doc="tokens to train (gives the wall-clock time to train)")

    def __post_init__(self) -> None:
        validate(self)
