"""simdist what-if dashboard: `streamlit run app.py`.

A thin page: the sidebar builds a scenario dict (the scenario-file format of CONTRACT.md),
`scenario_from_dict` validates it, `predict` answers, and `simdist.viz` draws. The plan search
(`simdist.search`), the run store (`simdist.calibrate.store`), the discrete-event engine and
the Perfetto trace writer are used when they import; otherwise the page says so.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import json
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import streamlit as st
import yaml

from simdist import catalog, viz
from simdist.errors import Collector, ScenarioError
from simdist.predict import predict
from simdist.results import Prediction
from simdist.spec.model import MODEL_FIELDS, fields_from_hf_config
from simdist.spec.plan import PRECISIONS, RECOMPUTE, SCHEDULES, rank_coord
from simdist.spec.profile import CalibrationProfile
from simdist.spec.scenario import Scenario, scenario_from_dict
from simdist.units import UnitError, fmt_seconds, parse_bandwidth

ROOT = Path(__file__).resolve().parent
SCENARIO_DIR = ROOT / "scenarios"
DEFAULT_FILE = "gpt3-175b-1024xa100.yaml"
CUSTOM = "custom"
SOURCES = ("scenario file", "uploaded scenario (YAML)", "uploaded Hugging Face config.json")

MODEL_KNOBS = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
               "ffn_hidden_size", "vocab_size", "seq_length")
INTER_LINKS = {"EDR 100 Gb/s": "100 Gb/s", "HDR 200 Gb/s": "200 Gb/s",
               "NDR 400 Gb/s": "400 Gb/s", "XDR 800 Gb/s": "800 Gb/s"}
INTRA_LINKS = {"PCIe Gen4 32 GB/s": "32 GB/s", "PCIe Gen5 64 GB/s": "64 GB/s",
               "NVLink2 150 GB/s": "150 GB/s", "NVLink3 300 GB/s": "300 GB/s",
               "NVLink4 450 GB/s": "450 GB/s", "NVLink5 900 GB/s": "900 GB/s"}
CLUSTER_FIELDS = ("num_nodes", "gpus_per_node", "gpu", "intra_node", "inter_node",
                  "in_switch_reduction", "host", "nodes_per_leaf", "spine_oversubscription")
PLAN_DEFAULTS = {"tp": 1, "pp": 1, "cp": 1, "virtual_pipeline_stages": 1, "schedule": "1f1b",
                 "zero_stage": 0, "sequence_parallel": False, "recompute": "none",
                 "micro_batch_size": 1, "global_batch_size": 64, "precision": "bf16"}
PLAN_KNOBS = {"p_tp": "tp", "p_pp": "pp", "p_cp": "cp", "p_vpp": "virtual_pipeline_stages",
              "p_schedule": "schedule", "p_zero": "zero_stage", "p_sp": "sequence_parallel",
              "p_recompute": "recompute", "p_mbs": "micro_batch_size",
              "p_gbs": "global_batch_size", "p_precision": "precision"}

ss = st.session_state
NUMBER_FORMATS = {  # table columns: seconds, fractions and GiB, readable
    "step_time_s": st.column_config.NumberColumn("step time (s)", format="%.3f"),
    "mfu": st.column_config.NumberColumn("MFU", format="percent"),
    "peak_gib": st.column_config.NumberColumn("peak GiB", format="%.1f"),
    "measured_s": st.column_config.NumberColumn("measured (s)", format="%.4g"),
    "predicted_s": st.column_config.NumberColumn("predicted (s)", format="%.4g"),
    "error": st.column_config.NumberColumn("error", format="percent"),
    "spread": st.column_config.NumberColumn("run spread", format="percent"),
}


# --- optional modules -------------------------------------------------------------------------


def optional(name: str) -> ModuleType | None:
    """The module if it imports (search, run store, Perfetto writer land later), else None."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


# --- where the scenario starts ----------------------------------------------------------------


def hf_base(cfg: dict[str, Any], filename: str) -> tuple[dict[str, Any], list[str]]:
    """A scenario dict around a Hugging Face config.json: one DGX H100 node, FSDP."""
    c = Collector("model")
    fields = fields_from_hf_config(cfg, c)
    if c.problems:
        return {}, [str(p) for p in c.problems]
    model = {k: v for k, v in fields.items() if k != "source"}
    notes = []
    if model.get("seq_length", 0) > 8192:
        notes.append(f"seq_length {model['seq_length']} (max_position_embeddings) set to 8192; edit it below")
        model["seq_length"] = 8192
    name = Path(filename).stem if filename != "config.json" else str(model.get("name", "hf-model"))
    plan = {"tp": 1, "pp": 1, "zero_stage": 3, "recompute": "full", "micro_batch_size": 1,
            "global_batch_size": 64, "precision": "bf16"}
    return {"name": name.replace("/", "-"), "model": model,
            "cluster": {"preset": "dgx-h100", "num_nodes": 1}, "plan": plan}, notes


def load_source() -> tuple[dict[str, Any], str, Path]:
    """The scenario dict the knobs start from, an id that changes with it, and its base dir."""
    kind = st.sidebar.radio("Start from", SOURCES, key="src_kind")
    if kind == SOURCES[0]:
        names = sorted(p.name for p in SCENARIO_DIR.glob("*.yaml"))
        if "src_file" not in ss:
            ss.src_file = DEFAULT_FILE if DEFAULT_FILE in names else names[0]
        name = st.sidebar.selectbox("Scenario file", names, key="src_file")
        raw = yaml.safe_load((SCENARIO_DIR / name).read_text(encoding="utf-8"))
        return raw, f"file:{name}", SCENARIO_DIR
    upload = st.sidebar.file_uploader(kind, type=["yaml", "yml"] if kind == SOURCES[1] else ["json"],
                                      key=f"upload_{SOURCES.index(kind)}")
    previous = (ss.get("_base") or {}, ss.get("_base_id", ""), ROOT)
    if upload is None:
        st.sidebar.caption("Upload a file; until then the knobs keep their values.")
        return previous
    text = upload.getvalue().decode("utf-8", errors="replace")
    upload_id = f"upload:{upload.name}:{hash(text)}"
    try:
        if kind == SOURCES[1]:
            raw = yaml.safe_load(text)
            if not isinstance(raw, dict):
                raise ValueError("the file must hold a mapping with name, model, cluster, plan")
            return raw, upload_id, ROOT
        cfg = json.loads(text)
        if not isinstance(cfg, dict):
            raise ValueError("a config.json holds one JSON object")
        raw, notes = hf_base(cfg, upload.name)
    except (yaml.YAMLError, json.JSONDecodeError, ValueError) as exc:
        st.sidebar.error(f"file: {upload.name} could not be read: {exc}")
        return previous
    for note in notes:
        (st.sidebar.caption if raw else st.sidebar.error)(note)
    return (raw, upload_id, ROOT) if raw else previous


def base_problems(raw: dict[str, Any], base_dir: Path) -> list[str]:
    try:
        scenario_from_dict(raw, base_dir=base_dir)
    except ScenarioError as exc:
        return [str(p) for p in exc.problems]
    return []


# --- knob defaults from a scenario dict -------------------------------------------------------


def model_reference(section: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """Model fields a section resolves to before its explicit knob fields (preset, hf_config)."""
    ref: dict[str, Any] = {}
    preset = section.get("preset")
    if preset in catalog.models():
        ref.update(catalog.models()[preset])
    if section.get("hf_config"):
        try:
            cfg = json.loads((base_dir / str(section["hf_config"])).read_text(encoding="utf-8"))
            ref.update(fields_from_hf_config(cfg, Collector("model")))
        except (OSError, json.JSONDecodeError):
            pass
    if "num_attention_heads" in ref:
        ref.setdefault("num_kv_heads", ref["num_attention_heads"])
    if "hidden_size" in ref:
        ref.setdefault("ffn_hidden_size", 4 * ref["hidden_size"])
    return ref


def model_values(section: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    vals = {**model_reference(section, base_dir), **section}
    vals.setdefault("num_kv_heads", vals.get("num_attention_heads", 1))
    vals.setdefault("ffn_hidden_size", 4 * int(vals.get("hidden_size", 1)))
    return vals


def cluster_reference(preset: str) -> dict[str, Any]:
    return copy.deepcopy(catalog.clusters().get(preset, {}))


def cluster_values(section: dict[str, Any]) -> dict[str, Any]:
    ref = cluster_reference(str(section.get("preset", "")))
    vals = {**ref, **{k: v for k, v in section.items() if k not in ("intra_node", "inter_node")}}
    for link in ("intra_node", "inter_node"):
        vals[link] = {**ref.get(link, {}), **(section.get(link) or {})}
    return vals


def coerce(value: Any, default: Any, options: Sequence[Any] | None = None, minimum: int = 1) -> Any:
    """A file's value if a knob can hold it, else the default (the file's problems are
    reported separately, naming the field)."""
    if options is not None:
        return value if value in options else default
    if isinstance(default, bool):
        return value if isinstance(value, bool) else default
    if isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= minimum
        return value if ok else default
    return default if value is None else str(value)


def set_model_knobs(section: dict[str, Any], base_dir: Path) -> None:
    vals = model_values(section, base_dir)
    preset = section.get("preset")
    ss.m_preset = preset if preset in catalog.models() else CUSTOM
    for key in MODEL_KNOBS:
        ss[f"m_{key}"] = coerce(vals.get(key), 1, minimum=0)
    ss.m_mlp = coerce(vals.get("mlp"), "gelu", ("gelu", "swiglu"))


def set_cluster_knobs(section: dict[str, Any]) -> None:
    vals = cluster_values(section)
    preset = section.get("preset")
    ss.c_preset = preset if preset in catalog.clusters() else CUSTOM
    ss.c_num_nodes = coerce(vals.get("num_nodes"), 1)
    ss.c_gpus_per_node = coerce(vals.get("gpus_per_node"), 8)
    gpu = vals.get("gpu")
    ss.c_gpu = gpu if isinstance(gpu, str) and gpu in catalog.gpus() else CUSTOM
    ss.c_intra_bw = coerce(vals["intra_node"].get("bandwidth"), "")
    ss.c_inter_bw = coerce(vals["inter_node"].get("bandwidth"), "")
    ss.c_nics = coerce(vals["inter_node"].get("nics_per_node"), 1)


def set_knobs(raw: dict[str, Any], base_dir: Path) -> None:
    """Point every knob at the values of a newly loaded scenario dict."""
    ss.s_name = str(raw.get("name", "what-if"))
    set_model_knobs(raw.get("model") or {}, base_dir)
    set_cluster_knobs(raw.get("cluster") or {})
    given = raw.get("plan") or {}
    choices = {"schedule": SCHEDULES, "recompute": RECOMPUTE, "precision": PRECISIONS,
               "zero_stage": (0, 1, 2, 3)}
    plan = {f: coerce(given.get(f, d), d, choices.get(f)) for f, d in PLAN_DEFAULTS.items()}
    if plan["virtual_pipeline_stages"] > 1 and "schedule" not in given:
        plan["schedule"] = "interleaved-1f1b"
    for key, field in PLAN_KNOBS.items():
        ss[key] = plan[field]


def on_model_preset() -> None:
    if ss.m_preset != CUSTOM:
        set_model_knobs({"preset": ss.m_preset}, ROOT)


def on_cluster_preset() -> None:
    if ss.c_preset != CUSTOM:
        set_cluster_knobs({"preset": ss.c_preset, "num_nodes": ss.c_num_nodes})


def on_link_pick(pick_key: str, text_key: str, links: dict[str, str]) -> None:
    if ss[pick_key] in links:
        ss[text_key] = links[ss[pick_key]]


def link_label(text: str, links: dict[str, str]) -> str:
    try:
        bw = parse_bandwidth(text)
    except UnitError:
        return CUSTOM
    return next((label for label, v in links.items() if parse_bandwidth(v) == bw), CUSTOM)


# --- the sidebar ------------------------------------------------------------------------------


def link_knobs(where: str, pick_key: str, text_key: str, links: dict[str, str]) -> None:
    ss[pick_key] = link_label(ss.get(text_key, ""), links)
    st.sidebar.selectbox(f"{where} link", [*links, CUSTOM], key=pick_key,
                         on_change=on_link_pick, args=(pick_key, text_key, links))
    st.sidebar.text_input(f"{where} bandwidth (with its unit)", key=text_key,
                          help='e.g. "200 Gb/s" (bits) or "300 GB/s" (bytes), per direction')


def sidebar_knobs() -> None:
    sb = st.sidebar
    sb.text_input("Scenario name", key="s_name")
    sb.subheader("Model")
    sb.selectbox("Model preset", [CUSTOM, *catalog.models()], key="m_preset", on_change=on_model_preset)
    c1, c2 = sb.columns(2)
    for i, key in enumerate(MODEL_KNOBS):
        (c1 if i % 2 == 0 else c2).number_input(key.replace("_", " "), min_value=0, step=1, key=f"m_{key}")
    sb.selectbox("MLP", ["gelu", "swiglu"], key="m_mlp")

    sb.subheader("Cluster")
    presets = [p for p in catalog.clusters() if p != "local" or ss.c_preset == "local"]
    sb.selectbox("Cluster preset", [CUSTOM, *presets], key="c_preset", on_change=on_cluster_preset)
    c1, c2 = sb.columns(2)
    c1.number_input("nodes", min_value=1, step=1, key="c_num_nodes")
    c2.number_input("GPUs per node", min_value=1, step=1, key="c_gpus_per_node")
    sb.selectbox("GPU", [CUSTOM, *catalog.gpus()], key="c_gpu",
                 help="custom keeps the GPU mapping of the loaded file")
    link_knobs("Intra-node", "c_intra_pick", "c_intra_bw", INTRA_LINKS)
    link_knobs("Inter-node", "c_inter_pick", "c_inter_bw", INTER_LINKS)
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
    sb.radio("Engine", ["des", "analytic"], key="engine", horizontal=True,
             help="des: discrete-event simulation with a timeline; analytic: closed form, instant")


def load_profile_upload() -> tuple[CalibrationProfile | None, str]:
    """The calibration profile uploaded in the sidebar (`simdist calibrate --out`), and its key."""
    upload = st.sidebar.file_uploader("Calibration profile (JSON, optional)", type=["json"], key="profile_upload",
                                      help="from `simdist calibrate --out PROFILE.json`; needed for the local cluster")
    if upload is None:
        return None, ""
    try:
        data = json.loads(upload.getvalue().decode("utf-8", errors="replace"))
        if not isinstance(data, dict):
            raise TypeError("not a JSON object")
        profile = CalibrationProfile.from_dict(data)
    except ScenarioError as exc:
        for problem in exc.problems:
            st.sidebar.error(str(problem))
        return None, ""
    except (json.JSONDecodeError, TypeError) as exc:
        st.sidebar.error(f"profile: {upload.name} is not a calibration profile: {exc}")
        return None, ""
    st.sidebar.caption(f"profile: {profile.device} ({len(profile.fitted_from)} measurements)")
    return profile, f"{upload.name}:{hash(upload.getvalue())}"


# --- knobs -> scenario dict -------------------------------------------------------------------


def _same_bandwidth(a: Any, b: Any) -> bool:
    try:
        return parse_bandwidth(a) == parse_bandwidth(b)
    except UnitError:
        return False


def build_scenario_dict(base: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """The scenario dict (file format, units as strings) of the knobs; unshown fields of the
    loaded file are kept, fields equal to the preset's are left out."""
    raw: dict[str, Any] = {"name": ss.s_name or "what-if"}
    if base.get("description"):
        raw["description"] = base["description"]

    bm = base.get("model") or {}
    same = ss.m_preset == (bm.get("preset") if bm.get("preset") in catalog.models() else CUSTOM)
    if same:
        model = copy.deepcopy(bm)
    elif ss.m_preset == CUSTOM:  # every field of what was loaded, explicit
        model = {k: v for k, v in model_values(bm, base_dir).items() if k in MODEL_FIELDS and k != "source"}
    else:
        model = {"preset": ss.m_preset}
    ref = model_reference(model, base_dir)
    for key in MODEL_KNOBS:
        model.pop(key, None)
        if ss[f"m_{key}"] != ref.get(key):
            model[key] = ss[f"m_{key}"]
    model.pop("mlp", None)
    if ss.m_mlp != ref.get("mlp", "gelu"):
        model["mlp"] = ss.m_mlp
    raw["model"] = model

    bc = base.get("cluster") or {}
    same = ss.c_preset == (bc.get("preset") if bc.get("preset") in catalog.clusters() else CUSTOM)
    if same:
        cluster = copy.deepcopy(bc)
    elif ss.c_preset == CUSTOM:  # every field of what was loaded, explicit
        cluster = {k: v for k, v in cluster_values(bc).items() if k in CLUSTER_FIELDS}
    else:
        cluster = {"preset": ss.c_preset}
    ref = cluster_reference(ss.c_preset)
    cluster["num_nodes"] = ss.c_num_nodes
    cluster.pop("gpus_per_node", None)
    if ss.c_gpus_per_node != ref.get("gpus_per_node"):
        cluster["gpus_per_node"] = ss.c_gpus_per_node
    if ss.c_gpu != CUSTOM:
        cluster.pop("gpu", None)
        if ss.c_gpu != ref.get("gpu"):
            cluster["gpu"] = ss.c_gpu
    for link, value in (("intra_node", ss.c_intra_bw), ("inter_node", ss.c_inter_bw)):
        section = dict(cluster.get(link) or {})
        section.pop("bandwidth", None)
        if not _same_bandwidth(value, ref.get(link, {}).get("bandwidth")):
            section["bandwidth"] = value
        if link == "inter_node":
            section.pop("nics_per_node", None)
            if ss.c_nics != ref.get(link, {}).get("nics_per_node"):
                section["nics_per_node"] = ss.c_nics
        cluster.pop(link, None)
        if section:
            cluster[link] = section
    raw["cluster"] = cluster

    plan = copy.deepcopy(base.get("plan") or {})
    plan.pop("dp", None)  # derived from the world size, shown in the sidebar
    for key, field in PLAN_KNOBS.items():
        plan[field] = ss[key]
    raw["plan"] = plan
    if base.get("reliability") is not None:
        raw["reliability"] = copy.deepcopy(base["reliability"])
    return raw


def knob_view(raw: dict[str, Any], scenario: Scenario) -> dict[str, Any]:
    """Flat, resolved, readable view of a scenario for the comparison table."""
    view = viz.flatten(raw)
    view.update({f"model.{k}": ss[f"m_{k}"] for k in MODEL_KNOBS})
    view.update({"model.mlp": ss.m_mlp, "cluster.gpu": scenario.cluster.gpu.name,
                 "cluster.gpus_per_node": ss.c_gpus_per_node,
                 "cluster.intra_node.bandwidth": ss.c_intra_bw,
                 "cluster.inter_node.bandwidth": ss.c_inter_bw,
                 "cluster.inter_node.nics_per_node": ss.c_nics, "plan.dp": scenario.plan.dp,
                 "world_size": scenario.world_size})
    view.pop("name", None)
    return view


# --- predictions (cached) ---------------------------------------------------------------------


@st.cache_resource(max_entries=64, show_spinner=False)
def cached_predict(key: str, _scenario: Scenario, engine: str,
                   _profile: CalibrationProfile | None = None) -> Prediction:
    """One prediction per (scenario hash + name, engine); the Scenario itself is not hashed.

    cache_resource, not cache_data: a Prediction is frozen, and copying one with 50,000 spans
    out of cache_data's pickle on every rerun costs a quarter of a second.
    """
    return predict(_scenario, profile=_profile, engine=engine, keep_spans=engine == "des")  # type: ignore[arg-type]


def run_predict(scenario: Scenario, engine: str, profile: CalibrationProfile | None,
                profile_key: str) -> tuple[Prediction, str]:
    """The prediction with the chosen engine; the analytic one when the DES cannot run."""
    key = f"{scenario.hash()}:{scenario.name}:{profile_key}"
    if engine == "des":
        try:
            return cached_predict(key, scenario, "des", profile), ""
        except ImportError:
            note = ("The discrete-event engine is not available yet: showing the analytic engine "
                    "(no timeline).")
            return cached_predict(key, scenario, "analytic", profile), note
        except ScenarioError:
            raise
        except Exception as exc:  # an engine bug must not take the page down
            note = f"The discrete-event engine failed ({type(exc).__name__}: {exc}); showing the analytic engine."
            return cached_predict(key, scenario, "analytic", profile), note
    return cached_predict(key, scenario, "analytic", profile), ""


@st.cache_data(max_entries=128, show_spinner=False)
def cached_sweep(raw_json: str, base_dir: str, sweep: str, values_json: str, profile_key: str,
                 _profile: CalibrationProfile | None) -> list[viz.SweepPoint]:
    raw, values = json.loads(raw_json), json.loads(values_json)
    points = []
    for value, variant in viz.sweep_variants(raw, sweep, values):
        label = str(value)
        try:
            x = viz.sweep_x(sweep, value)
            sc = scenario_from_dict(variant, base_dir=base_dir)
            p = predict(sc, profile=_profile, engine="analytic", keep_spans=False)
        except ScenarioError as exc:
            points.append(viz.SweepPoint(x=0.0, label=label, problem=str(exc.problems[0])))
            continue
        except UnitError as exc:
            points.append(viz.SweepPoint(x=0.0, label=label, problem=str(exc)))
            continue
        points.append(viz.SweepPoint(x=x, label=label, step_time_s=p.step_time_s, mfu=p.mfu,
                                     peak_gib=p.peak_gib, fits=p.fits))
    return points


# --- page sections ----------------------------------------------------------------------------


def show_problems(exc: ScenarioError) -> None:
    for problem in exc.problems:
        st.error(str(problem))


def results_tab(scenario: Scenario, pred: Prediction, note: str) -> None:
    c1, c2, c3, c4 = st.columns(4)
    c1.metric("Step time", fmt_seconds(pred.step_time_s))
    c2.metric("Tokens/s", f"{pred.tokens_per_s:,.0f}")
    c3.metric("MFU", f"{pred.mfu:.1%}", help=f"{pred.model_tflops_per_gpu:.0f} model TFLOP/s per GPU")
    c4.metric("Peak memory", f"{pred.peak_gib:.1f} GiB", help=f"of {pred.capacity_gib:.0f} GiB per GPU")
    if pred.fits:
        st.badge(f"fits: {pred.peak_gib:.1f} of {pred.capacity_gib:.0f} GiB", icon=":material/check:", color="green")
    else:
        st.badge(f"out of memory: {pred.peak_gib:.1f} of {pred.capacity_gib:.0f} GiB", icon=":material/error:", color="red")
    st.caption(f"{scenario.world_size} GPUs · tp {scenario.plan.tp} · pp {scenario.plan.pp} · "
               f"dp {scenario.plan.dp} · {scenario.plan.num_microbatches} micro-batches per pipeline "
               f"· bubble {pred.bubble_fraction:.1%} · engine {pred.engine}")
    if note:
        st.warning(note)
    c1, c2 = st.columns(2)
    kind = c1.radio("Breakdown as", ["bar", "pie"], horizontal=True, key="breakdown_kind")
    c1.plotly_chart(viz.breakdown_figure(pred, kind), key="fig_breakdown")
    c2.plotly_chart(viz.memory_figure(pred), key="fig_memory")
    timeline(scenario, pred)
    with st.expander("Assumptions"):
        for line in pred.assumptions:
            st.markdown(f"- {line}")


def timeline(scenario: Scenario, pred: Prediction) -> None:
    st.subheader("Pipeline timeline")
    if not pred.spans:
        st.info("The timeline comes from the discrete-event engine's spans; this prediction has "
                "none (engine: analytic).")
        return
    plan = scenario.plan
    n = 1
    if plan.num_microbatches > 1:
        n = st.slider("micro-batches shown", 1, min(64, plan.num_microbatches),
                      min(8, plan.num_microbatches), key="timeline_mbs")
    reps = [s * plan.cp * plan.tp for s in range(plan.pp)]  # (dp 0, stage s, cp 0, tp 0)
    spans, left_out = viz.select_spans(pred.spans, ranks=reps, max_microbatches=n)
    labels = {}
    for r in {s.rank for s in spans}:
        c = rank_coord(r, plan) if 0 <= r < scenario.world_size else None
        labels[r] = f"stage {c.pp} (rank {r})" if c else f"rank {r}"
    st.plotly_chart(viz.timeline_figure(spans, labels), key="fig_timeline")
    if left_out:
        st.caption(f"Showing {left_out}.")
    perfetto = optional("simdist.trace.perfetto")
    if perfetto is not None:
        def trace_json() -> str:  # built only when the button is pressed
            data = perfetto.chrome_trace(pred.spans, stage_of=lambda r: rank_coord(r, plan).pp,
                                         metadata={"scenario": scenario.name, "engine": pred.engine})
            return json.dumps(data)

        st.download_button("Download Perfetto trace", trace_json, file_name=f"{scenario.name}.trace.json",
                           mime="application/json", key="dl_trace",
                           help="every simulated span; open it in https://ui.perfetto.dev")


def whatif_tab(raw: dict[str, Any], base_dir: Path, scenario: Scenario, pred: Prediction,
               profile: CalibrationProfile | None) -> None:
    view = knob_view(raw, scenario)
    c1, c2 = st.columns([1, 4])
    if c1.button("Pin this plan", key="pin", type="primary"):
        ss.pinned = {"name": scenario.name, "view": view, "pred": dataclasses.replace(pred, spans=())}
    if "pinned" in ss and c2.button("Unpin", key="unpin"):
        del ss.pinned
    if "pinned" not in ss:
        st.info("Pin the current plan, then change the knobs in the sidebar to compare.")
    else:
        compare(ss.pinned, view, pred)
    st.subheader("Sweep (analytic engine)")
    c1, c2 = st.columns([1, 2])
    sweep = c1.selectbox("vary", list(viz.SWEEPS), key="sweep")
    current = {"nodes": ss.c_num_nodes, "micro-batch size": ss.p_mbs}.get(sweep)
    defaults = viz.default_sweep_values(sweep, current)
    text = c2.text_input("values (comma-separated)", ", ".join(map(str, defaults)), key=f"sweep_values_{sweep}")
    try:
        values = viz.parse_values(text, sweep)
    except ValueError as exc:
        st.error(f"sweep values: {exc}")
        return
    points = cached_sweep(json.dumps(raw, sort_keys=True), str(base_dir), sweep, json.dumps(values),
                          ss["_profile_key"], profile)
    st.plotly_chart(viz.sweep_figure(points, sweep, log_x=True), key="fig_sweep")
    for p in points:
        if p.problem:
            st.caption(f"{sweep} = {p.label}: {p.problem}")


def compare(pinned: dict[str, Any], view: dict[str, Any], pred: Prediction) -> None:
    a: Prediction = pinned["pred"]
    deltas = viz.metric_deltas(a, pred)
    st.markdown(f"**Pinned** `{pinned['name']}` vs **current**")

    def color(change: float, lower_is_better: bool) -> Any:
        return "off" if abs(change) < 1e-9 else "inverse" if lower_is_better else "normal"

    c = st.columns(4)
    st_a, st_b, st_d = deltas["step_time_s"]
    c[0].metric("Step time (current)", fmt_seconds(st_b), f"{st_d:+.1%} vs {fmt_seconds(st_a)}",
                delta_color=color(st_d, True))
    tk_a, tk_b, tk_d = deltas["tokens_per_s"]
    c[1].metric("Tokens/s (current)", f"{tk_b:,.0f}", f"{tk_d:+.1%} vs {tk_a:,.0f}", delta_color=color(tk_d, False))
    mf_a, mf_b, _ = deltas["mfu"]
    c[2].metric("MFU (current)", f"{mf_b:.1%}", f"{100 * (mf_b - mf_a):+.1f} pts vs {mf_a:.1%}",
                delta_color=color(mf_b - mf_a, False))
    pk_a, pk_b, _ = deltas["peak_gib"]
    c[3].metric("Peak memory (current)", f"{pk_b:.1f} GiB", f"{pk_b - pk_a:+.1f} GiB vs {pk_a:.1f}",
                delta_color=color(pk_b - pk_a, True))
    diffs = viz.diff_fields(pinned["view"], view)
    if diffs:
        st.dataframe([{"field": f, "pinned": str(x), "current": str(y)} for f, x, y in diffs],
                     hide_index=True, key="diff_table")
    else:
        st.caption("The current plan is the pinned one.")
    st.plotly_chart(viz.compare_figure(a, pred), key="fig_compare")


def calibration_tab(profile: CalibrationProfile | None) -> None:
    store = optional("simdist.calibrate.store")
    comparer = optional("simdist.calibrate.compare")
    if store is None or comparer is None:
        st.info("The run store is not available yet (simdist.calibrate.store): stored runs will "
                "show here, predicted vs measured.")
        return
    db = st.text_input("Run store (SQLite file; empty: the default store)", "", key="db_path")
    st.caption("Predictions use the calibration profile uploaded in the sidebar, if any.")
    try:
        runs_store = store.RunStore(db or None)
        measurements = runs_store.runs("measurement")
    except ScenarioError as exc:
        show_problems(exc)
        return
    except Exception as exc:  # a missing or broken file, shown in the page
        st.warning(f"Could not read the run store: {type(exc).__name__}: {exc}")
        return
    latest = {r.scenario_hash: r for r in measurements if r.scenario_yaml}  # newest per scenario
    comparisons, skipped = [], []
    for r in latest.values():
        try:
            comparisons.append(comparer.compare_one(r.payload, r.scenario_yaml, profile))
        except ScenarioError as exc:
            skipped.append(f"{r.name}: {exc.problems[0]}")
    st.caption(f"{runs_store.path}: {len(measurements)} measurement(s) of {len(latest)} scenario(s)")
    rows = viz.calibration_rows(comparisons)
    if rows:
        st.plotly_chart(viz.calibration_figure(rows), key="fig_calibration")
        st.dataframe(rows, hide_index=True, key="calibration_table", column_config=NUMBER_FORMATS)
    else:
        st.info("No stored measurement yet: `simdist run FILE --nproc N` stores one.")
    for line in skipped:
        st.caption(f"skipped {line}")


def use_plan(fields: dict[str, Any]) -> None:
    """Load a searched plan into the sidebar's plan knobs."""
    for key, field in PLAN_KNOBS.items():
        if field in fields:
            ss[key] = fields[field]


def search_tab(scenario: Scenario, profile: CalibrationProfile | None) -> None:
    search = optional("simdist.search")
    if search is None or not hasattr(search, "Constraints"):
        st.info("Plan search is not available yet (simdist.search): the ranked plans and their "
                "step time vs memory will show here.")
        return
    st.caption("Keeps the model, the cluster, the global batch and the precision; searches tp, pp, "
               "dp, cp, virtual stages, schedule, ZeRO stage, sequence parallel, recompute and "
               "micro-batch size.")
    c1, c2, c3 = st.columns([1, 2, 2])
    top = int(c1.number_input("top plans", 1, 200, 10, key="search_top"))
    engine = c2.selectbox("rank with", ["analytic", "auto"], key="search_engine",
                          format_func=lambda e: {"analytic": "closed form (seconds)",
                                                 "auto": "closed form, then the DES for the top"}[e])
    if c3.button("Search plans", key="run_search", type="primary"):
        bar = st.progress(0.0, "searching...")
        shown = [0.0]

        def progress(stage: str, done: int, total: int) -> None:
            if time.monotonic() - shown[0] > 0.25 or done == total:  # a few updates a second
                shown[0] = time.monotonic()
                bar.progress(min(1.0, done / max(total, 1)), f"{stage}: {done:,}/{total:,}")

        try:
            result = search.search(scenario, search.Constraints(top=top, engine=engine), progress=progress,
                                   profile=profile)
        except ScenarioError as exc:
            show_problems(exc)
            return
        except Exception as exc:  # the search's own failure, shown in the page
            st.error(f"search failed: {type(exc).__name__}: {exc}")
            return
        finally:
            bar.empty()
        ss.search_result = (scenario.hash(), result)
    if "search_result" not in ss:
        return
    key, result = ss.search_result
    if key != scenario.hash():
        st.caption("These plans were searched for an earlier scenario; search again to update.")
    d = result.to_dict()
    st.caption(f"{d['evaluated']:,} plans evaluated, {d['feasible']:,} fit, in {d['seconds']:.1f} s; "
               f"top ranked by the {d.get('engine', 'analytic')} engine")
    for note in d.get("notes", []):
        st.caption(note)
    rows = viz.search_rows(d)
    if not rows:
        st.warning("No plan fits in memory.")
        return
    st.dataframe(rows, hide_index=True, key="search_table", column_config=NUMBER_FORMATS)
    baseline = viz.search_rows([d["baseline"]])[0] if d.get("baseline") else None
    st.plotly_chart(viz.search_figure(rows, d.get("capacity_gib"), baseline), key="fig_search")
    c1, c2 = st.columns([1, 3])
    pick = int(c1.selectbox("plan", [r["rank"] for r in rows], key="search_pick"))
    c2.button("Use this plan in the sidebar", key="use_plan", on_click=use_plan,
              args=(d["plans"][pick - 1]["plan"],))


# --- the page ---------------------------------------------------------------------------------


def main() -> None:
    st.set_page_config(page_title="simdist: what if?", layout="wide")
    st.title("simdist: what if?")
    st.sidebar.header("Scenario")
    base, base_id, base_dir = load_source()
    if base_id and ss.get("_base_id") != base_id:
        ss["_base"], ss["_base_id"], ss["_base_dir"] = base, base_id, str(base_dir)
        ss["_base_problems"] = base_problems(base, base_dir)
        set_knobs(base, base_dir)
    base, base_dir = ss["_base"], Path(ss["_base_dir"])
    sidebar_knobs()
    profile, ss["_profile_key"] = load_profile_upload()
    raw = build_scenario_dict(base, base_dir)
    text = yaml.safe_dump(raw, sort_keys=False)
    st.sidebar.download_button("Download scenario (YAML)", text, file_name=f"{raw['name']}.yaml",
                               mime="application/x-yaml", key="dl_yaml")
    with st.sidebar.expander("Scenario YAML"):
        st.code(text, language="yaml")
    if ss.get("_base_problems"):
        with st.expander(f"The loaded file has {len(ss['_base_problems'])} problem(s); knobs that "
                         "could not hold a value start from the default", expanded=False):
            for problem in ss["_base_problems"]:
                st.markdown(f"- `{problem}`")
    try:
        scenario = scenario_from_dict(raw, base_dir=base_dir)
        pred, note = run_predict(scenario, ss.engine, profile, ss["_profile_key"])
    except ScenarioError as exc:
        st.subheader("This scenario is not valid")
        show_problems(exc)
        if any("calibration profile" in p.message for p in exc.problems):
            st.info("Upload a calibration profile in the sidebar (`simdist calibrate --nproc N "
                    "--out PROFILE.json` writes one).")
        return
    tabs = st.tabs(["Results", "What-if", "Calibration", "Search"])
    with tabs[0]:
        results_tab(scenario, pred, note)
    with tabs[1]:
        whatif_tab(raw, base_dir, scenario, pred, profile)
    with tabs[2]:
        calibration_tab(profile)
    with tabs[3]:
        search_tab(scenario, profile)


main()
