"""The what-if dashboard (`streamlit run app.py`), in modules:

- :mod:`~simdist.dashboard.knobs`: knob <-> scenario dict, pure (no Streamlit);
- :mod:`~simdist.dashboard.diff`: pinned-vs-current field diffs and metric deltas, pure;
- :mod:`~simdist.dashboard.sweep`: one-knob sweeps, pure;
- :mod:`~simdist.dashboard.tables`: rows for the search and calibration tables, pure;
- :mod:`~simdist.dashboard.cache`: predictions and sweeps cached across reruns (Streamlit);
- :mod:`~simdist.dashboard.sidebar` and :mod:`~simdist.dashboard.tabs`: the page (Streamlit).

Figures come from :mod:`simdist.viz`; app.py only lays out the page.
"""
