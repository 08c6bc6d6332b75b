"""The executor's place in the layers: it imports only simdist.spec (and units, errors,
catalog), splits the layers over stages exactly as the simulator does, and leaves the run store
to the `simdist run` command. The calibration microbenchmarks start through its launcher."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from conftest import measurement

from simdist.spec.measurement import Measurement

REPO = Path(__file__).resolve().parents[2]
ALLOWED = ("simdist.spec", "simdist.units", "simdist.errors", "simdist.catalog")


def _imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
            out += [f"{node.module}.{a.name}" for a in node.names if node.module == "simdist"]
    return out


def test_the_executor_imports_only_the_spec():
    files = sorted((REPO / "executor").glob("*.py"))
    assert len(files) > 10
    upward = [(f.name, m) for f in files for m in _imports(f)
              if m.split(".")[0] == "simdist" and not m.startswith(ALLOWED)]
    assert not upward, upward


def test_stages_hold_the_same_layers_as_in_the_simulator():
    """The executor takes its split from simdist.spec.stages; the simulator (simdist.analytic.params)
    must split the same way, or measured and predicted stages would hold different layers."""
    from simdist.analytic.params import stage_layer_ranges as simulated
    from simdist.spec.stages import stage_layer_ranges

    for layers in range(1, 41):
        for pp in range(1, 9):
            for v in range(1, 5):
                if pp * v <= layers:
                    assert stage_layer_ranges(layers, pp, v) == simulated(layers, pp, v), (layers, pp, v)
    assert stage_layer_ranges(10, 4) == ((range(0, 2),), (range(2, 5),), (range(5, 8),), (range(8, 10),))


def _measurement(name: str, scenario_hash: str) -> Measurement:
    return Measurement.from_dict(measurement(name, scenario_hash, step_time_s=0.5))


@pytest.mark.parametrize("no_store", [False, True])
def test_simdist_run_keeps_the_measurement_in_the_run_store(tmp_path, monkeypatch, no_store):
    import argparse

    from executor.launch import RunOutcome
    from simdist.calibrate.store import RunStore
    from simdist.cli import run

    path = REPO / "scenarios" / "tiny-ddp.yaml"
    seen = {}

    def fake_execute(opts):
        seen.update(opts)
        return RunOutcome(0, _measurement("tiny-ddp", "abc"))

    monkeypatch.setattr(run, "execute", fake_execute)
    parser = argparse.ArgumentParser()
    run.add_arguments(parser)
    db = tmp_path / "runs.db"
    args = parser.parse_args([str(path), "--nproc", "2", "--db", str(db), *(["--no-store"] if no_store else [])])
    assert run.main(args) == 0
    assert "db" not in seen and "no_store" not in seen and seen["nproc"] == 2  # the executor never sees the store
    stored = RunStore(db).runs("measurement")
    if no_store:
        assert stored == []
    else:
        (r,) = stored
        assert r.payload == _measurement("tiny-ddp", "abc").to_dict()
        assert r.scenario_yaml == path.read_text()


@pytest.mark.distributed
@pytest.mark.slow
def test_microbenchmarks_start_through_the_executors_launcher():
    pytest.importorskip("torch")
    from executor.launch import microbenchmarks
    from simdist.calibrate.fit import fit_profile

    bench = microbenchmarks(2, quick=True)
    assert bench["world_size"] == 2 and bench["gemm"] and bench["memory"] and bench["attention"]
    kinds = {(c["kind"], c["ranks"]) for c in bench["collectives"]}
    assert {("allreduce", 2), ("allgather", 2), ("sendrecv", 2)} <= kinds
    assert all(c["seconds"] > 0 for c in bench["collectives"])
    profile = fit_profile(json.loads(json.dumps(bench)))
    assert profile.peak_flops > 0 and "intra.allreduce" in profile.links
    # top-k at three sizes and three shares: nanoseconds an element on any CPU (not a memory pass's ~0.1 ns)
    assert sorted({n for n, _, _ in profile.select_rates}) == [2.0**14, 2.0**16, 2.0**18]
    assert sorted({round(s, 3) for _, s, _ in profile.select_rates}) == [0.001, 0.01, 0.05]
    assert all(2e-11 < rate < 1e-6 for _, _, rate in profile.select_rates)
    # copies out of the cache at three sizes, each a fraction of the in-cache passes' best rate
    assert [b for b, _ in profile.compute_curves["memory.cold"]] == [2.0**21, 2.0**22, 2.0**23]
    assert all(0 < e <= 1 for _, e in profile.compute_curves["memory.cold"])
    # pointwise ops forward and backward at two sizes each: a time per element (a memory pass's is ~0.05 ns)
    assert sorted(profile.pointwise_s) == sorted(f"{op} {p}" for op in ("gelu", "swiglu", "layernorm", "rmsnorm",
                                                                          "cross_entropy") for p in ("fwd", "bwd"))
    assert all([n for n, _ in v] == [4096.0, 32768.0] and all(0 <= r < 1e-7 for _, r in v)
               for v in profile.pointwise_s.values())
    # DDP's reducer on both stacks (rank 0's rows): microseconds a tensor and a fraction of a ms a MiB
    assert sorted((r["tensors"], r["bytes"]) for r in bench["reducer"]) == [(8, 4202496), (64, 34816)]
    assert 0.5e-6 < profile.ddp_reducer_tensor_s < 100e-6 and profile.ddp_reducer_byte_s < 1e-3 / 2**20
