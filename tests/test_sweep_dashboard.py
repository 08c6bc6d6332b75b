"""The dashboard's Sweeps tab: the heatmap, Pareto front and best-plan table of a sweep (pure),
and the tab in the page, driven headless with AppTest from the run store and from an upload."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REPO, base_scenario

pytest.importorskip("streamlit")
pytest.importorskip("plotly")
from streamlit.testing.v1 import AppTest

from simdist.dashboard import sweep_results as sr
from simdist.sweep import SweepStore, load_sweep, run_sweep

AXES = [{"field": "cluster.num_nodes", "values": [1, 2, 3]},
        {"field": "plan.micro_batch_size", "values": [1, 2, 4, 8]},
        {"field": "cluster.inter_node.bandwidth", "values": ["100 Gb/s", "400 Gb/s"]}]


def stored_sweep(tmp_path: Path, db: Path, **top) -> pd.DataFrame:
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base_scenario(tp=1, pp=1)))
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump({"name": "dash-sweep", "base": "base.yaml",
                                                         "axes": AXES, **top}))
    return run_sweep(load_sweep(tmp_path / "sweep.yaml"), SweepStore(db), workers=1).table


@pytest.fixture
def table(tmp_path: Path) -> pd.DataFrame:
    return stored_sweep(tmp_path, tmp_path / "runs.db", cost_per_gpu_hour=3.0)


def test_heatmap_cells_are_the_best_over_the_other_swept_field(table: pd.DataFrame) -> None:
    grid = sr.heatmap(table, "cluster.num_nodes", "plan.micro_batch_size", "step time")
    assert list(grid.columns) == [1, 2, 3] and list(grid.index) == [1, 2, 4, 8]
    ok = table[table["status"] == "ok"]
    for nodes in (1, 2):
        for mbs in (1, 2, 4):
            cell = ok[(ok["cluster.num_nodes"] == nodes) & (ok["plan.micro_batch_size"] == mbs)]
            assert grid.loc[mbs, nodes] == cell["step_time_s"].min()  # the faster bandwidth
    assert grid[3].isna().all() and pd.isna(grid.loc[8, 2])  # invalid points: empty cells
    mfu = sr.heatmap(table, "cluster.num_nodes", "plan.micro_batch_size", "MFU")
    assert mfu.loc[1, 1] == ok[(ok["cluster.num_nodes"] == 1) & (ok["plan.micro_batch_size"] == 1)]["mfu"].max()
    fig = sr.heatmap_figure(grid, "cluster.num_nodes", "plan.micro_batch_size", "step time")
    assert fig.data[0].type == "heatmap" and len(fig.data[0].z) == 4


def test_cost_is_offered_only_when_the_sweep_priced_gpu_hours(tmp_path: Path, table: pd.DataFrame) -> None:
    assert "cost per step" in sr.metrics_of(table)
    (tmp_path / "b").mkdir()
    plain = stored_sweep(tmp_path / "b", tmp_path / "b.db")
    assert "cost" not in plain.columns and "cost per step" not in sr.metrics_of(plain)


def test_pareto_front_holds_exactly_the_points_nothing_beats(table: pd.DataFrame) -> None:
    front = sr.pareto_front(table, cost="cost")
    ok = table[table["status"] == "ok"]

    def beaten(r) -> bool:
        return bool(((ok["cost"] <= r["cost"]) & (ok["step_time_s"] <= r["step_time_s"])
                     & ((ok["cost"] < r["cost"]) | (ok["step_time_s"] < r["step_time_s"]))).any())

    assert len(front) >= 1
    assert not any(beaten(r) for _, r in front.iterrows())
    assert all(beaten(r) for i, r in ok.iterrows() if i not in front.index)
    assert front["cost"].is_monotonic_increasing and front["step_time_s"].is_monotonic_decreasing
    assert len(front) < len(ok)


def test_best_plans_keep_the_swept_values_and_the_reason_a_point_failed(table: pd.DataFrame) -> None:
    best = sr.best_plans(table)
    assert list(best.columns[:3]) == ["cluster.num_nodes", "plan.micro_batch_size", "cluster.inter_node.bandwidth"]
    assert len(best) == 24 and (best.loc[best["status"] == "invalid", "problem"] != "").all()


def test_an_upload_that_is_not_a_sweep_table_is_refused(table: pd.DataFrame) -> None:
    assert len(sr.read_upload("t.csv", table.to_csv(index=False).encode())) == 24
    with pytest.raises(ValueError, match="not a sweep table"):
        sr.read_upload("t.csv", b"a,b\n1,2\n")


def test_the_sweeps_tab_draws_a_stored_sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "runs.db"
    monkeypatch.setenv("SIMDIST_DB", str(db))
    stored_sweep(tmp_path, db)
    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=120)
    at.run()
    assert not at.exception, at.exception
    tab = next(t for t in at.tabs if t.label == "Sweeps")
    assert tab.selectbox(key="sw_id").value == "dash-sweep"
    charts = tab.get("plotly_chart")
    assert len(charts) == 2  # heatmap and Pareto front
    assert tab.selectbox(key="sw_metric").options == ["step time", "MFU", "GPU-hours per step"]
    tab.selectbox(key="sw_y").select("cluster.inter_node.bandwidth")
    at.run()
    assert not at.exception, at.exception
    tab = next(t for t in at.tabs if t.label == "Sweeps")
    assert len(tab.dataframe) == 1 and len(tab.dataframe[0].value) == 24


def test_the_sweeps_tab_neither_creates_a_store_nor_adds_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sqlite3

    from simdist.calibrate.store import RunStore

    db = tmp_path / "runs.db"
    monkeypatch.setenv("SIMDIST_DB", str(db))
    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=120)
    at.run()
    assert not at.exception and not db.exists()
    RunStore(db)  # a store with runs only
    at.run()
    assert not at.exception
    with sqlite3.connect(db) as conn:
        assert "sweeps" not in {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
