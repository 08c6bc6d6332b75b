"""Issue 20 item 1: every file a scenario names (the scenario itself, model.hf_config,
plan.deepspeed_config) is opened only if it is a regular file of bounded size, decoded as UTF-8,
parsed with bounds, and checked to be a JSON object; anything else is one clean error naming
the field."""

from __future__ import annotations

import json
import os

import pytest
import yaml
from conftest import DATA, base_scenario, run_cli

from simdist.errors import ScenarioError
from simdist.spec.files import MAX_INPUT_BYTES, read_json_object, read_text
from simdist.spec.scenario import load_scenario, scenario_from_dict


def _hostile(tmp_path, kind: str) -> str:
    """A path of the given hostile kind (relative to tmp_path where it is a file)."""
    if kind == "directory":
        (tmp_path / "d").mkdir()
        return "d"
    if kind == "fifo":
        os.mkfifo(tmp_path / "p")
        return "p"
    if kind == "device":
        return "/dev/zero"
    if kind == "symlink loop":
        (tmp_path / "a").symlink_to(tmp_path / "b")
        (tmp_path / "b").symlink_to(tmp_path / "a")
        return "a"
    if kind == "nul in path":
        return "c\x00.json"
    if kind == "not utf-8":
        (tmp_path / "latin1.json").write_bytes('{"model_type": "caf\xe9"}'.encode("latin-1"))
        return "latin1.json"
    if kind == "too big":
        with open(tmp_path / "big.json", "wb") as fh:
            fh.truncate(MAX_INPUT_BYTES + 1)  # sparse: no disk used
        return "big.json"
    if kind == "missing":
        return "nope.json"
    raise AssertionError(kind)


KINDS = ("directory", "fifo", "device", "symlink loop", "nul in path", "not utf-8", "too big", "missing")
EXPECT = {"directory": "is a directory", "fifo": "is a pipe (FIFO)", "device": "is a device",
          "symlink loop": "symbolic link loop", "nul in path": "NUL character", "not utf-8": "not UTF-8 text",
          "too big": "the limit is", "missing": "does not exist"}


def _scenario_naming(field: str, path: str) -> dict:
    d = base_scenario()
    if field == "model.hf_config":
        d["model"] = {"hf_config": path}
    else:
        d["plan"]["deepspeed_config"] = path
    return d


@pytest.mark.parametrize("field", ["model.hf_config", "plan.deepspeed_config"])
@pytest.mark.parametrize("kind", KINDS)
def test_hostile_files_named_in_a_scenario(tmp_path, field, kind):
    d = _scenario_naming(field, _hostile(tmp_path, kind))
    with pytest.raises(ScenarioError) as exc:
        scenario_from_dict(d, tmp_path)
    mine = [p for p in exc.value.problems if p.field == field]
    assert len(mine) == 1 and EXPECT[kind] in mine[0].message, exc.value.problems
    assert "\n" not in mine[0].message


@pytest.mark.parametrize("kind", KINDS)
def test_hostile_scenario_files(tmp_path, kind):
    path = _hostile(tmp_path, kind)
    full = path if path.startswith("/") else str(tmp_path / path)
    with pytest.raises(ScenarioError) as exc:
        load_scenario(full)
    assert [p.field for p in exc.value.problems] == ["file"] and EXPECT[kind] in exc.value.problems[0].message


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_hostile_files_from_the_cli_exit_2_without_hanging(tmp_path, kind):
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(_scenario_naming("model.hf_config", _hostile(tmp_path, kind))))
    r = run_cli("predict", str(f), "--engine", "analytic")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"error: model.hf_config: {tmp_path / _hostile_name(kind)}" in r.stderr or "/dev/zero" in r.stderr


def _hostile_name(kind: str) -> str:
    return {"fifo": "p", "directory": "d"}.get(kind, "")


@pytest.mark.parametrize(("text", "expected"), [
    ("[1, 2]", "must hold a JSON object, not an array"),
    ('"text"', "must hold a JSON object, not a string"),
    ("{'a': 1}", "(not valid JSON)"),
    ("[" * 100_000 + "]" * 100_000, "nested more than 64 levels deep"),
    ('{"a": 1}', None),
], ids=["array", "string", "python-dict", "deep-100000", "object"])
def test_json_shape_and_depth(tmp_path, text, expected):
    (tmp_path / "c.json").write_text(text)
    if expected is None:
        assert read_json_object(tmp_path / "c.json", "plan.deepspeed_config") == {"a": 1}
        return
    with pytest.raises(ScenarioError) as exc:
        read_json_object(tmp_path / "c.json", "plan.deepspeed_config")
    (p,) = exc.value.problems
    assert p.field == "plan.deepspeed_config" and expected in p.message


@pytest.mark.parametrize(("config", "field"), [
    ('{"train_batch_size": Infinity}', "train_batch_size"),
    ('{"train_micro_batch_size_per_gpu": NaN}', "train_micro_batch_size_per_gpu"),
    ('{"zero_optimization": {"reduce_bucket_size": Infinity}}', "zero_optimization.reduce_bucket_size"),
    ('{"zero_optimization": {"reduce_bucket_size": 1e300}}', "zero_optimization.reduce_bucket_size"),
    ('{"gradient_accumulation_steps": 1e400}', "gradient_accumulation_steps"),
    ('{"zero_optimization": {"stage": "3"}}', "zero_optimization.stage"),
    ('{"zero_optimization": 5}', "zero_optimization"),
    ('{"zero_optimization": {"offload_param": "cpu"}}', "zero_optimization.offload_param"),
    ('{"bf16": true}', "bf16"),
    ('{"optimizer": {"type": 7}}', "optimizer.type"),
    pytest.param('{"train_batch_size": ' + "9" * 5000 + "}", None, id="5000-digit-integer"),
])
def test_deepspeed_values_of_the_wrong_type_or_not_finite(tmp_path, config, field):
    (tmp_path / "ds.json").write_text(config)
    with pytest.raises(ScenarioError) as exc:
        scenario_from_dict(base_scenario(deepspeed_config="ds.json"), tmp_path)
    fields = {p.field for p in exc.value.problems}
    if field is None:  # an integer beyond Python's digit limit is refused while parsing
        assert fields == {"plan.deepspeed_config"}
    else:
        assert f"plan.deepspeed_config.{field}" in fields, exc.value.problems


@pytest.mark.parametrize("patch", [{"architectures": 5}, {"architectures": ["x", 3]}, {"model_type": ["llama"]},
                                   {"num_hidden_layers": 1e400}, {"hidden_size": "4096"}, {"head_dim": -1}])
def test_hf_config_of_the_wrong_shape(tmp_path, patch):
    cfg = {**json.loads((DATA / "hf" / "llama3-8b.json").read_text()), **patch}
    if "model_type" not in patch:
        cfg.pop("model_type")
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    with pytest.raises(ScenarioError) as exc:
        scenario_from_dict({**base_scenario(), "model": {"hf_config": "c.json"}}, tmp_path)
    assert all(p.field.startswith("model.") for p in exc.value.problems)
    assert any(p.field.startswith("model.hf_config.") for p in exc.value.problems), exc.value.problems


def test_read_text_accepts_a_regular_file_through_a_symlink(tmp_path):
    (tmp_path / "real.yaml").write_text("name: x\n")
    (tmp_path / "link.yaml").symlink_to(tmp_path / "real.yaml")
    assert read_text(tmp_path / "link.yaml", "file") == "name: x\n"


def test_a_byte_order_mark_is_not_an_error(tmp_path):
    (tmp_path / "c.json").write_bytes(b"\xef\xbb\xbf" + (DATA / "hf" / "llama3-8b.json").read_bytes())
    d = {**base_scenario(), "model": {"hf_config": "c.json"}}
    assert scenario_from_dict(d, tmp_path).model.num_layers == 32


@pytest.mark.parametrize("config", ["/dev/zero", "nope.json", "nope.yaml"])
def test_simdist_import_of_a_hostile_config(tmp_path, config):
    path = config if config.startswith("/") else str(tmp_path / config)
    r = run_cli("import", path, "--model", "llama2-7b", "--cluster", "dgx-a100-80gb")
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.startswith(f"error: config: {path}")


@pytest.mark.parametrize(("text", "field"), [
    ('{"version": 1, "device": "x", "peak_flops": NaN}', "--profile.peak_flops"),
    ('{"version": 1, "device": "x", "links": {"intra": {"latency_s": -1, "bandwidth_bytes_per_s": 1e9}}}',
     "--profile.links.intra.latency_s"),
    ('{"version": 1, "device": "x", "links": [1]}', "--profile"),
    ("[1]", "--profile"),
])
def test_calibration_profiles_are_read_as_carefully(tmp_path, text, field):
    from simdist.spec.profile import load_profile

    (tmp_path / "p.json").write_text(text)
    with pytest.raises(ScenarioError) as exc:
        load_profile(tmp_path / "p.json")
    assert field in {p.field for p in exc.value.problems}
