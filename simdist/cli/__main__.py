"""``python -m simdist.cli ARGS``: the same as ``simdist ARGS``."""

from simdist.cli import program

program()
