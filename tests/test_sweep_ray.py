"""The sweep on Ray: a local Ray instance started by the test on the loopback address, no
dashboard, no usage reporting; the same sweep gives the same table as local processes.
Starting Ray takes about 15 s here, the two sweeps about 5 s: not marked slow."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REPO, base_scenario

from simdist.errors import ScenarioError
from simdist.sweep import SweepStore, backends, load_sweep, run_sweep

AXES = [{"field": "cluster.num_nodes", "values": [1, 2, 3]},
        {"field": "plan.micro_batch_size", "values": [1, 2, 4, 8]}]


def sweep_file(tmp_path: Path, **top) -> Path:
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base_scenario(tp=1, pp=1)))
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"name": "ray-sweep", "base": "base.yaml", "axes": AXES, **top}))
    return path


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'simdist[cluster]')")
    saved = {k: os.environ.get(k) for k in ("RAY_USAGE_STATS_ENABLED", "PYTHONPATH")}
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # no network
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [saved["PYTHONPATH"]])])  # workers import this simdist
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
             configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.mark.parametrize("mode", ["predict", "search"])
def test_ray_gives_the_same_table_as_local_processes(tmp_path: Path, local_ray, mode: str) -> None:
    extra = {"mode": "search", "search": {"max_micro_batch": 2, "zero_stages": [1], "recompute": ["none"],
                                          "schedules": ["1f1b"], "max_tp": 2}} if mode == "search" else {}
    spec = load_sweep(sweep_file(tmp_path, **extra))
    local = run_sweep(spec, SweepStore(tmp_path / "local.db"), workers=2)
    remote = run_sweep(spec, SweepStore(tmp_path / "ray.db"), backend="ray")
    assert (remote.backend, remote.workers, remote.computed) == ("ray", 2, 12)
    assert (local.table["status"] == "ok").sum() >= 7
    pd.testing.assert_frame_equal(remote.table, local.table)
    # and it resumes from the store like the local backend
    again = run_sweep(spec, SweepStore(tmp_path / "ray.db"), backend="ray")
    assert (again.skipped, again.computed) == (12, 0)


def test_the_command_runs_on_ray(tmp_path: Path, local_ray, capsys) -> None:
    from simdist.cli import main

    out = tmp_path / "t.csv"
    code = main(["sweep", str(sweep_file(tmp_path)), "--ray", "auto", "--db", str(tmp_path / "runs.db"),
                 "--out", str(out), "--no-progress"])
    assert code == 0
    assert "12 run on 2 ray worker(s)" in capsys.readouterr().out
    assert len(pd.read_csv(out)) == 12


def test_without_ray_the_flag_is_bad_input(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    with pytest.raises(ScenarioError) as err:
        backends.ray_module()
    assert err.value.problems[0].field == "--ray" and "simdist[cluster]" in err.value.problems[0].message


def test_the_simulator_imports_without_ray() -> None:
    code = ("import sys; sys.modules['ray'] = None; import simdist.sweep, simdist.cli.sweep, simdist.predict; "
            "print('ok')")
    import subprocess

    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_the_command_says_when_ray_is_missing(tmp_path: Path) -> None:
    import subprocess

    code = ("import sys; sys.modules['ray'] = None; from simdist.cli import main; "
            f"sys.exit(main(['sweep', {str(sweep_file(tmp_path))!r}, '--ray', 'auto', '--db', "
            f"{str(tmp_path / 'runs.db')!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 2 and r.stderr.startswith("error: --ray: Ray is not installed"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
