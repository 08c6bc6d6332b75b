"""The dashboard's knobs as plain data: which knob holds which scenario field, the knob values a
scenario dict starts them at, and the scenario dict (the scenario-file format, units as text)
the knobs describe. Pure functions of mappings (Streamlit's session state is one), no Streamlit.

Knob keys: ``s_name``; ``m_preset``, ``m_<field>`` for MODEL_KNOBS, ``m_mlp``; ``c_preset``,
``c_num_nodes``, ``c_gpus_per_node``, ``c_gpu``, ``c_intra_bw``, ``c_inter_bw``, ``c_nics``;
the plan's ``p_*`` keys of PLAN_KNOBS.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from simdist import catalog
from simdist.dashboard.diff import flatten
from simdist.dashboard.uploads import confined
from simdist.errors import Collector, ScenarioError
from simdist.io.hf import fields_from_hf_config
from simdist.spec.files import read_json_object
from simdist.spec.model import MODEL_FIELDS
from simdist.spec.plan import CP_METHODS, MOE_DISPATCHERS, PRECISIONS, RECOMPUTE, SCHEDULES
from simdist.spec.scenario import Scenario, scenario_from_dict
from simdist.units import UnitError, parse_bandwidth

CUSTOM = "custom"
MODEL_KNOBS = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
               "ffn_hidden_size", "vocab_size", "seq_length")
CLUSTER_FIELDS = ("num_nodes", "gpus_per_node", "gpu", "intra_node", "inter_node",
                  "in_switch_reduction", "host", "nodes_per_leaf", "spine_oversubscription")
PLAN_DEFAULTS = {"tp": 1, "pp": 1, "cp": 1, "virtual_pipeline_stages": 1, "schedule": "1f1b",
                 "zero_stage": 0, "sequence_parallel": False, "recompute": "none",
                 "micro_batch_size": 1, "global_batch_size": 64, "precision": "bf16"}
PLAN_KNOBS = {"p_tp": "tp", "p_pp": "pp", "p_cp": "cp", "p_vpp": "virtual_pipeline_stages",
              "p_schedule": "schedule", "p_zero": "zero_stage", "p_sp": "sequence_parallel",
              "p_recompute": "recompute", "p_mbs": "micro_batch_size",
              "p_gbs": "global_batch_size", "p_precision": "precision"}
# contract v1.2: experts and context parallelism; written to the plan only when not at their default
V12_PLAN_DEFAULTS = {"ep": 1, "etp": 1, "moe_dispatcher": "alltoall", "ep_comm_overlap": False, "cp_method": "ring"}
PLAN_DEFAULTS |= V12_PLAN_DEFAULTS
PLAN_KNOBS |= {"p_ep": "ep", "p_etp": "etp", "p_dispatcher": "moe_dispatcher", "p_ep_overlap": "ep_comm_overlap",
               "p_cp_method": "cp_method"}
_PLAN_CHOICES: dict[str, Sequence[Any]] = {"schedule": SCHEDULES, "recompute": RECOMPUTE,
                                           "precision": PRECISIONS, "zero_stage": (0, 1, 2, 3),
                                           "moe_dispatcher": MOE_DISPATCHERS, "cp_method": CP_METHODS}


def mapping(value: Any) -> Mapping[str, Any]:
    """A section of a loaded file as a mapping ({} when the file holds something else there:
    its problem is reported by the scenario's own check, naming the field)."""
    return value if isinstance(value, Mapping) else {}


def known(name: Any, entries: Mapping[str, Any]) -> bool:
    """``name`` is a key of a catalog (a list or a number in the file is not)."""
    return isinstance(name, str) and name in entries


def link_presets(where: str) -> dict[str, str]:
    """Label -> bandwidth of the link generations in the catalog ("intra_node" or "inter_node")."""
    return {label: entry["bandwidth"] for label, entry in catalog.links()[where].items()}


def link_label(text: str, links: Mapping[str, str]) -> str:
    """The preset label whose bandwidth equals ``text`` (any unit), else CUSTOM."""
    try:
        bw = parse_bandwidth(text)
    except UnitError:
        return CUSTOM
    return next((label for label, v in links.items() if parse_bandwidth(v) == bw), CUSTOM)


def same_bandwidth(a: Any, b: Any) -> bool:
    try:
        return parse_bandwidth(a) == parse_bandwidth(b)
    except UnitError:
        return False


# --- where a scenario starts ------------------------------------------------------------------


def hf_base(cfg: dict[str, Any], filename: str) -> tuple[dict[str, Any], list[str]]:
    """A scenario dict around a Hugging Face config.json (one DGX H100 node, FSDP), and notes;
    ({}, problems) when the config cannot be read as a model."""
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


def base_problems(raw: dict[str, Any], base_dir: Path) -> list[str]:
    """The loaded file's own problems, one line each naming the field."""
    try:
        scenario_from_dict(raw, base_dir=base_dir)
    except ScenarioError as exc:
        return [str(p) for p in exc.problems]
    return []


# --- knob values from a scenario dict ----------------------------------------------------------


def model_reference(section: Mapping[str, Any], base_dir: Path) -> dict[str, Any]:
    """Model fields a section resolves to before its explicit knob fields (preset, hf_config)."""
    ref: dict[str, Any] = {}
    preset = section.get("preset")
    if known(preset, catalog.models()):
        ref.update(catalog.models()[preset])
    path = confined(base_dir, section.get("hf_config"))  # only inside the scenario's folder
    if path is not None:
        with contextlib.suppress(ScenarioError):  # the scenario's own check reports it, naming the field
            ref.update(fields_from_hf_config(read_json_object(path, "model.hf_config"), Collector("model")))
    if "num_attention_heads" in ref:
        ref.setdefault("num_kv_heads", ref["num_attention_heads"])
    if "hidden_size" in ref:
        ref.setdefault("ffn_hidden_size", 4 * ref["hidden_size"])
    return ref


def model_values(section: Mapping[str, Any], base_dir: Path) -> dict[str, Any]:
    vals = {**model_reference(section, base_dir), **section}
    vals.setdefault("num_kv_heads", vals.get("num_attention_heads", 1))
    vals.setdefault("ffn_hidden_size", 4 * int(vals.get("hidden_size", 1)))
    return vals


def cluster_reference(preset: str) -> dict[str, Any]:
    return copy.deepcopy(catalog.clusters().get(preset, {}))


def cluster_values(section: Mapping[str, Any]) -> dict[str, Any]:
    ref = cluster_reference(str(section.get("preset", "")))
    vals = {**ref, **{k: v for k, v in section.items() if k not in ("intra_node", "inter_node")}}
    for link in ("intra_node", "inter_node"):
        vals[link] = {**ref.get(link, {}), **mapping(section.get(link))}
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


def model_knobs(section: Mapping[str, Any], base_dir: Path) -> dict[str, Any]:
    vals = model_values(section, base_dir)
    preset = section.get("preset")
    out: dict[str, Any] = {"m_preset": preset if known(preset, catalog.models()) else CUSTOM}
    out.update({f"m_{key}": coerce(vals.get(key), 1, minimum=0) for key in MODEL_KNOBS})
    out["m_mlp"] = coerce(vals.get("mlp"), "gelu", ("gelu", "swiglu"))
    return out


def cluster_knobs(section: Mapping[str, Any]) -> dict[str, Any]:
    vals = cluster_values(section)
    preset, gpu = section.get("preset"), vals.get("gpu")
    return {"c_preset": preset if known(preset, catalog.clusters()) else CUSTOM,
            "c_num_nodes": coerce(vals.get("num_nodes"), 1),
            "c_gpus_per_node": coerce(vals.get("gpus_per_node"), 8),
            "c_gpu": gpu if known(gpu, catalog.gpus()) else CUSTOM,
            "c_intra_bw": coerce(vals["intra_node"].get("bandwidth"), ""),
            "c_inter_bw": coerce(vals["inter_node"].get("bandwidth"), ""),
            "c_nics": coerce(vals["inter_node"].get("nics_per_node"), 1)}


def plan_knobs(given: Mapping[str, Any]) -> dict[str, Any]:
    plan = {f: coerce(given.get(f, d), d, _PLAN_CHOICES.get(f)) for f, d in PLAN_DEFAULTS.items()}
    if plan["virtual_pipeline_stages"] > 1 and "schedule" not in given:
        plan["schedule"] = "interleaved-1f1b"
    return {key: plan[field] for key, field in PLAN_KNOBS.items()}


def knobs_for(raw: Mapping[str, Any], base_dir: Path) -> dict[str, Any]:
    """Every knob's value for a newly loaded scenario dict."""
    name = raw.get("name")
    return {"s_name": name if isinstance(name, str) else "what-if", **model_knobs(mapping(raw.get("model")), base_dir),
            **cluster_knobs(mapping(raw.get("cluster"))), **plan_knobs(mapping(raw.get("plan")))}


# --- knobs -> scenario dict --------------------------------------------------------------------


def scenario_dict(base: Mapping[str, Any], base_dir: Path, k: Mapping[str, Any]) -> dict[str, Any]:
    """The scenario dict (file format, units as strings) of the knobs ``k``; unshown fields of
    the loaded file ``base`` are kept, fields equal to the preset's are left out."""
    raw: dict[str, Any] = {"name": k["s_name"] or "what-if"}
    if isinstance(base.get("description"), str):
        raw["description"] = base["description"]
    raw["model"] = _model_section(mapping(base.get("model")), base_dir, k)
    raw["cluster"] = _cluster_section(mapping(base.get("cluster")), k)
    plan = copy.deepcopy(dict(mapping(base.get("plan"))))
    plan.pop("dp", None)  # derived from the world size, shown in the sidebar
    plan.update({field: k[key] for key, field in PLAN_KNOBS.items()})
    for field, default in V12_PLAN_DEFAULTS.items():
        if plan[field] == default and field not in (base.get("plan") or {}):
            del plan[field]
    raw["plan"] = plan
    if base.get("reliability") is not None:
        raw["reliability"] = copy.deepcopy(base["reliability"])
    return raw


def _model_section(bm: Mapping[str, Any], base_dir: Path, k: Mapping[str, Any]) -> dict[str, Any]:
    same = k["m_preset"] == (bm.get("preset") if known(bm.get("preset"), catalog.models()) else CUSTOM)
    if same:
        model = copy.deepcopy(dict(bm))
    elif k["m_preset"] == CUSTOM:  # every field of what was loaded, explicit
        model = {f: v for f, v in model_values(bm, base_dir).items() if f in MODEL_FIELDS and f != "source"}
    else:
        model = {"preset": k["m_preset"]}
    ref = model_reference(model, base_dir)
    for key in MODEL_KNOBS:
        model.pop(key, None)
        if k[f"m_{key}"] != ref.get(key):
            model[key] = k[f"m_{key}"]
    model.pop("mlp", None)
    if k["m_mlp"] != ref.get("mlp", "gelu"):
        model["mlp"] = k["m_mlp"]
    return model


def _cluster_section(bc: Mapping[str, Any], k: Mapping[str, Any]) -> dict[str, Any]:
    same = k["c_preset"] == (bc.get("preset") if known(bc.get("preset"), catalog.clusters()) else CUSTOM)
    if same:
        cluster = copy.deepcopy(dict(bc))
    elif k["c_preset"] == CUSTOM:  # every field of what was loaded, explicit
        cluster = {f: v for f, v in cluster_values(bc).items() if f in CLUSTER_FIELDS}
    else:
        cluster = {"preset": k["c_preset"]}
    ref = cluster_reference(k["c_preset"])
    cluster["num_nodes"] = k["c_num_nodes"]
    cluster.pop("gpus_per_node", None)
    if k["c_gpus_per_node"] != ref.get("gpus_per_node"):
        cluster["gpus_per_node"] = k["c_gpus_per_node"]
    if k["c_gpu"] != CUSTOM:
        cluster.pop("gpu", None)
        if k["c_gpu"] != ref.get("gpu"):
            cluster["gpu"] = k["c_gpu"]
    for link, value in (("intra_node", k["c_intra_bw"]), ("inter_node", k["c_inter_bw"])):
        section = dict(mapping(cluster.get(link)))
        section.pop("bandwidth", None)
        if not same_bandwidth(value, ref.get(link, {}).get("bandwidth")):
            section["bandwidth"] = value
        if link == "inter_node":
            section.pop("nics_per_node", None)
            if k["c_nics"] != ref.get(link, {}).get("nics_per_node"):
                section["nics_per_node"] = k["c_nics"]
        cluster.pop(link, None)
        if section:
            cluster[link] = section
    return cluster


def knob_view(raw: Mapping[str, Any], scenario: Scenario, k: Mapping[str, Any]) -> dict[str, Any]:
    """Flat, resolved, readable view of a scenario for the pinned-vs-current table."""
    view = flatten(raw)
    view.update({f"model.{key}": k[f"m_{key}"] for key in MODEL_KNOBS})
    view.update({"model.mlp": k["m_mlp"], "cluster.gpu": scenario.cluster.gpu.name,
                 "cluster.gpus_per_node": k["c_gpus_per_node"],
                 "cluster.intra_node.bandwidth": k["c_intra_bw"],
                 "cluster.inter_node.bandwidth": k["c_inter_bw"],
                 "cluster.inter_node.nics_per_node": k["c_nics"], "plan.dp": scenario.plan.dp,
                 "world_size": scenario.world_size})
    view.pop("name", None)
    return view
