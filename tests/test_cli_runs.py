"""`simdist runs` (id, date, kind, scenario; --scenario by name or hash; rm) and `simdist compare`
when measurements are stored but cannot be compared."""

import yaml
from conftest import measurement

from simdist.calibrate.store import RunStore
from simdist.cli import main


def _store(tmp_path):
    db = tmp_path / "runs.db"
    store = RunStore(db)
    a = store.add("measurement", measurement(name="alpha", scenario_hash="aa11"), "name: alpha")
    b = store.add("prediction", {"name": "beta", "scenario_hash": "bb22", "step_time_s": 2.0}, "name: beta",
                  engine="des")
    c = store.add("measurement", measurement(name="a_b%", scenario_hash="cc33"))  # no scenario text
    return str(db), store, (a, b, c)


def test_runs_lists_id_date_kind_scenario(tmp_path, capsys):
    db, _, (a, _b, _c) = _store(tmp_path)
    assert main(["runs", "--db", db]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0]
    for word in ("id", "date (UTC)", "kind", "scenario", "hash", "step time (s)"):
        assert word in header
    line = next(row for row in out.splitlines() if "alpha" in row)
    assert line.split()[0] == str(a) and "measurement" in line and "aa11" in line
    assert line.split()[1].count("-") == 2  # the date, YYYY-MM-DD


def test_runs_filters_by_name_or_hash_prefix_literally(tmp_path, capsys):
    db, store, (a, b, c) = _store(tmp_path)
    assert [r.id for r in store.runs(scenario_hash="beta")] == [b]
    assert [r.id for r in store.runs(scenario_hash="aa")] == [a]
    assert [r.id for r in store.runs(scenario_hash="a_b%")] == [c]  # LIKE wildcards taken literally
    assert store.runs(scenario_hash="%") == []
    assert main(["runs", "--db", db, "--scenario", "beta"]) == 0
    out = capsys.readouterr().out
    assert "beta" in out and "alpha" not in out


def test_runs_rm_deletes_by_id(tmp_path, capsys):
    db, store, (a, b, c) = _store(tmp_path)
    assert main(["runs", "rm", str(a), "--db", db]) == 0
    assert "deleted 1 run(s)" in capsys.readouterr().out
    assert [r.id for r in store.runs()] == [b, c]
    assert main(["runs", "rm", str(a), "--db", db]) == 1  # gone already: said, nothing else deleted
    assert f"no run with id {a}" in capsys.readouterr().err
    assert main(["runs", "rm", "x1", "--db", db]) == 2
    assert main(["runs", "rm", "--db", db]) == 2
    assert [r.id for r in store.runs()] == [b, c]


def test_compare_never_says_none_are_stored_when_some_are(tmp_path, capsys):
    db, _, (a, _, c) = _store(tmp_path)  # alpha's scenario text does not load; a_b% has none
    assert main(["compare", "--db", db]) == 0
    cap = capsys.readouterr()
    assert "2 measurement(s) stored" in cap.out and "no measurements" not in cap.out
    assert f"(run {c}): stored without its scenario's text" in cap.err and f"(run {a})" in cap.err
    empty = tmp_path / "empty.db"
    assert main(["compare", "--db", str(empty)]) == 0
    assert "no measurements in" in capsys.readouterr().out


def test_compare_finds_a_measurement_by_scenario_name(tmp_path, capsys):
    from conftest import base_scenario

    from simdist.spec.scenario import scenario_from_dict

    d = base_scenario()
    sc = scenario_from_dict(d)
    db = tmp_path / "runs.db"
    RunStore(db).add("measurement", measurement(name="t", scenario_hash=sc.hash(), step_time_s=5.0), yaml.safe_dump(d))
    assert main(["compare", "--db", str(db), "--scenario", "t"]) == 0
    out = capsys.readouterr().out
    assert "step_time_s" in out and "no measurements" not in out
