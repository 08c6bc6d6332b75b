"""simdist.table's plain path (a pipe, no rich import) prints what rich prints, character for
character, and hands rich what it would lay out differently."""

from __future__ import annotations

import random

import pytest

from simdist import table as tables


def _random_table(rng: random.Random) -> tuple[list[str], list[list[object]], str]:
    words = ["ok", "OOM", "fits", "stage", "a", "tp8 pp16", "long header (GiB)", "x" * 30, "-", "1F1B"]
    n = rng.randint(1, 7)
    headers = [rng.choice(words) for _ in range(n)]
    rows = [[rng.choice([rng.choice(words), rng.uniform(-1e6, 1e6), rng.randint(0, 10**6), 0.0,
                         rng.uniform(0, 1e-4), f"{rng.random():.1%}"]) for _ in range(n)]
            for _ in range(rng.randint(0, 6))]
    align = "".join(rng.choice("lr") for _ in range(n))
    return headers, rows, align


def _rich(headers, rows, align, monkeypatch) -> str:
    with monkeypatch.context() as m:
        m.setattr(tables, "plain_table", lambda *a: None)
        return tables.table(headers, rows, align)


@pytest.mark.parametrize("seed", range(40))
def test_the_plain_path_prints_what_rich_prints(seed, monkeypatch):
    monkeypatch.setattr(tables, "is_terminal", lambda: False)
    headers, rows, align = _random_table(random.Random(seed))
    assert tables.plain_table(headers, rows, align) is not None
    assert tables.table(headers, rows, align) == _rich(headers, rows, align, monkeypatch)


@pytest.mark.parametrize("headers, rows", [
    (["[bold]x[/bold]", "y"], [["a", "b"]]),  # markup in a header
    (["x", "y"], [["ä", "b"]]),  # not ASCII (wide characters count twice)
    (["x", "y"], [["a\tb", "c"]]),  # not printable
    (["x", "y"], [["a"]]),  # a cell missing
    (["x", ""], [["a", ""]]),  # an empty column
    (["x", "y"], [["a" * 300, "b" * 300]]),  # wider than the pipe's 400 characters
])
def test_what_rich_lays_out_otherwise_goes_to_rich(headers, rows, monkeypatch):
    monkeypatch.setattr(tables, "is_terminal", lambda: False)
    assert tables.plain_table(headers, rows, "l" * len(headers)) is None
    if all(len(r) == len(headers) for r in rows):
        assert tables.table(headers, rows, "l" * len(headers)) == _rich(headers, rows, "l" * len(headers), monkeypatch)
