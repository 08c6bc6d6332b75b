"""simdist what-if dashboard: `streamlit run app.py`.

A thin page: the sidebar's knobs describe a scenario dict (the scenario-file format),
`scenario_from_dict` validates it, `predict` answers, and the tabs draw it. The parts live in
simdist/dashboard/ (knobs, diffs, sweeps, caching, sidebar, tabs, uploads) and simdist/viz.py
(figures).

The page is a server: an uploaded scenario reads only the files uploaded with it (kept in a
private temporary folder per session), the run store is the server's own (SIMDIST_DB), and an
error is shown as a message, never a traceback (.streamlit/config.toml sets the rest: upload
size, error details, file watching).
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import streamlit as st
import yaml

from simdist.dashboard import sidebar, sweep_tab, tabs
from simdist.dashboard.cache import closed_form, is_ready, run_predict
from simdist.dashboard.knobs import base_problems, knobs_for, scenario_dict
from simdist.dashboard.step_timeline import timeline
from simdist.dashboard.text import md_escape, plural
from simdist.dashboard.uploads import shown
from simdist.errors import ScenarioError
from simdist.spec.scenario import scenario_from_dict

ROOT = Path(__file__).resolve().parent
SCENARIO_DIR = ROOT / "scenarios"
ss = st.session_state
log = logging.getLogger("simdist.dashboard")


def uploads_folder() -> Path:
    """This session's private folder for uploads (removed with the session's state)."""
    if "_uploads" not in ss:
        ss["_uploads"] = tempfile.TemporaryDirectory(prefix="simdist-uploads-")
    return Path(ss["_uploads"].name)


def main() -> None:
    st.set_page_config(page_title="simdist: what if?", layout="wide")
    st.title("simdist: what if?")
    st.sidebar.header("Scenario")
    uploads = uploads_folder()
    base, base_id, base_dir = sidebar.load_source(SCENARIO_DIR, uploads)
    if base_id and ss.get("_base_id") != base_id:  # a new file: every knob starts from it
        ss["_base"], ss["_base_id"], ss["_base_dir"] = base, base_id, str(base_dir)
        ss["_base_problems"] = [shown(p, base_dir) for p in base_problems(base, base_dir)]
        ss.update(knobs_for(base, base_dir))
    base, base_dir = ss["_base"], Path(ss["_base_dir"])
    sidebar.sidebar_knobs()
    profile, ss["_profile_key"] = sidebar.load_profile_upload(uploads)
    raw = scenario_dict(base, base_dir, ss)
    text = yaml.safe_dump(raw, sort_keys=False)
    st.sidebar.download_button("Download scenario (YAML)", text, file_name=f"{raw['name']}.yaml",
                               mime="application/x-yaml", key="dl_yaml")
    with st.sidebar.expander("Scenario YAML"):
        st.code(text, language="yaml")
    if ss.get("_base_problems"):
        with st.expander(f"The loaded file has {plural(len(ss['_base_problems']), 'problem')}; knobs that "
                         "could not hold a value start from the default", expanded=False):
            for problem in ss["_base_problems"]:
                st.markdown(f"- {md_escape(problem)}")
    st.markdown(f"#### {md_escape(raw['name'])}")  # the scenario's full name (the sidebar's box cuts it)
    try:
        scenario = scenario_from_dict(raw, base_dir=base_dir)
        fast = closed_form(scenario, profile, ss["_profile_key"])
    except ScenarioError as exc:
        st.subheader("This scenario is not valid")
        tabs.show_problems(exc, base_dir)
        if any("calibration profile" in p.message for p in exc.problems):
            st.info("Upload a calibration profile in the sidebar (`simdist calibrate --nproc N "
                    "--out PROFILE.json` writes one).")
        return
    results, whatif, calibration, search, sweeps = st.tabs(["Results", "What-if", "Calibration", "Search", "Sweeps"])
    with results:  # the closed form at once; the event engine's numbers replace it when ready
        head = st.empty()
        kind = st.radio("Breakdown as", ["bar", "pie"], horizontal=True, key="breakdown_kind")
        body, rest = st.empty(), st.empty()
    if ss.engine == "des" and not is_ready(scenario, "des", ss["_profile_key"]):
        with head.container():
            tabs.results_tab(scenario, fast, "", pending=True)
        with body.container():
            tabs.results_figures(fast, kind, final=False)
        with rest.container():
            st.caption("The timeline appears when the discrete-event engine is done.")
    try:
        pred, note = run_predict(scenario, ss.engine, profile, ss["_profile_key"])
    except ScenarioError as exc:  # the closed form took it, the event engine did not
        head.empty()
        with body.container():
            tabs.show_problems(exc, base_dir)
        return
    with head.container():
        tabs.results_tab(scenario, pred, note)
    with body.container():
        tabs.results_figures(pred, kind)
    with rest.container():
        timeline(scenario, pred)
        tabs.assumptions(pred)
    with whatif:
        tabs.whatif_tab(raw, base_dir, scenario, pred, profile)
    with calibration:
        tabs.calibration_tab(profile)
    with search:
        tabs.search_tab(scenario, profile)
    with sweeps:
        sweep_tab.sweep_tab()


try:
    main()
except ImportError:  # a broken install: loud (the browser still sees no traceback, see config.toml)
    raise
except Exception as exc:  # a bug must not show a traceback (server paths, code) to whoever uses the page
    log.exception("the dashboard page failed")
    st.error(f"Something went wrong while drawing this page ({type(exc).__name__}); the details are in "
             "the server's log. Change the scenario or reload the page.")
