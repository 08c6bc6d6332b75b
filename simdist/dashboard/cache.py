"""Predictions and sweeps cached across the dashboard's reruns (Streamlit caches).

A knob change reruns the whole page; the prediction of a scenario already seen (same hash,
name, engine and profile) comes from the cache, so going back to a plan is instant. A scenario
not seen yet is drawn twice in one run: the closed form's metrics and charts at once
(:func:`closed_form`, milliseconds), then the event engine's, which replace them when ready.
"""

from __future__ import annotations

import dataclasses
import json

import streamlit as st

from simdist.dashboard.sweep import SweepPoint, sweep_points
from simdist.errors import ScenarioError
from simdist.predict import predict
from simdist.results import Prediction
from simdist.spec.profile import CalibrationProfile
from simdist.spec.scenario import Scenario

MAX_KEPT_SPANS = 500_000  # per cached prediction (about 100 MB); a larger timeline is not kept


@st.cache_resource(max_entries=32, show_spinner=False)
def cached_predict(key: str, _scenario: Scenario, engine: str,
                   _profile: CalibrationProfile | None = None) -> Prediction:
    """One prediction per (scenario hash + name + profile, engine); the Scenario itself is not hashed.

    cache_resource, not cache_data: a Prediction is frozen, and copying one with 50,000 spans
    out of cache_data's pickle on every rerun costs a quarter of a second. The page is a server:
    a timeline of more than MAX_KEPT_SPANS spans is dropped rather than kept in the cache (the
    timeline tab says so; `simdist trace` draws it).
    """
    pred = predict(_scenario, profile=_profile, engine=engine, keep_spans=engine == "des")  # type: ignore[arg-type]
    if len(pred.spans) > MAX_KEPT_SPANS:
        pred = dataclasses.replace(pred, spans=(), extras={**pred.extras, "spans_dropped": len(pred.spans)})
    _ready().add((key, engine))
    return pred


@st.cache_resource(show_spinner=False)
def _ready() -> set[tuple[str, str]]:
    """(key, engine) of the predictions cached_predict has made (some may since be evicted)."""
    return set()


def prediction_key(scenario: Scenario, profile_key: str) -> str:
    """The cache key of a scenario's prediction: its hash (what is simulated), name and profile."""
    return f"{scenario.hash()}:{scenario.name}:{profile_key}"


def is_ready(scenario: Scenario, engine: str, profile_key: str) -> bool:
    """Whether this prediction was made before (then it comes from the cache at once, unless evicted)."""
    return (prediction_key(scenario, profile_key), engine) in _ready()


def closed_form(scenario: Scenario, profile: CalibrationProfile | None, profile_key: str) -> Prediction:
    """The closed form's prediction (milliseconds): what the page shows while the event engine runs."""
    return cached_predict(prediction_key(scenario, profile_key), scenario, "analytic", profile)


def run_predict(scenario: Scenario, engine: str, profile: CalibrationProfile | None,
                profile_key: str) -> tuple[Prediction, str]:
    """The prediction with the chosen engine, and a note; when the discrete-event engine fails
    on this scenario (a bug in it), the closed form's prediction with a note that says so."""
    key = prediction_key(scenario, profile_key)
    if engine == "des":
        try:
            pred = cached_predict(key, scenario, "des", profile)
            if pred.engine != "des":  # past the event engine's work limits (simdist.sim.engine.budget)
                return pred, ("This scenario is too large for the discrete-event engine (more work than "
                              "its limits allow); showing the closed form. The assumptions say why.")
            return pred, ""
        except (ScenarioError, ImportError):  # bad input is shown by field; a broken install loudly
            raise
        except Exception as exc:  # an engine bug must not take the page down; the note shows it
            note = f"The discrete-event engine failed ({type(exc).__name__}: {exc}); showing the analytic engine."
            return cached_predict(key, scenario, "analytic", profile), note
    return cached_predict(key, scenario, "analytic", profile), ""


@st.cache_data(max_entries=128, show_spinner=False)
def cached_sweep(raw_json: str, base_dir: str, sweep: str, values_json: str, profile_key: str,
                 _profile: CalibrationProfile | None) -> list[SweepPoint]:
    """:func:`simdist.dashboard.sweep.sweep_points`, keyed by the scenario dict's JSON."""
    return sweep_points(json.loads(raw_json), base_dir, sweep, json.loads(values_json), _profile)
