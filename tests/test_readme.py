"""Every command of README.md's fenced shell blocks runs as written, so the README cannot drift.

The quick commands run for real (in a scratch folder that sees the repository's scenarios, with
a scratch run store) and must exit 0. The long ones (torchrun jobs, calibration, the plan search,
the validation reports, sweeps) get ``--help``, and a ``simdist run`` also gets the executor's own
checks of the scenario against ``--nproc`` (the check that refused the tour's old
``tiny-3d --nproc 4``); the test marked ``slow`` runs the search and validation commands for
real. Installing (pip) and the test suite itself are only checked for their form.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

README = REPO / "README.md"
LONG = {"run", "calibrate", "search", "validate", "sweep"}  # simdist commands given --help only
REAL_WHEN_SLOW = {"search", "validate"}  # ...that the slow test runs for real
OUTPUT_FLAGS = ("--out", "-o", "--output", "--csv", "--html")


def shell_blocks(text: str) -> list[str]:
    return re.findall(r"```(?:bash|sh|shell|console)\n(.*?)```", text, flags=re.S)


def commands(text: str) -> list[list[str]]:
    """Each command of the shell blocks as argv (comments dropped; lines split at ``&&`` and ``;``)."""
    out = []
    for block in shell_blocks(text):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            current: list[str] = []
            for w in [*words, ";"]:
                if w in ("&&", ";"):
                    if current:
                        out.append(current)
                    current = []
                elif w.endswith(";"):
                    current.append(w[:-1])
                    out.append(current)
                    current = []
                else:
                    current.append(w)
    return out


def outputs(argv: list[str]) -> set[str]:
    return {argv[i + 1] for i, w in enumerate(argv[:-1]) if w in OUTPUT_FLAGS}


def plan(text: str, slow: bool = False) -> list[tuple[str, list[str]]]:
    """(how, argv) per README command: how is 'run', 'help', 'form' (pip, pytest, streamlit)."""
    made_by_long: set[str] = set()
    steps = []
    for argv in commands(text):
        if argv[0] == "simdist":
            sub = argv[1] if len(argv) > 1 else ""
            long = sub in LONG and not (slow and sub in REAL_WHEN_SLOW)
            needs = any(a in made_by_long for a in argv)
            if long or needs:
                made_by_long |= outputs(argv)
                steps.append(("help", argv))
            else:
                steps.append(("run", argv))
        else:
            steps.append(("form", argv))
    return steps


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    d = tmp_path_factory.mktemp("readme")
    for name in ("scenarios", "app.py", "tests"):
        (d / name).symlink_to(REPO / name)
    env = {**os.environ, "SIMDIST_DB": str(d / "runs.db"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return d, env


def simdist(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simdist.cli", *argv[1:]], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def check_form(argv: list[str]) -> None:
    text = " ".join(argv)
    if argv[:2] == ["pip", "install"]:
        if "torch" in text:  # the CPU build: PyTorch's own CPU wheel index, and the pinned version
            assert "torch==2.13.0" in argv and "https://download.pytorch.org/whl/cpu" in argv, text
        else:
            assert argv[2] in ("-e", "--editable") and argv[3].startswith("."), text
    elif argv[:3] == ["python", "-m", "pytest"]:
        assert (REPO / "tests").is_dir()
    elif argv[:2] == ["streamlit", "run"]:
        assert (REPO / argv[2]).is_file(), text
    else:
        pytest.fail(f"README command not covered by this test: {text}")


def check_run_plan(argv: list[str]) -> None:
    """What `simdist run` checks before it launches torchrun: the scenario, --nproc, the options."""
    from executor.checks import run_problems
    from executor.launch import DEFAULTS, option_problems, total_processes
    from simdist.cli import build_parser
    from simdist.spec.scenario import load_scenario

    args = build_parser("run").parse_args(argv[1:])
    scenario = load_scenario(REPO / args.file)
    opts = {**DEFAULTS, **vars(args), "faults": []}
    problems = [str(p) for p in run_problems(scenario, int(args.nproc))]
    problems += option_problems(scenario, {**opts, "out": None}, total_processes(scenario))
    assert not problems, f"{' '.join(argv)}: {problems}"


def _check(steps: list[tuple[str, list[str]]], cwd: Path, env: dict[str, str]) -> None:
    failures = []
    for how, argv in steps:
        text = " ".join(argv)
        if how == "form":
            check_form(argv)
            continue
        if how == "help":
            r = simdist([*argv[:2], "--help"], cwd, env, timeout=120)
            if argv[1] == "run":
                check_run_plan(argv)
            for a in argv[2:]:
                if a.endswith((".yaml", ".json")) and a.startswith("scenarios/"):
                    assert (REPO / a).is_file(), f"{text}: {a} does not exist"
        else:
            r = simdist(argv, cwd, env)
        if r.returncode != 0 or "Traceback" in r.stderr:
            failures.append(f"{text} -> exit {r.returncode}: {r.stderr.strip()[-400:]}")
    assert not failures, "\n".join(failures)


def test_readme_commands_run_as_written(scratch):
    cwd, env = scratch
    steps = plan(README.read_text(encoding="utf-8"))
    assert sum(how == "run" for how, _ in steps) >= 10
    _check(steps, cwd, env)


@pytest.mark.slow
def test_readme_long_simulator_commands_run_as_written(scratch):
    cwd, env = scratch
    steps = [(how, argv) for how, argv in plan(README.read_text(encoding="utf-8"), slow=True)
             if how == "run" and argv[1] in REAL_WHEN_SLOW]
    assert steps
    _check(steps, cwd, env)


def test_readme_names_no_file_outside_the_clone():
    text = README.read_text(encoding="utf-8")
    assert "../" not in text and "shared/" not in text
    for link in re.findall(r"\]\(([^)#]+)\)", text):
        if not link.startswith("http"):
            assert (REPO / link).exists(), link


def test_validate_help_states_the_true_default_data(monkeypatch):
    r = subprocess.run([sys.executable, "-m", "simdist.cli", "validate", "--help"], capture_output=True,
                       text=True, cwd=REPO)
    assert "shipped with simdist" in r.stdout and "shared/" not in r.stdout
    from simdist.validate.rows import ENV_VAR, data_dir  # the folder the help means

    monkeypatch.delenv(ENV_VAR, raising=False)
    assert Path(data_dir()).resolve() == (REPO / "simdist" / "validate" / "data").resolve()


def test_the_doc_test_catches_a_wrong_nproc():
    """The check that keeps the tour honest: tiny-3d needs 8 processes, not 4."""
    with pytest.raises(AssertionError, match=r"nproc|processes|world"):
        check_run_plan(["simdist", "run", "scenarios/tiny-3d.yaml", "--nproc", "4", "--steps", "5"])
    check_run_plan(["simdist", "run", "scenarios/tiny-3d.yaml", "--nproc", "8"])
    r = simdist(["simdist", "list", "gpus", "|", "clusters"], REPO, dict(os.environ))
    assert r.returncode == 2  # the old "list gpus | clusters | models" text fails as one command
    with pytest.raises(pytest.fail.Exception):
        _check(plan("```bash\nclusters | models\n```"), REPO, dict(os.environ))
