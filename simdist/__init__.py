"""simdist: predict step time, memory and the best plan for distributed LLM training.

The public entry point is :func:`simdist.predict.predict`; scenario files are loaded with
:func:`simdist.spec.scenario.load_scenario`. Importing this package stays light (no torch,
no pandas) so the CLI starts fast.
"""

__version__ = "0.1.0"
