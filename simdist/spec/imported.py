"""A DeepSpeed config (ds_config.json) or an Accelerate config (YAML), plus a model and a
cluster preset -> a scenario that loads (what ``simdist import`` writes).

The conversions are :mod:`simdist.io.deepspeed` and :mod:`simdist.io.accelerate`; this module
reads the file, validates the result as a whole scenario and renders it back in the scenario
file's spelling (:func:`plan_to_yaml`, from the plan's field descriptions).
"""

from __future__ import annotations

from dataclasses import MISSING
from pathlib import Path
from typing import Any

import yaml

from simdist import catalog
from simdist.errors import Collector, Problem, ScenarioError
from simdist.io.accelerate import scenario_fields
from simdist.spec.fields import FieldSpec, spec_fields
from simdist.spec.files import read_json_object, read_yaml
from simdist.spec.plan import ParallelPlan
from simdist.spec.scenario import scenario_from_dict

ALWAYS = ("tp", "pp", "dp", "zero_stage", "micro_batch_size", "global_batch_size", "precision", "optimizer")


def import_config(path: Path, model: str, cluster: str, *, nodes: int | None = None,
                  gpus_per_node: int | None = None, global_batch_size: int | None = None,
                  micro_batch_size: int | None = None, name: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """The scenario dict for ``path`` (validated: it loads), and notes on where each plan field
    came from. Raises ScenarioError naming every problem."""
    notes: list[str] = []
    cl: dict[str, Any] = {"preset": cluster, "num_nodes": nodes or 1}
    if gpus_per_node:
        cl["gpus_per_node"] = gpus_per_node
    plan: dict[str, Any] = {}
    if global_batch_size:
        plan["global_batch_size"] = global_batch_size
    if micro_batch_size:
        plan["micro_batch_size"] = micro_batch_size
    if path.suffix.lower() == ".json":
        read_json_object(path, "config")  # a readable JSON object, or one problem naming the argument
        plan["deepspeed_config"] = str(path.resolve())
        notes.append(f"plan read from the DeepSpeed config {path.name}")
    else:
        raw = read_yaml(path, "config")
        if not isinstance(raw, dict):
            raise ScenarioError(Problem("config", f"{path} must hold a mapping (an Accelerate config)"))
        c = Collector("config")
        preset_gpus = catalog.clusters().get(cluster, {}).get("gpus_per_node", 8)
        scenario_fields(raw, plan, cl, nodes=nodes, preset_gpus_per_node=int(preset_gpus),
                        config_dir=str(path.resolve().parent), notes=notes, c=c)
        c.raise_if_any()
    d = {"name": name or path.stem, "model": {"preset": model}, "cluster": cl, "plan": plan}
    sc = scenario_from_dict(d)  # validates everything, resolves the DeepSpeed config
    notes += sc.notes  # the config keys no plan field comes from
    d["plan"] = plan_to_yaml(sc.plan)
    d["cluster"] = dict(cl)
    return d, notes


def plan_to_yaml(plan: ParallelPlan) -> dict[str, Any]:
    """A resolved plan in the scenario file's spelling: the fields every reader wants to see,
    and the others where they differ from the defaults."""
    default = ParallelPlan(global_batch_size=plan.global_batch_size, dp=plan.dp)
    out: dict[str, Any] = {key: getattr(plan, key) for key in ALWAYS}
    for fs in spec_fields(ParallelPlan):
        value = getattr(plan, fs.name)
        if fs.name in ALWAYS or value == getattr(default, fs.name):
            continue
        out[fs.key] = _yaml_value(fs, value)
    return out


def _yaml_value(fs: FieldSpec, value: Any) -> Any:
    if fs.meta.get("unit") == "size":
        mib = value / 2**20
        return f"{mib:g} MiB" if mib == int(mib) else f"{value:.0f} B"
    if fs.kind == "spec":
        nested = spec_fields(type(value))
        if fs.name == "grad_compression":  # the method's own parameter only
            keep = {"method", "error_feedback", {"topk": "ratio", "powersgd": "rank"}.get(value.method, "")}
            return {f.key: getattr(value, f.name) for f in nested if f.name in keep}
        return {f.key: getattr(value, f.name) for f in nested if f.default is not MISSING}
    return value


def render(d: dict[str, Any], notes: list[str], source: Path) -> str:
    """The scenario as commented YAML (the batch arithmetic in a comment)."""
    p = d["plan"]
    steps = p["global_batch_size"] // (p["micro_batch_size"] * p["dp"])
    lines = [f"# Imported by `simdist import` from {source.name}."]
    lines += [f"# {n}" for n in notes]
    lines.append(f"# batch: {p['global_batch_size']} sequences = micro {p['micro_batch_size']} x dp {p['dp']} "
                 f"x {steps} micro-batches per step")
    body = yaml.safe_dump({k: d[k] for k in ("name", "model", "cluster", "plan")}, sort_keys=False,
                          default_flow_style=False)
    return "\n".join(lines) + "\n" + body
