"""The dashboard is a server (issue 20 item 7): the hostile uploads of the issue, driven through
AppTest, read and create no server path, and show a message naming the field, never a
traceback. Files opened are recorded with an audit hook (every ``open`` and ``os.open``);
the folders an attacker aims at are listed before and after."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from simdist.dashboard.text import md_unescape as unmd

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest

APP = str(REPO / "app.py")
TIMEOUT = 120
OPENED: list[str] | None = None  # paths opened while recording


def _audit(event: str, args: tuple) -> None:
    if OPENED is not None and event == "open" and args and isinstance(args[0], str | bytes | os.PathLike):
        OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)


@contextlib.contextmanager
def recording() -> Iterator[list[str]]:
    global OPENED
    OPENED = []
    try:
        yield OPENED
    finally:
        OPENED = None


def listing(*folders: Path) -> set[str]:
    return {str(p) for f in folders if f.exists() for p in f.rglob("*")}


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A server's files an attacker would aim at: a secret JSON, a repository file, the store."""
    secret = tmp_path / "server" / "secret.json"
    secret.parent.mkdir()
    secret.write_text(json.dumps({"model_type": "SECRET-MODEL-TYPE", "hidden_size": 4096, "api_key": "k"}))
    db = tmp_path / "store" / "runs.db"
    monkeypatch.setenv("SIMDIST_DB", str(db))
    return {"secret": secret, "db": db, "repo_hf": REPO / "tests" / "data" / "hf" / "mistral-7b.json",
            "tmp": tmp_path}


def scenario(**refs: str) -> dict:
    d = {"name": "probe", "model": {"preset": "gpt3-1.3b"}, "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 1},
         "plan": {"global_batch_size": 64}}
    if "hf_config" in refs:
        d["model"] = {"hf_config": refs["hf_config"]}
    if "deepspeed_config" in refs:
        d["plan"]["deepspeed_config"] = refs["deepspeed_config"]
    return d


def app() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    assert not at.exception, at.exception
    return at


def upload(at: AppTest, name: str, data: bytes, files: list[tuple[str, bytes]] | None = None) -> AppTest:
    at.sidebar.radio(key="src_kind").set_value("uploaded scenario (YAML)").run()
    if files is not None:
        at.sidebar.file_uploader(key="upload_1_files").set_value(
            [(n, b, "application/json") for n, b in files]).run()
    at.sidebar.file_uploader(key="upload_1").set_value((name, data, "application/x-yaml")).run()
    return at


def texts(at: AppTest) -> list[str]:
    """Every message the page shows (main area and sidebar)."""
    out = []
    for kind in ("error", "warning", "info", "caption", "markdown", "exception"):
        for where in (at, at.sidebar):
            out += [getattr(e, "value", None) or getattr(e, "message", "") for e in getattr(where, kind)]
    return [str(t) for t in out]


def assert_no_traceback(at: AppTest) -> None:
    assert not at.exception, at.exception
    shown = "\n".join(texts(at))
    assert "Traceback" not in shown and 'File "' not in shown


def targets(server: dict[str, Path]) -> dict[str, str]:
    return {"absolute": str(server["secret"]), "dotdot": os.path.relpath(server["secret"], REPO),
            "repository": "tests/data/hf/mistral-7b.json", "device": "/dev/zero", "etc": "/etc/passwd",
            "nul": "a\x00b.json", "home": "~/.bashrc"}


@pytest.mark.parametrize("field", ["hf_config", "deepspeed_config"])
@pytest.mark.parametrize("kind", ["absolute", "dotdot", "repository", "device", "etc", "nul", "home"])
def test_an_uploaded_scenario_cannot_reach_a_server_file(server, field, kind):
    ref = targets(server)[kind]
    before = listing(server["tmp"], REPO)
    at = app()
    with recording() as opened:
        upload(at, "probe.yaml", yaml.safe_dump(scenario(**{field: ref})).encode())
    assert_no_traceback(at)
    bad = {str(server["secret"]), str(server["repo_hf"]), "/dev/zero", "/etc/passwd"}
    assert not bad & {str(Path(p).resolve()) if p.startswith("/") else p for p in opened}, opened
    assert not any("secret" in p or p.endswith("mistral-7b.json") for p in opened), opened
    section = "model" if field == "hf_config" else "plan"
    errors = [unmd(e.value) for e in at.sidebar.error]
    assert any(e.startswith(f"{section}.{field}:") for e in errors), errors
    assert not any("SECRET" in t or "api_key" in t for t in texts(at))
    assert listing(server["tmp"], REPO) == before  # nothing created (no store, no file)
    assert not server["db"].exists()


def test_a_file_uploaded_with_the_scenario_is_read_from_the_upload_only(server):
    hf = (REPO / "tests" / "data" / "hf" / "mistral-7b.json").read_bytes()
    before = listing(server["tmp"], REPO)
    at = app()
    with recording() as opened:
        upload(at, "mine.yaml", yaml.safe_dump(scenario(hf_config="config.json")).encode(),
               files=[("config.json", hf)])
    assert_no_traceback(at)
    assert not at.sidebar.error, [unmd(e.value) for e in at.sidebar.error]
    assert at.sidebar.number_input(key="m_num_kv_heads").value == 8  # mistral-7b's, from the upload
    reads = [p for p in opened if p.endswith("config.json")]
    assert reads and all("simdist-uploads-" in p for p in reads), reads
    assert listing(server["tmp"], REPO) == before


def test_a_name_not_uploaded_or_with_a_folder_is_refused(server):
    at = app()
    upload(at, "mine.yaml", yaml.safe_dump(scenario(hf_config="other.json")).encode(),
           files=[("config.json", b"{}")])
    assert any(unmd(e.value).startswith("model.hf_config: other.json was not uploaded") for e in at.sidebar.error)
    at = app()
    upload(at, "mine.yaml", yaml.safe_dump(scenario(hf_config="config.json")).encode(),
           files=[("../config.json", b"{}")])
    assert_no_traceback(at)
    assert any("is not a plain file name" in unmd(e.value) for e in at.sidebar.error), [unmd(e.value) for e in at.sidebar.error]


ALIAS_BOMB = ("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
              "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
              "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]\n"
              "g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]\nh: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]\n"
              "name: [*h]\n")
HOSTILE_SCENARIOS = {
    "alias bomb": ALIAS_BOMB.encode(),
    "deep nesting": ("name: " + "[" * 100_000 + "]" * 100_000 + "\n").encode(),
    "duplicate keys": b"name: a\nname: b\nmodel: {}\ncluster: {}\nplan: {}\n",
    "not utf-8": "name: caf\xe9\n".encode("latin-1"),
    "a list": b"- a\n- b\n",
    "a number": b"5\n",
    "syntax error": b"name: [unclosed\n",
    "too big": b"#" * (4 * 2**20 + 1),
    "nan and inf": yaml.safe_dump({**scenario(), "cluster": {"preset": "dgx-a100-80gb", "num_nodes": float("nan")},
                                   "plan": {"global_batch_size": float("inf")}}).encode(),
    "wrong types": yaml.safe_dump({"name": ["x"], "model": {"preset": ["tiny"]}, "cluster": "fast",
                                   "plan": {"tp": "two"}}).encode(),
    "sections not mappings": b"name: x\nmodel: [1]\ncluster: 3\nplan: null\n",
    "huge numbers": yaml.safe_dump({**scenario(), "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 2**40},
                                    "plan": {"global_batch_size": 2**40, "ddp_bucket_size": "1 B"}}).encode(),
    "extreme link": yaml.safe_dump({**scenario(), "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 2,
                                                              "inter_node": {"bandwidth": "1e-300 GB/s"}}}).encode(),
}


@pytest.mark.parametrize("kind", sorted(HOSTILE_SCENARIOS))
def test_hostile_scenario_uploads_show_messages_not_tracebacks(server, kind):
    before = listing(server["tmp"], REPO)
    at = app()
    upload(at, "hostile.yaml", HOSTILE_SCENARIOS[kind])
    assert_no_traceback(at)
    shown = [unmd(e.value) for e in at.sidebar.error] + [unmd(e.value) for e in at.error] + [unmd(w.value) for w in at.warning]
    shown += [m.value for e in at.expander if e.label.startswith("The loaded file has") for m in e.markdown]
    assert shown, f"{kind}: no message"
    assert all(":" in s for s in shown), shown  # "field: message"
    assert listing(server["tmp"], REPO) == before


HOSTILE_JSON = {
    "deep": b"[" * 100_000 + b"]" * 100_000,
    "array": b"[1, 2, 3]",
    "nan": b'{"hidden_size": NaN, "num_hidden_layers": Infinity}',
    "not utf-8": '{"model_type": "caf\xe9"}'.encode("latin-1"),
    "architectures 5": b'{"architectures": 5}',
    "too big": b" " * (4 * 2**20 + 1),
    "not json": b"model_type = llama",
}


@pytest.mark.parametrize("kind", sorted(HOSTILE_JSON))
def test_hostile_hugging_face_config_and_profile_uploads(server, kind):
    at = app()
    at.sidebar.radio(key="src_kind").set_value("uploaded Hugging Face config.json").run()
    at.sidebar.file_uploader(key="upload_2").set_value(("config.json", HOSTILE_JSON[kind], "application/json")).run()
    assert_no_traceback(at)
    assert at.sidebar.error, kind
    at.sidebar.file_uploader(key="profile_upload").set_value(("p.json", HOSTILE_JSON[kind], "application/json")).run()
    assert_no_traceback(at)
    assert any(unmd(e.value).startswith("profile: p.json is not a calibration profile") for e in at.sidebar.error)


def test_the_run_store_is_not_editable_and_not_created_from_the_page(server):
    at = app()
    assert not [t for t in at.text_input if t.key == "db_path"]
    assert any("No run store on this server yet" in i.value for i in at.info)
    assert not server["db"].exists()


def test_a_bug_shows_a_message_not_a_traceback(server, monkeypatch):
    import streamlit as st

    from simdist.dashboard import tabs

    def boom(*args, **kwargs):
        raise RuntimeError(f"bug with a server path {REPO}")

    monkeypatch.setattr(tabs, "knob_view", boom)
    st.cache_resource.clear()
    at = app()
    at.sidebar.selectbox(key="src_file").select("llama3-8b-fsdp-8xh100.yaml").run()
    assert_no_traceback(at)
    assert any("Something went wrong" in unmd(e.value) and "RuntimeError" in unmd(e.value) for e in at.error)
    assert not any(str(REPO) in t for t in texts(at))


def test_streamlit_config_hides_errors_limits_uploads_and_does_not_watch_files():
    import tomllib

    cfg = tomllib.loads((REPO / ".streamlit" / "config.toml").read_text(encoding="utf-8"))
    assert cfg["client"]["showErrorDetails"] == "none"  # false would still mean "stacktrace"
    assert 1 <= cfg["server"]["maxUploadSize"] <= 4
    assert cfg["server"]["fileWatcherType"] == "none"
    assert ".venv" in cfg["server"]["folderWatchBlacklist"]


def test_a_sweep_orders_a_bounded_number_of_predictions(server):
    at = app()
    at.text_input(key="sweep_values_nodes").set_value(", ".join(str(n) for n in range(1, 101))).run()
    assert_no_traceback(at)
    assert any(unmd(e.value) == "sweep values: 100 values; a sweep has at most 32" for e in at.error)


def test_a_timeline_too_large_to_keep_is_dropped_with_a_message(server, monkeypatch):
    import streamlit as st

    from simdist.dashboard import cache

    monkeypatch.setattr(cache, "MAX_KEPT_SPANS", 10)
    st.cache_resource.clear()
    try:
        at = app()
        assert_no_traceback(at)
        assert any("more than the page keeps" in i.value for i in at.info), [i.value for i in at.info]
    finally:
        st.cache_resource.clear()
