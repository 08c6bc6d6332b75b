import json
import os

import pytest
from conftest import SCENARIOS, run_cli

CONTRACT_KEYS = {"name", "world_size", "step_time_s", "tokens_per_s", "model_flops_per_step",
                 "model_tflops_per_gpu", "mfu", "bubble_fraction", "breakdown_s", "memory"}
BREAKDOWN = {"compute", "recompute", "tp_comm", "pp_comm", "dp_comm", "bubble", "optimizer"}


@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_predict_json_follows_contract(engine):
    r = run_cli("predict", "scenarios/gpt3-175b-1024xa100.yaml", "--json", "--engine", engine)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d.keys() >= CONTRACT_KEYS
    assert d["breakdown_s"].keys() >= BREAKDOWN
    assert sum(d["breakdown_s"].values()) == pytest.approx(d["step_time_s"], rel=0.01)
    assert d["world_size"] == 1024
    mem = d["memory"]
    assert {"peak_gib", "capacity_gib", "fits", "per_stage"} <= mem.keys()
    assert len(mem["per_stage"]) == 16 and mem["capacity_gib"] == 80
    assert mem["fits"] == (mem["peak_gib"] <= mem["capacity_gib"])
    assert d["mfu"] == pytest.approx(d["model_flops_per_step"] / (d["step_time_s"] * 1024 * 312e12), rel=1e-9)


def test_predict_table_is_readable():
    r = run_cli("predict", "scenarios/gpt3-175b-1024xa100.yaml", "--engine", "analytic")
    assert r.returncode == 0
    for word in ("step time", "tokens/s", "MFU", "where the time goes", "fits"):
        assert word in r.stdout


@pytest.mark.parametrize("what", ["gpus", "clusters", "models"])
def test_list(what):
    r = run_cli("list", what)
    assert r.returncode == 0
    expected = {"gpus": ["v100-32gb", "a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "b200"],
                "clusters": ["dgx-a100-40gb", "dgx-a100-80gb", "dgx-h100", "dgx-h200", "dgx-b200"],
                "models": ["gpt3-175b", "llama2-70b", "llama3-8b", "llama3.1-405b", "tiny"]}[what]
    for name in expected:
        assert name in r.stdout


def test_unknown_engine_exit_2():
    r = run_cli("predict", "scenarios/gpt3-175b-1024xa100.yaml", "--engine", "magic")
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_every_bundled_scenario_predicts():
    from simdist.predict import predict
    from simdist.spec.scenario import load_scenario

    assert len(SCENARIOS) >= 4
    for path in SCENARIOS:
        sc = load_scenario(path)
        if sc.requires_profile:
            continue  # `local` scenarios need a calibration profile (tested in calibration)
        for engine in ("analytic", "des"):
            p = predict(sc, engine=engine, keep_spans=False)
            assert p.step_time_s > 0 and 0 < p.mfu < 1, (path.name, engine)
            assert sum(p.breakdown_s.values()) == pytest.approx(p.step_time_s, rel=0.01)


def test_every_command_module_declares_its_options():
    from simdist.cli import COMMANDS

    for name, _, _ in COMMANDS:
        r = run_cli(name, "--help")
        assert r.returncode == 0 and f"simdist {name}" in r.stdout, (name, r.stderr)


def test_a_command_imports_only_its_own_module():
    """`simdist predict` starts fast: no search, executor, validation, plotly or torch import."""
    import subprocess
    import sys

    code = ("import sys; from simdist.cli import main; "
            "assert main(['predict', 'scenarios/llama3-8b-fsdp-8xh100.yaml', '--engine', 'analytic', "
            "'--no-store', '--json']) == 0; "
            "heavy = [m for m in ('simdist.search', 'executor', 'simdist.validate', 'plotly', 'torch', "
            "'simdist.cli.search', 'simdist.cli.run') if m in sys.modules]; "
            "assert not heavy, heavy")
    done = subprocess.run([sys.executable, "-c", code], cwd=SCENARIOS[0].parent.parent, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_predict_with_its_table_imports_no_other_command_and_no_heavy_library(tmp_path):
    """The whole default `simdist predict FILE` (event engine, table, reserved memory, run store)
    imports none of the other commands' packages nor pandas, numpy, networkx, plotly, rich, torch."""
    import subprocess
    import sys

    code = ("import sys, io, contextlib; from simdist.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            "    assert main(['predict', 'scenarios/gpt3-175b-1024xa100.yaml']) == 0\n"
            "assert 'reserved (GiB)' in out.getvalue()\n"
            "avoid = ('simdist.search', 'simdist.sweep', 'simdist.validate', 'simdist.dashboard', 'simdist.trace', "
            "'simdist.viz', 'simdist.calibrate.fit', 'simdist.cli.search', 'executor', 'pandas', 'numpy', "
            "'networkx', 'plotly', 'rich', 'torch', 'streamlit', 'ray')\n"
            "heavy = sorted(m for m in sys.modules if any(m == a or m.startswith(a + '.') for a in avoid))\n"
            "assert not heavy, heavy")
    env = {**os.environ, "SIMDIST_DB": str(tmp_path / "runs.db")}
    done = subprocess.run([sys.executable, "-c", code], cwd=SCENARIOS[0].parent.parent, capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr


def test_the_program_ends_at_once_after_predict_with_its_output_and_exit_handlers(tmp_path):
    """`simdist predict` run as the program skips the interpreter's teardown (simdist.cli.exit_now):
    its whole output still arrives, exit handlers still run, the exit code is kept."""
    import subprocess
    import sys

    code = ("import atexit, sys; atexit.register(lambda: print('handler ran', flush=True)); "
            "from simdist.cli import program; sys.argv = ['simdist', 'predict', *sys.argv[1:]]; program()")
    env = {**os.environ, "SIMDIST_DB": str(tmp_path / "runs.db")}
    cwd = SCENARIOS[0].parent.parent
    done = subprocess.run([sys.executable, "-c", code, "scenarios/gpt3-175b-1024xa100.yaml", "--json"], cwd=cwd,
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    body, _, tail = done.stdout.rpartition("}")
    assert json.loads(body + "}")["step_time_s"] > 0 and tail.strip() == "handler ran"
    bad = subprocess.run([sys.executable, "-c", code, "no-such-file.yaml"], cwd=cwd, capture_output=True,
                         text=True, timeout=300, env=env)
    assert bad.returncode == 2 and "no-such-file.yaml" in bad.stderr and bad.stdout.strip() == "handler ran"
