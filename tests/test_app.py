"""The Streamlit dashboard (app.py), driven headless with streamlit.testing.v1.AppTest."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, measurement

from simdist.dashboard.text import md_unescape as unmd

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest

from simdist.predict import predict
from simdist.spec.scenario import load_scenario, scenario_from_dict
from simdist.units import fmt_seconds

APP = str(REPO / "app.py")
TIMEOUT = 120


@pytest.fixture
def at(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv("SIMDIST_DB", str(tmp_path / "runs.db"))  # never the user's run store
    app = AppTest.from_file(APP, default_timeout=TIMEOUT)
    app.run()
    assert not app.exception, app.exception
    return app


def metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def expected_step_time(path: Path) -> str:
    sc = load_scenario(path)
    try:
        pred = predict(sc, engine="des", keep_spans=False)
    except Exception:  # a failing DES engine: the app falls back the same way
        pred = predict(sc, engine="analytic", keep_spans=False)
    return fmt_seconds(pred.step_time_s)


def scenario_yaml(at: AppTest) -> dict:
    """The scenario the page shows, parsed from its YAML view (what the download holds)."""
    return yaml.safe_load(at.sidebar.expander[0].code[0].value)


def test_loads_the_default_scenario(at: AppTest) -> None:
    path = REPO / "scenarios" / "gpt3-175b-1024xa100.yaml"
    assert at.sidebar.selectbox(key="src_file").value == path.name
    assert metric(at, "Step time") == expected_step_time(path)
    assert {m.label for m in at.metric} >= {"Step time", "Tokens/s", "MFU", "Peak memory"}
    assert not at.error
    assert at.sidebar.number_input(key="p_tp").value == 8
    assert at.sidebar.number_input(key="p_pp").value == 16
    assert at.sidebar.number_input(key="c_num_nodes").value == 128
    assert any("dp = 1024 GPUs" in unmd(c.value) and "**8**" in unmd(c.value) for c in at.sidebar.caption)
    assert len(at.get("plotly_chart")) >= 3  # breakdown, memory, timeline (or sweep)


def test_downloaded_yaml_is_the_same_scenario(at: AppTest) -> None:
    raw = scenario_yaml(at)
    assert raw["cluster"] == {"preset": "dgx-a100-80gb", "num_nodes": 128}
    assert raw["plan"]["flash_attention"] is False  # fields without a knob are kept from the file
    assert "dp" not in raw["plan"]  # derived
    file_sc = load_scenario(REPO / "scenarios" / "gpt3-175b-1024xa100.yaml")
    assert scenario_from_dict(raw, base_dir=REPO / "scenarios").hash() == file_sc.hash()
    at.sidebar.selectbox(key="c_inter_pick").select("NDR 400 Gb/s").run()
    raw = scenario_yaml(at)
    assert raw["cluster"]["inter_node"] == {"bandwidth": "400 Gb/s"}  # units as strings


def test_loading_another_file_resets_the_knobs(at: AppTest) -> None:
    before = metric(at, "Step time")
    at.sidebar.selectbox(key="src_file").select("llama3-8b-fsdp-8xh100.yaml").run()
    assert not at.exception
    assert at.sidebar.selectbox(key="m_preset").value == "llama3-8b"
    assert at.sidebar.selectbox(key="p_zero").value == 3
    assert at.sidebar.number_input(key="p_tp").value == 1
    assert metric(at, "Step time") == expected_step_time(REPO / "scenarios" / "llama3-8b-fsdp-8xh100.yaml")
    assert metric(at, "Step time") != before


def test_changing_knobs_changes_the_step_time(at: AppTest) -> None:
    before = metric(at, "Step time")
    at.sidebar.number_input(key="p_pp").set_value(8).run()
    assert not at.exception and not at.error
    assert metric(at, "Step time") != before
    assert any("**16**" in unmd(c.value) for c in at.sidebar.caption)  # dp follows: 1024 / (8*8)
    at.sidebar.number_input(key="p_pp").set_value(16).run()
    assert metric(at, "Step time") == before  # back to the file's plan (served from the cache)
    at.sidebar.radio(key="engine").set_value("analytic").run()
    assert not at.exception
    assert any("engine closed form" in unmd(c.value) for c in at.caption)


def test_model_preset_and_gpu(at: AppTest) -> None:
    at.sidebar.selectbox(key="m_preset").select("gpt3-13b").run()
    assert at.sidebar.number_input(key="m_num_layers").value == 40
    assert at.sidebar.number_input(key="m_hidden_size").value == 5120
    assert scenario_yaml(at)["model"] == {"preset": "gpt3-13b"}
    assert not at.error
    at.sidebar.selectbox(key="c_gpu").select("h200").run()
    assert not at.exception
    assert scenario_yaml(at)["cluster"]["gpu"] == "h200"
    badge = next(m.value for m in at.markdown if "-badge[" in m.value)
    assert "of 131 GiB" in badge  # H200: 141 GB = 131 GiB per GPU


def test_out_of_memory_badge(at: AppTest) -> None:
    at.sidebar.number_input(key="p_pp").set_value(2).run()  # 87.5B parameters per GPU pair
    assert not at.exception
    badge = next(m.value for m in at.markdown if "-badge[" in m.value)
    assert badge.startswith(":red-badge[") and "out of memory" in badge
    assert metric(at, "Step time")  # still predicted


def test_invalid_plan_shows_field_named_errors(at: AppTest) -> None:
    at.sidebar.number_input(key="p_tp").set_value(5).run()
    assert not at.exception
    errors = [unmd(e.value) for e in at.error]
    assert "plan.tp: 5 does not divide model.num_attention_heads (96)" in errors
    assert all(e.split(":")[0].startswith("plan.") for e in errors)
    assert not at.metric  # no stale prediction next to the errors
    at.sidebar.number_input(key="p_tp").set_value(8).run()
    assert not at.error and at.metric


def test_bare_number_bandwidth_is_an_error(at: AppTest) -> None:
    at.sidebar.text_input(key="c_inter_bw").input("200").run()
    assert not at.exception
    errors = [unmd(e.value) for e in at.error]
    assert errors and errors[0].startswith("cluster.inter_node.bandwidth:")


def test_hdr_vs_ndr_on_h100(at: AppTest) -> None:
    at.sidebar.selectbox(key="src_file").select("llama3-70b-tp8-pp4-64xh100.yaml").run()
    assert at.sidebar.text_input(key="c_inter_bw").value == "400 Gb/s"
    assert at.sidebar.selectbox(key="c_inter_pick").value == "NDR 400 Gb/s"
    ndr = metric(at, "Step time")
    at.sidebar.selectbox(key="c_inter_pick").select("HDR 200 Gb/s").run()
    assert at.sidebar.text_input(key="c_inter_bw").value == "200 Gb/s"
    assert metric(at, "Step time") != ndr


def test_pin_and_compare(at: AppTest) -> None:
    at.button(key="pin").click().run()
    pinned_step = metric(at, "Step time")
    at.sidebar.selectbox(key="c_gpu").select("h200").run()
    at.sidebar.number_input(key="p_mbs").set_value(2).run()
    assert not at.exception and not at.error
    labels = {m.label: m for m in at.metric}
    assert "Step time (current)" in labels
    assert pinned_step in labels["Step time (current)"].delta  # "-12.3% vs 30.498 s"
    diff = at.dataframe[0].value
    fields = dict(zip(diff["field"], zip(diff["pinned"], diff["current"], strict=True), strict=True))
    assert fields["cluster.gpu"] == ("a100-80gb", "h200")
    assert fields["plan.micro_batch_size"] == ("1", "2")
    assert "plan.tp" not in fields  # only what differs
    at.button(key="unpin").click().run()
    assert "Step time (current)" not in {m.label for m in at.metric}


def test_sweep(at: AppTest) -> None:
    at.selectbox(key="sweep").select("micro-batch size").run()
    assert not at.exception
    at.text_input(key="sweep_values_micro-batch size").input("1, 2, x").run()
    assert any(unmd(e.value).startswith("sweep values:") for e in at.error)
    at.selectbox(key="sweep").select("nodes").run()
    assert not at.exception
    # 1536 sequences do not split over every dp: those nodes are listed, not plotted
    at.text_input(key="sweep_values_nodes").input("64, 128, 80").run()
    assert any(unmd(c.value).startswith("nodes = 80: plan.global_batch_size:") for c in at.caption)


def test_calibration_view_with_a_stored_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from simdist.calibrate.store import RunStore

    db = tmp_path / "runs.db"
    monkeypatch.setenv("SIMDIST_DB", str(db))
    path = REPO / "scenarios" / "llama3-8b-fsdp-8xh100.yaml"
    sc = load_scenario(path)
    measured = measurement(sc.name, sc.hash(), step_time_s=12.0, step_times_s=[11.9, 12.1])
    RunStore(db).add("measurement", measured, scenario_yaml=path.read_text())
    RunStore(db).add("measurement", {"name": "half", "scenario_hash": "x"}, scenario_yaml=path.read_text())
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not at.exception
    table = next(d.value for d in at.dataframe if "measured_s" in d.value.columns)
    assert list(table["name"]) == [sc.name]
    assert table["measured_s"][0] == 12.0
    assert any(unmd(c.value).startswith("skipped half (run 2): measurement.") for c in at.caption)


def test_search_tab_ranks_and_loads_a_plan(at: AppTest) -> None:
    at.sidebar.selectbox(key="src_file").select("llama3-8b-fsdp-8xh100.yaml").run()
    at.number_input(key="search_top").set_value(5).run()
    at.button(key="run_search").click().run()
    assert not at.exception and not at.error
    table = next(d.value for d in at.dataframe if "step_time_s" in d.value.columns)
    assert 1 <= len(table) <= 5
    assert list(table["step_time_s"]) == sorted(table["step_time_s"])
    best = table.iloc[0]
    at.selectbox(key="search_pick").select(1).run()
    at.button(key="use_plan").click().run()
    assert not at.exception and not at.error
    assert at.sidebar.number_input(key="p_tp").value == best["tp"]
    assert at.sidebar.number_input(key="p_mbs").value == best["mbs"]
    assert metric(at, "Step time")


def test_upload_hugging_face_config(at: AppTest) -> None:
    at.sidebar.radio(key="src_kind").set_value("uploaded Hugging Face config.json").run()
    assert not at.exception
    assert metric(at, "Step time")  # the previous knobs stay until a file comes
    content = (REPO / "tests" / "data" / "hf" / "mistral-7b.json").read_bytes()
    at.sidebar.file_uploader(key="upload_2").set_value(("config.json", content, "application/json")).run()
    assert not at.exception and not at.error
    assert at.sidebar.selectbox(key="m_preset").value == "custom"
    assert at.sidebar.number_input(key="m_num_kv_heads").value == 8
    assert at.sidebar.number_input(key="m_seq_length").value == 8192  # capped, and said so
    assert any("set to 8192" in unmd(c.value) for c in at.sidebar.caption)
    model = scenario_yaml(at)["model"]
    assert model["mlp"] == "swiglu" and model["num_layers"] == 32 and "source" not in model
    assert metric(at, "Step time")


def test_upload_scenario_yaml_with_problems(at: AppTest) -> None:
    at.sidebar.radio(key="src_kind").set_value("uploaded scenario (YAML)").run()
    text = (REPO / "scenarios" / "llama3-70b-tp8-pp4-64xh100.yaml").read_text().replace("pp: 4 ", "pp: four ")
    at.sidebar.file_uploader(key="upload_1").set_value(("mine.yaml", text.encode(), "application/x-yaml")).run()
    assert not at.exception
    assert at.sidebar.text_input(key="s_name").value == "llama3-70b-tp8-pp4-64xh100"
    assert at.sidebar.number_input(key="p_tp").value == 8
    assert at.sidebar.number_input(key="p_pp").value == 1  # "four" cannot go in a number box ...
    (box,) = [e for e in at.expander if e.label.startswith("The loaded file has 1 problem")]
    problems = box.markdown  # ... and the file's own problem is listed, naming the field
    assert any("plan.pp: must be a positive whole number, got 'four'" in unmd(m.value) for m in problems)
    at.sidebar.file_uploader(key="upload_1").set_value(("bad.yaml", b"- a list\n", "application/x-yaml")).run()
    assert not at.exception
    assert any(unmd(e.value).startswith("file: bad.yaml could not be read") for e in at.sidebar.error)


@pytest.mark.parametrize("name", ["simdist.sim.engine", "simdist.search", "simdist.calibrate.store",
                                  "simdist.trace.perfetto"])
def test_a_missing_module_fails_loudly(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every part of simdist the page uses is installed with it: a missing one is a broken install,
    an uncaught ImportError (its details in the server's log only: .streamlit/config.toml's
    showErrorDetails = "none", issue 20), never as a friendly "not available yet" note."""
    import streamlit as st

    monkeypatch.setenv("SIMDIST_DB", str(tmp_path / "runs.db"))
    before = set(sys.modules)
    dashboard = [m for m in sys.modules if m.startswith("simdist.dashboard")]
    for module in dashboard:  # importing it again rebinds it on its package: put back afterwards too
        parent, _, child = module.rpartition(".")
        monkeypatch.setattr(sys.modules[parent], child, sys.modules[module], raising=False)
    for module in dashboard:
        monkeypatch.delitem(sys.modules, module)  # imported again by the page, from scratch
    monkeypatch.setitem(sys.modules, name, None)  # importing it raises ImportError
    st.cache_resource.clear()
    try:
        at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
        assert at.exception, "a broken install stops the page"
        assert not any(name in e.message or "Traceback" in e.message for e in at.exception), at.exception
        if name == "simdist.sim.engine":  # the closed form's numbers were drawn before the event engine ran
            assert any("simulating the step" in unmd(i.value) for i in at.info)
        else:
            assert not at.metric
    finally:
        st.cache_resource.clear()
        for module in {m for m in set(sys.modules) - before if m.startswith("simdist.")} - {name}:
            del sys.modules[module]  # first imported by this page, holding its dashboard modules


@pytest.mark.parametrize("path", sorted((REPO / "scenarios").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_scenario_file_loads(path: Path, at: AppTest) -> None:
    """Each file shows a prediction, or (the `local` cluster without a profile) field-named errors."""
    at.sidebar.selectbox(key="src_file").select(path.name).run()
    assert not at.exception, at.exception
    if load_scenario(path).requires_profile:
        assert next(unmd(e.value) for e in at.error).startswith("cluster.preset:")
        assert any("Upload a calibration profile" in i.value for i in at.info)
    else:
        assert not at.error, [unmd(e.value) for e in at.error]
        assert metric(at, "Step time") == expected_step_time(path)
        assert scenario_from_dict(scenario_yaml(at), base_dir=path.parent).hash() == load_scenario(path).hash()


def test_calibration_profile_upload(at: AppTest) -> None:
    from simdist.spec.profile import CalibrationProfile

    profile = CalibrationProfile(device="cpu (test)", peak_flops=1e11, memory_bandwidth_bytes_per_s=1e10)
    at.sidebar.selectbox(key="src_file").select("tiny-3d.yaml").run()
    assert at.error  # the local cluster needs a profile
    upload = at.sidebar.file_uploader(key="profile_upload")
    upload.set_value(("profile.json", json.dumps(profile.to_dict()).encode(), "application/json")).run()
    assert not at.exception and not at.error
    expected = predict(load_scenario(REPO / "scenarios" / "tiny-3d.yaml"), profile=profile, keep_spans=False)
    assert metric(at, "Step time") == fmt_seconds(expected.step_time_s)
    assert any("cpu (test)" in unmd(c.value) for c in at.sidebar.caption)
    at.sidebar.file_uploader(key="profile_upload").set_value(("p.json", b"[1]", "application/json")).run()
    assert not at.exception
    assert any(unmd(e.value).startswith("profile: p.json is not a calibration profile") for e in at.sidebar.error)


def test_a_failing_engine_falls_back_to_analytic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import streamlit as st

    from simdist.sim import engine

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("engine bug")

    monkeypatch.setenv("SIMDIST_DB", str(tmp_path / "runs.db"))
    monkeypatch.setattr(engine, "simulate", boom)
    st.cache_resource.clear()
    try:
        at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
        assert not at.exception and not at.error
        assert any("discrete-event engine failed (RuntimeError: engine bug)" in unmd(w.value) for w in at.warning)
        assert metric(at, "Step time")
    finally:
        st.cache_resource.clear()


def test_uploaded_values_no_knob_can_hold(at: AppTest) -> None:
    """Zero nodes, a negative batch, an unknown schedule: defaults in the knobs, the file's
    problems listed by field, never an exception."""
    raw = {"name": "odd", "model": {"preset": "gpt3-1.3b", "num_layers": -3},
           "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 0},
           "plan": {"tp": 0, "schedule": "pipedream", "global_batch_size": -8, "zero_stage": 7}}
    at.sidebar.radio(key="src_kind").set_value("uploaded scenario (YAML)").run()
    at.sidebar.file_uploader(key="upload_1").set_value(("odd.yaml", yaml.safe_dump(raw).encode(), "text/yaml")).run()
    assert not at.exception
    assert at.sidebar.number_input(key="c_num_nodes").value == 1
    assert at.sidebar.number_input(key="p_tp").value == 1
    assert at.sidebar.selectbox(key="p_schedule").value == "1f1b"
    (box,) = [e for e in at.expander if e.label.startswith("The loaded file has")]
    listed = " ".join(unmd(m.value) for m in box.markdown)
    for field in ("cluster.num_nodes", "plan.tp", "plan.schedule", "plan.global_batch_size", "plan.zero_stage"):
        assert field in listed
