"""``python -m executor FILE --nproc N [--steps K] [--out M.json]``: the same as ``simdist run``."""

from executor.launch import main

raise SystemExit(main())
