"""``python -m simdist.cli ARGS``: the same as ``simdist ARGS``."""

import sys

from simdist.cli import main

sys.exit(main())
