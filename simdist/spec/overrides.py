"""Scenario fields set on the command line (``--set plan.tp=4``), and a Hugging Face config
given where a scenario file is expected.

``--set KEY=VALUE`` (repeatable) changes one field of the scenario file before it is validated,
so a bad value is reported exactly as it would be in the file (``plan.tp: 12 does not divide
model.num_attention_heads (96)``). KEY is a dotted path that starts at a scenario section
(``name``, ``model``, ``cluster``, ``plan``, ``reliability``); VALUE is read as a YAML scalar
(``4`` is a number, ``true`` a boolean, ``300 GB/s`` text, ``'4'`` the text 4). A later
``--set`` of the same key wins.

A Hugging Face ``config.json`` (``model_type``, ``hidden_size``... and none of the scenario's
sections) is not a scenario: it is refused with one line saying how to use it
(``model: {hf_config: config.json}``), unless ``--set`` gives the cluster, and then it stands in
for the model of a scenario whose plan is the defaults plus whatever ``--set plan.*`` says.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from simdist.errors import Collector, Problem, ScenarioError
from simdist.spec.files import read_yaml
from simdist.units import short_repr

SECTIONS = ("name", "description", "model", "cluster", "plan", "reliability")
# keys only a Hugging Face config has at its top level (transformers' PretrainedConfig)
HF_KEYS = frozenset({"model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "architectures", "vocab_size", "intermediate_size", "torch_dtype"})
FILE_FIELDS = (("model", "hf_config"), ("plan", "deepspeed_config"))  # paths relative to the file


def parse_sets(items: Sequence[str]) -> list[tuple[tuple[str, ...], Any]]:
    """``KEY=VALUE`` items -> [(path, value)]; every malformed item is a problem naming ``--set``."""
    c = Collector()
    out: list[tuple[tuple[str, ...], Any]] = []
    for item in items:
        key, eq, text = item.partition("=")
        path = tuple(part.strip() for part in key.strip().split("."))
        if not eq or not key.strip() or any(not part for part in path):
            c.add("--set", f"{short_repr(item, 60)} is not KEY=VALUE with a dotted KEY, e.g. plan.tp=4")
            continue
        if path[0] not in SECTIONS:
            c.add("--set", f"{key.strip()[:60]}: a key starts at one of {', '.join(SECTIONS)}")
            continue
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError:
            value = text  # not YAML: the text itself (the field's own check judges it)
        if isinstance(value, list | dict):
            c.add("--set", f"{key.strip()[:60]}: VALUE must be one value (a number, true/false or "
                  f"text), got {short_repr(text, 60)}")
            continue
        out.append((path, value))
    c.raise_if_any()
    return out


def apply_sets(data: Mapping[str, Any], sets: Sequence[tuple[tuple[str, ...], Any]]) -> dict[str, Any]:
    """A deep copy of ``data`` with each (path, value) set; a section that is not a mapping
    where a key must go inside it is a problem naming that key."""
    out = copy.deepcopy(dict(data))
    c = Collector()
    for path, value in sets:
        node: dict[str, Any] = out
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                c.add(".".join(path[: i + 1]), f"is {short_repr(child, 40)}, not a mapping: cannot set "
                      f"{'.'.join(path)} inside it")
                break
            node = child
        else:
            node[path[-1]] = value
    c.raise_if_any()
    return out


def is_hf_config(data: Any) -> bool:
    """A Hugging Face model config: none of the scenario's sections, some of its own keys."""
    return (isinstance(data, Mapping) and not any(k in data for k in ("model", "cluster", "plan"))
            and len(HF_KEYS.intersection(k for k in data if isinstance(k, str))) >= 2)


def hf_config_hint(path: str | Path) -> str:
    name = Path(path).name
    return (f"{path} is a Hugging Face model config, not a scenario: name it as the model of a scenario "
            f"(model: {{hf_config: {name}}} beside cluster and plan), or give the cluster here, e.g. "
            f"--set cluster.preset=dgx-h100 --set cluster.num_nodes=8 --set plan.tp=8")


def scenario_data(path: str | Path, items: Sequence[str] = ()) -> dict[str, Any]:
    """The scenario file's dict with the ``--set`` items applied (a Hugging Face config becomes
    the model of a scenario when they give the cluster)."""
    p = Path(path)
    sets = parse_sets(items)
    data = read_yaml(p, "file")
    if is_hf_config(data):
        if not any(s[0] == "cluster" and len(s) > 1 for s, _ in sets):
            raise ScenarioError(Problem("file", hf_config_hint(p)))
        data = {"name": p.stem, "model": {"hf_config": p.name}, "plan": {}}
    if not isinstance(data, dict):
        raise ScenarioError(Problem("file", f"{p} must hold a mapping with name, model, cluster, plan"))
    return apply_sets(data, sets)


def load_scenario_with(path: str | Path, items: Sequence[str] = ()) -> Any:
    """:func:`~simdist.spec.scenario.load_scenario` with ``--set`` items applied."""
    from simdist.spec.scenario import scenario_from_dict

    p = Path(path)
    scenario = scenario_from_dict(scenario_data(p, items), base_dir=p.parent)
    return replace(scenario, source_path=str(p))


def write_merged(path: str | Path, items: Sequence[str], directory: str | Path | None = None) -> Path:
    """The scenario with ``--set`` applied, written as a new YAML file (for the executor's
    workers, which read a file); the files it names become absolute paths."""
    p = Path(path)
    data = scenario_data(p, items)
    for section, key in FILE_FIELDS:
        part = data.get(section)
        if isinstance(part, dict) and isinstance(part.get(key), str):
            part[key] = str((p.parent / part[key]).resolve())
    import tempfile  # here: only the executor's runs write a scenario

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix=f"{p.stem}-set-", dir=directory,
                                     delete=False, encoding="utf-8") as f:
        yaml.safe_dump(data, f, sort_keys=False)
    return Path(f.name)
