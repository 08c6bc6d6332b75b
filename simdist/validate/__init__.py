"""Validation against public, published measurements (`simdist validate`).

- :mod:`simdist.validate.training`: the training-runs report (training_runs.csv): each row
  mapped to a scenario and predicted, measured against predicted step time per row, per source
  and overall; rows the simulator cannot express yet are skipped, each with its reasons;
- :mod:`simdist.validate.breadth`: the breadth report (breadth.csv): offload, ZeRO++, FSDP,
  checkpoint sizes and failure counts, each predicted from the mechanism;
- :mod:`simdist.validate.rows`: what both share (the data folder, CSV cells, error summaries).

The data ships with the package (simdist/validate/data/: the CSVs and a README naming each
column and source). ``simdist validate --data DIR`` or ``SIMDIST_VALIDATION_DIR=DIR`` reads
another copy with the same file names instead.
"""

from simdist.validate.breadth import BreadthResult, breadth_table, run_breadth
from simdist.validate.rows import data_dir, packaged_data_dir
from simdist.validate.training import (
    Case,
    Result,
    build_cases,
    run_training,
    summarize,
    unsupported,
)

__all__ = [
    "BreadthResult",
    "Case",
    "Result",
    "breadth_table",
    "build_cases",
    "data_dir",
    "packaged_data_dir",
    "run_breadth",
    "run_training",
    "summarize",
    "unsupported",
]
