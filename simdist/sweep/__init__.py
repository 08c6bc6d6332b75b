"""Design-space sweeps (`simdist sweep SWEEP.yaml`): a base scenario, axes over its fields,
and at each point a prediction or a search for the best plan; the results as one table, kept in
the run store under the sweep's id and resumable. The format: docs/sweeps.md.

- :mod:`simdist.sweep.spec`: the sweep file, checked (every problem naming its field), and its points;
- :mod:`simdist.sweep.points`: one point, predicted or searched, as a flat row;
- :mod:`simdist.sweep.backends`: local processes or Ray, and the chunk-size rule;
- :mod:`simdist.sweep.store`: the sweep tables beside the runs in the run store;
- :mod:`simdist.sweep.table`: the DataFrame, CSV or Parquet, written whole;
- :mod:`simdist.sweep.run`: ``run_sweep``, the driver.
"""

from simdist.sweep.run import SweepOutcome, run_sweep
from simdist.sweep.spec import SweepSpec, load_sweep, sweep_from_dict
from simdist.sweep.store import SweepStore
from simdist.sweep.table import read_table, write_table

__all__ = ["SweepOutcome", "SweepSpec", "SweepStore", "load_sweep", "read_table", "run_sweep",
           "sweep_from_dict", "write_table"]
