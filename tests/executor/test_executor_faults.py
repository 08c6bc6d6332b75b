"""Bad plans are refused before launch; a crashed or hung rank stops the whole run cleanly."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
import yaml

from executor.launch import run_command

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def scenario_file(tmp_path: Path, base: str = "tiny-ddp", model: dict | None = None,
                  cluster: dict | None = None, **plan) -> Path:
    data = yaml.safe_load((SCENARIOS / f"{base}.yaml").read_text())
    data["model"].update(model or {})
    data["cluster"].update(cluster or {})
    data["plan"].update(plan)
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def refused(capsys: pytest.CaptureFixture[str], path: Path, nproc: int = 2, **opts) -> list[str]:
    code = run_command(file=str(path), nproc=nproc, **opts)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and "Traceback" not in err
    return lines


@pytest.mark.parametrize("changes,nproc,field", [
    ({"plan": {"tp": 3}}, 2, "plan.tp"),  # does not divide the heads (and not the world)
    ({"plan": {"pp": 8}, "cluster": {"gpus_per_node": 8}}, 8, "plan.pp"),  # more stages than layers
    ({}, 4, "--nproc"),  # degrees multiply to 2, not 4
    ({"plan": {"cp": 2, "tp": 2, "dp": 1}, "cluster": {"gpus_per_node": 4}}, 4, "plan.cp"),  # cp runs with dp only
    ({"plan": {"precision": "fp16"}}, 2, "plan.precision"),
    ({"plan": {"optimizer": "adafactor"}}, 2, "plan.optimizer"),
    ({"model": {"tie_embeddings": True}, "plan": {"pp": 2}}, 2, "model.tie_embeddings"),
    ({"model": {"tie_embeddings": True}, "plan": {"tp": 2}, "cluster": {"gpus_per_node": 4}}, 4,
     "model.tie_embeddings"),
    ({"plan": {"zero_stage": 1, "pp": 2, "virtual_pipeline_stages": 2}, "cluster": {"gpus_per_node": 4}},
     4, "plan.zero_stage"),
])
def test_impossible_plans_are_refused_before_launch(tmp_path, capsys, changes, nproc, field):
    path = scenario_file(tmp_path, model=changes.get("model"), cluster=changes.get("cluster"),
                         **changes.get("plan", {}))
    lines = refused(capsys, path, nproc=nproc)
    assert any(line.startswith(f"{field}: ") for line in lines), lines


def test_every_problem_is_reported_at_once(tmp_path, capsys):
    path = scenario_file(tmp_path, precision="fp16", optimizer="adafactor")
    lines = refused(capsys, path, nproc=4, steps=0, fault="9:1:explode")
    fields = {line.split(":")[0] for line in lines}
    assert {"--nproc", "plan.precision", "plan.optimizer", "--steps", "--fault"} <= fields


def _workers_of(path: Path) -> list[int]:
    """Live processes whose command line mentions this scenario file (workers, torchrun)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if str(path).encode() in cmd and int(entry.name) != os.getpid():
            pids.append(int(entry.name))
    return pids


def failed(capsys, path: Path, out: Path, **opts) -> tuple[str, float]:
    start = time.monotonic()
    code = run_command(file=str(path), nproc=2, steps=2, warmup=1, out=str(out), **opts)
    took = time.monotonic() - start
    err = capsys.readouterr().err
    assert code == 1, err
    assert not out.exists(), "a failed run must not leave a measurement"
    assert list(out.parent.glob("*.tmp")) == []
    assert _workers_of(path) == [], "processes left behind"
    log = next((line.split("full log: ")[1] for line in err.splitlines() if "full log: " in line), None)
    if log:
        shutil.rmtree(Path(log).parent, ignore_errors=True)
    return err, took


@pytest.mark.distributed
def test_a_crashing_rank_stops_the_run(tmp_path, capsys):
    path = scenario_file(tmp_path)
    err, _ = failed(capsys, path, tmp_path / "m.json", fault="1:2:crash")
    assert "rank 1: failed at step 2: RuntimeError: injected crash" in err


@pytest.mark.distributed
def test_a_hung_rank_times_out_its_peers(tmp_path, capsys):
    path = scenario_file(tmp_path, base="tiny-pp-1f1b")
    err, _ = failed(capsys, path, tmp_path / "m.json", fault="0:1:hang", pg_timeout=4)
    assert "rank 0: hung at step 1" in err
    assert "rank 1: timed out after 4 s at step 1" in err
    assert "no rank made progress" not in err  # the process-group timeout ended it, not the watchdog


@pytest.mark.distributed
@pytest.mark.slow
def test_a_stalled_run_is_killed_by_the_watchdog(tmp_path, capsys):
    """Backstop for hangs the process-group timeout does not catch (here: a long one)."""
    path = scenario_file(tmp_path)
    # stall: far above a tiny DDP step (0.1-1 s on a loaded 2-core machine), far below pg_timeout
    pg_timeout, stall = 600, 10
    err, took = failed(capsys, path, tmp_path / "m.json", fault="1:1:hang", pg_timeout=pg_timeout, stall_timeout=stall)
    assert f"no rank made progress for {stall} s" in err
    assert "rank 1: hung at step 1" in err  # not killed in set-up, however long the build took
    assert took < pg_timeout  # the watchdog ended it, not the process-group timeout


@pytest.mark.parametrize(("phases", "grace"), [
    (["start", "build"], True),  # set-up: building the model may outlast a short stall timeout
    (["step", "resume"], True),  # one rank still loading its checkpoint
    (["step", "step"], False),  # every rank in its steps: the stall timeout alone
    (["step", "hang"], False),
])
def test_the_stall_watchdog_waits_for_set_up(tmp_path, phases, grace):
    from executor.faults import heartbeat_path
    from executor.torchrun import STARTUP_GRACE_S, _stalled_for
    from simdist.spec.files import write_json_atomic

    now = time.time()
    for rank, phase in enumerate(phases):
        write_json_atomic(heartbeat_path(tmp_path, rank), {"rank": rank, "phase": phase, "time": now - 10 * (rank + 1)})
    idle, floor = _stalled_for(tmp_path, len(phases), started=now - 100)
    assert floor == (STARTUP_GRACE_S if grace else 0.0)
    assert 10 <= idle < 20  # since the newest heartbeat
    idle, floor = _stalled_for(tmp_path, len(phases) + 1, started=now - 100)  # a rank not started yet
    assert floor == STARTUP_GRACE_S and 100 <= idle < 110  # since the launch


@pytest.mark.parametrize("spec,ok", [("1:2:crash", True), ("0:0:hang", True), ("1:2", False),
                                     ("a:2:crash", False), ("1:2:explode", False)])
def test_fault_spec(spec, ok):
    from executor.faults import parse_fault

    if ok:
        assert str(parse_fault(spec)) == spec
    else:
        with pytest.raises(ValueError):
            parse_fault(spec)


def test_diagnosis_names_the_root_cause_first(tmp_path):
    from executor.faults import diagnose, failure_path, heartbeat_path
    from simdist.spec.files import write_json_atomic

    write_json_atomic(failure_path(tmp_path, 0), {"rank": 0, "step": 3, "phase": "step", "error": "RuntimeError",
                                                  "message": "Connection closed by peer", "kind": "peer-lost"})
    write_json_atomic(failure_path(tmp_path, 2), {"rank": 2, "step": 3, "phase": "step", "error": "ValueError",
                                                  "message": "boom", "kind": "error"})
    write_json_atomic(heartbeat_path(tmp_path, 1), {"rank": 1, "step": 3, "phase": "step", "time": 0})
    lines = diagnose(tmp_path, 3, 30)
    assert lines[0] == "rank 2: failed at step 3: ValueError: boom"
    assert lines[1].startswith("rank 0: lost a peer at step 3")
    assert lines[2] == "rank 1 (at step 3): stopped by torchrun after the failure above"
