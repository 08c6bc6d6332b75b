"""`simdist sweep`: the sweep file (axes, ranges, zips, errors naming fields), the run store's
resume after a crash, the table's round trip, and the command."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REPO, base_scenario, run_cli

from simdist.errors import Collector, ScenarioError
from simdist.sweep import (
    SweepStore,
    load_sweep,
    read_table,
    run_sweep,
    sweep_from_dict,
    write_table,
)
from simdist.sweep import points as sweep_points
from simdist.sweep.backends import chunk_size
from simdist.sweep.spec import _range, apply_overrides


def write_sweep(tmp_path: Path, axes, **top) -> Path:
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base_scenario(tp=1, pp=1)))
    doc = {"name": "t-sweep", "base": "base.yaml", "axes": axes, **top}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def problems(tmp_path: Path, axes, **top) -> list[str]:
    with pytest.raises(ScenarioError) as err:
        load_sweep(write_sweep(tmp_path, axes, **top))
    return [str(p) for p in err.value.problems]


# --- axes ---------------------------------------------------------------------------------


def test_product_of_a_list_and_a_range_first_axis_slowest(tmp_path: Path) -> None:
    spec = load_sweep(write_sweep(tmp_path, [
        {"field": "cluster.num_nodes", "values": [1, 2]},
        {"field": "plan.micro_batch_size", "range": {"start": 1, "stop": 4, "factor": 2}}]))
    assert spec.size == 6
    assert list(spec.points()) == [
        {"cluster.num_nodes": n, "plan.micro_batch_size": m} for n in (1, 2) for m in (1, 2, 4)]


def test_zip_moves_fields_together_inside_a_product(tmp_path: Path) -> None:
    spec = load_sweep(write_sweep(tmp_path, [
        {"zip": [{"field": "cluster.num_nodes", "values": [1, 2, 4]},
                 {"field": "plan.global_batch_size", "range": {"start": 64, "stop": 256, "factor": 2}}]},
        {"field": "cluster.inter_node.bandwidth", "values": ["200 Gb/s", "400 Gb/s"]}]))
    pts = list(spec.points())
    assert len(pts) == 6 and spec.fields == ("cluster.num_nodes", "plan.global_batch_size",
                                             "cluster.inter_node.bandwidth")
    assert [(p["cluster.num_nodes"], p["plan.global_batch_size"]) for p in pts[::2]] == [(1, 64), (2, 128), (4, 256)]
    assert {p["cluster.inter_node.bandwidth"] for p in pts} == {"200 Gb/s", "400 Gb/s"}


def test_arithmetic_ranges_include_the_stop_and_keep_floats_clean(tmp_path: Path) -> None:
    spec = load_sweep(write_sweep(tmp_path, {"plan.micro_batch_size": {"range": {"start": 1, "stop": 7, "step": 3}}}))
    assert spec.axes[0].values == ((1,), (4,), (7,))
    c = Collector()
    assert _range({"start": 0.1, "stop": 0.3, "step": 0.1}, "r", c) == [0.1, 0.2, 0.3]
    assert _range({"start": 1, "stop": 1000, "factor": 10}, "r", c) == [1, 10, 100, 1000]
    assert not c.problems


def test_overrides_make_sections_and_drop_the_derived_dp() -> None:
    base = base_scenario(tp=1, pp=1, dp=8)
    out = apply_overrides(base, {"cluster.inter_node.bandwidth": "100 Gb/s", "cluster.num_nodes": 2})
    assert out["cluster"] == {"preset": "dgx-a100-80gb", "num_nodes": 2, "inter_node": {"bandwidth": "100 Gb/s"}}
    assert "dp" not in out["plan"] and base["plan"]["dp"] == 8  # the base is not changed


# --- errors name their field --------------------------------------------------------------


def test_every_problem_of_a_bad_file_names_its_field(tmp_path: Path) -> None:
    found = problems(tmp_path, [
        {"field": "cluster.num_nodes", "range": {"start": 8, "stop": 1, "step": 1}},
        {"field": "name.x", "values": [1]},
        {"field": "plan.tp", "values": []},
        {"zip": [{"field": "plan.pp", "values": [1, 2]}, {"field": "plan.cp", "values": [1]}]},
        {"field": "plan.micro_batch_size", "range": {"start": 1, "stop": 4, "step": 0}}],
        mode="fastest", colour="blue", cost_per_gpu_hour=-1)
    fields = [p.split(":")[0] for p in found]
    assert fields == ["colour", "mode", "cost_per_gpu_hour", "axes[0].range.stop",
                      "axes[1].field", "axes[2].values", "axes[3].zip", "axes[4].range.step"], found


def test_values_the_scenario_rejects_are_named_by_axis(tmp_path: Path) -> None:
    found = problems(tmp_path, [{"field": "cluster.inter_node.bandwidth", "values": ["400 Gb/s", "fast"]},
                                {"field": "plan.bogus_knob", "values": [1]}])
    assert any(p.startswith("axes[0] cluster.inter_node.bandwidth = 'fast'") for p in found), found
    assert any(p.startswith("axes[1].field: plan.bogus_knob") for p in found), found


def test_base_and_search_options_are_checked(tmp_path: Path) -> None:
    found = problems(tmp_path, [{"field": "cluster.num_nodes", "values": [1]}], base="missing.yaml",
                     search={"top": 1})
    assert [p.split(":")[0] for p in found] == ["search", "base"], found
    found = problems(tmp_path, [{"field": "cluster.num_nodes", "values": [1]}], mode="search",
                     search={"max_tp": "eight", "warp": 9})
    assert [p.split(":")[0] for p in found] == ["search.max_tp", "search.warp"], found
    found = problems(tmp_path, [{"field": "cluster.num_nodes", "values": [1]}], mode="search",
                     search={"schedules": ["1f1b", "2f2b"], "memory_headroom": 1.5})
    assert [p.split(":")[0] for p in found] == ["search.memory_headroom", "search.schedules"], found
    assert "'2f2b' is not one of" in found[1]


def test_every_search_option_of_a_sweep_is_a_search_constraint() -> None:
    from dataclasses import fields

    from simdist.search.space import Constraints
    from simdist.sweep.spec import SEARCH_KEYS

    names = {f.name for f in fields(Constraints)}
    assert set(SEARCH_KEYS) <= names, set(SEARCH_KEYS) - names
    assert "rerank_exact" in SEARCH_KEYS  # the search's exact places, as `simdist search --rerank-exact`


def test_a_bad_sweep_file_exits_2_one_line_per_problem(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, [{"field": "plan.tp", "values": "eight"}], name="bad id!")
    r = run_cli("sweep", str(path), "--db", str(tmp_path / "runs.db"))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert lines == ["error: name: is required: the sweep's id, letters, digits, '.', '_' or '-' (at most 100)",
                     "error: axes[0].values: must be a non-empty list"], r.stderr
    assert "Traceback" not in r.stderr


# --- running, storing, resuming -------------------------------------------------------------


NODES_AND_MBS = [{"field": "cluster.num_nodes", "values": [1, 2, 3]},
                 {"field": "plan.micro_batch_size", "values": [1, 2, 4, 8]}]


def test_points_are_predicted_and_invalid_ones_kept_as_rows(tmp_path: Path) -> None:
    spec = load_sweep(write_sweep(tmp_path, NODES_AND_MBS, cost_per_gpu_hour={"a100-80gb": 2.0}))
    out = run_sweep(spec, SweepStore(tmp_path / "runs.db"), workers=1)
    t = out.table
    assert out.points == out.computed == len(t) == 12 and list(t["point"]) == list(range(12))
    # 64 sequences do not split over 24 GPUs (3 nodes), nor into micro-batches of 8 over 16
    # replicas: those points are invalid, with the reason
    bad = t[(t["cluster.num_nodes"] == 3) | ((t["cluster.num_nodes"] == 2) & (t["plan.micro_batch_size"] == 8))]
    assert set(bad["status"]) == {"invalid"} and all(bad["problem"] != "") and len(bad) == 5
    ok = t[t["status"] == "ok"]
    assert len(ok) == 7 and (ok["gpus"] == 8 * ok["cluster.num_nodes"]).all()
    assert ok["gpu_hours"].tolist() == pytest.approx((ok["gpus"] * ok["step_time_s"] / 3600).tolist())
    assert ok["cost"].tolist() == pytest.approx((2.0 * ok["gpu_hours"]).tolist())
    assert (ok["micro_batch_size"] == ok["plan.micro_batch_size"]).all()


@pytest.mark.parametrize("mode", ["predict", "search"])
def test_goodput_is_a_column_when_failures_are_swept(tmp_path: Path, mode: str) -> None:
    search = {"search": {"max_micro_batch": 1, "zero_stages": [1], "recompute": ["none"], "schedules": ["1f1b"],
                         "max_tp": 1}} if mode == "search" else {}
    spec = load_sweep(write_sweep(tmp_path, [{"field": "reliability.gpu_mtbf", "values": ["500 h", "50000 h"]},
                                             {"field": "reliability.checkpoint_bandwidth", "values": ["10 GB/s"]}],
                                  mode=mode, **search))
    t = run_sweep(spec, SweepStore(tmp_path / "runs.db"), workers=1).table
    assert list(t["status"]) == ["ok", "ok"] and "cost" not in t
    assert 0 < t["goodput"][0] < t["goodput"][1] < 1  # GPUs that fail less often lose less
    plain = run_sweep(load_sweep(write_sweep(tmp_path, NODES_AND_MBS[:1])), SweepStore(tmp_path / "b.db"), workers=1)
    assert "goodput" not in plain.table


def test_a_simulator_failure_is_a_row_not_the_end_of_the_sweep(tmp_path: Path, monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(sweep_points, "predict", broken)
    spec = load_sweep(write_sweep(tmp_path, NODES_AND_MBS[:1]))
    t = run_sweep(spec, SweepStore(tmp_path / "runs.db"), workers=1).table
    assert list(t["status"]) == ["error", "error", "invalid"]
    assert t["problem"][0] == "the simulator failed: ZeroDivisionError: a bug"


def test_a_rerun_after_a_crash_runs_only_the_points_not_stored(tmp_path: Path, monkeypatch) -> None:
    spec = load_sweep(write_sweep(tmp_path, NODES_AND_MBS))
    store = SweepStore(tmp_path / "runs.db")
    real, calls = sweep_points.evaluate_point, []

    def crashing(job, overrides):
        calls.append(overrides)
        if len(calls) == 7:
            raise RuntimeError("the machine went away")
        return real(job, overrides)

    monkeypatch.setattr(sweep_points, "evaluate_point", crashing)
    with pytest.raises(RuntimeError):
        run_sweep(spec, store, workers=1)
    stored = len(store.done_keys("t-sweep"))
    assert 1 <= stored < 7  # finished chunks were kept, the one in flight was not
    calls.clear()
    monkeypatch.setattr(sweep_points, "evaluate_point", lambda job, o: (calls.append(o), real(job, o))[1])
    out = run_sweep(spec, store, workers=1)
    assert (out.skipped, out.computed, len(calls)) == (stored, 12 - stored, 12 - stored)
    assert len(out.table) == 12 and list(out.table["point"]) == list(range(12))
    again = run_sweep(spec, store, workers=1)
    assert (again.skipped, again.computed) == (12, 0)
    pd.testing.assert_frame_equal(again.table, out.table)
    # a changed base makes every point new; the same axes under another id start from nothing
    changed = sweep_from_dict({**yaml.safe_load((tmp_path / "sweep.yaml").read_text()), "engine": "des"}, tmp_path)
    assert run_sweep(changed, store, workers=1).computed == 12
    assert run_sweep(spec, store, sweep_id="other", workers=1).computed == 12


def test_processes_give_the_same_table_as_one_process(tmp_path: Path) -> None:
    spec = load_sweep(write_sweep(tmp_path, NODES_AND_MBS))
    one = run_sweep(spec, SweepStore(tmp_path / "a.db"), workers=1).table
    two = run_sweep(spec, SweepStore(tmp_path / "b.db"), workers=2).table
    pd.testing.assert_frame_equal(one, two)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_the_table_round_trips(tmp_path: Path, suffix: str) -> None:
    if suffix == ".parquet":
        pytest.importorskip("pyarrow")
    spec = load_sweep(write_sweep(tmp_path, NODES_AND_MBS))
    table = run_sweep(spec, SweepStore(tmp_path / "runs.db"), workers=1).table
    path = tmp_path / f"out{suffix}"
    write_table(table, path)
    pd.testing.assert_frame_equal(read_table(path), table)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]  # no temporary left


def test_chunks_keep_scheduling_under_five_percent() -> None:
    for n, workers, t, overhead in [(10**6, 64, 0.002, 0.02), (100, 2, 1.0, 0.002), (15, 2, 0.5, 0.02),
                                    (10**5, 8, 1e-4, 0.002), (3, 1, 0.01, 0.02)]:
        c = chunk_size(n, workers, t, overhead)
        assert 1 <= c <= n
        assert overhead / (c * t) <= 0.05 or c == n, (n, workers, t, c)
    assert chunk_size(100, 2, 1.0, 0.002) == 13  # ~4 chunks per worker when the work is long
    assert chunk_size(10**6, 64, 1.0, 0.02) == 30  # at most ~30 s of work per chunk


def test_the_command_stores_resumes_and_writes(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, NODES_AND_MBS[:1], mode="search",
                       search={"max_micro_batch": 1, "zero_stages": [1], "recompute": ["none"],
                               "schedules": ["1f1b"], "max_tp": 2})
    db, out = str(tmp_path / "runs.db"), tmp_path / "t.csv"
    r = run_cli("sweep", str(path), "--db", db, "--out", str(out), "--workers", "1", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "3 points, 0 already stored, 3 run" in r.stdout
    t = read_table(out)
    assert list(t["status"]) == ["ok", "ok", "invalid"] and (t["tp"].iloc[:2] <= 2).all()
    assert (t["plans_evaluated"].iloc[:2] > 0).all()
    r = run_cli("sweep", str(path), "--db", db, "--no-progress")
    assert r.returncode == 0 and "3 points, 3 already stored, 0 run" in r.stdout
    r = run_cli("sweep", "--list", "--db", db)
    assert r.returncode == 0 and "t-sweep" in r.stdout


def test_the_readme_example_is_valid() -> None:
    spec = load_sweep(REPO / "sweeps" / "llama3-70b-h100.yaml")
    assert spec.mode == "search" and spec.size == 15
    assert [p["cluster.num_nodes"] for p in spec.points()][::3] == [8, 16, 32, 64, 128]
