"""The dashboard's sidebar: where the scenario starts (a bundled file, an uploaded scenario with
the files it names, an uploaded Hugging Face config.json), the knobs, and the calibration profile
upload. Uploads are read like files given on the command line (bounded, UTF-8, duplicate keys and
alias bombs refused), and an uploaded scenario reads only what was uploaded with it
(:mod:`simdist.dashboard.uploads`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import streamlit as st

from simdist import catalog
from simdist.dashboard.knobs import (
    CUSTOM,
    MODEL_KNOBS,
    cluster_knobs,
    hf_base,
    link_label,
    link_presets,
    model_knobs,
)
from simdist.dashboard.text import md_escape, plural
from simdist.dashboard.uploads import (
    forget_others,
    private_folder,
    reference_problems,
    remove,
    shown,
    upload_bytes,
    upload_text,
)
from simdist.errors import Problem, ScenarioError
from simdist.io.text import parse_json, parse_yaml
from simdist.spec.plan import CP_METHODS, MOE_DISPATCHERS, PRECISIONS, RECOMPUTE, SCHEDULES
from simdist.spec.profile import CalibrationProfile, load_profile

SOURCES = ("scenario file", "uploaded scenario (YAML)", "uploaded Hugging Face config.json")
DEFAULT_FILE = "gpt3-175b-1024xa100.yaml"
ss = st.session_state


def load_source(scenario_dir: Path, uploads: Path) -> tuple[dict[str, Any], str, Path]:
    """The scenario dict the knobs start from, an id that changes with it, and its base dir
    (the folder its hf_config / deepspeed_config are read from: the bundled scenarios' folder,
    or the private folder of what was uploaded with it under ``uploads``)."""
    kind = st.sidebar.radio("Start from", SOURCES, key="src_kind")
    if kind == SOURCES[0]:
        names = sorted(p.name for p in scenario_dir.glob("*.yaml"))
        if "src_file" not in ss:
            ss.src_file = DEFAULT_FILE if DEFAULT_FILE in names else names[0]
        name = st.sidebar.selectbox("Scenario file", names, key="src_file")
        raw = parse_yaml((scenario_dir / name).read_text(encoding="utf-8"), name)
        return raw, f"file:{name}", scenario_dir
    upload = st.sidebar.file_uploader(kind, type=["yaml", "yml"] if kind == SOURCES[1] else ["json"],
                                      key=f"upload_{SOURCES.index(kind)}")
    named = []
    if kind == SOURCES[1]:
        named = st.sidebar.file_uploader(
            "Files the scenario names (JSON, optional)", type=["json"], accept_multiple_files=True,
            key="upload_1_files", help="the model.hf_config and plan.deepspeed_config files, named in the "
            "scenario by file name alone; nothing else on the server can be read") or []
    previous = (ss.get("_base") or {}, ss.get("_base_id", ""), Path(ss.get("_base_dir") or scenario_dir))
    if upload is None:
        st.sidebar.caption("Upload a file; until then the knobs keep their values.")
        return previous
    try:
        text = upload_text(upload.name, upload.getvalue())
        files = {f.name: upload_bytes(f.name, f.getvalue(), "files") for f in named}
        upload_id = f"upload:{upload.name}:{hash(text)}:{hash(tuple(sorted((n, hash(b)) for n, b in files.items())))}"
        if upload_id == ss.get("_base_id"):
            return previous
        if kind == SOURCES[1]:
            raw = parse_yaml(text, upload.name)
            if not isinstance(raw, dict):
                raise ScenarioError(Problem("file", "must hold a mapping with name, model, cluster, plan"))
            problems = reference_problems(raw, files)
            if problems:
                raise ScenarioError(problems)
            folder = private_folder(files, uploads)
            forget_others(uploads, folder)
            return raw, upload_id, folder
        cfg = parse_json(text, upload.name, "file")
        if not isinstance(cfg, dict):
            raise ScenarioError(Problem("file", "a config.json holds one JSON object"))
        raw, notes = hf_base(cfg, upload.name)
    except ScenarioError as exc:
        for p in exc.problems:
            st.sidebar.error(md_escape(f"file: {upload.name} could not be read: {p}" if p.field == "file" else str(p)))
        return previous
    for note in notes:
        (st.sidebar.caption if raw else st.sidebar.error)(md_escape(note))
    return (raw, upload_id, private_folder({}, uploads)) if raw else previous


def _on_model_preset() -> None:
    if ss.m_preset != CUSTOM:
        ss.update(model_knobs({"preset": ss.m_preset}, Path(ss.get("_base_dir", "."))))


def _on_cluster_preset() -> None:
    if ss.c_preset != CUSTOM:
        ss.update(cluster_knobs({"preset": ss.c_preset, "num_nodes": ss.c_num_nodes}))


def _on_link_pick(pick_key: str, text_key: str, links: dict[str, str]) -> None:
    if ss[pick_key] in links:
        ss[text_key] = links[ss[pick_key]]


def link_knobs(where: str, pick_key: str, text_key: str, links: dict[str, str]) -> None:
    ss[pick_key] = link_label(ss.get(text_key, ""), links)
    st.sidebar.selectbox(f"{where} link", [*links, CUSTOM], key=pick_key,
                         on_change=_on_link_pick, args=(pick_key, text_key, links))
    st.sidebar.text_input(f"{where} bandwidth (with its unit)", key=text_key,
                          help='e.g. "200 Gb/s" (bits) or "300 GB/s" (bytes), per direction')


def sidebar_knobs() -> None:
    sb = st.sidebar
    sb.text_input("Scenario name", key="s_name")
    sb.subheader("Model")
    sb.selectbox("Model preset", [CUSTOM, *catalog.models()], key="m_preset", on_change=_on_model_preset)
    c1, c2 = sb.columns(2)
    for i, key in enumerate(MODEL_KNOBS):
        (c1 if i % 2 == 0 else c2).number_input(key.replace("_", " "), min_value=0, step=1, key=f"m_{key}")
    sb.selectbox("MLP", ["gelu", "swiglu"], key="m_mlp")

    sb.subheader("Cluster")
    presets = [p for p in catalog.clusters() if p != "local" or ss.c_preset == "local"]
    sb.selectbox("Cluster preset", [CUSTOM, *presets], key="c_preset", on_change=_on_cluster_preset)
    c1, c2 = sb.columns(2)
    c1.number_input("nodes", min_value=1, step=1, key="c_num_nodes")
    c2.number_input("GPUs per node", min_value=1, step=1, key="c_gpus_per_node")
    sb.selectbox("GPU", [CUSTOM, *catalog.gpus()], key="c_gpu",
                 help="custom keeps the GPU mapping of the loaded file")
    link_knobs("Intra-node", "c_intra_pick", "c_intra_bw", link_presets("intra_node"))
    link_knobs("Inter-node", "c_inter_pick", "c_inter_bw", link_presets("inter_node"))
    sb.number_input("NICs per node", min_value=1, step=1, key="c_nics")

    sb.subheader("Plan")
    c1, c2, c3 = sb.columns(3)
    c1.number_input("tp", min_value=1, step=1, key="p_tp")
    c2.number_input("pp", min_value=1, step=1, key="p_pp")
    c3.number_input("cp", min_value=1, step=1, key="p_cp")
    world = ss.c_num_nodes * ss.c_gpus_per_node
    mp = ss.p_tp * ss.p_pp * ss.p_cp
    dp = f"{world // mp}" if world % mp == 0 else "not a whole number"
    sb.caption(f"dp = {world} GPUs / (tp·pp·cp = {mp}) = **{dp}**")
    sb.number_input("virtual pipeline stages", min_value=1, step=1, key="p_vpp")
    sb.selectbox("schedule", SCHEDULES, key="p_schedule")
    sb.selectbox("ZeRO stage", [0, 1, 2, 3], key="p_zero")
    sb.checkbox("sequence parallel", key="p_sp")
    sb.selectbox("recompute", RECOMPUTE, key="p_recompute")
    c1, c2 = sb.columns(2)
    c1.number_input("micro batch", min_value=1, step=1, key="p_mbs")
    c2.number_input("global batch", min_value=1, step=1, key="p_gbs")
    sb.selectbox("precision", PRECISIONS, key="p_precision")
    sb.caption("Experts and context parallelism")  # contract v1.2
    c1, c2 = sb.columns(2)
    c1.number_input("ep", min_value=1, step=1, key="p_ep", help="expert-parallel size (models with experts)")
    c2.number_input("etp", min_value=1, step=1, key="p_etp", help="expert tensor-parallel size")
    sb.selectbox("token dispatcher", MOE_DISPATCHERS, key="p_dispatcher",
                 help="alltoall; allgather; flex = DeepEP/HybridEP (a token crosses to a node once)")
    sb.checkbox("overlap the all-to-all with another micro-batch", key="p_ep_overlap")
    sb.selectbox("context-parallel method", CP_METHODS, key="p_cp_method")
    sb.radio("Engine", ["des", "analytic"], key="engine", horizontal=True,
             help="des: discrete-event simulation with a timeline; analytic: closed form, instant")


def load_profile_upload(uploads: Path) -> tuple[CalibrationProfile | None, str]:
    """The calibration profile uploaded in the sidebar (`simdist calibrate --out`), and its key;
    read with the same checks as ``--profile`` (a bounded JSON object, finite numbers)."""
    upload = st.sidebar.file_uploader("Calibration profile (JSON, optional)", type=["json"], key="profile_upload",
                                      help="from `simdist calibrate --out PROFILE.json`; needed for the local cluster")
    if upload is None:
        return None, ""
    key = f"{upload.name}:{hash(upload.getvalue())}"
    if ss.get("_profile_loaded", ("",))[0] != key:
        folder = None
        try:
            data = upload_bytes(upload.name, upload.getvalue(), "profile")
            folder = private_folder({"profile.json": data}, uploads)
            ss["_profile_loaded"] = (key, load_profile(folder / "profile.json"), [])
        except ScenarioError as exc:
            ss["_profile_loaded"] = (key, None, [shown(p.message, folder) for p in exc.problems])
        finally:
            if folder is not None:
                remove(folder)
    _, profile, problems = ss["_profile_loaded"]
    for message in problems:
        st.sidebar.error(md_escape(f"profile: {upload.name} is not a calibration profile: {message}"))
    if profile is None:
        return None, ""
    st.sidebar.caption(md_escape(f"profile: {profile.device} ({plural(len(profile.fitted_from), 'measurement')})"))
    return profile, key
