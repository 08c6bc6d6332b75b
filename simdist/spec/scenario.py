"""Scenario: model + cluster + plan (+ reliability), loaded from YAML and validated as a whole.

``scenario_from_dict`` resolves presets, the Hugging Face config and the DeepSpeed config
(explicit fields win), parses every field the way the spec dataclasses describe it
(:mod:`simdist.spec.fields`), and reports every problem at once, each naming its field
(``plan.tp: 12 does not divide model.num_attention_heads (96)``). ``docs/scenario-format.md``
is the field reference.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, field, replace
from pathlib import Path
from typing import Any, TypeVar

from simdist import catalog
from simdist.errors import Collector, Problem, ScenarioError
from simdist.frozen import frozen
from simdist.spec.cluster import ClusterSpec
from simdist.spec.consistency import check_consistency
from simdist.spec.fields import hash_once, legacy_view
from simdist.spec.files import read_json_object, read_yaml
from simdist.spec.frameworks import FRAMEWORKS, plan_defaults
from simdist.spec.model import ModelSpec
from simdist.spec.parse import build, parse_fields
from simdist.spec.plan import ParallelPlan
from simdist.spec.reliability import Reliability
from simdist.units import short_repr

T = TypeVar("T")
_NONE = object()  # not kept yet

__all__ = ["Reliability", "Scenario", "check_consistency", "load_scenario", "scenario_from_dict"]


@hash_once
@frozen(kw_only=True)
class Scenario:
    name: str
    model: ModelSpec
    cluster: ClusterSpec
    plan: ParallelPlan
    reliability: Reliability | None = None
    requires_profile: bool = False  # the `local` cluster: speed only from a calibration profile
    source_path: str | None = field(default=None, compare=False)
    # what loading it left out, for the user (e.g. the DeepSpeed config keys no field is read from)
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def world_size(self) -> int:
        return self.cluster.world_size

    def to_dict(self) -> dict[str, Any]:
        """Resolved, SI-unit view of the scenario (for caching and reports)."""
        d = asdict(self)
        d.pop("source_path", None)
        d.pop("notes", None)
        d["model"].pop("source", None)
        d["cluster"]["gpu"].pop("source", None)
        return d

    def kept(self, what: str, make: Callable[[Scenario], T]) -> T:
        """``make(self)`` worked out once per scenario object and kept on it under ``what``: only
        for pure functions of the compared fields whose result is immutable (the fields are
        frozen, so it cannot go stale; a copy made by ``replace`` starts without it)."""
        key = f"_kept_{what}"
        out = self.__dict__.get(key, _NONE)
        if out is _NONE:
            out = make(self)
            object.__setattr__(self, key, out)
        return out  # type: ignore[no-any-return]

    def hash(self) -> str:
        """Stable content hash of what is simulated (the name is not part of it). Fields newer
        than contract 1.1 count only when set, so a file that does not use them keeps its hash.
        Kept on the scenario once worked out (``predict`` reports it every call)."""
        return self.kept("hash", Scenario._content_hash)

    def _content_hash(self) -> str:
        d: dict[str, Any] = {"model": legacy_view(self.model), "cluster": legacy_view(self.cluster),
                             "plan": legacy_view(self.plan), "requires_profile": self.requires_profile,
                             "reliability": legacy_view(self.reliability) if self.reliability else None}
        d["model"].pop("source", None)
        d["cluster"]["gpu"].pop("source", None)
        blob = json.dumps(d, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def with_plan(self, **changes: Any) -> Scenario:
        """A copy with some plan fields changed (validated again)."""
        plan = replace(self.plan, **changes)
        if "dp" in changes and "dp_shard" not in changes and self.plan.dp_shard == self.plan.dp:
            plan = replace(plan, dp_shard=plan.dp)
        problems = check_consistency(self.model, self.cluster, plan)
        if problems:
            raise ScenarioError(problems)
        return replace(self, plan=plan)


# --- loading ------------------------------------------------------------------------------


def load_scenario(path: str | Path) -> Scenario:
    """Load and validate a scenario file; raises ScenarioError listing every problem."""
    p = Path(path)
    data = read_yaml(p, "file")
    if not isinstance(data, dict):
        raise ScenarioError(Problem("file", f"{p} must hold a mapping with name, model, cluster, plan"))
    scenario = scenario_from_dict(data, base_dir=p.parent)
    return replace(scenario, source_path=str(p))


_TOP = ("name", "description", "model", "cluster", "plan", "reliability")


def scenario_from_dict(data: Mapping[str, Any], base_dir: str | Path = ".") -> Scenario:
    """The validated scenario of a scenario-file dict; files it names are relative to
    ``base_dir``. Raises ScenarioError naming every problem, and nothing else."""
    if not isinstance(data, Mapping):
        raise ScenarioError(Problem("file", f"must hold a mapping with name, model, cluster, plan, "
                                    f"got {short_repr(data)}"))
    c = Collector()
    base = Path(base_dir)
    for key in data:
        if key not in _TOP:
            c.add(short_repr(key, 60) if not isinstance(key, str) else key[:60],
                  f"unknown field (expected one of {', '.join(sorted(_TOP))})")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        c.add("name", "is required (free text)")
    if data.get("description") is not None and not isinstance(data["description"], str):
        c.add("description", "must be text")
    for section in ("model", "cluster", "plan"):
        if not isinstance(data.get(section), Mapping):
            c.add(section, "is required and must be a mapping")
    c.raise_if_any()

    model = _model(data["model"], base, c)
    cluster, requires_profile = _cluster(data["cluster"], c)
    notes: list[str] = []
    plan, dp_given = _plan(data["plan"], base, cluster, c, notes)
    reliability = None
    if data.get("reliability") is not None:
        rc = Collector("reliability")
        args = parse_fields(Reliability, data["reliability"], rc)
        if args is not None and not rc.problems:
            reliability = build(Reliability, args, rc)
        c.problems.extend(rc.problems)
    if model and cluster and plan:
        c.problems.extend(check_consistency(model, cluster, plan, dp_given=dp_given))
    else:
        for where, obj in (("model", model), ("cluster", cluster), ("plan", plan)):
            if obj is not None:
                c.problems.extend(Problem(f"{where}.{p.field}", p.message) for p in obj.problems())
    c.raise_if_any()
    assert model and cluster and plan
    return Scenario(name=str(name), model=model, cluster=cluster, plan=plan, reliability=reliability,
                    requires_profile=requires_profile, notes=tuple(notes))


def _preset(raw: Mapping[str, Any], entries: Mapping[str, Any], what: str, c: Collector) -> str | None:
    preset = raw.get("preset")
    if preset is None:
        return None
    if not isinstance(preset, str):
        c.add("preset", f"must be a {what} preset name, got {short_repr(preset)}")
    elif preset not in entries:
        c.add("preset", f"unknown {what} preset {preset[:60]!r}; see `simdist list {what}s`")
    else:
        return preset
    return None


def _path(raw: Mapping[str, Any], key: str, base: Path, c: Collector) -> Path | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        c.add(key, f"must be a file path, got {short_repr(value)}")
        return None
    return base / value


# --- the three parts ----------------------------------------------------------------------


def _model(raw: Mapping[str, Any], base: Path, outer: Collector) -> ModelSpec | None:
    c = Collector("model")
    values: dict[str, Any] = {}
    presets = catalog.models()
    preset = _preset(raw, presets, "model", c)
    if preset is not None:
        values.update({k: v for k, v in presets[preset].items() if k != "published_params"})
        values["name"] = preset
    path = _path(raw, "hf_config", base, c)
    if path is not None:
        from simdist.io.hf import fields_from_hf_config  # here: most scenarios have none

        hc = Collector("model.hf_config")
        try:
            values.update(fields_from_hf_config(read_json_object(path, "model.hf_config"), hc))
        except ScenarioError as exc:
            hc.extend(exc)
        c.problems.extend(hc.problems)
    trusted = {"source": values.pop("source")} if "source" in values else {}
    merged = {**values, **{k: v for k, v in raw.items() if k not in ("preset", "hf_config")}}
    args = parse_fields(ModelSpec, merged, c, hint="give it, a preset, or an hf_config",
                        missing=not c.problems)
    model = build(ModelSpec, {**args, **trusted}, c, local=False) if args is not None and not c.problems else None
    outer.problems.extend(c.problems)
    return model


def _cluster(raw: Mapping[str, Any], outer: Collector) -> tuple[ClusterSpec | None, bool]:
    c = Collector("cluster")
    presets = catalog.clusters()
    preset = _preset(raw, presets, "cluster", c)
    values: dict[str, Any] = {}
    requires_profile = False
    if preset is not None:
        values = copy.deepcopy(dict(presets[preset]))
        requires_profile = bool(values.pop("requires_profile", False))
        values.pop("source", None)
    for key, value in raw.items():
        if key == "preset":
            continue
        if key in ("intra_node", "inter_node", "host") and isinstance(value, Mapping) \
                and isinstance(values.get(key), Mapping):
            values[key] = {**values[key], **value}
        else:
            values[key] = value
    args = parse_fields(ClusterSpec, values, c, hint="give it or a preset", missing=not c.problems)
    cluster = None
    if args is not None and not c.problems:
        cluster = build(ClusterSpec, {**args, "name": preset or "custom"}, c, local=False)
    outer.problems.extend(c.problems)
    return cluster, requires_profile


def _plan(raw: Mapping[str, Any], base: Path, cluster: ClusterSpec | None,
          outer: Collector, notes: list[str]) -> tuple[ParallelPlan | None, bool]:
    c = Collector("plan")
    plan_data = {k: v for k, v in raw.items() if k != "deepspeed_config"}
    path = _path(raw, "deepspeed_config", base, c)
    if path is not None:
        from simdist.io import deepspeed as ds_io  # here: most scenarios have none

        dc = Collector("plan.deepspeed_config")
        try:
            cfg = read_json_object(path, "plan.deepspeed_config")
            world = cluster.world_size if cluster else None
            plan_data = {**ds_io.plan_fields(cfg, plan_data, world, dc), **plan_data}
            ignored = ds_io.ignored_keys(cfg)
            if ignored:
                notes.append(f"plan.deepspeed_config: not simulated, ignored: {', '.join(ignored)}")
        except ScenarioError as exc:
            dc.extend(exc)
        c.problems.extend(dc.problems)
    framework = plan_data.get("framework")
    if isinstance(framework, str) and framework in FRAMEWORKS:  # its defaults fill unset fields
        plan_data = {**plan_defaults(framework, plan_data), **plan_data}
    # virtual stages imply the interleaved schedule (the contract: ">1 means interleaved 1F1B")
    v = plan_data.get("virtual_pipeline_stages", 1)
    if "schedule" not in plan_data and _whole(v) and v > 1:
        plan_data["schedule"] = "interleaved-1f1b"
    dp_given = "dp" in plan_data
    if cluster is not None and not dp_given:  # check_consistency reports a mismatch
        mp = 1
        for key in ("tp", "pp", "cp"):
            x = plan_data.get(key, 1)
            mp *= x if _whole(x) and x > 0 else 1
        plan_data["dp"] = max(1, cluster.world_size // mp)
    args = parse_fields(ParallelPlan, plan_data, c)
    plan = None
    if args is not None and not c.problems and cluster is not None:
        plan = build(ParallelPlan, args, c, local=False)
    outer.problems.extend(c.problems)
    return plan, dp_given


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
