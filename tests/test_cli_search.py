"""`simdist search` flags that steer the event-engine re-rank: --rerank-exact reaches
Constraints.rerank_exact, a bad value exits 2 naming the flag, and the report says which
places the discrete-event engine ordered for certain (the rest keep closed-form times)."""

from __future__ import annotations

import pytest
from conftest import REPO, run_cli

from simdist.cli import build_parser
from simdist.cli.search import constraints_from_args, report
from simdist.search import Constraints, search
from simdist.spec.scenario import scenario_from_dict

GPT3 = str(REPO / "scenarios" / "gpt3-175b-1024xa100.yaml")
SMALL = {  # GPT-3 13B on 64 A100: a handful of plans once the space is narrowed below
    "name": "gpt3-13b-64xa100",
    "model": {"preset": "gpt3-13b"},
    "cluster": {"preset": "dgx-a100-80gb", "num_nodes": 8},
    "plan": {"tp": 2, "pp": 4, "global_batch_size": 512, "precision": "bf16"},
}


def _constraints(*argv: str) -> tuple[Constraints, list]:
    args = build_parser("search", alone=True).parse_args(["search", GPT3, *argv])
    constraints, _, problems = constraints_from_args(args)
    return constraints, problems


def test_rerank_exact_reaches_the_constraints():
    assert _constraints()[0].rerank_exact == Constraints().rerank_exact == 1  # the default: the winner
    constraints, problems = _constraints("--rerank-exact", "3", "--top", "5")
    assert (constraints.rerank_exact, constraints.top, problems) == (3, 5, [])


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_bad_rerank_exact_is_a_problem_naming_the_flag(value):
    constraints, problems = _constraints("--rerank-exact", value)
    assert [p.field for p in problems] == ["--rerank-exact"] and value in problems[0].message
    assert constraints.rerank_exact == 1  # left at its default so the other flags are still checked


def test_cli_bad_rerank_exact_exits_2_naming_the_flag():
    res = run_cli("search", GPT3, "--rerank-exact", "0")
    assert res.returncode == 2
    assert "error: --rerank-exact:" in res.stderr and "Traceback" not in res.stderr


def test_help_states_the_rerank_is_exact_only_for_the_top_places(capsys):
    with pytest.raises(SystemExit):
        build_parser("search", alone=True).parse_args(["search", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--rerank-exact N" in text and "keep their closed-form time" in text


def test_report_names_the_places_the_event_engine_ordered():
    sc = scenario_from_dict(SMALL)
    narrow = {"max_micro_batch": 1, "zero_stages": (1,), "schedules": ("1f1b",), "recompute": ("selective",),
              "pp": (4,), "max_tp": 2}
    des = search(sc, Constraints(top=3, rerank=3, rerank_exact=2, **narrow), workers=1)
    assert des.engine == "des"
    line = report(des, exact=2).splitlines()[1]
    assert "ranked by the discrete-event engine: the top 2 places are exact" in line
    assert f"{des.counts_by_engine['des']:,} plans re-timed" in line and "closed-form time" in line
    assert "the winner is exact" in report(des).splitlines()[1]  # exact=1
    closed = search(sc, Constraints(top=3, engine="analytic", **narrow), workers=1)
    line = report(closed).splitlines()[1]
    assert "timed by the closed-form engine" in line and "discrete-event" not in line
