"""Issue 20 items 2, 4 and 5 for YAML text: duplicate keys refused, alias expansion bounded
before anything is built (a 663-byte bomb fails fast in little memory), deep nesting refused
without a crash, syntax errors as one line naming file, line and column."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import yaml
from conftest import REPO, base_scenario, run_cli

from simdist.errors import ScenarioError
from simdist.io.text import MAX_EXPANDED_NODES, parse_yaml
from simdist.spec.scenario import load_scenario

# the classic "billion laughs": 9 levels of 9 aliases = 9^9 strings once expanded
BOMB = "\n".join(
    [f'a: &a [{",".join(["lol"] * 9)}]'] +
    [f"{n}: &{n} [{','.join(['*' + p] * 9)}]" for p, n in zip("abcdefgh", "bcdefghi", strict=True)] +
    ["name: *i", "model: {preset: tiny}", "cluster: {preset: local, num_nodes: 1}", "plan: {global_batch_size: 2}"])


def one_problem(text: str, source: str = "s.yaml") -> str:
    with pytest.raises(ScenarioError) as exc:
        parse_yaml(text, source)
    (p,) = exc.value.problems
    assert p.field == "file" and "\n" not in p.message
    return p.message


@pytest.mark.parametrize(("text", "where"), [
    ("name: a\nname: b\n", "s.yaml:2:1: duplicate key 'name'"),
    ("plan: {tp: 1, tp: 2}\n", "s.yaml:1:15: duplicate key 'tp'"),
    ("model:\n  preset: tiny\n  preset: gpt3-1.3b\n", "s.yaml:3:3: duplicate key 'preset'"),
])
def test_duplicate_keys_are_refused_where_they_are(text, where):
    assert one_problem(text).startswith(where)


def test_a_merge_key_may_be_overridden():
    assert parse_yaml("x: &x {k: 1, j: 2}\ny: {<<: *x, k: 3}\n", "s.yaml")["y"] == {"k": 3, "j": 2}


def test_the_catalogs_unbounded_reading_still_refuses_duplicates_and_is_the_same_data():
    from simdist.catalog import CATALOG_DIR

    with pytest.raises(ScenarioError, match="duplicate key 'name'"):
        parse_yaml("name: a\nname: b\n", "c.yaml", bounded=False)
    for path in sorted(CATALOG_DIR.glob("*.yaml")):
        text = path.read_text(encoding="utf-8")
        assert parse_yaml(text, path.name, bounded=False) == parse_yaml(text, path.name)


def test_alias_bomb_is_refused_before_it_expands():
    assert len(BOMB.encode()) < 700
    msg = one_problem(BOMB)
    assert f"more than {MAX_EXPANDED_NODES:,} values (an alias bomb?)" in msg


def test_alias_bomb_from_the_cli_in_little_memory(tmp_path):
    """The whole CLI under a 1 GiB address-space limit: the unbounded loader needed 1.8 GB and
    grew; the bounded one refuses the file after composing ~100 nodes."""
    f = tmp_path / "bomb.yaml"
    f.write_text(BOMB)
    code = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        sys.argv = ["simdist", "predict", {str(f)!r}]
        from simdist.cli import main
        sys.exit(main())
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 2 and "alias bomb" in r.stderr and "Traceback" not in r.stderr


def test_a_self_referencing_alias_is_refused():
    assert "an alias refers to a node that contains it" in one_problem("a: &a [1, *a]\n")


@pytest.mark.parametrize("text", ["a: " + "[" * 100_000 + "]" * 100_000,
                                  "a: " + "{b: " * 10_000 + "1" + "}" * 10_000,
                                  "\n".join(" " * i + f"k{i}:" for i in range(200)) + " 1"],
                         ids=["flow-100000", "mapping-10000", "block-200"])
def test_deep_nesting_is_refused_without_a_crash(tmp_path, text):
    """libyaml's node composer recurses in C: 100,000 levels used to crash the interpreter."""
    f = tmp_path / "deep.yaml"
    f.write_text(text)
    r = run_cli("predict", str(f))
    assert r.returncode == 2 and "nested more than 64 levels deep" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize(("text", "expected"), [
    ("name: [unclosed\n", "s.yaml:2:1: did not find expected ',' or ']' (while parsing a flow sequence)"),
    ("a: b: c\n", "s.yaml:1:5: mapping values are not allowed in this context"),
    ("a:\n  - b\n - c\n", "s.yaml:3:2:"),
    ("a: 'unterminated\n", "s.yaml:2:1:"),
    ("a: \x07\n", "s.yaml: unacceptable character #x0007"),
    ("a: " + "9" * 5000 + "\n", "s.yaml: Exceeds the limit"),
])
def test_syntax_errors_are_one_line_with_file_line_and_column(text, expected):
    assert one_problem(text).startswith(expected)


def test_syntax_error_from_the_cli_is_one_line(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("name: x\nplan:\n  tp: 1\n tp: 2\n")
    r = run_cli("predict", str(f))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: file: {f}:4:2: ")


def test_scenario_that_is_not_a_mapping(tmp_path):
    for text in ("", "- 1\n", "just text\n"):
        f = tmp_path / "s.yaml"
        f.write_text(text)
        with pytest.raises(ScenarioError) as exc:
            load_scenario(f)
        assert [p.field for p in exc.value.problems] == ["file"]


def test_yaml_oddities_are_type_errors_not_crashes(tmp_path):
    """Timestamps, binary, sets and non-string keys reach the field checks as values of the
    wrong type."""
    d = base_scenario()
    text = yaml.safe_dump(d) + "description: 2024-01-01\n"
    text = text.replace("preset: gpt3-1.3b", "preset: !!binary aGVsbG8=").replace("global_batch_size: 64",
                                                                                  "global_batch_size: !!set {64}")
    f = tmp_path / "s.yaml"
    f.write_text(text + "? [complex, key]\n: 1\n")
    with pytest.raises(ScenarioError) as exc:
        load_scenario(f)
    assert exc.value.problems and all(p.field for p in exc.value.problems)
